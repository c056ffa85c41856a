//! DMA dirty logging: the kernel's argument checks, read-and-clear reports at any page size,
//! and the path through the kernel driver's seam.

use std::collections::BTreeSet;

use gmig_vfio_migration::dma_log::{DmaLogError, DmaLogSlot, DmaLogger, MAX_RANGES};
use gmig_vfio_migration::kernel::mock::{CallKind, MockVfio};
use gmig_vfio_migration::kernel::KernelError;
use gmig_vfio_migration::testdev::BlobDevice;
use gmig_vfio_migration::{IovaRange, KernelDevice, MigrationFeatures};
use proptest::prelude::*;

const K4: u64 = 4096;

fn r(iova: u64, length: u64) -> IovaRange {
    IovaRange { iova, length }
}

fn bits(v: &[u64]) -> Vec<u64> {
    let mut out = Vec::new();
    for (w, word) in v.iter().enumerate() {
        for b in 0..64 {
            if word & (1 << b) != 0 {
                out.push((w * 64 + b) as u64);
            }
        }
    }
    out
}

#[test]
fn start_checks_like_the_kernel() {
    assert_eq!(
        DmaLogger::start(K4, &[]).unwrap_err(),
        DmaLogError::NoRanges
    );
    let many: Vec<IovaRange> = (0..=MAX_RANGES as u64).map(|i| r(i * 2 * K4, K4)).collect();
    assert_eq!(
        DmaLogger::start(K4, &many).unwrap_err(),
        DmaLogError::TooManyRanges(MAX_RANGES + 1)
    );
    assert!(DmaLogger::start(K4, &many[..MAX_RANGES]).is_ok());
    for ps in [0, 512, 3 * K4] {
        assert_eq!(
            DmaLogger::start(ps, &[r(0, K4)]).unwrap_err(),
            DmaLogError::BadPageSize(ps)
        );
    }
    assert!(matches!(
        DmaLogger::start(K4, &[r(100, K4)]),
        Err(DmaLogError::Unaligned { iova: 100, .. })
    ));
    assert!(matches!(
        DmaLogger::start(K4, &[r(0, 100)]),
        Err(DmaLogError::Unaligned { .. })
    ));
    assert!(matches!(
        DmaLogger::start(K4, &[r(0, 0)]),
        Err(DmaLogError::Unaligned { .. })
    ));
    assert!(matches!(
        DmaLogger::start(K4, &[r(u64::MAX - K4 + 1, 2 * K4)]),
        Err(DmaLogError::Overflow { .. })
    ));
    assert_eq!(
        DmaLogger::start(K4, &[r(8 * K4, 4 * K4), r(0, 9 * K4)]).unwrap_err(),
        DmaLogError::Overlap { a: 0, b: 8 * K4 }
    );
    assert!(matches!(
        DmaLogger::start(K4, &[r(0, 1 << 50)]),
        Err(DmaLogError::TooLarge(_))
    ));
}

#[test]
fn report_is_read_and_clear_at_any_page_size() {
    let mut l = DmaLogger::start(K4, &[r(0x10_0000, 64 * K4), r(0x100_0000, 16 * K4)]).unwrap();
    // A write straddling two pages, one wholly outside any range, one in the second range.
    assert_eq!(l.mark_dirty(0x10_0000 + 3 * K4 + 100, K4), 2);
    assert_eq!(l.mark_dirty(0x50_0000, K4), 0);
    assert_eq!(l.mark_dirty(0x100_0000 + 15 * K4, 1), 1);
    assert_eq!(l.dirty_pages(), 3);
    // Same page size.
    let rep = l.report(0x10_0000, 64 * K4, K4).unwrap();
    assert_eq!(rep.len(), 1);
    assert_eq!(bits(&rep), vec![3, 4]);
    assert_eq!(
        bits(&l.report(0x10_0000, 64 * K4, K4).unwrap()),
        Vec::<u64>::new()
    );
    // Coarser report pages: page 15 of range 2 is in the 4th 16 KiB page.
    assert_eq!(
        bits(&l.report(0x100_0000, 16 * K4, 4 * K4).unwrap()),
        vec![3]
    );
    assert_eq!(l.dirty_pages(), 0);
    // Finer report pages than tracking: both halves of an 8 KiB page report dirty.
    let mut l = DmaLogger::start(2 * K4, &[r(0, 8 * K4)]).unwrap();
    l.mark_dirty(2 * K4, 1);
    assert_eq!(bits(&l.report(0, 8 * K4, K4).unwrap()), vec![2, 3]);
    // A report covering half of a tracked page sets its bit but keeps the page dirty.
    l.mark_dirty(2 * K4, 1);
    assert_eq!(bits(&l.report(0, 3 * K4, K4).unwrap()), vec![2]);
    assert_eq!(l.dirty_pages(), 1);
    assert_eq!(bits(&l.report(0, 8 * K4, 2 * K4).unwrap()), vec![1]);
    assert_eq!(l.dirty_pages(), 0);
    // Bad report page sizes.
    assert_eq!(
        l.report(0, K4, 1024).unwrap_err(),
        DmaLogError::BadPageSize(1024)
    );
    assert!(matches!(
        l.report(u64::MAX, 2, K4),
        Err(DmaLogError::Overflow { .. })
    ));
}

#[test]
fn merge_guest_dirty_from_a_hash_diff() {
    use gmig_dirty::{DirtyBitmap, Gfn, GuestPages, HashSnapshot, Hasher};
    // Guest RAM of 64 frames at GPA 0; IOVA = GPA.
    let mut ram = vec![0u8; 64 * 4096];
    let hasher = Hasher::new(1).unwrap();
    let mut snap = HashSnapshot::for_range(Gfn(0), 64).unwrap();
    hasher
        .record_in_place(&GuestPages::from_slice(Gfn(0), &ram).unwrap(), &mut snap)
        .unwrap();
    // The "GPU" writes frames 5 and 40 behind the IOMMU's back.
    ram[5 * 4096 + 17] = 1;
    ram[40 * 4096] = 2;
    let diff = hasher
        .diff(&GuestPages::from_slice(Gfn(0), &ram).unwrap(), &snap, None)
        .unwrap();
    assert_eq!(diff.iter().collect::<Vec<_>>(), vec![Gfn(5), Gfn(40)]);
    // Only the first 32 frames are DMA-mapped and tracked.
    let mut l = DmaLogger::start(K4, &[r(0, 32 * K4)]).unwrap();
    assert_eq!(l.merge_guest_dirty(&diff, 0).unwrap(), 1);
    let rep = l.report_bitmap(0, 32 * K4, K4).unwrap();
    assert_eq!(rep.iter().collect::<Vec<_>>(), vec![Gfn(5)]);
    // The report merges with a KVM dirty log into one CPU + GPU dirty set.
    let mut all = DirtyBitmap::new(Gfn(0), 64).unwrap();
    all.merge(&rep).unwrap();
    all.merge_kvm_log(Gfn(0), 64, &[1 << 9]).unwrap();
    assert_eq!(all.iter().collect::<Vec<_>>(), vec![Gfn(5), Gfn(9)]);
    // With an IOVA offset the same frames land elsewhere.
    let mut l = DmaLogger::start(K4, &[r(1 << 30, 64 * K4)]).unwrap();
    assert_eq!(l.merge_guest_dirty(&diff, 1 << 30).unwrap(), 2);
    assert_eq!(bits(&l.report(1 << 30, 64 * K4, K4).unwrap()), vec![5, 40]);
    // Misaligned report base for a bitmap is refused before anything is cleared.
    l.mark_dirty(1 << 30, 1);
    assert!(l.report_bitmap((1 << 30) + 512, K4, K4).is_err());
    assert_eq!(l.dirty_pages(), 1);
}

#[test]
fn slot_enforces_one_session() {
    let mut s = DmaLogSlot::default();
    assert_eq!(s.report(0, K4, K4).unwrap_err(), DmaLogError::NotStarted);
    assert_eq!(s.stop().unwrap_err(), DmaLogError::NotStarted);
    s.mark_dirty(0, 1);
    assert_eq!(s.start(K4, &[r(0, 4 * K4)]).unwrap(), K4);
    assert_eq!(
        s.start(K4, &[r(0, 4 * K4)]).unwrap_err(),
        DmaLogError::AlreadyStarted
    );
    // The write made before logging started is not in the log.
    assert_eq!(bits(&s.report(0, 4 * K4, K4).unwrap()), Vec::<u64>::new());
    s.stop().unwrap();
}

#[test]
fn dma_logging_through_the_kernel_driver() {
    let f = MigrationFeatures::ALL;
    let mut k =
        KernelDevice::new(MockVfio::new(BlobDevice::new(4096, 256, 1, f)).unwrap()).unwrap();
    let ram = [r(0, 1 << 20), r(1 << 32, 1 << 20)];
    assert_eq!(k.dma_logging_start(K4, &ram).unwrap(), K4);
    // Starting twice is refused (one session per device).
    assert!(matches!(
        k.dma_logging_start(K4, &ram),
        Err(KernelError::Op { .. })
    ));
    let dev = k.ops_mut().handle().device_mut();
    dev.dma_write(5 * K4, 10);
    dev.dma_write((1 << 32) + 7 * K4, 2 * K4);
    assert_eq!(bits(&k.dma_logging_report(ram[0], K4).unwrap()), vec![5]);
    assert_eq!(bits(&k.dma_logging_report(ram[1], K4).unwrap()), vec![7, 8]);
    assert_eq!(
        bits(&k.dma_logging_report(ram[1], K4).unwrap()),
        Vec::<u64>::new()
    );
    // Injected kernel failure carries the errno.
    k.ops_mut().fail_next(CallKind::DmaLog, libc::ENOMEM);
    match k.dma_logging_report(ram[0], K4) {
        Err(KernelError::Op { source, .. }) => {
            assert_eq!(source.raw_os_error(), Some(libc::ENOMEM));
        }
        other => panic!("{other:?}"),
    }
    k.dma_logging_stop().unwrap();
    assert!(k.dma_logging_report(ram[0], K4).is_err());
    assert!(k.dma_logging_stop().is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The report equals a model: the set of tracked pages any write touched, at any report
    /// page size, and a second report is empty.
    #[test]
    fn report_matches_model(
        writes in prop::collection::vec((0u64..(80 * K4), 1u64..(3 * K4)), 0..40),
        shift in 0u32..4,
    ) {
        let ranges = [r(0, 32 * K4), r(48 * K4, 16 * K4)];
        let mut l = DmaLogger::start(K4, &ranges).unwrap();
        let mut model = BTreeSet::new();
        for &(at, len) in &writes {
            l.mark_dirty(at, len);
            for p in at / K4..=(at + len - 1) / K4 {
                if ranges.iter().any(|x| p * K4 >= x.iova && p * K4 < x.iova + x.length) {
                    model.insert(p);
                }
            }
        }
        let ps = K4 << shift;
        let span = 64 * K4;
        let rep = l.report(0, span, ps).unwrap();
        let expect: BTreeSet<u64> = model.iter().map(|p| p * K4 / ps).collect();
        let got: BTreeSet<u64> = bits(&rep).into_iter().collect();
        prop_assert_eq!(got, expect);
        prop_assert_eq!(l.dirty_pages(), 0);
        prop_assert!(bits(&l.report(0, span, ps).unwrap()).is_empty());
    }
}

#[test]
fn same_dma_logging_interface_for_a_gmig_device_and_a_kernel_device() {
    use gmig_vfio_migration::{MigrationHandle, MigrationTarget};
    fn exercise<T: MigrationTarget>(t: &mut T, write: &mut dyn FnMut(&mut T, u64, u64)) {
        let range = r(0, 64 * K4);
        assert_eq!(t.dma_logging_start(K4, &[range]).unwrap(), K4);
        write(t, 9 * K4, 3 * K4);
        assert_eq!(
            bits(&t.dma_logging_report(range, K4).unwrap()),
            vec![9, 10, 11]
        );
        assert_eq!(
            bits(&t.dma_logging_report(range, K4).unwrap()),
            Vec::<u64>::new()
        );
        t.dma_logging_stop().unwrap();
        assert!(t.dma_logging_report(range, K4).is_err());
    }
    let f = MigrationFeatures::ALL;
    let mut h = MigrationHandle::new(BlobDevice::new(4096, 256, 1, f)).unwrap();
    exercise(&mut h, &mut |h, at, len| h.device_mut().dma_write(at, len));
    let mut k =
        KernelDevice::new(MockVfio::new(BlobDevice::new(4096, 256, 1, f)).unwrap()).unwrap();
    exercise(&mut k, &mut |k, at, len| {
        k.ops_mut().handle().device_mut().dma_write(at, len);
    });
    // A device without DMA logging answers "not supported" through the same interface.
    struct NoLog;
    impl MigrationTarget for NoLog {
        fn features(&mut self) -> gmig_vfio_migration::target::Result<MigrationFeatures> {
            Ok(MigrationFeatures::STOP_COPY)
        }
        fn state(
            &mut self,
        ) -> gmig_vfio_migration::target::Result<gmig_vfio_migration::DeviceState> {
            Ok(gmig_vfio_migration::DeviceState::Running)
        }
        fn set_state(
            &mut self,
            _: gmig_vfio_migration::DeviceState,
        ) -> gmig_vfio_migration::target::Result<()> {
            Ok(())
        }
        fn read_data(
            &mut self,
            _: &mut [u8],
        ) -> gmig_vfio_migration::target::Result<gmig_vfio_migration::ReadOutcome> {
            Ok(gmig_vfio_migration::ReadOutcome::End)
        }
        fn write_data(&mut self, _: &[u8]) -> gmig_vfio_migration::target::Result<()> {
            Ok(())
        }
        fn precopy_info(
            &mut self,
        ) -> gmig_vfio_migration::target::Result<gmig_vfio_migration::PrecopyInfo> {
            Ok(Default::default())
        }
        fn stop_copy_size(&mut self) -> gmig_vfio_migration::target::Result<u64> {
            Ok(0)
        }
        fn reset(&mut self) -> gmig_vfio_migration::target::Result<()> {
            Ok(())
        }
    }
    assert!(matches!(
        NoLog.dma_logging_start(K4, &[r(0, K4)]),
        Err(gmig_vfio_migration::TargetError::Unsupported(_))
    ));
}
