//! Compact per-frame hash snapshots.
//!
//! A [`HashSnapshot`] remembers, for every *tracked* guest frame, the hash of the bytes last sent
//! for it. Memory: 8 bytes per tracked page (the hash), plus, per frame of the tracked span, one bit
//! for "tracked", one bit for "recorded" and a 32-bit rank per 64 frames — 0.31 bytes per spanned
//! frame. The optional sampling pre-filter adds 4 bytes per tracked page.
//!
//! Hashes are stored densely in frame order; the hash of frame `f` lives at index
//! `rank[f / 64] + popcount(tracked_word & below(f))`, so lookups are O(1) without storing keys.

use crate::addr::{Gfn, PageDigest, PageHash};
use crate::bitmap::{BitmapError, DirtyBitmap};

/// Errors of snapshot construction and updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The frame is not tracked by this snapshot.
    #[error("guest frame 0x{gfn:x} is not tracked by the snapshot")]
    NotTracked {
        /// The frame.
        gfn: u64,
    },
    /// More tracked pages than a snapshot indexes (2^32).
    #[error("{pages} tracked pages exceed the snapshot limit of 2^32")]
    TooManyPages {
        /// Tracked pages requested.
        pages: u64,
    },
    /// The tracked set could not be represented.
    #[error(transparent)]
    Bitmap(#[from] BitmapError),
}

/// Module result type.
pub type Result<T> = std::result::Result<T, SnapshotError>;

/// The hash of the last-sent bytes of every tracked guest frame. See the module docs for layout.
#[derive(Debug, Clone)]
pub struct HashSnapshot {
    tracked: DirtyBitmap,
    recorded: DirtyBitmap,
    ranks: Vec<u32>,
    hashes: Vec<u64>,
    samples: Option<Vec<u32>>,
}

impl HashSnapshot {
    /// A snapshot tracking the frames set in `tracked`, with nothing recorded yet (every tracked
    /// page counts as dirty until a hash is recorded for it).
    pub fn new(tracked: DirtyBitmap) -> Result<Self> {
        let mut ranks = Vec::with_capacity(tracked.words().len() + 1);
        let mut n: u64 = 0;
        for w in tracked.words() {
            ranks.push(u32::try_from(n).map_err(|_| SnapshotError::TooManyPages { pages: n })?);
            n += u64::from(w.count_ones());
        }
        let count = u32::try_from(n).map_err(|_| SnapshotError::TooManyPages { pages: n })?;
        ranks.push(count);
        let recorded = DirtyBitmap::new(tracked.base(), tracked.span_pages())?;
        Ok(HashSnapshot {
            hashes: vec![0; count as usize],
            tracked,
            recorded,
            ranks,
            samples: None,
        })
    }

    /// A snapshot tracking every frame of `[base, base + pages)`.
    pub fn for_range(base: Gfn, pages: u64) -> Result<Self> {
        Self::new(DirtyBitmap::full(base, pages)?)
    }

    /// Also keep a 32-bit sample of every recorded page, enabling the sampling pre-filter in
    /// [`Hasher::diff`](crate::Hasher::diff): a page whose sample changed is dirty without a full
    /// hash. Costs 4 bytes per tracked page. Pages recorded before this call have no sample and are
    /// unrecorded again.
    pub fn with_sampling(mut self) -> Self {
        self.samples = Some(vec![0; self.hashes.len()]);
        self.recorded.clear_all();
        self
    }

    /// Whether the sampling pre-filter is on.
    pub fn has_samples(&self) -> bool {
        self.samples.is_some()
    }

    /// The tracked frames.
    pub fn tracked(&self) -> &DirtyBitmap {
        &self.tracked
    }

    /// The frames with a recorded hash.
    pub fn recorded(&self) -> &DirtyBitmap {
        &self.recorded
    }

    /// Number of tracked pages.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether no page is tracked.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// Heap bytes this snapshot holds (the compactness bound: ≤ 8 per tracked page plus
    /// 0.31 per spanned frame, plus 4 per tracked page with sampling).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(self.tracked.words())
            + std::mem::size_of_val(self.recorded.words())
            + std::mem::size_of_val(self.ranks.as_slice())
            + std::mem::size_of_val(self.hashes.as_slice())
            + self
                .samples
                .as_ref()
                .map_or(0, |s| std::mem::size_of_val(s.as_slice()))
    }

    /// Dense index of a tracked frame.
    pub fn index_of(&self, gfn: Gfn) -> Option<usize> {
        let i = gfn.checked_offset_from(self.tracked.base())?;
        if i >= self.tracked.span_pages() {
            return None;
        }
        let w = (i / 64) as usize;
        let word = *self.tracked.words().get(w)?;
        let bit = i % 64;
        if word >> bit & 1 == 0 {
            return None;
        }
        let below = word & ((1u64 << bit) - 1);
        Some(*self.ranks.get(w)? as usize + below.count_ones() as usize)
    }

    /// The recorded hash of `gfn`, or `None` when untracked or not recorded yet.
    pub fn get(&self, gfn: Gfn) -> Option<PageHash> {
        if !self.recorded.is_set(gfn) {
            return None;
        }
        self.index_of(gfn)
            .and_then(|i| self.hashes.get(i))
            .map(|&h| PageHash(h))
    }

    /// Forget the recorded hash of `gfn` (it counts as dirty again), e.g. when a send failed.
    pub fn invalidate(&mut self, gfn: Gfn) -> Result<()> {
        self.index_of(gfn)
            .ok_or(SnapshotError::NotTracked { gfn: gfn.0 })?;
        self.recorded.clear(gfn)?;
        Ok(())
    }

    /// Record what was sent for `gfn`. Crate-internal on purpose: the public ways to record are
    /// the copying ones, so a hash always describes bytes that were actually sent.
    pub(crate) fn record(&mut self, gfn: Gfn, digest: PageDigest, sample: u32) -> Result<()> {
        let i = self
            .index_of(gfn)
            .ok_or(SnapshotError::NotTracked { gfn: gfn.0 })?;
        self.hashes[i] = digest.hash.0;
        if let Some(s) = self.samples.as_mut() {
            s[i] = sample;
        }
        self.recorded.set(gfn)?;
        Ok(())
    }

    pub(crate) fn ranks(&self) -> &[u32] {
        &self.ranks
    }

    pub(crate) fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    pub(crate) fn samples(&self) -> Option<&[u32]> {
        self.samples.as_deref()
    }

    /// Split-borrow for parallel in-place recording of every tracked page.
    pub(crate) fn parts_mut(&mut self) -> (&DirtyBitmap, &[u32], &mut [u64], Option<&mut [u32]>) {
        (
            &self.tracked,
            &self.ranks,
            &mut self.hashes,
            self.samples.as_deref_mut(),
        )
    }

    pub(crate) fn mark_all_recorded(&mut self) {
        self.recorded = self.tracked.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::PageKind;

    fn digest(h: u64) -> PageDigest {
        PageDigest {
            hash: PageHash(h),
            kind: PageKind::Data,
        }
    }

    #[test]
    fn index_get_record_invalidate() {
        let mut t = DirtyBitmap::new(Gfn(1000), 300).unwrap();
        for g in [1000, 1063, 1064, 1200, 1299] {
            t.set(Gfn(g)).unwrap();
        }
        let mut s = HashSnapshot::new(t).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s.index_of(Gfn(1000)), Some(0));
        assert_eq!(s.index_of(Gfn(1064)), Some(2));
        assert_eq!(s.index_of(Gfn(1299)), Some(4));
        assert_eq!(s.index_of(Gfn(1001)), None);
        assert_eq!(s.index_of(Gfn(999)), None);
        assert_eq!(s.get(Gfn(1200)), None);
        s.record(Gfn(1200), digest(42), 0).unwrap();
        assert_eq!(s.get(Gfn(1200)), Some(PageHash(42)));
        assert_eq!(
            s.record(Gfn(1201), digest(1), 0),
            Err(SnapshotError::NotTracked { gfn: 1201 })
        );
        s.invalidate(Gfn(1200)).unwrap();
        assert_eq!(s.get(Gfn(1200)), None);
    }

    #[test]
    fn memory_bound_for_a_2_5_gib_vgpu() {
        // 655,360 pages (2.5 GiB), contiguous: 8 bytes each plus 0.31 bytes per frame (200 KiB).
        let pages = 655_360u64;
        let s = HashSnapshot::for_range(Gfn(0x10_0000), pages).unwrap();
        let bytes = s.memory_bytes() as u64;
        assert!(bytes <= 8 * pages + pages * 5 / 16 + 64, "{bytes} bytes");
        assert!(bytes < 6 * 1024 * 1024);

        // The same pages scattered every 4th frame over a 10 GiB span: the overhead grows with
        // the span (0.31 B/frame), still far below a keyed table's 16 B/page.
        let mut t = DirtyBitmap::new(Gfn(0), 4 * pages).unwrap();
        for i in 0..pages {
            t.set(Gfn(4 * i)).unwrap();
        }
        let s = HashSnapshot::new(t).unwrap();
        let bytes = s.memory_bytes() as u64;
        assert!(
            bytes <= 8 * pages + (4 * pages) * 5 / 16 + 64,
            "{bytes} bytes"
        );

        let with = HashSnapshot::for_range(Gfn(0), pages)
            .unwrap()
            .with_sampling();
        assert!(with.memory_bytes() as u64 <= 12 * pages + pages * 5 / 16 + 64);
    }
}
