//! Page-granular views of guest memory: which host address backs each guest frame.

use std::marker::PhantomData;

use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MemoryRegionAddress,
};

use crate::addr::{Gfn, PAGE_SHIFT, PAGE_SIZE};

/// Errors of building a page view or resolving a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// No guest memory region backs the whole frame.
    #[error("guest frame 0x{gfn:x} is not backed by guest memory")]
    NotBacked {
        /// The frame.
        gfn: u64,
    },
    /// A region's host mapping could not be obtained.
    #[error("no host mapping for the guest region at 0x{addr:x}")]
    NoHostMapping {
        /// Guest-physical start of the region.
        addr: u64,
    },
    /// A host buffer's length is not a whole number of pages.
    #[error("buffer of {len} bytes is not a whole number of 4 KiB pages")]
    Unaligned {
        /// The length.
        len: usize,
    },
}

/// Module result type.
pub type Result<T> = std::result::Result<T, MemoryError>;

/// Host pointer of a run's first page, shareable between hashing threads.
#[derive(Debug, Clone, Copy)]
struct HostPtr(*const u8);

// SAFETY: the pointer designates memory that outlives the `GuestPages<'a>` borrow holding it, and
// it is only ever read through (hashing, copying out). Guest memory is shared between threads by
// design; concurrent writers (vCPUs, devices) are expected and are why senders hash their copy.
unsafe impl Send for HostPtr {}
// SAFETY: as above.
unsafe impl Sync for HostPtr {}

#[derive(Debug, Clone, Copy)]
struct Run {
    first: u64,
    pages: u64,
    host: HostPtr,
}

/// Guest frames mapped to host memory: built once from a `vm-memory` guest memory (or a host
/// buffer) and then used by the [`Hasher`](crate::Hasher) to find pages without per-page region
/// lookups. Only whole 4 KiB pages inside a region are addressable.
#[derive(Debug, Clone)]
pub struct GuestPages<'a> {
    runs: Vec<Run>,
    _mem: PhantomData<&'a [u8]>,
}

impl<'a> GuestPages<'a> {
    /// View every whole page of every region of a guest memory whose regions are mapped in this
    /// process (`vm_memory::GuestMemoryMmap`; any backend whose regions answer
    /// `GuestMemoryRegion::get_host_address`). Regions without a host mapping are an error.
    pub fn new<M: GuestMemoryBackend>(mem: &'a M) -> Result<Self> {
        let mut runs = Vec::with_capacity(mem.num_regions());
        for r in mem.iter() {
            let start = r.start_addr().0;
            let first = start.div_ceil(PAGE_SIZE as u64);
            let skip = first * PAGE_SIZE as u64 - start;
            let pages = r.len().saturating_sub(skip) >> PAGE_SHIFT;
            if pages == 0 {
                continue;
            }
            let no_mapping = MemoryError::NoHostMapping { addr: start };
            let bytes = usize::try_from(pages << PAGE_SHIFT).map_err(|_| no_mapping)?;
            // `get_host_address` gives a persistent mapping; a `VolatileSlice` over the whole page
            // range proves those bytes are one contiguous host range. Require both to agree.
            let host = r
                .get_host_address(MemoryRegionAddress(skip))
                .map_err(|_| no_mapping)?;
            let whole = r
                .get_slice(MemoryRegionAddress(skip), bytes)
                .map_err(|_| no_mapping)?;
            if whole.ptr_guard().as_ptr() != host || whole.len() != bytes {
                return Err(no_mapping);
            }
            runs.push(Run {
                first,
                pages,
                host: HostPtr(host.cast_const()),
            });
        }
        runs.sort_by_key(|r| r.first);
        Ok(GuestPages {
            runs,
            _mem: PhantomData,
        })
    }

    /// View a host buffer as guest frames `[base, base + buf.len() / 4096)`. Used by tests and
    /// benchmarks, and by callers that keep device memory in ordinary buffers.
    pub fn from_slice(base: Gfn, buf: &'a [u8]) -> Result<Self> {
        if !buf.len().is_multiple_of(PAGE_SIZE) {
            return Err(MemoryError::Unaligned { len: buf.len() });
        }
        let pages = (buf.len() / PAGE_SIZE) as u64;
        if base.checked_add(pages).is_none() {
            return Err(MemoryError::NotBacked { gfn: base.0 });
        }
        Ok(GuestPages {
            runs: vec![Run {
                first: base.0,
                pages,
                host: HostPtr(buf.as_ptr()),
            }],
            _mem: PhantomData,
        })
    }

    /// Total addressable pages.
    pub fn pages(&self) -> u64 {
        self.runs.iter().map(|r| r.pages).sum()
    }

    /// The addressable frames as a bitmap over `[lowest, highest]` frame.
    pub fn frames(&self) -> crate::bitmap::Result<crate::DirtyBitmap> {
        let (Some(lo), Some(hi)) = (self.runs.first(), self.runs.last()) else {
            return crate::DirtyBitmap::new(Gfn(0), 0);
        };
        let mut b = crate::DirtyBitmap::new(Gfn(lo.first), hi.first + hi.pages - lo.first)?;
        for r in &self.runs {
            b.set_range(Gfn(r.first), r.pages)?;
        }
        Ok(b)
    }

    /// A cursor for resolving ascending frames quickly.
    pub(crate) fn cursor(&self) -> Cursor<'_> {
        Cursor {
            runs: &self.runs,
            cur: 0,
        }
    }

    /// Host address of `gfn` (a one-off lookup).
    pub(crate) fn host(&self, gfn: Gfn) -> Result<*const u8> {
        self.cursor().host(gfn)
    }
}

/// Resolves frames to host pointers, remembering the last run so ascending lookups are O(1).
pub(crate) struct Cursor<'r> {
    runs: &'r [Run],
    cur: usize,
}

impl Cursor<'_> {
    #[inline]
    pub(crate) fn host(&mut self, gfn: Gfn) -> Result<*const u8> {
        let hit = |r: &Run| gfn.0 >= r.first && gfn.0 - r.first < r.pages;
        if !self.runs.get(self.cur).is_some_and(hit) {
            let i = self.runs.partition_point(|r| r.first + r.pages <= gfn.0);
            match self.runs.get(i) {
                Some(r) if hit(r) => self.cur = i,
                _ => return Err(MemoryError::NotBacked { gfn: gfn.0 }),
            }
        }
        let r = &self.runs[self.cur];
        // In range: (gfn - first) < pages, and the run's pages are all mapped.
        Ok(r.host
            .0
            .wrapping_add(((gfn.0 - r.first) as usize) << PAGE_SHIFT))
    }
}

/// Whether the device may write guest RAM at `gpa..gpa + len`: every region the range touches
/// is mapped writable. A VMM may map a range to the device read-only (a vfio-user DMA_MAP without
/// the write flag, which a server maps `PROT_READ`); the vGPU's writes and a migration
/// destination's page writes ask this first and refuse, as an IOMMU refuses a write through a
/// read-only mapping, instead of faulting the process on the protected page. A range RAM does
/// not back answers `true` (the write itself then fails as unbacked).
pub fn device_writable(mem: &GuestMemoryMmap, gpa: GuestAddress, len: usize) -> bool {
    let Some(end) = gpa.0.checked_add(len as u64) else {
        return true;
    };
    let mut at = gpa.0;
    while at < end {
        let Some(r) = mem.find_region(GuestAddress(at)) else {
            return true;
        };
        if r.prot() & libc::PROT_WRITE == 0 {
            return false;
        }
        at = r.start_addr().0.saturating_add(r.len());
    }
    true
}

#[cfg(test)]
mod tests {
    use vm_memory::{GuestAddress, GuestMemoryMmap};

    use super::*;

    #[test]
    fn regions_become_runs_and_holes_are_not_backed() {
        let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 4 * PAGE_SIZE),
            (GuestAddress(0x10_0000), 2 * PAGE_SIZE),
        ])
        .unwrap();
        let pages = GuestPages::new(&mem).unwrap();
        assert_eq!(pages.pages(), 6);
        let f = pages.frames().unwrap();
        assert_eq!(f.count(), 6);
        assert_eq!(f.base(), Gfn(0));
        assert_eq!(f.span_pages(), 0x102);
        let mut c = pages.cursor();
        let a = c.host(Gfn(0)).unwrap();
        assert_eq!(c.host(Gfn(3)).unwrap(), a.wrapping_add(3 * PAGE_SIZE));
        assert!(c.host(Gfn(4)).is_err());
        assert!(c.host(Gfn(0x101)).is_ok());
        assert_eq!(
            c.host(Gfn(0x102)),
            Err(MemoryError::NotBacked { gfn: 0x102 })
        );
        assert!(GuestPages::from_slice(Gfn(0), &[0u8; 100]).is_err());
    }
}
