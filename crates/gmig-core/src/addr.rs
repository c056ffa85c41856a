//! GGTT address-space types shared with `gmig-cmdparser` (a stand-in until its first version lands).

use serde::{Deserialize, Serialize};

/// A byte offset in the global GTT address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GgttOffset(pub u64);

impl GgttOffset {
    /// `self + delta`, `None` on overflow.
    pub fn checked_add(self, delta: u64) -> Option<GgttOffset> {
        self.0.checked_add(delta).map(GgttOffset)
    }
    /// `self - base`, `None` when `base` is above `self`.
    pub fn checked_offset_from(self, base: GgttOffset) -> Option<u64> {
        self.0.checked_sub(base.0)
    }
}

/// One contiguous range of GGTT address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slice {
    /// First byte.
    pub base: GgttOffset,
    /// Size in bytes.
    pub size: u64,
}

impl Slice {
    /// Whether `[start, start + len)` lies wholly inside the slice.
    pub fn contains(&self, start: GgttOffset, len: u64) -> bool {
        match (
            start.checked_offset_from(self.base),
            start.0.checked_add(len),
        ) {
            (Some(off), Some(_)) => off <= self.size && len <= self.size - off,
            _ => false,
        }
    }
}

/// A vGPU's aperture and hidden slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VgpuSlices {
    /// The aperture (CPU-visible) slice.
    pub aperture: Slice,
    /// The hidden slice.
    pub hidden: Slice,
}

impl VgpuSlices {
    /// Whether `[start, start + len)` lies wholly inside one of the two slices.
    pub fn contains(&self, start: GgttOffset, len: u64) -> bool {
        self.aperture.contains(start, len) || self.hidden.contains(start, len)
    }
}

/// A move of a vGPU's two slices to other bases (sizes equal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceMove {
    /// Where the slices were.
    pub from: VgpuSlices,
    /// Where they go.
    pub to: VgpuSlices,
}

impl SliceMove {
    /// A move, `None` unless the slice sizes match.
    pub fn new(from: VgpuSlices, to: VgpuSlices) -> Option<SliceMove> {
        (from.aperture.size == to.aperture.size && from.hidden.size == to.hidden.size)
            .then_some(SliceMove { from, to })
    }
    /// Rebases one address from `from` into `to`; `None` when it lies in neither slice.
    pub fn rebase(&self, addr: GgttOffset) -> Option<GgttOffset> {
        for (f, t) in [
            (self.from.aperture, self.to.aperture),
            (self.from.hidden, self.to.hidden),
        ] {
            if f.contains(addr, 1) {
                return t.base.checked_add(addr.checked_offset_from(f.base)?);
            }
        }
        None
    }
    /// The move back.
    pub fn inverse(&self) -> SliceMove {
        SliceMove {
            from: self.to,
            to: self.from,
        }
    }
}
