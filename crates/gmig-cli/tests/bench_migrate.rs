//! `gmig bench migrate --json` on a tiny matrix: the schema, and figures that agree with each
//! other. `gmig bench paper --json` on one profile. `--out` writes JSON, Markdown and two SVGs.

use std::process::Command;

use serde_json::Value;

mod common;
use common::{f, u};

const TINY: [&str; 8] = [
    "--types",
    "64+384",
    "--ram-mib",
    "24",
    "--small-workload",
    "--threads",
    "2",
    "--json",
];

fn gmig(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_gmig"))
        .args(args)
        .output()
        .expect("gmig runs");
    assert!(
        out.status.success(),
        "gmig {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "one JSON object: {text}");
    serde_json::from_str(&text).unwrap()
}

#[test]
fn tiny_matrix_json_is_complete_and_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench");
    let mut args = vec![
        "bench",
        "migrate",
        "--profiles",
        "desktop",
        "--policies",
        "stop-and-copy,one-shot,one-shot-narrow",
        "--links",
        "unlimited,25",
        "--reps",
        "2",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(TINY);
    let v = gmig(&args);
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 3 * 2, "policies x links: {v}");
    // The other two policies against one-shot-narrow, per link, from the same rows.
    let cmp = v["comparison"].as_array().expect("comparison");
    assert_eq!(cmp.len(), 2 * 2, "{v}");
    for c in cmp {
        let row = |policy: &str| {
            rows.iter()
                .find(|r| r["policy"] == policy && r["link_gbps"] == c["link_gbps"])
                .unwrap()
        };
        let (other, narrow) = (row(c["policy"].as_str().unwrap()), row("one-shot-narrow"));
        assert_ne!(c["policy"], "one-shot-narrow");
        let want = f(other, &["downtime_ms", "p50"]) / f(narrow, &["downtime_ms", "p50"]);
        assert!((f(c, &["downtime_ratio"]) - want).abs() < 1e-9, "{c}");
        if u(narrow, "pages_stop_copy") == 0 {
            // Nothing to divide by (narrow's stop sent no page): no ratio.
            assert!(c["stop_copy_pages_ratio"].is_null(), "{c}");
        } else {
            let want = u(other, "pages_stop_copy") as f64 / u(narrow, "pages_stop_copy") as f64;
            assert!(
                (f(c, &["stop_copy_pages_ratio"]) - want).abs() < 1e-9,
                "{c}"
            );
        }
    }
    for r in rows {
        assert_eq!(r["profile"], "desktop");
        assert_eq!(r["vgpu_type"], "64+384");
        assert_eq!(u(r, "vgpu_mib"), 448);
        assert_eq!(u(r, "guest_mib"), 24);
        assert_eq!(u(r, "max_drain"), 0, "the engine's default: carry: {r}");
        if r["policy"] == "one-shot-narrow" {
            let v = u(r, "verify_rounds");
            assert!((1..=8).contains(&v), "{r}");
        } else {
            assert_eq!(u(r, "verify_rounds"), 0, "{r}");
        }
        assert_eq!(u(r, "drained_workloads"), 0, "{r}");
        // The GPU's working set: some frames, never more than guest RAM has.
        let gtt = u(r, "gtt_backed_pages");
        assert!(gtt > 0 && gtt <= (24 << 20) / 4096, "{r}");
        assert_eq!(u(r, "reps"), 2);
        assert_eq!(r["downtime_samples_ms"].as_array().unwrap().len(), 2);
        // The guest draws on its own clock (desktop: 60 fps), so there are no frame phases to
        // sample, and each repetition's destination equals an unmigrated run of as many frames.
        assert_eq!(r["guest_clock"], "60 fps", "{r}");
        assert_eq!(r["frame_phases"], serde_json::json!([]), "{r}");
        assert_eq!(r["identical"], true, "{r}");
        let (p50, p95, max) = (
            f(r, &["downtime_ms", "p50"]),
            f(r, &["downtime_ms", "p95"]),
            f(r, &["downtime_ms", "max"]),
        );
        assert!(0.0 < p50 && p50 <= p95 && p95 <= max, "{r}");
        assert!(f(r, &["downtime_ms", "min"]) <= p50);
        assert!(max <= f(r, &["total_ms", "max"]) + 1e-9, "{r}");
        for k in [
            "quiesce_ms",
            "hash_ms",
            "transfer_ms",
            "restore_ms",
            "remap_ms",
        ] {
            assert!(f(r, &[k]) >= 0.0, "{k}: {r}");
        }
        let (pre, stop, total) = (
            u(r, "pages_precopy"),
            u(r, "pages_stop_copy"),
            u(r, "pages_total"),
        );
        assert!(stop <= total && pre <= total, "{r}");
        // Every guest page travels at least once (24 MiB of 4 KiB pages).
        assert!(total >= 24 * 256, "{r}");
        assert!(u(r, "bytes_stop_copy") > 0);
        assert!(f(r, &["read_gbps"]) > 0.0);
        let bound = f(r, &["bound_ms"]);
        assert!(bound > 0.0, "{r}");
        let (bl, bh) = (f(r, &["bound_link_ms"]), f(r, &["bound_hash_ms"]));
        // Each repetition's bound is the sum of its terms, so the medians keep the order.
        assert!(bound + 1e-9 >= bl && bound + 1e-9 >= bh, "{r}");
        assert!(f(r, &["downtime_over_bound"]) > 0.0);
        match r["link_gbps"].as_f64() {
            None => {
                // Unlimited: the bound's link runs at the probed loopback rate.
                assert!(f(r, &["loopback_gbps"]) > 0.0, "{r}");
                assert!(bl > 0.0, "{r}");
            }
            Some(g) => {
                assert_eq!(g, 25.0);
                assert!(bl > 0.0);
                assert_eq!(f(r, &["loopback_gbps"]), 0.0, "{r}");
            }
        }
        if r["policy"] == "stop-and-copy" {
            assert_eq!(pre, 0, "{r}");
            assert_eq!(stop, total);
            assert_eq!(u(r, "bytes_precopy"), 0);
        } else {
            assert!(
                pre >= 24 * 256,
                "one pass over all pages while running: {r}"
            );
            assert!(stop < pre, "{r}");
        }
        if r["policy"] == "one-shot" {
            assert_eq!(u(r, "pages_rehashed"), 24 * 256, "full re-hash: {r}");
        }
        if r["policy"] == "one-shot-narrow" && r["widened"] == false {
            assert!(u(r, "pages_rehashed") < 24 * 256, "{r}");
        }
    }
    let targets = v["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 5);
    for t in targets {
        assert!(t["target"].is_string() && t["detail"].is_string(), "{t}");
        assert!(t["met"].is_boolean() || t["met"].is_null(), "{t}");
    }
    // The reduction target is judged here (stop-and-copy and narrow both ran).
    assert!(targets[1]["met"].is_boolean(), "{}", targets[1]);
    assert_eq!(v["matrix"]["reps"], 2);
    assert!(v["machine"]["cpus"].as_u64().unwrap() >= 1);

    for name in [
        "migrate.json",
        "migrate.md",
        "downtime-by-policy.svg",
        "downtime-by-size.svg",
    ] {
        let p = out.join(name);
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(!text.is_empty(), "{name}");
        if name.ends_with(".svg") {
            assert!(text.contains("<svg"), "{name}");
            assert!(text.contains("one-shot-narrow"), "{name} has a legend");
        }
    }
    let on_disk: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("migrate.json")).unwrap()).unwrap();
    assert_eq!(on_disk["rows"], v["rows"]);
    let md = std::fs::read_to_string(out.join("migrate.md")).unwrap();
    // Six rows, then four comparisons with one-shot-narrow.
    assert_eq!(
        md.lines().filter(|l| l.contains("| desktop |")).count(),
        6 + 4
    );
    assert!(md.contains("Policies against one-shot-narrow"), "{md}");
    assert!(md.contains("one-shot (gMig paper)"), "{md}");
}

/// `--max-drain` and `--max-drain-ms` reach the engine: two workloads may finish, but with no
/// time for it the stop completes none (it preempts at once); without the time bound it
/// completes some. `--verify-rounds 1` verifies once. `--gpu-ahead` runs part of each frame on submission, so the stop finds work
/// part-way. The guest is batch-stepped (`--batch-stepped`), so the stop always finds the last
/// frame in flight.
#[test]
fn max_drain_and_its_time_bound_reach_the_engine() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "migrate",
            "--profiles",
            "3d",
            "--policies",
            "one-shot-narrow",
            "--links",
            "unlimited",
            "--reps",
            "1",
            "--gpu-ahead",
            "3",
            "--batch-stepped",
        ];
        args.extend(extra);
        args.extend(TINY);
        let v = gmig(&args);
        let rows = v["rows"].as_array().expect("rows").clone();
        assert_eq!(rows.len(), 1, "{v}");
        assert_eq!(u(&rows[0], "gpu_ahead"), 3, "{v}");
        assert_eq!(rows[0]["guest_clock"], "1 frame / 8 batches", "{v}");
        assert_eq!(rows[0]["frame_phases"], serde_json::json!([0]), "{v}");
        assert_eq!(rows[0]["identical"], true, "{v}");
        rows[0].clone()
    };
    let bounded = run(&[
        "--max-drain",
        "2",
        "--max-drain-ms",
        "0",
        "--verify-rounds",
        "1",
    ]);
    assert_eq!(u(&bounded, "max_drain"), 2, "{bounded}");
    assert_eq!(u(&bounded, "verify_rounds"), 1, "{bounded}");
    assert_eq!(bounded["max_drain_ms"], 0.0, "{bounded}");
    assert_eq!(u(&bounded, "drained_workloads"), 0, "{bounded}");
    let drained = run(&["--max-drain", "2"]);
    assert!(drained["max_drain_ms"].is_null(), "{drained}");
    assert!(u(&drained, "drained_workloads") >= 1, "{drained}");
}

#[test]
fn paper_json_compares_with_the_paper() {
    let mut args = vec![
        "bench",
        "paper",
        "--profiles",
        "desktop",
        "--links",
        "10",
        "--reps",
        "1",
    ];
    args.extend(TINY);
    let v = gmig(&args);
    assert_eq!(f(&v, &["paper", "linux_downtime_ms"]), 119.0);
    assert_eq!(f(&v, &["paper", "windows_downtime_ms"]), 302.0);
    assert_eq!(f(&v, &["paper", "spared_pct"]), 80.0);
    let p = &v["profiles"][0];
    assert_eq!(p["profile"], "desktop");
    let without = u(p, "pages_without");
    let narrow = u(p, "pages_narrow");
    assert!(narrow < without, "{p}");
    let spared = f(p, &["spared_narrow_pct"]);
    let want = 100.0 * (1.0 - narrow as f64 / without as f64);
    assert!((spared - want).abs() < 1e-9, "{p}");
    assert_eq!(v["rows"].as_array().unwrap().len(), 3);
}

#[test]
fn bad_filters_are_usage_errors() {
    for bad in [
        &["--types", "1+1"][..],
        &["--links", "0"][..],
        &["--reps", "0"][..],
        &["--guest-fps", "0"][..],
        &["--guest-fps", "fast"][..],
        &["--guest-fps", "60", "--batch-stepped"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_gmig"))
            .args(["bench", "migrate", "--profiles", "idle"])
            .args(bad)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad:?} accepted");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
    }
}
