//! `gmig bench evacuate --json`: two real KVM guests, each with its vGPU in its own slot,
//! migrated at once over one shared paced link; both destinations finish exactly as their
//! unmigrated runs. Control: with the vGPU's DMA log left out of RAM pre-copy, the pages the
//! vGPU wrote are missed and the check fails. Needs /dev/kvm; skips loudly without it.

use std::process::Output;

use serde_json::Value;

mod common;
use common::{f, u};
#[path = "common/kvm_bench.rs"]
mod kvm_bench;
use kvm_bench::{bench_json, kvm};

fn evacuate(vms: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "--vms",
        vms,
        "--links",
        "1",
        "--ram-mib",
        "16",
        "--frames",
        "10",
        "--at-frame",
        "2",
        "--scratch-pages",
        "16",
        "--round-exits",
        "16",
    ];
    args.extend_from_slice(extra);
    bench_json("evacuate", &args)
}

#[test]
fn two_vms_evacuated_at_once_are_identical_to_their_unmigrated_runs() {
    if !kvm("real KVM guests to evacuate") {
        return;
    }
    let out = evacuate("2", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{v}");
    let r = &rows[0];
    assert_eq!(u(r, "vms"), 2);
    assert_eq!(r["identical"], true, "{r}");
    assert_eq!(u(r, "finished_in_precopy"), 0, "{r}");
    let e = &v["evacuations"][0];
    let each = e["each"].as_array().expect("each VM");
    assert_eq!(each.len(), 2, "{e}");
    let mut wire = 0;
    for (i, vm) in each.iter().enumerate() {
        assert_eq!(u(vm, "index"), i as u64);
        // Each VM has its own guest, its own source slot and another slot on its destination.
        assert_eq!(u(vm, "seed"), 1 + i as u64);
        assert_eq!(vm["slots"], serde_json::json!([i, i + 1]), "{vm}");
        assert_eq!(vm["identical"], true, "{vm}");
        // The switch-over left the destination work: it finished the guest's frames.
        assert!(u(vm, "frames_at_stop") >= 2, "{vm}");
        assert!(u(vm, "destination_frames") > 0, "{vm}");
        assert_eq!(vm["finished_in_precopy"], false, "{vm}");
        assert_eq!(
            u(vm, "frames_at_stop") + u(vm, "destination_frames"),
            10,
            "{vm}"
        );
        let m = &vm["migration"];
        assert!(f(m, &["downtime_ms"]) > 0.0, "{vm}");
        assert!(f(vm, &["ended_ms"]) > f(vm, &["started_ms"]), "{vm}");
        wire += u(m, "wire_bytes");
    }
    // Both went over the one link: its bytes are theirs (the pacing itself is tested in
    // `bench::evacuate`).
    assert_eq!(u(e, "link_bytes"), wire, "{e}");
    let want = wire as f64 * 8.0 / 1e6;
    assert!((f(e, &["link_bound_ms"]) - want).abs() < 1e-6 * want, "{e}");

    // Control (one VM, to keep it short): RAM pre-copy without the vGPU's DMA log misses what
    // the vGPU wrote.
    let out = evacuate("1", &["--x-no-gpu-dirty"]);
    assert!(
        !out.status.success(),
        "an evacuation blind to the vGPUs' writes passed its check: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The report, then the failed check's own line.
    let text = String::from_utf8(out.stdout).unwrap();
    let v: Value = serde_json::from_str(text.lines().next().unwrap_or_default())
        .expect("the report still comes");
    assert_eq!(v["rows"][0]["identical"], false, "{v}");
}
