//! AUB captures: reading and writing the GEN8+ "memtrace" AUB format that Mesa's `intel_dump_gpu`
//! writes, so that captures made on real hardware can be decoded, audited and remapped, and so that
//! our own command sequences can be saved as captures (the fixtures in `fixtures/` are made this way).
//!
//! # Format
//!
//! An AUB file is a sequence of packets of little-endian dwords. DW0 of every packet has bits 31:29 = 7,
//! an opcode in bits 28:23 (0x2e for the memtrace packets of GEN8+ captures), a sub-opcode in bits
//! 22:16 and, in bits 15:0, the packet length in dwords minus one. The packets this module understands:
//!
//! | sub-opcode | packet | layout after DW0 |
//! |---|---|---|
//! | 0x0e | `MEM_TRACE_VERSION` | file version, device (bits 15:8), 2 dwords of version, application name |
//! | 0x06 | `MEMORY_WRITE` | address lo, address hi, address space (bits 31:28), length in bytes, data |
//! | 0x03 | `REGISTER_WRITE` | register, size and space, mask lo, mask hi, value |
//! | 0x02 | `REGISTER_POLL` | register, size and space, mask lo, mask hi, value |
//!
//! Memtrace packets that change nothing (comments, memory polls and compares, frame markers …) are
//! skipped and reported as [`AubEvent::Skipped`]; the discontiguous memory write (0x0b) and unknown
//! sub-opcodes are refused, since skipping a write would leave a wrong image. Classic (pre-execlist)
//! AUB packets, opcode 1, are refused.
//!
//! A `MEMORY_WRITE` goes to one of three address spaces: the global GTT (0; translated through the
//! GGTT entries written so far), physical memory (2 << 28), or the GGTT page table itself (4 << 28;
//! the address is then a byte offset into the table of 8-byte entries, one per 4 KiB page).
//!
//! Work is submitted through the execlist ports, as register writes: on GEN8/GEN9 four writes to
//! `ELSP` (`mmio_base + 0x230`: element 1 high, element 1 low, element 0 high, element 0 low); on GEN11
//! the low and high halves of the descriptor go to `EXECLIST_SQ_CONTENTS` (`+0x510`, `+0x514`) and a
//! write of 1 to `EXECLIST_CONTROL` (`+0x550`) loads it. A context descriptor holds the GGTT address of
//! the logical ring context (LRCA, bits 31:12): one page of per-process hardware status page, then the
//! context image, whose register state gives the ring (`RING_HEAD` value at dword 5, `RING_TAIL` at 7,
//! `RING_START` at 9, `RING_CTL` at 11) and the PPGTT root (`PDP0` upper half at dword 49, lower half at
//! 51).
//!
//! # Model
//!
//! [`AubReader`] turns bytes into [`AubEvent`]s while it maintains a [`MemoryImage`] (GGTT entries and
//! physical pages; GGTT-addressed writes land in the physical page their entry names), the last value
//! of every register, and the list of [`Submission`]s. [`AubCapture::parse`] runs a reader to the end.
//! [`AubCapture::to_bytes`] writes a capture back, so that `parse(to_bytes(c)) == c` for every capture
//! whose submissions agree with its memory (all captures that [`CaptureBuilder`] or
//! [`AubCapture::parse`] make do). [`CaptureBuilder`] makes captures from our own command sequences.
//!
//! The reader is total: any input gives events or a typed [`AubError`] naming the byte offset of the
//! offending packet, and memory grows only up to the bounds in [`ReadLimits`].
//!
//! [`AubCapture::migrate`] gives a capture as it is after its vGPU moved between slice layouts
//! (commands remapped, contexts and GGTT entries rebased); migrating back restores it.
//!
//! Submodules: [`cmd`] encodes commands as raw dwords; [`listing`] makes the aubinator-like listings
//! `gmig decode` prints; [`fixture`] holds the fixture set, its generator and its replay (see
//! `docs/fixtures.md`).

use std::collections::BTreeMap;

use crate::{
    remap_walk, AddressSpace, Budget, Engine, Gen, GgttOffset, GpuMemory, GpuMemoryMut,
    MemoryError, RemapStats, RingSpan, SliceMove, WalkError,
};

pub mod cmd;
pub mod fixture;
pub mod listing;

/// Size of a GTT page and of a physical page in the memory image.
pub const PAGE_SIZE: u64 = 4096;
const PAGE: usize = 4096;

/// Number of entries of the GEN8+ global GTT (4 GiB of graphics memory, 8-byte entries).
pub const GGTT_ENTRIES: u64 = 1 << 20;
/// Highest physical or PPGTT address + 1 (48-bit addressing).
pub const ADDRESS_LIMIT: u64 = 1 << 48;
const ADDRESS_MASK: u64 = ADDRESS_LIMIT - 1;
/// Mask of the page address bits of a GGTT or PPGTT entry.
const PTE_ADDRESS_MASK: u64 = 0xffff_ffff_f000;
/// Present bit of a GGTT or PPGTT entry.
const PTE_PRESENT: u64 = 1;

const TYPE_AUB: u32 = 7;
const OPCODE_LEGACY: u32 = 0x01;
const OPCODE_MEM_TRACE: u32 = 0x2e;

/// Sub-opcodes of the memtrace (opcode 0x2e) packets.
pub mod subop {
    /// `REGISTER_POLL`.
    pub const REGISTER_POLL: u32 = 0x02;
    /// `REGISTER_WRITE`.
    pub const REGISTER_WRITE: u32 = 0x03;
    /// `MEMORY_WRITE`.
    pub const MEMORY_WRITE: u32 = 0x06;
    /// `COMMENT`.
    pub const COMMENT: u32 = 0x08;
    /// `MEM_TRACE_VERSION` (the extended version packet that starts a GEN8+ capture).
    pub const VERSION: u32 = 0x0e;
}

/// Register-write size field (DW2 bits 19:16) for a dword register.
const REGISTER_SIZE_DWORD: u32 = 2 << 16;

/// Register offsets relative to an engine's MMIO base.
pub mod reg {
    /// `RING_TAIL`.
    pub const RING_TAIL: u32 = 0x30;
    /// `RING_HEAD`.
    pub const RING_HEAD: u32 = 0x34;
    /// `RING_START`.
    pub const RING_START: u32 = 0x38;
    /// `RING_CTL`.
    pub const RING_CTL: u32 = 0x3c;
    /// `HWS_PGA`: the global hardware status page.
    pub const HWS_PGA: u32 = 0x80;
    /// `EXECLIST_SUBMITPORT` (ELSP, GEN8–GEN10).
    pub const EXECLIST_SUBMITPORT: u32 = 0x230;
    /// `EXECLIST_STATUS`.
    pub const EXECLIST_STATUS: u32 = 0x234;
    /// `CTX_CTRL` (context control).
    pub const CTX_CTRL: u32 = 0x244;
    /// `PDP0` lower dword.
    pub const PDP0_LDW: u32 = 0x270;
    /// `PDP0` upper dword.
    pub const PDP0_UDW: u32 = 0x274;
    /// `GFX_MODE` (execlist enable).
    pub const GFX_MODE: u32 = 0x29c;
    /// `CTX_TIMESTAMP`.
    pub const CTX_TIMESTAMP: u32 = 0x3a8;
    /// `EXECLIST_SQ_CONTENTS` (ELSQ slot 0, GEN11+).
    pub const EXECLIST_SQ_CONTENTS: u32 = 0x510;
    /// `EXECLIST_CONTROL` (GEN11+; writing 1 loads the ELSQ).
    pub const EXECLIST_CONTROL: u32 = 0x550;
}

/// Dword indices of the register state in a context image (after the PPHWSP page).
mod ctx {
    pub const RING_HEAD: usize = 5;
    pub const RING_TAIL: usize = 7;
    pub const RING_START: usize = 9;
    pub const RING_CTL: usize = 11;
    pub const PDP0_UDW: usize = 49;
    pub const PDP0_LDW: usize = 51;
    /// Dwords of the context image that we read and write.
    pub const DWORDS: usize = 64;
}

/// Valid bit | legacy 64-bit PPGTT addressing mode (bits 4:3 = 3): the flags of our descriptors.
pub const DESCRIPTOR_FLAGS: u64 = 0x19;
/// Mask of the LRCA (GGTT address of the logical ring context) in a context descriptor.
pub const DESCRIPTOR_LRCA_MASK: u64 = 0xffff_f000;

/// The device id (simulator id) `intel_dump_gpu` writes for each generation's first platform.
#[must_use]
pub fn device_id(gen: Gen) -> u32 {
    match gen {
        Gen::Gen8 => 11,  // BDW
        Gen::Gen9 => 12,  // SKL
        Gen::Gen11 => 19, // ICL
    }
}

/// The generation of an AUB device (simulator) id, where we know it.
#[must_use]
pub fn gen_of_device(device: u32) -> Option<Gen> {
    match device {
        11 | 13 => Some(Gen::Gen8),                // BDW, CHV
        12 | 14 | 16 | 17 | 24 => Some(Gen::Gen9), // SKL, BXT, KBL, GLK, CFL
        19 | 28 => Some(Gen::Gen11),               // ICL, EHL
        _ => None,
    }
}

/// MMIO base of an engine's registers on a generation (the first instance of each engine class).
#[must_use]
pub fn mmio_base(gen: Gen, engine: Engine) -> u32 {
    match (gen, engine) {
        (_, Engine::Render) => 0x2000,
        (_, Engine::Blitter) => 0x2_2000,
        (Gen::Gen8 | Gen::Gen9, Engine::Video) => 0x1_2000,
        (Gen::Gen8 | Gen::Gen9, Engine::VideoEnhance) => 0x1_a000,
        (Gen::Gen11, Engine::Video) => 0x1c_0000,
        (Gen::Gen11, Engine::VideoEnhance) => 0x1c_8000,
    }
}

/// Every (engine, MMIO base) pair the reader recognises execlist ports at, across generations.
const ENGINE_BASES: [(Engine, u32); 6] = [
    (Engine::Render, 0x2000),
    (Engine::Blitter, 0x2_2000),
    (Engine::Video, 0x1_2000),
    (Engine::Video, 0x1c_0000),
    (Engine::VideoEnhance, 0x1_a000),
    (Engine::VideoEnhance, 0x1c_8000),
];

fn engine_index(engine: Engine) -> usize {
    match engine {
        Engine::Render => 0,
        Engine::Blitter => 1,
        Engine::Video => 2,
        Engine::VideoEnhance => 3,
    }
}

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
    /// More submissions than [`ReadLimits::max_submissions`].
    #[error("byte 0x{offset:x}: more than {limit} submissions")]
    TooManySubmissions {
        /// Offset of the packet.
        offset: usize,
        /// The bound.
        limit: usize,
    },
    /// More distinct registers than [`ReadLimits::max_registers`].
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

// ------------------------------------------------------------------------------------------------
// Memory image
// ------------------------------------------------------------------------------------------------

/// GGTT entries and physical pages, as a capture leaves them.
///
/// Physical pages that were never written read as zeros; GGTT offsets without a present entry and
/// PPGTT addresses without present page-table entries do not read at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryImage {
    ggtt: BTreeMap<u64, u64>,
    phys: BTreeMap<u64, Box<[u8]>>,
}

impl MemoryImage {
    /// An empty image.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The GGTT entry (PTE) with this index, if one was written.
    #[must_use]
    pub fn ggtt_entry(&self, index: u64) -> Option<u64> {
        self.ggtt.get(&index).copied()
    }

    /// All written GGTT entries, by index.
    pub fn ggtt_entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ggtt.iter().map(|(&i, &e)| (i, e))
    }

    /// Number of written GGTT entries.
    #[must_use]
    pub fn ggtt_entry_count(&self) -> usize {
        self.ggtt.len()
    }

    /// Set GGTT entry `index` (must be below [`GGTT_ENTRIES`]).
    ///
    /// # Errors
    /// [`MemFault::GgttOutOfRange`] when the index is beyond the table.
    pub fn set_ggtt_entry(&mut self, index: u64, pte: u64) -> std::result::Result<(), MemFault> {
        if index >= GGTT_ENTRIES {
            return Err(MemFault::GgttOutOfRange {
                addr: index.saturating_mul(PAGE_SIZE),
            });
        }
        self.ggtt.insert(index, pte);
        Ok(())
    }

    /// Remove GGTT entry `index`, returning it.
    pub fn clear_ggtt_entry(&mut self, index: u64) -> Option<u64> {
        self.ggtt.remove(&index)
    }

    /// All physical pages that were written, by page number (physical address / 4096).
    pub fn phys_pages(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        self.phys.iter().map(|(&n, p)| (n, &p[..]))
    }

    /// Number of physical pages held.
    #[must_use]
    pub fn page_count(&self) -> u64 {
        self.phys.len() as u64
    }

    /// The physical address a GGTT offset maps to.
    ///
    /// # Errors
    /// [`MemFault::GgttOutOfRange`] or [`MemFault::GgttUnmapped`].
    pub fn translate_ggtt(&self, addr: GgttOffset) -> std::result::Result<u64, MemFault> {
        let index = addr.0 / PAGE_SIZE;
        if index >= GGTT_ENTRIES {
            return Err(MemFault::GgttOutOfRange { addr: addr.0 });
        }
        match self.ggtt.get(&index) {
            Some(&pte) if pte & PTE_PRESENT != 0 => {
                Ok((pte & PTE_ADDRESS_MASK) | (addr.0 % PAGE_SIZE))
            }
            _ => Err(MemFault::GgttUnmapped { addr: addr.0 }),
        }
    }

    /// Read physical memory; pages never written read as zeros.
    ///
    /// # Errors
    /// [`MemFault::Overflow`] past the 48-bit address space.
    pub fn read_phys(&self, addr: u64, out: &mut [u8]) -> std::result::Result<(), MemFault> {
        check_range(addr, out.len() as u64)?;
        let mut done = 0usize;
        while done < out.len() {
            let a = addr + done as u64;
            let in_page = (a % PAGE_SIZE) as usize;
            let n = (PAGE - in_page).min(out.len() - done);
            let dst = &mut out[done..done + n];
            match self.phys.get(&(a / PAGE_SIZE)) {
                Some(page) => dst.copy_from_slice(&page[in_page..in_page + n]),
                None => dst.fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// Write physical memory, creating pages as needed, at most `max_pages` pages in all.
    ///
    /// # Errors
    /// [`MemFault::Overflow`] or [`MemFault::PageLimit`]; on error nothing is written.
    pub fn write_phys(
        &mut self,
        addr: u64,
        data: &[u8],
        max_pages: u64,
    ) -> std::result::Result<(), MemFault> {
        check_range(addr, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let first = addr / PAGE_SIZE;
        let last = (addr + data.len() as u64 - 1) / PAGE_SIZE;
        let new_pages = (first..=last)
            .filter(|p| !self.phys.contains_key(p))
            .count() as u64;
        if self.page_count().saturating_add(new_pages) > max_pages {
            return Err(MemFault::PageLimit { limit: max_pages });
        }
        let mut done = 0usize;
        while done < data.len() {
            let a = addr + done as u64;
            let in_page = (a % PAGE_SIZE) as usize;
            let n = (PAGE - in_page).min(data.len() - done);
            let page = self
                .phys
                .entry(a / PAGE_SIZE)
                .or_insert_with(|| vec![0u8; PAGE].into_boxed_slice());
            page[in_page..in_page + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// Read through the GGTT.
    ///
    /// # Errors
    /// A [`MemFault`] for the first page that does not translate.
    pub fn read_ggtt(&self, addr: GgttOffset, out: &mut [u8]) -> std::result::Result<(), MemFault> {
        self.read_translated(addr.0, out, |a| self.translate_ggtt(GgttOffset(a)))
    }

    /// Reads `out.len()` bytes at `addr` of an address space `translate` maps page by page onto
    /// physical memory.
    fn read_translated(
        &self,
        addr: u64,
        out: &mut [u8],
        translate: impl Fn(u64) -> std::result::Result<u64, MemFault>,
    ) -> std::result::Result<(), MemFault> {
        check_range(addr, out.len() as u64)?;
        let mut done = 0usize;
        while done < out.len() {
            let a = addr + done as u64;
            let n = (PAGE - (a % PAGE_SIZE) as usize).min(out.len() - done);
            let pa = translate(a)?;
            self.read_phys(pa, &mut out[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `addr` of an address space `translate` maps onto physical memory; every
    /// page is translated before anything is written, so a fault changes nothing.
    fn write_translated(
        &mut self,
        addr: u64,
        data: &[u8],
        max_pages: u64,
        translate: impl Fn(&Self, u64) -> std::result::Result<u64, MemFault>,
    ) -> std::result::Result<(), MemFault> {
        check_range(addr, data.len() as u64)?;
        let mut chunks = Vec::new();
        let mut done = 0usize;
        while done < data.len() {
            let a = addr + done as u64;
            let n = (PAGE - (a % PAGE_SIZE) as usize).min(data.len() - done);
            chunks.push((translate(self, a)?, done, n));
            done += n;
        }
        for (pa, from, n) in chunks {
            self.write_phys(pa, &data[from..from + n], max_pages)?;
        }
        Ok(())
    }

    /// Write through the GGTT; every page must already be mapped.
    ///
    /// # Errors
    /// A [`MemFault`]; translation is checked for every page before anything is written.
    pub fn write_ggtt(
        &mut self,
        addr: GgttOffset,
        data: &[u8],
        max_pages: u64,
    ) -> std::result::Result<(), MemFault> {
        self.write_translated(addr.0, data, max_pages, |m, a| {
            m.translate_ggtt(GgttOffset(a))
        })
    }

    /// The physical address a PPGTT address maps to under the 4-level tables rooted at `pml4`.
    ///
    /// # Errors
    /// [`MemFault::PpgttUnmapped`] or [`MemFault::Overflow`].
    pub fn translate_ppgtt(&self, pml4: u64, addr: u64) -> std::result::Result<u64, MemFault> {
        check_range(addr, 1)?;
        let mut table = pml4 & PTE_ADDRESS_MASK;
        for level in (1u8..=4).rev() {
            let shift = 12 + 9 * u32::from(level - 1);
            let index = (addr >> shift) & 0x1ff;
            let mut entry = [0u8; 8];
            self.read_phys(table + index * 8, &mut entry)?;
            let entry = u64::from_le_bytes(entry);
            if entry & PTE_PRESENT == 0 {
                return Err(MemFault::PpgttUnmapped { addr, level });
            }
            table = entry & PTE_ADDRESS_MASK;
        }
        Ok(table | (addr % PAGE_SIZE))
    }

    /// Read through the PPGTT rooted at `pml4`.
    ///
    /// # Errors
    /// A [`MemFault`] for the first page that does not translate.
    pub fn read_ppgtt(
        &self,
        pml4: u64,
        addr: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemFault> {
        self.read_translated(addr, out, |a| self.translate_ppgtt(pml4, a))
    }

    /// Write through the PPGTT rooted at `pml4`; every page must already be mapped.
    ///
    /// # Errors
    /// A [`MemFault`]; translation is checked for every page before anything is written.
    pub fn write_ppgtt(
        &mut self,
        pml4: u64,
        addr: u64,
        data: &[u8],
        max_pages: u64,
    ) -> std::result::Result<(), MemFault> {
        self.write_translated(addr, data, max_pages, |m, a| m.translate_ppgtt(pml4, a))
    }

    /// Read little-endian dwords through the GGTT.
    ///
    /// # Errors
    /// As [`MemoryImage::read_ggtt`].
    pub fn read_ggtt_dwords(
        &self,
        addr: GgttOffset,
        count: usize,
    ) -> std::result::Result<Vec<u32>, MemFault> {
        let len = count.checked_mul(4).ok_or(MemFault::Overflow {
            addr: addr.0,
            len: u64::MAX,
        })?;
        check_range(addr.0, len as u64)?;
        let mut bytes = vec![0u8; len];
        self.read_ggtt(addr, &mut bytes)?;
        Ok(dwords_of(&bytes))
    }
}

fn check_range(addr: u64, len: u64) -> std::result::Result<(), MemFault> {
    match addr.checked_add(len) {
        Some(end) if end <= ADDRESS_LIMIT => Ok(()),
        _ => Err(MemFault::Overflow { addr, len }),
    }
}

/// Little-endian dwords of a byte slice (a trailing partial dword is dropped).
#[must_use]
pub fn dwords_of(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Little-endian bytes of dwords.
#[must_use]
pub fn bytes_of(dwords: &[u32]) -> Vec<u8> {
    dwords.iter().flat_map(|d| d.to_le_bytes()).collect()
}

// ------------------------------------------------------------------------------------------------
// Submissions
// ------------------------------------------------------------------------------------------------

/// The ring a submitted context runs, as its context image gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingState {
    /// GGTT offset of the ring buffer (`RING_START`).
    pub start: GgttOffset,
    /// Size of the ring in bytes (from `RING_CTL`).
    pub size: u64,
    /// Head offset in bytes (`RING_HEAD`).
    pub head: u64,
    /// Tail offset in bytes (`RING_TAIL`).
    pub tail: u64,
}

/// One execlist submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Submission {
    /// Engine the context was submitted to.
    pub engine: Engine,
    /// The context descriptor written to the execlist port.
    pub descriptor: u64,
    /// GGTT offset of the logical ring context (PPHWSP page, then the context image).
    pub lrca: GgttOffset,
    /// The ring, as the context image gave it at submission time.
    pub ring: RingState,
    /// Physical address of the PPGTT's PML4 (from the context image's `PDP0`).
    pub pml4: u64,
}

impl Submission {
    /// GGTT offset of the context image's register state (one page after the LRCA).
    #[must_use]
    pub fn context_image(&self) -> GgttOffset {
        GgttOffset(self.lrca.0 + PAGE_SIZE)
    }
}

impl Submission {
    /// The ring as the walker takes it.
    #[must_use]
    pub fn ring_span(&self) -> RingSpan {
        RingSpan {
            start: self.ring.start,
            size: self.ring.size,
            head: self.ring.head,
            tail: self.ring.tail,
        }
    }

    /// The memory this submission's commands see: the image through the GGTT, and through the
    /// PPGTT rooted at this submission's PML4.
    #[must_use]
    pub fn memory<'a>(&self, image: &'a MemoryImage) -> CaptureMemory<'a> {
        CaptureMemory {
            image,
            pml4: self.pml4,
        }
    }
}

/// A [`MemoryImage`] seen through the GGTT and one PPGTT, as the walker reads it.
#[derive(Clone, Copy, Debug)]
pub struct CaptureMemory<'a> {
    /// The image.
    pub image: &'a MemoryImage,
    /// Physical address of the PPGTT's PML4.
    pub pml4: u64,
}

/// A mutable [`MemoryImage`] seen through the GGTT and one PPGTT (for remapping in place).
#[derive(Debug)]
pub struct CaptureMemoryMut<'a> {
    /// The image.
    pub image: &'a mut MemoryImage,
    /// Physical address of the PPGTT's PML4.
    pub pml4: u64,
}

fn memory_error(space: AddressSpace, fault: MemFault) -> MemoryError {
    match fault {
        MemFault::GgttOutOfRange { addr }
        | MemFault::GgttUnmapped { addr }
        | MemFault::PpgttUnmapped { addr, .. }
        | MemFault::BadContextAddress { addr } => MemoryError::Unmapped { space, addr },
        MemFault::Overflow { addr, len } => MemoryError::Overflow {
            space,
            addr,
            len: usize::try_from(len).unwrap_or(usize::MAX),
        },
        MemFault::PageLimit { .. } => MemoryError::Denied { space, addr: 0 },
    }
}

fn image_read(
    image: &MemoryImage,
    pml4: u64,
    space: AddressSpace,
    addr: u64,
    out: &mut [u8],
) -> std::result::Result<(), MemoryError> {
    match space {
        AddressSpace::Ggtt => image.read_ggtt(GgttOffset(addr), out),
        AddressSpace::Ppgtt => image.read_ppgtt(pml4, addr, out),
    }
    .map_err(|f| memory_error(space, f))
}

impl GpuMemory for CaptureMemory<'_> {
    fn read(
        &self,
        space: AddressSpace,
        addr: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemoryError> {
        image_read(self.image, self.pml4, space, addr, out)
    }
}

impl GpuMemory for CaptureMemoryMut<'_> {
    fn read(
        &self,
        space: AddressSpace,
        addr: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemoryError> {
        image_read(self.image, self.pml4, space, addr, out)
    }
}

impl GpuMemoryMut for CaptureMemoryMut<'_> {
    fn write(
        &mut self,
        space: AddressSpace,
        addr: u64,
        data: &[u8],
    ) -> std::result::Result<(), MemoryError> {
        match space {
            AddressSpace::Ggtt => self.image.write_ggtt(GgttOffset(addr), data, u64::MAX),
            AddressSpace::Ppgtt => self.image.write_ppgtt(self.pml4, addr, data, u64::MAX),
        }
        .map_err(|f| memory_error(space, f))
    }
}

fn submission_from_image(
    image: &MemoryImage,
    engine: Engine,
    descriptor: u64,
) -> std::result::Result<Submission, MemFault> {
    let lrca = GgttOffset(descriptor & DESCRIPTOR_LRCA_MASK);
    let c = image.read_ggtt_dwords(GgttOffset(lrca.0 + PAGE_SIZE), ctx::PDP0_LDW + 1)?;
    let at = |i: usize| u64::from(c.get(i).copied().unwrap_or(0));
    Ok(Submission {
        engine,
        descriptor,
        lrca,
        ring: RingState {
            start: GgttOffset(at(ctx::RING_START) & 0xffff_f000),
            size: (at(ctx::RING_CTL) & 0x1f_f000) + PAGE_SIZE,
            head: at(ctx::RING_HEAD) & 0x1f_fffc,
            tail: at(ctx::RING_TAIL) & 0x1f_fff8,
        },
        pml4: ((at(ctx::PDP0_UDW) << 32) | at(ctx::PDP0_LDW)) & PTE_ADDRESS_MASK,
    })
}

// ------------------------------------------------------------------------------------------------
// Reader
// ------------------------------------------------------------------------------------------------

/// Bounds on what a reader may build from untrusted input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// Most physical pages the memory image may hold.
    pub max_pages: u64,
    /// Most submissions.
    pub max_submissions: usize,
    /// Most distinct registers remembered.
    pub max_registers: usize,
}

impl Default for ReadLimits {
    /// 64 Ki pages (256 MiB), 64 Ki submissions, 64 Ki registers.
    fn default() -> Self {
        Self {
            max_pages: 1 << 16,
            max_submissions: 1 << 16,
            max_registers: 1 << 16,
        }
    }
}

/// One packet's effect, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AubEvent {
    /// `MEM_TRACE_VERSION`.
    Version {
        /// Byte offset of the packet.
        offset: usize,
        /// Device (simulator) id.
        device: u32,
        /// The generation of that device, if known.
        gen: Option<Gen>,
        /// Application name (and PCI id) text.
        app_name: String,
    },
    /// `MEMORY_WRITE`.
    MemoryWrite {
        /// Byte offset of the packet.
        offset: usize,
        /// Address space.
        space: AubSpace,
        /// Address (48-bit).
        addr: u64,
        /// Length in bytes.
        len: u32,
    },
    /// `REGISTER_WRITE` (execlist-port writes included).
    RegisterWrite {
        /// Byte offset of the packet.
        offset: usize,
        /// Register.
        reg: u32,
        /// Value.
        value: u32,
    },
    /// `REGISTER_POLL`.
    RegisterPoll {
        /// Byte offset of the packet.
        offset: usize,
        /// Register.
        reg: u32,
        /// Mask (low dword).
        mask: u32,
        /// Awaited value.
        value: u32,
    },
    /// A context was submitted (follows the register write that submitted it).
    Submit {
        /// Byte offset of the packet.
        offset: usize,
        /// The submission.
        submission: Submission,
    },
    /// A memtrace packet that changes nothing (comments, polls of memory, markers).
    Skipped {
        /// Byte offset of the packet.
        offset: usize,
        /// DW0.
        dw0: u32,
    },
}

#[derive(Clone, Copy, Debug, Default)]
struct PortState {
    elsp: [u32; 4],
    elsp_count: usize,
    sq_lo: u32,
    sq_hi: u32,
}

/// A lazy, total reader of AUB bytes: `next_event` yields one packet's effect at a time and keeps the
/// memory image, registers and submissions current; after an error it yields nothing more.
#[derive(Debug)]
pub struct AubReader<'a> {
    bytes: &'a [u8],
    pos: usize,
    done: bool,
    limits: ReadLimits,
    capture: AubCapture,
    ports: [PortState; 4],
    pending: Vec<AubEvent>,
}

impl<'a> AubReader<'a> {
    /// A reader over `bytes` with the default [`ReadLimits`].
    #[must_use]
    pub fn new(bytes: &'a [u8]) -> Self {
        Self::with_limits(bytes, ReadLimits::default())
    }

    /// A reader with explicit limits.
    #[must_use]
    pub fn with_limits(bytes: &'a [u8], limits: ReadLimits) -> Self {
        Self {
            bytes,
            pos: 0,
            done: false,
            limits,
            capture: AubCapture::default(),
            ports: [PortState::default(); 4],
            pending: Vec::new(),
        }
    }

    /// The memory image as the packets read so far leave it.
    #[must_use]
    pub fn image(&self) -> &MemoryImage {
        &self.capture.memory
    }

    /// The capture as the packets read so far leave it.
    #[must_use]
    pub fn capture(&self) -> &AubCapture {
        &self.capture
    }

    /// The capture read so far, giving up the reader.
    #[must_use]
    pub fn into_capture(self) -> AubCapture {
        self.capture
    }

    /// Byte offset of the next packet.
    #[must_use]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The next event, `Ok(None)` at the end of the file; after an error, always `Ok(None)`.
    ///
    /// # Errors
    /// An [`AubError`] naming the offending packet's byte offset.
    pub fn next_event(&mut self) -> Result<Option<AubEvent>> {
        if !self.pending.is_empty() {
            return Ok(Some(self.pending.remove(0)));
        }
        if self.done {
            return Ok(None);
        }
        match self.step() {
            Ok(ev) => {
                if ev.is_none() {
                    self.done = true;
                }
                Ok(ev)
            }
            Err(e) => {
                self.done = true;
                self.pending.clear();
                Err(e)
            }
        }
    }

    fn step(&mut self) -> Result<Option<AubEvent>> {
        let offset = self.pos;
        let rest = self.bytes.get(offset..).unwrap_or(&[]);
        if rest.is_empty() {
            return Ok(None);
        }
        let have = rest.len() as u64;
        let Some(head) = rest.get(..4) else {
            return Err(AubError::Truncated {
                offset,
                need: 4,
                have,
            });
        };
        let dw0 = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        if dw0 >> 29 != TYPE_AUB {
            return Err(AubError::NotAubPacket { offset, dw0 });
        }
        match (dw0 >> 23) & 0x3f {
            OPCODE_MEM_TRACE => {}
            OPCODE_LEGACY => return Err(AubError::LegacyPacket { offset, dw0 }),
            _ => return Err(AubError::UnknownOpcode { offset, dw0 }),
        }
        let dwords = (dw0 & 0xffff) + 1;
        let need = u64::from(dwords) * 4;
        let Some(packet) = rest.get(..need as usize) else {
            return Err(AubError::Truncated { offset, need, have });
        };
        self.pos = offset + need as usize;
        let p = dwords_of(packet);
        let at = |i: usize| p.get(i).copied().unwrap_or(0);
        let short = |min: u32| {
            if dwords < min {
                Err(AubError::PacketTooShort {
                    offset,
                    dw0,
                    dwords,
                    min,
                })
            } else {
                Ok(())
            }
        };
        let ev = match (dw0 >> 16) & 0x7f {
            subop::VERSION => {
                short(5)?;
                let device = (at(2) >> 8) & 0xff;
                let gen = gen_of_device(device);
                let name = packet.get(20..).unwrap_or(&[]);
                let end = name
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(name.len())
                    .min(256);
                let app_name = String::from_utf8_lossy(&name[..end]).into_owned();
                self.capture.gen = gen;
                self.capture.app_name.clone_from(&app_name);
                AubEvent::Version {
                    offset,
                    device,
                    gen,
                    app_name,
                }
            }
            subop::MEMORY_WRITE => {
                short(5)?;
                let addr = (u64::from(at(1)) | (u64::from(at(2)) << 32)) & ADDRESS_MASK;
                let space_bits = at(3) >> 28;
                let len = at(4);
                let room = packet.len().saturating_sub(20);
                let data = (len as usize)
                    .checked_add(20)
                    .and_then(|end| packet.get(20..end))
                    .ok_or(AubError::WriteTooLong {
                        offset,
                        len,
                        room: room as u32,
                    })?;
                let max_pages = self.limits.max_pages;
                let mem = &mut self.capture.memory;
                let space = match space_bits {
                    0 => {
                        mem.write_ggtt(GgttOffset(addr), data, max_pages)
                            .map_err(|fault| AubError::Memory { offset, fault })?;
                        AubSpace::Ggtt
                    }
                    2 => {
                        mem.write_phys(addr, data, max_pages)
                            .map_err(|fault| AubError::Memory { offset, fault })?;
                        AubSpace::Physical
                    }
                    4 => {
                        if !addr.is_multiple_of(8) || len % 8 != 0 {
                            return Err(AubError::MisalignedEntryWrite { offset, addr, len });
                        }
                        let first = addr / 8;
                        let count = u64::from(len / 8);
                        if first.saturating_add(count) > GGTT_ENTRIES {
                            return Err(AubError::Memory {
                                offset,
                                fault: MemFault::GgttOutOfRange {
                                    addr: first.saturating_add(count).saturating_mul(PAGE_SIZE),
                                },
                            });
                        }
                        for (i, e) in data.chunks_exact(8).enumerate() {
                            let pte = u64::from_le_bytes([
                                e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7],
                            ]);
                            mem.set_ggtt_entry(first + i as u64, pte)
                                .map_err(|fault| AubError::Memory { offset, fault })?;
                        }
                        AubSpace::GgttEntry
                    }
                    space => return Err(AubError::UnsupportedSpace { offset, space }),
                };
                AubEvent::MemoryWrite {
                    offset,
                    space,
                    addr,
                    len,
                }
            }
            subop::REGISTER_WRITE => {
                short(6)?;
                let (reg, value) = (at(1), at(5));
                self.register_write(offset, reg, value)?;
                AubEvent::RegisterWrite { offset, reg, value }
            }
            subop::REGISTER_POLL => {
                short(6)?;
                AubEvent::RegisterPoll {
                    offset,
                    reg: at(1),
                    mask: at(3),
                    value: at(5),
                }
            }
            // Version (old), register/memory compare, memory poll, frame begin, comment, delay,
            // memory dump, test-phase marker, continuous region, predicate, dump compress: none
            // changes memory, registers or submissions.
            0x00
            | 0x01
            | 0x04
            | 0x05
            | 0x07
            | subop::COMMENT
            | 0x09
            | 0x0a
            | 0x0c
            | 0x0d
            | 0x0f
            | 0x10 => AubEvent::Skipped { offset, dw0 },
            // MEMORY_WRITE_DISCONTIGUOUS (0x0b) and anything unknown might change memory: refusing
            // is sound, skipping is not.
            _ => return Err(AubError::UnsupportedPacket { offset, dw0 }),
        };
        Ok(Some(ev))
    }

    fn register_write(&mut self, offset: usize, reg: u32, value: u32) -> Result<()> {
        for (engine, base) in ENGINE_BASES {
            let port = &mut self.ports[engine_index(engine)];
            let Some(rel) = reg.checked_sub(base) else {
                continue;
            };
            match rel {
                reg::EXECLIST_SUBMITPORT => {
                    port.elsp[port.elsp_count] = value;
                    port.elsp_count += 1;
                    if port.elsp_count == 4 {
                        port.elsp_count = 0;
                        let e = port.elsp;
                        let element0 = (u64::from(e[2]) << 32) | u64::from(e[3]);
                        let element1 = (u64::from(e[0]) << 32) | u64::from(e[1]);
                        self.submit(offset, engine, element0)?;
                        if element1 & 1 != 0 {
                            self.submit(offset, engine, element1)?;
                        }
                    }
                    return Ok(());
                }
                reg::EXECLIST_SQ_CONTENTS => {
                    port.sq_lo = value;
                    return Ok(());
                }
                r if r == reg::EXECLIST_SQ_CONTENTS + 4 => {
                    port.sq_hi = value;
                    return Ok(());
                }
                reg::EXECLIST_CONTROL => {
                    let desc = (u64::from(port.sq_hi) << 32) | u64::from(port.sq_lo);
                    if value & 1 != 0 {
                        self.submit(offset, engine, desc)?;
                    }
                    return Ok(());
                }
                _ => {}
            }
        }
        let regs = &mut self.capture.registers;
        if !regs.contains_key(&reg) && regs.len() >= self.limits.max_registers {
            return Err(AubError::TooManyRegisters {
                offset,
                limit: self.limits.max_registers,
            });
        }
        regs.insert(reg, value);
        Ok(())
    }

    fn submit(&mut self, offset: usize, engine: Engine, descriptor: u64) -> Result<()> {
        if self.capture.submissions.len() >= self.limits.max_submissions {
            return Err(AubError::TooManySubmissions {
                offset,
                limit: self.limits.max_submissions,
            });
        }
        let submission =
            submission_from_image(&self.capture.memory, engine, descriptor).map_err(|fault| {
                AubError::ContextUnreadable {
                    offset,
                    descriptor,
                    fault,
                }
            })?;
        self.capture.submissions.push(submission);
        self.pending.push(AubEvent::Submit { offset, submission });
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------------
// Capture
// ------------------------------------------------------------------------------------------------

/// What a capture leaves: the generation, memory, registers and submissions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AubCapture {
    /// Generation named by the version packet (None when absent or unknown).
    pub gen: Option<Gen>,
    /// Application name of the version packet.
    pub app_name: String,
    /// GGTT entries and physical pages.
    pub memory: MemoryImage,
    /// Last value written to every register other than the execlist ports.
    pub registers: BTreeMap<u32, u32>,
    /// Submissions, in order.
    pub submissions: Vec<Submission>,
}

impl AubCapture {
    /// Read a whole capture with the default limits.
    ///
    /// # Errors
    /// The first [`AubError`].
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        Self::parse_with_limits(bytes, ReadLimits::default())
    }

    /// Read a whole capture with explicit limits.
    ///
    /// # Errors
    /// The first [`AubError`].
    pub fn parse_with_limits(bytes: &[u8], limits: ReadLimits) -> Result<Self> {
        let mut r = AubReader::with_limits(bytes, limits);
        while r.next_event()?.is_some() {}
        Ok(r.into_capture())
    }

    /// Write the capture as AUB bytes: version, registers, GGTT entries, physical pages (each trimmed
    /// after its last non-zero dword), then the submissions' execlist-port writes, each followed by a
    /// poll of `EXECLIST_STATUS` as `intel_dump_gpu` writes it.
    ///
    /// # Errors
    /// [`AubError::NoGeneration`] when `gen` is `None`.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let gen = self.gen.ok_or(AubError::NoGeneration)?;
        let mut w = AubWriter::new(gen, &self.app_name);
        for (&reg, &value) in &self.registers {
            w.register_write(reg, value);
        }
        // GGTT entries, in runs of consecutive indices.
        let entries: Vec<(u64, u64)> = self.memory.ggtt_entries().collect();
        let mut i = 0;
        while i < entries.len() {
            let start = entries[i].0;
            let mut run = Vec::new();
            while let Some(&(idx, pte)) = entries.get(i) {
                if idx != start + run.len() as u64 / 8 || run.len() >= PAGE {
                    break;
                }
                run.extend_from_slice(&pte.to_le_bytes());
                i += 1;
            }
            w.memory_write(AubSpace::GgttEntry, start * 8, &run);
        }
        for (page, data) in self.memory.phys_pages() {
            let used = data
                .chunks_exact(4)
                .rposition(|c| c != [0, 0, 0, 0])
                .map_or(4, |last| (last + 1) * 4);
            w.memory_write(AubSpace::Physical, page * PAGE_SIZE, &data[..used]);
        }
        for s in &self.submissions {
            w.submit(gen, s.engine, s.descriptor);
        }
        Ok(w.finish())
    }
}

impl AubCapture {
    /// The capture as it would be after migrating its vGPU from `mv.from` to `mv.to`:
    ///
    /// 1. every distinct (engine, ring, PPGTT) of the submissions is walked and its GGTT addresses
    ///    rebased in place ([`remap_walk`]: ring, first- and second-level batches; PPGTT addresses
    ///    untouched; each walk all or nothing);
    /// 2. each context image's `RING_START`, and each engine's `HWS_PGA` register, are rebased;
    /// 3. every GGTT entry inside a source slice moves to the same place in the destination slice
    ///    (the physical pages stay where they are);
    /// 4. each descriptor's LRCA is rebased, and the submissions are read again from the new image.
    ///
    /// Migrating with `mv.inverse()` afterwards gives back the original capture. The capture is
    /// taken as its final memory shows it: submissions that share a ring share its remap.
    ///
    /// # Errors
    /// [`AubError::Walk`] when a walk or its remap fails, [`AubError::NotInSlice`] for a context
    /// or ring outside the source slices, [`AubError::EntryCollision`]; `self` is never changed.
    pub fn migrate(&self, mv: &SliceMove, budget: Budget) -> Result<AubCapture> {
        let gen = self.gen.ok_or(AubError::NoGeneration)?;
        let mut out = self.clone();
        // 1. Commands.
        let mut done: Vec<(Engine, RingState, u64)> = Vec::new();
        for (i, s) in self.submissions.iter().enumerate() {
            let key = (s.engine, s.ring, s.pml4);
            if done.contains(&key) {
                continue;
            }
            done.push(key);
            let mut mem = CaptureMemoryMut {
                image: &mut out.memory,
                pml4: s.pml4,
            };
            let _stats: RemapStats = remap_walk(gen, s.engine, &mut mem, s.ring_span(), budget, mv)
                .map_err(|err| AubError::Walk { submission: i, err })?;
        }
        // 2. Context images and status pages.
        let rebase = |what: &'static str, addr: u64| {
            mv.rebase(GgttOffset(addr))
                .map(|g| g.0)
                .ok_or(AubError::NotInSlice { what, addr })
        };
        let mut contexts: Vec<u64> = self.submissions.iter().map(|s| s.lrca.0).collect();
        contexts.sort_unstable();
        contexts.dedup();
        for lrca in contexts {
            rebase("context", lrca)?;
            let at = GgttOffset(lrca + PAGE_SIZE + 4 * ctx::RING_START as u64);
            let old = out
                .memory
                .read_ggtt_dwords(at, 1)?
                .first()
                .copied()
                .unwrap_or(0);
            let start = u64::from(old) & 0xffff_f000;
            let new = rebase("ring", start)?;
            let new = u32::try_from(new).map_err(|_| AubError::NotInSlice {
                what: "ring",
                addr: start,
            })?;
            out.memory
                .write_ggtt(at, &((old & 0xfff) | new).to_le_bytes(), u64::MAX)?;
        }
        for engine in Engine::ALL {
            let reg = mmio_base(gen, engine) + reg::HWS_PGA;
            if let Some(v) = out.registers.get_mut(&reg) {
                if let Some(new) = mv.rebase(GgttOffset(u64::from(*v & 0xffff_f000))) {
                    *v = (*v & 0xfff) | u32::try_from(new.0).unwrap_or(*v & 0xffff_f000);
                }
            }
        }
        // 3. GGTT entries.
        let mut moved = BTreeMap::new();
        let mut kept = BTreeMap::new();
        for (index, pte) in out.memory.ggtt_entries() {
            match mv.rebase(GgttOffset(index * PAGE_SIZE)) {
                Some(to) => {
                    moved.insert(to.0 / PAGE_SIZE, pte);
                }
                None => {
                    kept.insert(index, pte);
                }
            }
        }
        for (&index, &pte) in &moved {
            if kept.insert(index, pte).is_some() {
                return Err(AubError::EntryCollision {
                    addr: index * PAGE_SIZE,
                });
            }
        }
        out.memory.ggtt = kept;
        // 4. Descriptors and submissions.
        for s in &mut out.submissions {
            let lrca = rebase("context", s.lrca.0)?;
            let descriptor = (s.descriptor & !DESCRIPTOR_LRCA_MASK) | lrca;
            *s = submission_from_image(&out.memory, s.engine, descriptor)?;
        }
        Ok(out)
    }
}

// ------------------------------------------------------------------------------------------------
// Writer
// ------------------------------------------------------------------------------------------------

/// Low-level AUB packet writer.
#[derive(Clone, Debug)]
pub struct AubWriter {
    out: Vec<u8>,
}

fn header(sub: u32, total_dwords: usize) -> u32 {
    (TYPE_AUB << 29) | (OPCODE_MEM_TRACE << 23) | (sub << 16) | ((total_dwords as u32 - 1) & 0xffff)
}

/// Most data bytes one `MEMORY_WRITE` packet carries (a multiple of 8 and of the page size).
const MAX_WRITE: usize = 8 * PAGE;

impl AubWriter {
    /// Start a capture with its `MEM_TRACE_VERSION` packet.
    #[must_use]
    pub fn new(gen: Gen, app_name: &str) -> Self {
        let mut name: Vec<u8> = app_name.bytes().filter(|&b| b != 0).take(252).collect();
        name.push(0);
        while !name.len().is_multiple_of(4) {
            name.push(0);
        }
        let mut w = Self { out: Vec::new() };
        w.dword(header(subop::VERSION, 5 + name.len() / 4));
        w.dword(0); // file version
        w.dword(device_id(gen) << 8);
        w.dword(0);
        w.dword(0);
        w.out.extend_from_slice(&name);
        w
    }

    fn dword(&mut self, d: u32) {
        self.out.extend_from_slice(&d.to_le_bytes());
    }

    /// `MEMORY_WRITE` packets for `data` at `addr` (split into packets of at most 32 KiB).
    pub fn memory_write(&mut self, space: AubSpace, addr: u64, data: &[u8]) {
        let mut done = 0usize;
        loop {
            let n = (data.len() - done).min(MAX_WRITE);
            let chunk = &data[done..done + n];
            let a = addr + done as u64;
            self.dword(header(subop::MEMORY_WRITE, 5 + n.div_ceil(4)));
            self.dword(a as u32);
            self.dword((a >> 32) as u32);
            self.dword(space.dw3());
            self.dword(n as u32);
            self.out.extend_from_slice(chunk);
            self.out.resize(self.out.len() + (4 - n % 4) % 4, 0);
            done += n;
            if done >= data.len() {
                break;
            }
        }
    }

    /// A dword `REGISTER_WRITE`.
    pub fn register_write(&mut self, reg: u32, value: u32) {
        self.dword(header(subop::REGISTER_WRITE, 6));
        self.dword(reg);
        self.dword(REGISTER_SIZE_DWORD);
        self.dword(0xffff_ffff);
        self.dword(0);
        self.dword(value);
    }

    /// A dword `REGISTER_POLL`.
    pub fn register_poll(&mut self, reg: u32, mask: u32, value: u32) {
        self.dword(header(subop::REGISTER_POLL, 6));
        self.dword(reg);
        self.dword(REGISTER_SIZE_DWORD);
        self.dword(mask);
        self.dword(0);
        self.dword(value);
    }

    /// Submit a context: ELSP writes on GEN8/GEN9, ELSQ and control on GEN11, then a status poll.
    pub fn submit(&mut self, gen: Gen, engine: Engine, descriptor: u64) {
        let base = mmio_base(gen, engine);
        let (lo, hi) = (descriptor as u32, (descriptor >> 32) as u32);
        if gen == Gen::Gen11 {
            self.register_write(base + reg::EXECLIST_SQ_CONTENTS, lo);
            self.register_write(base + reg::EXECLIST_SQ_CONTENTS + 4, hi);
            self.register_write(base + reg::EXECLIST_CONTROL, 1);
            self.register_poll(base + reg::EXECLIST_STATUS, 1, 1);
        } else {
            self.register_write(base + reg::EXECLIST_SUBMITPORT, 0);
            self.register_write(base + reg::EXECLIST_SUBMITPORT, 0);
            self.register_write(base + reg::EXECLIST_SUBMITPORT, hi);
            self.register_write(base + reg::EXECLIST_SUBMITPORT, lo);
            self.register_poll(base + reg::EXECLIST_STATUS, 0x10, 0);
        }
    }

    /// The bytes written.
    #[must_use]
    pub fn finish(self) -> Vec<u8> {
        self.out
    }
}

// ------------------------------------------------------------------------------------------------
// Builder
// ------------------------------------------------------------------------------------------------

/// Where a submission's ring and context live, and what the ring holds.
#[derive(Clone, Copy, Debug)]
pub struct RingSpec<'a> {
    /// GGTT offset of the ring buffer (page aligned).
    pub ring: GgttOffset,
    /// Ring size in bytes (a multiple of 4 KiB, at most 2 MiB).
    pub ring_size: u64,
    /// Commands placed at the start of the ring; head = 0, tail = their length (8-byte aligned).
    pub commands: &'a [u32],
    /// GGTT offset of the logical ring context (two pages: PPHWSP, then the context image).
    pub context: GgttOffset,
}

/// Builds captures from our own command sequences: maps GGTT and PPGTT pages onto freshly allocated
/// physical pages, places buffers, writes ring and context images, and submits.
#[derive(Clone, Debug)]
pub struct CaptureBuilder {
    capture: AubCapture,
    gen: Gen,
    next_phys_page: u64,
    pml4: Option<u64>,
    max_pages: u64,
}

/// First physical page the builder allocates.
const FIRST_PHYS_PAGE: u64 = 0x100;

impl CaptureBuilder {
    /// A new capture for `gen`, with execlists enabled (`GFX_MODE`) on every engine.
    #[must_use]
    pub fn new(gen: Gen, app_name: &str) -> Self {
        let mut capture = AubCapture {
            gen: Some(gen),
            app_name: app_name.chars().filter(|&c| c != '\0').take(200).collect(),
            ..AubCapture::default()
        };
        for engine in [
            Engine::Render,
            Engine::Blitter,
            Engine::Video,
            Engine::VideoEnhance,
        ] {
            capture
                .registers
                .insert(mmio_base(gen, engine) + reg::GFX_MODE, 0x8000_8000);
        }
        Self {
            capture,
            gen,
            next_phys_page: FIRST_PHYS_PAGE,
            pml4: None,
            max_pages: ReadLimits::default().max_pages,
        }
    }

    /// The generation.
    #[must_use]
    pub fn gen(&self) -> Gen {
        self.gen
    }

    /// The memory image so far.
    #[must_use]
    pub fn image(&self) -> &MemoryImage {
        &self.capture.memory
    }

    fn alloc_page(&mut self) -> std::result::Result<u64, MemFault> {
        if self.next_phys_page - FIRST_PHYS_PAGE >= self.max_pages {
            return Err(MemFault::PageLimit {
                limit: self.max_pages,
            });
        }
        let p = self.next_phys_page;
        self.next_phys_page += 1;
        Ok(p * PAGE_SIZE)
    }

    /// Map every GGTT page of `[addr, addr + len)` that is not mapped yet onto a new physical page.
    ///
    /// # Errors
    /// [`MemFault`] when the range leaves the GGTT or the page budget runs out.
    pub fn map_ggtt(&mut self, addr: GgttOffset, len: u64) -> Result<()> {
        let end = addr
            .0
            .checked_add(len)
            .ok_or(MemFault::Overflow { addr: addr.0, len })?;
        if end > GGTT_ENTRIES * PAGE_SIZE {
            return Err(MemFault::GgttOutOfRange { addr: end - 1 }.into());
        }
        let mut page = addr.0 / PAGE_SIZE;
        while page * PAGE_SIZE < end {
            if self
                .capture
                .memory
                .ggtt_entry(page)
                .is_none_or(|e| e & PTE_PRESENT == 0)
            {
                let pa = self.alloc_page()?;
                self.capture.memory.set_ggtt_entry(page, pa | PTE_PRESENT)?;
            }
            page += 1;
        }
        Ok(())
    }

    /// Write bytes through the GGTT, mapping pages first where needed.
    ///
    /// # Errors
    /// As [`CaptureBuilder::map_ggtt`].
    pub fn write_ggtt(&mut self, addr: GgttOffset, data: &[u8]) -> Result<()> {
        self.map_ggtt(addr, data.len() as u64)?;
        self.capture.memory.write_ggtt(addr, data, u64::MAX)?;
        Ok(())
    }

    /// Write dwords through the GGTT, mapping pages first where needed.
    ///
    /// # Errors
    /// As [`CaptureBuilder::map_ggtt`].
    pub fn write_ggtt_dwords(&mut self, addr: GgttOffset, dwords: &[u32]) -> Result<()> {
        self.write_ggtt(addr, &bytes_of(dwords))
    }

    /// Physical address of the PML4 of the capture's one PPGTT (allocated on first use).
    ///
    /// # Errors
    /// [`MemFault::PageLimit`].
    pub fn pml4(&mut self) -> Result<u64> {
        if let Some(p) = self.pml4 {
            return Ok(p);
        }
        let p = self.alloc_page()?;
        // Materialise the (empty) table so that it round-trips as a page of the image.
        self.capture.memory.write_phys(p, &[0; 8], u64::MAX)?;
        self.pml4 = Some(p);
        Ok(p)
    }

    /// Map every PPGTT page of `[addr, addr + len)` not mapped yet, creating tables as needed.
    ///
    /// # Errors
    /// [`MemFault`] when the range leaves the 48-bit space or the page budget runs out.
    pub fn map_ppgtt(&mut self, addr: u64, len: u64) -> Result<()> {
        check_range(addr, len)?;
        let pml4 = self.pml4()?;
        let mut page = addr / PAGE_SIZE;
        while page * PAGE_SIZE < addr + len {
            let va = page * PAGE_SIZE;
            let mut table = pml4;
            for level in (1u8..=4).rev() {
                let shift = 12 + 9 * u32::from(level - 1);
                let slot = table + ((va >> shift) & 0x1ff) * 8;
                let mut e = [0u8; 8];
                self.capture.memory.read_phys(slot, &mut e)?;
                let mut entry = u64::from_le_bytes(e);
                if entry & PTE_PRESENT == 0 {
                    let next = self.alloc_page()?;
                    if level > 1 {
                        self.capture.memory.write_phys(next, &[0; 8], u64::MAX)?;
                    }
                    entry = next | 3; // present | writable
                    self.capture
                        .memory
                        .write_phys(slot, &entry.to_le_bytes(), u64::MAX)?;
                }
                table = entry & PTE_ADDRESS_MASK;
            }
            page += 1;
        }
        Ok(())
    }

    /// Write bytes through the PPGTT, mapping pages first where needed.
    ///
    /// # Errors
    /// As [`CaptureBuilder::map_ppgtt`].
    pub fn write_ppgtt(&mut self, addr: u64, data: &[u8]) -> Result<()> {
        self.map_ppgtt(addr, data.len() as u64)?;
        let pml4 = self.pml4()?;
        self.capture
            .memory
            .write_ppgtt(pml4, addr, data, u64::MAX)?;
        Ok(())
    }

    /// Write dwords through the PPGTT, mapping pages first where needed.
    ///
    /// # Errors
    /// As [`CaptureBuilder::map_ppgtt`].
    pub fn write_ppgtt_dwords(&mut self, addr: u64, dwords: &[u32]) -> Result<()> {
        self.write_ppgtt(addr, &bytes_of(dwords))
    }

    /// Set a register's value (written before any submission).
    pub fn set_register(&mut self, reg: u32, value: u32) {
        self.capture.registers.insert(reg, value);
    }

    /// Place `spec.commands` in a ring, write a context image naming that ring and the PPGTT, and
    /// submit the context to `engine`.
    ///
    /// # Errors
    /// [`MemFault::BadContextAddress`] for a context the descriptor cannot hold, or a mapping fault.
    pub fn submit(&mut self, engine: Engine, spec: &RingSpec<'_>) -> Result<Submission> {
        let ctx_addr = spec.context.0;
        if !ctx_addr.is_multiple_of(PAGE_SIZE) || ctx_addr > DESCRIPTOR_LRCA_MASK {
            return Err(MemFault::BadContextAddress { addr: ctx_addr }.into());
        }
        let ring_size = spec.ring_size.clamp(PAGE_SIZE, 0x20_0000) & !(PAGE_SIZE - 1);
        self.map_ggtt(spec.ring, ring_size)?;
        self.write_ggtt_dwords(spec.ring, spec.commands)?;
        let tail = (spec.commands.len() as u64 * 4).next_multiple_of(8) % ring_size;
        let pml4 = self.pml4()?;
        let base = mmio_base(self.gen, engine);
        let mut image = vec![0u32; ctx::DWORDS];
        image[1] = 0x1100_1015; // MI_LOAD_REGISTER_IMM, 11 registers
        let pairs = [
            (2, reg::CTX_CTRL, 0x0009_0009),
            (ctx::RING_HEAD - 1, reg::RING_HEAD, 0),
            (ctx::RING_TAIL - 1, reg::RING_TAIL, tail as u32),
            (ctx::RING_START - 1, reg::RING_START, spec.ring.0 as u32),
            (
                ctx::RING_CTL - 1,
                reg::RING_CTL,
                ((ring_size - PAGE_SIZE) as u32 & 0x1f_f000) | 1,
            ),
        ];
        for (at, r, v) in pairs {
            image[at] = base + r;
            image[at + 1] = v;
        }
        image[0x21] = 0x1100_1011; // MI_LOAD_REGISTER_IMM, 9 registers
        image[0x22] = base + reg::CTX_TIMESTAMP;
        for (k, at) in (0x24..=0x32).step_by(2).enumerate() {
            // PDP3_UDW, PDP3_LDW, … PDP0_UDW, PDP0_LDW at 0x28c down to 0x270.
            image[at] = base + 0x28c - 4 * k as u32;
        }
        image[ctx::PDP0_UDW] = (pml4 >> 32) as u32;
        image[ctx::PDP0_LDW] = pml4 as u32;
        image[ctx::DWORDS - 1] = 0x0500_0000; // MI_BATCH_BUFFER_END
        self.map_ggtt(spec.context, 2 * PAGE_SIZE)?;
        self.write_ggtt_dwords(GgttOffset(ctx_addr + PAGE_SIZE), &image)?;
        let id = self.capture.submissions.len() as u64 + 1;
        let descriptor = (id << 32) | ctx_addr | DESCRIPTOR_FLAGS;
        let s = submission_from_image(&self.capture.memory, engine, descriptor)?;
        self.capture.submissions.push(s);
        Ok(s)
    }

    /// The finished capture.
    #[must_use]
    pub fn finish(self) -> AubCapture {
        self.capture
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(gen: Gen) -> AubCapture {
        let mut b = CaptureBuilder::new(gen, "gmig test");
        b.write_ggtt_dwords(GgttOffset(0x10_0000), &[0x0500_0000])
            .unwrap();
        b.write_ppgtt_dwords(0x7000_1000, &[0x1000_0000, 0x0500_0000])
            .unwrap();
        let ring = [0x1880_0101, 0x7000_1000, 0, 0];
        b.submit(
            Engine::Blitter,
            &RingSpec {
                ring: GgttOffset(0x20_0000),
                ring_size: 4096,
                commands: &ring,
                context: GgttOffset(0x30_0000),
            },
        )
        .unwrap();
        b.finish()
    }

    #[test]
    fn round_trip_every_generation() {
        for gen in [Gen::Gen8, Gen::Gen9, Gen::Gen11] {
            let c = sample(gen);
            let bytes = c.to_bytes().unwrap();
            let back = AubCapture::parse(&bytes).unwrap();
            assert_eq!(back, c);
            assert_eq!(back.to_bytes().unwrap(), bytes);
        }
    }

    #[test]
    fn submission_reads_ring_from_context_image() {
        let c = sample(Gen::Gen9);
        let back = AubCapture::parse(&c.to_bytes().unwrap()).unwrap();
        let s = back.submissions[0];
        assert_eq!(s.engine, Engine::Blitter);
        assert_eq!(s.lrca, GgttOffset(0x30_0000));
        assert_eq!(
            s.ring,
            RingState {
                start: GgttOffset(0x20_0000),
                size: 4096,
                head: 0,
                tail: 16
            }
        );
        let ring = back.memory.read_ggtt_dwords(s.ring.start, 4).unwrap();
        assert_eq!(ring, vec![0x1880_0101, 0x7000_1000, 0, 0]);
        let mut batch = [0u8; 8];
        back.memory
            .read_ppgtt(s.pml4, 0x7000_1000, &mut batch)
            .unwrap();
        assert_eq!(dwords_of(&batch), vec![0x1000_0000, 0x0500_0000]);
    }

    #[test]
    fn ggtt_write_goes_through_entries() {
        let mut w = AubWriter::new(Gen::Gen8, "x");
        w.memory_write(AubSpace::GgttEntry, 5 * 8, &(0x7000u64 | 1).to_le_bytes());
        w.memory_write(AubSpace::Ggtt, 5 * 4096 + 8, &[1, 2, 3, 4]);
        let c = AubCapture::parse(&w.finish()).unwrap();
        assert_eq!(c.gen, Some(Gen::Gen8));
        let mut out = [0u8; 4];
        c.memory.read_phys(0x7008, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3, 4]);
    }

    #[test]
    fn unmapped_ggtt_write_is_refused_with_offset() {
        let mut w = AubWriter::new(Gen::Gen9, "x");
        let off = w.clone().finish().len();
        w.memory_write(AubSpace::Ggtt, 0x5000, &[1, 2, 3, 4]);
        let err = AubCapture::parse(&w.finish()).unwrap_err();
        assert_eq!(
            err,
            AubError::Memory {
                offset: off,
                fault: MemFault::GgttUnmapped { addr: 0x5000 }
            }
        );
    }

    #[test]
    fn truncated_and_foreign_packets_are_refused() {
        let bytes = sample(Gen::Gen9).to_bytes().unwrap();
        let cut = bytes.len() - 4;
        assert!(matches!(
            AubCapture::parse(&bytes[..cut]),
            Err(AubError::Truncated { .. })
        ));
        assert!(matches!(
            AubCapture::parse(&bytes[..cut + 1]),
            Err(AubError::Truncated { .. })
        ));
        assert_eq!(
            AubCapture::parse(&[0, 0, 0, 0]),
            Err(AubError::NotAubPacket { offset: 0, dw0: 0 })
        );
        let legacy = (7u32 << 29 | 1 << 23 | 5 << 16).to_le_bytes();
        assert!(matches!(
            AubCapture::parse(&legacy),
            Err(AubError::LegacyPacket { offset: 0, .. })
        ));
    }

    #[test]
    fn harmless_packets_are_skipped_and_discontiguous_writes_refused() {
        let base = AubWriter::new(Gen::Gen9, "x").finish();
        let packet = |sub: u32| {
            let mut b = base.clone();
            b.extend_from_slice(&header(sub, 3).to_le_bytes());
            b.extend_from_slice(&[0x41; 8]);
            b
        };
        let bytes = packet(subop::COMMENT);
        let mut r = AubReader::new(&bytes);
        assert!(matches!(r.next_event(), Ok(Some(AubEvent::Version { .. }))));
        assert_eq!(
            r.next_event(),
            Ok(Some(AubEvent::Skipped {
                offset: base.len(),
                dw0: header(subop::COMMENT, 3)
            }))
        );
        assert_eq!(r.next_event(), Ok(None));
        assert_eq!(
            AubCapture::parse(&packet(0x0b)),
            Err(AubError::UnsupportedPacket {
                offset: base.len(),
                dw0: header(0x0b, 3)
            })
        );
    }

    #[test]
    fn page_limit_bounds_memory() {
        let mut w = AubWriter::new(Gen::Gen9, "x");
        for p in 0..10u64 {
            w.memory_write(AubSpace::Physical, p * 4096, &[1, 0, 0, 0]);
        }
        let bytes = w.finish();
        let limits = ReadLimits {
            max_pages: 4,
            ..ReadLimits::default()
        };
        let err = AubCapture::parse_with_limits(&bytes, limits).unwrap_err();
        assert!(matches!(
            err,
            AubError::Memory {
                fault: MemFault::PageLimit { limit: 4 },
                ..
            }
        ));
    }

    #[test]
    fn gen11_elsq_and_gen8_elsp_both_submit() {
        for gen in [Gen::Gen8, Gen::Gen11] {
            let c = sample(gen);
            let bytes = c.to_bytes().unwrap();
            let mut r = AubReader::new(&bytes);
            let mut submits = 0;
            while let Some(ev) = r.next_event().unwrap() {
                if let AubEvent::Submit { submission, .. } = ev {
                    assert_eq!(submission.engine, Engine::Blitter);
                    submits += 1;
                }
            }
            assert_eq!(submits, 1);
            // The execlist-port writes do not show up as plain registers.
            assert!(!r
                .capture()
                .registers
                .keys()
                .any(|&k| k == 0x2_2230 || k == 0x2_2550));
        }
    }

    /// A capture laid out the way Mesa's `intel_dump_gpu` lays one out: GGTT entries for ring,
    /// PPHWSP and context; PPGTT page tables and the batch written as physical memory; the ring
    /// holding a non-privileged MI_BATCH_BUFFER_START; ELSP writes and a status poll.
    #[test]
    fn mesa_style_capture_decodes() {
        let mut w = AubWriter::new(Gen::Gen9, "PCI-ID=0x1912 glxgears");
        let pte = |phys: u64| (phys | 1).to_le_bytes();
        // GGTT: entry 0 (dummy), then ring (1 page), PPHWSP and context (2 pages) at GGTT 0x1000...
        w.memory_write(AubSpace::GgttEntry, 0, &pte(0x1_0000));
        let mut entries = Vec::new();
        for i in 0..3u64 {
            entries.extend_from_slice(&pte(0x2_0000 + i * 0x1000));
        }
        w.memory_write(AubSpace::GgttEntry, 8, &entries);
        for e in [0x2000u32, 0x1_2000, 0x2_2000] {
            w.register_write(e + reg::GFX_MODE, 0x8000_8000);
        }
        // PPGTT: PML4 at phys 0, tables at 0x5000.., batch page at 0x8000, for VA 0x1_0000_0000.
        let va = 0x1_0000_0000u64;
        w.memory_write(
            AubSpace::Physical,
            ((va >> 39) & 0x1ff) * 8,
            &(0x5000u64 | 3).to_le_bytes(),
        );
        w.memory_write(
            AubSpace::Physical,
            0x5000 + ((va >> 30) & 0x1ff) * 8,
            &(0x6000u64 | 3).to_le_bytes(),
        );
        w.memory_write(
            AubSpace::Physical,
            0x6000 + ((va >> 21) & 0x1ff) * 8,
            &(0x7000u64 | 3).to_le_bytes(),
        );
        w.memory_write(
            AubSpace::Physical,
            0x7000 + ((va >> 12) & 0x1ff) * 8,
            &(0x8000u64 | 3).to_le_bytes(),
        );
        let batch = bytes_of(&[0x1000_0002, 0x20_0000, 0, 7, cmd::MI_BATCH_BUFFER_END]);
        w.memory_write(AubSpace::Physical, 0x8000, &batch);
        // Ring, PPHWSP and context through the GGTT.
        let (ring, lrca) = (0x1000u64, 0x2000u64);
        w.memory_write(AubSpace::Ggtt, ring, &[0; 4096]);
        let mut ctx_img = vec![0u32; 1024 + 64];
        ctx_img[1024 + 9] = ring as u32;
        ctx_img[1024 + 11] = 1;
        w.memory_write(AubSpace::Ggtt, lrca, &bytes_of(&ctx_img));
        w.memory_write(
            AubSpace::Ggtt,
            ring,
            &bytes_of(&[0x1880_0101, va as u32, (va >> 32) as u32, 0]),
        );
        w.memory_write(AubSpace::Ggtt, lrca + 4096 + 20, &0u32.to_le_bytes());
        w.memory_write(AubSpace::Ggtt, lrca + 4096 + 28, &16u32.to_le_bytes());
        w.register_write(0x2000 + reg::HWS_PGA, 0x4000);
        w.submit(Gen::Gen9, Engine::Render, lrca | DESCRIPTOR_FLAGS);
        let bytes = w.finish();

        let c = AubCapture::parse(&bytes).unwrap();
        assert_eq!(c.gen, Some(Gen::Gen9));
        assert_eq!(c.app_name, "PCI-ID=0x1912 glxgears");
        assert_eq!(c.submissions.len(), 1);
        let s = c.submissions[0];
        assert_eq!(
            s.ring,
            RingState {
                start: GgttOffset(ring),
                size: 4096,
                head: 0,
                tail: 16
            }
        );
        assert_eq!(s.pml4, 0);
        let items = listing::list_capture(&bytes, None, listing::LISTING_BUDGET);
        let names: Vec<&str> = items
            .iter()
            .filter_map(|i| match i {
                listing::ListingItem::Command(c) => Some(c.name),
                _ => None,
            })
            .collect();
        assert_eq!(
            names,
            [
                "MI_BATCH_BUFFER_START",
                "MI_STORE_DATA_IMM",
                "MI_BATCH_BUFFER_END",
                "MI_NOOP"
            ]
        );
        let text = listing::to_text(&items);
        assert!(
            text.contains("ppgtt 0x000100000000  batch1 +0x0000  MI_STORE_DATA_IMM"),
            "{text}"
        );
        // Our writer's canonical form of it reads back as the same capture.
        assert_eq!(AubCapture::parse(&c.to_bytes().unwrap()).unwrap(), c);
    }

    fn fixture_move() -> SliceMove {
        fixture::Manifest::parse(&fixture::specs()[0].manifest().to_text())
            .unwrap()
            .slice_move()
            .unwrap()
    }

    #[test]
    fn migrate_there_and_back_restores_every_fixture_byte_for_byte() {
        let mv = fixture_move();
        let mut n = 0;
        for spec in fixture::specs() {
            if spec.expect != fixture::Expect::Remap {
                continue;
            }
            let bytes = spec.capture().unwrap();
            let c = AubCapture::parse(&bytes).unwrap();
            let moved = c.migrate(&mv, fixture::REPLAY_BUDGET).unwrap();
            assert_ne!(moved.to_bytes().unwrap(), bytes, "{}", spec.name);
            let back = moved
                .migrate(&mv.inverse(), fixture::REPLAY_BUDGET)
                .unwrap();
            assert_eq!(back.to_bytes().unwrap(), bytes, "{}", spec.name);
            n += 1;
        }
        assert!(n >= 10);
    }

    #[test]
    fn migrate_moves_entries_rings_and_contexts_but_not_ppgtt() {
        let mv = fixture_move();
        let mut b = CaptureBuilder::new(Gen::Gen11, "m");
        b.write_ppgtt_dwords(0x7000_0000, &[cmd::MI_BATCH_BUFFER_END])
            .unwrap();
        let ring = cmd::bb_start(0x7000_0000, true, false);
        let spec = RingSpec {
            ring: GgttOffset(0x0400_0000),
            ring_size: 4096,
            commands: &ring,
            context: GgttOffset(0x4000_0000),
        };
        b.submit(Engine::Video, &spec).unwrap();
        let c = b.finish();
        let m = c.migrate(&mv, Budget::default()).unwrap();
        let (s0, s1) = (c.submissions[0], m.submissions[0]);
        assert_eq!(s1.lrca, GgttOffset(0x6000_0000));
        assert_eq!(s1.ring.start, GgttOffset(0x0800_0000));
        assert_eq!(
            s1.descriptor & !DESCRIPTOR_LRCA_MASK,
            s0.descriptor & !DESCRIPTOR_LRCA_MASK
        );
        assert_eq!(m.memory.ggtt_entry_count(), c.memory.ggtt_entry_count());
        assert_eq!(
            m.memory.ggtt_entry(0x0800_0000 / 4096),
            c.memory.ggtt_entry(0x0400_0000 / 4096)
        );
        assert_eq!(m.memory.ggtt_entry(0x0400_0000 / 4096), None);
        // The ring's BB_START names a PPGTT batch: same bytes before and after.
        assert_eq!(
            m.memory.read_ggtt_dwords(s1.ring.start, 3).unwrap(),
            c.memory.read_ggtt_dwords(s0.ring.start, 3).unwrap()
        );
        assert_eq!(s1.pml4, s0.pml4);
    }

    #[test]
    fn migrate_refuses_what_it_cannot_rebase_and_changes_nothing() {
        let mv = fixture_move();
        let mut b = CaptureBuilder::new(Gen::Gen8, "m");
        let ring = [cmd::MI_NOOP, cmd::MI_NOOP];
        // A context outside both slices.
        let spec = RingSpec {
            ring: GgttOffset(0x0400_0000),
            ring_size: 4096,
            commands: &ring,
            context: GgttOffset(0x10_0000),
        };
        b.submit(Engine::Render, &spec).unwrap();
        let c = b.finish();
        let before = c.clone();
        assert_eq!(
            c.migrate(&mv, Budget::default()),
            Err(AubError::NotInSlice {
                what: "context",
                addr: 0x10_0000
            })
        );
        assert_eq!(c, before);
        // A batch writing outside the slices: the walk's remap refuses.
        let mut b = CaptureBuilder::new(Gen::Gen8, "m");
        b.write_ggtt_dwords(
            GgttOffset(0x0401_0000),
            &cmd::store_data_imm(0x2000_0000, true, 1),
        )
        .unwrap();
        let ring = cmd::bb_start(0x0401_0000, false, false);
        let spec = RingSpec {
            ring: GgttOffset(0x0400_0000),
            ring_size: 4096,
            commands: &ring,
            context: GgttOffset(0x0400_1000),
        };
        b.submit(Engine::Render, &spec).unwrap();
        let c = b.finish();
        assert!(matches!(
            c.migrate(&mv, Budget::default()),
            Err(AubError::Walk { submission: 0, .. })
        ));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Ggtt(u64, Vec<u32>),
        Ppgtt(u64, Vec<u32>),
        Reg(u32, u32),
        Submit(u8, u64, Vec<u32>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..0x400, prop::collection::vec(any::<u32>(), 0..300))
                .prop_map(|(p, d)| Op::Ggtt(p * 256, d)),
            (0u64..(1 << 24), prop::collection::vec(any::<u32>(), 0..300))
                .prop_map(|(p, d)| Op::Ppgtt(p * 4096 + 0x40, d)),
            (0u32..0x2_0000, any::<u32>()).prop_map(|(r, v)| Op::Reg(r * 4 + 0x4_0000, v)),
            (
                0u8..4,
                0u64..0x100,
                prop::collection::vec(any::<u32>(), 0..64)
            )
                .prop_map(|(e, c, d)| Op::Submit(e, c, d)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
            let mut r = AubReader::new(&bytes);
            let mut n = 0;
            while let Ok(Some(_)) = r.next_event() {
                n += 1;
                prop_assert!(n <= bytes.len());
            }
            prop_assert_eq!(r.next_event(), Ok(None));
        }

        #[test]
        fn packet_shaped_garbage_never_panics(
            packets in prop::collection::vec(
                (0u32..0x12, prop::collection::vec(any::<u32>(), 0..12), any::<bool>()), 0..24)
        ) {
            let mut bytes = Vec::new();
            for (sub, body, honest) in packets {
                let len = if honest { body.len() as u32 } else { body.first().copied().unwrap_or(0) & 0xffff };
                bytes.extend_from_slice(&((7u32 << 29) | (0x2e << 23) | (sub << 16) | len).to_le_bytes());
                for d in body {
                    bytes.extend_from_slice(&d.to_le_bytes());
                }
            }
            let limits = ReadLimits { max_pages: 64, max_submissions: 8, max_registers: 8 };
            let _ = AubCapture::parse_with_limits(&bytes, limits);
        }

        #[test]
        fn mutated_captures_never_panic(
            which in 0usize..64,
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            let specs = fixture::specs();
            let spec = specs[which % specs.len()];
            let mut bytes = spec.capture().unwrap();
            for (at, x) in flips {
                let i = at.index(bytes.len());
                bytes[i] ^= x | 1;
            }
            let small = Budget { max_commands: 512, max_batch_bytes: 1 << 16, max_batches: 8 };
            let _ = listing::list_capture(&bytes, None, small);
            let limits = ReadLimits { max_pages: 256, max_submissions: 16, max_registers: 64 };
            if let Ok(c) = AubCapture::parse_with_limits(&bytes, limits) {
                let _ = c.migrate(&fixture_move(), small);
                let _ = c.to_bytes();
            }
        }

        #[test]
        fn migrate_round_trips_and_passes_destination_audit(
            gen_i in 0usize..3,
            cmds in prop::collection::vec((0u8..3, any::<bool>(), 0u64..0x10_0000), 1..16),
        ) {
            let gen = [Gen::Gen8, Gen::Gen9, Gen::Gen11][gen_i];
            let mv = fixture_move();
            let mut batch = Vec::new();
            for (kind, hidden, off) in cmds {
                let slice = if hidden { mv.from.hidden } else { mv.from.aperture };
                let addr = slice.base.0 + 0x10_0000 + off * 8;
                match kind {
                    0 => batch.extend(cmd::store_data_imm(addr, true, off as u32)),
                    1 => batch.extend(cmd::xy_color_blt(addr, 64, 16, 4, 0)),
                    _ => batch.extend(cmd::flush_dw_write(addr, true, off)),
                }
            }
            batch.push(cmd::MI_BATCH_BUFFER_END);
            let mut b = CaptureBuilder::new(gen, "prop");
            b.write_ggtt_dwords(GgttOffset(0x0401_0000), &batch).unwrap();
            let ring = cmd::bb_start(0x0401_0000, false, false);
            let spec = RingSpec { ring: GgttOffset(0x0400_0000), ring_size: 4096, commands: &ring, context: GgttOffset(0x0400_1000) };
            b.submit(Engine::Blitter, &spec).unwrap();
            let c = b.finish();
            let m = c.migrate(&mv, Budget::default()).unwrap();
            for s in &m.submissions {
                crate::audit_walk(gen, s.engine, &s.memory(&m.memory), s.ring_span(), Budget::default(), &mv.to).unwrap();
            }
            prop_assert_ne!(&m, &c);
            prop_assert_eq!(m.migrate(&mv.inverse(), Budget::default()).unwrap(), c);
        }

        #[test]
        fn write_read_round_trip(gen_i in 0usize..3, ops in prop::collection::vec(op(), 0..12)) {
            let gen = [Gen::Gen8, Gen::Gen9, Gen::Gen11][gen_i];
            let mut b = CaptureBuilder::new(gen, "proptest");
            let mut used = std::collections::BTreeSet::new();
            for op in ops {
                match op {
                    Op::Ggtt(a, d) => b.write_ggtt_dwords(GgttOffset(0x100_0000 + a), &d).unwrap(),
                    Op::Ppgtt(a, d) => b.write_ppgtt_dwords(a, &d).unwrap(),
                    Op::Reg(r, v) => b.set_register(r, v),
                    Op::Submit(e, c, d) => {
                        if !used.insert(c) {
                            continue;
                        }
                        let engine = [Engine::Render, Engine::Blitter, Engine::Video, Engine::VideoEnhance][usize::from(e)];
                        let spec = RingSpec {
                            ring: GgttOffset(0x800_0000 + c * 0x3000),
                            ring_size: 4096,
                            commands: &d,
                            context: GgttOffset(0x800_0000 + c * 0x3000 + 0x1000),
                        };
                        b.submit(engine, &spec).unwrap();
                    }
                }
            }
            let c = b.finish();
            let bytes = c.to_bytes().unwrap();
            let back = AubCapture::parse(&bytes).unwrap();
            prop_assert_eq!(&back, &c);
            prop_assert_eq!(back.to_bytes().unwrap(), bytes);
        }
    }
}
