//! QEMU's own migration figures for a VM with a gmig vGPU, against the same VM without it, and
//! against `gmig vm migrate` (`gmig bench vm`) for the same guest GPU driver.
//!
//! `cargo bench -p gmig-cli --bench qemu_migration [-- --ram-mib 1024,4096 --reps 1]`
//!
//! For each guest RAM size, three VMs migrate on this machine (QEMU 10.2.2 with
//! `integrations/qemu/patches`, TCG, `-cpu max`, memfd RAM; the destination's vGPU in another
//! slot), each over QMP `migrate` to `tcp:127.0.0.1` with `downtime-limit` 300 ms and
//! `max-bandwidth` 10 Gbit/s (1.25e9 bytes/s):
//! - *no vGPU*: the Linux guest sleeps, no vfio-user device;
//! - *vGPU, idle*: the same with the vGPU attached (`gmig serve`), the guest sleeping;
//! - *vGPU, rendering*: the guest GPU driver renders the desktop profile through the migration,
//!   and the destination's guest must print frames after the switch-over.
//!
//! It prints `query-migrate`'s `downtime`, `total-time` and `setup-time`, the RAM and device
//! bytes, one markdown row per run; then `gmig bench vm --links 10` (the freestanding driver under
//! `gmig-vmm`, KVM) at the same sizes. Skips, saying why, where QEMU's source tarball is absent.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gmig_test_support::qemu::pair::Pair;
use gmig_test_support::qemu::{qemu_source_present, Tools, VmSpec};
use serde_json::Value;

fn gmig() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_gmig"))
}

#[derive(Clone, Copy, PartialEq)]
enum Case {
    NoVgpu,
    VgpuIdle,
    VgpuRendering,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::NoVgpu => "no vGPU, guest idle",
            Case::VgpuIdle => "vGPU, guest idle",
            Case::VgpuRendering => "vGPU, guest rendering",
        }
    }

    fn spec(self, socket: &Path, ram_mib: u64, extra: Vec<String>) -> VmSpec {
        let (gpus, run) = match self {
            Case::NoVgpu => (vec![], "/bin/sleep,100000"),
            Case::VgpuIdle => (vec![socket.to_path_buf()], "/bin/sleep,100000"),
            Case::VgpuRendering => (
                vec![socket.to_path_buf()],
                "/bin/gmig-guest,--profile,desktop,--frames,100000000",
            ),
        };
        VmSpec {
            gpus,
            run: Some(run.to_string()),
            ram_mib,
            extra,
            ..VmSpec::default()
        }
    }
}

/// `--name a,b` from the command line (after cargo's own `--bench`).
fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn list(name: &str, default: &str) -> Vec<u64> {
    arg(name)
        .unwrap_or_else(|| default.to_string())
        .split(',')
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}: not a number: {v}"))
        })
        .collect()
}

/// One migration of `case` with `ram_mib` of guest RAM; `query-migrate`'s end.
fn migrate_once(tools: &Tools, dir: &Path, tag: &str, case: Case, ram_mib: u64) -> Value {
    let mut p = Pair::start(gmig(), tools, dir, tag, &[], &[], |socket, extra| {
        case.spec(socket, ram_mib, extra)
    });
    match case {
        Case::VgpuRendering => p.wait_source(|l| l.starts_with("frame 32 ")),
        _ => {
            p.wait_source(|l| l.starts_with("GMIG-GUEST: up"));
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    // 10 Gbit/s (QEMU's default is 128 MiB/s), as `gmig bench vm --links 10` below.
    let q = p.migrate(r#"{"downtime-limit":300,"max-bandwidth":1250000000}"#);
    assert_eq!(q["status"], "completed", "{q}\n{}", p.logs());
    if case == Case::VgpuRendering {
        // The destination does the work after the switch-over.
        assert!(
            p.dst
                .wait_for(Duration::from_secs(60), |l| l.starts_with("frame ")),
            "the destination's guest rendered nothing after the switch-over:\n{}",
            p.logs()
        );
        assert!(
            !p.dst.console().contains("seqno timeout"),
            "the destination's vGPU did not complete the guest's work:\n{}",
            p.logs()
        );
    }
    q
}

fn main() {
    if !qemu_source_present() {
        eprintln!("SKIPPED: QEMU's source tarball is not in ../shared/qemu: no QEMU to measure");
        return;
    }
    let sizes = list("--ram-mib", "1024,4096");
    let reps = list("--reps", "1")[0];
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let tools = Tools::get(scratch.path()).unwrap_or_else(|e| panic!("QEMU or the guest: {e}"));
    println!(
        "| guest RAM | VM | downtime (ms) | total (ms) | setup (ms) | RAM bytes | vGPU bytes |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &ram in &sizes {
        for case in [Case::NoVgpu, Case::VgpuIdle, Case::VgpuRendering] {
            for rep in 0..reps {
                let dir: PathBuf = scratch.path().join(format!("{ram}-{}-{rep}", case as u8));
                std::fs::create_dir_all(&dir).expect("run directory");
                let q = migrate_once(&tools, &dir, "m", case, ram);
                println!(
                    "| {ram} MiB | {} | {} | {} | {} | {} | {} |",
                    case.name(),
                    q["downtime"],
                    q["total-time"],
                    q["setup-time"],
                    q["ram"]["transferred"],
                    q["vfio"]["transferred"].as_u64().unwrap_or(0)
                );
            }
        }
    }
    // The same guest GPU driver, freestanding under gmig-vmm on this machine's KVM.
    if !Path::new("/dev/kvm").exists() {
        eprintln!("SKIPPED: /dev/kvm is absent: no `gmig bench vm` row");
        return;
    }
    let mib: Vec<String> = sizes.iter().map(u64::to_string).collect();
    let out = Command::new(gmig())
        .args(["--json", "bench", "vm", "--profiles", "desktop", "--links"])
        .args(["10", "--reps"])
        .arg(reps.to_string())
        .arg("--ram-mib")
        .arg(mib.join(","))
        .output()
        .expect("gmig bench vm");
    assert!(
        out.status.success(),
        "gmig bench vm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("gmig bench vm prints JSON");
    println!(
        "\n`gmig --json bench vm --profiles desktop --links 10 --reps {reps} --ram-mib {}` \
         (the freestanding driver under gmig-vmm):\n",
        mib.join(",")
    );
    println!("| guest RAM | downtime p50 (ms) | total (ms) | bytes on the wire | identical to unmigrated |");
    println!("|---|---|---|---|---|");
    for r in v["rows"].as_array().into_iter().flatten() {
        println!(
            "| {} MiB | {:.2} | {:.0} | {} | {} |",
            r["ram_mib"],
            r["downtime_ms"]["p50"].as_f64().unwrap_or(f64::NAN),
            r["total_ms"].as_f64().unwrap_or(f64::NAN),
            r["wire_bytes"],
            r["identical"]
        );
    }
}
