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

mod capture;
pub mod cmd;
mod consts;
mod error;
pub mod fixture;
mod image;
pub mod listing;
mod model;
mod reader;
mod submission;
mod writer;

#[cfg(test)]
mod tests;

pub use consts::{
    device_id, gen_of_device, mmio_base, reg, subop, ADDRESS_LIMIT, DESCRIPTOR_FLAGS,
    DESCRIPTOR_LRCA_MASK, GGTT_ENTRIES, PAGE_SIZE,
};
pub use error::{AubError, AubSpace, MemFault, Result};
pub use image::{bytes_of, dwords_of, MemoryImage};
pub use model::{AubCapture, ReadLimits};
pub use reader::{AubEvent, AubReader};
pub use submission::{CaptureMemory, CaptureMemoryMut, RingState, Submission};
pub use writer::{AubWriter, CaptureBuilder, RingSpec};
