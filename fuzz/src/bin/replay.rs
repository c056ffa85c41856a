//! Runs a fuzz harness without libFuzzer (stable Rust, no sanitizers, no coverage feedback).
//!
//! ```text
//! replay [--target NAME] PATH...                       replay files, or every file of a directory
//! replay [--target NAME] --mutate N SEED [--seconds S] [--artifacts DIR] PATH...
//!                                                      N blind mutations of the inputs in PATH
//! replay --random N [SEED]                             N pseudo-random inputs (decode_walk_remap)
//! ```
//!
//! `NAME` is one of `decode_walk_remap` (the default), `stream_decode`, `aub_read`, `vgpu_resume`,
//! `vgpu_guest` (accepted: the vGPU answered after GDRST alone), `vfio_user_session`. `--mutate`
//! draws inputs with `gmig_cmdparser_fuzz::mutate` (stacked bit flips, interesting values,
//! truncations, range erasures, duplications, splices) from the xorshift seed `SEED`, so a run is
//! reproducible; with `--seconds` it stops after `S` seconds if `N` is not reached first (`N` =
//! 0: no count limit). `--random N SEED` generates inputs biased towards real command headers and
//! addresses inside the ring/batch pages.
//!
//! A broken guarantee (a panic) writes the input to `DIR/crash-NAME-SEED-I` (`DIR` defaults to
//! `.`) and exits with status 1. See docs/fuzzing.md.

use gmig_cmdparser::all_commands;
use gmig_cmdparser_fuzz::mutate::{mutate, Rng};

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn random_input(s: &mut u64) -> Vec<u8> {
    let n = (xorshift(s) % 1200) as usize;
    let mut v = vec![
        (xorshift(s) % 36) as u8,
        xorshift(s) as u8,
        xorshift(s) as u8,
        xorshift(s) as u8,
    ];
    let rows = all_commands();
    while v.len() < n {
        let r = xorshift(s);
        let d: u32 = match r % 8 {
            0..=2 => {
                let row = &rows[(r >> 8) as usize % rows.len()];
                row.header(((r >> 40) % 12) as u32)
            }
            3 => 0,
            4 => 0x0400_0000 + ((r >> 8) as u32 % 0x3000) / 4 * 4,
            _ => (r >> 16) as u32,
        };
        v.extend(d.to_le_bytes());
    }
    v
}

/// The harness `name` runs; returns whether the input was accepted (where a harness says).
fn harness(name: &str) -> fn(&[u8]) -> bool {
    match name {
        "decode_walk_remap" => |d| {
            gmig_cmdparser_fuzz::run(d);
            false
        },
        "stream_decode" => |d| {
            gmig_test_support::fuzz::stream_decode(d);
            false
        },
        "aub_read" => |d| {
            gmig_test_support::fuzz::aub_read(d);
            false
        },
        "vgpu_resume" => gmig_test_support::fuzz::vgpu_resume,
        // Accepted: the vGPU answered after GDRST alone (no device reset needed).
        "vgpu_guest" => |d| gmig_test_support::fuzz::vgpu_guest(d).gdrst_recovers,
        "vfio_user_session" => |d| {
            gmig_test_support::fuzz::vfio_user_session(d);
            false
        },
        other => {
            eprintln!("unknown target {other}");
            std::process::exit(2)
        }
    }
}

fn read_inputs(paths: &[String]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for a in paths {
        let mut files: Vec<std::path::PathBuf> = match std::fs::read_dir(a) {
            Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(_) => vec![a.into()],
        };
        files.sort();
        out.extend(files.iter().filter_map(|p| std::fs::read(p).ok()));
    }
    out
}

/// Runs `input`; on a panic, saves it as `dir/crash-name-tag` and exits with status 1.
fn run_one(run: fn(&[u8]) -> bool, input: &[u8], dir: &str, name: &str, tag: &str) -> bool {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(input))) {
        Ok(accepted) => accepted,
        Err(_) => {
            let path = std::path::Path::new(dir).join(format!("crash-{name}-{tag}"));
            let _ = std::fs::create_dir_all(dir);
            let _ = std::fs::write(&path, input);
            eprintln!(
                "CRASH: {}-byte input saved to {}",
                input.len(),
                path.display()
            );
            std::process::exit(1)
        }
    }
}

fn main() {
    gmig_cmdparser_fuzz::keep_heap();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut take = |flag: &str, n: usize| -> Option<Vec<String>> {
        let i = args.iter().position(|a| a == flag)?;
        let v: Vec<String> = args.drain(i..(i + 1 + n).min(args.len())).skip(1).collect();
        Some(v)
    };
    let target = take("--target", 1)
        .and_then(|v| v.into_iter().next())
        .unwrap_or_else(|| "decode_walk_remap".into());
    let artifacts = take("--artifacts", 1)
        .and_then(|v| v.into_iter().next())
        .unwrap_or_else(|| ".".into());
    let seconds: Option<f64> = take("--seconds", 1).and_then(|v| v.first()?.parse().ok());
    let mutate_args = take("--mutate", 2);
    let random_args = take("--random", 2);
    let run = harness(&target);
    let t = std::time::Instant::now();

    if let Some(r) = random_args {
        let n: u64 = r.first().and_then(|a| a.parse().ok()).unwrap_or(100_000);
        let mut seed: u64 = r
            .get(1)
            .and_then(|a| a.parse().ok())
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        for i in 0..n {
            let input = random_input(&mut seed);
            run_one(
                |d| {
                    gmig_cmdparser_fuzz::run(d);
                    false
                },
                &input,
                &artifacts,
                "decode_walk_remap",
                &format!("random-{i}"),
            );
        }
        println!(
            "{n} random inputs, no crash, {:.1}s",
            t.elapsed().as_secs_f64()
        );
        return;
    }

    let corpus = read_inputs(&args);
    let mut accepted = 0u64;
    for (i, input) in corpus.iter().enumerate() {
        accepted += u64::from(run_one(
            run,
            input,
            &artifacts,
            &target,
            &format!("input-{i}"),
        ));
    }
    let Some(m) = mutate_args else {
        println!(
            "{target}: {} inputs, {accepted} accepted, no crash, {:.1}s",
            corpus.len(),
            t.elapsed().as_secs_f64()
        );
        return;
    };
    let n: u64 = m.first().and_then(|a| a.parse().ok()).unwrap_or(0);
    let seed: u64 = m.get(1).and_then(|a| a.parse().ok()).unwrap_or(1);
    if corpus.is_empty() {
        eprintln!("--mutate needs at least one input");
        std::process::exit(2);
    }
    let mut rng = Rng::new(seed);
    let mut input = Vec::new();
    let (mut runs, mut ok) = (0u64, 0u64);
    let t = std::time::Instant::now();
    while n == 0 || runs < n {
        if runs % 256 == 0 && seconds.is_some_and(|s| t.elapsed().as_secs_f64() >= s) {
            break;
        }
        mutate(&mut rng, &corpus, &mut input);
        ok += u64::from(run_one(
            run,
            &input,
            &artifacts,
            &target,
            &format!("{seed}-{runs}"),
        ));
        runs += 1;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{target}: {} corpus inputs ({accepted} accepted), then {runs} mutations (seed {seed}, \
         {ok} accepted), no crash, {secs:.1}s, {:.0} exec/s",
        corpus.len(),
        runs as f64 / secs.max(1e-9)
    );
}
