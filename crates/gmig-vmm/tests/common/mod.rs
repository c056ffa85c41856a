//! Shared scaffolding of the real-guest tests: vGPUs, a baseline run, a migration at a chosen
//! point over loopback TCP, and the differential comparison.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};

use gmig_qemu_bridge::vgpu_backend::{VgpuBackend, VgpuSpec};
use gmig_vgpu::gm::{Gfn, VgpuType};
use gmig_vmm::migrate::{migrate_in, migrate_out_at, Incoming, Options, Report};
use gmig_vmm::{guest, GpuLink, GuestConfig, Linked, Machine, Progress, Stop, Work};

/// Guest RAM of the tests.
pub const RAM: u64 = 64 << 20;
/// Migration options of the tests: short rounds (several pre-copy rounds run while the guest and
/// its GPU work, so pages the vGPU writes after they were sent must be sent again).
pub fn opts() -> gmig_vmm::migrate::Options {
    gmig_vmm::migrate::Options {
        round_exits: 16,
        ..gmig_vmm::migrate::Options::default()
    }
}

/// Guest phases (its telemetry page): GGTT setup, then frames.
pub const PHASE_SETUP: u64 = 2;
/// See [`PHASE_SETUP`].
pub const PHASE_FRAMES: u64 = 3;

/// Frames of the test guests: enough that every switch-over point leaves most of the run to the
/// destination.
pub const FRAMES: u32 = 24;

/// Enough exits for any test guest to finish.
pub const ALL: u64 = 50_000_000;

pub fn kvm_present() -> bool {
    if std::path::Path::new("/dev/kvm").exists() {
        return true;
    }
    eprintln!("SKIPPED: /dev/kvm is absent; the real-guest tests need KVM");
    false
}

/// The in-process vGPU in host slot `slot`.
pub fn linked(slot: u32, remap: bool) -> Box<dyn GpuLink> {
    let mut spec = VgpuSpec::for_guest(VgpuType::V5_8, slot, true).expect("spec");
    spec.remap = remap;
    Box::new(Linked(VgpuBackend::new(spec)))
}

/// Runs `cfg` to completion without migrating.
pub fn baseline(cfg: &GuestConfig) -> Machine {
    let mut m = Machine::boot(RAM, cfg, linked(0, true)).expect("boot");
    assert_eq!(m.run(ALL).expect("run"), Stop::Halted);
    m
}

/// Where the switch-over lands (the source's vCPU pauses for good at the first exit at which the
/// point holds; pre-copy rounds run until then).
#[derive(Debug, Clone, Copy)]
pub enum Point {
    /// This many exits after the guest entered its GGTT setup (telemetry phase 2: objects
    /// being mapped through BAR0, no frame yet).
    Setup(u64),
    /// This many exits after the guest completed this many frames (a few exits in: mid-frame).
    Frame(u64, u64),
    /// At the first exit after this many completed frames at which the vGPU holds a queued
    /// workload (in process only: the VMM looks inside the vGPU).
    QueuedAfter(u64),
}

impl Point {
    /// The predicate [`gmig_vmm::migrate::migrate_out_at`] asks after every exit.
    pub fn reached(self) -> impl FnMut(&Machine) -> bool {
        let mut into_frame: Option<u64> = None;
        let mut into_setup: Option<u64> = None;
        move |m: &Machine| match self {
            Point::Setup(n) => {
                if m.telemetry().map_or(0, |t| t.phase) < PHASE_SETUP {
                    return false;
                }
                let at = *into_setup.get_or_insert(m.exits);
                m.exits >= at + n
            }
            Point::Frame(f, n) => {
                if m.frames_done() < f {
                    return false;
                }
                let at = *into_frame.get_or_insert(m.exits);
                m.exits >= at + n
            }
            Point::QueuedAfter(f) => m.frames_done() >= f && queued(m) > 0,
        }
    }

    /// Where the migration starts (frames completed): at boot for a setup point, halfway to the
    /// frame otherwise.
    fn start(self) -> u64 {
        match self {
            Point::Setup(_) => 0,
            Point::Frame(f, _) | Point::QueuedAfter(f) => f / 2,
        }
    }
}

pub fn queued(m: &Machine) -> usize {
    m.gpu_ref()
        .link_ref()
        .backend()
        .and_then(|b| b.vm())
        .map_or(0, |vm| vm.vgpu().queued())
}

/// Boots `cfg` on a source (host slot 0), runs it to where the migration starts, migrates it
/// with the switch-over at `point` to a destination (`dest`, slot 1 in the tests, so the vGPU
/// moves in graphics memory) over loopback TCP, and returns the source, the destination (not yet
/// run further) and the source's report; the results are returned, not unwrapped.
pub fn migrate_at(
    cfg: &GuestConfig,
    point: Point,
    opts: &Options,
    dest: Box<dyn GpuLink>,
) -> (
    Machine,
    gmig_vmm::Result<(Machine, Incoming)>,
    gmig_vmm::Result<Report>,
) {
    let src = Machine::boot(RAM, cfg, linked(0, true)).expect("boot");
    migrate_machine_at(src, cfg, point, opts, move |s| migrate_in(s, dest))
}

/// As [`migrate_at`] for a source machine already booted, with the destination's side given as
/// a closure over the accepted connection.
pub fn migrate_machine_at<D>(
    mut src: Machine,
    cfg: &GuestConfig,
    point: Point,
    opts: &Options,
    dest: D,
) -> (
    Machine,
    gmig_vmm::Result<(Machine, Incoming)>,
    gmig_vmm::Result<Report>,
)
where
    D: FnOnce(&mut TcpStream) -> gmig_vmm::Result<(Machine, Incoming)> + Send + 'static,
{
    let start = point.start();
    src.run_until(ALL, |m| m.frames_done() >= start)
        .expect("run to where the migration starts");
    assert!(
        !src.halted(),
        "the guest finished before the migration started"
    );
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr().expect("address");
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        dest(&mut s)
    });
    let mut conn = TcpStream::connect(addr).expect("connect");
    let mut reached = point.reached();
    let rep = migrate_out_at(&mut src, cfg, &mut conn, opts, &mut reached);
    drop(conn);
    let incoming = t.join().expect("destination thread");
    (src, incoming, rep)
}

/// Asserts that the switch-over left work to the destination and that the destination, run on
/// to its end (`dest` already run), did it: the source had not finished at the stop, and the
/// destination completed frames and (where the vGPU is visible: `gpu`, else the in-process
/// link) ran GPU workloads. Returns what the destination did.
pub fn assert_destination_worked(
    what: &str,
    rep: &Report,
    inc: &Incoming,
    dest: &Machine,
    gpu: Option<(Progress, Progress)>,
) -> Work {
    assert!(
        !rep.at_stop.halted,
        "{what}: the source guest had finished when it paused for the switch-over"
    );
    assert_eq!(
        rep.at_stop.frames, inc.at_restore.frames,
        "{what}: the destination restored the guest at another frame than the source stopped at"
    );
    let mut work = Progress::of(dest).work_since(&inc.at_restore);
    if let Some((stop, end)) = gpu {
        work.workloads = end.work_since(&stop).workloads;
    }
    assert!(
        work.frames > 0,
        "{what}: the destination completed no frame after the switch-over ({work:?})"
    );
    let workloads = work
        .workloads
        .unwrap_or_else(|| panic!("{what}: the destination's vGPU counters are not visible"));
    assert!(
        workloads > 0,
        "{what}: the destination's vGPU ran no workload after the switch-over ({work:?})"
    );
    eprintln!(
        "{what}: switch-over at frame {} (exit {}); the destination ran {} frames and {workloads} \
         GPU workloads after it",
        rep.at_stop.frames, rep.at_stop.exits, work.frames
    );
    work
}

/// The faults an in-process vGPU recorded, as text.
pub fn faults(m: &Machine) -> Vec<String> {
    m.gpu_ref()
        .link_ref()
        .backend()
        .map(served_faults)
        .unwrap_or_default()
}

/// Guest RAM of `m`, without the telemetry page.
pub fn ram(m: &Machine) -> Vec<u8> {
    m.ram_image().expect("read RAM")
}

/// Pages where two RAM images differ.
pub fn differing_pages(a: &[u8], b: &[u8]) -> Vec<u64> {
    a.chunks(4096)
        .zip(b.chunks(4096))
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, _)| i as u64)
        .collect()
}

/// Asserts that `b` finished exactly as `a`: serial results, guest RAM (telemetry aside), and
/// the vGPU's guest-visible state.
pub fn assert_same_run(a: &Machine, b: &Machine, what: &str) {
    assert_eq!(
        a.serial_results(),
        b.serial_results(),
        "{what}: serial output"
    );
    let (ra, rb) = (ram(a), ram(b));
    let diff = differing_pages(&ra, &rb);
    for &p in diff.iter().take(2) {
        let at = (p * 4096) as usize;
        let bytes: Vec<(usize, u8, u8)> = (at..at + 4096)
            .filter(|&i| ra[i] != rb[i])
            .take(16)
            .map(|i| (i, ra[i], rb[i]))
            .collect();
        eprintln!("{what}: page {p:#x} differs at {bytes:x?}");
    }
    assert!(
        diff.is_empty(),
        "{what}: guest RAM differs in pages {diff:x?}"
    );
    let va = a.gpu_ref().link_ref().backend().and_then(|x| x.vm());
    let vb = b.gpu_ref().link_ref().backend().and_then(|x| x.vm());
    if let (Some(va), Some(vb)) = (va, vb) {
        let mut d = gmig_vgpu::compare::compare_guest_visible(va.vgpu(), vb.vgpu());
        d.pages.retain(|g| *g != Gfn(guest::TELEMETRY / 4096));
        assert!(d.is_identical(), "{what}: vGPU state differs: {d:?}");
    }
}

/// A vfio-user server (gmig's, on a thread) serving a vGPU in host slot `slot` (remapping as
/// `remap` says) on a socket in `dir`; returns the socket path and the server thread, which
/// hands the vGPU back when its one client is gone (as `gmig serve --clients 1`), so a test can
/// look inside it.
pub fn serve_vgpu_with(
    dir: &std::path::Path,
    name: &str,
    slot: u32,
    remap: bool,
) -> (std::path::PathBuf, std::thread::JoinHandle<VgpuBackend>) {
    use gmig_qemu_bridge::server::Server;
    let path = dir.join(name);
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let mut spec = VgpuSpec::for_guest(VgpuType::V5_8, slot, true).expect("spec");
    spec.remap = remap;
    let t = std::thread::spawn(move || {
        let (stream, _) = listener.accept().expect("accept");
        let mut server = Server::new(VgpuBackend::new(spec));
        let _ = server.serve(stream);
        server.into_device()
    });
    (path, t)
}

/// [`serve_vgpu_with`] with remapping on, the thread left to run.
pub fn serve_vgpu(dir: &std::path::Path, name: &str, slot: u32) -> std::path::PathBuf {
    serve_vgpu_with(dir, name, slot, true).0
}

/// The counters of a served vGPU handed back by [`serve_vgpu_with`].
pub fn served_progress(b: &VgpuBackend) -> Progress {
    Progress {
        gpu: gmig_vmm::GpuProgress::of(b),
        ..Progress::default()
    }
}

/// The faults of a served vGPU handed back by [`serve_vgpu_with`].
pub fn served_faults(b: &VgpuBackend) -> Vec<String> {
    b.vm()
        .map(|vm| {
            vm.vgpu()
                .faults()
                .iter()
                .map(|f| f.reason.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// The vGPU over vfio-user, from a server started with [`serve_vgpu`].
pub fn remote(path: &std::path::Path) -> Box<dyn GpuLink> {
    Box::new(gmig_vmm::Remote::connect(path).expect("connect"))
}
