//! cloud-hypervisor live-migrates a VM with a gmig vGPU: `ch-remote send-migration` /
//! `receive-migration` between two cloud-hypervisor processes whose `gmig serve` sit in
//! different host slots.
//!
//! cloud-hypervisor is built by `scripts/cloud-hypervisor/build.sh` with
//! `integrations/cloud-hypervisor/patches/`: patch 0003 makes its vfio-user device drive the
//! server's VFIO migration v2 (DEVICE_FEATURE, MIG_DATA_READ/WRITE, DMA logging) through the
//! `vfio_user` crate patched in `patches/vfio_user-0.1.5/`. The device's data travels in the VM's
//! snapshot; its DMA dirty log joins cloud-hypervisor's.
//!
//! The guest (the GPU driver as a PVH ELF, `compute`, [`FRAMES`] frames) starts on the source;
//! after its `frame 16` line the VM migrates. The destination's serial file holds only what the
//! guest printed after the switch-over: its running sums and its final checksum must equal an
//! unmigrated run's (`gmig vm run`), and its server (slot 1) must have restored the vGPU and seen
//! no fault. Controls: a source whose DMA log reports no page (`--x-dma-log blind`) gives another
//! checksum; a destination that does not remap (`--x-no-remap`) faults; a server without
//! migration (`--x-no-migration`) or without DMA logging (`--x-dma-log off`) makes
//! cloud-hypervisor refuse the migration with the reason before any memory is sent, and the
//! source's guest renders on.
//!
//! Skips (loudly) where cloud-hypervisor is not built or `/dev/kvm` is absent.

use std::path::Path;
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::Duration;

use gmig_test_support::cloud_hypervisor::{binaries, ch_remote, wait_path, Ch};
use gmig_test_support::qemu::{checksum_line, one_at_a_time, Serve};

#[path = "common/ch.rs"]
mod ch;
use ch::{gmig, guest, reference_run, spec, sums};

/// Frames the guest renders: a running sum every 16; the VM migrates after the first.
const FRAMES: u32 = 96;
const PROFILE: &str = "compute";

/// The migration link's rate, source to destination: the memory's first pass (about 5 MiB of
/// touched guest RAM) takes over a second, in which the guest renders on and the vGPU writes
/// pages that only the vGPU's DMA log reports (cloud-hypervisor itself has no rate limit).
const LINK_BYTES_PER_S: u64 = 4 << 20;

/// Relays one connection from a new listener at `at` to the Unix socket `to`, the bytes toward
/// `to` paced at `rate` bytes a second, the replies as they come.
fn paced_relay(at: &Path, to: &Path, rate: u64) {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    let listener = UnixListener::bind(at).expect("bind the relay");
    let to = to.to_path_buf();
    std::thread::spawn(move || {
        let Ok((mut src, _)) = listener.accept() else {
            return;
        };
        let Ok(mut dst) = UnixStream::connect(&to) else {
            return;
        };
        let (mut src_back, mut dst_back) = (src.try_clone().unwrap(), dst.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut dst_back, &mut src_back);
            let _ = src_back.shutdown(std::net::Shutdown::Both);
        });
        let start = std::time::Instant::now();
        let (mut sent, mut buf) = (0u64, vec![0u8; 64 << 10]);
        loop {
            let n = match src.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if dst.write_all(&buf[..n]).is_err() {
                break;
            }
            sent += n as u64;
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let _ = dst.shutdown(std::net::Shutdown::Write);
    });
}

/// `gmig vm run`'s output for the guest: its running sums and its checksum.
fn unmigrated() -> &'static (Vec<String>, String) {
    static R: OnceLock<(Vec<String>, String)> = OnceLock::new();
    R.get_or_init(|| {
        let out = reference_run(&["--profile", PROFILE, "--frames", &FRAMES.to_string()]);
        let want = (
            sums(&out),
            checksum_line(&out).expect("gmig vm run: no checksum"),
        );
        assert_eq!(want.0.len(), (FRAMES / 16) as usize, "gmig vm run: {out}");
        want
    })
}

/// A migration under way or done: the source VM (its console read past the links), the
/// destination, both servers, and the receiver's `ch-remote`.
struct Migration {
    src: Ch,
    dst: Ch,
    src_gpu: Serve,
    dst_gpu: Serve,
    receiver: Option<JoinHandle<Result<String, String>>>,
    _dir: tempfile::TempDir,
}

impl Migration {
    /// Starts the source VM on a server with `src_flags`, waits for its `frame 16` line, and
    /// sends it to a destination whose server (slot 1) has `dst_flags`; returns once the
    /// source's log has the outcome.
    fn run(bin: &Path, src_flags: &[&str], dst_flags: &[&str]) -> Migration {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let kernel = guest(d);
        let src_gpu = Serve::start(gmig(), d, "a", &[&["--clients", "1"], src_flags].concat());
        let dst_gpu = Serve::start(
            gmig(),
            d,
            "b",
            &[&["--slot", "1", "--clients", "1"], dst_flags].concat(),
        );
        // The destination takes the source's configuration, paths included, and opens
        // (truncates) the serial file on receiving it: the vfio-user socket and the serial file
        // are symlinks, pointed at the destination's before the migration.
        let (gpu, console) = (d.join("gpu.sock"), d.join("console"));
        std::os::unix::fs::symlink(&src_gpu.socket, &gpu).unwrap();
        std::os::unix::fs::symlink(d.join("src.console"), &console).unwrap();
        let (src_api, dst_api) = (d.join("src.api"), d.join("dst.api"));
        let cmdline = format!("--profile {PROFILE} --frames {FRAMES}");
        let mut s = spec(&kernel, &cmdline, vec![gpu.clone()]);
        s.api_socket = Some(src_api.clone());
        s.console = Some(console.clone());
        let mut src = Ch::start(bin, &s, d, "src");
        src.console = d.join("src.console"); // read past the link, which moves
        let mut dst = Ch::start_destination(bin, &dst_api, d, "dst");
        dst.console = d.join("dst.console");
        assert!(wait_path(&src_api, Duration::from_secs(20)));
        assert!(wait_path(&dst_api, Duration::from_secs(20)));
        assert!(
            src.wait_for(Duration::from_secs(180), |c, _| c.contains("frame 16 sum")),
            "the source's guest did not render:\n{}\n{}",
            src.console_text(),
            src.log_text()
        );
        for (link, to) in [
            (&gpu, dst_gpu.socket.clone()),
            (&console, dst.console.clone()),
        ] {
            std::fs::remove_file(link).unwrap();
            std::os::unix::fs::symlink(to, link).unwrap();
        }
        let recv = d.join("recv.sock");
        let receiver = {
            let (bin, api, url) = (bin.to_path_buf(), dst_api.clone(), recv.clone());
            std::thread::spawn(move || {
                let url = format!("receiver_url=unix:{}", url.display());
                ch_remote(&bin, &api, &["receive-migration", &url])
            })
        };
        assert!(wait_path(&recv, Duration::from_secs(20)));
        let relay = d.join("mig.sock");
        paced_relay(&relay, &recv, LINK_BYTES_PER_S);
        // ch-remote returns at once; the outcome is in the source's log.
        let url = format!("destination_url=unix:{}", relay.display());
        ch_remote(bin, &src_api, &["send-migration", &url]).unwrap();
        assert!(
            src.wait_for(Duration::from_secs(120), |_, l| l
                .contains("Migration completed")
                || l.contains("Migration failed")),
            "no outcome in the source's log:\n{}",
            src.log_text()
        );
        Migration {
            src,
            dst,
            src_gpu,
            dst_gpu,
            receiver: Some(receiver),
            _dir: dir,
        }
    }

    /// The receiver's result.
    fn received(&mut self) -> Result<String, String> {
        self.receiver.take().unwrap().join().unwrap()
    }

    /// Everything a failure message needs.
    fn logs(&self) -> String {
        format!(
            "source log:\n{}\ndestination log:\n{}\nsource console:\n{}\ndestination console:\n{}\n\
             source server:\n{}\ndestination server:\n{}",
            self.src.log_text(),
            self.dst.log_text(),
            self.src.console_text(),
            self.dst.console_text(),
            self.src_gpu.log_text(),
            self.dst_gpu.log_text()
        )
    }

    /// Waits for the destination's guest to finish (it powers the VM off) and returns what it
    /// printed after the switch-over.
    fn destination_console(&mut self) -> String {
        let status = self.dst.wait_exit(Duration::from_secs(300));
        assert!(
            status.is_some_and(|s| s.success()),
            "the destination did not finish: {status:?}\n{}",
            self.logs()
        );
        self.dst.console_text()
    }

    /// The N of the first `…PREFIX N bytes of device state` line of a log, if any.
    fn device_bytes(log: &str, prefix: &str) -> Option<u64> {
        let line = log
            .lines()
            .find(|l| l.contains(prefix) && l.contains(" bytes of device state"))?;
        let before = &line[..line.find(" bytes of device state")?];
        before.rsplit(' ').next()?.parse().ok()
    }
}

#[test]
fn cloud_hypervisor_live_migrates_the_vm_with_its_vgpu_and_the_destination_renders_on() {
    let Some(bin) = binaries() else {
        return;
    };
    let _one = one_at_a_time();
    let (want_sums, want) = unmigrated();
    let mut m = Migration::run(&bin, &[], &[]);
    let log = m.src.log_text();
    assert!(log.contains("Migration completed"), "{}", m.logs());
    m.received().unwrap_or_else(|e| panic!("{e}\n{}", m.logs()));
    // The vGPU's state went with the VM: read on the source, restored on the destination.
    let sent = Migration::device_bytes(&log, "_vfio_user0: ").filter(|&n| n > 0);
    let restored = Migration::device_bytes(&m.dst.log_text(), "restored ");
    assert!(sent.is_some(), "no device state sent:\n{}", m.logs());
    assert_eq!(sent, restored, "{}", m.logs());
    eprintln!(
        "cloud-hypervisor: {}; device state {} bytes",
        log.lines()
            .find(|l| l.contains("Migration completed"))
            .unwrap_or_default(),
        sent.unwrap()
    );

    // What the guest rendered after the switch-over, on the destination's vGPU: the sums and
    // the checksum of the unmigrated run.
    let console = m.destination_console();
    let after = sums(&console);
    assert!(
        !after.is_empty(),
        "no frame after the switch-over:\n{}",
        m.logs()
    );
    for line in &after {
        assert!(
            want_sums.contains(line),
            "{line} is not unmigrated:\n{}",
            m.logs()
        );
    }
    assert_eq!(checksum_line(&console).as_ref(), Some(want), "{}", m.logs());
    let server = m.dst_gpu.log_text();
    assert!(server.contains("connected"), "{server}");
    assert!(!server.contains("fault"), "{}", m.logs());
    assert!(!m.src_gpu.log_text().contains("fault"), "{}", m.logs());
    drop(m);

    // Negative control: the source's DMA log reports no page; the destination's guest reads
    // stale copies of what the vGPU wrote during the memory's pre-copy.
    let mut m = Migration::run(&bin, &["--x-dma-log", "blind"], &[]);
    assert!(
        m.src.log_text().contains("Migration completed"),
        "{}",
        m.logs()
    );
    m.received().unwrap_or_else(|e| panic!("{e}\n{}", m.logs()));
    let status = m.dst.wait_exit(Duration::from_secs(300));
    let got = checksum_line(&m.dst.console_text());
    eprintln!("blind DMA log: {got:?} ({status:?}; unmigrated {want})");
    assert_ne!(
        got.as_ref(),
        Some(want),
        "without the vGPU's dirty pages the destination still rendered the reference:\n{}",
        m.logs()
    );
}

#[test]
fn without_remapping_the_destinations_vgpu_faults() {
    let Some(bin) = binaries() else {
        return;
    };
    let _one = one_at_a_time();
    let mut m = Migration::run(&bin, &[], &["--x-no-remap"]);
    assert!(
        m.src.log_text().contains("Migration completed"),
        "{}",
        m.logs()
    );
    m.received().unwrap_or_else(|e| panic!("{e}\n{}", m.logs()));
    assert!(
        m.dst.wait_for(Duration::from_secs(120), |_, _| m
            .dst_gpu
            .log_text()
            .contains("fault")),
        "the destination's vGPU kept the source's addresses and did not fault:\n{}",
        m.logs()
    );
    assert_ne!(
        checksum_line(&m.dst.console_text()).as_ref(),
        Some(&unmigrated().1),
        "{}",
        m.logs()
    );
}

/// A refused migration: the reason in the source's log, a failed receive, a destination server
/// that never had a client, and a source guest that renders on what it rendered before.
fn assert_refused(bin: &Path, src_flags: &[&str], reason: &str) {
    let (want_sums, _) = unmigrated();
    let mut m = Migration::run(bin, src_flags, &[]);
    let log = m.src.log_text();
    let said = format!(
        "Migration failed: Failed to start migration for migratable component: vfio-user device \
         _vfio_user0: {reason}"
    );
    assert!(
        log.contains(&said),
        "not refused with `{said}`:\n{}",
        m.logs()
    );
    let received = m.received();
    assert!(received.is_err(), "the destination received: {received:?}");
    let rendered = sums(&m.src.console_text()).len();
    assert!(
        m.src
            .wait_for(Duration::from_secs(180), |c, _| sums(c).len() > rendered),
        "the source's guest stopped after the refused migration:\n{}",
        m.logs()
    );
    let console = m.src.console_text();
    let now = sums(&console);
    assert_eq!(now[..], want_sums[..now.len()], "{}", m.logs());
    assert!(!console.contains("guest error"), "{}", m.logs());
    assert!(!m.dst_gpu.log_text().contains("connected"), "{}", m.logs());
}

#[test]
fn a_server_without_migration_or_dma_logging_is_refused_with_the_reason() {
    let Some(bin) = binaries() else {
        return;
    };
    let _one = one_at_a_time();
    assert_refused(
        &bin,
        &["--x-no-migration"],
        "the server does not support migration (DEVICE_FEATURE MIGRATION: Server refused \
         DeviceFeature: Operation not supported (os error 95))",
    );
    assert_refused(
        &bin,
        &["--x-dma-log", "off"],
        "the server has no DMA dirty-page logging (DEVICE_FEATURE DMA_LOGGING_START: Server \
         refused DeviceFeature: Operation not supported (os error 95))",
    );
}
