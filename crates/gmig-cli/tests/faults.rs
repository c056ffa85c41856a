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

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

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

fn gmig() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gmig"))
}

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    ToDest,
    ToSource,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    KillSource,
    KillDest,
    Cut,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::KillSource => "SIGKILL source",
            Fault::KillDest => "SIGKILL destination",
            Fault::Cut => "link cut",
        }
    }
}

/// Forwards one connection between the source and the destination; after `at.1` bytes in
/// direction `at.0` it stops forwarding and fires the fault.
struct Proxy {
    listener: TcpListener,
    dest: String,
}

struct Trip {
    fired: AtomicBool,
    fault: Fault,
    children: Mutex<(Option<Child>, Option<Child>)>,
    sockets: Mutex<Vec<TcpStream>>,
    captured: Mutex<Vec<u8>>,
}

impl Trip {
    fn fire(&self) {
        if self.fired.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut ch = self.children.lock().unwrap();
        let victim = match self.fault {
            Fault::KillSource => ch.0.as_mut(),
            Fault::KillDest => ch.1.as_mut(),
            Fault::Cut => None,
        };
        if let Some(c) = victim {
            let _ = c.kill();
            let _ = c.wait();
            // The dead process's connection ends: the survivor sees it close.
            for s in self.sockets.lock().unwrap().iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        // A cut forwards nothing more and keeps both connections open.
    }
}

/// Where in a direction the fault strikes: past a byte offset, or (whole-VM stream, towards the
/// destination) past the end of the DONE record, that is on the source's COMMIT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Limit {
    Bytes(u64),
    VmStreamEnd,
}

/// The end of the whole-VM stream's DONE record in `bytes`, once it arrived; `cursor` walks the
/// records (magic, then tag u8, length u32 LE, crc u32, payload).
fn vm_done_end(bytes: &[u8], cursor: &mut usize) -> Option<u64> {
    const DONE: u8 = 7;
    *cursor = (*cursor).max(8);
    while let Some(head) = bytes.get(*cursor..*cursor + 9) {
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let end = *cursor + 9 + len;
        if end > bytes.len() {
            return None;
        }
        if head[0] == DONE {
            return Some(end as u64);
        }
        *cursor = end;
    }
    None
}

fn pump(mut from: TcpStream, mut to: TcpStream, limit: Option<Limit>, trip: &Trip, dir: Dir) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    let mut cursor = 0;
    let mut limit = limit;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => {
                if !trip.fired.load(Ordering::SeqCst) {
                    let _ = to.shutdown(Shutdown::Write);
                }
                return;
            }
            Ok(n) => n,
        };
        if trip.fired.load(Ordering::SeqCst) {
            continue; // swallowed: after a cut nothing crosses, after a kill nothing matters
        }
        let mut take = n;
        if let Some(Limit::Bytes(l)) = limit {
            take = take.min(usize::try_from(l.saturating_sub(sent)).unwrap_or(usize::MAX));
        }
        if dir == Dir::ToDest {
            let mut captured = trip.captured.lock().unwrap();
            captured.extend_from_slice(&buf[..take]);
            if limit == Some(Limit::VmStreamEnd) {
                // COMMIT only follows the destination's ACK of the whole stream, so it never
                // shares a read with the stream's last bytes.
                if let Some(end) = vm_done_end(&captured, &mut cursor) {
                    limit = Some(Limit::Bytes(end));
                }
            }
        }
        if to.write_all(&buf[..take]).is_err() {
            return;
        }
        sent += take as u64;
        // The fault strikes when the sender goes past the offset.
        if take < n {
            trip.fire();
        }
    }
}

impl Proxy {
    fn new(dest: String) -> Proxy {
        Proxy {
            listener: TcpListener::bind("127.0.0.1:0").unwrap(),
            dest,
        }
    }

    fn addr(&self) -> String {
        self.listener.local_addr().unwrap().to_string()
    }

    /// Relays the first connection; returns the handle to wait on and the shared trip state.
    fn run(self, trigger: Option<(Dir, Limit)>, trip: Arc<Trip>) -> thread::JoinHandle<()> {
        thread::spawn(move || {
            let Ok((src, _)) = self.listener.accept() else {
                return;
            };
            // The destination listens once it has placed its vGPU (it accepts one connection,
            // so it is not probed before).
            let t0 = Instant::now();
            let dst = loop {
                match TcpStream::connect(&self.dest) {
                    Ok(d) => break d,
                    Err(_) if t0.elapsed() < Duration::from_secs(20) => {
                        thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => return,
                }
            };
            trip.sockets
                .lock()
                .unwrap()
                .extend([src.try_clone().unwrap(), dst.try_clone().unwrap()]);
            let lim = |d: Dir| trigger.filter(|t| t.0 == d).map(|t| t.1);
            let (s2, d2) = (src.try_clone().unwrap(), dst.try_clone().unwrap());
            let t1 = trip.clone();
            let (to_dest, to_source) = (lim(Dir::ToDest), lim(Dir::ToSource));
            let a = thread::spawn(move || pump(src, dst, to_dest, &t1, Dir::ToDest));
            let t2 = trip.clone();
            let b = thread::spawn(move || pump(d2, s2, to_source, &t2, Dir::ToSource));
            let _ = a.join();
            let _ = b.join();
        })
    }
}

/// What one process said when it exited (None: killed, or no JSON): its JSON lines merged.
#[derive(Debug, Clone)]
struct Side {
    json: Option<serde_json::Value>,
    code: Option<i32>,
}

impl Side {
    /// What this side holds: `vgpu` (gmig migrate) or `vm` (gmig vm migrate).
    fn vgpu(&self) -> &str {
        self.json
            .as_ref()
            .and_then(|j| j.get("vgpu").or_else(|| j.get("vm")))
            .and_then(serde_json::Value::as_str)
            .unwrap_or("killed")
    }
    fn field(&self, k: &str) -> Option<&serde_json::Value> {
        self.json.as_ref().and_then(|j| j.get(k))
    }
}

fn side(out: &Output) -> Side {
    let text = String::from_utf8_lossy(&out.stdout);
    let mut merged: Option<serde_json::Map<String, serde_json::Value>> = None;
    for line in text.lines() {
        if let Ok(serde_json::Value::Object(o)) = serde_json::from_str(line) {
            merged.get_or_insert_with(Default::default).extend(o);
        }
    }
    Side {
        json: merged.map(serde_json::Value::Object),
        code: out.status.code(),
    }
}

fn wait_with_deadline(child: &mut Child, deadline: Instant) {
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    panic!("a gmig process did not exit in time");
}

fn output_of(mut child: Child, deadline: Instant) -> Output {
    wait_with_deadline(&mut child, deadline);
    child.wait_with_output().unwrap()
}

struct Run {
    source: Side,
    dest: Side,
    /// Bytes that crossed from the source to the destination.
    captured: Vec<u8>,
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
    )
}

fn free_addr() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// Any destination and source command pair through the proxy.
fn run_pair(
    dest: impl FnOnce(&str) -> Command,
    source: impl FnOnce(&str) -> Command,
    trigger: Option<(Dir, Limit)>,
    fault: Fault,
) -> Run {
    let dest_addr = free_addr();
    let dest = dest(&dest_addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let proxy = Proxy::new(dest_addr);
    let proxy_addr = proxy.addr();
    let trip = Arc::new(Trip {
        fired: AtomicBool::new(false),
        fault,
        children: Mutex::new((None, Some(dest))),
        sockets: Mutex::new(Vec::new()),
        captured: Mutex::new(Vec::new()),
    });
    let relay = proxy.run(trigger, trip.clone());
    let source = source(&proxy_addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    trip.children.lock().unwrap().0 = Some(source);
    let deadline = Instant::now() + Duration::from_secs(60);
    // Wait for both without holding the lock the proxy needs to kill one of them.
    let mut outs: [Option<Output>; 2] = [None, None];
    while outs.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "a gmig process did not exit in time"
        );
        for (i, slot) in outs.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            let mut ch = trip.children.lock().unwrap();
            let c = if i == 0 { &mut ch.0 } else { &mut ch.1 };
            let done = matches!(c.as_mut().map(Child::try_wait), Some(Ok(Some(_))));
            if done {
                let child = c.take().unwrap();
                drop(ch);
                *slot = Some(output_of(child, deadline));
            }
        }
        thread::sleep(Duration::from_millis(20));
    }
    // Both ends are gone: close what a cut left open so the relay ends.
    for s in trip.sockets.lock().unwrap().iter() {
        let _ = s.shutdown(Shutdown::Both);
    }
    relay.join().unwrap();
    let [s, d] = outs;
    let captured = std::mem::take(&mut *trip.captured.lock().unwrap());
    Run {
        source: side(&s.unwrap()),
        dest: side(&d.unwrap()),
        captured,
    }
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
    let results = run_cells(phases.len(), 3, tmp.path(), |fault, p, dir| {
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
    };
    let names: Vec<&str> = phases.iter().map(|p| p.0).collect();
    // Before the destination holds a complete copy, a killed source takes the guest with it.
    judge_all(
        results,
        &names,
        |f, p| f == Fault::KillSource && p <= 5,
        &flavour,
        t0,
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

/// Runs every (fault, phase) cell, `threads` at a time, each in its own directory under `tmp`.
fn run_cells(
    phases: usize,
    threads: usize,
    tmp: &Path,
    cell: impl Fn(Fault, usize, &Path) -> Run + Sync,
) -> Vec<(Fault, usize, Run, PathBuf)> {
    let cells: Vec<(Fault, usize)> = [Fault::KillSource, Fault::KillDest, Fault::Cut]
        .into_iter()
        .flat_map(|f| (0..phases).map(move |p| (f, p)))
        .collect();
    thread::scope(|s| {
        let handles: Vec<_> = cells
            .chunks(cells.len().div_ceil(threads))
            .map(|chunk| {
                let cell = &cell;
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|&(fault, p)| {
                            let dir = tmp.join(format!("{fault:?}-{p}"));
                            std::fs::create_dir_all(&dir).unwrap();
                            let r = cell(fault, p, &dir);
                            (fault, p, r, dir)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// Judges every cell (`lost_ok`: where no owner is allowed), prints the table and fails on any
/// broken invariant.
fn judge_all(
    results: Vec<(Fault, usize, Run, PathBuf)>,
    names: &[&str],
    lost_ok: impl Fn(Fault, usize) -> bool,
    fl: &Flavour<'_>,
    t0: Instant,
) {
    let mut table = Vec::new();
    let mut failures = Vec::new();
    for (fault, p, r, dir) in results {
        // The in-doubt copies in `dir` are resumed while judging.
        table.push(judge(
            fault,
            names[p],
            lost_ok(fault, p),
            &r,
            fl,
            &mut failures,
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
    eprintln!("| fault | phase | source ends | destination ends | owner afterwards |");
    eprintln!("|---|---|---|---|---|");
    for row in &table {
        eprintln!("{row}");
    }
    eprintln!(
        "{} cells in {:.1} s",
        table.len(),
        t0.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// How one kind of pair states its state and resumes a saved copy.
struct Flavour<'a> {
    /// The owner's state, from its JSON: the vGPU's digest, or the guest's checksum line.
    state: &'a dyn Fn(&serde_json::Value) -> Option<String>,
    /// Resumes a checkpoint file; the resumed side's JSON.
    resume: &'a dyn Fn(&Path) -> serde_json::Value,
    /// The unmigrated guest's state, given the source's JSON when the source survived.
    expected: &'a dyn Fn(Option<&serde_json::Value>) -> String,
}

/// Checks one cell and resolves its doubt as an operator would; returns its table row.
fn judge(
    fault: Fault,
    phase: &str,
    lost_ok: bool,
    r: &Run,
    fl: &Flavour<'_>,
    failures: &mut Vec<String>,
) -> String {
    let (sv, dv) = (r.source.vgpu(), r.dest.vgpu());
    let mut check = |ok: bool, what: String| {
        if !ok {
            failures.push(format!(
                "{} at {phase}: {what} ({r:?})",
                fault.name(),
                r = (&r.source, &r.dest)
            ));
        }
    };
    check(
        !(sv == "running" && dv == "running"),
        "both sides run the guest".into(),
    );
    // Every exit a survivor makes says what it holds, with the documented exit code.
    for (s, role) in [(&r.source, "source"), (&r.dest, "destination")] {
        let want = match s.vgpu() {
            "killed" => None,
            "in-doubt" => Some(4),
            // A destination told to die as it resumes may run the guest to its end and report
            // it before the signal lands; what it reported is judged below like any survivor's.
            "running" if role == "destination" && fault == Fault::KillDest && s.code.is_none() => {
                None
            }
            "running" if role == "destination" => Some(0),
            "none" if role == "source" => Some(0),
            _ => Some(1),
        };
        check(s.code == want, format!("{role} exit code {:?}", s.code));
    }
    let checkpoint = |s: &Side| {
        let path = s.field("checkpoint").and_then(|p| p.as_str()).unwrap_or("");
        (fl.resume)(Path::new(path))
    };
    let (outcome, state) = match (sv, dv) {
        ("running", _) => (
            format!(
                "source runs{}",
                if dv == "in-doubt" {
                    "; destination's in-doubt copy discarded"
                } else {
                    ""
                }
            ),
            r.source.json.as_ref().and_then(fl.state),
        ),
        (_, "running") => (
            format!(
                "destination runs{}",
                if sv == "in-doubt" {
                    "; source's in-doubt copy discarded"
                } else {
                    ""
                }
            ),
            r.dest.json.as_ref().and_then(fl.state),
        ),
        (_, "in-doubt") => {
            let resumed = (fl.state)(&checkpoint(&r.dest));
            let mut o = "destination's in-doubt copy resumed".to_string();
            if sv == "in-doubt" {
                // Both held a copy: they are the same guest.
                let other = (fl.state)(&checkpoint(&r.source));
                check(other == resumed, "the two in-doubt copies differ".into());
                o.push_str(" (source's identical copy discarded)");
            }
            (o, resumed)
        }
        ("in-doubt", _) => (
            "source's in-doubt copy resumed".to_string(),
            (fl.state)(&checkpoint(&r.source)),
        ),
        _ => ("lost with the killed source".to_string(), None),
    };
    match state {
        Some(d) => {
            let want = (fl.expected)(r.source.json.as_ref());
            check(
                d == want,
                format!("owner's state {d} differs from the unmigrated guest's {want}"),
            );
        }
        None => check(lost_ok && dv == "none", "no side owns the guest".into()),
    }
    format!("| {} | {phase} | {sv} | {dv} | {outcome} |", fault.name())
}

/// The guest arguments of the whole-VM cells (as `tests/vm.rs` runs them).
const VM_GUEST: [&str; 4] = ["--frames", "24", "--ram-mib", "64"];

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

/// The same faults on the whole-VM path: two `gmig vm migrate` processes (a KVM guest driving the
/// vGPU, RAM and vCPU migrated by the VMM), at a point inside the stream and at each step of the
/// hand-over (the destination's ACK, the source's COMMIT, the destination's RESUMED), where a
/// lost message used to let both sides run the guest. An in-doubt side's copy is the journal of
/// the stream it sent or received, resumed with `gmig vm migrate --resume`; every owner's guest
/// must print the checksum of an unmigrated run.
#[test]
fn whole_vm_migration_has_one_owner_after_every_fault_at_the_switch_over() {
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
    let cell = |trigger: Option<(Dir, Limit)>, fault: Fault, dir: &Path| {
        std::fs::create_dir_all(dir).unwrap();
        let dest = |addr: &str| {
            let mut c = vm_cmd();
            c.args(["--listen", addr, "--slot", "1", "--checkpoint"])
                .arg(dir.join("destination.gmigvm"));
            c
        };
        let source = |addr: &str| {
            let mut c = vm_cmd();
            // Pre-copy from frame 8, switch-over at 16 of 24: the owner has frames left to render.
            c.args(["--to", addr, "--at-frame", "8", "--switch-at-frame", "16"])
                .arg("--checkpoint")
                .arg(dir.join("source.gmigvm"));
            c
        };
        run_pair(dest, source, trigger, fault)
    };
    let base = cell(None, Fault::Cut, &tmp.path().join("clean"));
    assert_eq!(base.source.code, Some(0), "{:?}", base.source);
    assert_eq!(base.dest.code, Some(0), "{:?}", base.dest);
    assert_eq!(
        base.dest.json.as_ref().and_then(vm_checksum),
        Some(reference.clone())
    );
    let did = |k: &str| {
        base.dest
            .field(k)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    assert!(
        did("destination_frames") > 0 && did("destination_workloads") > 0,
        "the clean migration's destination did no work after the switch-over: {:?}",
        base.dest
    );
    let wire = base.source.field("wire_bytes").unwrap().as_u64().unwrap();
    // No journal is left behind by a migration that completed.
    assert_eq!(
        std::fs::read_dir(tmp.path().join("clean")).unwrap().count(),
        0
    );

    let phases: [(&str, Dir, Limit); 4] = [
        ("pre-copy", Dir::ToDest, Limit::Bytes(wire / 3)),
        // The whole stream crossed; the destination's ACK (restored, stopped) is held.
        ("restore", Dir::ToSource, Limit::Bytes(0)),
        // ACK crossed; the source's COMMIT is held.
        ("commit", Dir::ToDest, Limit::VmStreamEnd),
        // COMMIT crossed; RESUMED is held (the destination already runs the guest).
        ("resume", Dir::ToSource, Limit::Bytes(9)),
    ];
    let results = run_cells(phases.len(), 2, tmp.path(), |fault, p, dir| {
        let (_, d, at) = phases[p];
        cell(Some((d, at)), fault, dir)
    });
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
    };
    let names: Vec<&str> = phases.iter().map(|p| p.0).collect();
    judge_all(
        results,
        &names,
        |f, p| f == Fault::KillSource && p == 0,
        &flavour,
        t0,
    );
}
