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
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use gmig_core::stream::{Section, StreamDecoder, StreamLimits, HEADER_LEN};
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

fn pump(mut from: TcpStream, mut to: TcpStream, limit: Option<u64>, trip: &Trip, dir: Dir) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
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
        if let Some(l) = limit {
            take = take.min(usize::try_from(l.saturating_sub(sent)).unwrap_or(usize::MAX));
        }
        if dir == Dir::ToDest {
            trip.captured
                .lock()
                .unwrap()
                .extend_from_slice(&buf[..take]);
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
    fn run(self, trigger: Option<(Dir, u64)>, trip: Arc<Trip>) -> thread::JoinHandle<()> {
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

/// What one process said when it exited (None: killed, or no JSON).
#[derive(Debug, Clone)]
struct Side {
    json: Option<serde_json::Value>,
    code: Option<i32>,
}

impl Side {
    fn vgpu(&self) -> &str {
        self.json
            .as_ref()
            .and_then(|j| j["vgpu"].as_str())
            .unwrap_or("killed")
    }
    fn field(&self, k: &str) -> Option<&serde_json::Value> {
        self.json.as_ref().and_then(|j| j.get(k))
    }
}

fn side(out: &Output) -> Side {
    let text = String::from_utf8_lossy(&out.stdout);
    Side {
        json: serde_json::from_str(text.trim()).ok(),
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

/// One migration through the proxy, with the fault fired at `trigger` (none: a clean run).
fn run(trigger: Option<(Dir, u64)>, fault: Fault, dir: &Path) -> Run {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dest_addr = format!("127.0.0.1:{port}");
    let dest = common(&mut gmig())
        .args(["--listen", &dest_addr, "--checkpoint"])
        .arg(dir.join("destination.gmig"))
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
    let source = common(&mut gmig())
        .args(["--to", &proxy_addr, "--frames-before", "1"])
        .args(["--seed", &SEED.to_string(), "--profile", "desktop"])
        .args(["--policy", "one-shot-narrow", "--checkpoint"])
        .arg(dir.join("source.gmig"))
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

/// Where the device-state sections start in a captured stream: the offset just before the last
/// byte of the first device-state section.
fn device_state_offset(stream: &[u8]) -> u64 {
    let mut d = StreamDecoder::new(StreamLimits::default(), None);
    for (i, b) in stream.iter().enumerate() {
        d.feed(std::slice::from_ref(b)).unwrap();
        while let Some(s) = d.next_section().unwrap() {
            if matches!(s, Section::State { .. }) {
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
    let device_state = device_state_offset(&base.captured[..stream as usize]);
    let header = HEADER_LEN as u64;
    assert!(header < precopy && precopy < device_state && device_state < stream);

    let phases: [(&str, Dir, u64); 8] = [
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
        (
            "stop-copy",
            Dir::ToDest,
            precopy + (device_state - precopy) / 2,
        ),
        ("device state", Dir::ToDest, device_state),
        // HEADER_ACCEPTED crossed; RESTORED is held.
        ("restore", Dir::ToSource, CONTROL),
        // The whole stream crossed; COMMIT is held.
        ("commit", Dir::ToDest, stream),
        // RESTORED crossed; RESUMED is held (the destination already runs the vGPU).
        ("resume", Dir::ToSource, 2 * CONTROL),
    ];
    let mut table = Vec::new();
    let mut failures = Vec::new();
    let cells: Vec<(Fault, usize)> = [Fault::KillSource, Fault::KillDest, Fault::Cut]
        .into_iter()
        .flat_map(|f| (0..phases.len()).map(move |p| (f, p)))
        .collect();
    let results: Vec<_> = thread::scope(|s| {
        let chunks: Vec<_> = cells
            .chunks(cells.len().div_ceil(3))
            .map(|chunk| {
                let tmp = tmp.path();
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|&(fault, p)| {
                            let dir = tmp.join(format!("{fault:?}-{p}"));
                            std::fs::create_dir_all(&dir).unwrap();
                            let (_, d, at) = phases[p];
                            (fault, p, run(Some((d, at)), fault, &dir), dir)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        chunks.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    for (fault, p, r, dir) in results {
        let phase = phases[p].0;
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
            "both sides run the vGPU".into(),
        );
        // Every exit a survivor makes says what it holds, with the documented exit code.
        for (s, role) in [(&r.source, "source"), (&r.dest, "destination")] {
            let want = match s.vgpu() {
                "killed" => None,
                "in-doubt" => Some(4),
                "running" if role == "destination" => Some(0),
                "none" if role == "source" => Some(0),
                _ => Some(1),
            };
            check(s.code == want, format!("{role} exit code {:?}", s.code));
        }
        let frames = r
            .source
            .field("frames")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(frames_at_stop);
        let (outcome, digest) = match (sv, dv) {
            ("running", _) => (
                format!(
                    "source runs{}",
                    if dv == "in-doubt" {
                        "; destination's in-doubt copy discarded"
                    } else {
                        ""
                    }
                ),
                r.source.field("state_digest").cloned(),
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
                r.dest.field("state_digest").cloned(),
            ),
            (_, "in-doubt") => {
                let resumed = resume(Path::new(
                    r.dest.field("checkpoint").unwrap().as_str().unwrap(),
                ));
                let mut o = "destination's in-doubt copy resumed".to_string();
                if sv == "in-doubt" {
                    // Both held a copy: they are the same vGPU.
                    let other = resume(Path::new(
                        r.source.field("checkpoint").unwrap().as_str().unwrap(),
                    ));
                    check(
                        other["state_digest"] == resumed["state_digest"],
                        "the two in-doubt copies differ".into(),
                    );
                    o.push_str(" (source's identical copy discarded)");
                }
                (o, resumed.get("state_digest").cloned())
            }
            ("in-doubt", _) => (
                "source's in-doubt copy resumed".to_string(),
                resume(Path::new(
                    r.source.field("checkpoint").unwrap().as_str().unwrap(),
                ))
                .get("state_digest")
                .cloned(),
            ),
            _ => ("lost with the killed source".to_string(), None),
        };
        match digest {
            Some(d) => check(
                d.as_str() == Some(reference_digest(frames).as_str()),
                format!("owner's state {d} differs from the unmigrated guest at frame {frames}"),
            ),
            None => check(
                fault == Fault::KillSource && p <= 4 && dv == "none",
                "no side owns the vGPU".into(),
            ),
        }
        let _ = std::fs::remove_dir_all(&dir);
        table.push(format!(
            "| {} | {phase} | {sv} | {dv} | {outcome} |",
            fault.name()
        ));
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
