//! Process-level fault injection: two `gmig migrate` processes talk through a proxy that, at a
//! chosen byte of a chosen direction, SIGKILLs the source, SIGKILLs the destination, or cuts the
//! link (stops forwarding and leaves both connections open, so the ends find out by timeout).
//! One cell per fault and phase: handshake, early and late pre-copy, stop-copy, device state,
//! restore, commit, resume.
//!
//! After each cell: the two sides never both run the vGPU; exactly one side ends up owning it —
//! the one that runs it, or, when no side runs it, an in-doubt copy resumed with
//! `gmig migrate --resume` — except when the source is killed before the destination held a
//! complete state (then the guest dies with its only process, as in a host crash, and the
//! destination must have dropped the partial stream); and the owner's guest-visible state digest
//! equals that of the same guest run in this test process without any migration.
//!
//! The table the test prints is the matrix in docs/reliability.md.

#[path = "common/fault_harness.rs"]
mod harness;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use harness::*;

use gmig_core::stream::{Section, StateKind, StreamDecoder, StreamLimits, HEADER_LEN};
use gmig_vgpu::compare::guest_visible_digest;
use gmig_vgpu::gm::{HostConfig, PartitionManager};
use gmig_vgpu::migratable::{parse_vgpu_type, VgpuVm};
use gmig_vgpu::workload::{Profile, WorkloadConfig};

const TYPE: &str = "64+384";
const RAM_MIB: u64 = 16;
const SEED: u64 = 3;
/// Seconds each side waits for the other: short, so a cut link is noticed quickly.
const TIMEOUT: &str = "3";
/// A control frame without payload (HEADER_ACCEPTED, RESTORED, COMMIT).
const CONTROL: u64 = 16;
/// Bytes of the SYNCED control frame (a frame and its sequence number).
const SYNCED: u64 = CONTROL + 8;

fn common(c: &mut Command) -> &mut Command {
    c.args([
        "--json",
        "migrate",
        "--vgpu-type",
        TYPE,
        "--timeout",
        TIMEOUT,
    ])
    .args(["--ram-mib", &RAM_MIB.to_string()])
    .env("RUST_LOG", "off")
}

/// One `gmig migrate` pair through the proxy, with the fault fired at `trigger` (none: a clean
/// run).
fn run(trigger: Option<(Dir, u64)>, fault: Fault, dir: &Path) -> Run {
    let dest = |addr: &str| {
        let mut c = gmig();
        common(&mut c)
            .args(["--listen", addr, "--checkpoint"])
            .arg(dir.join("destination.gmig"));
        c
    };
    let source = |addr: &str| {
        let mut c = gmig();
        common(&mut c)
            .args(["--to", addr, "--frames-before", "1"])
            // The stop lets no queued workload finish on the source: the last frame's two travel
            // in the stream, and whichever side ends up running the vGPU runs them.
            .args(["--max-drain", "0"])
            .args(["--seed", &SEED.to_string(), "--profile", "desktop"])
            .args(["--policy", "one-shot-narrow", "--checkpoint"])
            .arg(dir.join("source.gmig"));
        c
    };
    run_pair(
        dest,
        source,
        trigger.map(|(d, at)| (d, Limit::Bytes(at))),
        fault,
        None,
        None,
    )
}

/// `gmig migrate --resume FILE`: the resumed copy's JSON.
fn resume(file: &Path) -> serde_json::Value {
    let out = common(&mut gmig())
        .arg("--resume")
        .arg(file)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "resume {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The digest of the same guest run here, unmigrated, for `frames` frames and then idle.
fn reference_digest(frames: u64) -> String {
    let ty = parse_vgpu_type(TYPE).unwrap();
    let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
    let (_, slices) = pm.place(ty).unwrap();
    let mut vm = VgpuVm::boot(
        ty,
        slices,
        RAM_MIB << 20,
        Profile::Desktop,
        WorkloadConfig::default(),
        SEED,
    )
    .unwrap();
    vm.run_steps(frames).unwrap();
    vm.run_queued();
    format!("{:016x}", guest_visible_digest(vm.vgpu()))
}

/// Where the stop's device-state sections start in a captured stream: the offset just before the
/// last byte of its first one, DEVICE_CONFIG (the GGTT goes earlier, with pre-copy).
fn device_state_offset(stream: &[u8]) -> u64 {
    let mut d = StreamDecoder::new(StreamLimits::default(), None);
    for (i, b) in stream.iter().enumerate() {
        d.feed(std::slice::from_ref(b)).unwrap();
        while let Some(s) = d.next_section().unwrap() {
            if matches!(
                s,
                Section::State {
                    kind: StateKind::DeviceConfig,
                    ..
                }
            ) {
                return i as u64;
            }
        }
    }
    panic!("no device-state section in the captured stream");
}

#[test]
fn every_fault_at_every_phase_leaves_exactly_one_owner_and_nothing_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    // A clean run through the proxy gives the stream's layout.
    let base = run(None, Fault::Cut, tmp.path());
    assert_eq!(base.source.code, Some(0), "{:?}", base.source);
    assert_eq!(base.dest.code, Some(0), "{:?}", base.dest);
    let precopy = base
        .source
        .field("bytes_precopy")
        .unwrap()
        .as_u64()
        .unwrap();
    let stream = precopy
        + base
            .source
            .field("bytes_stop_copy")
            .unwrap()
            .as_u64()
            .unwrap();
    assert_eq!(
        base.captured.len() as u64,
        stream + CONTROL,
        "stream and COMMIT"
    );
    let frames_at_stop = base.source.field("frames").unwrap().as_u64().unwrap();
    let migrated = base.dest.field("state_digest").unwrap().as_str().unwrap();
    assert_eq!(
        migrated,
        reference_digest(frames_at_stop),
        "clean migration"
    );
    // Nothing drained on the source: the destination ran the carried workloads after the
    // switch-over, without a fault, and (the digest above) wrote what the unmigrated guest wrote.
    assert_eq!(
        base.source.field("drained_workloads"),
        Some(&0.into()),
        "{:?}",
        base.source
    );
    assert_eq!(
        base.dest.field("carried_workloads_run"),
        Some(&CARRIED.into()),
        "{:?}",
        base.dest
    );
    assert_eq!(base.dest.field("gpu_faults"), Some(&0.into()));
    let device_state = device_state_offset(&base.captured[..stream as usize]);
    let header = HEADER_LEN as u64;
    assert!(header < precopy && precopy < device_state && device_state < stream);

    let phases: [(&str, Dir, u64); 9] = [
        ("handshake", Dir::ToDest, header / 2),
        (
            "early pre-copy",
            Dir::ToDest,
            header + (precopy - header) / 10,
        ),
        (
            "late pre-copy",
            Dir::ToDest,
            header + (precopy - header) * 9 / 10,
        ),
        // HEADER_ACCEPTED crossed; SYNCED (the switch-over acknowledgement) is held: the source
        // waits, its guest running.
        ("switch-over", Dir::ToSource, CONTROL),
        (
            "stop-copy",
            Dir::ToDest,
            precopy + (device_state - precopy) / 2,
        ),
        ("device state", Dir::ToDest, device_state),
        // HEADER_ACCEPTED and SYNCED crossed; RESTORED is held.
        ("restore", Dir::ToSource, CONTROL + SYNCED),
        // The whole stream crossed; COMMIT is held.
        ("commit", Dir::ToDest, stream),
        // RESTORED crossed; RESUMED is held (the destination already runs the vGPU).
        ("resume", Dir::ToSource, 2 * CONTROL + SYNCED),
    ];
    let faults = [Fault::KillSource, Fault::KillDest, Fault::Cut];
    let results = run_cells(&faults, phases.len(), 3, tmp.path(), |fault, p, dir| {
        let (_, d, at) = phases[p];
        run(Some((d, at)), fault, dir)
    });
    // Where the destination ends up owning the vGPU — running it, or through its in-doubt copy,
    // resumed while judging — it ran the carried workloads after the switch-over (and its digest,
    // judged below, includes what they wrote).
    let mut dest_work = Vec::new();
    for (fault, p, r, _) in &results {
        if r.dest.vgpu() == "running" {
            dest_work.push((
                format!("{} at {}: destination", fault.name(), phases[*p].0),
                carried_run(r.dest.json.as_ref()),
            ));
        }
    }
    let resumed = Mutex::new(Vec::new());
    let resume_counting = |file: &Path| {
        let j = resume(file);
        if file.file_name() == Some("destination.gmig".as_ref()) {
            resumed.lock().unwrap().push((
                format!("{}: resumed", file.display()),
                carried_run(Some(&j)),
            ));
        }
        j
    };
    let flavour = Flavour {
        state: &|j| {
            j.get("state_digest")
                .and_then(|d| d.as_str())
                .map(str::to_string)
        },
        resume: &resume_counting,
        expected: &|src| {
            let frames = src
                .and_then(|j| j.get("frames"))
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(frames_at_stop);
            reference_digest(frames)
        },
        wide: false,
    };
    let names: Vec<&str> = phases.iter().map(|p| p.0).collect();
    let untripped: Vec<_> = results
        .iter()
        .filter(|(_, _, r, _)| r.tripped.is_none())
        .map(|(f, p, _, _)| format!("{} at {}", f.name(), names[*p]))
        .collect();
    // Before the destination holds a complete copy, a killed source takes the guest with it.
    judge_all(
        results,
        &names,
        |f, p| f == Fault::KillSource && p <= 5,
        &flavour,
        t0,
    );
    assert!(
        untripped.is_empty(),
        "the fault never struck: {untripped:?}"
    );
    dest_work.extend(resumed.into_inner().unwrap());
    assert!(
        !dest_work.is_empty(),
        "no cell left the vGPU to the destination"
    );
    let idle: Vec<_> = dest_work
        .iter()
        .filter(|(_, ran)| *ran != CARRIED)
        .collect();
    assert!(
        idle.is_empty(),
        "the destination did not run the {CARRIED} carried workloads after the switch-over \
         (cell, workloads it ran): {idle:?}"
    );
}

/// Workloads the stop carried to the destination (with `--max-drain 0`, the desktop's last frame:
/// a client and a compositor batch).
const CARRIED: u64 = 2;

/// The carried workloads a side that owns the vGPU ran (`carried_workloads_run`; 0 when absent).
fn carried_run(j: Option<&serde_json::Value>) -> u64 {
    j.and_then(|j| j.get("carried_workloads_run"))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}
