//! The writable-frames hint (format 1.2): guest frames the device can write through its own
//! translation tables (a GPU's GTTs), sent during pre-copy so that a destination can back them
//! with memory before the stop. A page that pre-copy found zero is applied on the destination
//! without a write, so the destination never touches it; if the device then writes it, its first
//! touch would otherwise be a page fault in the downtime. The hint is advisory: a destination
//! that ignores it is correct, only slower.
//!
//! Payload: ranges of `(first frame u64, count u64)`, little-endian, sorted, disjoint and not
//! adjacent, each count at least 1, every frame below the header's `guest_pages`.

use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::error::{Result, StreamError};
use super::header::Gfn;
use super::wire::{FRAME_RANGE_LEN, MAX_FRAME_RANGES_PER_SECTION};

/// A run of `count` guest frames from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRange {
    /// First frame.
    pub start: Gfn,
    /// Frames in the run (at least 1).
    pub count: u64,
}

impl FrameRange {
    /// The frames of the run (those below 2^64: a run a reader validated lies wholly there).
    pub fn frames(&self) -> impl Iterator<Item = Gfn> {
        let start = self.start.0;
        (0..self.count).map_while(move |i| start.checked_add(i).map(Gfn))
    }
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct WireRange {
    start: U64,
    count: U64,
}

const _: () = assert!(std::mem::size_of::<WireRange>() == FRAME_RANGE_LEN);

/// `frames` (in any order, repeats allowed) as sorted, disjoint, non-adjacent runs.
pub fn frame_ranges(frames: &[Gfn]) -> Vec<FrameRange> {
    let mut sorted: Vec<u64> = frames.iter().map(|g| g.0).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<FrameRange> = Vec::new();
    for f in sorted {
        match out.last_mut() {
            Some(r) if r.start.0.checked_add(r.count) == Some(f) => r.count += 1,
            _ => out.push(FrameRange {
                start: Gfn(f),
                count: 1,
            }),
        }
    }
    out
}

/// The payload of one section holding `ranges` (at most [`MAX_FRAME_RANGES_PER_SECTION`]).
pub(crate) fn encode(ranges: &[FrameRange]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ranges.len() * FRAME_RANGE_LEN);
    for r in ranges {
        let w = WireRange {
            start: U64::new(r.start.0),
            count: U64::new(r.count),
        };
        out.extend_from_slice(w.as_bytes());
    }
    out
}

/// Validate a received hint payload at stream offset `base` for a guest of `guest_pages`.
pub(crate) fn parse(payload: &[u8], guest_pages: u64, base: u64) -> Result<Vec<FrameRange>> {
    let bad = |at: usize, reason| StreamError::BadFrameHint {
        offset: base + at as u64,
        reason,
    };
    if payload.is_empty() || !payload.len().is_multiple_of(FRAME_RANGE_LEN) {
        return Err(bad(0, "length is not a positive multiple of 16 bytes"));
    }
    if payload.len() / FRAME_RANGE_LEN > MAX_FRAME_RANGES_PER_SECTION {
        return Err(bad(0, "more ranges than one section may carry"));
    }
    let mut out = Vec::with_capacity(payload.len() / FRAME_RANGE_LEN);
    let mut next_free = 0u64;
    for (i, chunk) in payload.chunks_exact(FRAME_RANGE_LEN).enumerate() {
        let at = i * FRAME_RANGE_LEN;
        let w = WireRange::read_from_bytes(chunk).map_err(|_| bad(at, "range truncated"))?;
        let (start, count) = (w.start.get(), w.count.get());
        if count == 0 {
            return Err(bad(at, "empty range"));
        }
        let end = start
            .checked_add(count)
            .filter(|&e| e <= guest_pages)
            .ok_or(bad(at, "range reaches past guest memory"))?;
        if i > 0 && start <= next_free {
            return Err(bad(at, "ranges out of order, overlapping or adjacent"));
        }
        next_free = end;
        out.push(FrameRange {
            start: Gfn(start),
            count,
        });
    }
    Ok(out)
}
