//! Helpers of the benches that run real KVM guests (`gmig bench vm`, `gmig bench evacuate`).

use std::process::{Command, Output};

/// Whether `/dev/kvm` is here; without it the test skips, saying so (`what`: what it would have
/// run).
pub fn kvm(what: &str) -> bool {
    let ok = std::path::Path::new("/dev/kvm").exists();
    if !ok {
        eprintln!("SKIP: /dev/kvm is absent, so no {what}");
    }
    ok
}

/// `gmig --json bench BENCH ARGS...`, run to its end.
pub fn bench_json(bench: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gmig"))
        .args(["--json", "bench", bench])
        .args(args)
        .output()
        .expect("gmig runs")
}
