//! Graphics address spaces, a vGPU's GGTT slices and the move between two slice layouts.
//!
//! Every address space is a newtype with explicit, checked arithmetic (no operator overloading),
//! so a GGTT offset can never be added to a PPGTT address by accident.

use thiserror::Error;

/// Size of one GGTT page (one GGTT entry maps one 4 KiB page).
pub const GTT_PAGE_SIZE: u64 = 4096;

/// Largest surface GVT-g lets one command address (36 MiB); larger ranges are refused.
pub const MAX_SURFACE_BYTES: u64 = 36 << 20;

/// A byte offset in the global graphics translation table (GGTT) address space.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct GgttOffset(pub u64);

impl GgttOffset {
    /// The raw offset.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// `self + n`, or `None` on overflow.
    pub fn checked_add(self, n: u64) -> Option<Self> {
        self.0.checked_add(n).map(Self)
    }

    /// `self - n`, or `None` on underflow.
    pub fn checked_sub(self, n: u64) -> Option<Self> {
        self.0.checked_sub(n).map(Self)
    }

    /// Distance from `base` to `self`, or `None` when `self < base`.
    pub fn checked_offset_from(self, base: GgttOffset) -> Option<u64> {
        self.0.checked_sub(base.0)
    }
}

/// A per-process graphics virtual address (PPGTT). Never rebased by migration.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct PpgttAddr(pub u64);

impl PpgttAddr {
    /// The raw address.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// `self + n`, or `None` on overflow.
    pub fn checked_add(self, n: u64) -> Option<Self> {
        self.0.checked_add(n).map(Self)
    }
}

/// Which translation an address goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum AddressSpace {
    /// The global GTT, shared by all vGPUs; a vGPU owns two slices of it.
    Ggtt,
    /// The per-process GTT of the submitting context.
    Ppgtt,
}

impl core::fmt::Display for AddressSpace {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            AddressSpace::Ggtt => "ggtt",
            AddressSpace::Ppgtt => "ppgtt",
        })
    }
}

/// Errors of this module.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum AddrError {
    /// A slice's end does not fit in 64 bits.
    #[error("slice at 0x{base:x} of 0x{size:x} bytes overflows")]
    SliceOverflow {
        /// Slice base.
        base: u64,
        /// Slice size.
        size: u64,
    },
    /// A slice base or size is not 4 KiB aligned.
    #[error("slice at 0x{base:x} of 0x{size:x} bytes is not 4 KiB aligned")]
    Unaligned {
        /// Slice base.
        base: u64,
        /// Slice size.
        size: u64,
    },
    /// Source and destination slices differ in size.
    #[error("slice sizes differ: 0x{from:x} bytes versus 0x{to:x} bytes")]
    SizeMismatch {
        /// Source size.
        from: u64,
        /// Destination size.
        to: u64,
    },
    /// The aperture and hidden slices of one layout overlap.
    #[error("aperture and hidden slices overlap at 0x{at:x}")]
    Overlap {
        /// Start of the later slice.
        at: u64,
    },
}

/// Result type of this module.
pub type Result<T> = core::result::Result<T, AddrError>;

/// One contiguous slice of the GGTT.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Slice {
    /// First byte of the slice.
    pub base: GgttOffset,
    /// Size in bytes.
    pub size: u64,
}

impl Slice {
    /// A slice; checks alignment and that the end fits in 64 bits.
    pub fn new(base: GgttOffset, size: u64) -> Result<Self> {
        let s = Slice { base, size };
        s.validate()?;
        Ok(s)
    }

    /// Checks alignment and that the end fits in 64 bits.
    pub fn validate(&self) -> Result<()> {
        if self.base.0.checked_add(self.size).is_none() {
            return Err(AddrError::SliceOverflow {
                base: self.base.0,
                size: self.size,
            });
        }
        if !self.base.0.is_multiple_of(GTT_PAGE_SIZE) || !self.size.is_multiple_of(GTT_PAGE_SIZE) {
            return Err(AddrError::Unaligned {
                base: self.base.0,
                size: self.size,
            });
        }
        Ok(())
    }

    /// One past the last byte (saturating).
    pub fn end(&self) -> u64 {
        self.base.0.saturating_add(self.size)
    }

    /// Whether `[start, start + len)` lies wholly inside the slice (`len == 0` counts as the
    /// single byte at `start`).
    #[inline]
    pub fn contains(&self, start: u64, len: u64) -> bool {
        let len = len.max(1);
        match start.checked_add(len) {
            Some(end) => start >= self.base.0 && end <= self.end(),
            None => false,
        }
    }

    /// Whether the two slices share a byte (an empty slice shares none).
    pub fn overlaps(&self, other: &Slice) -> bool {
        self.size != 0 && other.size != 0 && self.base.0 < other.end() && other.base.0 < self.end()
    }
}

/// Which of a vGPU's two slices an address falls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SliceKind {
    /// The CPU-visible (low) graphics memory.
    Aperture,
    /// The hidden (high) graphics memory.
    Hidden,
}

/// A vGPU's valid GGTT ranges: its aperture slice and its hidden slice.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct VgpuSlices {
    /// The CPU-visible (low) slice.
    pub aperture: Slice,
    /// The hidden (high) slice.
    pub hidden: Slice,
}

impl VgpuSlices {
    /// Checks both slices and that they do not overlap.
    pub fn validate(&self) -> Result<()> {
        self.aperture.validate()?;
        self.hidden.validate()?;
        if self.aperture.overlaps(&self.hidden) {
            return Err(AddrError::Overlap {
                at: self.aperture.base.0.max(self.hidden.base.0),
            });
        }
        Ok(())
    }

    /// Whether any byte of graphics memory is in both vGPUs' slices (two vGPUs of one host must
    /// not overlap).
    pub fn overlaps(&self, other: &VgpuSlices) -> bool {
        [&self.aperture, &self.hidden]
            .iter()
            .any(|a| a.overlaps(&other.aperture) || a.overlaps(&other.hidden))
    }

    /// The slice that wholly contains `[start, start + len)`, if any.
    #[inline]
    pub fn classify(&self, start: u64, len: u64) -> Option<SliceKind> {
        if self.aperture.contains(start, len) {
            Some(SliceKind::Aperture)
        } else if self.hidden.contains(start, len) {
            Some(SliceKind::Hidden)
        } else {
            None
        }
    }

    /// Whether `[start, start + len)` lies wholly inside the aperture or wholly inside the hidden
    /// slice.
    pub fn contains(&self, start: u64, len: u64) -> bool {
        self.classify(start, len).is_some()
    }

    /// The slice of `kind`.
    #[inline]
    pub fn slice(&self, kind: SliceKind) -> &Slice {
        match kind {
            SliceKind::Aperture => &self.aperture,
            SliceKind::Hidden => &self.hidden,
        }
    }
}

/// The move of a vGPU's slices from one GGTT layout to another (two independent deltas).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct SliceMove {
    /// Layout on the source host.
    pub from: VgpuSlices,
    /// Layout on the destination host.
    pub to: VgpuSlices,
}

impl SliceMove {
    /// A move; checks that each slice keeps its size, alignment, and that neither layout
    /// overlaps itself.
    pub fn new(from: VgpuSlices, to: VgpuSlices) -> Result<Self> {
        from.validate()?;
        to.validate()?;
        for (a, b) in [(from.aperture, to.aperture), (from.hidden, to.hidden)] {
            if a.size != b.size {
                return Err(AddrError::SizeMismatch {
                    from: a.size,
                    to: b.size,
                });
            }
        }
        Ok(SliceMove { from, to })
    }

    /// The move back.
    pub fn inverse(&self) -> SliceMove {
        SliceMove {
            from: self.to,
            to: self.from,
        }
    }

    /// Rebases one GGTT address; `None` when it lies in neither source slice.
    pub fn rebase(&self, addr: GgttOffset) -> Option<GgttOffset> {
        self.rebase_range(addr.0, 1).map(GgttOffset)
    }

    /// Rebases `start` of a range `[start, start + len)` that must lie wholly inside one source
    /// slice; `None` otherwise.
    pub fn rebase_range(&self, start: u64, len: u64) -> Option<u64> {
        let kind = self.from.classify(start, len)?;
        let off = start.checked_sub(self.from.slice(kind).base.0)?;
        self.to.slice(kind).base.0.checked_add(off)
    }

    /// Rebases an address that a field holds, given the range the field's command touches
    /// (which may start before the address, as with a negative blit pitch). Returns the new
    /// address and the new range start.
    pub fn rebase_with_range(&self, addr: u64, start: u64, len: u64) -> Option<(u64, u64)> {
        let kind = self.from.classify(start, len)?;
        let from = self.from.slice(kind).base.0;
        let to = self.to.slice(kind).base.0;
        let new_start = to.checked_add(start.checked_sub(from)?)?;
        let new_addr = if to >= from {
            addr.checked_add(to - from)?
        } else {
            addr.checked_sub(from - to)?
        };
        Some((new_addr, new_start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slices(a: u64, h: u64) -> VgpuSlices {
        VgpuSlices {
            aperture: Slice::new(GgttOffset(a), 64 << 20).unwrap(),
            hidden: Slice::new(GgttOffset(h), 384 << 20).unwrap(),
        }
    }

    #[test]
    fn contains_is_whole_range() {
        let s = slices(0, 1 << 30);
        assert!(s.contains(0, 64 << 20));
        assert!(!s.contains(1, 64 << 20));
        assert!(!s.contains(u64::MAX, 2));
        assert!(s.contains((1 << 30) + 5, 10));
        assert!(!s.contains(64 << 20, 1));
    }

    #[test]
    fn move_checks_sizes_and_overlap() {
        let a = slices(0, 1 << 30);
        let mut b = slices(128 << 20, 2 << 30);
        assert!(SliceMove::new(a, b).is_ok());
        b.hidden.size = 512 << 20;
        assert!(matches!(
            SliceMove::new(a, b),
            Err(AddrError::SizeMismatch { .. })
        ));
        let c = slices(0, 32 << 20);
        assert!(matches!(c.validate(), Err(AddrError::Overlap { .. })));
        assert!(matches!(
            Slice::new(GgttOffset(5), 4096),
            Err(AddrError::Unaligned { .. })
        ));
    }

    #[test]
    fn rebase_moves_slices_independently_and_back() {
        let mv = SliceMove::new(slices(0, 1 << 30), slices(256 << 20, 1 << 29)).unwrap();
        assert_eq!(
            mv.rebase(GgttOffset(0x1000)),
            Some(GgttOffset((256 << 20) + 0x1000))
        );
        assert_eq!(
            mv.rebase(GgttOffset((1 << 30) + 8)),
            Some(GgttOffset((1 << 29) + 8))
        );
        assert_eq!(mv.rebase(GgttOffset(100 << 20)), None);
        let back = mv.inverse();
        for a in [0u64, 0x1234, (1 << 30) + 0xfff0] {
            let there = mv.rebase(GgttOffset(a)).unwrap();
            assert_eq!(back.rebase(there), Some(GgttOffset(a)));
        }
    }
}
