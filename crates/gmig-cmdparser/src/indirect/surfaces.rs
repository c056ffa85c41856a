//! RENDER_SURFACE_STATE: the bytes a surface state covers, and its address fields.

use super::fields::{addr64, bit, bits};
use super::footprint::Shape;
use crate::table::Gen;

/// Bytes of RENDER_SURFACE_STATE read (16 dwords on GEN8–GEN11).
pub const SURFACE_STATE_BYTES: usize = 64;

/// Rows a surface of `height` rows occupies per slice: whole tiles of `tile_rows`, doubled for a
/// mip chain, or the array pitch when larger.
pub(super) fn tiled_rows(height: u64, tile_rows: u64, mips: u64, qpitch: u64, array: bool) -> u64 {
    let mut rows = height.next_multiple_of(tile_rows);
    if mips > 0 {
        rows *= 2;
    }
    if array {
        rows = rows.max(qpitch.saturating_mul(4).next_multiple_of(64));
    }
    rows
}

pub(super) enum Extent {
    Null,
    Bytes {
        start: u64,
        len: u64,
        shape: Shape,
        aux: Option<(u64, u64)>,
    },
    Unsized(String),
}

/// The bytes a RENDER_SURFACE_STATE covers (an upper bound).
pub(super) fn surface_extent(gen: Gen, ss: &[u32; 16]) -> Extent {
    const SURFTYPE_BUFFER: u64 = 4;
    const SURFTYPE_STRBUF: u64 = 5;
    const SURFTYPE_NULL: u64 = 7;
    const FORMAT_RAW: u64 = 0x1ff;
    let ty = bits(ss[0], 29, 3);
    let start = addr64(ss[8], ss[9], 0);
    let pitch = bits(ss[3], 0, 18) + 1;
    let width = bits(ss[2], 0, 14) + 1;
    let height = bits(ss[2], 16, 14) + 1;
    let (len, shape) = match ty {
        SURFTYPE_NULL => return Extent::Null,
        6 => return Extent::Unsized("reserved surface type 6".into()),
        SURFTYPE_BUFFER | SURFTYPE_STRBUF => {
            // Buffers: entries - 1 split over width 6:0, height 20:7, depth 30:21.
            let entries =
                (bits(ss[3], 21, 11) << 21 | bits(ss[2], 16, 14) << 7 | bits(ss[2], 0, 7)) + 1;
            let format_bits = if gen == Gen::Gen8 { 9 } else { 10 };
            let format = bits(ss[0], 18, format_bits);
            let stride = if format == FORMAT_RAW { 1 } else { 16 };
            let len = entries.saturating_mul(stride.max(pitch));
            (len, Shape::linear(len))
        }
        _ => {
            let depth = bits(ss[3], 21, 11) + 1;
            let mips = bits(ss[5], 0, 4);
            let qpitch = bits(ss[1], 0, 15);
            let array = bit(ss[0], 28) || ty == 2 || depth > 1;
            let mut slices = depth;
            if ty == 3 {
                slices = slices.saturating_mul(6);
            }
            let samples = 1u64 << bits(ss[4], 3, 3).min(4);
            // Tile heights: linear 1, X 8, W 64, Y 32 (Yf/Ys up to 256 as tiled resources).
            let tile_rows = match bits(ss[0], 12, 2) {
                0 => 1,
                2 => 8,
                _ if bits(ss[5], 18, 2) != 0 => 256,
                _ => 64,
            };
            let rows = tiled_rows(height, tile_rows, mips, qpitch, array);
            // X/Y offsets move the origin by up to 28 rows and 508 pixels of 16 bytes.
            let offset = if bits(ss[5], 21, 3) != 0 || bits(ss[5], 25, 7) != 0 {
                28 * pitch + 508 * 16
            } else {
                0
            };
            let len = pitch
                .saturating_mul(rows)
                .saturating_mul(slices)
                .saturating_mul(samples)
                .saturating_add(offset);
            // 32-bit pixels, the reference GPU's colour format.
            (len, Shape::rows(width * 4, pitch, height))
        }
    };
    // CCS, MCS and HiZ auxiliary surfaces are no larger than the surface they describe.
    let aux = (bits(ss[6], 0, 3) != 0)
        .then(|| addr64(ss[10], ss[11], 12))
        .filter(|a| *a != 0)
        .map(|a| (a, len));
    Extent::Bytes {
        start,
        len,
        shape,
        aux,
    }
}

/// An address field inside a RENDER_SURFACE_STATE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateAddress {
    /// Field name.
    pub field: &'static str,
    /// Dword index of the field's low half in the surface state.
    pub dword: usize,
    /// Bits of the 64-bit value in dwords `dword` and `dword + 1` that hold the address.
    pub mask: u64,
    /// The address.
    pub addr: u64,
    /// Bytes the GPU may touch from it; `None` when the state does not size it.
    pub len: Option<u64>,
}

/// The address fields a RENDER_SURFACE_STATE uses: the surface base, the auxiliary surface (when
/// an aux mode is set) and, on GEN11, the clear-colour address (when enabled). A null surface uses
/// none. In a privileged (GGTT) context these are GGTT addresses to audit and remap.
#[must_use]
pub fn surface_state_addresses(gen: Gen, ss: &[u32; 16]) -> Vec<StateAddress> {
    const ADDR48: u64 = 0x0000_ffff_ffff_ffff;
    let pair = |i: usize| u64::from(ss[i]) | (u64::from(ss[i + 1]) << 32);
    let (len, aux) = match surface_extent(gen, ss) {
        Extent::Null => return Vec::new(),
        Extent::Unsized(_) => (None, None),
        Extent::Bytes { len, aux, .. } => (Some(len), aux),
    };
    let mut v = vec![StateAddress {
        field: "surface base",
        dword: 8,
        mask: ADDR48,
        addr: pair(8) & ADDR48,
        len,
    }];
    if let Some((addr, l)) = aux {
        v.push(StateAddress {
            field: "aux surface base",
            dword: 10,
            mask: ADDR48 & !0xfff,
            addr,
            len: Some(l),
        });
    }
    let clear = pair(12) & ADDR48 & !0x3f;
    if gen == Gen::Gen11 && bit(ss[10], 10) && clear != 0 {
        v.push(StateAddress {
            field: "clear value",
            dword: 12,
            mask: ADDR48 & !0x3f,
            addr: clear,
            len: Some(64),
        });
    }
    v
}
