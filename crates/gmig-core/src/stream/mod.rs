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
//!     S->>D: GGTT, PAGES ... (pre-copy, vGPU running)
//!     S->>D: SYNC(n)
//!     D-->>S: Control::Synced(n) (everything before it applied)
//!     Note over S: stop: quiesce, re-hash
//!     S->>D: PAGES ... (changed pages), device-state sections + GGTT_UPDATE, END
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

mod control;
mod error;
mod header;
mod hint;
mod pages;
mod reader;
mod wire;
mod writer;

pub use control::{Control, CONTROL_MAGIC};
pub use error::{Result, StreamError};
pub use header::{Compatibility, Gfn, GpuGeneration, StateKind, StreamHeader, StreamLimits};
pub use hint::{frame_ranges, FrameRange};
pub use pages::{is_zero_page, PageBatch, PageData, PageIter};
pub use reader::{load, LoadedStream, Section, StreamDecoder, StreamReader};
pub use wire::{
    VgpuTypeId, END_PAYLOAD_LEN, FORMAT_MAJOR, FORMAT_MINOR, FRAME_RANGE_LEN, HEADER_LEN, KIND_END,
    KIND_PAGES, KIND_SYNC, KIND_WRITABLE_FRAMES, MAGIC, MAX_FRAME_RANGES_PER_SECTION,
    MAX_PAGES_PER_BATCH, PAGE_BATCH_HEADER_LEN, PAGE_RECORD_LEN, PAGE_SIZE, SECTION_HEADER_LEN,
    SECTION_VERSION, SYNC_PAYLOAD_LEN,
};
pub use writer::{StreamSummary, StreamWriter};
