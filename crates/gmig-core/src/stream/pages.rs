//! Page batches: the records that carry guest pages (full or zero).

use super::error::Result;
use super::error::StreamError;
use super::header::Gfn;
use super::wire::WirePageRecord;
use super::wire::ENCODING_FULL;
use super::wire::ENCODING_ZERO;
use super::wire::MAX_PAGES_PER_BATCH;
use super::wire::PAGE_BATCH_HEADER_LEN;
use super::wire::PAGE_RECORD_LEN;
use super::wire::PAGE_SIZE;
use zerocopy::little_endian::U32;
use zerocopy::little_endian::U64;
use zerocopy::FromBytes;
use zerocopy::IntoBytes;

/// One page of a batch: all zeroes, or its full contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageData<'a> {
    /// The page is all zeroes; no data travels.
    Zero,
    /// The page's bytes.
    Full(&'a [u8; PAGE_SIZE]),
}

/// The record that introduces `gfn`'s page in a batch.
fn record(gfn: Gfn, zero: bool) -> WirePageRecord {
    WirePageRecord {
        gfn: U64::new(gfn.0),
        encoding: U32::new(if zero { ENCODING_ZERO } else { ENCODING_FULL }),
        reserved: U32::new(0),
    }
}

/// A batch of pages, built by a sender or parsed (and fully validated) by a receiver.
///
/// The batch keeps its wire payload as is, so sending copies nothing more and receiving hands out
/// page slices that borrow from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageBatch {
    pub(crate) payload: Vec<u8>,
    pub(crate) count: u32,
    pub(crate) zero: u32,
}

impl Default for PageBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl PageBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty batch with room for `pages` full pages.
    pub fn with_capacity(pages: usize) -> Self {
        let pages = pages.min(MAX_PAGES_PER_BATCH as usize);
        let mut payload =
            Vec::with_capacity(PAGE_BATCH_HEADER_LEN + pages * (PAGE_RECORD_LEN + PAGE_SIZE));
        payload.extend_from_slice(&[0; PAGE_BATCH_HEADER_LEN]);
        Self {
            payload,
            count: 0,
            zero: 0,
        }
    }

    /// Pages in the batch.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the batch holds no page.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether the batch holds [`MAX_PAGES_PER_BATCH`] pages and takes no more.
    pub fn is_full(&self) -> bool {
        self.count >= MAX_PAGES_PER_BATCH
    }

    /// Pages sent as zero markers.
    pub fn zero_pages(&self) -> usize {
        self.zero as usize
    }

    /// Bytes of the batch's section payload.
    pub fn payload_len(&self) -> usize {
        self.payload.len()
    }

    /// Add a page, as a zero marker when it is all zeroes. Returns `false` (and adds nothing) when
    /// the batch is full.
    pub fn push(&mut self, gfn: Gfn, page: &[u8; PAGE_SIZE]) -> bool {
        if self.is_full() {
            return false;
        }
        let zero = is_zero_page(page);
        self.payload.extend_from_slice(record(gfn, zero).as_bytes());
        if !zero {
            self.payload.extend_from_slice(page);
        }
        self.counted(zero);
        true
    }

    /// Counts a record just appended (a zero marker or not) in the batch and its header.
    fn counted(&mut self, zero: bool) {
        if zero {
            self.zero += 1;
        }
        self.count += 1;
        let count = self.count.to_le_bytes();
        self.payload[..4].copy_from_slice(&count);
    }

    /// Add a page that `fill` writes straight into the batch (no intermediate copy), as a zero
    /// marker when it turns out all zeroes. Returns `Ok(false)` (and adds nothing) when the batch
    /// is full; when `fill` fails, the batch is left as it was and its error is returned.
    pub fn push_from<E>(
        &mut self,
        gfn: Gfn,
        fill: impl FnOnce(&mut [u8; PAGE_SIZE]) -> core::result::Result<(), E>,
    ) -> core::result::Result<bool, E> {
        if self.is_full() {
            return Ok(false);
        }
        // Room for the record and the page; the record is written once the page is known.
        let at = self.payload.len();
        self.payload.resize(at + PAGE_RECORD_LEN + PAGE_SIZE, 0);
        // The payload was just grown by a record and a page, so its last PAGE_SIZE bytes are the
        // page; should that ever not hold, nothing is added.
        let Some(page) = self.payload.last_chunk_mut::<PAGE_SIZE>() else {
            self.payload.truncate(at);
            return Ok(false);
        };
        let zero = match fill(page).map(|()| is_zero_page(page)) {
            Ok(zero) => zero,
            Err(e) => {
                self.payload.truncate(at);
                return Err(e);
            }
        };
        if zero {
            self.payload.truncate(at + PAGE_RECORD_LEN);
        }
        self.payload[at..at + PAGE_RECORD_LEN].copy_from_slice(record(gfn, zero).as_bytes());
        self.counted(zero);
        Ok(true)
    }

    /// Empty the batch, keeping its allocation.
    pub fn clear(&mut self) {
        self.payload.truncate(PAGE_BATCH_HEADER_LEN);
        self.payload[..4].copy_from_slice(&[0; 4]);
        self.count = 0;
        self.zero = 0;
    }

    /// The pages, in the order they were added.
    pub fn iter(&self) -> PageIter<'_> {
        PageIter {
            rest: self.payload.get(PAGE_BATCH_HEADER_LEN..).unwrap_or(&[]),
        }
    }

    /// Validate a received payload: counts, encodings, reserved words, frames below
    /// `guest_pages`, and an exact length. `base` is the payload's stream offset, for errors.
    pub fn parse(payload: Vec<u8>, guest_pages: u64, base: u64) -> Result<Self> {
        let bad = |at: usize, reason: &'static str| StreamError::BadPageBatch {
            offset: base + at as u64,
            reason,
        };
        let head = payload
            .get(..PAGE_BATCH_HEADER_LEN)
            .ok_or(bad(0, "payload shorter than the batch header"))?;
        let count = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        if head[4..8] != [0; 4] {
            return Err(bad(4, "reserved word is not zero"));
        }
        if count == 0 {
            return Err(bad(0, "empty batch"));
        }
        if count > MAX_PAGES_PER_BATCH {
            return Err(bad(0, "more records than a batch may hold"));
        }
        let mut at = PAGE_BATCH_HEADER_LEN;
        let mut zero = 0u32;
        for _ in 0..count {
            let rec_bytes = payload
                .get(at..)
                .ok_or(bad(at, "record past the payload"))?;
            let (rec, _) = WirePageRecord::read_from_prefix(rec_bytes)
                .map_err(|_| bad(at, "record header truncated"))?;
            let gfn = rec.gfn.get();
            if gfn >= guest_pages {
                return Err(StreamError::PageOutOfRange {
                    offset: base + at as u64,
                    gfn,
                    pages: guest_pages,
                });
            }
            if rec.reserved.get() != 0 {
                return Err(bad(at + 12, "record reserved word is not zero"));
            }
            let data_len = match rec.encoding.get() {
                ENCODING_FULL => PAGE_SIZE,
                ENCODING_ZERO => {
                    zero += 1;
                    0
                }
                encoding => {
                    return Err(StreamError::BadPageEncoding {
                        offset: base + at as u64 + 8,
                        encoding,
                    })
                }
            };
            at = at
                .checked_add(PAGE_RECORD_LEN + data_len)
                .ok_or(bad(at, "record length overflows"))?;
            if at > payload.len() {
                return Err(bad(at, "page data past the payload"));
            }
        }
        if at != payload.len() {
            return Err(bad(at, "trailing bytes after the last record"));
        }
        Ok(Self {
            payload,
            count,
            zero,
        })
    }
}

/// Iterator over a [`PageBatch`]'s pages.
#[derive(Debug, Clone)]
pub struct PageIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for PageIter<'a> {
    type Item = (Gfn, PageData<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        // A batch is validated when built or parsed, so every record here is complete; a short
        // remainder simply ends the iteration.
        let (rec, rest) = WirePageRecord::read_from_prefix(self.rest).ok()?;
        let gfn = Gfn(rec.gfn.get());
        if rec.encoding.get() == ENCODING_ZERO {
            self.rest = rest;
            return Some((gfn, PageData::Zero));
        }
        let (page, rest) = rest.split_first_chunk::<PAGE_SIZE>()?;
        self.rest = rest;
        Some((gfn, PageData::Full(page)))
    }
}

/// Whether a page is all zeroes.
pub fn is_zero_page(page: &[u8; PAGE_SIZE]) -> bool {
    // OR-folding 64-byte blocks vectorises; the early exit keeps dirty pages cheap.
    page.chunks_exact(64)
        .all(|block| block.iter().fold(0u8, |acc, &b| acc | b) == 0)
}
