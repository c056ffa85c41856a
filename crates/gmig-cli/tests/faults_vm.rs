//! Whole-VM fault matrix: two `gmig vm migrate` processes (a KVM guest driving the vGPU, RAM and
//! vCPU migrated by the VMM), each with its vGPU in a `gmig serve` process, through the fault
//! proxy of `tests/faults.rs`, at every phase of the vGPU matrix — handshake, early and late
//! pre-copy, stop-copy (the dirty pages sent while the source is paused), device state (the
//! vGPU's stop-copy data), restore (the destination's ACK held), commit (the source's COMMIT
//! held), resume (the destination's RESUMED held) — and at every process: the source VMM and the
//! destination VMM (SIGKILL), the link between them (cut), and each side's `gmig serve` (SIGKILL,
//! or its vfio-user link held: nothing crosses, both ends stay open).
//!
//! Each VMM reaches its server through a vfio-user relay (`common/vfio_relay.rs`) that passes the
//! descriptors on, logs the VMM's requests and strikes the server. Pre-copy rounds overlap the
//! guest's run, so the stream's layout differs from run to run: the proxy finds each phase's
//! record as it crosses, and the source's relay marks where the source paused (it holds the
//! STOP_COPY request until everything sent before has crossed). The source's vGPU is struck, for
//! the first five phases, at the request that opens the phase on the source (DMA_LOGGING_START;
//! the first MIG_DATA_READ; the first pre-copy DMA_LOGGING_REPORT after the first pass; the one
//! after STOP_COPY; the first MIG_DATA_READ in STOP_COPY), since the source runs ahead of what
//! has crossed the link; everywhere else the fault strikes when the link carries the phase's
//! byte. Every cell checks that its fault struck.
//!
//! An in-doubt side's copy is the journal of the stream it sent or received, resumed with
//! `gmig vm migrate --resume` (on an in-process vGPU). Every owner's guest must print the
//! checksum of an unmigrated `gmig vm run`; no process may panic. The table the test prints is
//! the whole-VM matrix in docs/reliability.md.

#[path = "common/fault_harness.rs"]
mod harness;
#[path = "common/vfio_relay.rs"]
mod relay;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use harness::*;
use relay::{Action, Relay, Req, Trigger};

/// Seconds each side waits for the other (a VMM gives its vGPU half of it).
const TIMEOUT: &str = "3";
/// A small guest (small frames: the guest's rendering is most of a cell's time).
const VM_GUEST: [&str; 8] = [
    "--frames",
    "24",
    "--ram-mib",
    "64",
    "--width",
    "64",
    "--height",
    "48",
];

const PHASES: [&str; 8] = [
    "handshake",
    "early pre-copy",
    "late pre-copy",
    "stop-copy",
    "device state",
    "restore",
    "commit",
    "resume",
];

fn vm_cmd() -> Command {
    let mut c = gmig();
    c.args(["--json", "vm"])
        .arg("migrate")
        .args(VM_GUEST)
        .args(["--timeout", TIMEOUT])
        .env("RUST_LOG", "off");
    c
}

/// The guest's own checksum line, printed when it halts.
fn vm_checksum(j: &serde_json::Value) -> Option<String> {
    j.get("serial")?
        .as_str()?
        .lines()
        .find(|l| l.starts_with("checksum"))
        .map(str::to_string)
}

/// Whole-VM stream record tags.
const PAGES: u8 = 2;
const DEVICE: u8 = 3;

/// A record of a whole-VM stream: (offset, tag, payload length).
type Record = (u64, u8, u64);

/// The records of a whole-VM stream whose header arrived.
fn records(bytes: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    let mut at = 8;
    while let Some(head) = bytes.get(at..at + 9) {
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        out.push((at as u64, head[0], len as u64));
        at += 9 + len;
    }
    out
}

/// Page entries in a PAGES record's payload.
fn page_entries(mut p: &[u8]) -> u64 {
    let mut n = 0;
    while p.len() >= 9 {
        let skip = if p[8] == 1 { 9 + 4096 } else { 9 };
        p = p.get(skip..).unwrap_or(&[]);
        n += 1;
    }
    n
}

/// Where each phase's fault strikes on the link, found in the stream as it crosses (rounds
/// overlap the guest's run, so their layout differs from run to run).
const ON_LINK: [(Dir, Limit); 8] = [
    // Inside the Hello record.
    (Dir::ToDest, Limit::Bytes(12)),
    // The middle of the first pass's first page record.
    (
        Dir::ToDest,
        Limit::VmRecord {
            tag: PAGES,
            after: After::Start,
            at: At::Middle,
        },
    ),
    // The middle of a later round's first page record, before the source paused.
    (
        Dir::ToDest,
        Limit::VmRecord {
            tag: PAGES,
            after: After::FirstPass,
            at: At::Middle,
        },
    ),
    // The middle of the first page record the source sent paused.
    (
        Dir::ToDest,
        Limit::VmRecord {
            tag: PAGES,
            after: After::Pause,
            at: At::Middle,
        },
    ),
    // The vGPU's stop-copy record: its header crossed, its data held.
    (
        Dir::ToDest,
        Limit::VmRecord {
            tag: DEVICE,
            after: After::Pause,
            at: At::Header,
        },
    ),
    // The whole stream crossed; the destination's ACK (restored, stopped) is held.
    (Dir::ToSource, Limit::Bytes(0)),
    // ACK crossed; the source's COMMIT is held.
    (Dir::ToDest, Limit::VmStreamEnd),
    // COMMIT crossed; RESUMED is held (the destination already runs the guest).
    (Dir::ToSource, Limit::Bytes(9)),
];

/// The source's vGPU requests that open phases 0–4 on the source.
fn source_vgpu_trigger(phase: usize) -> Trigger {
    use relay::*;
    let count = move |log: &[Req], f: &dyn Fn(&Req) -> bool| log.iter().filter(|r| f(r)).count();
    let last = |log: &[Req]| *log.last().unwrap();
    match phase {
        0 => Box::new(move |log| last(log).is_feature(DMA_LOGGING_START)),
        1 => Box::new(move |log| {
            last(log).command == MIG_DATA_READ && count(log, &|r| r.command == MIG_DATA_READ) == 1
        }),
        2 => Box::new(move |log| {
            let r = last(log);
            r.is_feature(DMA_LOGGING_REPORT) && r.state == PRE_COPY
        }),
        3 => Box::new(move |log| {
            let r = last(log);
            r.is_feature(DMA_LOGGING_REPORT) && r.state == STOP_COPY
        }),
        _ => Box::new(move |log| {
            let r = last(log);
            r.command == MIG_DATA_READ && r.state == STOP_COPY
        }),
    }
}

/// The device state the source's vGPU must have been in when a phase-`p` trigger struck it.
fn state_at(p: usize) -> u32 {
    match p {
        0 => relay::RUNNING,
        1 | 2 => relay::PRE_COPY,
        _ => relay::STOP_COPY,
    }
}

/// A `gmig serve` child in `dir` (host `slot`) behind a relay; the VMM connects to the relay.
fn served(
    dir: &Path,
    name: &str,
    slot: u32,
    action: Action,
    trigger: Option<Trigger>,
    watch: Option<relay::Watch>,
) -> Relay {
    let sock = dir.join(format!("{name}.sock"));
    let child = gmig()
        .arg("serve")
        .arg("--socket")
        .arg(&sock)
        .args([
            "--ram-by-vmm",
            "--clients",
            "1",
            "--slot",
            &slot.to_string(),
        ])
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Relay::start(
        &dir.join(format!("{name}-relay.sock")),
        sock,
        child,
        action,
        trigger,
        watch,
    )
}

/// What a cell produced besides the two VMMs' exits: whether and where its vGPU fault struck,
/// and whether a vGPU process panicked.
struct Cell {
    run: Run,
    /// The relay of the struck vGPU: whether it fired, at which request.
    relay_fired: Option<(bool, Option<Req>)>,
    /// Requests the source made of its vGPU.
    source_log: Vec<Req>,
    serve_panics: Vec<String>,
    /// Where the source's pause fell in the stream, when it paused.
    pause: Option<u64>,
}

fn cell(
    trigger: Option<(Dir, Limit)>,
    fault: Fault,
    source_trigger: Option<Trigger>,
    dir: &Path,
) -> Cell {
    std::fs::create_dir_all(dir).unwrap();
    let action = match fault {
        Fault::HoldSourceServe | Fault::HoldDestServe => Action::Hold,
        _ => Action::Kill,
    };
    let (sa, da) = match fault {
        Fault::KillSourceServe | Fault::HoldSourceServe => (action, Action::Kill),
        _ => (Action::Kill, action),
    };
    // The source's relay marks where its pause falls in the stream.
    let marks = Marks::new();
    let m = marks.clone();
    let watch: relay::Watch = Box::new(move |r: &Req| {
        if r.sets == Some(relay::STOP_COPY) {
            m.mark_pause();
        }
    });
    let src = Arc::new(served(dir, "source", 0, sa, source_trigger, Some(watch)));
    let dst = Arc::new(served(dir, "destination", 1, da, None, None));
    let (src_sock, dst_sock) = (src.path.clone(), dst.path.clone());
    let dest = |addr: &str| {
        let mut c = vm_cmd();
        c.args(["--listen", addr, "--checkpoint"])
            .arg(dir.join("destination.gmigvm"))
            .arg("--vgpu-socket")
            .arg(&dst_sock);
        c
    };
    let source = |addr: &str| {
        let mut c = vm_cmd();
        // Pre-copy from frame 4 in rounds of 16 exits (many rounds, however fast the stream
        // goes), switch-over at 16 of 24: the owner has frames left to render.
        c.args(["--to", addr, "--at-frame", "4", "--switch-at-frame", "16"])
            .args(["--round-exits", "16", "--checkpoint"])
            .arg(dir.join("source.gmigvm"))
            .arg("--vgpu-socket")
            .arg(&src_sock);
        c
    };
    // A vGPU fault struck from the link: the proxy holds the byte until the server is struck.
    let struck = (!fault.on_vmm()).then(|| if fault.on_source() { &src } else { &dst }.clone());
    let on_fire: Option<OnFire> = struck.clone().map(|r| Box::new(move || r.fire()) as OnFire);
    let run = run_pair(dest, source, trigger, fault, on_fire, Some(marks.clone()));
    let mut cell = Cell {
        run,
        relay_fired: struck.map(|r| r.fired()),
        source_log: src.log(),
        serve_panics: Vec::new(),
        pause: marks.stop(),
    };
    for (r, who) in [(src, "source"), (dst, "destination")] {
        let r = Arc::try_unwrap(r).ok().expect("relay still shared");
        let err = r.finish();
        if err.contains("panicked") {
            cell.serve_panics
                .push(format!("the {who}'s gmig serve: {err}"));
        }
    }
    cell
}

/// Runs a clean migration and checks it: both sides succeed, the destination rendered frames
/// after the switch-over and printed the unmigrated checksum, no journal is left, pre-copy had
/// rounds after the first pass, and the pause the relay marked in the stream is where the
/// source's report puts it: the DEVICE records after it are its `device_stop_bytes`, the page
/// records after it at most its `final_pages` (the stop sends KVM's pages while the vGPU goes
/// to STOP_COPY, where the relay marks the pause, so some may cross before the mark) and at
/// least the pages only the vGPU's log listed, which go after its stop.
fn clean(reference: &str, dir: &Path) {
    let c = cell(None, Fault::Cut, None, dir);
    let base = &c.run;
    assert_eq!(base.source.code, Some(0), "{:?}", base.source);
    assert_eq!(base.dest.code, Some(0), "{:?}", base.dest);
    assert_eq!(
        base.dest.json.as_ref().and_then(vm_checksum).as_deref(),
        Some(reference)
    );
    let num = |k: &str| {
        base.source
            .field(k)
            .and_then(serde_json::Value::as_u64)
            .unwrap()
    };
    let frames = base
        .dest
        .field("destination_frames")
        .and_then(serde_json::Value::as_u64);
    assert!(
        frames > Some(0),
        "the clean migration's destination did no work after the switch-over: {:?}",
        base.dest
    );
    assert!(num("rounds") >= 2, "no pre-copy round after the first pass");
    assert!(c.serve_panics.is_empty(), "{:?}", c.serve_panics);
    let wire = num("wire_bytes");
    assert_eq!(
        base.captured.len() as u64,
        wire + 1,
        "the stream and COMMIT"
    );
    let pause = c.pause.expect("the source's pause was marked");
    let (mut pages, mut device) = (0, 0);
    for (off, tag, len) in records(&base.captured[..wire as usize]) {
        let payload = &base.captured[(off + 9) as usize..(off + 9 + len) as usize];
        match tag {
            PAGES if off >= pause => pages += page_entries(payload),
            DEVICE if off >= pause => device += len,
            _ => {}
        }
    }
    assert_eq!(
        device,
        num("device_stop_bytes"),
        "the vGPU's stop-copy data crossed after the marked pause"
    );
    assert!(
        (num("final_gpu_only_pages")..=num("final_pages")).contains(&pages),
        "page records after the marked pause: {pages}, not between the pages only the vGPU's \
         log listed ({}) and the stop's ({})",
        num("final_gpu_only_pages"),
        num("final_pages")
    );
    // No journal is left behind by a migration that completed.
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "gmigvm"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The faults of the matrix (every cell runs both vGPUs in `gmig serve` processes).
const FAULTS: [Fault; 7] = [
    Fault::KillSource,
    Fault::KillDest,
    Fault::Cut,
    Fault::KillSourceServe,
    Fault::HoldSourceServe,
    Fault::KillDestServe,
    Fault::HoldDestServe,
];

/// Where no side may own the guest afterwards: its only copy was in the process the fault struck
/// (the source VMM or its vGPU before the destination held a complete copy; the destination's
/// vGPU once the destination ran the guest).
fn lost_ok(f: Fault, p: usize) -> bool {
    match f {
        Fault::KillSource | Fault::KillSourceServe | Fault::HoldSourceServe => p <= 4,
        Fault::KillDestServe | Fault::HoldDestServe => p == 7,
        _ => false,
    }
}

#[test]
fn whole_vm_migration_has_one_owner_after_every_fault_at_every_phase_in_every_process() {
    if !Path::new("/dev/kvm").exists() {
        eprintln!("SKIPPED: /dev/kvm is absent; `gmig vm` needs KVM");
        return;
    }
    let t0 = Instant::now();
    let out = gmig()
        .args(["--json", "vm", "run"])
        .args(VM_GUEST)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference = vm_checksum(&side(&out).json.unwrap()).expect("a checksum line");
    let tmp = tempfile::tempdir().unwrap();
    clean(&reference, &tmp.path().join("clean"));

    // The source's vGPU is struck at its requests before the hand-over; everything else on the
    // link.
    let by_relay = |f: Fault, p: usize| f.on_source() && !f.on_vmm() && p <= 4;
    let results = run_cells(&FAULTS, PHASES.len(), 3, tmp.path(), |fault, p, dir| {
        if by_relay(fault, p) {
            cell(None, fault, Some(source_vgpu_trigger(p)), dir)
        } else {
            cell(Some(ON_LINK[p]), fault, None, dir)
        }
    });

    // Each fault struck where it was meant to.
    let mut misplaced = Vec::new();
    for (fault, p, c, _) in &results {
        let what = format!("{} at {}", fault.name(), PHASES[*p]);
        misplaced.extend(c.serve_panics.iter().map(|e| format!("{what}: {e}")));
        if by_relay(*fault, *p) {
            match c.relay_fired {
                Some((true, Some(req))) if req.state == state_at(*p) => {}
                other => misplaced.push(format!(
                    "{what}: the source's vGPU was struck at {other:?} (its requests: {:?})",
                    c.source_log
                )),
            }
            continue;
        }
        let dir = ON_LINK[*p].0;
        if c.run.tripped.map(|t| t.0) != Some(dir) {
            misplaced.push(format!(
                "{what}: the link never tripped ({:?})",
                c.run.tripped
            ));
        }
        if !fault.on_vmm() && c.relay_fired.map(|f| f.0) != Some(true) {
            misplaced.push(format!("{what}: the vGPU was not struck"));
        }
    }

    let resume = |file: &Path| {
        let out = vm_cmd().arg("--resume").arg(file).output().unwrap();
        assert!(
            out.status.success(),
            "resume {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        side(&out).json.unwrap()
    };
    let flavour = Flavour {
        state: &vm_checksum,
        resume: &resume,
        expected: &|_| reference.clone(),
        wide: true,
    };
    let results = results
        .into_iter()
        .map(|(f, p, c, d)| (f, p, c.run, d))
        .collect();
    judge_all(results, &PHASES, lost_ok, &flavour, t0);
    assert!(misplaced.is_empty(), "{}", misplaced.join("\n"));
}
