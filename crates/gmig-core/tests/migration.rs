//! The migration engine on the synthetic VM: differential runs for every policy over TCP, Unix and
//! memory transports; failure at every phase leaves the source running with nothing lost.

use std::thread;
use std::time::Duration;

use gmig_core::migration::synthetic::{SyntheticConfig, SyntheticFactory, SyntheticVm};
use gmig_core::migration::{
    migrate_destination, migrate_source, record_stream, source_handle, MigratableVm,
    MigrationConfig, MigrationError, MigrationPhase, MigrationReport, Policy,
};
use gmig_core::stream::{GpuGeneration, StreamLimits};
use gmig_core::transport::{mem_pair, Connection, Counted, Endpoint};
use gmig_test_support::tcp_pair;
use gmig_test_support::Corrupting;
use gmig_vfio_migration::{DeviceState, MigrationHandle, MigrationTarget};

const SRC_AP: u64 = 0x0400_0000;
const SRC_HID: u64 = 0x4000_0000;
const DST_AP: u64 = 0x1000_0000;
const DST_HID: u64 = 0x8000_0000;
const TOTAL_STEPS: u64 = 60;
const BEFORE: u64 = 10;

fn synth_cfg(seed: u64, opaque_every: u64) -> SyntheticConfig {
    SyntheticConfig {
        pages: 2048,
        seed,
        max_cmd_pages: 8,
        opaque_every,
    }
}

fn factory() -> SyntheticFactory {
    SyntheticFactory {
        aperture_base: DST_AP,
        hidden_base: DST_HID,
        skip_remap: false,
    }
}

fn cfg(policy: Policy) -> MigrationConfig {
    let mut c = MigrationConfig::new(policy);
    c.hash_threads = 2;
    c.timeout = Duration::from_secs(10);
    c
}

fn reference(synth: SyntheticConfig) -> u64 {
    let mut vm = SyntheticVm::new(synth, SRC_AP, SRC_HID).unwrap();
    for _ in 0..TOTAL_STEPS {
        vm.step().unwrap();
    }
    vm.finish().unwrap();
    vm.guest_digest().unwrap()
}

/// Migrate mid-run, continue on the destination, return (report, digest at the end).
fn migrated_run(
    synth: SyntheticConfig,
    policy: Policy,
    src_conn: Box<dyn Connection>,
    dst_conn: Box<dyn Connection>,
    factory: SyntheticFactory,
) -> (MigrationReport, Result<u64, String>) {
    let mut vm = SyntheticVm::new(synth, SRC_AP, SRC_HID).unwrap();
    for _ in 0..BEFORE {
        vm.step().unwrap();
    }
    let c = cfg(policy);
    let c2 = c.clone();
    let dest = thread::spawn(move || migrate_destination(factory, dst_conn, &c2));
    let mut handle = source_handle(vm, &c).unwrap();
    let report = migrate_source(&mut handle, src_conn, &c, &mut |_| {}).unwrap();
    assert_eq!(
        MigrationTarget::state(&mut handle).unwrap(),
        DeviceState::Stop
    );
    let (mut vm, dest_report) = dest.join().unwrap().unwrap();
    assert_eq!(dest_report.pages, report.pages_total);
    // The downtime split adds up: the consecutive phases the source measures never exceed the
    // downtime (the rest is starting the stop itself, outside the quiesce).
    let split = report.quiesce_ms + report.transfer_ms + report.dest_finish_ms + report.commit_ms;
    assert!(split <= report.downtime_ms + 1e-6, "{report:?}");
    assert!(
        report.dest_finish_ms >= 0.0 && report.commit_ms > 0.0,
        "{report:?}"
    );
    let remaining = TOTAL_STEPS - BEFORE - report.steps_during_precopy;
    // The destination has work of its own after the switch-over: steps the source never ran,
    // and the commands the stop carried instead of draining.
    assert!(
        remaining > 0,
        "the source ran every step before the switch-over: {report:?}"
    );
    assert!(vm.queued() > 0, "no carried command on the destination");
    let digest = (|| {
        for _ in 0..remaining {
            vm.step()?;
        }
        vm.finish()?;
        vm.guest_digest()
    })()
    .map_err(|e| e.to_string());
    (report, digest)
}

#[test]
fn every_policy_over_tcp_equals_the_unmigrated_run() {
    for seed in [1, 7] {
        for opaque in [0, 5] {
            let synth = synth_cfg(seed, opaque);
            let want = reference(synth);
            for policy in Policy::ALL {
                let (a, b) = tcp_pair();
                let (report, got) = migrated_run(synth, policy, a, b, factory());
                assert_eq!(
                    got,
                    Ok(want),
                    "{policy:?} seed {seed} opaque {opaque}: {report:?}"
                );
                assert_eq!(
                    report.pages_total,
                    report.pages_precopy + report.pages_stop_copy
                );
                if policy == Policy::StopAndCopy {
                    assert_eq!(report.pages_precopy, 0);
                    assert_eq!(report.pages_stop_copy, synth.pages);
                } else {
                    assert!(report.pages_precopy >= synth.pages, "{report:?}");
                    assert!(
                        report.steps_during_precopy > 0,
                        "workload ran during pre-copy"
                    );
                }
                if policy == Policy::OneShotNarrow {
                    assert_eq!(report.widened, opaque > 0, "{report:?}");
                }
            }
        }
    }
}

#[test]
fn unix_and_memory_transports_work_too() {
    let synth = synth_cfg(3, 0);
    let want = reference(synth);
    let (a, b) = mem_pair(1 << 16);
    let (_, got) = migrated_run(synth, Policy::OneShot, Box::new(a), Box::new(b), factory());
    assert_eq!(got, Ok(want));

    let dir = std::env::temp_dir().join(format!("gmig-mig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.sock");
    let _ = std::fs::remove_file(&path);
    let l = Endpoint::Unix(path).listen().unwrap();
    let ep = l.endpoint().unwrap();
    let t = thread::spawn(move || (l.accept().unwrap(), l));
    let a = ep.connect().unwrap();
    let (b, _l) = t.join().unwrap();
    let (_, got) = migrated_run(synth, Policy::OneShotNarrow, a, b, factory());
    assert_eq!(got, Ok(want));
}

#[test]
fn without_remapping_the_migrated_run_differs() {
    let synth = synth_cfg(1, 0);
    let want = reference(synth);
    let (a, b) = mem_pair(1 << 16);
    let no_remap = SyntheticFactory {
        skip_remap: true,
        ..factory()
    };
    let (_, got) = migrated_run(synth, Policy::OneShot, Box::new(a), Box::new(b), no_remap);
    assert_ne!(got, Ok(want), "the differential test must have teeth");
}

#[test]
fn narrow_sends_far_fewer_pages_in_downtime_than_stop_and_copy() {
    let synth = synth_cfg(2, 0);
    let mut stop_copy = Vec::new();
    for policy in Policy::ALL {
        let (a, b) = mem_pair(1 << 16);
        let (r, digest) = migrated_run(synth, policy, Box::new(a), Box::new(b), factory());
        assert_eq!(digest, Ok(reference(synth)), "{policy:?}");
        stop_copy.push((policy, r.pages_stop_copy, r.pages_rehashed));
    }
    let sac = stop_copy[0].1;
    let (_, narrow, narrow_rehashed) = stop_copy[3];
    let (_, _, oneshot_rehashed) = stop_copy[2];
    assert!(narrow * 5 <= sac, "narrow {narrow} vs stop-and-copy {sac}");
    assert!(narrow_rehashed * 4 < oneshot_rehashed, "{stop_copy:?}");
}

/// Run a migration that is expected to fail; check the source is RUNNING again and that
/// continuing it reaches the reference state. Returns the source's and destination's errors.
fn failing_run<F: gmig_core::migration::VmFactory<Vm = SyntheticVm> + 'static>(
    policy: Policy,
    src_conn: Box<dyn Connection>,
    dst_conn: Box<dyn Connection>,
    factory: F,
) -> (MigrationError, MigrationError) {
    let synth = synth_cfg(4, 0);
    let want = reference(synth);
    let mut vm = SyntheticVm::new(synth, SRC_AP, SRC_HID).unwrap();
    for _ in 0..BEFORE {
        vm.step().unwrap();
    }
    let c = cfg(policy);
    let c2 = c.clone();
    let dest = thread::spawn(move || migrate_destination(factory, dst_conn, &c2).map(|_| ()));
    let mut handle: MigrationHandle<_> = source_handle(vm, &c).unwrap();
    let src_err = migrate_source(&mut handle, src_conn, &c, &mut |_| {}).unwrap_err();
    let dst_err = dest.join().unwrap().unwrap_err();
    assert_eq!(
        MigrationTarget::state(&mut handle).unwrap(),
        DeviceState::Running,
        "source must be RUNNING after: {src_err}"
    );
    let mut vm = handle.into_device().into_vm();
    assert!(vm.accepting(), "the source accepts submissions again");
    // Continue for the rest of the run: nothing was lost, so it ends as the reference does.
    // (The steps run during pre-copy count too.)
    let ran = vm.submitted();
    for _ in ran..TOTAL_STEPS {
        vm.step().unwrap();
    }
    vm.finish().unwrap();
    assert_eq!(
        vm.guest_digest().unwrap(),
        want,
        "source state intact after: {src_err}"
    );
    (src_err, dst_err)
}

/// Byte counts of a successful run of the failure tests' workload: (pre-copy bytes, all bytes
/// before the commit frame).
fn layout(policy: Policy) -> (u64, u64) {
    let (a, b) = mem_pair(1 << 16);
    let (r, _) = migrated_run(synth_cfg(4, 0), policy, Box::new(a), Box::new(b), factory());
    (r.bytes_precopy, r.bytes_on_wire - 16)
}

#[test]
fn a_cut_connection_at_any_phase_leaves_the_source_running() {
    let (pre, full) = layout(Policy::OneShot);
    let mut phases = Vec::new();
    // Inside the header, early and late pre-copy, mid stop-copy, inside END.
    for cut in [10, pre / 3, pre - 100, pre + (full - pre) / 2, full - 10] {
        let (a, b) = mem_pair(1 << 16);
        let a = Counted::new(a).cut_after(cut);
        let (src, dst) = failing_run(Policy::OneShot, Box::new(a), Box::new(b), factory());
        phases.push(MigrationPhase::from(&src));
        assert!(
            matches!(
                dst,
                MigrationError::Closed { .. } | MigrationError::Transport { .. }
            ),
            "destination: {dst}"
        );
    }
    assert_eq!(phases[0], MigrationPhase::Handshake);
    assert_eq!(phases[1], MigrationPhase::PreCopy);
    assert_eq!(phases[3], MigrationPhase::StopCopy);

    // Stop-and-copy: cut in downtime.
    let (a, b) = mem_pair(1 << 16);
    let (_, full) = layout(Policy::StopAndCopy);
    let a = Counted::new(a).cut_after(full / 2);
    let (src, _) = failing_run(Policy::StopAndCopy, Box::new(a), Box::new(b), factory());
    assert_eq!(MigrationPhase::from(&src), MigrationPhase::StopCopy);
}

#[test]
fn destination_rejections_leave_the_source_running() {
    // Incompatible vGPU type: refused at the header.
    struct Other(SyntheticFactory);
    use gmig_core::migration::VmFactory;
    impl VmFactory for Other {
        type Vm = SyntheticVm;
        fn compatibility(&self) -> gmig_core::stream::Compatibility {
            gmig_core::stream::Compatibility {
                generation: GpuGeneration::Gen11,
                ..self.0.compatibility()
            }
        }
        fn create_memory(
            &mut self,
            h: &gmig_core::stream::StreamHeader,
        ) -> Result<vm_memory::GuestMemoryMmap, gmig_core::migration::VmError> {
            self.0.create_memory(h)
        }
        fn restore(
            &mut self,
            h: &gmig_core::stream::StreamHeader,
            m: vm_memory::GuestMemoryMmap,
            s: &[(gmig_core::stream::StateKind, Vec<u8>)],
        ) -> Result<(SyntheticVm, gmig_core::migration::RestoreTimes), gmig_core::migration::VmError>
        {
            self.0.restore(h, m, s)
        }
    }
    let (a, b) = mem_pair(1 << 16);
    let (src, _) = failing_run(
        Policy::OneShotNarrow,
        Box::new(a),
        Box::new(b),
        Other(factory()),
    );
    match src {
        MigrationError::Rejected { phase, reason } => {
            assert_eq!(phase, MigrationPhase::Handshake);
            assert!(reason.contains("GPU generation"), "{reason}");
        }
        other => panic!("{other}"),
    }
    // A corrupted byte in pre-copy and in stop-copy: refused by the checksum.
    let (pre, full) = layout(Policy::OneShot);
    let (_, sac_full) = layout(Policy::StopAndCopy);
    let cases = [
        (Policy::OneShot, pre / 2),
        (Policy::OneShot, pre + (full - pre) / 2),
        (Policy::StopAndCopy, sac_full / 2),
        (Policy::StopAndCopy, sac_full - 30),
    ];
    for (policy, at) in cases {
        {
            let (a, b) = mem_pair(1 << 16);
            let a = Corrupting::new(a, at);
            let (src, dst) = failing_run(policy, Box::new(a), Box::new(b), factory());
            // The source reports the destination's reason, not just a broken pipe.
            match &src {
                MigrationError::Rejected { reason, .. } => {
                    assert!(reason.contains("bad migration stream"), "{reason}");
                }
                other => panic!("{policy:?} at {at}: {other}"),
            }
            assert!(
                dst.to_string().contains("bad migration stream"),
                "{policy:?} at {at}: {dst}"
            );
        }
    }
    // Restore refused (the queued work points outside the destination's slice).
    let bad = SyntheticFactory {
        aperture_base: u64::MAX - 0x1000,
        ..factory()
    };
    let (a, b) = mem_pair(1 << 16);
    let (src, _) = failing_run(Policy::Iterative, Box::new(a), Box::new(b), bad);
    match src {
        MigrationError::Rejected { phase, reason } => {
            assert_eq!(phase, MigrationPhase::Restore, "{reason}");
            assert!(reason.contains("restore refused"), "{reason}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn any_corrupted_byte_of_a_recorded_stream_is_rejected_by_the_destination() {
    use gmig_core::migration::DestDevice;
    let mut vm = SyntheticVm::new(synth_cfg(5, 0), SRC_AP, SRC_HID).unwrap();
    for _ in 0..BEFORE {
        vm.step().unwrap();
    }
    let (bytes, _vm) = record_stream(vm, &cfg(Policy::StopAndCopy)).unwrap();
    let load = |bytes: &[u8]| -> bool {
        let mut h =
            MigrationHandle::new(DestDevice::new(factory(), StreamLimits::default())).unwrap();
        MigrationTarget::set_state(&mut h, DeviceState::Resuming).unwrap();
        for chunk in bytes.chunks(100_000) {
            if MigrationTarget::write_data(&mut h, chunk).is_err() {
                return false;
            }
        }
        let ok = MigrationTarget::set_state(&mut h, DeviceState::Stop).is_ok();
        ok && h.device().restored()
    };
    assert!(load(&bytes), "the intact stream loads");
    let n = bytes.len();
    let mut positions: Vec<usize> = (0..64).map(|i| i * 977).collect();
    positions.extend((0..48).map(|i| (i * 179_999) % n));
    positions.extend((1..=40).map(|i| n - i));
    for p in positions {
        let mut bad = bytes.clone();
        bad[p] ^= 0x04;
        assert!(!load(&bad), "flip at {p} of {n} was accepted");
    }
}

#[test]
fn a_zero_page_after_a_full_one_zeroes_the_frame_on_the_destination() {
    use gmig_core::migration::{DestDevice, MigratableVm as _};
    use gmig_core::stream::{load, Gfn, PageBatch, StreamWriter, PAGE_SIZE};
    use vm_memory::{Bytes, GuestAddress};

    let vm = SyntheticVm::new(synth_cfg(6, 0), SRC_AP, SRC_HID).unwrap();
    let (bytes, _vm) = record_stream(vm, &cfg(Policy::StopAndCopy)).unwrap();
    let recorded = load(&bytes[..], StreamLimits::default(), None).unwrap();
    // Frame 1000 is zero in the recorded stream; send it full first, then the recorded batches.
    let target = Gfn(1000);
    assert!(recorded
        .batches
        .iter()
        .flat_map(PageBatch::iter)
        .any(|(g, d)| { g == target && d == gmig_core::stream::PageData::Zero }));
    let mut w = StreamWriter::new(Vec::new(), &recorded.header).unwrap();
    let mut first = PageBatch::new();
    first.push(target, &[0xab; PAGE_SIZE]);
    w.write_pages(&first).unwrap();
    for b in &recorded.batches {
        w.write_pages(b).unwrap();
    }
    for (k, p) in &recorded.states {
        w.write_state(*k, p).unwrap();
    }
    let (stream, _) = w.finish().unwrap();

    let mut h = MigrationHandle::new(DestDevice::new(factory(), StreamLimits::default())).unwrap();
    MigrationTarget::set_state(&mut h, DeviceState::Resuming).unwrap();
    MigrationTarget::write_data(&mut h, &stream).unwrap();
    MigrationTarget::set_state(&mut h, DeviceState::Stop).unwrap();
    let vm = h.device_mut().take_vm().unwrap();
    let mut page = [0xffu8; PAGE_SIZE];
    vm.memory()
        .read_slice(&mut page, GuestAddress(target.0 * PAGE_SIZE as u64))
        .unwrap();
    assert!(page.iter().all(|&b| b == 0), "the later zero page must win");
}

mod cut_anywhere {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Wherever the connection drops (any byte, any policy), the source ends up RUNNING and,
        /// continued, reaches the unmigrated run's state; the destination returns an error.
        #[test]
        fn a_cut_at_any_byte_loses_nothing(frac in 0.0f64..1.0, p in 0usize..4) {
            let policy = Policy::ALL[p];
            let (_, full) = layout(policy);
            let cut = ((full as f64) * frac) as u64;
            let (a, b) = mem_pair(1 << 16);
            let a = Counted::new(a).cut_after(cut);
            let (_src, dst) = failing_run(policy, Box::new(a), Box::new(b), factory());
            prop_assert!(!dst.to_string().is_empty());
        }
    }
}

#[test]
fn mig_data_size_never_underestimates_the_stop_copy_bytes() {
    use gmig_vfio_migration::ReadOutcome;
    for (policy, opaque) in [
        (Policy::StopAndCopy, 0),
        (Policy::OneShot, 0),
        (Policy::OneShotNarrow, 0),
        (Policy::OneShotNarrow, 3),
    ] {
        let mut vm = SyntheticVm::new(synth_cfg(8, opaque), SRC_AP, SRC_HID).unwrap();
        for _ in 0..BEFORE {
            vm.step().unwrap();
        }
        let mut h = source_handle(vm, &cfg(policy)).unwrap();
        let mut buf = vec![0u8; 1 << 16];
        if policy != Policy::StopAndCopy {
            MigrationTarget::set_state(&mut h, DeviceState::PreCopy).unwrap();
            while let ReadOutcome::Data(_) = MigrationTarget::read_data(&mut h, &mut buf).unwrap() {
            }
            for _ in 0..5 {
                h.device_mut().vm_mut().step().unwrap();
            }
        }
        let estimate = MigrationTarget::stop_copy_size(&mut h).unwrap();
        MigrationTarget::set_state(&mut h, DeviceState::StopCopy).unwrap();
        let after_stop = MigrationTarget::stop_copy_size(&mut h).unwrap();
        let mut actual = 0u64;
        while let ReadOutcome::Data(n) = MigrationTarget::read_data(&mut h, &mut buf).unwrap() {
            actual += n as u64;
        }
        assert!(
            estimate >= actual,
            "{policy:?}: estimate {estimate} < {actual}"
        );
        assert!(
            after_stop >= actual,
            "{policy:?}: in STOP_COPY {after_stop} < {actual}"
        );
        assert_eq!(MigrationTarget::stop_copy_size(&mut h).unwrap(), 0);
        eprintln!("{policy:?} opaque {opaque}: estimate {estimate}, in stop-copy {after_stop}, actual {actual}");
    }
}

mod hand_over {
    use super::*;
    use gmig_core::migration::{receive_migration, Incoming, MigratableVm};
    use proptest::prelude::*;

    /// Continues a VM to the end of the run and returns its digest.
    fn finish_run(mut vm: SyntheticVm) -> u64 {
        for _ in vm.submitted()..TOTAL_STEPS {
            vm.step().unwrap();
        }
        vm.finish().unwrap();
        vm.guest_digest().unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The connection drops at any byte in either direction — the stream, HEADER_ACCEPTED,
        /// RESTORED, COMMIT, RESUMED — under any policy. Then: never do both sides run; the
        /// source lets its copy go only when the destination runs; a side that is not sure keeps
        /// a stopped copy (in doubt); and the copy an operator resumes (the running one, or else
        /// an in-doubt one) continues to exactly the unmigrated run's state.
        #[test]
        fn a_cut_anywhere_in_either_direction_leaves_one_owner_and_loses_nothing(
            frac in 0.0f64..1.0,
            towards_destination in any::<bool>(),
            p in 0usize..4,
        ) {
            let policy = Policy::ALL[p];
            let synth = synth_cfg(4, 0);
            let want = reference(synth);
            let (_, stream) = layout(policy);
            let (a, b) = mem_pair(1 << 16);
            // Source → destination: the stream and COMMIT (16 bytes); back: HEADER_ACCEPTED and
            // RESTORED (16 each) and RESUMED (32).
            let (a, b): (Box<dyn Connection>, Box<dyn Connection>) = if towards_destination {
                let cut = ((stream + 16) as f64 * frac) as u64;
                (Box::new(Counted::new(a).cut_after(cut)), Box::new(b))
            } else {
                let cut = (64.0 * frac) as u64;
                (Box::new(a), Box::new(Counted::new(b).cut_after(cut)))
            };
            let mut vm = SyntheticVm::new(synth, SRC_AP, SRC_HID).unwrap();
            for _ in 0..BEFORE {
                vm.step().unwrap();
            }
            let mut c = cfg(policy);
            c.timeout = Duration::from_secs(2);
            let c2 = c.clone();
            let dest = thread::spawn(move || receive_migration(factory(), b, &c2));
            let mut handle = source_handle(vm, &c).unwrap();
            let src = migrate_source(&mut handle, a, &c, &mut |_| {});
            let dst = dest.join().unwrap();
            let src_state = MigrationTarget::state(&mut handle).unwrap();
            let src_runs = src.as_ref().is_err_and(|e| !e.in_doubt());
            let src_in_doubt = src.as_ref().is_err_and(MigrationError::in_doubt);
            let dst_runs = matches!(dst, Ok(Incoming::Running(..)));
            prop_assert!(!(src_runs && dst_runs), "both run: {src:?} / {dst:?}");
            if src.is_ok() {
                prop_assert!(dst_runs, "the source let go but the destination does not run");
            }
            if src_runs {
                prop_assert_eq!(src_state, DeviceState::Running);
            } else {
                // Released or in doubt: stopped, never resumed by itself.
                prop_assert_eq!(src_state, DeviceState::Stop);
            }
            let owner = match dst {
                Ok(Incoming::Running(vm, _)) => vm,
                _ if src_runs => handle.into_device().into_vm(),
                Ok(Incoming::InDoubt { mut vm, error }) => {
                    prop_assert!(error.in_doubt());
                    // The operator resumes the destination's copy (the source, in doubt or not,
                    // does not run).
                    vm.unquiesce().unwrap();
                    vm
                }
                Err(e) => {
                    prop_assert!(
                        src_in_doubt,
                        "neither side holds the guest: {src:?} / {e}"
                    );
                    // Only the source's stopped copy is left: the operator resumes it.
                    MigrationTarget::set_state(&mut handle, DeviceState::Running).unwrap();
                    handle.into_device().into_vm()
                }
            };
            prop_assert_eq!(finish_run(owner), want);
        }
    }
}

#[test]
fn the_source_stops_the_vm_only_once_the_destination_acknowledged_the_switch_over() {
    use gmig_core::stream::{Section, StateKind};
    use gmig_test_support::{mute_destination, sections_of};
    // A destination that accepts the header and reads everything, but never answers a SYNC.
    for ack in [true, false] {
        let mut vm = SyntheticVm::new(synth_cfg(4, 0), SRC_AP, SRC_HID).unwrap();
        for _ in 0..BEFORE {
            vm.step().unwrap();
        }
        let mut c = cfg(Policy::OneShot);
        c.timeout = Duration::from_millis(500);
        c.switchover_ack = ack;
        let (a, b) = mem_pair(1 << 16);
        let mute = mute_destination(b);
        let mut handle = source_handle(vm, &c).unwrap();
        let err = migrate_source(&mut handle, Box::new(a), &c, &mut |_| {}).unwrap_err();
        let got = mute.join().unwrap();
        let sections = sections_of(&got);
        let stopped = sections.iter().any(|s| {
            matches!(
                s,
                Section::State {
                    kind: StateKind::DeviceConfig,
                    ..
                }
            )
        });
        if ack {
            // Waiting for the acknowledgement, the VM ran: no stop-copy byte left the source.
            assert_eq!(MigrationPhase::from(&err), MigrationPhase::PreCopy, "{err}");
            assert!(matches!(sections.last(), Some(Section::Sync(1))));
            assert!(!stopped);
        } else {
            // Without it the source stopped and sent everything, then waited for RESTORED.
            assert_eq!(MigrationPhase::from(&err), MigrationPhase::Restore, "{err}");
            assert!(stopped);
            assert!(!sections.iter().any(|s| matches!(s, Section::Sync(_))));
        }
        assert_eq!(
            MigrationTarget::state(&mut handle).unwrap(),
            DeviceState::Running,
            "the source runs again after: {err}"
        );
    }
}

/// `step_phase` shifts the workload's steps among the pre-copy batches: with one step every
/// 2^20 batches none falls in a short pre-copy, unless the phase puts it right after the first.
#[test]
fn the_step_phase_moves_the_workload_steps() {
    let steps_with = |phase: u64| {
        let synth = synth_cfg(1, 0);
        let mut c = cfg(Policy::OneShot);
        c.step_every_batches = 1 << 20;
        c.step_phase = phase;
        let vm = SyntheticVm::new(synth, SRC_AP, SRC_HID).unwrap();
        let (a, b) = mem_pair(1 << 16);
        let c2 = c.clone();
        let dest = thread::spawn(move || migrate_destination(factory(), b, &c2));
        let mut handle = source_handle(vm, &c).unwrap();
        let report = migrate_source(&mut handle, a, &c, &mut |_| {}).unwrap();
        dest.join().unwrap().unwrap();
        report.steps_during_precopy
    };
    assert_eq!(steps_with(0), 0);
    assert_eq!(steps_with((1 << 20) - 1), 1);
}
