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
fn merge_bitmap_from_software_dirty_detection() {
    let mut l = DmaLogger::start(K4, &[r(0, 256 * K4)]).unwrap();
    let mut bm = vec![0u64; 2];
    bm[0] |= 1 << 5;
    bm[1] |= 1 << 1; // page 65
    l.merge_bitmap(0, K4, 128, &bm).unwrap();
    assert_eq!(bits(&l.report(0, 256 * K4, K4).unwrap()), vec![5, 65]);
    assert_eq!(
        l.merge_bitmap(0, K4, 129, &bm).unwrap_err(),
        DmaLogError::ShortBitmap {
            words: 2,
            pages: 129
        }
    );
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
