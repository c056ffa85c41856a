//! The process-level fault harness shared by `tests/faults.rs` (two `gmig migrate` processes)
//! and `tests/faults_vm.rs` (two `gmig vm migrate` processes, with or without a `gmig serve`
//! each): a TCP proxy between source and destination that, at a chosen byte of a chosen
//! direction, SIGKILLs the source, SIGKILLs the destination, cuts the link (forwards nothing more
//! and leaves both connections open, so the ends find out by timeout), or does something to a
//! vGPU process and goes on forwarding; the cells run in parallel; each cell is judged by the
//! rules of docs/reliability.md and the table printed.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub fn gmig() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gmig"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    ToDest,
    ToSource,
}

/// A fault: which process, and what happens to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    KillSource,
    KillDest,
    Cut,
    /// SIGKILL the source's `gmig serve` (its vGPU).
    KillSourceServe,
    /// SIGKILL the destination's `gmig serve`.
    KillDestServe,
    /// The source VMM's link to its `gmig serve` holds: nothing crosses, both ends stay open.
    HoldSourceServe,
    /// The destination VMM's link to its `gmig serve` holds.
    HoldDestServe,
}

impl Fault {
    /// The fault as the vGPU matrix names it.
    pub fn name(self) -> &'static str {
        match self {
            Fault::KillSource => "SIGKILL source",
            Fault::KillDest => "SIGKILL destination",
            Fault::Cut => "link cut",
            Fault::KillSourceServe => "SIGKILL source's gmig serve",
            Fault::KillDestServe => "SIGKILL destination's gmig serve",
            Fault::HoldSourceServe => "source's vGPU link held",
            Fault::HoldDestServe => "destination's vGPU link held",
        }
    }

    /// Which process the fault strikes.
    pub fn process(self) -> &'static str {
        match self {
            Fault::KillSource => "source VMM",
            Fault::KillDest => "destination VMM",
            Fault::Cut => "either VMM (the link between them)",
            Fault::KillSourceServe | Fault::HoldSourceServe => "source `gmig serve`",
            Fault::KillDestServe | Fault::HoldDestServe => "destination `gmig serve`",
        }
    }

    /// What happens to it.
    pub fn action(self) -> &'static str {
        match self {
            Fault::KillSource | Fault::KillDest | Fault::KillSourceServe | Fault::KillDestServe => {
                "SIGKILL"
            }
            Fault::Cut => "partition (link cut)",
            Fault::HoldSourceServe | Fault::HoldDestServe => "partition (vfio-user link held)",
        }
    }

    /// Whether the fault strikes a VMM process or the link between them (the proxy stops
    /// forwarding), rather than a vGPU process (the proxy forwards on).
    pub fn on_vmm(self) -> bool {
        matches!(self, Fault::KillSource | Fault::KillDest | Fault::Cut)
    }

    /// Whether it strikes the source's side (its VMM or its vGPU process).
    pub fn on_source(self) -> bool {
        matches!(
            self,
            Fault::KillSource | Fault::KillSourceServe | Fault::HoldSourceServe
        )
    }
}

/// Where in a direction the fault strikes: past a byte offset, or (whole-VM stream, towards the
/// destination) past the end of the DONE record, that is on the source's COMMIT, or in a record
/// of the whole-VM stream found as it crosses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Bytes(u64),
    VmStreamEnd,
    /// The first record with this tag that starts where `after` says; the fault strikes `at`.
    VmRecord {
        tag: u8,
        after: After,
        at: At,
    },
}

/// Which part of the whole-VM stream a [`Limit::VmRecord`] is looked for in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Anywhere (the first such record).
    Start,
    /// After the first DEVICE record (the first pass's vGPU data) and before the source paused.
    FirstPass,
    /// After the source paused ([`Marks::stop`]).
    Pause,
}

/// Where in the record the fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// Its header crossed, its payload is held.
    Header,
    /// The middle of its payload.
    Middle,
}

/// What the whole-VM cells learn of the stream as it crosses, shared between the proxy and the
/// source's vGPU relay: the relay holds the source's STOP_COPY request until everything the source
/// wrote before its pause has crossed (the link is quiet with the proxy waiting to read), and
/// marks that offset as the start of the stream's downtime part.
pub struct Marks {
    received: AtomicU64,
    reading: AtomicBool,
    /// The proxy stopped forwarding towards the destination (it closed, or a fault struck).
    closed: AtomicBool,
    /// Offset of the first byte the source wrote after it paused (`u64::MAX`: not yet).
    stop: AtomicU64,
}

impl Default for Marks {
    fn default() -> Self {
        Marks {
            received: AtomicU64::new(0),
            reading: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            stop: AtomicU64::new(u64::MAX),
        }
    }
}

impl Marks {
    pub fn new() -> Arc<Marks> {
        Arc::new(Marks::default())
    }

    /// Where the source's downtime part starts, once known.
    pub fn stop(&self) -> Option<u64> {
        let s = self.stop.load(Ordering::SeqCst);
        (s != u64::MAX).then_some(s)
    }

    /// Waits until the link towards the destination is quiet (the source is blocked on its
    /// vGPU) and marks what crossed as everything before the pause. Marks nothing when the link
    /// no longer forwards, or stays busy past a second.
    pub fn mark_pause(&self) {
        let t0 = Instant::now();
        let mut last = u64::MAX;
        while !self.closed.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(1) {
            let now = self.received.load(Ordering::SeqCst);
            if now == last && self.reading.load(Ordering::SeqCst) {
                self.stop.store(now, Ordering::SeqCst);
                return;
            }
            last = now;
            thread::sleep(Duration::from_millis(25));
        }
    }
}

/// What a fault that strikes a vGPU process does when the proxy trips.
pub type OnFire = Box<dyn Fn() + Send + Sync>;

pub struct Trip {
    fired: AtomicBool,
    /// Nothing more crosses (a VMM was killed, or the link cut).
    swallow: AtomicBool,
    fault: Fault,
    children: Mutex<(Option<Child>, Option<Child>)>,
    sockets: Mutex<Vec<TcpStream>>,
    captured: Mutex<Vec<u8>>,
    /// Where the proxy tripped: the direction and the bytes that had crossed in it.
    at: Mutex<Option<(Dir, u64)>>,
    on_fire: Option<OnFire>,
    marks: Arc<Marks>,
}

impl Trip {
    fn fire(&self, dir: Dir, sent: u64) {
        if self.fired.swap(true, Ordering::SeqCst) {
            return;
        }
        *self.at.lock().unwrap() = Some((dir, sent));
        if !self.fault.on_vmm() {
            // A vGPU process: it dies or its link holds before the held bytes go on.
            if let Some(f) = &self.on_fire {
                f();
            }
            return;
        }
        self.swallow.store(true, Ordering::SeqCst);
        let mut ch = self.children.lock().unwrap();
        let victim = match self.fault {
            Fault::KillSource => ch.0.as_mut(),
            Fault::KillDest => ch.1.as_mut(),
            _ => None,
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

/// A [`Limit::VmRecord`] once its record arrived: the byte at which it strikes. `cursor` walks
/// the records, `device` says whether a DEVICE record went by.
fn vm_record_at(
    bytes: &[u8],
    cursor: &mut usize,
    device: &mut bool,
    want: (u8, After, At),
    marks: &Marks,
) -> Option<u64> {
    const DEVICE: u8 = 3;
    *cursor = (*cursor).max(8);
    while let Some(head) = bytes.get(*cursor..*cursor + 9) {
        let (off, tag) = (*cursor as u64, head[0]);
        let len = u64::from(u32::from_le_bytes([head[1], head[2], head[3], head[4]]));
        let paused = marks.stop().is_some_and(|s| off >= s);
        let fits = tag == want.0
            && match want.1 {
                After::Start => true,
                After::FirstPass => *device && !paused,
                After::Pause => paused,
            };
        if fits {
            return Some(match want.2 {
                At::Header => off + 9,
                At::Middle => off + 9 + len / 2,
            });
        }
        *device |= tag == DEVICE;
        *cursor += 9 + len as usize;
    }
    None
}

fn pump(from: TcpStream, to: TcpStream, limit: Option<Limit>, trip: &Trip, dir: Dir) {
    forward(from, to, limit, trip, dir);
    if dir == Dir::ToDest {
        trip.marks.closed.store(true, Ordering::SeqCst);
    }
}

fn forward(mut from: TcpStream, mut to: TcpStream, limit: Option<Limit>, trip: &Trip, dir: Dir) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    let mut cursor = 0;
    let mut device = false;
    let mut limit = limit;
    loop {
        if dir == Dir::ToDest {
            trip.marks.reading.store(true, Ordering::SeqCst);
        }
        let read = from.read(&mut buf);
        if dir == Dir::ToDest {
            trip.marks.reading.store(false, Ordering::SeqCst);
        }
        let n = match read {
            Ok(0) | Err(_) => {
                if !trip.swallow.load(Ordering::SeqCst) {
                    let _ = to.shutdown(Shutdown::Write);
                }
                return;
            }
            Ok(n) => n,
        };
        if trip.swallow.load(Ordering::SeqCst) {
            trip.marks.closed.store(true, Ordering::SeqCst);
            continue; // swallowed: after a cut nothing crosses, after a kill nothing matters
        }
        if dir == Dir::ToDest {
            let mut captured = trip.captured.lock().unwrap();
            captured.extend_from_slice(&buf[..n]);
            trip.marks
                .received
                .store(captured.len() as u64, Ordering::SeqCst);
            match limit {
                Some(Limit::VmStreamEnd) => {
                    // COMMIT only follows the destination's ACK of the whole stream, so it
                    // never shares a read with the stream's last bytes.
                    if let Some(end) = vm_done_end(&captured, &mut cursor) {
                        limit = Some(Limit::Bytes(end));
                    }
                }
                Some(Limit::VmRecord { tag, after, at }) => {
                    let want = (tag, after, at);
                    if let Some(b) =
                        vm_record_at(&captured, &mut cursor, &mut device, want, &trip.marks)
                    {
                        limit = Some(Limit::Bytes(b));
                    }
                }
                _ => {}
            }
        }
        let mut take = n;
        if let Some(Limit::Bytes(l)) = limit {
            take = take.min(usize::try_from(l.saturating_sub(sent)).unwrap_or(usize::MAX));
        }
        if to.write_all(&buf[..take]).is_err() {
            return;
        }
        sent += take as u64;
        // The fault strikes when the sender goes past the offset.
        if take < n {
            trip.fire(dir, sent);
            limit = None;
            if trip.swallow.load(Ordering::SeqCst) {
                continue;
            }
            // A vGPU process was struck: the migration link itself goes on.
            if to.write_all(&buf[take..n]).is_err() {
                return;
            }
            sent += (n - take) as u64;
        }
    }
}

/// Forwards one connection between the source and the destination.
struct Proxy {
    listener: TcpListener,
    dest: String,
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

    /// Relays the first connection; returns the handle to wait on.
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
pub struct Side {
    pub json: Option<serde_json::Value>,
    pub code: Option<i32>,
    pub stderr: String,
}

impl Side {
    /// What this side holds: `vgpu` (gmig migrate) or `vm` (gmig vm migrate).
    pub fn vgpu(&self) -> &str {
        self.json
            .as_ref()
            .and_then(|j| j.get("vgpu").or_else(|| j.get("vm")))
            .and_then(serde_json::Value::as_str)
            .unwrap_or("killed")
    }
    pub fn field(&self, k: &str) -> Option<&serde_json::Value> {
        self.json.as_ref().and_then(|j| j.get(k))
    }
    /// Whether it exited reporting a failure (`"ok": false`).
    pub fn failed(&self) -> bool {
        self.field("ok") == Some(&false.into())
    }
}

pub fn side(out: &Output) -> Side {
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
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
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

pub struct Run {
    pub source: Side,
    pub dest: Side,
    /// Bytes the source sent towards the destination (with a VMM fault, up to the read in
    /// which it struck).
    pub captured: Vec<u8>,
    /// Where the proxy tripped (None: it never did).
    pub tripped: Option<(Dir, u64)>,
}

pub fn free_addr() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// Whether something listens on TCP `port` of this host (`/proc/net/tcp`, state 0A), seen
/// without touching the port.
fn listening(port: &str) -> bool {
    let want = format!(":{:04X}", port.parse::<u16>().unwrap_or(0));
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
        })
}

/// Starts the destination on a free address and waits until it listens there. The address is
/// free when chosen, but another process or connection may take it before the destination binds
/// it: a destination that failed for that ("Address already in use") is started again on another
/// address. One that exits before listening for any other reason comes back as its output.
fn spawn_listening(dest: &impl Fn(&str) -> Command) -> (String, Result<Child, Output>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let addr = free_addr();
        let port = addr.rsplit(':').next().unwrap_or_default().to_string();
        let mut child = dest(&addr)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let exited = loop {
            assert!(Instant::now() < deadline, "the destination never listened");
            if listening(&port) {
                break false;
            }
            if !matches!(child.try_wait(), Ok(None)) {
                break true;
            }
            thread::sleep(Duration::from_millis(10));
        };
        if !exited {
            return (addr, Ok(child));
        }
        let out = child.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !said.contains("Address already in use") {
            return (addr, Err(out));
        }
    }
}

/// Any destination and source command pair through the proxy; `on_fire` is what a fault on a
/// vGPU process does when the proxy trips.
pub fn run_pair(
    dest: impl Fn(&str) -> Command,
    source: impl FnOnce(&str) -> Command,
    trigger: Option<(Dir, Limit)>,
    fault: Fault,
    on_fire: Option<OnFire>,
    marks: Option<Arc<Marks>>,
) -> Run {
    let (dest_addr, dest) = spawn_listening(&dest);
    // A destination that already ended (it failed before listening) is waited for no more.
    let (dest, dest_out) = match dest {
        Ok(child) => (Some(child), None),
        Err(out) => (None, Some(out)),
    };
    let proxy = Proxy::new(dest_addr);
    let proxy_addr = proxy.addr();
    let trip = Arc::new(Trip {
        fired: AtomicBool::new(false),
        swallow: AtomicBool::new(false),
        fault,
        children: Mutex::new((None, dest)),
        sockets: Mutex::new(Vec::new()),
        captured: Mutex::new(Vec::new()),
        at: Mutex::new(None),
        on_fire,
        marks: marks.unwrap_or_default(),
    });
    let relay = proxy.run(trigger, trip.clone());
    let source = source(&proxy_addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    trip.children.lock().unwrap().0 = Some(source);
    let deadline = Instant::now() + Duration::from_secs(60);
    // Wait for both without holding the lock the proxy needs to kill one of them.
    let mut outs: [Option<Output>; 2] = [None, dest_out];
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
    let tripped = *trip.at.lock().unwrap();
    Run {
        source: side(&s.unwrap()),
        dest: side(&d.unwrap()),
        captured,
        tripped,
    }
}

/// Runs every (fault, phase) cell, `threads` at a time, each in its own directory under `tmp`.
pub fn run_cells<R: Send>(
    faults: &[Fault],
    phases: usize,
    threads: usize,
    tmp: &Path,
    cell: impl Fn(Fault, usize, &Path) -> R + Sync,
) -> Vec<(Fault, usize, R, PathBuf)> {
    let cells: Vec<(Fault, usize)> = faults
        .iter()
        .flat_map(|&f| (0..phases).map(move |p| (f, p)))
        .collect();
    // Cells are dealt round-robin, so slow kinds (timeouts) spread over the threads.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out = thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (cell, cells, next) = (&cell, &cells, &next);
                s.spawn(move || {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(&(fault, p)) = cells.get(i) else {
                            break;
                        };
                        let dir = tmp.join(format!("{fault:?}-{p}"));
                        std::fs::create_dir_all(&dir).unwrap();
                        let r = cell(fault, p, &dir);
                        done.push((i, (fault, p, r, dir)));
                    }
                    done
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, c)| c).collect()
}

/// How one kind of pair states its state and resumes a saved copy.
pub struct Flavour<'a> {
    /// The owner's state, from its JSON: the vGPU's digest, or the guest's checksum line.
    pub state: &'a dyn Fn(&serde_json::Value) -> Option<String>,
    /// Resumes a checkpoint file; the resumed side's JSON.
    pub resume: &'a dyn Fn(&Path) -> serde_json::Value,
    /// The unmigrated guest's state, given the source's JSON when the source survived.
    pub expected: &'a dyn Fn(Option<&serde_json::Value>) -> String,
    /// Print the process and fault as two columns (the whole-VM table).
    pub wide: bool,
}

/// One judged cell: its table row.
pub struct Judged {
    pub row: String,
    /// Whether a copy survived the fault and ended with one owner.
    pub owned: bool,
}

/// Judges every cell (`lost_ok`: where no owner is allowed), prints the table and fails on any
/// broken invariant; returns the judged rows.
pub fn judge_all(
    results: Vec<(Fault, usize, Run, PathBuf)>,
    names: &[&str],
    lost_ok: impl Fn(Fault, usize) -> bool,
    fl: &Flavour<'_>,
    t0: Instant,
) -> Vec<Judged> {
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
    if fl.wide {
        eprintln!(
            "| process | fault | phase | source ends | destination ends | owner afterwards |"
        );
        eprintln!("|---|---|---|---|---|---|");
    } else {
        eprintln!("| fault | phase | source ends | destination ends | owner afterwards |");
        eprintln!("|---|---|---|---|---|");
    }
    for j in &table {
        eprintln!("{}", j.row);
    }
    let owned = table.iter().filter(|j| j.owned).count();
    eprintln!(
        "{} cells in {:.1} s; {owned} with one owner and the unmigrated guest's state, {} lost \
         with the process that held the only copy",
        table.len(),
        t0.elapsed().as_secs_f64(),
        table.len() - owned
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    table
}

/// Checks one cell and resolves its doubt as an operator would; returns its table row.
pub fn judge(
    fault: Fault,
    phase: &str,
    lost_ok: bool,
    r: &Run,
    fl: &Flavour<'_>,
    failures: &mut Vec<String>,
) -> Judged {
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
    // Nothing panics, whatever died around it.
    for (s, role) in [(&r.source, "source"), (&r.dest, "destination")] {
        check(
            !s.stderr.contains("panicked"),
            format!("the {role} panicked: {}", s.stderr),
        );
    }
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
            // A source whose migration completed holds nothing; one whose vGPU died holds
            // nothing either, and says the migration failed.
            "none" if role == "source" && !s.failed() => Some(0),
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
        _ => (lost_with(fault).to_string(), None),
    };
    let owned = state.is_some();
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
    let row = if fl.wide {
        format!(
            "| {} | {} | {phase} | {sv} | {dv} | {outcome} |",
            fault.process(),
            fault.action()
        )
    } else {
        format!("| {} | {phase} | {sv} | {dv} | {outcome} |", fault.name())
    };
    Judged { row, owned }
}

/// Where the only copy went when no side owns the guest afterwards.
fn lost_with(fault: Fault) -> &'static str {
    match fault {
        Fault::KillSource => "lost with the killed source",
        Fault::KillDest => "lost with the killed destination",
        Fault::Cut => "lost",
        Fault::KillSourceServe => "lost with the source's vGPU process",
        Fault::HoldSourceServe => "lost with the source's unreachable vGPU",
        Fault::KillDestServe => "lost with the destination's vGPU process, after it ran the guest",
        Fault::HoldDestServe => {
            "lost with the destination's unreachable vGPU, after it ran the guest"
        }
    }
}
