//! AUB packet constants, register offsets, context layout and the GEN device identities.

use crate::{Engine, Gen};

/// Size of a GTT page and of a physical page in the memory image.
pub const PAGE_SIZE: u64 = 4096;
pub(crate) const PAGE: usize = 4096;

/// Number of entries of the GEN8+ global GTT (4 GiB of graphics memory, 8-byte entries).
pub const GGTT_ENTRIES: u64 = 1 << 20;
/// Highest physical or PPGTT address + 1 (48-bit addressing).
pub const ADDRESS_LIMIT: u64 = 1 << 48;
pub(crate) const ADDRESS_MASK: u64 = ADDRESS_LIMIT - 1;
/// Mask of the page address bits of a GGTT or PPGTT entry.
pub(crate) const PTE_ADDRESS_MASK: u64 = 0xffff_ffff_f000;
/// Present bit of a GGTT or PPGTT entry.
pub(crate) const PTE_PRESENT: u64 = 1;

pub(crate) const TYPE_AUB: u32 = 7;
pub(crate) const OPCODE_LEGACY: u32 = 0x01;
pub(crate) const OPCODE_MEM_TRACE: u32 = 0x2e;

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
pub(crate) const REGISTER_SIZE_DWORD: u32 = 2 << 16;

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
pub(crate) mod ctx {
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
pub(crate) const ENGINE_BASES: [(Engine, u32); 6] = [
    (Engine::Render, 0x2000),
    (Engine::Blitter, 0x2_2000),
    (Engine::Video, 0x1_2000),
    (Engine::Video, 0x1c_0000),
    (Engine::VideoEnhance, 0x1_a000),
    (Engine::VideoEnhance, 0x1c_8000),
];

pub(crate) fn engine_index(engine: Engine) -> usize {
    match engine {
        Engine::Render => 0,
        Engine::Blitter => 1,
        Engine::Video => 2,
        Engine::VideoEnhance => 3,
    }
}
