//! The migration engine on the reference vGPU: every policy × profile over TCP ends identical to
//! the unmigrated run; a failed migration leaves the source running with nothing lost.

use std::thread;
use std::time::Duration;

use gmig_core::migration::{
    migrate_destination, migrate_source, receive_migration, record_stream, source_handle, Incoming,
    MigratableVm, MigrationConfig, MigrationError, MigrationPhase, MigrationReport, Policy,
};
use gmig_core::stream::Control;
use gmig_core::transport::{Connection, Counted};
use gmig_test_support::tcp_pair;
use gmig_vfio_migration::{DeviceState, MigrationTarget};
use gmig_vgpu::checkpoint::RestoreOptions;
use gmig_vgpu::compare::compare_guest_visible;
use gmig_vgpu::gm::{VgpuSlices, VgpuType};
use gmig_vgpu::migratable::{VgpuFactory, VgpuVm};
use gmig_vgpu::workload::{Profile, WorkloadConfig};

const RAM: u64 = 48 << 20;
const TY: VgpuType = VgpuType::V5_8;
const BEFORE: u64 = 3;
const AFTER: u64 = 3;

/// Source slices, and destination slices elsewhere in the GGTT (so every move remaps).
fn slices() -> (VgpuSlices, VgpuSlices) {
    gmig_test_support::moved_slices(TY)
}

fn boot(profile: Profile, seed: u64, s: VgpuSlices) -> VgpuVm {
    VgpuVm::boot(TY, s, RAM, profile, WorkloadConfig::small(), seed).unwrap()
}

fn cfg(policy: Policy) -> MigrationConfig {
    let mut c = MigrationConfig::new(policy);
    c.hash_threads = 2;
    c.step_every_batches = 16;
    c.max_drain = gmig_core::migration::Drain::workloads(1);
    c.timeout = Duration::from_secs(20);
    c
}

fn factory(d: VgpuSlices, remap: bool) -> VgpuFactory {
    VgpuFactory::new(gmig_cmdparser::Gen::Gen9, TY, d, RAM).with_options(RestoreOptions { remap })
}

/// Migrate mid-run over TCP, continue on the destination; compare with an unmigrated run of the
/// same number of frames. Returns the report and whether the states are identical.
fn differential(
    profile: Profile,
    seed: u64,
    policy: Policy,
    remap: bool,
) -> (MigrationReport, bool) {
    differential_with(profile, seed, &cfg(policy), remap)
}

/// [`differential`] with the engine configured by `c`.
fn differential_with(
    profile: Profile,
    seed: u64,
    c: &MigrationConfig,
    remap: bool,
) -> (MigrationReport, bool) {
    let (s, d) = slices();
    let mut vm = boot(profile, seed, s);
    vm.run_steps(BEFORE).unwrap();
    let c2 = c.clone();
    let (a, b) = tcp_pair();
    let f = factory(d, remap);
    let dest = thread::spawn(move || migrate_destination(f, b, &c2));
    let mut handle = source_handle(vm, c).unwrap();
    let report = migrate_source(&mut handle, a, c, &mut |_| {}).unwrap();
    let mut src = handle.into_device().into_vm();
    let (mut moved, _) = dest.join().unwrap().unwrap();
    moved.attach_driver(src.take_driver().unwrap());
    moved.run_steps(AFTER).unwrap();
    moved.finish().unwrap();

    let mut reference = boot(profile, seed, s);
    reference.run_steps(moved.frames()).unwrap();
    reference.finish().unwrap();
    assert_eq!(reference.frames(), moved.frames());
    let diff = compare_guest_visible(reference.vgpu(), moved.vgpu());
    (report, diff.is_identical())
}

#[test]
fn every_policy_and_profile_over_tcp_equals_the_unmigrated_run() {
    for profile in Profile::ALL {
        for policy in Policy::ALL {
            let (r, identical) = differential(profile, 11, policy, true);
            assert!(identical, "{profile:?} {policy:?}: {r:?}");
            assert_eq!(r.pages_total, r.pages_precopy + r.pages_stop_copy);
            if policy != Policy::StopAndCopy {
                assert!(r.steps_during_precopy > 0, "{profile:?} {policy:?}: {r:?}");
            }
        }
    }
}

#[test]
fn without_remapping_the_migrated_vgpu_differs() {
    let (_, identical) = differential(Profile::Desktop, 3, Policy::OneShotNarrow, false);
    assert!(!identical, "the negative control must differ");
}

#[test]
fn narrow_cuts_desktop_stop_copy_pages_by_at_least_80_percent() {
    let (sac, ok1) = differential(Profile::Desktop, 5, Policy::StopAndCopy, true);
    let (narrow, ok2) = differential(Profile::Desktop, 5, Policy::OneShotNarrow, true);
    let (oneshot, ok3) = differential(Profile::Desktop, 5, Policy::OneShot, true);
    assert!(ok1 && ok2 && ok3);
    assert!(
        narrow.pages_stop_copy * 5 <= sac.pages_stop_copy,
        "narrow {} vs stop-and-copy {}",
        narrow.pages_stop_copy,
        sac.pages_stop_copy
    );
    assert!(!narrow.widened);
    assert!(
        narrow.pages_rehashed * 10 < oneshot.pages_rehashed,
        "{narrow:?} {oneshot:?}"
    );
    // Draws, dispatches and decodes narrow too: their write sets come from the indirect state
    // (render target, depth, the kernels' buffers, decode destinations), not from "anything".
    for profile in [Profile::ThreeD, Profile::Compute, Profile::Video] {
        let (n, ok) = differential(profile, 5, Policy::OneShotNarrow, true);
        let (o, ok2) = differential(profile, 5, Policy::OneShot, true);
        assert!(ok && ok2, "{profile:?}");
        assert!(!n.widened, "{profile:?}: {n:?}");
        assert!(
            n.pages_rehashed * 10 < o.pages_rehashed,
            "{profile:?}: narrow {n:?} one-shot {o:?}"
        );
    }
}

#[test]
fn a_failed_migration_leaves_the_vgpu_running_with_nothing_lost() {
    let (s, d) = slices();
    for (cut, bad_slices) in [(Some(300_000u64), false), (None, true)] {
        let mut vm = boot(Profile::Desktop, 9, s);
        vm.run_steps(BEFORE).unwrap();
        let c = cfg(Policy::OneShot);
        let c2 = c.clone();
        let (a, b) = tcp_pair();
        // A destination whose slices are not a valid move for this vGPU refuses at restore.
        let mut f = factory(d, true);
        if bad_slices {
            f.slices.aperture.size /= 2;
        }
        let dest = thread::spawn(move || migrate_destination(f, b, &c2).map(|_| ()));
        let mut handle = source_handle(vm, &c).unwrap();
        let a: Box<dyn Connection> = match cut {
            Some(n) => Box::new(Counted::new(a).cut_after(n)),
            None => a,
        };
        let err = migrate_source(&mut handle, a, &c, &mut |_| {}).unwrap_err();
        assert!(dest.join().unwrap().is_err());
        match (&err, cut) {
            // The GGTT goes first in pre-copy, and the destination loads it as it arrives: a
            // table that does not fit its slices is refused then, before the stop.
            (MigrationError::Rejected { phase, reason }, None) => {
                assert_eq!(*phase, MigrationPhase::PreCopy);
                assert!(reason.contains("Ggtt"), "{reason}");
            }
            (e, Some(_)) => assert_eq!(MigrationPhase::from(e), MigrationPhase::PreCopy),
            (e, None) => panic!("unexpected {e}"),
        }
        assert_eq!(
            MigrationTarget::state(&mut handle).unwrap(),
            DeviceState::Running
        );
        let mut src = handle.into_device().into_vm();
        assert!(src.vgpu().is_accepting());
        src.run_steps(AFTER).unwrap();
        src.finish().unwrap();
        let mut reference = boot(Profile::Desktop, 9, s);
        reference.run_steps(src.frames()).unwrap();
        reference.finish().unwrap();
        let diff = compare_guest_visible(reference.vgpu(), src.vgpu());
        assert!(diff.is_identical(), "after {err}: {diff:?}");
        let _ = src.stream_header();
    }
}

/// MIG_DATA_SIZE asked at `ask` (after pre-copy when `precopy`, else while running or once
/// stopped), then the stop-copy bytes actually produced.
fn estimate_and_actual(
    profile: Profile,
    policy: Policy,
    precopy: bool,
    ask: DeviceState,
) -> (u64, u64) {
    use gmig_vfio_migration::ReadOutcome;
    let (s, _) = slices();
    let mut vm = boot(profile, 2, s);
    vm.run_steps(BEFORE).unwrap();
    let mut h = source_handle(vm, &cfg(policy)).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    if precopy {
        MigrationTarget::set_state(&mut h, DeviceState::PreCopy).unwrap();
        while let ReadOutcome::Data(_) = MigrationTarget::read_data(&mut h, &mut buf).unwrap() {}
    }
    h.device_mut().vm_mut().run_steps(2).unwrap();
    MigrationTarget::set_state(&mut h, ask).unwrap();
    let estimate = MigrationTarget::stop_copy_size(&mut h).unwrap();
    MigrationTarget::set_state(&mut h, DeviceState::StopCopy).unwrap();
    let mut actual = 0u64;
    while let ReadOutcome::Data(n) = MigrationTarget::read_data(&mut h, &mut buf).unwrap() {
        actual += n as u64;
    }
    (estimate, actual)
}

#[test]
fn mig_data_size_is_within_2x_above_the_vgpu_stop_copy_bytes() {
    let cases = [
        (Policy::OneShotNarrow, true, DeviceState::PreCopy),
        (Policy::OneShot, true, DeviceState::PreCopy),
        (Policy::StopAndCopy, false, DeviceState::Running),
        (Policy::StopAndCopy, false, DeviceState::Stop),
    ];
    for profile in Profile::ALL {
        for (policy, precopy, ask) in cases {
            let (estimate, actual) = estimate_and_actual(profile, policy, precopy, ask);
            let ratio = estimate as f64 / actual as f64;
            eprintln!(
                "{profile:?} {policy:?} asked in {ask:?}: MIG_DATA_SIZE {estimate} for {actual} \
                 stop-copy bytes ({ratio:.3}x)"
            );
            assert!(
                estimate >= actual && estimate <= 2 * actual,
                "{profile:?} {policy:?} {ask:?}: estimate {estimate} vs actual {actual}"
            );
        }
    }
}

/// A destination restoring onto memory it was handed (a VMM's RAM) writes the stream's pages into
/// that memory, and a vGPU built with `VgpuVm::on_memory` drives the guest from the same memory:
/// what the migrated vGPU renders is visible through the VMM's mapping.
#[test]
fn a_destination_on_vmm_memory_restores_into_that_memory() {
    use vm_memory::{Bytes, GuestAddress};
    let (s, d) = slices();
    let mut vm = boot(Profile::Desktop, 5, s);
    vm.run_steps(BEFORE).unwrap();
    let c = cfg(Policy::OneShotNarrow);
    let c2 = c.clone();
    let vmm_ram = gmig_vgpu::gtt::new_guest_ram(RAM as usize).unwrap();
    let canary = GuestAddress(RAM - 8);
    vmm_ram.write_obj(0xdead_beef_u64, canary).unwrap();
    let f = factory(d, true).on_memory(vmm_ram.clone());
    let (a, b) = tcp_pair();
    let dest = thread::spawn(move || migrate_destination(f, b, &c2));
    let mut handle = source_handle(vm, &c).unwrap();
    migrate_source(&mut handle, a, &c, &mut |_| {}).unwrap();
    let mut src = handle.into_device().into_vm();
    let (mut moved, _) = dest.join().unwrap().unwrap();
    moved.attach_driver(src.take_driver().unwrap());
    moved.run_steps(AFTER).unwrap();
    moved.finish().unwrap();
    // Every page the migrated guest can see is the VMM's: same bytes through both mappings.
    let mut a = vec![0u8; RAM as usize];
    let mut b = vec![0u8; RAM as usize];
    moved.memory().read_slice(&mut a, GuestAddress(0)).unwrap();
    vmm_ram.read_slice(&mut b, GuestAddress(0)).unwrap();
    assert!(a == b, "the restored vGPU does not use the VMM's RAM");
    // The source's last page was zero, so the stream wrote a zero over the canary, proving the
    // pages landed in the VMM's RAM rather than in a private copy.
    assert_ne!(vmm_ram.read_obj::<u64>(canary).unwrap(), 0xdead_beef);
    // And the result equals the unmigrated run.
    let mut reference = boot(Profile::Desktop, 5, s);
    reference.run_steps(moved.frames()).unwrap();
    reference.finish().unwrap();
    assert!(compare_guest_visible(reference.vgpu(), moved.vgpu()).is_identical());
}

/// `VgpuVm::on_memory` + `boot_driver` is the same guest as `VgpuVm::boot`.
#[test]
fn a_vgpu_on_given_memory_runs_the_same_guest_as_a_booted_one() {
    let (s, _) = slices();
    let mem = gmig_vgpu::gtt::new_guest_ram(RAM as usize).unwrap();
    let mut a = gmig_vgpu::migratable::VgpuVm::on_memory(TY, s, mem).unwrap();
    a.boot_driver(Profile::Video, WorkloadConfig::small(), 9)
        .unwrap();
    let mut b = boot(Profile::Video, 9, s);
    a.run_steps(3).unwrap();
    b.run_steps(3).unwrap();
    a.finish().unwrap();
    b.finish().unwrap();
    assert!(compare_guest_visible(a.vgpu(), b.vgpu()).is_identical());
}

/// The destination's side of the hand-over, driven by a scripted source: once it has restored the
/// vGPU, COMMIT makes it run the vGPU, ABORTED makes it drop its copy (the source runs it again),
/// and anything else — the source vanishing, silence — leaves it in doubt, holding the restored
/// copy without running it. Before the restore, a vanished source leaves it holding nothing.
#[test]
fn the_destination_owns_the_vgpu_only_after_commit_and_keeps_a_copy_when_in_doubt() {
    use std::io::Write;
    let (s, d) = slices();
    let mut vm = boot(Profile::Desktop, 21, s);
    vm.run_steps(BEFORE).unwrap();
    let mut c = cfg(Policy::StopAndCopy);
    c.max_drain = gmig_core::migration::Drain::workloads(0);
    let (stream, vm) = record_stream(vm, &c).unwrap();
    let mut c = cfg(Policy::StopAndCopy);
    c.timeout = Duration::from_millis(500);
    for script in [
        "commit",
        "aborted",
        "vanish",
        "silence",
        "vanish-before-restore",
    ] {
        let (mut a, b) = tcp_pair();
        let c2 = c.clone();
        let dest = thread::spawn(move || receive_migration(factory(d, true), b, &c2));
        let cut = if script == "vanish-before-restore" {
            stream.len() / 2
        } else {
            stream.len()
        };
        a.write_all(&stream[..cut]).unwrap();
        let mut controls = Vec::new();
        if cut == stream.len() {
            for _ in 0..2 {
                controls.push(Control::read_from(&mut a).unwrap());
            }
            assert_eq!(controls, [Control::HeaderAccepted, Control::Restored]);
        }
        match script {
            "commit" => Control::Commit.write_to(&mut a).unwrap(),
            "aborted" => Control::Aborted("the source runs it again".into())
                .write_to(&mut a)
                .unwrap(),
            "silence" => {}
            _ => drop(a.shutdown()),
        }
        let out = dest.join().unwrap();
        match (script, out) {
            ("commit", Ok(Incoming::Running(mut moved, _))) => {
                assert!(moved.vgpu().is_accepting(), "COMMIT runs the vGPU");
                let diff = compare_guest_visible(vm.vgpu(), moved.vgpu());
                assert!(diff.is_identical(), "{diff:?}");
                // The owner runs the workloads the stop carried (max_drain 0), on its own
                // slices, to what the unmigrated vGPU computes.
                let ran = moved.run_queued();
                assert!(
                    ran > 0,
                    "COMMIT: no carried workload ran on the destination"
                );
                let mut reference = boot(Profile::Desktop, 21, s);
                reference.run_steps(BEFORE).unwrap();
                assert_eq!(reference.run_queued(), ran);
                let diff = compare_guest_visible(reference.vgpu(), moved.vgpu());
                assert!(diff.is_identical(), "after the carried work: {diff:?}");
            }
            ("aborted", Err(MigrationError::Aborted { phase, reason })) => {
                assert_eq!(phase, MigrationPhase::Commit);
                assert_eq!(reason, "the source runs it again");
            }
            ("vanish" | "silence", Ok(Incoming::InDoubt { vm: held, error })) => {
                assert!(error.in_doubt(), "{error}");
                assert!(!held.vgpu().is_accepting(), "an in-doubt copy does not run");
                let diff = compare_guest_visible(vm.vgpu(), held.vgpu());
                assert!(diff.is_identical(), "{script}: {diff:?}");
            }
            ("vanish-before-restore", Err(e)) => {
                assert!(!e.in_doubt(), "{e}");
                assert_eq!(MigrationPhase::from(&e), MigrationPhase::StopCopy);
            }
            (script, other) => panic!("{script}: {other:?}"),
        }
    }
}

/// The reference vGPU with a deliberately too-small candidate set: the frames of one object are
/// left out of what narrowing re-hashes.
struct TooSmall {
    vm: VgpuVm,
    left_out: std::collections::BTreeSet<gmig_vgpu::gm::Gfn>,
}

impl MigratableVm for TooSmall {
    fn stream_header(&self) -> gmig_core::stream::StreamHeader {
        self.vm.stream_header()
    }
    fn memory(&self) -> &vm_memory::GuestMemoryMmap {
        self.vm.memory()
    }
    fn migratable_pages(&self) -> Vec<gmig_vgpu::gm::Gfn> {
        self.vm.migratable_pages()
    }
    fn migratable_pages_fixed(&self) -> bool {
        self.vm.migratable_pages_fixed()
    }
    fn step(&mut self) -> Result<(), gmig_core::migration::VmError> {
        self.vm.step()
    }
    fn start_write_tracking(&mut self) {
        self.vm.start_write_tracking();
    }
    fn stop_write_tracking(&mut self) {
        self.vm.stop_write_tracking();
    }
    fn write_candidates(&mut self) -> gmig_core::migration::Candidates {
        match self.vm.write_candidates() {
            gmig_core::migration::Candidates::Pages(p) => gmig_core::migration::Candidates::Pages(
                p.into_iter()
                    .filter(|g| !self.left_out.contains(g))
                    .collect(),
            ),
            other => other,
        }
    }
    fn quiesce(
        &mut self,
        max_drain: gmig_core::migration::Drain,
    ) -> Result<usize, gmig_core::migration::VmError> {
        self.vm.quiesce(max_drain)
    }
    fn unquiesce(&mut self) -> Result<(), gmig_core::migration::VmError> {
        self.vm.unquiesce()
    }
    fn save_state(
        &self,
    ) -> Result<Vec<(gmig_core::stream::StateKind, Vec<u8>)>, gmig_core::migration::VmError> {
        self.vm.save_state()
    }
}

#[test]
fn a_too_small_candidate_set_loses_the_compute_output() {
    // Negative control for narrowing on dispatches: leave the compute buffer (what the kernel's
    // untyped writes reach through the binding table) out of the candidates; the migrated run
    // then differs from the unmigrated one. With the full set (every test above) it does not.
    let (s, d) = slices();
    let profile = Profile::Compute;
    let mut vm = boot(profile, 21, s);
    vm.run_steps(BEFORE).unwrap();
    let mut driver = vm.take_driver().unwrap();
    let buf = driver.object("compute").unwrap();
    // Objects are contiguous in guest RAM.
    let left_out = (buf.gpa / 4096..(buf.gpa + buf.size) / 4096)
        .map(gmig_vgpu::gm::Gfn)
        .collect();
    vm.attach_driver(driver);
    let c = cfg(Policy::OneShotNarrow);
    let c2 = c.clone();
    let (a, b) = tcp_pair();
    let f = factory(d, true);
    let dest = thread::spawn(move || migrate_destination(f, b, &c2));
    let mut handle = source_handle(TooSmall { vm, left_out }, &c).unwrap();
    let report = migrate_source(&mut handle, a, &c, &mut |_| {}).unwrap();
    assert!(!report.widened);
    let mut src = handle.into_device().into_vm().vm;
    let (mut moved, _) = dest.join().unwrap().unwrap();
    driver = src.take_driver().unwrap();
    moved.attach_driver(driver);
    moved.run_steps(AFTER).unwrap();
    moved.finish().unwrap();
    let mut reference = boot(profile, 21, s);
    reference.run_steps(moved.frames()).unwrap();
    reference.finish().unwrap();
    let diff = compare_guest_visible(reference.vgpu(), moved.vgpu());
    assert!(!diff.is_identical(), "the negative control must differ");
}

/// Everything the source device has to give now: until it has nothing more in pre-copy, or to
/// END in stop-copy.
fn drain_device(
    h: &mut gmig_vfio_migration::MigrationHandle<gmig_core::migration::SourceDevice<VgpuVm>>,
    out: &mut Vec<u8>,
) {
    use gmig_vfio_migration::ReadOutcome;
    let mut buf = vec![0u8; 64 << 10];
    while let ReadOutcome::Data(n) = MigrationTarget::read_data(h, &mut buf).unwrap() {
        out.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn ggtt_entries_written_during_precopy_reach_the_destination_in_the_update() {
    use gmig_core::stream::{load, StateKind, StreamLimits};
    use gmig_vgpu::gm::PAGE_SIZE;
    use gmig_vgpu::gtt::GgttState;
    use gmig_vgpu::mmio::{GTT_MMIO_BASE, GTT_PTE_PRESENT};

    let (s, d) = slices();
    let mut vm = boot(Profile::Desktop, 5, s);
    vm.run_steps(BEFORE).unwrap();
    let c = cfg(Policy::OneShot);
    let mut h = source_handle(vm, &c).unwrap();
    MigrationTarget::set_state(&mut h, DeviceState::PreCopy).unwrap();
    let mut stream = Vec::new();
    drain_device(&mut h, &mut stream);

    // While pre-copy runs the guest clears one present aperture entry and maps two empty ones.
    let first = s.aperture.base.0 / PAGE_SIZE;
    let pages = s.aperture.size / PAGE_SIZE;
    let vgpu = h.device_mut().vm_mut().vgpu_mut();
    let entry = |v: &mut gmig_vgpu::Vgpu, p: u64| {
        let off = GTT_MMIO_BASE + (p * 8) as u32;
        u64::from(v.mmio_read32(off).unwrap()) | (u64::from(v.mmio_read32(off + 4).unwrap()) << 32)
    };
    let present = (first..first + pages)
        .find(|p| entry(vgpu, *p) & GTT_PTE_PRESENT != 0)
        .expect("the desktop guest maps aperture pages");
    let empty: Vec<u64> = (first..first + pages)
        .filter(|p| entry(vgpu, *p) == 0)
        .take(2)
        .collect();
    assert_eq!(empty.len(), 2);
    let mut written = vec![(present, 0u64)];
    for (i, p) in empty.iter().enumerate() {
        written.push((*p, ((5 + i as u64) * PAGE_SIZE) | GTT_PTE_PRESENT));
    }
    for &(p, pte) in &written {
        let off = GTT_MMIO_BASE + (p * 8) as u32;
        vgpu.mmio_write32(off, pte as u32).unwrap();
        vgpu.mmio_write32(off + 4, (pte >> 32) as u32).unwrap();
    }
    MigrationTarget::set_state(&mut h, DeviceState::StopCopy).unwrap();
    drain_device(&mut h, &mut stream);
    let src = h.into_device().into_vm();

    // The GGTT went early and without the writes; the update carries exactly the three slots.
    let loaded = load(&stream[..], StreamLimits::default(), None).unwrap();
    let section = |kind| -> GgttState {
        let (_, p) = loaded.states.iter().find(|(k, _)| *k == kind).unwrap();
        postcard::from_bytes(p).unwrap()
    };
    let whole = section(StateKind::Ggtt);
    let slot = |p: u64| (p - first) as u32;
    assert!(whole.aperture.iter().any(|(i, _)| *i == slot(present)));
    assert!(!whole.aperture.iter().any(|(i, _)| *i == slot(empty[0])));
    let update = section(StateKind::GgttUpdate);
    let mut got = update.aperture.clone();
    got.sort_unstable();
    let mut want: Vec<(u32, u64)> = written.iter().map(|(p, e)| (slot(*p), *e)).collect();
    want.sort_unstable();
    assert_eq!(got, want);
    assert!(update.hidden.is_empty());

    // The destination, which loaded the GGTT as it arrived, ends with the source's table.
    let restored = gmig_core::migration::restore_stream(factory(d, true), &stream, &c).unwrap();
    let diff = compare_guest_visible(src.vgpu(), restored.vgpu());
    assert!(diff.is_identical(), "{diff:?}");
}

#[test]
fn verifying_before_the_stop_misses_nothing_the_guest_writes_after_it() {
    let (s, d) = slices();
    for profile in [
        Profile::Desktop,
        Profile::ThreeD,
        Profile::Video,
        Profile::Compute,
    ] {
        let mut vm = boot(profile, 21, s);
        vm.run_steps(BEFORE).unwrap();
        let c = cfg(Policy::OneShotNarrow);
        let mut h = source_handle(vm, &c).unwrap();
        MigrationTarget::set_state(&mut h, DeviceState::PreCopy).unwrap();
        let mut stream = Vec::new();
        drain_device(&mut h, &mut stream);
        // The guest ran frames during pre-copy; verify what they wrote, send what changed.
        h.device_mut().vm_mut().run_steps(2).unwrap();
        h.device_mut().verify_candidates().unwrap();
        drain_device(&mut h, &mut stream);
        // Frames after the verification: only the new candidate set can find their writes.
        h.device_mut().vm_mut().run_steps(3).unwrap();
        MigrationTarget::set_state(&mut h, DeviceState::StopCopy).unwrap();
        drain_device(&mut h, &mut stream);
        let stats = h.device().stats();
        assert!(stats.verified > 0, "{profile:?}: {stats:?}");
        assert!(stats.rehashed > 0, "{profile:?}: {stats:?}");
        let src = h.into_device().into_vm();
        let restored = gmig_core::migration::restore_stream(factory(d, true), &stream, &c).unwrap();
        let diff = compare_guest_visible(src.vgpu(), restored.vgpu());
        assert!(diff.is_identical(), "{profile:?}: {diff:?}");
    }
}

/// Before the switch-over marker the source names the frames the GPU can write (the frames its
/// GTTs map), so that a destination can back those pre-copy found zero while the guest runs.
#[test]
fn the_source_names_the_frames_the_gpu_can_write_before_the_switch_over() {
    use gmig_core::stream::Section;
    use gmig_test_support::{mute_destination, sections_of};
    let (s, _) = slices();
    let mut vm = boot(Profile::Compute, 5, s);
    vm.run_steps(BEFORE).unwrap();
    let mut c = cfg(Policy::OneShot);
    c.timeout = Duration::from_millis(500);
    // A destination that takes everything but never answers the SYNC: the source gives up
    // waiting for it, before the stop, and the stream so far is what it sent.
    let (a, b) = tcp_pair();
    let mute = mute_destination(b);
    let mut handle = source_handle(vm, &c).unwrap();
    let err = migrate_source(&mut handle, a, &c, &mut |_| {}).unwrap_err();
    assert_eq!(MigrationPhase::from(&err), MigrationPhase::PreCopy, "{err}");
    let got = mute.join().unwrap();
    // After the stream, the source's ABORTED control frame follows; decoding stops there.
    let sections = sections_of(&got);
    let n = sections.len();
    assert!(
        matches!(sections[n - 1], Section::Sync(1)),
        "ends with SYNC"
    );
    let hinted: Vec<u64> = sections
        .iter()
        .filter_map(|s| match s {
            Section::WritableFrames(runs) => Some(runs),
            _ => None,
        })
        .flatten()
        .flat_map(gmig_core::stream::FrameRange::frames)
        .map(|g| g.0)
        .collect();
    assert!(
        matches!(sections[n - 2], Section::WritableFrames(_)),
        "the hint comes right before the SYNC"
    );
    // The VM has not run since the SYNC was written: its GTTs map what they mapped then.
    let vm = handle.into_device().into_vm();
    let guest = RAM / 4096;
    let want: Vec<u64> = vm
        .vgpu()
        .gtt_backed_pages()
        .into_iter()
        .map(|g| g.0)
        .filter(|&g| g < guest)
        .collect();
    assert!(!want.is_empty());
    assert_eq!(hinted, want);
}

/// One-shot-narrow verifies again while the last verification found more than a round's worth
/// of pages changed (a frame landed in the resend before it), so the stop follows a resend in
/// which the guest wrote little. Over the frame phases, 3d's stop-copy pages with up to 8
/// verifications are a fraction of those with one, and the guest still ends as an unmigrated
/// one. The control, one verification, pays a frame's render pass in the stop in some phase.
#[test]
fn verifying_until_a_quiet_resend_keeps_frames_out_of_the_stop() {
    let mut one = Vec::new();
    let mut converged = Vec::new();
    for phase in (0..32).step_by(4) {
        for (rounds, out) in [(1, &mut one), (8, &mut converged)] {
            let mut c = cfg(Policy::OneShotNarrow);
            c.max_drain = gmig_core::migration::Drain::CARRY;
            // Small batches, a frame every 32: a verification's resend (a frame's ~110 pages)
            // spans about 14 batches, so a frame lands in it in some phases and not in others.
            c.batch_pages = 8;
            c.step_every_batches = 32;
            c.step_phase = phase;
            c.verify_rounds = rounds;
            let (r, identical) = differential_with(Profile::ThreeD, 7, &c, true);
            assert!(identical, "phase {phase}, {rounds} rounds: {r:?}");
            assert!(r.verify_rounds >= 1 && r.verify_rounds <= rounds, "{r:?}");
            out.push((r.pages_stop_copy, r.verify_rounds, r.pages_verify_resent));
        }
    }
    let pages = |v: &[(u64, u32, u64)]| v.iter().map(|p| p.0).sum::<u64>();
    assert!(
        one.iter().any(|&(p, _, _)| p >= 16),
        "control: with one verification some phase pays a frame in the stop: {one:?}"
    );
    assert!(
        converged.iter().any(|&(_, r, _)| r > 1),
        "some phase verified again: {converged:?}"
    );
    assert!(
        pages(&converged) * 4 <= pages(&one),
        "converging verification: {converged:?} against one verification: {one:?}"
    );
}
