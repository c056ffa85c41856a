//! Guest frame numbers and page hashes.

use vm_memory::GuestAddress;

/// Size of one guest page in bytes (4 KiB, the granule of KVM's dirty log and of GGTT entries).
pub const PAGE_SIZE: usize = 4096;
/// `log2(PAGE_SIZE)`.
pub const PAGE_SHIFT: u32 = 12;

/// A guest frame number: a guest-physical address divided by [`PAGE_SIZE`].
///
/// Arithmetic is explicit and checked (vm-memory style), so a frame number is never silently mixed
/// with a byte address.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Gfn(pub u64);

impl Gfn {
    /// The frame starting at `addr`, or `None` when `addr` is not page aligned.
    pub fn from_addr(addr: GuestAddress) -> Option<Gfn> {
        addr.0
            .is_multiple_of(PAGE_SIZE as u64)
            .then_some(Gfn(addr.0 >> PAGE_SHIFT))
    }

    /// The frame that contains `addr`.
    pub fn containing(addr: GuestAddress) -> Gfn {
        Gfn(addr.0 >> PAGE_SHIFT)
    }

    /// Guest-physical address of the frame's first byte, or `None` on overflow.
    pub fn addr(self) -> Option<GuestAddress> {
        self.0.checked_mul(PAGE_SIZE as u64).map(GuestAddress)
    }

    /// `self + pages`, or `None` on overflow.
    pub fn checked_add(self, pages: u64) -> Option<Gfn> {
        self.0.checked_add(pages).map(Gfn)
    }

    /// `self - base` in pages, or `None` when `base > self`.
    pub fn checked_offset_from(self, base: Gfn) -> Option<u64> {
        self.0.checked_sub(base.0)
    }
}

/// The xxh3-64 hash of one 4 KiB page (bit-identical to `xxhash_rust::xxh3::xxh3_64` of the page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageHash(pub u64);

impl PageHash {
    /// The hash of an all-zero page, computed at compile time from the reference implementation.
    pub const ZERO_PAGE: PageHash = PageHash(xxhash_rust::const_xxh3::xxh3_64(&[0u8; PAGE_SIZE]));
}

/// What a page holds, as far as the sender cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PageKind {
    /// Every byte is zero: send a zero-page marker instead of 4 KiB of data.
    Zero,
    /// Anything else: send the data.
    Data,
}

/// The hash of a page together with its zero-page marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageDigest {
    /// xxh3-64 of the page's bytes (for a zero page this is [`PageHash::ZERO_PAGE`]).
    pub hash: PageHash,
    /// Whether the page is all zero.
    pub kind: PageKind,
}

impl PageDigest {
    /// Digest placeholder for buffers the caller pre-allocates (`hash` 0, `kind` data).
    pub const EMPTY: PageDigest = PageDigest {
        hash: PageHash(0),
        kind: PageKind::Data,
    };

    /// Whether the page is all zero.
    pub fn is_zero(&self) -> bool {
        self.kind == PageKind::Zero
    }
}
