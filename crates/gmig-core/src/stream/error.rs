//! Errors of the stream format.

use std::io;

use super::wire::{VgpuTypeId, FORMAT_MAJOR, FORMAT_MINOR};

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
    /// The stream does not start with [`MAGIC`](super::MAGIC).
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
    /// A writable-frames hint is malformed (format 1.2).
    #[error("bad writable-frames hint at offset 0x{offset:x}: {reason}")]
    BadFrameHint {
        /// Offset of the offending range (or of the section).
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
    /// An update section came before the section it updates.
    #[error("device-state section kind {kind} at offset 0x{offset:x} updates section kind {needs}, which has not come before it")]
    SectionOutOfOrder {
        /// Offset of the update section.
        offset: u64,
        /// The update's kind.
        kind: u16,
        /// The kind it updates.
        needs: u16,
    },
    /// A fixed-size section has another length.
    #[error(
        "section kind {kind} at offset 0x{offset:x} is {len} bytes long; it must be {expected}"
    )]
    BadSectionLength {
        /// Offset of the section header.
        offset: u64,
        /// The section kind.
        kind: u16,
        /// Its declared length.
        len: u32,
        /// The length the kind has.
        expected: u32,
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
