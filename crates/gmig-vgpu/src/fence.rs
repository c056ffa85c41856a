//! Fence registers applied to the CPU's accesses through the aperture, as the hardware applies
//! them: an access inside a valid fence's range sees the surface linearly (rows of the fence's
//! pitch) while memory holds it X- or Y-tiled, so i915's GTT mmaps of tiled objects read and
//! write the same bytes as the GPU's blits do.
//!
//! `FENCE_REG_GEN6_LO(i)` (0x100000 + 8 i): bits 31:12 the first page (GGTT, guest view), bit 1
//! Y tiling (else X), bit 0 valid; `_HI` (+4): bits 31:12 the last page, bits 11:0 the pitch in
//! 128-byte units less one (i915's `i965_write_fence_reg` on GEN6+). No bit-6 swizzling: i915
//! reports none on GEN8+.

use crate::mmio;
use crate::vgpu::Vgpu;

/// One valid fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fence {
    start: u64,
    /// Exclusive end.
    end: u64,
    pitch: u64,
    y: bool,
}

impl Fence {
    fn decode(lo: u32, hi: u32) -> Option<Fence> {
        if lo & 1 == 0 {
            return None;
        }
        let start = u64::from(lo & 0xffff_f000);
        let end = u64::from(hi & 0xffff_f000).checked_add(4096)?;
        let pitch = (u64::from(hi & 0xfff) + 1) * 128;
        let y = lo & 2 != 0;
        // A pitch that is not a whole number of tiles wide describes no tiled surface.
        let tile_width = if y { 128 } else { 512 };
        (end > start && pitch.is_multiple_of(tile_width)).then_some(Fence {
            start,
            end,
            pitch,
            y,
        })
    }

    /// Where linear byte `rel` of the fenced range lives, and how many bytes from there are
    /// contiguous in both views.
    fn tiled(&self, rel: u64) -> (u64, u64) {
        let (y, x) = (rel / self.pitch, rel % self.pitch);
        let (within, run, tile) = if self.y {
            // 128 bytes x 32 rows, in 16-byte columns of 32 rows.
            let tile = (y / 32) * (self.pitch / 128) + x / 128;
            (
                (x % 128) / 16 * 512 + (y % 32) * 16 + x % 16,
                16 - x % 16,
                tile,
            )
        } else {
            // 512 bytes x 8 rows.
            let tile = (y / 8) * (self.pitch / 512) + x / 512;
            ((y % 8) * 512 + x % 512, 512 - x % 512, tile)
        };
        (self.start + tile * 4096 + within, run)
    }
}

impl Vgpu {
    /// The valid fences the guest programmed (guest-view GGTT ranges).
    fn fences(&self) -> impl Iterator<Item = Fence> + '_ {
        (0..self.cfg.fence_num.min(mmio::FENCE_COUNT)).filter_map(|i| {
            let lo = mmio::FENCE_REG_BASE + 8 * i;
            Fence::decode(self.reg_value(lo), self.reg_value(lo + 4))
        })
    }

    /// The GGTT ranges (guest view) that `len` bytes at aperture offset `offset` reach, in
    /// order: one range where no fence covers them, else pieces detiled through the fence.
    pub(crate) fn aperture_ranges(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = offset;
        let end = offset.saturating_add(len);
        while at < end {
            let fence = self.fences().find(|f| (f.start..f.end).contains(&at));
            let (addr, run) = match fence {
                Some(f) => {
                    // A tiled surface's rows end where the fence does.
                    let (addr, run) = f.tiled(at - f.start);
                    (addr, run.min(f.end - at))
                }
                None => {
                    let next = self
                        .fences()
                        .map(|f| f.start)
                        .filter(|s| *s > at)
                        .min()
                        .unwrap_or(u64::MAX);
                    (at, next - at)
                }
            };
            let n = run.min(end - at);
            out.push((addr, n));
            at += n;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_decode_as_i915_writes_them() {
        // An X-tiled object of 2 pages at 0x10000 with a 1024-byte pitch.
        let f = Fence::decode(0x10000 | 1, 0x11000 | (1024 / 128 - 1)).unwrap();
        assert_eq!(
            f,
            Fence {
                start: 0x10000,
                end: 0x12000,
                pitch: 1024,
                y: false
            }
        );
        assert_eq!(Fence::decode(0x10000, 0x11000 | 7), None, "not valid");
        // Row 1, byte 0 of an X-tiled surface: the second 512-byte row of tile 0.
        assert_eq!(f.tiled(1024), (0x10000 + 512, 512));
        // Row 0, byte 512: tile 1.
        assert_eq!(f.tiled(512), (0x11000, 512));
        let y = Fence::decode(0x10000 | 3, 0x11000 | 7).unwrap();
        // Y: row 1 is the next 16 bytes of the first column; byte 16 of row 0 is column 1.
        assert_eq!(y.tiled(1024), (0x10000 + 16, 16));
        assert_eq!(y.tiled(16), (0x10000 + 512, 16));
    }
}
