//! Whole-VM live migration of a real KVM guest driving the vGPU. Every migration here pauses the
//! source at a chosen point of the guest's run with work left, and asserts what the destination
//! did after the switch-over (frames completed, GPU workloads run), then that it finished exactly
//! as an unmigrated run: for every profile, early (GGTT setup), mid-frame and with a workload
//! queued in the vGPU. Negative controls beside their positive twins: without remapping the
//! destination's vGPU faults on the guest's old graphics addresses and the guest stalls; without
//! the vGPU's DMA log (KVM's dirty log alone) the destination differs. A cut connection or a
//! refused stream leaves the source running with nothing lost.

mod common;

use common::*;
use gmig_vmm::{GuestConfig, GuestProfile, Machine, Stop};

fn cfg(profile: GuestProfile) -> GuestConfig {
    GuestConfig {
        profile,
        frames: FRAMES,
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
        let third = u64::from(c.frames) / 3;
        for (name, point) in [
            ("early (GGTT setup)", Point::Setup(20)),
            ("mid-frame", Point::Frame(third, 3)),
            ("queued workload", Point::QueuedAfter(third)),
        ] {
            let what = format!("{} {name}", profile.name());
            let (_src, dest, rep) = migrate_at(&c, point, &opts(), linked(1, true));
            let rep = rep.unwrap_or_else(|e| panic!("{what}: migration failed: {e}"));
            let (mut m, inc) = dest.unwrap_or_else(|e| panic!("{what}: destination failed: {e}"));
            // Each point is what its name says, at the moment the source paused.
            let restored = inc.at_restore.gpu.expect("in-process vGPU counters");
            match point {
                Point::Setup(_) => assert!(
                    rep.at_stop.phase == PHASE_SETUP && rep.at_stop.frames == 0,
                    "{what}: not in the guest's setup at the stop: {:?}",
                    rep.at_stop
                ),
                Point::Frame(f, _) => assert!(
                    rep.at_stop.phase == PHASE_FRAMES && rep.at_stop.frames == f,
                    "{what}: not inside frame {f} at the stop: {:?}",
                    rep.at_stop
                ),
                Point::QueuedAfter(_) => assert!(
                    restored.queued > 0,
                    "{what}: the restored vGPU holds no queued workload"
                ),
            }
            assert_eq!(m.run(ALL).expect("run on"), Stop::Halted, "{what}");
            let work = assert_destination_worked(&what, &rep, &inc, &m, None);
            if let Point::QueuedAfter(_) = point {
                assert!(
                    work.workloads >= Some(restored.queued),
                    "{what}: the destination did not run the queued workloads it restored"
                );
            }
            eprintln!("{what}: {rep:?}");
            assert_same_run(&base, &m, &what);
        }
    }
}

/// Runs the destination on; returns whether it finished exactly as the baseline did.
fn finishes_as(base: &Machine, m: &mut Machine) -> bool {
    // A guest whose GPU results were lost may wait for ever: a hang is a difference too.
    match m.run(base.exits * 3) {
        Ok(Stop::Halted) => {}
        _ => return false,
    }
    base.serial_results() == m.serial_results() && differing_pages(&ram(base), &ram(m)).is_empty()
}

/// The positive twin of a control: the correct migration from `point`, whose destination works,
/// faults nothing and ends as the baseline did. Returns the source's report.
fn positive_twin(
    what: &str,
    c: &GuestConfig,
    base: &Machine,
    point: Point,
) -> gmig_vmm::migrate::Report {
    let (_s, dest, rep) = migrate_at(c, point, &opts(), linked(1, true));
    let rep = rep.expect("migration");
    let (mut m, inc) = dest.expect("destination");
    assert!(
        finishes_as(base, &mut m),
        "{what}: the correct migration differs"
    );
    assert_destination_worked(what, &rep, &inc, &m, None);
    assert!(faults(&m).is_empty(), "{what}: faults: {:?}", faults(&m));
    rep
}

#[test]
fn without_remapping_the_destination_faults_and_the_guest_stalls() {
    if !kvm_present() {
        return;
    }
    let c = cfg(GuestProfile::Desktop);
    let base = baseline(&c);
    let point = Point::Frame(u64::from(c.frames) / 3, 3);
    positive_twin("with remapping", &c, &base, point);

    // Control: the destination's vGPU (another slot) keeps the source's graphics addresses.
    let (_s, dest, rep) = migrate_at(&c, point, &opts(), linked(1, false));
    rep.expect("the migration itself completes");
    let (mut m, inc) = dest.expect("destination");
    let finished = finishes_as(&base, &mut m);
    let f = faults(&m);
    eprintln!(
        "remapping off: finished as the baseline: {finished}; frames after the switch-over: {}; \
         faults: {f:?}",
        m.frames_done() - inc.at_restore.frames
    );
    assert!(
        f.iter().any(|r| r.contains("outside this vGPU's slices")),
        "remapping off: no out-of-slice fault on the destination: {f:?}"
    );
    assert!(
        !finished,
        "remapping off: the guest finished as the baseline did"
    );
    assert!(
        !m.halted(),
        "remapping off: the guest did not stall (it halted)"
    );
}

#[test]
fn with_kvm_dirty_log_only_the_migrated_guest_differs() {
    if !kvm_present() {
        return;
    }
    let c = cfg(GuestProfile::Desktop);
    let base = baseline(&c);
    let point = Point::Frame(u64::from(c.frames) / 3, 3);
    // Positive twin: the same migration, correct, to show the control below is about what it
    // switches off.
    let rep = positive_twin("with DMA logging", &c, &base, point);
    assert!(
        rep.rounds > 1,
        "pre-copy had no round after the first pass: nothing for the vGPU to dirty"
    );

    // Control: KVM's dirty log only: the pages the vGPU wrote during pre-copy are never resent.
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
        let mut src = Machine::boot(RAM, &c, linked(0, true)).expect("boot");
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
        // The stop (or the failure before it) comes in frame 16 of 40: work is left after it.
        let mut point = Point::Frame(16, 3).reached();
        let r = gmig_vmm::migrate::migrate_out_at(&mut src, &c, &mut conn, &opts(), &mut point);
        drop(conn);
        let dest = t.join().expect("destination thread");
        assert!(r.is_err(), "{what}: the source committed");
        assert!(dest.is_err(), "{what}: the destination accepted");
        eprintln!("{what}: source: {}", r.unwrap_err());
        // The source carries on to the same end as an unmigrated run, doing the rest of the
        // guest's work itself.
        assert!(
            !src.halted(),
            "{what}: the guest had finished before the failure"
        );
        let failed_at = gmig_vmm::Progress::of(&src);
        assert_eq!(src.run(ALL).expect("run on"), Stop::Halted, "{what}");
        let after = gmig_vmm::Progress::of(&src).work_since(&failed_at);
        assert!(
            after.frames > 0 && after.workloads > Some(0),
            "{what}: the source did no work after the failed migration: {after:?}"
        );
        assert_same_run(&base, &src, what);
    }
}

#[test]
fn a_switch_over_point_after_the_guests_end_fails_loudly_and_keeps_the_source() {
    if !kvm_present() {
        return;
    }
    let c = GuestConfig {
        frames: 4,
        ..GuestConfig::default()
    };
    let base = baseline(&c);
    // The point can never hold: the guest halts first. The migration must not pass as one whose
    // destination did the (absent) work.
    let (src, dest, rep) = migrate_at(&c, Point::Frame(5, 0), &opts(), linked(1, true));
    let e = rep.expect_err("a switch-over after the guest's end was accepted");
    assert!(
        e.to_string()
            .contains("before the chosen switch-over point"),
        "{e}"
    );
    assert!(dest.is_err(), "the destination accepted a VM");
    assert!(src.halted());
    assert_same_run(&base, &src, "the kept source");
}

/// A destination whose vGPU cannot run (its process died, say) after the source's COMMIT.
struct FailsToRun(Box<dyn gmig_vmm::GpuLink>);

impl gmig_vmm::GpuLink for FailsToRun {
    fn attach_ram(
        &mut self,
        mem: &vm_memory::GuestMemoryMmap,
        file: &std::fs::File,
    ) -> gmig_vmm::Result<()> {
        self.0.attach_ram(mem, file)
    }
    fn region_size(&mut self, index: u32) -> gmig_vmm::Result<Option<u64>> {
        self.0.region_size(index)
    }
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> gmig_vmm::Result<()> {
        self.0.region_read(index, offset, data)
    }
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> gmig_vmm::Result<()> {
        self.0.region_write(index, offset, data)
    }
    fn set_msi(&mut self, fd: &vmm_sys_util::eventfd::EventFd) -> gmig_vmm::Result<()> {
        self.0.set_msi(fd)
    }
    fn set_state(&mut self, state: gmig_vfio_migration::DeviceState) -> gmig_vmm::Result<()> {
        if state == gmig_vfio_migration::DeviceState::Running {
            return Err(gmig_vmm::Error::Device("the vGPU process is gone".into()));
        }
        self.0.set_state(state)
    }
    fn save_read(&mut self, max: usize) -> gmig_vmm::Result<Option<Vec<u8>>> {
        self.0.save_read(max)
    }
    fn resume_write(&mut self, data: &[u8]) -> gmig_vmm::Result<()> {
        self.0.resume_write(data)
    }
    fn dma_log_start(&mut self, ranges: &[gmig_vfio_migration::IovaRange]) -> gmig_vmm::Result<()> {
        self.0.dma_log_start(ranges)
    }
    fn dma_log_report(&mut self, iova: u64, length: u64) -> gmig_vmm::Result<Vec<u64>> {
        self.0.dma_log_report(iova, length)
    }
    fn dma_log_stop(&mut self) -> gmig_vmm::Result<()> {
        self.0.dma_log_stop()
    }
}

/// After COMMIT the destination must run the VM; when its vGPU cannot (its process died), it
/// says so (NAK instead of RESUMED) and drops its copy, and the source — told for certain that
/// the destination does not run the VM — takes it back and finishes it: one owner, nothing lost,
/// no doubt to resolve by hand.
#[test]
fn a_destination_whose_vgpu_cannot_run_after_commit_hands_the_vm_back() {
    if !kvm_present() {
        return;
    }
    let c = cfg(GuestProfile::Desktop);
    let base = baseline(&c);
    let (mut src, dest, rep) = migrate_at(
        &c,
        Point::Frame(16, 3),
        &opts(),
        Box::new(FailsToRun(linked(1, true))),
    );
    let e = rep.expect_err("the source committed to a destination that did not run the VM");
    assert!(!e.in_doubt(), "the source is in doubt: {e}");
    assert!(e.to_string().contains("the vGPU process is gone"), "{e}");
    let Err(d) = dest else {
        panic!("the destination says it runs the VM");
    };
    assert!(!d.in_doubt(), "the destination is in doubt: {d}");
    assert!(
        !src.halted(),
        "the guest had finished before the switch-over"
    );
    assert_eq!(src.run(ALL).expect("run on"), Stop::Halted);
    assert_same_run(&base, &src, "the source that took the VM back");
}

/// Pre-copy rounds are written by a copier thread while the guest runs on, and the migrated run
/// still equals the unmigrated one (pages the guest writes while they are copied are sent again).
/// The control, `overlap: false`, writes every round before the guest runs again: no guest exit
/// happens while a round is in flight.
#[test]
fn precopy_rounds_are_written_while_the_guest_runs() {
    if !kvm_present() {
        return;
    }
    let c = cfg(GuestProfile::Desktop);
    let base = baseline(&c);
    let third = u64::from(c.frames) / 3;
    for overlap in [true, false] {
        let what = format!("overlap {overlap}");
        let o = gmig_vmm::migrate::Options { overlap, ..opts() };
        let (_src, dest, rep) = migrate_at(&c, Point::Frame(third, 3), &o, linked(1, true));
        let rep = rep.unwrap_or_else(|e| panic!("{what}: migration failed: {e}"));
        let (mut m, inc) = dest.unwrap_or_else(|e| panic!("{what}: destination failed: {e}"));
        assert_eq!(m.run(ALL).expect("run on"), Stop::Halted, "{what}");
        assert_destination_worked(&what, &rep, &inc, &m, None);
        assert_same_run(&m, &base, &what);
        assert!(rep.rounds > 1, "{what}: one round only: {rep:?}");
        if overlap {
            assert!(
                rep.exits_while_copying > 0,
                "{what}: the guest never ran while a round was written: {rep:?}"
            );
        } else {
            assert_eq!(rep.exits_while_copying, 0, "{what}: {rep:?}");
        }
    }
}

/// RAM beyond the low 3 GiB sits above the device window (`gmig_vmm::kvm::HIGH_RAM_BASE`) and
/// migrates with the rest: pages the VMM wrote there before the migration (never written ones
/// are neither read nor sent) reach the destination, whose guest finishes as an unmigrated run
/// of the same size.
#[test]
fn ram_above_the_device_window_migrates() {
    use gmig_vmm::kvm::{HIGH_RAM_BASE, LOW_RAM_MAX};
    use vm_memory::{Bytes, GuestAddress};
    if !kvm_present() {
        return;
    }
    let ram = LOW_RAM_MAX + (64 << 20);
    let c = cfg(GuestProfile::Compute);
    let mut base = Machine::boot(ram, &c, linked(0, true)).expect("boot");
    assert_eq!(base.run(ALL).expect("run"), Stop::Halted);
    let src = Machine::boot(ram, &c, linked(0, true)).expect("boot");
    assert_eq!(src.vm().ram_end(), HIGH_RAM_BASE + (64 << 20));
    let marks: Vec<(u64, [u8; 8])> = (0..4u64)
        .map(|i| {
            (
                HIGH_RAM_BASE + i * (16 << 20) + 4096 * i,
                (0xabad_cafe_0000 + i).to_le_bytes(),
            )
        })
        .collect();
    for (at, v) in &marks {
        src.vm()
            .memory()
            .write_slice(v, GuestAddress(*at))
            .expect("write high RAM");
    }
    let third = u64::from(c.frames) / 3;
    let (_src, dest, rep) =
        migrate_machine_at(src, &c, Point::Frame(third, 3), &opts(), move |s| {
            gmig_vmm::migrate::migrate_in(s, linked(1, true))
        });
    let rep = rep.expect("migration");
    let (mut m, inc) = dest.expect("destination");
    for (at, v) in &marks {
        let mut got = [0u8; 8];
        m.vm()
            .memory()
            .read_slice(&mut got, GuestAddress(*at))
            .expect("read high RAM");
        assert_eq!(&got, v, "high RAM at {at:#x}");
    }
    // Only data was sent in the first pass: a few MiB of the 3 GiB, not all of it.
    assert!(
        rep.precopy_pages < 64 << 10,
        "the first pass read never-written RAM: {} pages",
        rep.precopy_pages
    );
    assert_eq!(m.run(ALL).expect("run on"), Stop::Halted);
    assert_destination_worked("high RAM", &rep, &inc, &m, None);
    assert_eq!(m.serial_results(), base.serial_results());
}
