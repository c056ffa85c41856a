//! Whole-VM live migration of a real KVM guest driving the vGPU: the migrated run equals an
//! unmigrated one, for every profile and at every kind of migration point; without gmig's
//! software dirty pages (KVM's dirty log alone) it does not; a cut connection or a refused stream
//! leaves the source running with nothing lost.

mod common;

use common::*;
use gmig_vmm::{GuestConfig, GuestProfile, Stop};

fn cfg(profile: GuestProfile) -> GuestConfig {
    GuestConfig {
        profile,
        frames: 24,
        ..GuestConfig::default()
    }
}

#[test]
fn migrated_guest_finishes_exactly_as_an_unmigrated_one() {
    if !kvm_present() {
        return;
    }
    for profile in GuestProfile::ALL {
        let c = cfg(profile);
        let base = baseline(&c);
        for (name, point) in [
            ("early (GGTT setup)", Point::Exit(40)),
            ("mid-frame", Point::Frame(u64::from(c.frames) / 2, 3)),
            ("queued batch", Point::QueuedAfter(u64::from(c.frames) / 3)),
        ] {
            let what = format!("{} {name}", profile.name());
            let (_src, dest, rep) = migrate_at(&c, point, &opts(), linked(1, true));
            let rep = rep.unwrap_or_else(|e| panic!("{what}: migration failed: {e}"));
            let (mut m, _) = dest.unwrap_or_else(|e| panic!("{what}: destination failed: {e}"));
            assert_eq!(m.run(ALL).expect("run on"), Stop::Halted, "{what}");
            eprintln!("{what}: {rep:?}");
            assert_same_run(&base, &m, &what);
        }
    }
}

/// Runs the destination on; returns whether it finished exactly as the baseline did.
fn finishes_as(base: &gmig_vmm::Machine, m: &mut gmig_vmm::Machine) -> bool {
    // A guest whose GPU results were lost may wait for ever: a hang is a difference too.
    match m.run(base.exits * 3) {
        Ok(Stop::Halted) => {}
        _ => return false,
    }
    base.serial_results() == m.serial_results() && differing_pages(&ram(base), &ram(m)).is_empty()
}

#[test]
fn with_kvm_dirty_log_only_the_migrated_guest_differs() {
    if !kvm_present() {
        return;
    }
    let c = cfg(GuestProfile::Desktop);
    let base = baseline(&c);
    let point = Point::Frame(u64::from(c.frames) / 3, 3);
    // Control: the same migration, correct, to show the controls below are about what they
    // switch off.
    let (_s, dest, rep) = migrate_at(&c, point, &opts(), linked(1, true));
    let rep = rep.expect("migration");
    let (mut m, _) = dest.expect("destination");
    assert!(finishes_as(&base, &mut m), "the correct migration differs");
    eprintln!("with DMA logging: {rep:?}");

    // 1. KVM's dirty log only: the pages the vGPU wrote during pre-copy are never resent.
    let no_gpu = gmig_vmm::migrate::Options {
        gpu_dirty: false,
        ..opts()
    };
    let (_s, dest, rep) = migrate_at(&c, point, &no_gpu, linked(1, true));
    rep.expect("migration without DMA logging still completes");
    let (mut m, _) = dest.expect("destination");
    assert!(
        !finishes_as(&base, &mut m),
        "KVM's dirty log alone gave the same result: the vGPU's writes were not exercised"
    );
}

/// A connection that fails after `cut_at` bytes or at the DONE record's header, or flips the
/// byte at `flip_at`.
struct Faulty {
    inner: std::net::TcpStream,
    sent: usize,
    cut_at: Option<usize>,
    cut_before_done: bool,
    flip_at: Option<usize>,
}

impl std::io::Write for Faulty {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let done_header = buf.len() == 9 && buf[0] == gmig_vmm::migrate::Tag::Done as u8;
        if self.cut_at.is_some_and(|c| self.sent + buf.len() > c)
            || (self.cut_before_done && done_header)
        {
            {
                let _ = self.inner.shutdown(std::net::Shutdown::Both);
                return Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "cut"));
            }
        }
        let mut b = buf.to_vec();
        if let Some(f) = self.flip_at {
            if (self.sent..self.sent + b.len()).contains(&f) {
                b[f - self.sent] ^= 0x5a;
            }
        }
        self.inner.write_all(&b)?;
        self.sent += b.len();
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl std::io::Read for Faulty {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf)
    }
}

#[test]
fn a_cut_connection_or_a_refused_stream_leaves_the_source_running_with_nothing_lost() {
    if !kvm_present() {
        return;
    }
    let c = cfg(GuestProfile::Desktop);
    let base = baseline(&c);
    for (what, cut_at, cut_before_done, flip_at) in [
        ("cut during pre-copy", Some(200_000), false, None),
        ("cut before DONE, in downtime", None, true, None),
        ("a corrupted page record", None, false, Some(5_000)),
    ] {
        let mut src = gmig_vmm::Machine::boot(RAM, &c, linked(0, true)).expect("boot");
        src.run_until(ALL, |m| m.frames_done() >= 8).expect("run");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let addr = listener.local_addr().expect("address");
        let t = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            gmig_vmm::migrate::migrate_in(&mut s, linked(1, true)).map(|_| ())
        });
        let inner = std::net::TcpStream::connect(addr).expect("connect");
        let mut conn = Faulty {
            inner,
            sent: 0,
            cut_at,
            cut_before_done,
            flip_at,
        };
        let r = gmig_vmm::migrate::migrate_out(&mut src, &c, &mut conn, &opts());
        drop(conn);
        let dest = t.join().expect("destination thread");
        assert!(r.is_err(), "{what}: the source committed");
        assert!(dest.is_err(), "{what}: the destination accepted");
        eprintln!("{what}: source: {}", r.unwrap_err());
        // The source carries on to the same end as an unmigrated run.
        assert_eq!(src.run(ALL).expect("run on"), Stop::Halted, "{what}");
        assert_same_run(&base, &src, what);
    }
}
