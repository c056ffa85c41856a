//! Address spaces of a capture, memory faults and the reader's errors.

use crate::WalkError;

/// The address space of an AUB `MEMORY_WRITE` (DW3 bits 31:28).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AubSpace {
    /// Global GTT address, translated through the GGTT entries (0).
    Ggtt,
    /// Physical address (2).
    Physical,
    /// Byte offset into the GGTT page table (4).
    GgttEntry,
}

impl AubSpace {
    /// The value of DW3 for this space.
    #[must_use]
    pub fn dw3(self) -> u32 {
        match self {
            AubSpace::Ggtt => 0,
            AubSpace::Physical => 2 << 28,
            AubSpace::GgttEntry => 4 << 28,
        }
    }

    /// Short lower-case name, as the listing prints it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            AubSpace::Ggtt => "ggtt",
            AubSpace::Physical => "phys",
            AubSpace::GgttEntry => "ggtt-entry",
        }
    }
}

/// A memory access that the image cannot serve.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemFault {
    /// The GGTT offset lies beyond the 4 GiB global GTT.
    #[error("GGTT offset 0x{addr:x} is beyond the 4 GiB global GTT")]
    GgttOutOfRange {
        /// The offset.
        addr: u64,
    },
    /// No present GGTT entry maps the page.
    #[error("GGTT offset 0x{addr:x} has no present GGTT entry")]
    GgttUnmapped {
        /// The offset.
        addr: u64,
    },
    /// A PPGTT page-table level has no present entry for the address.
    #[error("PPGTT address 0x{addr:x} is not mapped (no present level-{level} entry)")]
    PpgttUnmapped {
        /// The address.
        addr: u64,
        /// Page-table level (4 = PML4 … 1 = page table).
        level: u8,
    },
    /// The access runs past the 48-bit address space.
    #[error("access of 0x{len:x} bytes at 0x{addr:x} runs past the 48-bit address space")]
    Overflow {
        /// Start address.
        addr: u64,
        /// Length in bytes.
        len: u64,
    },
    /// The image already holds as many physical pages as it may.
    #[error("memory image is full ({limit} physical pages)")]
    PageLimit {
        /// The bound.
        limit: u64,
    },
    /// A context address that a descriptor cannot hold (not page aligned or not below 4 GiB).
    #[error("context address 0x{addr:x} is not a page-aligned GGTT offset below 4 GiB")]
    BadContextAddress {
        /// The address.
        addr: u64,
    },
}

/// Why an AUB capture could not be read or written. Offsets are byte offsets into the file.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AubError {
    /// Fewer bytes remain than a packet header or the packet's stated length needs.
    #[error("AUB packet at byte 0x{offset:x} is truncated: needs {need} bytes, {have} remain")]
    Truncated {
        /// Offset of the packet.
        offset: usize,
        /// Bytes the packet needs.
        need: u64,
        /// Bytes left in the file.
        have: u64,
    },
    /// DW0 bits 31:29 are not 7.
    #[error("byte 0x{offset:x}: dword 0x{dw0:08x} is not an AUB packet header (type {})", dw0 >> 29)]
    NotAubPacket {
        /// Offset of the packet.
        offset: usize,
        /// DW0.
        dw0: u32,
    },
    /// A classic (pre-GEN8, non-execlist) AUB packet.
    #[error("byte 0x{offset:x}: classic AUB packet 0x{dw0:08x} is not supported (only GEN8+ memtrace captures)")]
    LegacyPacket {
        /// Offset of the packet.
        offset: usize,
        /// DW0.
        dw0: u32,
    },
    /// An opcode other than the memtrace opcode 0x2e.
    #[error("byte 0x{offset:x}: unknown AUB opcode 0x{:x} in 0x{dw0:08x}", (dw0 >> 23) & 0x3f)]
    UnknownOpcode {
        /// Offset of the packet.
        offset: usize,
        /// DW0.
        dw0: u32,
    },
    /// A packet shorter than its kind's fixed part.
    #[error("byte 0x{offset:x}: packet 0x{dw0:08x} has {dwords} dwords, needs at least {min}")]
    PacketTooShort {
        /// Offset of the packet.
        offset: usize,
        /// DW0.
        dw0: u32,
        /// Dwords in the packet.
        dwords: u32,
        /// Dwords needed.
        min: u32,
    },
    /// A memory write whose length exceeds the data its packet carries.
    #[error("byte 0x{offset:x}: memory write of {len} bytes, but the packet carries only {room}")]
    WriteTooLong {
        /// Offset of the packet.
        offset: usize,
        /// Stated length.
        len: u32,
        /// Data bytes present.
        room: u32,
    },
    /// A memtrace packet this reader does not model and cannot safely skip (it may write memory).
    #[error("byte 0x{offset:x}: unsupported memtrace packet 0x{dw0:08x} (sub-opcode 0x{:02x})", (dw0 >> 16) & 0x7f)]
    UnsupportedPacket {
        /// Offset of the packet.
        offset: usize,
        /// DW0.
        dw0: u32,
    },
    /// A memory write to an address space this reader does not model.
    #[error(
        "byte 0x{offset:x}: memory write to unsupported address space {space} (DW3 bits 31:28)"
    )]
    UnsupportedSpace {
        /// Offset of the packet.
        offset: usize,
        /// The space value.
        space: u32,
    },
    /// A GGTT-entry write that does not cover whole 8-byte entries.
    #[error("byte 0x{offset:x}: GGTT entry write at 0x{addr:x} of {len} bytes is not whole 8-byte entries")]
    MisalignedEntryWrite {
        /// Offset of the packet.
        offset: usize,
        /// Byte offset into the GGTT table.
        addr: u64,
        /// Length in bytes.
        len: u32,
    },
    /// A memory access of a packet failed.
    #[error("byte 0x{offset:x}: {fault}")]
    Memory {
        /// Offset of the packet.
        offset: usize,
        /// What failed.
        fault: MemFault,
    },
    /// A submission whose context image cannot be read.
    #[error(
        "byte 0x{offset:x}: submission of descriptor 0x{descriptor:x}: context unreadable: {fault}"
    )]
    ContextUnreadable {
        /// Offset of the packet.
        offset: usize,
        /// The context descriptor.
        descriptor: u64,
        /// What failed.
        fault: MemFault,
    },
    /// More submissions than [`ReadLimits::max_submissions`](super::ReadLimits::max_submissions).
    #[error("byte 0x{offset:x}: more than {limit} submissions")]
    TooManySubmissions {
        /// Offset of the packet.
        offset: usize,
        /// The bound.
        limit: usize,
    },
    /// More distinct registers than [`ReadLimits::max_registers`](super::ReadLimits::max_registers).
    #[error("byte 0x{offset:x}: more than {limit} distinct registers written")]
    TooManyRegisters {
        /// Offset of the packet.
        offset: usize,
        /// The bound.
        limit: usize,
    },
    /// Remapping a submission's ring and batches failed (nothing was changed).
    #[error("submission {submission}: {err}")]
    Walk {
        /// Index of the submission.
        submission: usize,
        /// Why.
        err: WalkError,
    },
    /// A GGTT address the migration must rebase lies outside the source slices.
    #[error("{what} at GGTT 0x{addr:x} lies outside the source slices; cannot rebase it")]
    NotInSlice {
        /// What it is (`"context"`, `"ring"`, `"hardware status page"`).
        what: &'static str,
        /// The address.
        addr: u64,
    },
    /// Moving a GGTT entry would overwrite an entry the move does not carry.
    #[error("GGTT entry for 0x{addr:x} moves onto an entry that is not part of the move")]
    EntryCollision {
        /// Destination GGTT offset.
        addr: u64,
    },
    /// Writing a capture needs its generation.
    #[error("the capture names no GEN generation; cannot write its header")]
    NoGeneration,
    /// A memory operation outside any packet (building or rebasing a capture) failed.
    #[error(transparent)]
    Fault(#[from] MemFault),
}

/// Module result type.
pub type Result<T> = std::result::Result<T, AubError>;
