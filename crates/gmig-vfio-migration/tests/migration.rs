//! Migrating devices end to end: v2 in process, v1 emulation, the kernel driver over its mock;
//! stream validation, segmentation, MIG_DATA_SIZE honesty and failure recovery.

use gmig_vfio_migration::handle::HandleError;
use gmig_vfio_migration::kernel::mock::{Call, CallKind, MockVfio};
use gmig_vfio_migration::kernel::KernelError;
use gmig_vfio_migration::state::ArcKind;
use gmig_vfio_migration::target::{self, MigrateOptions, MigrationReport};
use gmig_vfio_migration::testdev::{BlobDevice, Faulty};
use gmig_vfio_migration::v1::{self, V1Region};
use gmig_vfio_migration::{
    DeviceError, DeviceState, KernelDevice, MigrationDevice, MigrationFeatures, MigrationHandle,
    MigrationTarget, ReadOutcome, StreamId, TargetError,
};
use proptest::prelude::*;

const LEN: usize = 40_000;
const CHUNK: usize = 1024;

fn blob(f: MigrationFeatures, seed: u64) -> BlobDevice {
    BlobDevice::new(LEN, CHUNK, seed, f)
}

fn handle(f: MigrationFeatures, seed: u64) -> MigrationHandle<BlobDevice> {
    MigrationHandle::new(blob(f, seed)).unwrap()
}

/// Moves `h` to `state` (RESUMING or STOP_COPY) and returns the id of the data stream it opens.
fn open_stream<D: MigrationDevice>(h: &mut MigrationHandle<D>, state: DeviceState) -> StreamId {
    h.set_state(state).unwrap().new_stream.unwrap().id
}

/// Migrates through v2 with `ticks` writes between the pre-copy pass and stop-copy.
fn migrate_v2(
    f: MigrationFeatures,
    ticks: usize,
    chunk: usize,
) -> (Vec<u8>, MigrationReport, Vec<u8>, Vec<u8>) {
    let mut src = handle(f, 11);
    let mut dst = handle(f, 99);
    let opts = MigrateOptions {
        chunk,
        ..MigrateOptions::default()
    };
    let (stream, report) = target::migrate(&mut src, &mut dst, opts, |s| {
        s.device_mut().tick(ticks);
        Ok(())
    })
    .unwrap();
    assert_eq!(src.state(), DeviceState::Stop);
    assert_eq!(dst.state(), DeviceState::Running);
    (
        stream,
        report,
        src.device().blob().to_vec(),
        dst.device().blob().to_vec(),
    )
}

fn migrate_v1(
    f: MigrationFeatures,
    ticks: usize,
    window: usize,
) -> (Vec<u8>, u64, Vec<u8>, Vec<u8>) {
    let mut src = V1Region::new(handle(f, 11), window);
    let mut dst = V1Region::new(handle(f, 99), window);
    let mut stream = Vec::new();
    let (_pre, stop) = src
        .save(&mut stream, true, |r| {
            r.handle().device_mut().tick(ticks);
            Ok(())
        })
        .unwrap();
    assert_eq!(src.device_state(), 0);
    dst.load(&mut stream.as_slice()).unwrap();
    assert_eq!(dst.device_state(), 1);
    (
        stream,
        stop,
        src.handle().device().blob().to_vec(),
        dst.handle().device().blob().to_vec(),
    )
}

#[test]
fn v2_and_v1_emulation_migrate_identically() {
    for f in MigrationFeatures::COMBINATIONS {
        for ticks in [0, 7, 200] {
            let (s2, report, src2, dst2) = migrate_v2(f, ticks, 4096);
            let (s1, stop1, src1, dst1) = migrate_v1(f, ticks, 3000);
            assert_eq!(
                dst2, src2,
                "{f} ticks {ticks}: v2 destination differs from source"
            );
            assert_eq!(
                dst1, src1,
                "{f} ticks {ticks}: v1 destination differs from source"
            );
            assert_eq!(src1, src2, "{f}: sources diverged");
            assert_eq!(s1, s2, "{f} ticks {ticks}: v1 and v2 streams differ");
            assert_eq!(stop1, report.stop_copy_bytes, "{f} ticks {ticks}");
            if f.contains(MigrationFeatures::PRE_COPY) {
                assert!(report.precopy_bytes > LEN as u64);
            } else {
                assert_eq!(report.precopy_bytes, 0);
            }
        }
    }
}

#[test]
fn source_changes_while_running_and_freezes_when_stopped() {
    let mut h = handle(MigrationFeatures::ALL, 3);
    let before = h.device().blob().to_vec();
    assert!(h.device_mut().tick(10));
    assert_ne!(h.device().blob(), &before[..]);
    h.set_state(DeviceState::Stop).unwrap();
    let frozen = h.device().blob().to_vec();
    assert!(!h.device_mut().tick(10));
    assert_eq!(h.device().blob(), &frozen[..]);
}

#[test]
fn mig_data_size_is_an_honest_upper_bound() {
    let mut worst = 1.0f64;
    for f in MigrationFeatures::COMBINATIONS {
        for ticks in [0, 1, 5, 50, 500] {
            let (_, r, _, _) = migrate_v2(f, ticks, 1000);
            assert!(r.stop_copy_bytes > 0);
            assert!(
                r.stop_copy_estimate >= r.stop_copy_bytes,
                "{f} ticks {ticks}: estimate {} below actual {}",
                r.stop_copy_estimate,
                r.stop_copy_bytes
            );
            assert!(
                r.stop_copy_estimate <= 2 * r.stop_copy_bytes,
                "{f} ticks {ticks}: estimate {} over 2x actual {}",
                r.stop_copy_estimate,
                r.stop_copy_bytes
            );
            worst = worst.max(r.stop_copy_estimate as f64 / r.stop_copy_bytes as f64);
        }
    }
    eprintln!("MIG_DATA_SIZE estimate / actual stop-copy bytes: worst ratio {worst:.3}");
}

#[test]
fn corrupt_truncated_or_foreign_streams_fail_resuming_to_stop() {
    let f = MigrationFeatures::ALL;
    let (good, _, src_blob, _) = migrate_v2(f, 5, 4096);
    let mut bad_sum = good.clone();
    let last = bad_sum.len() - 1;
    bad_sum[last] ^= 1;
    let mut bad_data = good.clone();
    bad_data[100] ^= 0x80;
    let mut trailing = good.clone();
    trailing.push(0);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("truncated", good[..good.len() / 2].to_vec()),
        ("no end record", good[..good.len() - 9].to_vec()),
        ("bad checksum", bad_sum),
        ("flipped data bit", bad_data),
        ("trailing byte", trailing),
        ("bad magic", [b"XXXX".as_slice(), &good[4..]].concat()),
    ];
    for (what, bytes) in cases {
        let mut dst = handle(f, 99);
        let before = dst.device().blob().to_vec();
        let id = open_stream(&mut dst, DeviceState::Resuming);
        dst.write(id, &bytes).unwrap();
        match dst.set_state(DeviceState::Running) {
            Err(HandleError::ArcFailed {
                from: DeviceState::Resuming,
                now: DeviceState::Resuming,
                source: DeviceError::BadStream { .. },
                ..
            }) => {}
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(dst.device().blob(), &before[..], "{what}: partial load");
        dst.reset().unwrap();
        // v1 emulation reports the same failure on its `_RUNNING` write.
        let mut r = V1Region::new(handle(f, 99), 2048);
        assert!(
            r.load(&mut bytes.as_slice()).is_err(),
            "{what}: v1 accepted"
        );
        assert_eq!(r.handle().device().blob(), &before[..]);
    }
    // A stream from a device of another size is refused too.
    let mut other = MigrationHandle::new(BlobDevice::new(LEN + 1, CHUNK, 1, f)).unwrap();
    let id = open_stream(&mut other, DeviceState::Resuming);
    other.write(id, &good).unwrap();
    assert!(other.set_state(DeviceState::Stop).is_err());
    // And the good stream loads.
    let mut dst = handle(f, 99);
    let id = open_stream(&mut dst, DeviceState::Resuming);
    dst.write(id, &good).unwrap();
    dst.set_state(DeviceState::Running).unwrap();
    assert_eq!(dst.device().blob(), &src_blob[..]);
}

#[test]
fn resuming_input_is_bounded() {
    let mut dst = handle(MigrationFeatures::STOP_COPY, 1);
    let id = open_stream(&mut dst, DeviceState::Resuming);
    let big = vec![0u8; 1 << 20];
    let mut err = None;
    for _ in 0..4 {
        if let Err(e) = dst.write(id, &big) {
            err = Some(e);
            break;
        }
    }
    assert!(matches!(
        err,
        Some(HandleError::Device(DeviceError::StreamTooLarge { .. }))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any read sizes on the source and any write segmentation on the destination give the same
    /// device state: only byte order matters.
    #[test]
    fn segmentation_never_matters(
        fi in 0usize..4,
        read_sizes in prop::collection::vec(1usize..5000, 1..20),
        cuts in prop::collection::vec(0usize..60_000, 0..30),
        ticks in 0usize..50,
    ) {
        let f = MigrationFeatures::COMBINATIONS[fi];
        let (reference, _, src_blob, _) = migrate_v2(f, ticks, 4096);
        // Re-run the source with the random read sizes.
        let mut src = handle(f, 11);
        let mut stream = Vec::new();
        let mut k = 0;
        let mut read_all = |h: &mut MigrationHandle<BlobDevice>, stream: &mut Vec<u8>| {
            let id = h.open_stream().unwrap().id;
            loop {
                let mut buf = vec![0u8; read_sizes[k % read_sizes.len()]];
                k += 1;
                match h.read(id, &mut buf).unwrap() {
                    ReadOutcome::Data(n) => stream.extend_from_slice(&buf[..n]),
                    ReadOutcome::NoDataNow | ReadOutcome::End => break,
                }
            }
        };
        if f.contains(MigrationFeatures::PRE_COPY) {
            src.set_state(DeviceState::PreCopy).unwrap();
            read_all(&mut src, &mut stream);
        }
        src.device_mut().tick(ticks);
        src.set_state(DeviceState::StopCopy).unwrap();
        read_all(&mut src, &mut stream);
        prop_assert_eq!(&stream, &reference);
        // Write it with random cuts.
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (stream.len() + 1)).collect();
        cuts.push(0);
        cuts.push(stream.len());
        cuts.sort_unstable();
        let mut dst = handle(f, 99);
        let id = open_stream(&mut dst, DeviceState::Resuming);
        for w in cuts.windows(2) {
            dst.write(id, &stream[w[0]..w[1]]).unwrap();
        }
        dst.set_state(DeviceState::Running).unwrap();
        prop_assert_eq!(dst.device().blob(), &src_blob[..]);
    }
}

#[test]
fn migrate_recovers_after_injected_failures() {
    let f = MigrationFeatures::ALL;
    let mk = |seed| MigrationHandle::new(Faulty::new(blob(f, seed))).unwrap();
    // Fatal failure while entering STOP_COPY: the source is in ERROR, the migration fails.
    let mut src = mk(11);
    let mut dst = mk(99);
    src.device_mut()
        .fail_next(ArcKind::PreCopyToStopCopy, false);
    let e = target::migrate(&mut src, &mut dst, MigrateOptions::default(), |_| Ok(())).unwrap_err();
    assert!(matches!(
        e,
        TargetError::Handle(HandleError::ArcFailed {
            now: DeviceState::Error,
            ..
        })
    ));
    assert_eq!(src.state(), DeviceState::Error);
    // Reset and retry: the migration completes and the destination matches.
    src.reset().unwrap();
    target::migrate(&mut src, &mut dst, MigrateOptions::default(), |_| Ok(())).unwrap();
    assert_eq!(dst.device().inner.blob(), src.device().inner.blob());

    // Rolled-back failure on the destination's RESUMING -> STOP: it stays in RESUMING.
    let mut src = mk(12);
    let mut dst = mk(98);
    dst.device_mut().fail_next(ArcKind::FinishResuming, true);
    let e = target::migrate(&mut src, &mut dst, MigrateOptions::default(), |_| Ok(())).unwrap_err();
    assert!(matches!(
        e,
        TargetError::Handle(HandleError::ArcFailed {
            now: DeviceState::Resuming,
            ..
        })
    ));
    assert_eq!(dst.state(), DeviceState::Resuming);
    // The buffered stream is intact: finishing again succeeds.
    dst.set_state(DeviceState::Running).unwrap();
    assert_eq!(dst.device().inner.blob(), src.device().inner.blob());

    // A failing read surfaces as a device error and changes no state.
    let mut src = mk(13);
    let id = open_stream(&mut src, DeviceState::StopCopy);
    src.device_mut().fail_reads(true);
    let mut b = [0u8; 16];
    assert!(matches!(src.read(id, &mut b), Err(HandleError::Device(_))));
    assert_eq!(src.state(), DeviceState::StopCopy);
    src.device_mut().fail_reads(false);
    assert!(matches!(src.read(id, &mut b), Ok(ReadOutcome::Data(16))));
}

fn kdev(f: MigrationFeatures, seed: u64) -> KernelDevice<MockVfio<BlobDevice>> {
    KernelDevice::new(MockVfio::new(blob(f, seed)).unwrap()).unwrap()
}

#[test]
fn kernel_driver_migrates_like_the_in_process_handle() {
    for f in MigrationFeatures::COMBINATIONS {
        let (reference, ref_report, src_blob, _) = migrate_v2(f, 9, 4096);
        let mut src = kdev(f, 11);
        let mut dst = kdev(f, 99);
        let (stream, report) =
            target::migrate(&mut src, &mut dst, MigrateOptions::default(), |s| {
                s.ops_mut().handle().device_mut().tick(9);
                Ok(())
            })
            .unwrap();
        assert_eq!(stream, reference, "{f}");
        assert_eq!(report, ref_report, "{f}");
        assert_eq!(dst.ops_mut().handle().device().blob(), &src_blob[..]);
        // The ioctl sequence is what QEMU issues.
        let expected: Vec<u32> = if f == MigrationFeatures::ALL {
            vec![6, 7, 3, 1]
        } else if f.contains(MigrationFeatures::PRE_COPY) {
            vec![6, 3, 1]
        } else if f.contains(MigrationFeatures::P2P) {
            vec![5, 1, 3, 1]
        } else {
            vec![1, 3, 1]
        };
        assert_eq!(src.ops().set_state_calls(), expected, "{f}");
        assert_eq!(dst.ops().set_state_calls(), vec![4, 2], "{f}");
        assert_eq!(src.streams_opened(), 1);
        assert_eq!(dst.streams_opened(), 1);
        // Every read the source saw went through the data fd; none after the stream ended.
        let reads = src
            .ops()
            .calls
            .iter()
            .filter(|c| matches!(c, Call::Read(_)))
            .count();
        assert!(reads >= 2, "{f}: {reads} reads");
    }
}

#[test]
fn kernel_driver_failure_paths() {
    let f = MigrationFeatures::ALL;
    // No v2 support.
    let m = MockVfio::new(blob(f, 1)).unwrap().without_migration();
    assert!(matches!(
        KernelDevice::new(m),
        Err(KernelError::NotMigratable)
    ));

    // A refused request issues no SET ioctl.
    let mut k =
        KernelDevice::new(MockVfio::new(blob(MigrationFeatures::STOP_COPY, 1)).unwrap()).unwrap();
    assert!(matches!(
        k.set_state(DeviceState::PreCopy),
        Err(KernelError::Refused(_))
    ));
    assert!(k.ops().set_state_calls().is_empty());

    // SET fails in the kernel before the device moves: the driver reads the state back.
    let mut k = kdev(f, 1);
    k.set_state(DeviceState::PreCopy).unwrap();
    k.ops_mut().fail_next(CallKind::SetState, libc::EIO);
    match k.set_state(DeviceState::StopCopy) {
        Err(KernelError::SetState {
            now, errno, from, ..
        }) => {
            assert_eq!(
                (now, errno, from),
                (DeviceState::PreCopy, Some(libc::EIO), DeviceState::PreCopy)
            );
        }
        other => panic!("{other:?}"),
    }
    // vfio-ioctls dropped the data fd: reads report no stream.
    assert!(!k.stream_open());
    let mut b = [0u8; 8];
    assert!(matches!(k.read(&mut b), Err(KernelError::NoStream { .. })));

    // SET fails and GET fails too: the state is unknown, reported as ERROR.
    let mut k = kdev(f, 1);
    k.ops_mut().fail_next(CallKind::SetState, libc::EIO);
    k.ops_mut().fail_next(CallKind::GetState, libc::EIO);
    assert!(matches!(
        k.set_state(DeviceState::Stop),
        Err(KernelError::SetState {
            now: DeviceState::Error,
            ..
        })
    ));

    // The device fails an arc fatally: the kernel answers EIO and reports ERROR; reset recovers.
    let mut k = KernelDevice::new(MockVfio::new(Faulty::new(blob(f, 1))).unwrap()).unwrap();
    k.ops_mut()
        .handle()
        .device_mut()
        .fail_next(ArcKind::Stop, false);
    assert!(matches!(
        k.set_state(DeviceState::StopCopy),
        Err(KernelError::SetState {
            now: DeviceState::Error,
            errno: Some(libc::EIO),
            ..
        })
    ));
    assert!(matches!(
        k.set_state(DeviceState::Running),
        Err(KernelError::Refused(_))
    ));
    MigrationTarget::reset(&mut k).unwrap();
    assert_eq!(k.state(), DeviceState::Running);
    k.set_state(DeviceState::StopCopy).unwrap();

    // Read errors other than ENOMSG surface with their errno.
    let mut k = kdev(f, 1);
    k.set_state(DeviceState::StopCopy).unwrap();
    k.ops_mut().fail_next(CallKind::Read, libc::EIO);
    match k.read(&mut b) {
        Err(KernelError::Op { op: "read", source }) => {
            assert_eq!(source.raw_os_error(), Some(libc::EIO));
        }
        other => panic!("{other:?}"),
    }
    // ENOMSG is "no data now".
    let mut k = kdev(f, 1);
    k.set_state(DeviceState::PreCopy).unwrap();
    k.ops_mut().fail_next(CallKind::Read, libc::ENOMSG);
    assert_eq!(k.read(&mut b).unwrap(), ReadOutcome::NoDataNow);
    // PRECOPY_INFO outside a stream.
    let mut k = kdev(f, 1);
    assert!(matches!(
        k.precopy_info(),
        Err(KernelError::NoStream { .. })
    ));
    // Write without RESUMING.
    assert!(matches!(k.write(b"x"), Err(KernelError::NoStream { .. })));
}

#[test]
fn v1_region_layout_and_access_rules() {
    use v1::*;
    assert_eq!(
        (
            OFF_DEVICE_STATE,
            OFF_RESERVED,
            OFF_PENDING_BYTES,
            OFF_DATA_OFFSET,
            OFF_DATA_SIZE,
            HEADER_SIZE
        ),
        (0, 4, 8, 16, 24, 32)
    );
    assert_eq!(v2_target(1).unwrap(), DeviceState::Running);
    assert_eq!(v2_target(3).unwrap(), DeviceState::PreCopy);
    assert_eq!(v2_target(2).unwrap(), DeviceState::StopCopy);
    assert_eq!(v2_target(0).unwrap(), DeviceState::Stop);
    assert_eq!(v2_target(4).unwrap(), DeviceState::Resuming);
    for bad in [5u32, 6, 7] {
        assert!(matches!(v2_target(bad), Err(V1Error::InvalidState(_))));
    }
    for s in DeviceState::ALL {
        if s != DeviceState::Error {
            let back = v2_target(v1_bits(s)).unwrap();
            assert_eq!(v1_bits(back), v1_bits(s));
        }
    }
    assert_eq!(v1_bits(DeviceState::Error), 6);

    let mut r = V1Region::new(handle(MigrationFeatures::ALL, 1), 4096);
    assert_eq!(r.region_size(), 8192);
    let mut b8 = [0u8; 8];
    let mut b4 = [0u8; 4];
    r.read(OFF_DEVICE_STATE, &mut b4).unwrap();
    assert_eq!(u32::from_le_bytes(b4), 1);
    // pending_bytes while running, misaligned or mis-sized accesses, read-only fields.
    assert!(matches!(
        r.read(OFF_PENDING_BYTES, &mut b8),
        Err(V1Error::WrongPhase { .. })
    ));
    assert!(matches!(
        r.read(OFF_DEVICE_STATE, &mut b8),
        Err(V1Error::BadAccess { .. })
    ));
    assert!(matches!(r.read(9, &mut b4), Err(V1Error::BadAccess { .. })));
    assert!(matches!(
        r.write(OFF_PENDING_BYTES, &b8),
        Err(V1Error::ReadOnly(8))
    ));
    assert!(matches!(
        r.read(8192 - 2, &mut b4),
        Err(V1Error::BadAccess { .. })
    ));
    assert!(matches!(
        r.write(OFF_DEVICE_STATE, &7u32.to_le_bytes()),
        Err(V1Error::InvalidState(7))
    ));
    // data_size larger than the window is refused while resuming.
    r.write(OFF_DEVICE_STATE, &4u32.to_le_bytes()).unwrap();
    assert!(matches!(
        r.write(OFF_DATA_SIZE, &(1u64 << 40).to_le_bytes()),
        Err(V1Error::TooLarge { .. })
    ));
    // A failed transition reads back as v1's error state; reset returns to _RUNNING.
    let mut r = V1Region::new(
        MigrationHandle::new(Faulty::new(blob(MigrationFeatures::ALL, 1))).unwrap(),
        4096,
    );
    r.handle()
        .device_mut()
        .fail_next(ArcKind::StartPreCopy, false);
    assert!(r.write(OFF_DEVICE_STATE, &3u32.to_le_bytes()).is_err());
    r.read(OFF_DEVICE_STATE, &mut b4).unwrap();
    assert_eq!(u32::from_le_bytes(b4), V1_ERROR_STATE);
    r.reset().unwrap();
    assert_eq!(r.device_state(), 1);
}

#[test]
fn real_kernel_device_when_available() {
    if !std::path::Path::new("/dev/vfio/vfio").exists() {
        eprintln!("SKIPPED: real_kernel_device_when_available needs /dev/vfio (see docs/vfio-migration.md)");
        return;
    }
    let (Ok(src), Ok(dst)) = (
        std::env::var("GMIG_VFIO_SRC"),
        std::env::var("GMIG_VFIO_DST"),
    ) else {
        eprintln!("SKIPPED: real_kernel_device_when_available needs GMIG_VFIO_SRC and GMIG_VFIO_DST (sysfs paths of two mtty mdevs)");
        return;
    };
    let mut s = KernelDevice::open(std::path::Path::new(&src)).expect("open source");
    let mut d = KernelDevice::open(std::path::Path::new(&dst)).expect("open destination");
    assert!(s.features().contains(MigrationFeatures::STOP_COPY));
    let est = s.stop_copy_size().expect("MIG_DATA_SIZE");
    let (stream, report) =
        target::migrate(&mut s, &mut d, MigrateOptions::default(), |_| Ok(())).expect("migrate");
    eprintln!(
        "kernel device migrated: {} bytes ({} pre-copy, {} stop-copy, estimate {est})",
        stream.len(),
        report.precopy_bytes,
        report.stop_copy_bytes
    );
    assert!(report.stop_copy_estimate >= report.stop_copy_bytes);
    assert_eq!(d.state(), DeviceState::Running);
}

#[test]
fn blob_device_passes_the_conformance_check() {
    use gmig_vfio_migration::conformance;
    for f in MigrationFeatures::COMBINATIONS {
        let r = conformance::check(
            |seed| blob(f, 11 + seed * 88),
            |d| {
                d.tick(25);
            },
            |a, b| a.blob() == b.blob(),
            3000,
        )
        .unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(r.stop_copy_bytes > 0);
        assert!((1.0..=2.0).contains(&r.estimate_ratio()));
    }
    // A device that under-reports MIG_DATA_SIZE fails it.
    struct Liar(BlobDevice);
    impl gmig_vfio_migration::RunControl for Liar {
        fn stop(&mut self) -> gmig_vfio_migration::ArcResult {
            self.0.stop()
        }
        fn run(&mut self) -> gmig_vfio_migration::ArcResult {
            self.0.run()
        }
        fn reset(&mut self) -> gmig_vfio_migration::device::Result<()> {
            gmig_vfio_migration::RunControl::reset(&mut self.0)
        }
    }
    impl gmig_vfio_migration::StateSaver for Liar {
        fn start_stop_copy(&mut self) -> gmig_vfio_migration::ArcResult {
            self.0.start_stop_copy()
        }
        fn save_read(&mut self, buf: &mut [u8]) -> gmig_vfio_migration::device::Result<usize> {
            self.0.save_read(buf)
        }
        fn stop_copy_size(&mut self) -> gmig_vfio_migration::device::Result<u64> {
            Ok(self.0.stop_copy_size()? / 2)
        }
    }
    impl gmig_vfio_migration::StateLoader for Liar {
        fn resume_write(&mut self, data: &[u8]) -> gmig_vfio_migration::device::Result<()> {
            self.0.resume_write(data)
        }
        fn finish_resuming(&mut self) -> gmig_vfio_migration::ArcResult {
            self.0.finish_resuming()
        }
    }
    impl gmig_vfio_migration::DirtyLogging for Liar {}
    impl gmig_vfio_migration::MigrationDevice for Liar {}
    let e = conformance::check(
        |seed| Liar(blob(MigrationFeatures::STOP_COPY, 11 + seed)),
        |_| {},
        |a, b| a.0.blob() == b.0.blob(),
        3000,
    )
    .unwrap_err();
    assert!(
        matches!(e, conformance::ConformanceError::DishonestEstimate { .. }),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Untrusted stream bytes never panic the loader: random bytes and random mutations of a
    /// valid stream are either loaded or refused with a typed error, leaving the state intact.
    #[test]
    fn loader_never_panics_on_untrusted_bytes(
        junk in prop::collection::vec(any::<u8>(), 0..300),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..8),
        cut in any::<usize>(),
    ) {
        let f = MigrationFeatures::STOP_COPY;
        let small = |seed| BlobDevice::new(2000, 100, seed, f);
        let mut src = MigrationHandle::new(small(5)).unwrap();
        let id = open_stream(&mut src, DeviceState::StopCopy);
        let mut good = Vec::new();
        let mut buf = [0u8; 777];
        while let ReadOutcome::Data(n) = src.read(id, &mut buf).unwrap() {
            good.extend_from_slice(&buf[..n]);
        }
        let mut mutated = good.clone();
        for (at, x) in flips {
            let i = at % mutated.len();
            mutated[i] ^= x;
        }
        mutated.truncate(cut % (mutated.len() + 1));
        for bytes in [junk, mutated] {
            let mut dst = MigrationHandle::new(small(6)).unwrap();
            let before = dst.device().blob().to_vec();
            let id = open_stream(&mut dst, DeviceState::Resuming);
            dst.write(id, &bytes).unwrap();
            match dst.set_state(DeviceState::Stop) {
                Ok(_) => prop_assert_eq!(dst.device().blob(), src.device().blob()),
                Err(HandleError::ArcFailed { source: DeviceError::BadStream { .. }, now, .. }) => {
                    prop_assert_eq!(now, DeviceState::Resuming);
                    prop_assert_eq!(dst.device().blob(), &before[..]);
                }
                Err(e) => prop_assert!(false, "unexpected {}", e),
            }
        }
    }

    /// Arbitrary v1 region accesses never panic; they succeed or give a typed error.
    #[test]
    fn v1_region_accesses_never_panic(
        ops in prop::collection::vec((any::<bool>(), 0u64..9000, 0usize..20, any::<u32>()), 1..40),
    ) {
        let mut r = V1Region::new(handle(MigrationFeatures::ALL, 1), 4096);
        for (write, offset, len, val) in ops {
            let offset = match offset % 5 { 0 => 0, 1 => 8, 2 => 16, 3 => 24, _ => offset };
            if write {
                let mut data = vec![0u8; len];
                for (i, b) in data.iter_mut().enumerate() {
                    *b = (val >> ((i % 4) * 8)) as u8 & 7;
                }
                let _ = r.write(offset, &data);
            } else {
                let mut data = vec![0u8; len];
                let _ = r.read(offset, &mut data);
            }
            let s = r.device_state();
            prop_assert!(s <= 7);
        }
    }
}

#[test]
fn engine_drives_gmig_and_kernel_devices_through_one_dyn_interface() {
    let f = MigrationFeatures::ALL;
    let mut devices: Vec<Box<dyn MigrationTarget>> = vec![
        Box::new(handle(f, 11)),
        Box::new(kdev(f, 11)),
        Box::new(handle(f, 99)),
        Box::new(kdev(f, 99)),
    ];
    let mut streams = Vec::new();
    // Sources 0 and 1 migrate into destinations 3 and 2 (crossing the kinds).
    for (s, d) in [(0usize, 3usize), (1, 2)] {
        let (a, b) = devices.split_at_mut(2);
        let src = &mut *a[s];
        let dst = &mut *b[d - 2];
        let (stream, _) = target::migrate(src, dst, MigrateOptions::default(), |_| Ok(())).unwrap();
        assert_eq!(dst.state().unwrap(), DeviceState::Running);
        streams.push(stream);
    }
    assert_eq!(streams[0], streams[1]);
}
