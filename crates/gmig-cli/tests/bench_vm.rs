//! `gmig bench vm --json`: a whole-VM migration of a real KVM guest, its RAM migrated by the VMM
//! separately from the vGPU. Needs /dev/kvm; skips loudly without it.

use std::process::Command;

use serde_json::Value;

mod common;
use common::{f, u};
#[path = "common/kvm_bench.rs"]
mod kvm_bench;
use kvm_bench::{bench_json, kvm};

#[test]
fn a_tiny_vm_matrix_is_consistent_and_identical() {
    if !kvm("real KVM guest to migrate") {
        return;
    }
    let out = bench_json(
        "vm",
        &[
            "--profiles",
            "compute",
            "--ram-mib",
            "32",
            "--links",
            "unlimited,25",
            "--reps",
            "1",
            "--frames",
            "12",
            "--at-frame",
            "4",
            "--scratch-pages",
            "32",
            "--dirty-log",
            "get,auto",
            "--thp",
            "off,on",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let rows = v["rows"].as_array().expect("rows");
    // Rows: link, then dirty-log mode, then THP.
    assert_eq!(rows.len(), 8, "{v}");
    for (i, r) in rows.iter().enumerate() {
        // `get` asked for is what ran; `auto` is manual protect where this KVM offers it.
        let mode = r["dirty_log_mode"].as_str().expect("dirty_log_mode");
        if (i / 2) % 2 == 0 {
            assert_eq!(mode, "get", "{r}");
        } else {
            assert!(
                ["get", "manual-protect+initially-set", "manual-protect"].contains(&mode),
                "{r}"
            );
            eprintln!("--dirty-log auto ran {mode}");
        }
        // Huge pages asked for or not, the guest ends the same (whether the kernel backs shared
        // memory with them is its setting: `ram_huge_kib` says).
        assert_eq!(r["thp"], i % 2 == 1, "{r}");
        assert!(r["ram_huge_kib"].is_u64(), "{r}");
        // The dirty log's parts are parts of it, and it is part of the RAM phase.
        let log = f(r, &["dirty_log_ms"]);
        assert!(
            f(r, &["kvm_log_ms"]) + f(r, &["gpu_log_ms"]) <= log * 1.001 + 1e-6,
            "{r}"
        );
        assert!(log <= f(r, &["ram_ms"]) * 1.001 + 1e-6, "{r}");
        assert_eq!(r["profile"], "compute");
        assert_eq!(u(r, "ram_mib"), 32);
        assert_eq!(u(r, "scratch_pages"), 32);
        assert_eq!(r["identical"], true, "{r}");
        let p50 = f(r, &["downtime_ms", "p50"]);
        assert!(p50 > 0.0 && p50 <= f(r, &["total_ms"]), "{r}");
        // The phases are parts of the source's downtime.
        let parts: f64 = ["ram_ms", "vgpu_ms", "vcpu_ms", "transfer_ms"]
            .iter()
            .map(|k| f(r, &[k]))
            .sum();
        assert!(parts <= p50 * 1.001 + 1e-6, "{parts} > {p50}: {r}");
        // Round 0 sends the non-zero pages of guest RAM (the destination's starts zeroed), each
        // with its 4 KiB on the wire.
        let pre = u(r, "precopy_pages");
        assert!(pre > 0, "{r}");
        assert!(
            u(r, "wire_bytes") >= (pre + u(r, "final_pages")) * 4096,
            "{r}"
        );
        assert!(u(r, "final_gpu_only_pages") <= u(r, "final_pages"), "{r}");
        assert!(u(r, "rounds") >= 1, "{r}");
    }
    assert!(rows[..4].iter().all(|r| r["link_gbps"].is_null()));
    assert!(rows[4..].iter().all(|r| f(r, &["link_gbps"]) == 25.0));
}

#[test]
fn bad_vm_bench_arguments_are_refused() {
    for bad in [
        &["--profiles", "idle"][..],
        &["--ram-mib", "0"][..],
        &["--links", "0"][..],
        &["--reps", "0"][..],
        &["--at-frame", "48"][..],
        &["--dirty-log", "ring"][..],
        &["--thp", "maybe"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_gmig"))
            .args(["bench", "vm"])
            .args(bad)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad:?} accepted");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
    }
}
