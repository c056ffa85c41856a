//! DMA dirty logging (`VFIO_DEVICE_FEATURE_DMA_LOGGING_START` / `_REPORT` / `_STOP`) for devices
//! without hardware dirty tracking.
//!
//! A VMM asks the device to log which guest-RAM pages (IOVAs) it writes by DMA, then reads and
//! clears a bitmap per range, and merges it with KVM's dirty log. QEMU refuses to migrate a VFIO
//! device without this by default. A mediated vGPU has no IOMMU dirty bits, so the device side
//! fills the log itself: from writes it knows it made (command-parser post-sync writes, blits)
//! through [`DmaLogger::mark_dirty`], and from software dirty detection (page hashes compared by
//! `gmig-dirty`'s `Hasher::diff`) through [`DmaLogger::merge_guest_dirty`]. The log itself is kept
//! in `gmig-dirty`'s [`DirtyBitmap`], and [`DmaLogger::report_bitmap`] hands a report back in that
//! type, ready to merge with KVM's dirty log.
//!
//! The checks are the kernel's (`vfio_ioctl_device_feature_logging_start/report`): at least one
//! range and at most [`MAX_RANGES`], ranges aligned to the page size, not overflowing, not
//! overlapping; report page sizes are powers of two of at least 4 KiB; a report is
//! read-and-clear; bit `i` of the report covers `[iova + i*page_size, +page_size)`.

use gmig_dirty::{DirtyBitmap, Gfn, PAGE_SIZE};

/// An IOVA range for DMA logging (`struct vfio_device_feature_dma_logging_range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IovaRange {
    /// First IOVA of the range.
    pub iova: u64,
    /// Length in bytes.
    pub length: u64,
}

/// The kernel's limit on ranges (one page of `struct vfio_device_feature_dma_logging_range`).
pub const MAX_RANGES: usize = 4096 / 16;
/// Smallest page size a report may use.
pub const MIN_PAGE_SIZE: u64 = 4096;
/// Upper bound on the pages one logger tracks (a 1 TiB guest at 4 KiB pages is 2^28).
pub const MAX_TRACKED_PAGES: u64 = 1 << 30;

/// Errors of DMA logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DmaLogError {
    /// No ranges were given.
    #[error("DMA logging needs at least one range")]
    NoRanges,
    /// More ranges than the kernel accepts (`E2BIG`).
    #[error("{0} ranges exceed the limit of {MAX_RANGES}")]
    TooManyRanges(usize),
    /// Page size not a power of two of at least 4 KiB.
    #[error("page size 0x{0:x} is not a power of two >= 4 KiB")]
    BadPageSize(u64),
    /// A range not aligned to the page size, or empty.
    #[error("range 0x{iova:x}+0x{length:x} is empty or not aligned to page size 0x{page_size:x}")]
    Unaligned {
        /// Range start.
        iova: u64,
        /// Range length.
        length: u64,
        /// The page size.
        page_size: u64,
    },
    /// `iova + length` overflows (`EOVERFLOW`).
    #[error("range 0x{iova:x}+0x{length:x} overflows")]
    Overflow {
        /// Range start.
        iova: u64,
        /// Range length.
        length: u64,
    },
    /// Two ranges overlap.
    #[error("ranges at 0x{a:x} and 0x{b:x} overlap")]
    Overlap {
        /// Start of the first range.
        a: u64,
        /// Start of the second range.
        b: u64,
    },
    /// The ranges cover more pages than [`MAX_TRACKED_PAGES`].
    #[error("ranges cover 0x{0:x} pages, more than the logger tracks")]
    TooLarge(u64),
    /// Logging is already started (the kernel allows one session per device).
    #[error("DMA logging is already started")]
    AlreadyStarted,
    /// Logging is not started.
    #[error("DMA logging is not started")]
    NotStarted,
}

/// Result type of DMA logging.
pub type Result<T> = std::result::Result<T, DmaLogError>;

#[derive(Debug, Clone)]
struct Tracked {
    range: IovaRange,
    /// One bit per tracking page; frame `n` of the bitmap is the page at IOVA `n * page_size`.
    bits: DirtyBitmap,
}

fn check_page_size(page_size: u64) -> Result<()> {
    if page_size < MIN_PAGE_SIZE || !page_size.is_power_of_two() {
        return Err(DmaLogError::BadPageSize(page_size));
    }
    Ok(())
}

fn end_of(r: IovaRange) -> Result<u64> {
    r.iova.checked_add(r.length).ok_or(DmaLogError::Overflow {
        iova: r.iova,
        length: r.length,
    })
}

fn set_bit(bits: &mut [u64], i: u64) {
    if let Some(w) = bits.get_mut((i / 64) as usize) {
        *w |= 1 << (i % 64);
    }
}

/// A device's DMA dirty log: the tracked IOVA ranges and one bit per tracked page, kept in
/// `gmig-dirty`'s [`DirtyBitmap`] (KVM / VFIO report layout) with frames counted in units of the
/// logger's page size.
#[derive(Debug, Clone)]
pub struct DmaLogger {
    page_size: u64,
    tracked: Vec<Tracked>,
}

impl DmaLogger {
    /// `LOGGING_START`: validates the request like the kernel and starts with a clean log.
    pub fn start(page_size: u64, ranges: &[IovaRange]) -> Result<DmaLogger> {
        check_page_size(page_size)?;
        if ranges.is_empty() {
            return Err(DmaLogError::NoRanges);
        }
        if ranges.len() > MAX_RANGES {
            return Err(DmaLogError::TooManyRanges(ranges.len()));
        }
        let mut sorted = ranges.to_vec();
        sorted.sort_by_key(|r| r.iova);
        let mut total_pages = 0u64;
        let mut prev: Option<(u64, u64)> = None;
        let mut tracked = Vec::with_capacity(sorted.len());
        for r in sorted {
            if r.length == 0 || r.iova % page_size != 0 || r.length % page_size != 0 {
                return Err(DmaLogError::Unaligned {
                    iova: r.iova,
                    length: r.length,
                    page_size,
                });
            }
            let end = end_of(r)?;
            if let Some((pstart, pend)) = prev {
                if r.iova < pend {
                    return Err(DmaLogError::Overlap {
                        a: pstart,
                        b: r.iova,
                    });
                }
            }
            prev = Some((r.iova, end));
            let pages = r.length / page_size;
            total_pages = total_pages.saturating_add(pages);
            if total_pages > MAX_TRACKED_PAGES {
                return Err(DmaLogError::TooLarge(total_pages));
            }
            let bits = DirtyBitmap::new(Gfn(r.iova / page_size), pages)
                .map_err(|_| DmaLogError::TooLarge(pages))?;
            tracked.push(Tracked { range: r, bits });
        }
        Ok(DmaLogger { page_size, tracked })
    }

    /// The tracking page size.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// The tracked ranges, sorted by IOVA.
    pub fn ranges(&self) -> impl Iterator<Item = IovaRange> + '_ {
        self.tracked.iter().map(|t| t.range)
    }

    /// Records a device write of `len` bytes at `iova`. Parts outside the tracked ranges are not
    /// logged (as with hardware trackers). Returns how many tracked pages the write touched.
    pub fn mark_dirty(&mut self, iova: u64, len: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let end = iova.saturating_add(len);
        let ps = self.page_size;
        let mut touched = 0;
        for t in &mut self.tracked {
            let tend = t.range.iova + t.range.length;
            let lo = iova.max(t.range.iova);
            let hi = end.min(tend);
            if lo >= hi {
                continue;
            }
            let first = lo / ps;
            let last = (hi - 1) / ps;
            // In span by construction: [lo, hi) lies inside the tracked range.
            if t.bits.set_range(Gfn(first), last - first + 1).is_ok() {
                touched += last - first + 1;
            }
        }
        touched
    }

    /// Merges a guest-frame dirty set from `gmig-dirty` (a hash diff, a KVM log: 4 KiB frames)
    /// into the log. Guest frame `g` is at IOVA `iova_of_gfn0 + g * 4096` (0 for the usual
    /// identity IOVA = GPA mapping of guest RAM). Frames outside the tracked ranges are ignored.
    /// Returns how many tracked pages became (or stayed) dirty.
    pub fn merge_guest_dirty(&mut self, dirty: &DirtyBitmap, iova_of_gfn0: u64) -> Result<u64> {
        let mut touched = 0;
        for (first, count) in dirty.runs() {
            let overflow = DmaLogError::Overflow {
                iova: iova_of_gfn0,
                length: count.saturating_mul(PAGE_SIZE as u64),
            };
            let at = first
                .0
                .checked_mul(PAGE_SIZE as u64)
                .and_then(|o| o.checked_add(iova_of_gfn0))
                .ok_or(overflow)?;
            let len = count.checked_mul(PAGE_SIZE as u64).ok_or(overflow)?;
            touched += self.mark_dirty(at, len);
        }
        Ok(touched)
    }

    /// `LOGGING_REPORT`: the bitmap of `[iova, iova+length)` at `page_size` granularity, and
    /// the covered tracked pages are cleared (read-and-clear). A report page is dirty when any
    /// tracked page overlapping it is dirty. Bit `i` of the result (bit `i % 64` of word `i / 64`)
    /// is the page at `iova + i * page_size`.
    pub fn report(&mut self, iova: u64, length: u64, page_size: u64) -> Result<Vec<u64>> {
        check_page_size(page_size)?;
        let end = end_of(IovaRange { iova, length })?;
        let pages = length.div_ceil(page_size);
        if pages > MAX_TRACKED_PAGES {
            return Err(DmaLogError::TooLarge(pages));
        }
        let mut out = vec![0u64; pages.div_ceil(64) as usize];
        let ps = self.page_size;
        for t in &mut self.tracked {
            let tend = t.range.iova + t.range.length;
            if iova.max(t.range.iova) >= end.min(tend) {
                continue;
            }
            // Only set bits are visited: a clean range costs one load per 64 pages.
            let hits: Vec<Gfn> = t
                .bits
                .iter()
                .filter(|g| {
                    let pstart = g.0 * ps;
                    pstart < end && pstart + ps > iova
                })
                .collect();
            for g in hits {
                let pstart = g.0 * ps;
                let a = pstart.max(iova);
                let b = (pstart + ps).min(end);
                for q in (a - iova) / page_size..=(b - 1 - iova) / page_size {
                    set_bit(&mut out, q);
                }
                // Clear only tracked pages wholly inside the report; a partially reported page
                // stays dirty so a later report still sees it.
                if pstart >= iova && pstart + ps <= end {
                    let _ = t.bits.clear(g);
                }
            }
        }
        Ok(out)
    }

    /// [`DmaLogger::report`] as a `gmig-dirty` bitmap whose frames are `page_size` units
    /// (frame `n` = IOVA `n * page_size`; for 4 KiB pages and identity IOVA, guest frames), ready
    /// to merge with KVM's dirty log or a hash diff.
    pub fn report_bitmap(&mut self, iova: u64, length: u64, page_size: u64) -> Result<DirtyBitmap> {
        check_page_size(page_size)?;
        if !iova.is_multiple_of(page_size) {
            return Err(DmaLogError::Unaligned {
                iova,
                length,
                page_size,
            });
        }
        let words = self.report(iova, length, page_size)?;
        DirtyBitmap::from_words(Gfn(iova / page_size), length.div_ceil(page_size), words)
            .map_err(|_| DmaLogError::TooLarge(length / page_size))
    }

    /// Number of dirty tracked pages.
    pub fn dirty_pages(&self) -> u64 {
        self.tracked.iter().map(|t| t.bits.count()).sum()
    }
}

/// A device's optional logger with the `LOGGING_*` semantics: start fails while started
/// (`EBUSY` in vfio-ioctls), report and stop fail when not started. Devices embed one and forward
/// [`crate::device::DirtyLogging`] to it.
#[derive(Debug, Clone, Default)]
pub struct DmaLogSlot(Option<DmaLogger>);

impl DmaLogSlot {
    /// `LOGGING_START`.
    pub fn start(&mut self, page_size: u64, ranges: &[IovaRange]) -> Result<u64> {
        if self.0.is_some() {
            return Err(DmaLogError::AlreadyStarted);
        }
        let l = DmaLogger::start(page_size, ranges)?;
        let ps = l.page_size();
        self.0 = Some(l);
        Ok(ps)
    }

    /// `LOGGING_STOP`.
    pub fn stop(&mut self) -> Result<()> {
        self.0.take().map(|_| ()).ok_or(DmaLogError::NotStarted)
    }

    /// `LOGGING_REPORT`.
    pub fn report(&mut self, iova: u64, length: u64, page_size: u64) -> Result<Vec<u64>> {
        self.0
            .as_mut()
            .ok_or(DmaLogError::NotStarted)?
            .report(iova, length, page_size)
    }

    /// Records a device write (no-op when logging is off).
    pub fn mark_dirty(&mut self, iova: u64, len: u64) {
        if let Some(l) = self.0.as_mut() {
            l.mark_dirty(iova, len);
        }
    }

    /// The running logger.
    pub fn logger(&mut self) -> Option<&mut DmaLogger> {
        self.0.as_mut()
    }
}
