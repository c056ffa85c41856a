//! Runs the fuzz harness without libFuzzer: over the files named on the command line (a corpus),
//! or, with `--random N [SEED]`, over N pseudo-random inputs (a xorshift generator biased towards
//! command headers). Exits non-zero on the first broken guarantee (a panic).

use gmig_cmdparser::all_commands;

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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--random") {
        let n: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
        let mut seed: u64 = args
            .get(2)
            .and_then(|a| a.parse().ok())
            .unwrap_or(0x9e37_79b9_7f4a_7c15);
        let t = std::time::Instant::now();
        for _ in 0..n {
            let input = random_input(&mut seed);
            gmig_cmdparser_fuzz::run(&input);
        }
        println!(
            "{n} random inputs, no crash, {:.1}s",
            t.elapsed().as_secs_f64()
        );
        return;
    }
    let mut count = 0;
    for a in &args {
        let paths: Vec<std::path::PathBuf> = match std::fs::read_dir(a) {
            Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(_) => vec![a.into()],
        };
        for p in paths {
            if let Ok(data) = std::fs::read(&p) {
                gmig_cmdparser_fuzz::run(&data);
                count += 1;
            }
        }
    }
    println!("{count} inputs, no crash");
}
