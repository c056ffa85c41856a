//! The gmig vGPU as one VFIO migration device ([`VmDevice`]): it passes
//! `gmig_vfio_migration::conformance::check` — v2 and v1-emulation migrations with byte-identical
//! streams and identical results, an honest MIG_DATA_SIZE, any segmentation, truncation refused —
//! for every workload profile; a failed resume loses nothing; a restored vGPU migrates on.

use gmig_core::migration::{MigratableVm, MigrationConfig, Policy, SaveSettings, VmDevice};
use gmig_core::stream::StreamLimits;
use gmig_vfio_migration::conformance;
use gmig_vfio_migration::target::{self, MigrateOptions};
use gmig_vfio_migration::{DeviceState, MigrationHandle, MigrationTarget};
use gmig_vgpu::compare::compare_guest_visible;
use gmig_vgpu::gm::{VgpuSlices, VgpuType};
use gmig_vgpu::migratable::{VgpuFactory, VgpuVm};
use gmig_vgpu::workload::{Profile, WorkloadConfig};

const RAM: u64 = 32 << 20;
const TY: VgpuType = VgpuType::V5_8;

/// Source slices, and destination slices elsewhere in the GGTT (so every move remaps).
fn slices() -> (VgpuSlices, VgpuSlices) {
    gmig_test_support::moved_slices(TY)
}

fn factory(slices: VgpuSlices) -> VgpuFactory {
    VgpuFactory::new(gmig_cmdparser::Gen::Gen9, TY, slices, RAM)
}

fn settings(policy: Policy) -> SaveSettings {
    let mut c = MigrationConfig::new(policy);
    // One hashing thread: the hash pipeline's hand-overs then come in one order, so the v1 and
    // v2 streams can be compared byte for byte.
    c.hash_threads = 1;
    c.max_drain = gmig_core::migration::Drain::workloads(1);
    SaveSettings::from(&c)
}

fn booted(profile: Profile, seed: u64, s: VgpuSlices) -> VgpuVm {
    let mut vm = VgpuVm::boot(TY, s, RAM, profile, WorkloadConfig::small(), seed).unwrap();
    vm.run_steps(3).unwrap();
    vm
}

/// `make(0)`: a source vGPU mid-workload; `make(1)`: a destination device that already holds a
/// different running vGPU (another profile and seed, on the destination's slices), which the
/// stream must replace entirely.
fn maker(profile: Profile, policy: Policy) -> impl Fn(u64) -> VmDevice<VgpuFactory> {
    let (s, d) = slices();
    move |seed| {
        let (vm, f) = if seed == 0 {
            (booted(profile, 21, s), factory(d))
        } else {
            (booted(Profile::Idle, 99, d), factory(d))
        };
        VmDevice::new(Some(vm), f, StreamLimits::default(), settings(policy)).unwrap()
    }
}

/// A fresh device on `slices` holding no vGPU yet: only a stream will fill it.
fn fresh(slices: VgpuSlices) -> VmDevice<VgpuFactory> {
    VmDevice::new(
        None,
        factory(slices),
        StreamLimits::default(),
        settings(Policy::OneShot),
    )
    .unwrap()
}

fn same(a: &VmDevice<VgpuFactory>, b: &VmDevice<VgpuFactory>) -> bool {
    match (a.vm(), b.vm()) {
        (Some(x), Some(y)) => compare_guest_visible(x.vgpu(), y.vgpu()).is_identical(),
        _ => false,
    }
}

#[test]
fn the_vgpu_passes_the_vfio_conformance_check_for_every_profile() {
    for profile in Profile::ALL {
        for policy in [Policy::OneShotNarrow, Policy::OneShot] {
            let r = conformance::check(
                maker(profile, policy),
                |d| d.vm_mut().unwrap().run_steps(2).unwrap(),
                same,
                64 * 1024,
            )
            .unwrap_or_else(|e| panic!("{profile:?} {policy:?}: {e}"));
            eprintln!(
                "{profile:?} {policy:?}: {} stream bytes, {} pre-copy, {} stop-copy, \
                 MIG_DATA_SIZE {:.3}x",
                r.stream_bytes,
                r.precopy_bytes,
                r.stop_copy_bytes,
                r.estimate_ratio()
            );
            assert!(r.precopy_bytes > 0 && r.stop_copy_bytes > 0, "{r:?}");
        }
    }
}

/// Migrate a Desktop vGPU through `VmDevice`s over v2, then let both ends run the work the stop
/// left queued (the destination runs it from the stream); whether they end identical.
fn carried_work_matches(remap: bool) -> bool {
    let (s, d) = slices();
    let mut f = factory(d);
    f.opts.remap = remap;
    let mut src = MigrationHandle::new(
        VmDevice::new(
            Some(booted(Profile::Desktop, 4, s)),
            factory(d),
            StreamLimits::default(),
            settings(Policy::OneShot),
        )
        .unwrap(),
    )
    .unwrap();
    let mut dst = MigrationHandle::new(
        VmDevice::new(None, f, StreamLimits::default(), settings(Policy::OneShot)).unwrap(),
    )
    .unwrap();
    target::migrate(&mut src, &mut dst, MigrateOptions::default(), |_| Ok(())).unwrap();
    let mut a = src.into_device().into_vm().unwrap();
    let mut b = dst.into_device().into_vm().unwrap();
    let (ran_a, ran_b) = (a.run_queued(), b.run_queued());
    assert!(
        ran_a > 0,
        "the stop must leave work queued for this test to mean anything"
    );
    assert_eq!(ran_a, ran_b);
    compare_guest_visible(a.vgpu(), b.vgpu()).is_identical()
}

#[test]
fn carried_work_runs_identically_on_the_destination_only_with_remapping() {
    assert!(carried_work_matches(true));
    assert!(
        !carried_work_matches(false),
        "the negative control must differ"
    );
}

#[test]
fn a_bad_stream_leaves_the_held_vgpu_as_it_was_and_running() {
    let (_, d) = slices();
    // A good stream from a source on other slices.
    let mut src = MigrationHandle::new(maker(Profile::Desktop, Policy::OneShot)(0)).unwrap();
    let mut sink = MigrationHandle::new(maker(Profile::Desktop, Policy::OneShot)(1)).unwrap();
    let (stream, _) =
        target::migrate(&mut src, &mut sink, MigrateOptions::default(), |_| Ok(())).unwrap();

    let held = || {
        VmDevice::new(
            Some(booted(Profile::Video, 8, d)),
            factory(d),
            StreamLimits::default(),
            settings(Policy::OneShot),
        )
        .unwrap()
    };
    // The reference went through what the device did: a stop (its bounded drain), a resume.
    let mut reference = booted(Profile::Video, 8, d);
    reference
        .quiesce(gmig_core::migration::Drain::workloads(1))
        .unwrap();
    reference.unquiesce().unwrap();
    let mut flipped = stream.clone();
    let at = flipped.len() / 3;
    flipped[at] ^= 0x40;
    for (what, bytes) in [
        ("truncated", &stream[..stream.len() - 5]),
        ("flipped", &flipped[..]),
        ("empty", &stream[..0]),
    ] {
        let mut h = MigrationHandle::new(held()).unwrap();
        MigrationTarget::set_state(&mut h, DeviceState::Resuming).unwrap();
        // A corrupt byte may be refused as it is written or when the stream is closed.
        let loaded = MigrationTarget::write_data(&mut h, bytes)
            .and_then(|()| MigrationTarget::set_state(&mut h, DeviceState::Stop));
        assert!(loaded.is_err(), "{what} stream accepted");
        // The VMM gives up on the resume: a reset brings the device back to RUNNING.
        MigrationTarget::reset(&mut h).unwrap();
        assert_eq!(
            MigrationTarget::state(&mut h).unwrap(),
            DeviceState::Running
        );
        let dev = h.into_device();
        let vm = dev.vm().expect("the held vGPU is still there");
        let diff = compare_guest_visible(reference.vgpu(), vm.vgpu());
        assert!(diff.is_identical(), "{what}: {diff:?}");
        assert_eq!(vm.stream_header(), reference.stream_header(), "{what}");
    }
}

#[test]
fn a_restored_vgpu_migrates_on_through_v1_and_v2() {
    // A -> B over v2, then B (now holding the restored vGPU) -> C over v1 emulation, and back
    // to A's slices: each hop equals the original.
    let (s, d) = slices();
    let mut a = MigrationHandle::new(maker(Profile::Desktop, Policy::OneShotNarrow)(0)).unwrap();
    let mut b = MigrationHandle::new(fresh(d)).unwrap();
    target::migrate(&mut a, &mut b, MigrateOptions::default(), |_| Ok(())).unwrap();
    assert!(same(a.device(), b.device()));
    assert_eq!(
        b.device().vm().unwrap().stream_header().src_aperture_base,
        d.aperture.base.0
    );

    use gmig_vfio_migration::v1::V1Region;
    let mut v1b = V1Region::new(b, 4096);
    let mut wire = Vec::new();
    v1b.save(&mut wire, true, |_| Ok(())).unwrap();
    // B ran its carried work in the stop's drain; C must equal B as B was saved.
    let b = v1b.into_handle();
    let c = fresh(s);
    let mut v1c = V1Region::new(MigrationHandle::new(c).unwrap(), 4096);
    v1c.load(&mut wire.as_slice()).unwrap();
    let c = v1c.into_handle();
    assert_eq!(c.state(), DeviceState::Running);
    assert!(same(b.device(), c.device()));
    assert_eq!(
        c.device().vm().unwrap().stream_header().src_aperture_base,
        s.aperture.base.0
    );
}

#[test]
fn a_device_with_no_vgpu_refuses_to_save_and_stays_usable() {
    let (_, d) = slices();
    let dev = fresh(d);
    let mut h = MigrationHandle::new(dev).unwrap();
    assert!(MigrationTarget::set_state(&mut h, DeviceState::PreCopy).is_err());
    assert!(MigrationTarget::set_state(&mut h, DeviceState::StopCopy).is_err());
    assert!(MigrationTarget::stop_copy_size(&mut h).is_err());
    // It is still a working device: it stops, runs, and can resume a stream.
    MigrationTarget::set_state(&mut h, DeviceState::Stop).unwrap();
    MigrationTarget::set_state(&mut h, DeviceState::Resuming).unwrap();
}
/// Every guest RAM page, for comparing before and after.
fn ram_of(vm: &VgpuVm) -> Vec<u8> {
    use vm_memory::{Bytes, GuestAddress};
    let mut out = vec![0u8; RAM as usize];
    vm.memory().read_slice(&mut out, GuestAddress(0)).unwrap();
    out
}

fn pages_in_report(report: &[u64], first_page: u64) -> std::collections::BTreeSet<u64> {
    let mut out = std::collections::BTreeSet::new();
    for (w, word) in report.iter().enumerate() {
        for b in 0..64 {
            if word >> b & 1 == 1 {
                out.insert(first_page + w as u64 * 64 + b);
            }
        }
    }
    out
}

#[test]
fn dma_logging_reports_exactly_the_pages_the_running_vgpu_changed() {
    use gmig_vfio_migration::IovaRange;
    let (s, d) = slices();
    let mut dev = VmDevice::new(
        Some(booted(Profile::Desktop, 6, s)),
        factory(d),
        StreamLimits::default(),
        settings(Policy::OneShot),
    )
    .unwrap();
    // As QEMU does: two ranges of guest RAM, reported one at a time.
    let half = RAM / 2;
    let ranges = [
        IovaRange {
            iova: 0,
            length: half,
        },
        IovaRange {
            iova: half,
            length: half,
        },
    ];
    let mut h = MigrationHandle::new(dev).unwrap();
    assert_eq!(h.dma_logging_start(4096, &ranges).unwrap(), 4096);
    // Started twice is refused, and the log keeps running.
    assert!(h.dma_logging_start(4096, &ranges).is_err());
    let before = ram_of(h.device().vm().unwrap());
    h.device_mut().vm_mut().unwrap().run_steps(3).unwrap();
    let after = ram_of(h.device().vm().unwrap());
    let changed: std::collections::BTreeSet<u64> = before
        .chunks(4096)
        .zip(after.chunks(4096))
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, _)| i as u64)
        .collect();
    assert!(!changed.is_empty(), "the workload must write guest memory");
    let mut reported = pages_in_report(&h.dma_logging_report(0, half, 4096).unwrap(), 0);
    reported.extend(pages_in_report(
        &h.dma_logging_report(half, half, 4096).unwrap(),
        half / 4096,
    ));
    assert_eq!(reported, changed);
    // Read-and-clear: nothing ran since, so nothing more to report.
    assert!(h
        .dma_logging_report(0, RAM, 4096)
        .unwrap()
        .iter()
        .all(|w| *w == 0));
    // A coarser report page covers the same writes.
    h.device_mut().vm_mut().unwrap().run_steps(1).unwrap();
    let coarse = h.dma_logging_report(0, RAM, 1 << 16).unwrap();
    assert!(coarse.iter().any(|w| *w != 0));
    h.dma_logging_stop().unwrap();
    assert!(h.dma_logging_report(0, RAM, 4096).is_err());
    assert!(h.dma_logging_stop().is_err());
    dev = h.into_device();
    assert!(dev.vm().is_some());

    // A device holding no vGPU has nothing to log.
    let mut empty = MigrationHandle::new(fresh(d)).unwrap();
    assert!(empty.dma_logging_start(4096, &ranges).is_err());
    // Bad ranges are refused as the kernel refuses them.
    let mut h = MigrationHandle::new(dev).unwrap();
    assert!(h
        .dma_logging_start(
            4096,
            &[IovaRange {
                iova: 1,
                length: 4096
            }]
        )
        .is_err());
    assert!(h.dma_logging_start(4096, &[]).is_err());
}

#[test]
fn a_resume_while_dma_logging_reports_every_logged_page() {
    use gmig_vfio_migration::IovaRange;
    let mut src = MigrationHandle::new(maker(Profile::Idle, Policy::OneShot)(0)).unwrap();
    let mut h = MigrationHandle::new(maker(Profile::Idle, Policy::OneShot)(1)).unwrap();
    let all = [IovaRange {
        iova: 0,
        length: RAM,
    }];
    h.dma_logging_start(4096, &all).unwrap();
    assert!(h
        .dma_logging_report(0, RAM, 4096)
        .unwrap()
        .iter()
        .all(|w| *w == 0));
    target::migrate(&mut src, &mut h, MigrateOptions::default(), |_| Ok(())).unwrap();
    let report = h.dma_logging_report(0, RAM, 4096).unwrap();
    assert_eq!(pages_in_report(&report, 0).len() as u64, RAM / 4096);
}

/// A VMM may leave PRE_COPY for STOP_COPY before the first pass is read out (QEMU does when the
/// downtime limit allows it). The pages pre-copy never sent must still travel: the destination
/// equals the source, guest memory included, for both policies and whether pre-copy sent
/// nothing, one chunk, or a few.
#[test]
fn a_stop_before_the_first_pass_is_read_out_still_sends_every_page() {
    use gmig_vfio_migration::ReadOutcome;
    let (s, d) = slices();
    for policy in [Policy::OneShot, Policy::OneShotNarrow] {
        for chunks in [0usize, 1, 5] {
            let mut src = MigrationHandle::new(
                VmDevice::new(
                    Some(booted(Profile::Desktop, 8, s)),
                    factory(d),
                    StreamLimits::default(),
                    settings(policy),
                )
                .unwrap(),
            )
            .unwrap();
            let mut stream = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            let id = src
                .set_state(DeviceState::PreCopy)
                .unwrap()
                .new_stream
                .unwrap()
                .id;
            for _ in 0..chunks {
                match src.read(id, &mut buf).unwrap() {
                    ReadOutcome::Data(n) => stream.extend_from_slice(&buf[..n]),
                    other => panic!("pre-copy ended early: {other:?}"),
                }
            }
            assert!(
                src.precopy_info(id).unwrap().initial_bytes > 0,
                "pass not finished"
            );
            src.device_mut().vm_mut().unwrap().run_steps(1).unwrap();
            src.set_state(DeviceState::StopCopy).unwrap();
            loop {
                match src.read(id, &mut buf).unwrap() {
                    ReadOutcome::Data(0) | ReadOutcome::End => break,
                    ReadOutcome::Data(n) => stream.extend_from_slice(&buf[..n]),
                    other => panic!("stop-copy: {other:?}"),
                }
            }
            src.set_state(DeviceState::Stop).unwrap();
            let mut dst = MigrationHandle::new(fresh(d)).unwrap();
            let rid = dst
                .set_state(DeviceState::Resuming)
                .unwrap()
                .new_stream
                .unwrap()
                .id;
            dst.write(rid, &stream).unwrap();
            dst.set_state(DeviceState::Stop).unwrap();
            let (a, b) = (src.device().vm().unwrap(), dst.device().vm().unwrap());
            assert!(
                compare_guest_visible(a.vgpu(), b.vgpu()).is_identical(),
                "{policy:?} after {chunks} chunks"
            );
            let mut ma = vec![0u8; RAM as usize];
            let mut mb = vec![0u8; RAM as usize];
            use vm_memory::{Bytes, GuestAddress};
            a.memory().read_slice(&mut ma, GuestAddress(0)).unwrap();
            b.memory().read_slice(&mut mb, GuestAddress(0)).unwrap();
            assert!(
                ma == mb,
                "{policy:?} after {chunks} chunks: guest memory differs"
            );
        }
    }
}
