//! Page-granular dirty bitmaps in KVM's layout.
//!
//! A [`DirtyBitmap`] covers the frames `[base, base + pages)`. Bit `i` (bit `i % 64` of `u64` word
//! `i / 64`) stands for frame `base + i`: exactly the layout `KVM_GET_DIRTY_LOG` fills for a memslot
//! and the layout VFIO's DMA-logging report uses for an IOVA range (with the range's page size).
//! Bits past `pages` in the last word are always zero.
//!
//! The bitmap itself is granule-agnostic: for a VFIO DMA-logging report over an IOVA range with a
//! page size other than 4 KiB, use `iova / page_size` as the frame number.

use crate::addr::Gfn;

/// Errors of bitmap construction and merging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BitmapError {
    /// The span does not fit in the address space or in memory.
    #[error("bitmap span of {pages} pages at frame 0x{base:x} is too large")]
    TooLarge {
        /// First frame.
        base: u64,
        /// Requested number of pages.
        pages: u64,
    },
    /// A word buffer has the wrong length for the span.
    #[error("bitmap of {pages} pages needs {expected} u64 words, got {got}")]
    WrongWordCount {
        /// Pages in the span.
        pages: u64,
        /// Words the span needs.
        expected: usize,
        /// Words supplied.
        got: usize,
    },
    /// A bit is set past the end of the span (in the last word's padding).
    #[error("bit {bit} is set but the bitmap covers only {pages} pages")]
    StrayBit {
        /// Index of the offending bit.
        bit: u64,
        /// Pages in the span.
        pages: u64,
    },
    /// A frame lies outside the bitmap's span.
    #[error("frame 0x{gfn:x} is outside the bitmap span [0x{base:x}, +0x{pages:x})")]
    OutOfSpan {
        /// The frame.
        gfn: u64,
        /// First frame of the span.
        base: u64,
        /// Pages in the span.
        pages: u64,
    },
    /// A merge would drop dirty pages that lie outside the destination's span.
    #[error(
        "{lost} dirty pages of the merged bitmap lie outside the span [0x{base:x}, +0x{pages:x})"
    )]
    MergeOutOfSpan {
        /// Dirty pages that would be lost.
        lost: u64,
        /// First frame of the destination span.
        base: u64,
        /// Pages in the destination span.
        pages: u64,
    },
}

/// Module result type.
pub type Result<T> = std::result::Result<T, BitmapError>;

/// Number of `u64` words a span of `pages` needs, or `None` when it cannot be allocated.
pub fn words_for(pages: u64) -> Option<usize> {
    usize::try_from(pages.div_ceil(64)).ok()
}

/// A set of guest frames over a fixed span, one bit per page, KVM dirty-log layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyBitmap {
    base: Gfn,
    pages: u64,
    words: Vec<u64>,
}

/// The largest span a bitmap may cover: 2^36 pages (256 TiB of 4 KiB pages; a 1 GiB bitmap), so a
/// span taken from a peer cannot make us allocate without bound.
pub const MAX_PAGES: u64 = 1 << 36;

impl DirtyBitmap {
    /// An empty bitmap over `[base, base + pages)`.
    pub fn new(base: Gfn, pages: u64) -> Result<Self> {
        let n = Self::check_span(base, pages)?;
        Ok(DirtyBitmap {
            base,
            pages,
            words: vec![0; n],
        })
    }

    /// A bitmap with every page of `[base, base + pages)` set.
    pub fn full(base: Gfn, pages: u64) -> Result<Self> {
        let mut b = Self::new(base, pages)?;
        b.words.fill(u64::MAX);
        b.clear_padding();
        Ok(b)
    }

    /// Take ownership of KVM-layout words. `words.len()` must be exactly `ceil(pages / 64)` and no
    /// bit past `pages` may be set (KVM's `KVM_GET_DIRTY_LOG` guarantees both for a memslot).
    pub fn from_words(base: Gfn, pages: u64, words: Vec<u64>) -> Result<Self> {
        let n = Self::check_span(base, pages)?;
        if words.len() != n {
            return Err(BitmapError::WrongWordCount {
                pages,
                expected: n,
                got: words.len(),
            });
        }
        let b = DirtyBitmap { base, pages, words };
        if let Some(bit) = b.first_padding_bit() {
            return Err(BitmapError::StrayBit { bit, pages });
        }
        Ok(b)
    }

    /// Parse a little-endian byte image of the words (what a VFIO DMA-logging report or a wire
    /// format carries): `bytes.len()` must be exactly `8 * ceil(pages / 64)`; padding bits must be 0.
    pub fn from_le_bytes(base: Gfn, pages: u64, bytes: &[u8]) -> Result<Self> {
        let n = Self::check_span(base, pages)?;
        if bytes.len() != n.saturating_mul(8) {
            return Err(BitmapError::WrongWordCount {
                pages,
                expected: n,
                got: bytes.len() / 8,
            });
        }
        let words = bytes
            .chunks_exact(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w.copy_from_slice(c);
                u64::from_le_bytes(w)
            })
            .collect();
        Self::from_words(base, pages, words)
    }

    /// The words as little-endian bytes (`8 * ceil(pages / 64)` of them).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn check_span(base: Gfn, pages: u64) -> Result<usize> {
        let too_large = BitmapError::TooLarge {
            base: base.0,
            pages,
        };
        if pages > MAX_PAGES || base.checked_add(pages).is_none() {
            return Err(too_large);
        }
        words_for(pages).ok_or(too_large)
    }

    fn first_padding_bit(&self) -> Option<u64> {
        let rem = self.pages % 64;
        if rem == 0 {
            return None;
        }
        let last = *self.words.last()?;
        let stray = last & !((1u64 << rem) - 1);
        (stray != 0).then(|| (self.words.len() as u64 - 1) * 64 + u64::from(stray.trailing_zeros()))
    }

    fn clear_padding(&mut self) {
        let rem = self.pages % 64;
        if rem != 0 {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u64 << rem) - 1;
            }
        }
    }

    /// First frame of the span.
    pub fn base(&self) -> Gfn {
        self.base
    }

    /// Number of pages in the span (set or not).
    pub fn span_pages(&self) -> u64 {
        self.pages
    }

    /// One past the last frame of the span.
    pub fn end(&self) -> Gfn {
        // check_span guaranteed this does not overflow.
        Gfn(self.base.0 + self.pages)
    }

    /// The words, KVM layout (bit `i` = frame `base + i`).
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// Give the words back (KVM layout).
    pub fn into_words(self) -> Vec<u64> {
        self.words
    }

    /// Mutable words for producers that fill the bitmap in place (e.g. an ioctl). Bits past the
    /// span are cleared again when the returned guard is dropped, so the invariant holds.
    pub fn words_mut(&mut self) -> WordsMut<'_> {
        WordsMut(self)
    }

    /// Whether `gfn` lies inside the span.
    pub fn in_span(&self, gfn: Gfn) -> bool {
        gfn >= self.base && gfn < self.end()
    }

    fn bit_of(&self, gfn: Gfn) -> Result<u64> {
        match gfn.checked_offset_from(self.base) {
            Some(i) if i < self.pages => Ok(i),
            _ => Err(BitmapError::OutOfSpan {
                gfn: gfn.0,
                base: self.base.0,
                pages: self.pages,
            }),
        }
    }

    /// Whether `gfn` is set (`false` outside the span).
    pub fn is_set(&self, gfn: Gfn) -> bool {
        self.bit_of(gfn)
            .ok()
            .and_then(|i| {
                self.words
                    .get((i / 64) as usize)
                    .map(|w| w >> (i % 64) & 1 == 1)
            })
            .unwrap_or(false)
    }

    /// Set `gfn`; returns whether it was already set.
    pub fn set(&mut self, gfn: Gfn) -> Result<bool> {
        let i = self.bit_of(gfn)?;
        let w = &mut self.words[(i / 64) as usize];
        let was = *w >> (i % 64) & 1 == 1;
        *w |= 1 << (i % 64);
        Ok(was)
    }

    /// Clear `gfn`; returns whether it was set.
    pub fn clear(&mut self, gfn: Gfn) -> Result<bool> {
        let i = self.bit_of(gfn)?;
        let w = &mut self.words[(i / 64) as usize];
        let was = *w >> (i % 64) & 1 == 1;
        *w &= !(1 << (i % 64));
        Ok(was)
    }

    /// Set the `count` frames starting at `start`.
    pub fn set_range(&mut self, start: Gfn, count: u64) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let first = self.bit_of(start)?;
        let last_gfn = start.checked_add(count - 1).ok_or(BitmapError::OutOfSpan {
            gfn: start.0,
            base: self.base.0,
            pages: self.pages,
        })?;
        let last = self.bit_of(last_gfn)?;
        let mut i = first;
        while i <= last {
            let w = (i / 64) as usize;
            let lo = i % 64;
            let hi = if last / 64 == i / 64 { last % 64 } else { 63 };
            let mask = (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
            self.words[w] |= mask;
            i = (w as u64 + 1) * 64;
        }
        Ok(())
    }

    /// Clear every bit.
    pub fn clear_all(&mut self) {
        self.words.fill(0);
    }

    /// Number of set pages.
    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// Whether any page is set.
    pub fn any(&self) -> bool {
        self.words.iter().any(|&w| w != 0)
    }

    /// Iterate over the set frames in ascending order.
    pub fn iter(&self) -> SetBits<'_> {
        SetBits {
            words: &self.words,
            base: self.base,
            next_word: 0,
            cur: 0,
            cur_base: 0,
        }
    }

    /// Iterate over maximal runs of consecutive set frames as `(first, count)`.
    pub fn runs(&self) -> Runs<'_> {
        Runs {
            bits: self.iter(),
            pending: None,
        }
    }

    /// 64 bits of this bitmap starting at signed bit position `pos` (bits outside the span read 0).
    pub(crate) fn extract64(&self, pos: i128) -> u64 {
        if pos <= -64 || pos >= i128::from(self.pages) {
            return 0;
        }
        if pos < 0 {
            // -64 < pos < 0: the word at 0, shifted up.
            let first = self.words.first().copied().unwrap_or(0);
            return first << ((-pos) as u32);
        }
        let pos = pos as u64;
        let i = (pos / 64) as usize;
        let sh = (pos % 64) as u32;
        let lo = self.words.get(i).copied().unwrap_or(0) >> sh;
        if sh == 0 {
            lo
        } else {
            lo | self.words.get(i + 1).copied().unwrap_or(0) << (64 - sh)
        }
    }

    /// `other`'s bits re-based onto this bitmap's word `k` (bits of `other` outside its span are 0).
    pub(crate) fn foreign_word(&self, other: &DirtyBitmap, k: usize) -> u64 {
        let pos = i128::from(self.base.0) + 64 * k as i128 - i128::from(other.base.0);
        other.extract64(pos)
    }

    /// Set pages of `self` in bit range `[lo, hi)` of the span.
    fn count_bits(&self, lo: u64, hi: u64) -> u64 {
        let mut n = 0;
        let mut i = lo;
        while i < hi {
            let w = self.words.get((i / 64) as usize).copied().unwrap_or(0);
            let start = i % 64;
            let end = if hi / 64 == i / 64 { hi % 64 } else { 64 };
            let mask = if end == 64 {
                u64::MAX << start
            } else {
                ((1u64 << end) - 1) & (u64::MAX << start)
            };
            n += u64::from((w & mask).count_ones());
            i = (i / 64 + 1) * 64;
        }
        n
    }

    /// Union `other` into `self` (the combined CPU + GPU dirty set). Spans may differ and need not
    /// be word aligned to each other. Fails without changing `self` when `other` has a set page
    /// outside `self`'s span, since dropping it would lose a dirty page.
    pub fn merge(&mut self, other: &DirtyBitmap) -> Result<()> {
        // Portion of other's span that overlaps self's span, in other's bit indices.
        let lo = self.base.0.saturating_sub(other.base.0).min(other.pages);
        let hi = self
            .end()
            .0
            .saturating_sub(other.base.0)
            .min(other.pages)
            .max(lo);
        let inside = other.count_bits(lo, hi);
        let total = other.count();
        if inside != total {
            return Err(BitmapError::MergeOutOfSpan {
                lost: total - inside,
                base: self.base.0,
                pages: self.pages,
            });
        }
        if self.base == other.base && self.pages == other.pages {
            for (d, s) in self.words.iter_mut().zip(&other.words) {
                *d |= s;
            }
            return Ok(());
        }
        for k in 0..self.words.len() {
            let w = self.foreign_word(other, k);
            self.words[k] |= w;
        }
        self.clear_padding();
        Ok(())
    }

    /// Union a KVM dirty log (`KVM_GET_DIRTY_LOG` output for a memslot of `pages` pages starting at
    /// frame `slot_base`) into `self`. Errors as [`DirtyBitmap::from_words`] and
    /// [`DirtyBitmap::merge`].
    pub fn merge_kvm_log(&mut self, slot_base: Gfn, pages: u64, words: &[u64]) -> Result<()> {
        let log = DirtyBitmap::from_words(slot_base, pages, words.to_vec())?;
        self.merge(&log)
    }

    /// Keep only pages also set in `other` (pages outside `other`'s span are cleared).
    pub fn intersect(&mut self, other: &DirtyBitmap) {
        for k in 0..self.words.len() {
            let w = self.foreign_word(other, k);
            self.words[k] &= w;
        }
    }

    /// Clear every page set in `other`.
    pub fn subtract(&mut self, other: &DirtyBitmap) {
        for k in 0..self.words.len() {
            let w = self.foreign_word(other, k);
            self.words[k] &= !w;
        }
    }
}

/// Mutable access to a bitmap's words; see [`DirtyBitmap::words_mut`].
#[derive(Debug)]
pub struct WordsMut<'a>(&'a mut DirtyBitmap);

impl std::ops::Deref for WordsMut<'_> {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        &self.0.words
    }
}

impl std::ops::DerefMut for WordsMut<'_> {
    fn deref_mut(&mut self) -> &mut [u64] {
        &mut self.0.words
    }
}

impl Drop for WordsMut<'_> {
    fn drop(&mut self) {
        self.0.clear_padding();
    }
}

/// Iterator over set frames; see [`DirtyBitmap::iter`].
#[derive(Debug, Clone)]
pub struct SetBits<'a> {
    words: &'a [u64],
    base: Gfn,
    next_word: usize,
    cur: u64,
    cur_base: u64,
}

impl Iterator for SetBits<'_> {
    type Item = Gfn;

    fn next(&mut self) -> Option<Gfn> {
        while self.cur == 0 {
            let w = *self.words.get(self.next_word)?;
            self.cur = w;
            self.cur_base = self.next_word as u64 * 64;
            self.next_word += 1;
        }
        let bit = u64::from(self.cur.trailing_zeros());
        self.cur &= self.cur - 1;
        Some(Gfn(self.base.0 + self.cur_base + bit))
    }
}

/// Iterator over runs of set frames; see [`DirtyBitmap::runs`].
#[derive(Debug, Clone)]
pub struct Runs<'a> {
    bits: SetBits<'a>,
    pending: Option<(Gfn, u64)>,
}

impl Iterator for Runs<'_> {
    type Item = (Gfn, u64);

    fn next(&mut self) -> Option<(Gfn, u64)> {
        loop {
            match (self.bits.next(), self.pending) {
                (Some(g), None) => self.pending = Some((g, 1)),
                (Some(g), Some((start, n))) if g.0 == start.0 + n => {
                    self.pending = Some((start, n + 1));
                }
                (Some(g), Some(run)) => {
                    self.pending = Some((g, 1));
                    return Some(run);
                }
                (None, run) => {
                    self.pending = None;
                    return run;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_iter_runs() {
        let mut b = DirtyBitmap::new(Gfn(100), 200).unwrap();
        for g in [100, 101, 102, 163, 164, 299] {
            assert!(!b.set(Gfn(g)).unwrap());
        }
        assert!(b.set(Gfn(101)).unwrap());
        assert!(b.set(Gfn(300)).is_err());
        assert!(b.set(Gfn(99)).is_err());
        assert_eq!(b.count(), 6);
        let got: Vec<u64> = b.iter().map(|g| g.0).collect();
        assert_eq!(got, vec![100, 101, 102, 163, 164, 299]);
        let runs: Vec<(u64, u64)> = b.runs().map(|(g, n)| (g.0, n)).collect();
        assert_eq!(runs, vec![(100, 3), (163, 2), (299, 1)]);
        assert!(b.clear(Gfn(163)).unwrap());
        assert!(!b.is_set(Gfn(163)));
    }

    #[test]
    fn kvm_layout_and_padding() {
        // 70 pages: two words, bits 6..63 of word 1 are padding.
        let words = vec![0b1010, 1 << 5];
        let b = DirtyBitmap::from_words(Gfn(0), 70, words.clone()).unwrap();
        assert!(b.is_set(Gfn(1)) && b.is_set(Gfn(3)) && b.is_set(Gfn(69)));
        assert_eq!(
            DirtyBitmap::from_words(Gfn(0), 70, vec![0, 1 << 6]),
            Err(BitmapError::StrayBit { bit: 70, pages: 70 })
        );
        assert!(matches!(
            DirtyBitmap::from_words(Gfn(0), 70, vec![0]),
            Err(BitmapError::WrongWordCount {
                expected: 2,
                got: 1,
                ..
            })
        ));
        assert!(DirtyBitmap::new(Gfn(u64::MAX - 3), 10).is_err());
        assert!(matches!(
            DirtyBitmap::new(Gfn(0), MAX_PAGES + 1),
            Err(BitmapError::TooLarge { .. })
        ));
        let full = DirtyBitmap::full(Gfn(0), 70).unwrap();
        assert_eq!(full.count(), 70);
    }

    #[test]
    fn le_bytes_round_trip_and_reject_bad_lengths() {
        let mut b = DirtyBitmap::new(Gfn(0x40), 100).unwrap();
        b.set(Gfn(0x40)).unwrap();
        b.set(Gfn(0x40 + 99)).unwrap();
        let bytes = b.to_le_bytes();
        assert_eq!(bytes.len(), 16);
        assert_eq!(bytes[0], 1);
        assert_eq!(DirtyBitmap::from_le_bytes(Gfn(0x40), 100, &bytes), Ok(b));
        assert!(DirtyBitmap::from_le_bytes(Gfn(0x40), 100, &bytes[..15]).is_err());
        let mut stray = bytes.clone();
        stray[15] = 0x80;
        assert!(matches!(
            DirtyBitmap::from_le_bytes(Gfn(0x40), 100, &stray),
            Err(BitmapError::StrayBit { bit: 127, .. })
        ));
    }

    #[test]
    fn set_range_matches_single_sets() {
        for (start, n) in [(0u64, 1u64), (3, 61), (3, 62), (63, 2), (10, 200), (0, 256)] {
            let mut a = DirtyBitmap::new(Gfn(7), 300).unwrap();
            let mut b = a.clone();
            a.set_range(Gfn(7 + start), n).unwrap();
            for i in 0..n {
                b.set(Gfn(7 + start + i)).unwrap();
            }
            assert_eq!(a, b, "start {start} n {n}");
        }
        let mut a = DirtyBitmap::new(Gfn(0), 10).unwrap();
        assert!(a.set_range(Gfn(5), 6).is_err());
    }

    #[test]
    fn merge_unaligned_and_out_of_span() {
        let mut gpu = DirtyBitmap::new(Gfn(1000), 500).unwrap();
        gpu.set(Gfn(1000)).unwrap();
        let mut kvm = DirtyBitmap::new(Gfn(1037), 100).unwrap();
        kvm.set(Gfn(1037)).unwrap();
        kvm.set(Gfn(1136)).unwrap();
        gpu.merge(&kvm).unwrap();
        let got: Vec<u64> = gpu.iter().map(|g| g.0).collect();
        assert_eq!(got, vec![1000, 1037, 1136]);

        // A log that starts before the span: bits inside still merge, outside ones refuse.
        let mut early = DirtyBitmap::new(Gfn(990), 20).unwrap();
        early.set(Gfn(1005)).unwrap();
        gpu.merge(&early).unwrap();
        assert!(gpu.is_set(Gfn(1005)));
        early.set(Gfn(995)).unwrap();
        let before = gpu.clone();
        assert_eq!(
            gpu.merge(&early),
            Err(BitmapError::MergeOutOfSpan {
                lost: 1,
                base: 1000,
                pages: 500
            })
        );
        assert_eq!(gpu, before);
    }

    #[test]
    fn intersect_and_subtract() {
        let mut a = DirtyBitmap::full(Gfn(0), 130).unwrap();
        let mut c = DirtyBitmap::new(Gfn(60), 10).unwrap();
        c.set(Gfn(61)).unwrap();
        c.set(Gfn(69)).unwrap();
        let mut b = a.clone();
        a.intersect(&c);
        assert_eq!(a.iter().map(|g| g.0).collect::<Vec<_>>(), vec![61, 69]);
        b.subtract(&c);
        assert_eq!(b.count(), 128);
        assert!(!b.is_set(Gfn(61)));
    }
}
