//! Format constants and the little-endian wire layouts of the header, section headers, page
//! records and the END payload.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The eight bytes every gmig stream starts with.
pub const MAGIC: [u8; 8] = *b"GMIGSTRM";
/// Format major version written and the only one read: a different major is refused.
pub const FORMAT_MAJOR: u16 = 1;
/// Newest format minor version understood; streams of an older minor are read, newer refused.
pub const FORMAT_MINOR: u16 = 3;
/// Size of a guest page in bytes.
pub const PAGE_SIZE: usize = 4096;
/// Size of the stream header in bytes.
pub const HEADER_LEN: usize = 64;
/// Size of a section header in bytes.
pub const SECTION_HEADER_LEN: usize = 16;
/// Size of one page record's header inside a page batch.
pub const PAGE_RECORD_LEN: usize = 16;
/// Size of a page batch's own header (record count and reserved word).
pub const PAGE_BATCH_HEADER_LEN: usize = 8;
/// Most page records one page batch may carry.
pub const MAX_PAGES_PER_BATCH: u32 = 1024;
/// Size of the END section's payload.
pub const END_PAYLOAD_LEN: usize = 24;
/// Version of every section kind written by this implementation.
pub const SECTION_VERSION: u16 = 1;

pub(crate) const HEADER_CRC_OFFSET: usize = HEADER_LEN - 4;
pub(crate) const ENCODING_FULL: u32 = 0;
pub(crate) const ENCODING_ZERO: u32 = 1;

/// Section kind of a page batch.
pub const KIND_PAGES: u16 = 7;
/// Section kind of the END section.
pub const KIND_END: u16 = 8;
/// Section kind of a switch-over marker (format 1.1): the source asks the destination to say
/// when it has applied everything before it.
pub const KIND_SYNC: u16 = 10;
/// Size of a SYNC section's payload: the marker's sequence number.
pub const SYNC_PAYLOAD_LEN: usize = 8;
/// Section kind of a writable-frames hint (format 1.2): guest frames the device can write, which
/// a destination may back with memory before the stop. Advisory: ignoring it is correct.
pub const KIND_WRITABLE_FRAMES: u16 = 11;
/// Size of one frame range in a writable-frames hint: first frame (u64) and count (u64).
pub const FRAME_RANGE_LEN: usize = 16;
/// Most ranges one writable-frames section carries (a writer splits longer lists).
pub const MAX_FRAME_RANGES_PER_SECTION: usize = 4096;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct WireHeader {
    pub(crate) magic: [u8; 8],
    pub(crate) major: U16,
    pub(crate) minor: U16,
    pub(crate) generation: u8,
    pub(crate) reserved0: [u8; 3],
    pub(crate) aperture_mib: U32,
    pub(crate) hidden_mib: U32,
    pub(crate) aperture_base: U64,
    pub(crate) hidden_base: U64,
    pub(crate) guest_pages: U64,
    pub(crate) page_size: U32,
    pub(crate) reserved1: [u8; 8],
    pub(crate) crc: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct WireSection {
    pub(crate) kind: U16,
    pub(crate) version: U16,
    pub(crate) flags: U32,
    pub(crate) length: U32,
    pub(crate) crc: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct WirePageRecord {
    pub(crate) gfn: U64,
    pub(crate) encoding: U32,
    pub(crate) reserved: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct WireEnd {
    pub(crate) sections: U64,
    pub(crate) pages: U64,
    pub(crate) stream_crc: U32,
    pub(crate) reserved: U32,
}

const _: () = assert!(std::mem::size_of::<WireHeader>() == HEADER_LEN);
const _: () = assert!(std::mem::size_of::<WireSection>() == SECTION_HEADER_LEN);
const _: () = assert!(std::mem::size_of::<WirePageRecord>() == PAGE_RECORD_LEN);
const _: () = assert!(std::mem::size_of::<WireEnd>() == END_PAYLOAD_LEN);

pub(crate) fn section_crc(header12: &[u8], payload: &[u8]) -> u32 {
    section_crc_with(header12, &payload_crc(payload))
}

/// The running CRC-32 of a section payload: computed once per section and combined into both
/// the section's checksum ([`section_crc_with`]) and the stream's, so a page batch's bytes are
/// read once for checksumming on each side, not twice.
pub(crate) fn payload_crc(payload: &[u8]) -> crc32fast::Hasher {
    let mut h = crc32fast::Hasher::new();
    h.update(payload);
    h
}

/// The section checksum (CRC-32 of the first 12 header bytes, then the payload) from the
/// payload's own CRC.
pub(crate) fn section_crc_with(header12: &[u8], payload: &crc32fast::Hasher) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(header12);
    h.combine(payload);
    h.finalize()
}

/// A vGPU type as the stream names it: aperture and hidden graphics memory in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VgpuTypeId {
    /// Low (CPU-visible aperture) graphics memory in MiB.
    pub aperture_mib: u32,
    /// High (hidden) graphics memory in MiB.
    pub hidden_mib: u32,
}
