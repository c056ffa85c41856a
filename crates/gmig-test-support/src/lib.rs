//! # gmig-test-support
//!
//! Helpers that several of gmig's test suites and benchmarks share, kept in one place so that
//! they cannot drift apart. Not a public API: nothing outside the workspace's tests depends on it.
//!
//! **Owns:** a lone vGPU on a default host ([`lone_vgpu`]); vGPU slice placements for "the
//! destination sits elsewhere" tests ([`moved_slices`]); fault-injecting connections
//! ([`Corrupting`]); a connected loopback TCP pair ([`tcp_pair`]); checking that a command exited
//! successfully ([`assert_success`]); the one wait loop ([`poll_until`]); the fuzz harnesses for every decoder of untrusted bytes
//! ([`fuzz`]), shared by `fuzz/` and CI's smoke tests; QEMU and cloud-hypervisor processes
//! around `gmig serve` ([`qemu`], [`cloud_hypervisor`]); private libvirt daemons with gmig's hook
//! ([`libvirt`]).
//!
//! **Must not know about:** anything a production path needs.
#![warn(missing_docs)]

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::process::Output;
use std::thread;

use gmig_core::transport::{Connection, Endpoint};

pub mod cloud_hypervisor;
pub mod fuzz;
pub mod libvirt;
pub mod qemu;

use gmig_vgpu::gm::{HostConfig, PartitionManager, VgpuSlices, VgpuType};
use gmig_vgpu::gtt::new_guest_ram;
use gmig_vgpu::vgpu::{Vgpu, VgpuConfig};

/// Calls `done` every `period` until it holds or `limit` has passed, then once more; whether it
/// held. The one wait loop of the test processes (consoles, logs, files, daemons).
pub fn poll_until(
    limit: std::time::Duration,
    period: std::time::Duration,
    mut done: impl FnMut() -> bool,
) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if done() {
            return true;
        }
        thread::sleep(period);
    }
    done()
}

/// A 64+384 vGPU (number 1) placed first on an empty default host, with `ram` bytes of guest RAM.
///
/// # Panics
/// When the default host or the guest RAM cannot be set up (a test set-up error).
pub fn lone_vgpu(ram: usize) -> Vgpu {
    let mut pm = PartitionManager::new(HostConfig::default()).expect("default host");
    let (_, s) = pm.place(VgpuType::V5_8).expect("place vGPU");
    let ram = new_guest_ram(ram).expect("guest RAM");
    Vgpu::new(VgpuConfig::new(VgpuType::V5_8, 1), s, ram).expect("vGPU")
}

/// Source slices for a `ty` vGPU placed first on an empty host, and destination slices for the
/// same type on a host where a 128+512 vGPU was placed first and the source's offsets are
/// avoided — so both the aperture and the hidden slice move, and every migration remaps.
///
/// # Panics
/// When the default host cannot hold the vGPUs (a test set-up error).
pub fn moved_slices(ty: VgpuType) -> (VgpuSlices, VgpuSlices) {
    let mut src = PartitionManager::new(HostConfig::default()).expect("default host");
    let (_, s) = src.place(ty).expect("place source vGPU");
    let mut dst = PartitionManager::new(HostConfig::default()).expect("default host");
    dst.place(VgpuType::V5_4).expect("place neighbour vGPU");
    let (_, d) = dst
        .place_avoiding(ty, Some(&s))
        .expect("place destination vGPU");
    assert_ne!(s.aperture.base, d.aperture.base, "aperture slice must move");
    assert_ne!(s.hidden.base, d.hidden.base, "hidden slice must move");
    (s, d)
}

/// A connection that flips one bit (0x20) of the byte at stream offset `at` of what it writes;
/// reads pass through. Use it to check that a destination refuses a corrupted stream.
#[derive(Debug)]
pub struct Corrupting<C> {
    /// The connection underneath.
    pub inner: C,
    /// Stream offset of the byte to corrupt.
    pub at: u64,
    /// Bytes written so far.
    pub written: u64,
}

impl<C> Corrupting<C> {
    /// Corrupt the byte at stream offset `at` of what is written through `inner`.
    pub fn new(inner: C, at: u64) -> Self {
        Self {
            inner,
            at,
            written: 0,
        }
    }
}

impl<C: Read> Read for Corrupting<C> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.inner.read(b)
    }
}

impl<C: Write> Write for Corrupting<C> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut buf = data.to_vec();
        let end = self.written + data.len() as u64;
        if (self.written..end).contains(&self.at) {
            let i = usize::try_from(self.at - self.written).expect("index within a slice");
            buf[i] ^= 0x20;
        }
        let n = self.inner.write(&buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

gmig_core::forward_connection!(Corrupting);

/// Both ends of a TCP connection over loopback: the first is the connecting side, the second the
/// accepted one.
///
/// # Panics
/// When loopback cannot listen, connect or accept (a test set-up error).
pub fn tcp_pair() -> (Box<dyn Connection>, Box<dyn Connection>) {
    let l = Endpoint::Tcp(
        "127.0.0.1:0"
            .parse::<SocketAddr>()
            .expect("loopback address"),
    )
    .listen()
    .expect("listen on loopback");
    let ep = l.endpoint().expect("listening endpoint");
    let t = thread::spawn(move || l.accept().expect("accept on loopback"));
    let a = ep.connect().expect("connect over loopback");
    (a, t.join().expect("accepting thread"))
}

/// A destination that accepts the stream's header and then reads everything, never answering
/// (a SYNC stays unanswered), until the source hangs up. The thread returns the bytes that came.
///
/// # Panics
/// In the thread, when the header cannot be read or the acceptance cannot be written.
pub fn mute_destination<C: Read + Write + Send + 'static>(
    mut conn: C,
) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut head = [0u8; gmig_core::stream::HEADER_LEN];
        conn.read_exact(&mut head).expect("stream header");
        gmig_core::stream::Control::HeaderAccepted
            .write_to(&mut conn)
            .expect("accept the header");
        conn.flush().expect("flush the acceptance");
        let mut got = head.to_vec();
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = conn.read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        got
    })
}

/// The sections a byte capture of a stream decodes to, as far as it is complete and valid (a
/// capture may end mid-section, or go on with a control frame).
pub fn sections_of(bytes: &[u8]) -> Vec<gmig_core::stream::Section> {
    let limits = gmig_core::stream::StreamLimits::default();
    let mut d = gmig_core::stream::StreamDecoder::new(limits, None);
    let mut out = Vec::new();
    for piece in bytes.chunks(4096) {
        if d.feed(piece).is_err() {
            break;
        }
        while let Ok(Some(s)) = d.next_section() {
            out.push(s);
        }
    }
    out
}

/// Asserts that a finished command exited successfully, showing its stderr when it did not.
///
/// # Panics
/// When the command's exit status is not success.
#[track_caller]
pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
