//! The gmig migration stream: a versioned header, then typed, checksummed sections.
//!
//! `docs/stream-format.md` specifies the format byte for byte; this module is its one
//! implementation. In brief (all integers little-endian):
//!
//! ```text
//! header   64 B   magic "GMIGSTRM", format major.minor, GPU generation, vGPU type,
//!                 source slices, guest size, page size, CRC-32 of bytes 0..60
//! section  16 B   kind u16, version u16, flags u32 (0), length u32, CRC-32 of
//!                 (bytes 0..12 of this header ++ payload)
//!          + payload (length bytes, at most StreamLimits::max_section_len)
//! ...
//! end      a section of kind END whose payload counts the sections and page records
//!          before it and carries the CRC-32 of every stream byte before it
//! ```
//!
//! Control frames ([`Control`]) travel the other way (and carry the source's commit): they are
//! framed and checksummed the same way, so that a reply, too, is never misread.
//!
//! ```mermaid
//! sequenceDiagram
//!     participant S as source
//!     participant D as destination
//!     S->>D: header
//!     D-->>S: Control::HeaderAccepted (or Rejected + reason)
//!     S->>D: PAGES ... (pre-copy, vGPU running)
//!     Note over S: stop: quiesce, re-hash
//!     S->>D: PAGES ... (changed pages), device-state sections, END
//!     Note over D: every section validated; restore + remap into a private vGPU
//!     D-->>S: Control::Restored (or Rejected + reason)
//!     S->>D: Control::Commit
//!     Note over D: vGPU RUNNING
//!     D-->>S: Control::Resumed(restore, remap times)
//! ```
//!
//! Readers follow gimli's rules: every read returns a `Result`, running out of input is an error
//! carrying its offset, and after an error a [`StreamReader`] yields nothing more. Every size the
//! stream declares is checked against [`StreamLimits`] before anything is allocated, and the
//! reader never reads more than `max_stream_bytes` in all.

use std::io::{self, Read, Write};

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The eight bytes every gmig stream starts with.
pub const MAGIC: [u8; 8] = *b"GMIGSTRM";
/// Format major version written and the only one read: a different major is refused.
pub const FORMAT_MAJOR: u16 = 1;
/// Newest format minor version understood; streams of an older minor are read, newer refused.
pub const FORMAT_MINOR: u16 = 0;
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

const HEADER_CRC_OFFSET: usize = HEADER_LEN - 4;
const ENCODING_FULL: u32 = 0;
const ENCODING_ZERO: u32 = 1;

/// Errors of the stream format: each names the byte offset in the stream and the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The input ended before a structure was complete.
    #[error("stream truncated at offset 0x{offset:x}: needed {wanted} more bytes")]
    Truncated {
        /// Offset where the incomplete read started.
        offset: u64,
        /// Bytes the structure still needed.
        wanted: u64,
    },
    /// The underlying reader or writer failed.
    #[error("I/O error at stream offset 0x{offset:x}: {kind}")]
    Io {
        /// Offset of the failed read or write.
        offset: u64,
        /// What the I/O layer reported.
        kind: io::ErrorKind,
    },
    /// The stream does not start with [`MAGIC`].
    #[error("not a gmig migration stream: bad magic {found:02x?}")]
    BadMagic {
        /// The eight bytes found instead.
        found: [u8; 8],
    },
    /// The header checksum does not match.
    #[error("stream header checksum mismatch: stored 0x{stored:08x}, computed 0x{computed:08x}")]
    HeaderChecksum {
        /// CRC-32 stored in the header.
        stored: u32,
        /// CRC-32 computed over the header.
        computed: u32,
    },
    /// The stream's format version is not one this reader understands.
    #[error(
        "unsupported stream format version {major}.{minor} (this gmig reads {}.0 to {}.{})",
        FORMAT_MAJOR,
        FORMAT_MAJOR,
        FORMAT_MINOR
    )]
    UnsupportedVersion {
        /// Major version in the stream.
        major: u16,
        /// Minor version in the stream.
        minor: u16,
    },
    /// The GPU generation byte names no generation gmig knows.
    #[error("unknown GPU generation {value} in the stream header")]
    UnknownGeneration {
        /// The raw value.
        value: u8,
    },
    /// The stream comes from another GPU generation than the destination's.
    #[error(
        "incompatible GPU generation: stream is GEN{stream}, this destination is GEN{expected}"
    )]
    GenerationMismatch {
        /// Generation in the stream.
        stream: u8,
        /// Generation of the destination.
        expected: u8,
    },
    /// The stream carries another vGPU type than the destination was set up for.
    #[error(
        "incompatible vGPU type: stream is {}+{} MiB, this destination expects {}+{} MiB",
        stream.aperture_mib, stream.hidden_mib, expected.aperture_mib, expected.hidden_mib
    )]
    VgpuTypeMismatch {
        /// vGPU type in the stream.
        stream: VgpuTypeId,
        /// vGPU type the destination expects.
        expected: VgpuTypeId,
    },
    /// A header field has a value the format forbids.
    #[error("invalid header field `{field}` at offset 0x{offset:x}: value 0x{value:x}")]
    BadHeaderField {
        /// Offset of the field.
        offset: u64,
        /// Field name.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// A section has a kind this format does not define.
    #[error("unknown section kind {kind} at offset 0x{offset:x}")]
    UnknownSection {
        /// Offset of the section header.
        offset: u64,
        /// The raw kind.
        kind: u16,
    },
    /// A section's version is not supported.
    #[error("unsupported version {version} of section kind {kind} at offset 0x{offset:x}")]
    UnsupportedSectionVersion {
        /// Offset of the section header.
        offset: u64,
        /// The section kind.
        kind: u16,
        /// The version found.
        version: u16,
    },
    /// A section header's reserved flags are not zero.
    #[error("section at offset 0x{offset:x} has reserved flags 0x{flags:x} set")]
    SectionFlags {
        /// Offset of the section header.
        offset: u64,
        /// The flags found.
        flags: u32,
    },
    /// A section declares more bytes than the limit allows.
    #[error("section kind {kind} at offset 0x{offset:x} declares {len} bytes, limit is {max}")]
    SectionTooLarge {
        /// Offset of the section header.
        offset: u64,
        /// The section kind.
        kind: u16,
        /// Declared length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// A section's checksum does not match its header and payload.
    #[error(
        "section kind {kind} at offset 0x{offset:x}: checksum mismatch (stored 0x{stored:08x}, computed 0x{computed:08x})"
    )]
    SectionChecksum {
        /// Offset of the section header.
        offset: u64,
        /// The section kind.
        kind: u16,
        /// CRC-32 stored in the header.
        stored: u32,
        /// CRC-32 computed.
        computed: u32,
    },
    /// The stream would exceed the total size a load may read.
    #[error("stream exceeds the load limit of {limit} bytes at offset 0x{offset:x}")]
    StreamTooLarge {
        /// Offset at which the limit would be passed.
        offset: u64,
        /// The limit.
        limit: u64,
    },
    /// A page batch's structure is inconsistent.
    #[error("malformed page batch at offset 0x{offset:x}: {reason}")]
    BadPageBatch {
        /// Offset of the offending field.
        offset: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// A page record names a frame outside the guest memory the header declares.
    #[error(
        "page frame 0x{gfn:x} at offset 0x{offset:x} lies outside guest memory of {pages} pages"
    )]
    PageOutOfRange {
        /// Offset of the page record.
        offset: u64,
        /// The frame number.
        gfn: u64,
        /// Pages of guest memory in the header.
        pages: u64,
    },
    /// A page record has an encoding this format does not define.
    #[error("unknown page encoding {encoding} at offset 0x{offset:x}")]
    BadPageEncoding {
        /// Offset of the page record.
        offset: u64,
        /// The raw encoding.
        encoding: u32,
    },
    /// The END section disagrees with what came before it.
    #[error("END section at offset 0x{offset:x}: {what} is {found}, the stream had {expected}")]
    EndMismatch {
        /// Offset of the END section.
        offset: u64,
        /// Which count or checksum.
        what: &'static str,
        /// Value in the END section.
        found: u64,
        /// Value computed from the stream.
        expected: u64,
    },
    /// A device-state section appeared twice.
    #[error("device-state section kind {kind} appears twice (second at offset 0x{offset:x})")]
    DuplicateSection {
        /// Offset of the second section.
        offset: u64,
        /// The section kind.
        kind: u16,
    },
    /// The END section came before a required device-state section.
    #[error("stream ended at offset 0x{offset:x} without device-state section kind {kind}")]
    MissingSection {
        /// Offset of the END section.
        offset: u64,
        /// The missing kind.
        kind: u16,
    },
    /// Bytes arrived after the END section.
    #[error("{count} bytes after the END section (at offset 0x{offset:x})")]
    TrailingBytes {
        /// Offset of the first extra byte.
        offset: u64,
        /// How many arrived.
        count: u64,
    },
    /// A push decoder was fed more than one maximal section without being drained.
    #[error("decoder buffer overrun at offset 0x{offset:x}: sections were not drained")]
    DecoderOverrun {
        /// Offset of the refused bytes.
        offset: u64,
    },
    /// A control frame is malformed.
    #[error("malformed control frame: {reason} (value 0x{value:x})")]
    BadControl {
        /// What is wrong.
        reason: &'static str,
        /// The offending value.
        value: u64,
    },
}

/// Result of stream operations.
pub type Result<T> = std::result::Result<T, StreamError>;

/// Guest frame numbers: one type across gmig (defined by `gmig-dirty`, which hashes them).
pub use gmig_dirty::Gfn;

/// GPU generation of the vGPU a stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum GpuGeneration {
    /// Broadwell.
    Gen8 = 8,
    /// Skylake, Kaby Lake, Coffee Lake.
    Gen9 = 9,
    /// Ice Lake.
    Gen11 = 11,
}

impl TryFrom<u8> for GpuGeneration {
    type Error = StreamError;
    fn try_from(value: u8) -> Result<Self> {
        match value {
            8 => Ok(Self::Gen8),
            9 => Ok(Self::Gen9),
            11 => Ok(Self::Gen11),
            _ => Err(StreamError::UnknownGeneration { value }),
        }
    }
}

/// A vGPU type as the stream names it: aperture and hidden graphics memory in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VgpuTypeId {
    /// Low (CPU-visible aperture) graphics memory in MiB.
    pub aperture_mib: u32,
    /// High (hidden) graphics memory in MiB.
    pub hidden_mib: u32,
}

/// What a stream's header says about the vGPU it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamHeader {
    /// Format minor version of the stream (the major is always [`FORMAT_MAJOR`]).
    pub format_minor: u16,
    /// GPU generation.
    pub generation: GpuGeneration,
    /// vGPU type.
    pub vgpu_type: VgpuTypeId,
    /// GGTT byte offset of the source's aperture slice.
    pub src_aperture_base: u64,
    /// GGTT byte offset of the source's hidden slice.
    pub src_hidden_base: u64,
    /// Pages of guest memory; every page record's frame is below this.
    pub guest_pages: u64,
}

impl StreamHeader {
    /// A header of the current format version.
    pub fn new(
        generation: GpuGeneration,
        vgpu_type: VgpuTypeId,
        src_aperture_base: u64,
        src_hidden_base: u64,
        guest_pages: u64,
    ) -> Self {
        Self {
            format_minor: FORMAT_MINOR,
            generation,
            vgpu_type,
            src_aperture_base,
            src_hidden_base,
            guest_pages,
        }
    }

    /// The header's 64 wire bytes, checksum included.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut wire = WireHeader {
            magic: MAGIC,
            major: U16::new(FORMAT_MAJOR),
            minor: U16::new(self.format_minor),
            generation: self.generation as u8,
            reserved0: [0; 3],
            aperture_mib: U32::new(self.vgpu_type.aperture_mib),
            hidden_mib: U32::new(self.vgpu_type.hidden_mib),
            aperture_base: U64::new(self.src_aperture_base),
            hidden_base: U64::new(self.src_hidden_base),
            guest_pages: U64::new(self.guest_pages),
            page_size: U32::new(PAGE_SIZE as u32),
            reserved1: [0; 8],
            crc: U32::new(0),
        };
        let crc = crc32fast::hash(&wire.as_bytes()[..HEADER_CRC_OFFSET]);
        wire.crc = U32::new(crc);
        let mut out = [0u8; HEADER_LEN];
        out.copy_from_slice(wire.as_bytes());
        out
    }

    /// Parse and validate header bytes (magic, checksum, version, reserved fields, limits).
    pub fn parse(bytes: &[u8; HEADER_LEN], limits: &StreamLimits) -> Result<Self> {
        let wire = WireHeader::read_from_bytes(bytes).map_err(|_| StreamError::Truncated {
            offset: 0,
            wanted: HEADER_LEN as u64,
        })?;
        if wire.magic != MAGIC {
            return Err(StreamError::BadMagic { found: wire.magic });
        }
        let computed = crc32fast::hash(&bytes[..HEADER_CRC_OFFSET]);
        if computed != wire.crc.get() {
            return Err(StreamError::HeaderChecksum {
                stored: wire.crc.get(),
                computed,
            });
        }
        let (major, minor) = (wire.major.get(), wire.minor.get());
        if major != FORMAT_MAJOR || minor > FORMAT_MINOR {
            return Err(StreamError::UnsupportedVersion { major, minor });
        }
        let generation = GpuGeneration::try_from(wire.generation)?;
        let bad = |offset: u64, field: &'static str, value: u64| StreamError::BadHeaderField {
            offset,
            field,
            value,
        };
        if wire.reserved0 != [0; 3] {
            return Err(bad(13, "reserved", 0));
        }
        if wire.reserved1 != [0; 8] {
            return Err(bad(52, "reserved", 0));
        }
        if wire.page_size.get() as usize != PAGE_SIZE {
            return Err(bad(48, "page_size", wire.page_size.get().into()));
        }
        let guest_pages = wire.guest_pages.get();
        if guest_pages == 0 || guest_pages > limits.max_guest_pages {
            return Err(bad(40, "guest_pages", guest_pages));
        }
        Ok(Self {
            format_minor: minor,
            generation,
            vgpu_type: VgpuTypeId {
                aperture_mib: wire.aperture_mib.get(),
                hidden_mib: wire.hidden_mib.get(),
            },
            src_aperture_base: wire.aperture_base.get(),
            src_hidden_base: wire.hidden_base.get(),
            guest_pages,
        })
    }

    /// Refuse a stream the destination cannot take.
    pub fn check_compatible(&self, expect: &Compatibility) -> Result<()> {
        if self.generation != expect.generation {
            return Err(StreamError::GenerationMismatch {
                stream: self.generation as u8,
                expected: expect.generation as u8,
            });
        }
        if self.vgpu_type != expect.vgpu_type {
            return Err(StreamError::VgpuTypeMismatch {
                stream: self.vgpu_type,
                expected: expect.vgpu_type,
            });
        }
        Ok(())
    }
}

/// What a destination can take: streams of another generation or vGPU type are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compatibility {
    /// The destination's GPU generation.
    pub generation: GpuGeneration,
    /// The vGPU type the destination has set up.
    pub vgpu_type: VgpuTypeId,
}

/// Bounds a reader enforces before allocating or reading (a denial-of-service guard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Largest section payload accepted, in bytes.
    pub max_section_len: u32,
    /// Most bytes one load reads in all, header included.
    pub max_stream_bytes: u64,
    /// Largest guest memory (in pages) a header may declare.
    pub max_guest_pages: u64,
}

impl Default for StreamLimits {
    /// 8 MiB sections (a full page batch is just over 4 MiB), 64 GiB per load, 64 GiB of guest.
    fn default() -> Self {
        Self {
            max_section_len: 8 << 20,
            max_stream_bytes: 64 << 30,
            max_guest_pages: (64u64 << 30) / PAGE_SIZE as u64,
        }
    }
}

/// The kinds of device-state sections; each appears exactly once per stream, before END.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum StateKind {
    /// vGPU configuration: type, slices, fences, the paravirtual info page.
    DeviceConfig = 1,
    /// The MMIO register file.
    Registers = 2,
    /// The GGTT entries of the vGPU's slices.
    Ggtt = 3,
    /// PPGTT roots and page-table state.
    Ppgtt = 4,
    /// Engine, ring and execlist state.
    Engines = 5,
    /// Workloads queued but not executed.
    Workloads = 6,
}

impl StateKind {
    /// All device-state kinds, in the order a writer emits them.
    pub const ALL: [StateKind; 6] = [
        StateKind::DeviceConfig,
        StateKind::Registers,
        StateKind::Ggtt,
        StateKind::Ppgtt,
        StateKind::Engines,
        StateKind::Workloads,
    ];

    fn from_wire(kind: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u16 == kind)
    }
}

/// Section kind of a page batch.
pub const KIND_PAGES: u16 = 7;
/// Section kind of the END section.
pub const KIND_END: u16 = 8;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct WireHeader {
    magic: [u8; 8],
    major: U16,
    minor: U16,
    generation: u8,
    reserved0: [u8; 3],
    aperture_mib: U32,
    hidden_mib: U32,
    aperture_base: U64,
    hidden_base: U64,
    guest_pages: U64,
    page_size: U32,
    reserved1: [u8; 8],
    crc: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct WireSection {
    kind: U16,
    version: U16,
    flags: U32,
    length: U32,
    crc: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct WirePageRecord {
    gfn: U64,
    encoding: U32,
    reserved: U32,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct WireEnd {
    sections: U64,
    pages: U64,
    stream_crc: U32,
    reserved: U32,
}

const _: () = assert!(std::mem::size_of::<WireHeader>() == HEADER_LEN);
const _: () = assert!(std::mem::size_of::<WireSection>() == SECTION_HEADER_LEN);
const _: () = assert!(std::mem::size_of::<WirePageRecord>() == PAGE_RECORD_LEN);
const _: () = assert!(std::mem::size_of::<WireEnd>() == END_PAYLOAD_LEN);

fn section_crc(header12: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(header12);
    h.update(payload);
    h.finalize()
}

/// One page of a batch: all zeroes, or its full contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageData<'a> {
    /// The page is all zeroes; no data travels.
    Zero,
    /// The page's bytes.
    Full(&'a [u8; PAGE_SIZE]),
}

/// A batch of pages, built by a sender or parsed (and fully validated) by a receiver.
///
/// The batch keeps its wire payload as is, so sending copies nothing more and receiving hands out
/// page slices that borrow from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageBatch {
    payload: Vec<u8>,
    count: u32,
    zero: u32,
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
        let record = WirePageRecord {
            gfn: U64::new(gfn.0),
            encoding: U32::new(if zero { ENCODING_ZERO } else { ENCODING_FULL }),
            reserved: U32::new(0),
        };
        self.payload.extend_from_slice(record.as_bytes());
        if zero {
            self.zero += 1;
        } else {
            self.payload.extend_from_slice(page);
        }
        self.count += 1;
        let count = self.count.to_le_bytes();
        self.payload[..4].copy_from_slice(&count);
        true
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

/// Counts a writer or reader reports at the end of a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamSummary {
    /// Sections before END.
    pub sections: u64,
    /// Page records in all batches.
    pub pages: u64,
    /// Page records that were zero markers.
    pub zero_pages: u64,
    /// Bytes of the whole stream, END included.
    pub bytes: u64,
}

/// Writes a stream: the header on creation, then sections, then END on [`StreamWriter::finish`].
#[derive(Debug)]
pub struct StreamWriter<W: Write> {
    inner: W,
    crc: crc32fast::Hasher,
    summary: StreamSummary,
    states: Vec<StateKind>,
}

impl<W: Write> StreamWriter<W> {
    /// Write `header` to `inner` and return a writer for the sections.
    pub fn new(mut inner: W, header: &StreamHeader) -> Result<Self> {
        let bytes = header.to_bytes();
        inner.write_all(&bytes).map_err(|e| StreamError::Io {
            offset: 0,
            kind: e.kind(),
        })?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes);
        Ok(Self {
            inner,
            crc,
            summary: StreamSummary {
                bytes: HEADER_LEN as u64,
                ..StreamSummary::default()
            },
            states: Vec::new(),
        })
    }

    /// Bytes written so far.
    pub fn bytes_written(&self) -> u64 {
        self.summary.bytes
    }

    /// The counts so far.
    pub fn summary(&self) -> StreamSummary {
        self.summary
    }

    /// The underlying writer (to flush it, or to read replies on a duplex connection).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    fn write_section(&mut self, kind: u16, payload: &[u8]) -> Result<()> {
        let offset = self.summary.bytes;
        let length = u32::try_from(payload.len()).map_err(|_| StreamError::SectionTooLarge {
            offset,
            kind,
            len: u32::MAX,
            max: u32::MAX,
        })?;
        let mut sec = WireSection {
            kind: U16::new(kind),
            version: U16::new(SECTION_VERSION),
            flags: U32::new(0),
            length: U32::new(length),
            crc: U32::new(0),
        };
        sec.crc = U32::new(section_crc(&sec.as_bytes()[..12], payload));
        let io = |e: io::Error| StreamError::Io {
            offset,
            kind: e.kind(),
        };
        self.inner.write_all(sec.as_bytes()).map_err(io)?;
        self.inner.write_all(payload).map_err(io)?;
        self.crc.update(sec.as_bytes());
        self.crc.update(payload);
        self.summary.bytes += (SECTION_HEADER_LEN + payload.len()) as u64;
        Ok(())
    }

    /// Write one device-state section. Each kind may be written once.
    pub fn write_state(&mut self, kind: StateKind, payload: &[u8]) -> Result<()> {
        if self.states.contains(&kind) {
            return Err(StreamError::DuplicateSection {
                offset: self.summary.bytes,
                kind: kind as u16,
            });
        }
        self.write_section(kind as u16, payload)?;
        self.states.push(kind);
        self.summary.sections += 1;
        Ok(())
    }

    /// Write a page batch (nothing is written for an empty batch).
    pub fn write_pages(&mut self, batch: &PageBatch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        self.write_section(KIND_PAGES, &batch.payload)?;
        self.summary.sections += 1;
        self.summary.pages += u64::from(batch.count);
        self.summary.zero_pages += u64::from(batch.zero);
        Ok(())
    }

    /// Flush the underlying writer.
    pub fn flush(&mut self) -> Result<()> {
        self.inner.flush().map_err(|e| StreamError::Io {
            offset: self.summary.bytes,
            kind: e.kind(),
        })
    }

    /// Write END (after checking every device-state section was written), flush, and return the
    /// writer and the stream's counts.
    pub fn finish(mut self) -> Result<(W, StreamSummary)> {
        if let Some(missing) = StateKind::ALL.iter().find(|k| !self.states.contains(k)) {
            return Err(StreamError::MissingSection {
                offset: self.summary.bytes,
                kind: *missing as u16,
            });
        }
        let end = WireEnd {
            sections: U64::new(self.summary.sections),
            pages: U64::new(self.summary.pages),
            stream_crc: U32::new(self.crc.clone().finalize()),
            reserved: U32::new(0),
        };
        self.write_section(KIND_END, end.as_bytes())?;
        self.flush()?;
        Ok((self.inner, self.summary))
    }
}

/// A section read and validated by a [`StreamReader`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Section {
    /// A device-state section: its kind and payload (opaque to the stream layer; the device
    /// validates its contents when it restores).
    State {
        /// Which part of the device state.
        kind: StateKind,
        /// The section's bytes.
        payload: Vec<u8>,
    },
    /// A page batch.
    Pages(PageBatch),
    /// The END section: the stream is complete and consistent.
    End(StreamSummary),
}

/// The validation state shared by the pull ([`StreamReader`]) and push ([`StreamDecoder`])
/// readers: everything after the header.
#[derive(Debug, Clone)]
struct Validator {
    limits: StreamLimits,
    header: StreamHeader,
    offset: u64,
    crc: crc32fast::Hasher,
    summary: StreamSummary,
    states: Vec<StateKind>,
}

impl Validator {
    fn new(header: StreamHeader, header_bytes: &[u8], limits: StreamLimits) -> Self {
        let mut crc = crc32fast::Hasher::new();
        crc.update(header_bytes);
        Self {
            limits,
            header,
            offset: HEADER_LEN as u64,
            crc,
            summary: StreamSummary::default(),
            states: Vec::new(),
        }
    }

    /// Check a section header before its payload is read; returns the payload length.
    fn check_head(&self, head: &[u8; SECTION_HEADER_LEN]) -> Result<usize> {
        let at = self.offset;
        let sec = WireSection::read_from_bytes(head).map_err(|_| StreamError::Truncated {
            offset: at,
            wanted: SECTION_HEADER_LEN as u64,
        })?;
        let kind = sec.kind.get();
        let len = sec.length.get();
        if StateKind::from_wire(kind).is_none() && kind != KIND_PAGES && kind != KIND_END {
            return Err(StreamError::UnknownSection { offset: at, kind });
        }
        if sec.version.get() != SECTION_VERSION {
            return Err(StreamError::UnsupportedSectionVersion {
                offset: at,
                kind,
                version: sec.version.get(),
            });
        }
        if sec.flags.get() != 0 {
            return Err(StreamError::SectionFlags {
                offset: at,
                flags: sec.flags.get(),
            });
        }
        let max = if kind == KIND_END {
            END_PAYLOAD_LEN as u32
        } else {
            self.limits.max_section_len
        };
        if len > max {
            return Err(StreamError::SectionTooLarge {
                offset: at,
                kind,
                len,
                max,
            });
        }
        if at + (SECTION_HEADER_LEN as u64) + u64::from(len) > self.limits.max_stream_bytes {
            return Err(StreamError::StreamTooLarge {
                offset: at,
                limit: self.limits.max_stream_bytes,
            });
        }
        Ok(len as usize)
    }

    /// Validate a complete section (its header already passed `check_head`).
    fn accept(&mut self, head: &[u8; SECTION_HEADER_LEN], payload: Vec<u8>) -> Result<Section> {
        let at = self.offset;
        let sec = WireSection::read_from_bytes(head).map_err(|_| StreamError::Truncated {
            offset: at,
            wanted: SECTION_HEADER_LEN as u64,
        })?;
        let kind = sec.kind.get();
        let computed = section_crc(&head[..12], &payload);
        if computed != sec.crc.get() {
            return Err(StreamError::SectionChecksum {
                offset: at,
                kind,
                stored: sec.crc.get(),
                computed,
            });
        }
        let stream_crc_before = self.crc.clone().finalize();
        self.crc.update(head);
        self.crc.update(&payload);
        let payload_at = at + SECTION_HEADER_LEN as u64;
        self.offset = payload_at + payload.len() as u64;

        if kind == KIND_END {
            return self.finish_end(at, &payload, stream_crc_before);
        }
        self.summary.sections += 1;
        if let Some(kind) = StateKind::from_wire(kind) {
            if self.states.contains(&kind) {
                return Err(StreamError::DuplicateSection {
                    offset: at,
                    kind: kind as u16,
                });
            }
            self.states.push(kind);
            return Ok(Section::State { kind, payload });
        }
        let batch = PageBatch::parse(payload, self.header.guest_pages, payload_at)?;
        self.summary.pages += u64::from(batch.count);
        self.summary.zero_pages += u64::from(batch.zero);
        Ok(Section::Pages(batch))
    }

    fn finish_end(&mut self, at: u64, payload: &[u8], stream_crc: u32) -> Result<Section> {
        let end = WireEnd::read_from_bytes(payload).map_err(|_| StreamError::BadControl {
            reason: "END payload has the wrong length",
            value: payload.len() as u64,
        })?;
        let checks = [
            ("section count", end.sections.get(), self.summary.sections),
            ("page count", end.pages.get(), self.summary.pages),
            (
                "stream checksum",
                u64::from(end.stream_crc.get()),
                u64::from(stream_crc),
            ),
            ("reserved word", u64::from(end.reserved.get()), 0),
        ];
        for (what, found, expected) in checks {
            if found != expected {
                return Err(StreamError::EndMismatch {
                    offset: at,
                    what,
                    found,
                    expected,
                });
            }
        }
        if let Some(missing) = StateKind::ALL.iter().find(|k| !self.states.contains(k)) {
            return Err(StreamError::MissingSection {
                offset: at,
                kind: *missing as u16,
            });
        }
        self.summary.bytes = self.offset;
        Ok(Section::End(self.summary))
    }
}

fn open_header(
    bytes: &[u8; HEADER_LEN],
    limits: &StreamLimits,
    expect: Option<&Compatibility>,
) -> Result<StreamHeader> {
    if limits.max_stream_bytes < HEADER_LEN as u64 {
        return Err(StreamError::StreamTooLarge {
            offset: 0,
            limit: limits.max_stream_bytes,
        });
    }
    let header = StreamHeader::parse(bytes, limits)?;
    if let Some(expect) = expect {
        header.check_compatible(expect)?;
    }
    Ok(header)
}

/// Reads a stream section by section, validating each completely before handing it out.
///
/// After an error, or after END, [`StreamReader::next_section`] returns `Ok(None)` for good.
#[derive(Debug)]
pub struct StreamReader<R: Read> {
    inner: R,
    v: Validator,
    done: bool,
}

fn read_exact_at<R: Read>(r: &mut R, buf: &mut [u8], offset: u64) -> Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(StreamError::Truncated {
                    offset,
                    wanted: (buf.len() - filled) as u64,
                })
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(StreamError::Io {
                    offset: offset + filled as u64,
                    kind: e.kind(),
                })
            }
        }
    }
    Ok(())
}

impl<R: Read> StreamReader<R> {
    /// Read and validate the header; with `expect`, refuse an incompatible generation or type.
    pub fn open(
        mut inner: R,
        limits: StreamLimits,
        expect: Option<&Compatibility>,
    ) -> Result<Self> {
        let mut bytes = [0u8; HEADER_LEN];
        read_exact_at(&mut inner, &mut bytes, 0)?;
        let header = open_header(&bytes, &limits, expect)?;
        Ok(Self {
            inner,
            v: Validator::new(header, &bytes, limits),
            done: false,
        })
    }

    /// The validated header.
    pub fn header(&self) -> &StreamHeader {
        &self.v.header
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.v.offset
    }

    /// The underlying reader (to send replies on a duplex connection).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// The next section, or `None` after END or after an error.
    pub fn next_section(&mut self) -> Result<Option<Section>> {
        if self.done {
            return Ok(None);
        }
        let result = self.read_section();
        if !matches!(result, Ok(Section::Pages(_) | Section::State { .. })) {
            self.done = true;
        }
        result.map(Some)
    }

    fn read_section(&mut self) -> Result<Section> {
        let at = self.v.offset;
        if at + SECTION_HEADER_LEN as u64 > self.v.limits.max_stream_bytes {
            return Err(StreamError::StreamTooLarge {
                offset: at,
                limit: self.v.limits.max_stream_bytes,
            });
        }
        let mut head = [0u8; SECTION_HEADER_LEN];
        read_exact_at(&mut self.inner, &mut head, at)?;
        let len = self.v.check_head(&head)?;
        // `len` is bounded by `max_section_len` in `check_head`, so this allocation is too.
        let mut payload = vec![0u8; len];
        read_exact_at(
            &mut self.inner,
            &mut payload,
            at + SECTION_HEADER_LEN as u64,
        )?;
        self.v.accept(&head, payload)
    }
}

/// A push-style reader: bytes arrive in any segmentation through [`StreamDecoder::feed`], and
/// each section comes out of [`StreamDecoder::next_section`] once complete and validated.
///
/// What it buffers is bounded by one section (header plus `max_section_len`); bytes after END,
/// or after an error, are refused.
#[derive(Debug)]
pub struct StreamDecoder {
    limits: StreamLimits,
    expect: Option<Compatibility>,
    buf: Vec<u8>,
    pos: usize,
    v: Option<Validator>,
    end: Option<StreamSummary>,
    failed: Option<StreamError>,
    fed: u64,
}

impl StreamDecoder {
    /// A decoder that will refuse a header incompatible with `expect`.
    pub fn new(limits: StreamLimits, expect: Option<Compatibility>) -> Self {
        Self {
            limits,
            expect,
            buf: Vec::new(),
            pos: 0,
            v: None,
            end: None,
            failed: None,
            fed: 0,
        }
    }

    /// The header, once its bytes have arrived and validated.
    pub fn header(&self) -> Option<&StreamHeader> {
        self.v.as_ref().map(|v| &v.header)
    }

    /// The END summary once the stream is complete.
    pub fn finished(&self) -> Option<StreamSummary> {
        self.end
    }

    /// Bytes fed so far.
    pub fn bytes_fed(&self) -> u64 {
        self.fed
    }

    fn fail(&mut self, e: StreamError) -> StreamError {
        self.failed = Some(e);
        self.buf = Vec::new();
        self.pos = 0;
        e
    }

    /// Accept more bytes. Fails after an earlier error, after END, or when the bytes buffered but
    /// not yet decoded would exceed one maximal section (call `next_section` until it returns
    /// `None` between feeds).
    pub fn feed(&mut self, data: &[u8]) -> Result<()> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if self.end.is_some() && !data.is_empty() {
            let offset = self.fed;
            let count = data.len() as u64;
            return Err(self.fail(StreamError::TrailingBytes { offset, count }));
        }
        if self.fed.saturating_add(data.len() as u64) > self.limits.max_stream_bytes {
            let offset = self.fed;
            let limit = self.limits.max_stream_bytes;
            return Err(self.fail(StreamError::StreamTooLarge { offset, limit }));
        }
        if self.pos > 0 && self.pos * 2 >= self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let cap = HEADER_LEN + SECTION_HEADER_LEN + self.limits.max_section_len as usize;
        if self.buf.len() - self.pos + data.len() > cap.saturating_mul(2) {
            let offset = self.fed;
            return Err(self.fail(StreamError::DecoderOverrun { offset }));
        }
        self.buf.extend_from_slice(data);
        self.fed += data.len() as u64;
        Ok(())
    }

    /// The next complete section, or `None` when more bytes are needed or END has been seen.
    pub fn next_section(&mut self) -> Result<Option<Section>> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if self.end.is_some() {
            return Ok(None);
        }
        let r = self.try_next();
        match r {
            Err(e) => Err(self.fail(e)),
            Ok(Some(Section::End(s))) => {
                self.end = Some(s);
                Ok(Some(Section::End(s)))
            }
            other => other,
        }
    }

    fn try_next(&mut self) -> Result<Option<Section>> {
        let avail = &self.buf[self.pos..];
        let Some(v) = self.v.as_mut() else {
            let Some(head) = avail.first_chunk::<HEADER_LEN>() else {
                return Ok(None);
            };
            let header = open_header(head, &self.limits, self.expect.as_ref())?;
            self.v = Some(Validator::new(header, head, self.limits));
            self.pos += HEADER_LEN;
            return self.try_next();
        };
        let Some(head) = avail.first_chunk::<SECTION_HEADER_LEN>() else {
            return Ok(None);
        };
        let head = *head;
        let len = v.check_head(&head)?;
        let Some(payload) = avail.get(SECTION_HEADER_LEN..SECTION_HEADER_LEN + len) else {
            return Ok(None);
        };
        let payload = payload.to_vec();
        self.pos += SECTION_HEADER_LEN + len;
        v.accept(&head, payload).map(Some)
    }
}

/// A whole stream read into memory and validated (for tests, tools and small streams).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedStream {
    /// The header.
    pub header: StreamHeader,
    /// Device-state sections by kind, in [`StateKind::ALL`] order.
    pub states: Vec<(StateKind, Vec<u8>)>,
    /// Page batches in stream order.
    pub batches: Vec<PageBatch>,
    /// Counts from END.
    pub summary: StreamSummary,
}

/// Read and validate a whole stream; nothing is returned unless every section and END check out.
pub fn load<R: Read>(
    inner: R,
    limits: StreamLimits,
    expect: Option<&Compatibility>,
) -> Result<LoadedStream> {
    let mut reader = StreamReader::open(inner, limits, expect)?;
    let mut states = Vec::new();
    let mut batches = Vec::new();
    loop {
        match reader.next_section()? {
            Some(Section::State { kind, payload }) => states.push((kind, payload)),
            Some(Section::Pages(b)) => batches.push(b),
            Some(Section::End(summary)) => {
                states.sort_by_key(|(k, _)| *k);
                return Ok(LoadedStream {
                    header: reader.v.header,
                    states,
                    batches,
                    summary,
                });
            }
            None => {
                return Err(StreamError::Truncated {
                    offset: reader.v.offset,
                    wanted: SECTION_HEADER_LEN as u64,
                })
            }
        }
    }
}

/// Messages the two ends exchange beside the stream (replies, the commit).
///
/// Frame: magic `b"GMCT"`, kind u16, reserved u16, payload length u32, CRC-32 of
/// (the first 12 bytes ++ payload), payload (at most [`Control::MAX_PAYLOAD`] bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Destination → source: the header is compatible; send the rest.
    HeaderAccepted,
    /// Destination → source: the stream was refused; the reason in words.
    Rejected(String),
    /// Destination → source: every section validated and the vGPU restored (not yet running).
    Restored,
    /// Source → destination: the source has given up the vGPU; run it.
    Commit,
    /// Destination → source: the vGPU runs; how long restore and remap took.
    Resumed {
        /// Restore time (state sections applied), nanoseconds.
        restore_ns: u64,
        /// GGTT remap time, nanoseconds.
        remap_ns: u64,
    },
}

/// Magic of a control frame.
pub const CONTROL_MAGIC: [u8; 4] = *b"GMCT";
const CONTROL_HEADER_LEN: usize = 16;

impl Control {
    /// Largest control payload accepted.
    pub const MAX_PAYLOAD: u32 = 4096;

    fn kind(&self) -> u16 {
        match self {
            Control::HeaderAccepted => 1,
            Control::Rejected(_) => 2,
            Control::Restored => 3,
            Control::Commit => 4,
            Control::Resumed { .. } => 5,
        }
    }

    /// Write the frame.
    pub fn write_to<W: Write>(&self, w: &mut W) -> io::Result<()> {
        let payload: Vec<u8> = match self {
            Control::Rejected(msg) => {
                let mut end = msg.len().min(Self::MAX_PAYLOAD as usize);
                while !msg.is_char_boundary(end) {
                    end -= 1;
                }
                msg.as_bytes()[..end].to_vec()
            }
            Control::Resumed {
                restore_ns,
                remap_ns,
            } => {
                let mut p = restore_ns.to_le_bytes().to_vec();
                p.extend_from_slice(&remap_ns.to_le_bytes());
                p
            }
            _ => Vec::new(),
        };
        let mut frame = Vec::with_capacity(CONTROL_HEADER_LEN + payload.len());
        frame.extend_from_slice(&CONTROL_MAGIC);
        frame.extend_from_slice(&self.kind().to_le_bytes());
        frame.extend_from_slice(&0u16.to_le_bytes());
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        let crc = section_crc(&frame[..12], &payload);
        frame.extend_from_slice(&crc.to_le_bytes());
        frame.extend_from_slice(&payload);
        w.write_all(&frame)?;
        w.flush()
    }

    /// Read and validate one frame.
    pub fn read_from<R: Read>(r: &mut R) -> Result<Self> {
        let mut head = [0u8; CONTROL_HEADER_LEN];
        read_exact_at(r, &mut head, 0)?;
        let bad = |reason, value| StreamError::BadControl { reason, value };
        let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        if head[..4] != CONTROL_MAGIC {
            return Err(bad("bad magic", u64::from(word(0))));
        }
        let kind = u16::from_le_bytes([head[4], head[5]]);
        let reserved = u16::from_le_bytes([head[6], head[7]]);
        if reserved != 0 {
            return Err(bad("reserved field is not zero", reserved.into()));
        }
        let len = word(8);
        if len > Self::MAX_PAYLOAD {
            return Err(bad("payload too large", len.into()));
        }
        let mut payload = vec![0u8; len as usize];
        read_exact_at(r, &mut payload, CONTROL_HEADER_LEN as u64)?;
        let computed = section_crc(&head[..12], &payload);
        if computed != word(12) {
            return Err(bad("checksum mismatch", computed.into()));
        }
        let empty = |c: Control| {
            if payload.is_empty() {
                Ok(c)
            } else {
                Err(bad("unexpected payload", payload.len() as u64))
            }
        };
        match kind {
            1 => empty(Control::HeaderAccepted),
            2 => Ok(Control::Rejected(
                String::from_utf8_lossy(&payload).into_owned(),
            )),
            3 => empty(Control::Restored),
            4 => empty(Control::Commit),
            5 => {
                let (a, b) = payload
                    .split_first_chunk::<8>()
                    .ok_or(bad("Resumed payload too short", len.into()))?;
                let b: [u8; 8] = b
                    .try_into()
                    .map_err(|_| bad("Resumed payload has the wrong length", len.into()))?;
                Ok(Control::Resumed {
                    restore_ns: u64::from_le_bytes(*a),
                    remap_ns: u64::from_le_bytes(b),
                })
            }
            other => Err(bad("unknown kind", other.into())),
        }
    }
}
