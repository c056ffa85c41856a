//! Shared scaffolding of the real-guest tests: vGPUs, a baseline run, a migration at a chosen
//! point over loopback TCP, and the differential comparison.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};

use gmig_qemu_bridge::vgpu_backend::{VgpuBackend, VgpuSpec};
use gmig_vgpu::gm::{Gfn, VgpuType};
use gmig_vmm::migrate::{migrate_in, migrate_out, Incoming, Options, Report};
use gmig_vmm::{guest, GpuLink, GuestConfig, Linked, Machine, Stop};

/// Guest RAM of the tests.
pub const RAM: u64 = 64 << 20;
/// Migration options of the tests: short rounds, so pre-copy ends while the guest still runs.
pub fn opts() -> gmig_vmm::migrate::Options {
    gmig_vmm::migrate::Options {
        round_exits: 64,
        ..gmig_vmm::migrate::Options::default()
    }
}

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

/// Where the source is when the migration starts.
#[derive(Debug, Clone, Copy)]
pub enum Point {
    /// After this many exits.
    Exit(u64),
    /// This many exits after the guest completed this many frames (a few exits in: mid-frame).
    Frame(u64, u64),
    /// At the first exit after this many completed frames at which the vGPU holds a queued
    /// batch.
    QueuedAfter(u64),
}

pub fn queued(m: &Machine) -> usize {
    m.gpu_ref()
        .link_ref()
        .backend()
        .and_then(|b| b.vm())
        .map_or(0, |vm| vm.vgpu().queued())
}

/// Boots `cfg` on a source, runs it to `point`, migrates it to a destination (host slot 1, so
/// the vGPU moves in graphics memory) over loopback TCP, and returns the source, the destination
/// (not yet run further) and the reports; the migration result is returned, not unwrapped.
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
    let mut src = Machine::boot(RAM, cfg, linked(0, true)).expect("boot");
    match point {
        Point::Exit(n) => {
            src.run(n).expect("run to the migration point");
        }
        Point::Frame(f, n) => {
            src.run_until(ALL, |m| m.frames_done() >= f)
                .expect("run to the frame");
            src.run(n).expect("run into the frame");
        }
        Point::QueuedAfter(f) => {
            src.run_until(ALL, |m| m.frames_done() >= f)
                .expect("run to the frame");
            src.run_until(ALL, |m| queued(m) > 0)
                .expect("run to a queued batch");
            assert!(queued(&src) > 0, "no queued batch to migrate with");
        }
    }
    assert!(
        !src.halted(),
        "the guest finished before the migration point"
    );
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr().expect("address");
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        migrate_in(&mut s, dest)
    });
    let mut conn = TcpStream::connect(addr).expect("connect");
    let rep = migrate_out(&mut src, cfg, &mut conn, opts);
    drop(conn);
    let incoming = t.join().expect("destination thread");
    (src, incoming, rep)
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

/// A vfio-user server (gmig's, on a thread) serving a vGPU in host slot `slot` on a socket in
/// `dir`; returns the socket path. The server serves one client, as `gmig serve --clients 1`.
pub fn serve_vgpu(dir: &std::path::Path, name: &str, slot: u32) -> std::path::PathBuf {
    use gmig_qemu_bridge::server::Server;
    let path = dir.join(name);
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let spec = VgpuSpec::for_guest(VgpuType::V5_8, slot, true).expect("spec");
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().expect("accept");
        let mut server = Server::new(VgpuBackend::new(spec));
        let _ = server.serve(stream);
    });
    path
}

/// The vGPU over vfio-user, from a server started with [`serve_vgpu`].
pub fn remote(path: &std::path::Path) -> Box<dyn GpuLink> {
    Box::new(gmig_vmm::Remote::connect(path).expect("connect"))
}
