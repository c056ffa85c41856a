//! A vfio-user relay between a VMM and its `gmig serve`, for fault injection: it forwards whole
//! messages in both directions with the file descriptors they carry (guest RAM's memfd in
//! DMA_MAP, the MSI eventfd in SET_IRQS), logs the VMM's requests, and at a chosen request —
//! or when told — kills the server (SIGKILL; the VMM then sees its connection close) or holds
//! the link (forwards nothing more and keeps both connections open: a hung or partitioned vGPU
//! process, which the VMM finds out only by its timeout).

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// The vfio-user command the relay names.
pub const MIG_DATA_READ: u16 = 17;
const DEVICE_FEATURE: u16 = 16;
const FEATURE_SET: u32 = 1 << 17;
const FEATURE_MIG_DEVICE_STATE: u32 = 2;
/// Feature indices of DEVICE_FEATURE requests.
pub const DMA_LOGGING_START: u32 = 6;
/// See [`DMA_LOGGING_START`].
pub const DMA_LOGGING_REPORT: u32 = 8;
/// VFIO device states the relay names.
pub const RUNNING: u32 = 2;
/// See [`RUNNING`].
pub const STOP_COPY: u32 = 3;
/// See [`RUNNING`].
pub const PRE_COPY: u32 = 6;

/// One request of the VMM, as the relay saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req {
    /// The command.
    pub command: u16,
    /// DEVICE_FEATURE: the feature index.
    pub feature: Option<u32>,
    /// The device state the vGPU was last told to enter before this request (RUNNING at first).
    pub state: u32,
    /// A MIG_DEVICE_STATE SET: the state it asks for.
    pub sets: Option<u32>,
}

impl Req {
    /// A DEVICE_FEATURE request of feature `f`.
    pub fn is_feature(&self, f: u32) -> bool {
        self.command == DEVICE_FEATURE && self.feature == Some(f)
    }
}

/// What the relay does to the server when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// SIGKILL the server.
    Kill,
    /// Forward nothing more; keep both connections open.
    Hold,
}

/// Decides, for each request of the VMM (the log so far, this one last), whether to fire.
pub type Trigger = Box<dyn Fn(&[Req]) -> bool + Send + Sync>;

/// Sees each request of the VMM before it goes on (it may hold it a while).
pub type Watch = Box<dyn Fn(&Req) + Send + Sync>;

struct Shared {
    action: Action,
    trigger: Option<Trigger>,
    watch: Option<Watch>,
    server: Mutex<Option<Child>>,
    fired: AtomicBool,
    /// The request at which the relay fired (None: fired from outside, or not fired).
    fired_at: Mutex<Option<Req>>,
    log: Mutex<Vec<Req>>,
    sockets: Mutex<Vec<UnixStream>>,
}

impl Shared {
    fn fire(&self, at: Option<Req>) {
        if self.fired.swap(true, Ordering::SeqCst) {
            return;
        }
        *self.fired_at.lock().unwrap() = at;
        if self.action == Action::Kill {
            if let Some(c) = self.server.lock().unwrap().as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            // The server's end closed: so does the VMM's, as if it were connected directly.
            for s in self.sockets.lock().unwrap().iter() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// A running relay and its `gmig serve`.
pub struct Relay {
    shared: Arc<Shared>,
    thread: Option<thread::JoinHandle<()>>,
    /// The socket the VMM connects to.
    pub path: PathBuf,
}

impl Relay {
    /// Relays the first connection to `listen` to the server `server` listens on (its process
    /// `child`), firing `action` at the first request `trigger` picks; `watch` sees every
    /// request first.
    pub fn start(
        listen: &Path,
        server: PathBuf,
        child: Child,
        action: Action,
        trigger: Option<Trigger>,
        watch: Option<Watch>,
    ) -> Relay {
        let listener = UnixListener::bind(listen).unwrap();
        let shared = Arc::new(Shared {
            action,
            trigger,
            watch,
            server: Mutex::new(Some(child)),
            fired: AtomicBool::new(false),
            fired_at: Mutex::new(None),
            log: Mutex::new(Vec::new()),
            sockets: Mutex::new(Vec::new()),
        });
        let sh = shared.clone();
        let thread = thread::spawn(move || {
            let Ok((vmm, _)) = listener.accept() else {
                return;
            };
            let t0 = Instant::now();
            let srv = loop {
                if sh.fired.load(Ordering::SeqCst) {
                    return; // struck before it connected: the VMM's connection closes
                }
                match UnixStream::connect(&server) {
                    Ok(s) => break s,
                    Err(_) if t0.elapsed() < Duration::from_secs(20) => {
                        thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => return,
                }
            };
            sh.sockets
                .lock()
                .unwrap()
                .extend([vmm.try_clone().unwrap(), srv.try_clone().unwrap()]);
            let (v2, s2) = (vmm.try_clone().unwrap(), srv.try_clone().unwrap());
            let up = {
                let sh = sh.clone();
                thread::spawn(move || pump(vmm, srv, &sh, true))
            };
            pump(s2, v2, &sh, false);
            let _ = up.join();
        });
        Relay {
            shared,
            thread: Some(thread),
            path: listen.to_path_buf(),
        }
    }

    /// Fires the action now (from the migration link's proxy).
    pub fn fire(&self) {
        self.shared.fire(None);
    }

    /// Whether the relay fired, and at which request of the VMM when a trigger picked it.
    pub fn fired(&self) -> (bool, Option<Req>) {
        (
            self.shared.fired.load(Ordering::SeqCst),
            *self.shared.fired_at.lock().unwrap(),
        )
    }

    /// The VMM's requests so far.
    pub fn log(&self) -> Vec<Req> {
        self.shared.log.lock().unwrap().clone()
    }

    /// Ends the server (if it still runs) and the relay; returns what the server wrote on
    /// stderr, when it was captured.
    pub fn finish(mut self) -> String {
        let mut err = String::new();
        if let Some(mut c) = self.shared.server.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
            if let Some(mut e) = c.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
        }
        for s in self.shared.sockets.lock().unwrap().iter() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        // A relay never connected to waits in accept: wake it.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        err
    }
}

/// Receives one message: header (with the descriptors that came with it) and payload.
fn recv_message(s: &mut UnixStream) -> Option<(Vec<u8>, Vec<OwnedFd>)> {
    let mut head = [0u8; 16];
    let mut fds = Vec::new();
    let n = {
        let mut iov = [IoSliceMut::new(&mut head)];
        let mut space = nix::cmsg_space!([RawFd; 8]);
        let msg = recvmsg::<()>(
            s.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .ok()?;
        for c in msg.cmsgs().ok()? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: each descriptor was just received with SCM_RIGHTS and belongs to
                // nobody else; the OwnedFd closes it once.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        msg.bytes
    };
    if n == 0 {
        return None;
    }
    s.read_exact(&mut head[n..]).ok()?;
    let size = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    let mut msg = head.to_vec();
    msg.resize(size.max(16), 0);
    s.read_exact(&mut msg[16..]).ok()?;
    Some((msg, fds))
}

fn send_message(s: &mut UnixStream, msg: &[u8], fds: &[OwnedFd]) -> Option<()> {
    if fds.is_empty() {
        return s.write_all(msg).ok();
    }
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let n = sendmsg::<()>(
        s.as_raw_fd(),
        &[IoSlice::new(msg)],
        &[ControlMessage::ScmRights(&raw)],
        MsgFlags::empty(),
        None,
    )
    .ok()?;
    s.write_all(&msg[n..]).ok()
}

/// The request in `msg` (a command from the VMM), given the state it was in.
fn request(msg: &[u8], state: u32) -> Req {
    let command = u16::from_le_bytes([msg[2], msg[3]]);
    let word = |at: usize| {
        msg.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let flags = if command == DEVICE_FEATURE {
        word(20)
    } else {
        None
    };
    let sets = flags
        .filter(|f| f & FEATURE_SET != 0 && f & 0xffff == FEATURE_MIG_DEVICE_STATE)
        .and_then(|_| word(24));
    Req {
        command,
        feature: flags.map(|f| f & 0xffff),
        state,
        sets,
    }
}

/// Forwards messages `from` → `to`; `up` is the VMM's direction (requests, and its replies to
/// the server's DMA requests).
fn pump(mut from: UnixStream, mut to: UnixStream, sh: &Shared, up: bool) {
    let mut state = RUNNING;
    while let Some((msg, fds)) = recv_message(&mut from) {
        let is_reply = u32::from_le_bytes([msg[8], msg[9], msg[10], msg[11]]) & 0xf == 1;
        if up && !is_reply && !sh.fired.load(Ordering::SeqCst) {
            let req = request(&msg, state);
            let fire = {
                let mut log = sh.log.lock().unwrap();
                log.push(req);
                sh.trigger.as_ref().is_some_and(|t| t(&log))
            };
            if let Some(to) = req.sets {
                state = to;
            }
            if fire {
                // The request dies with the server, or is held.
                sh.fire(Some(req));
            } else if let Some(w) = &sh.watch {
                w(&req);
            }
        }
        if sh.fired.load(Ordering::SeqCst) {
            continue; // killed: nothing matters; held: nothing crosses
        }
        if send_message(&mut to, &msg, &fds).is_none() {
            break;
        }
    }
    if !sh.fired.load(Ordering::SeqCst) {
        let _ = to.shutdown(std::net::Shutdown::Write);
    }
}
