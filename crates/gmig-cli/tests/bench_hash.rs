//! `gmig bench hash --json` prints one JSON object whose ratio is hash over read.

use gmig_test_support::assert_success;
use std::process::Command;

#[test]
fn bench_hash_json_reports_consistent_figures() {
    let out = Command::new(env!("CARGO_BIN_EXE_gmig"))
        .args([
            "bench",
            "hash",
            "--size-mib",
            "8",
            "--threads",
            "2",
            "--reps",
            "1",
            "--json",
        ])
        .output()
        .expect("gmig runs");
    assert_success(&out);
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "one JSON object: {text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let hash = v["hash_gbps"].as_f64().unwrap();
    let read = v["read_gbps"].as_f64().unwrap();
    let ratio = v["ratio"].as_f64().unwrap();
    assert!(hash > 0.0 && read > 0.0);
    assert!((ratio - hash / read).abs() < 0.01 * ratio.max(1.0), "{v}");
    assert_eq!(v["threads"].as_u64(), Some(2));
    assert_eq!(v["size_mib"].as_u64(), Some(8));
}

#[test]
fn bench_hash_rejects_zero_size() {
    let out = Command::new(env!("CARGO_BIN_EXE_gmig"))
        .args(["bench", "hash", "--size-mib", "0", "--json"])
        .output()
        .expect("gmig runs");
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn other_benches_are_built() {
    // `bench migrate` and `bench paper` (issue 8) exist now: a bad filter is a runtime error
    // (exit 1), not "not built" (exit 4), and is refused before anything runs.
    for what in ["migrate", "paper"] {
        let out = Command::new(env!("CARGO_BIN_EXE_gmig"))
            .args(["bench", what, "--reps", "0"])
            .output()
            .expect("gmig runs");
        assert_eq!(out.status.code(), Some(1), "bench {what}");
    }
}
