//! # gmig-cmdparser
//!
//! Decoding, walking, auditing and remapping of Intel GEN8–GEN11 GPU command buffers — the
//! "dynamic graphics address remapping" half of gMig.
//!
//! **Owns:** the per-generation, per-engine command tables (opcodes, length rules, address fields);
//! a zero-copy, total decoder over little-endian dwords; the ring → first-level → second-level batch
//! walker with a work budget; the GGTT audit against a vGPU's aperture and hidden slices; in-place
//! remapping of GGTT addresses between two slice layouts; per-command write sets; and reading and
//! writing GEN8+ AUB captures.
//!
//! **Must not know about:** VFIO, page hashing, migration streams or transports. Memory is reached
//! only through a trait the caller implements (GGTT and PPGTT translation are the caller's).
//!
//! ## Map
//!
//! | module | what |
//! |---|---|
//! | [`addr`] | [`GgttOffset`], [`PpgttAddr`], [`AddressSpace`], a vGPU's [`VgpuSlices`], [`SliceMove`] |
//! | [`table`] | [`Gen`], [`Engine`], the [`CommandDesc`] schema, [`lookup`] (rows: [`all_commands`]) |
//! | [`decode`] | [`Decoder`] (zero-copy, lazy, total), [`Decoded`], [`AddressUse`], [`BatchContext`] |
//! | [`audit`](mod@audit) | [`audit`](audit()) one command, [`audit_buffer`]; [`regs`]: the register whitelist |
//! | [`remap`] | [`remap_in_place`] (all or nothing, round-trips) |
//! | [`writeset`] | [`Decoded::write_set`] → [`WriteSet`] (sound over-approximation), [`Reach`] |
//! | [`indirect`] | [`IndirectState`]: binding tables, surface states, depth/SO/video buffers → a work command's [`Footprint`] |
//! | [`isa`] | [`isa::scan_kernel`]: which binding-table entries an EU kernel's SENDs read and write |
//! | [`walk`](mod@walk) | ring → first → second-level batches: [`walk`](walk()), [`audit_walk`], [`remap_walk`] |
//! | [`memory`] | the caller's [`GpuMemory`]/[`GpuMemoryMut`], a sparse [`PageMemory`] |
//! | [`build`] | encoders for the commands the reference vGPU executes |
//!
//! ## Example
//!
//! ```
//! use gmig_cmdparser::{build, *};
//!
//! let slices = |ap, hi| VgpuSlices {
//!     aperture: Slice::new(GgttOffset(ap), 64 << 20).unwrap(),
//!     hidden: Slice::new(GgttOffset(hi), 384 << 20).unwrap(),
//! };
//! let mv = SliceMove::new(slices(0x0400_0000, 0x4000_0000), slices(0x1000_0000, 0x8000_0000))
//!     .unwrap();
//! let mut ring: Vec<u32> = [
//!     build::mi_store_data_imm(AddressSpace::Ggtt, 0x0400_1000, &[42]),
//!     build::mi_batch_buffer_start(AddressSpace::Ppgtt, 0x7000_0000, false),
//! ]
//! .concat();
//! for cmd in Decoder::new(Gen::Gen9, Engine::Render, &ring) {
//!     audit(&cmd.unwrap(), &BatchContext::RING, &mv.from).unwrap();
//! }
//! remap_in_place(Gen::Gen9, Engine::Render, &mut ring, &BatchContext::RING, &mv).unwrap();
//! assert_eq!(ring[1], 0x1000_1000); // GGTT rebased by the aperture delta
//! assert_eq!(ring[5], 0x7000_0000); // PPGTT untouched
//! ```
#![warn(missing_docs)]

pub mod addr;
pub mod aub;
pub mod audit;
pub mod build;
pub mod decode;
mod desc;
pub mod indirect;
pub mod isa;
pub mod memory;
pub mod regs;
pub mod remap;
mod rows;
pub mod table;
pub mod walk;
pub mod widen;
pub mod writeset;

pub use addr::{
    AddrError, AddressSpace, GgttOffset, PpgttAddr, Slice, SliceKind, SliceMove, VgpuSlices,
    GTT_PAGE_SIZE, MAX_SURFACE_BYTES,
};
pub use audit::{audit, audit_buffer, AuditError, AuditReport, BufferAuditError};
pub use decode::{
    decode_one, AddressIter, AddressUse, BatchContext, BatchLevel, DecodeError, Decoded, Decoder,
    IndexUse, INVALID_LEN,
};
pub use indirect::{Footprint, IndirectState, Stage, SurfaceRole, SurfaceUse};
pub use memory::{GpuMemory, GpuMemoryMut, MemoryError, PageMemory};
pub use regs::{register_allowed, RegAccess};
pub use remap::{remap_in_place, RemapError, RemapStats};
pub use table::{
    all_commands, by_name, lookup, Access, AddrField, Class, CommandDesc, Cond, Engine, Flags, Gen,
    Hook, IndexRule, LengthRule, SizeRule, SpaceRule, StatusPage, Width,
};
pub use walk::{
    audit_walk, remap_walk, walk, walk_batch, walk_looping, Budget, RingSpan, WalkError,
    WalkSummary, WalkedCommand,
};
pub use widen::{audit_widened, null_use, redirect_null_uses, CmdRegister, Widening};
pub use writeset::{AddressRange, Reach, WriteSet};
