//! `gmig migrate` between two processes over TCP, and `gmig demo --json`.

use gmig_test_support::assert_success;
use std::net::TcpListener;
use std::process::{Command, Stdio};

fn gmig() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gmig"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits for `child`; one still running after `limit` is killed and the test fails, naming it.
fn wait_at_most(
    mut child: std::process::Child,
    limit: std::time::Duration,
) -> std::process::Output {
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn json(out: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(out);
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {text}"))
}

fn pair(dest_type: &str, policy: &str) -> (std::process::Output, std::process::Output) {
    pair_at(
        &format!("127.0.0.1:{}", free_port()),
        dest_type,
        policy,
        &[],
    )
}

/// A destination and a source (`source_args` added to its command line) migrating a desktop guest
/// on 48 MiB that ran one frame before.
fn pair_at(
    addr: &str,
    dest_type: &str,
    policy: &str,
    source_args: &[&str],
) -> (std::process::Output, std::process::Output) {
    let addr = addr.to_string();
    let dest = gmig()
        .args(["--json", "migrate", "--listen", &addr, "--ram-mib", "48"])
        .args(["--vgpu-type", dest_type])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let src = gmig()
        .args([
            "--json",
            "migrate",
            "--to",
            &addr,
            "--ram-mib",
            "48",
            "--frames-before",
            "1",
        ])
        .args([
            "--profile",
            "desktop",
            "--vgpu-type",
            "64+384",
            "--policy",
            policy,
        ])
        .args(source_args)
        .output()
        .unwrap();
    (src, wait_at_most(dest, std::time::Duration::from_secs(120)))
}

/// Where the source places its 64+384 vGPU (first fit): aperture and hidden bases.
fn source_slices() -> [u64; 2] {
    use gmig_vgpu::gm::{HostConfig, PartitionManager};
    let ty = gmig_vgpu::migratable::parse_vgpu_type("64+384").unwrap();
    let (_, s) = PartitionManager::new(HostConfig::default())
        .unwrap()
        .place(ty)
        .unwrap();
    [s.aperture.base.0, s.hidden.base.0]
}

/// The guest-visible state digest (`state_digest`) of the same guest as [`pair_at`]'s source
/// (desktop, seed 1, 48 MiB, first fit on the host), run here unmigrated for `frames` frames and
/// the work they queued.
fn reference_digest(frames: u64) -> String {
    use gmig_vgpu::gm::{HostConfig, PartitionManager};
    use gmig_vgpu::migratable::{parse_vgpu_type, VgpuVm};
    use gmig_vgpu::workload::{Profile, WorkloadConfig};
    let ty = parse_vgpu_type("64+384").unwrap();
    let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
    let (_, slices) = pm.place(ty).unwrap();
    let mut vm = VgpuVm::boot(
        ty,
        slices,
        48 << 20,
        Profile::Desktop,
        WorkloadConfig::default(),
        1,
    )
    .unwrap();
    vm.run_steps(frames).unwrap();
    vm.run_queued();
    format!(
        "{:016x}",
        gmig_vgpu::compare::guest_visible_digest(vm.vgpu())
    )
}

#[test]
fn migrate_between_two_processes() {
    // The stop lets no workload finish on the source: the last frame's two (a client and a
    // compositor batch) travel, the first preempted 3 commands in (the source's GPU runs that
    // much of each frame as it is submitted), and the destination, on other slices (it places a
    // neighbour first), must resume it there and run the other after the switch-over.
    let addr = format!("127.0.0.1:{}", free_port());
    let (src, dst) = pair_at(
        &addr,
        "64+384",
        "one-shot-narrow",
        &["--max-drain", "0", "--gpu-ahead", "3"],
    );
    assert_success(&src);
    assert_success(&dst);
    let s = json(&src.stdout);
    let d = json(&dst.stdout);
    assert_eq!(s["policy"], "one-shot-narrow");
    assert_eq!(s["role"], "source");
    let total = s["pages_total"].as_u64().unwrap();
    // Every page once, the pages the verification before the stop found changed, and the
    // stop-copy pages.
    assert_eq!(
        total,
        (48 << 20) / 4096
            + s["pages_verify_resent"].as_u64().unwrap()
            + s["pages_stop_copy"].as_u64().unwrap()
    );
    assert_eq!(d["pages_received"].as_u64().unwrap(), total);
    assert!(s["downtime_ms"].as_f64().unwrap() > 0.0);
    // Nothing drained on the source; the destination ran the carried workloads, without a fault
    // (a workload with stale graphics addresses would be refused, and fault)...
    assert_eq!(s["drained_workloads"], 0, "{s}");
    assert_eq!(d["carried_workloads_run"], 2, "{d}");
    assert_eq!(d["carried_preempted_at"], 3, "{d}");
    assert_eq!(d["gpu_faults"], 0, "{d}");
    assert_ne!(d["slices"][0], source_slices()[0], "the vGPU moved: {d}");
    // ...and ended with what the same guest has unmigrated: what those workloads wrote included.
    let frames = s["frames"].as_u64().unwrap();
    assert_eq!(
        d["state_digest"].as_str().unwrap(),
        reference_digest(frames),
        "the destination's state differs from the unmigrated guest's after {frames} frames"
    );
}

#[test]
fn an_incompatible_destination_refuses_and_the_source_says_why() {
    let (src, dst) = pair("128+512", "one-shot");
    assert_eq!(src.status.code(), Some(1));
    assert_eq!(dst.status.code(), Some(1));
    let s = json(&src.stdout);
    let err = s["error"].as_str().unwrap();
    assert!(err.contains("incompatible vGPU type"), "{err}");
    assert!(err.contains("running on the source again"), "{err}");
}

#[test]
fn demo_reports_an_identical_migration() {
    let out = gmig().args(["demo", "--json"]).output().unwrap();
    assert_success(&out);
    let v = json(&out.stdout);
    assert_eq!(v["identical"], true);
    assert_eq!(v["policy"], "one-shot-narrow");
    for k in [
        "downtime_ms",
        "pages_precopy",
        "pages_stop_copy",
        "pages_total",
        "bytes_on_wire",
    ] {
        assert!(v[k].is_number(), "{k} missing: {v}");
    }
    assert!(v["pages_stop_copy"].as_u64().unwrap() < v["pages_precopy"].as_u64().unwrap() / 5);
    // The guest drew on its own clock (60 fps), from the five frames it ran before.
    assert_eq!(v["clock"]["clocked"]["fps"], 60.0, "{v}");
    let at_stop = v["frames_at_stop"].as_u64().unwrap();
    assert!(at_stop >= 5, "{v}");
    assert_eq!(
        v["steps_during_precopy"].as_u64().unwrap(),
        at_stop - 5,
        "{v}"
    );
}

#[test]
fn migrate_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("unix:{}", dir.path().join("gmig.sock").display());
    let (src, dst) = pair_at(&addr, "64+384", "iterative", &[]);
    assert_success(&src);
    assert_success(&dst);
    assert_eq!(json(&src.stdout)["policy"], "iterative");
}

#[test]
fn a_bad_address_is_a_clear_error() {
    let out = gmig()
        .args(["migrate", "--to", "nowhere"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("neither HOST:PORT nor unix:PATH"), "{err}");
}

#[test]
fn an_incoming_stream_of_random_bytes_is_refused_with_its_cause_said_once() {
    use std::io::Write as _;
    let addr = format!("127.0.0.1:{}", free_port());
    let dest = gmig()
        .args(["migrate", "--listen", &addr, "--ram-mib", "48"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Deterministic noise that cannot start with the stream magic.
    let noise: Vec<u8> = (0u32..65_536)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut conn = None;
    for _ in 0..200 {
        match std::net::TcpStream::connect(&addr) {
            // A connect retried while nothing listens can meet itself (TCP simultaneous open,
            // when the kernel picks the same port as the source): that is not the destination.
            Ok(c) if !gmig_core::transport::met_itself(&c) => {
                conn = Some(c);
                break;
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
    let mut conn = conn.expect("destination listens");
    let _ = conn.write_all(&noise);
    drop(conn);
    let out = wait_at_most(dest, std::time::Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("bad magic").count(), 1, "{err}");
}
