//! Fields of command and state dwords.

use crate::decode::Decoded;

/// Dword `i` of `d`; 0 past its end.
pub(super) fn dw(d: &Decoded<'_>, i: usize) -> u32 {
    d.dword(i).unwrap_or(0)
}

/// The address in `lo` and the low 16 bits of `hi`, with the low `low_bits` bits of `lo` cleared.
pub(super) fn addr64(lo: u32, hi: u32, low_bits: u32) -> u64 {
    (u64::from(hi & 0xffff) << 32) | u64::from(lo & !((1u32 << low_bits) - 1))
}

/// Bit `b` of `v`.
pub(super) fn bit(v: u32, b: u32) -> bool {
    (v >> b) & 1 == 1
}

/// The `n` bits of `v` from bit `lo`.
pub(super) fn bits(v: u32, lo: u32, n: u32) -> u64 {
    u64::from((v >> lo) & ((1u32 << n) - 1))
}
