//! The vGPU's MMIO layout: register offsets, the GVT-g PV info page (`vgt_if`), the GTT range.
//!
//! Offsets follow the GEN8/GEN9 register map as i915 and GVT-g use it. The BAR0 window is 16 MiB:
//! registers in the low 2 MiB, the GGTT entries (8 bytes each) from 8 MiB up.

use gmig_cmdparser::Gen;
use serde::{Deserialize, Serialize};

/// The PV info page (`struct vgt_if`) in MMIO space.
pub const VGT_PVINFO_PAGE: u32 = 0x78000;
/// Its size.
pub const VGT_PVINFO_SIZE: u32 = 0x1000;
/// `VGT_MAGIC`: "vGTvGTvG".
pub const VGT_MAGIC: u64 = 0x4776_5447_7654_4776;
/// `VGT_VERSION_MAJOR`.
pub const VGT_VERSION_MAJOR: u16 = 1;
/// `VGT_VERSION_MINOR`.
pub const VGT_VERSION_MINOR: u16 = 0;
/// `VGT_G2V_PPGTT_L4_PAGE_TABLE_CREATE`.
pub const VGT_G2V_PPGTT_L4_PAGE_TABLE_CREATE: u32 = 4;
/// `VGT_G2V_PPGTT_L4_PAGE_TABLE_DESTROY`.
pub const VGT_G2V_PPGTT_L4_PAGE_TABLE_DESTROY: u32 = 5;
/// `VGT_CAPS_FULL_PPGTT`.
pub const VGT_CAPS_FULL_PPGTT: u32 = 1 << 2;
/// `VGT_CAPS_HWSP_EMULATION`.
pub const VGT_CAPS_HWSP_EMULATION: u32 = 1 << 3;

/// Field offsets inside `struct vgt_if` (add [`VGT_PVINFO_PAGE`]).
pub mod pvinfo {
    /// `u64 magic`.
    pub const MAGIC: u32 = 0x00;
    /// `u16 version_major`.
    pub const VERSION_MAJOR: u32 = 0x08;
    /// `u16 version_minor`.
    pub const VERSION_MINOR: u32 = 0x0a;
    /// `u32 vgt_id`.
    pub const VGT_ID: u32 = 0x0c;
    /// `u32 vgt_caps`.
    pub const VGT_CAPS: u32 = 0x10;
    /// `avail_rs.mappable_gmadr.base`.
    pub const APERTURE_BASE: u32 = 0x40;
    /// `avail_rs.mappable_gmadr.size`.
    pub const APERTURE_SIZE: u32 = 0x44;
    /// `avail_rs.nonmappable_gmadr.base`.
    pub const HIDDEN_BASE: u32 = 0x48;
    /// `avail_rs.nonmappable_gmadr.size`.
    pub const HIDDEN_SIZE: u32 = 0x4c;
    /// `avail_rs.fence_num`.
    pub const FENCE_NUM: u32 = 0x50;
    /// `display_ready`.
    pub const DISPLAY_READY: u32 = 0x804;
    /// `g2v_notify`.
    pub const G2V_NOTIFY: u32 = 0x818;
    /// `pdp[0].lo`.
    pub const PDP0_LO: u32 = 0x838;
    /// `execlist_context_descriptor_lo`.
    pub const EXECLIST_DESC_LO: u32 = 0x858;
    /// `execlist_context_descriptor_hi`.
    pub const EXECLIST_DESC_HI: u32 = 0x85c;
}

/// Where the GGTT entries start in the MMIO BAR.
pub const GTT_MMIO_BASE: u32 = 0x80_0000;
/// End (exclusive) of the MMIO BAR: 16 MiB, so 1 Mi entries = a 4 GiB GGTT.
pub const MMIO_BAR_SIZE: u32 = 0x100_0000;
/// End (exclusive) of the register part.
pub const MMIO_REG_END: u32 = 0x20_0000;

/// GGTT page-table entry: present bit.
pub const GTT_PTE_PRESENT: u64 = 1;
/// GGTT/PPGTT page-table entry: address bits 47:12.
pub const PTE_ADDR_MASK: u64 = 0x0000_ffff_ffff_f000;

/// Fence registers (`FENCE_REG_GEN6_LO(i)` = base + 8 i, `_HI` = + 4).
pub const FENCE_REG_BASE: u32 = 0x10_0000;
/// Fence registers on the physical GPU.
pub const FENCE_COUNT: u32 = 32;

/// `GEN8_RING_FAULT_REG`: the vGPU reports refused or faulting work here.
pub const RING_FAULT_REG: u32 = 0x4094;
/// `ERROR_GEN6`.
pub const ERROR_GEN6: u32 = 0x40a0;
/// `GEN8_GT_IIR(0)`: render/blitter interrupt identity.
pub const GT_IIR0: u32 = 0x44308;
/// `GEN8_GT_IIR(1)`: video interrupt identity.
pub const GT_IIR1: u32 = 0x44318;
/// `GEN8_GT_IIR(3)`: video-enhancement interrupt identity.
pub const GT_IIR3: u32 = 0x44338;

/// Primary plane surface address (`DSPASURF` / `PLANE_SURF(pipe, 0)`) per pipe A, B, C.
pub const PLANE_SURF: [u32; 3] = [0x7019c, 0x7119c, 0x7219c];
/// Cursor base (`CURBASE`) per pipe.
pub const CUR_BASE: [u32; 3] = [0x70084, 0x71084, 0x72084];
/// Primary plane stride per pipe.
pub const PLANE_STRIDE: [u32; 3] = [0x70188, 0x71188, 0x72188];

/// Ring register offsets relative to an engine's base.
pub mod ring {
    /// `RING_TAIL`.
    pub const TAIL: u32 = 0x30;
    /// `RING_HEAD`.
    pub const HEAD: u32 = 0x34;
    /// `RING_START`.
    pub const START: u32 = 0x38;
    /// `RING_CTL`.
    pub const CTL: u32 = 0x3c;
    /// `RING_HWS_PGA`.
    pub const HWS_PGA: u32 = 0x80;
    /// `RING_ELSP`.
    pub const ELSP: u32 = 0x230;
    /// `RING_EXECLIST_STATUS_LO`.
    pub const EXECLIST_STATUS: u32 = 0x234;
    /// `RING_MI_MODE`-adjacent `RING_MODE_GEN7`.
    pub const MODE: u32 = 0x29c;
    /// `RING_CONTEXT_STATUS_BUF_LO(0)`: six (lo, hi) pairs.
    pub const CSB: u32 = 0x370;
    /// `RING_CONTEXT_STATUS_PTR`.
    pub const CSB_PTR: u32 = 0x3a0;
}

/// Context-status-buffer event: idle to active (`GEN8_CTX_STATUS_IDLE_ACTIVE`).
pub const CSB_IDLE_TO_ACTIVE: u32 = 1 << 0;
/// Context-status-buffer event: the running context was preempted by a new submission
/// (`GEN8_CTX_STATUS_PREEMPTED`).
pub const CSB_PREEMPTED: u32 = 1 << 1;
/// Context-status-buffer event: element switch (`GEN8_CTX_STATUS_ELEMENT_SWITCH`).
pub const CSB_ELEMENT_SWITCH: u32 = 1 << 2;
/// Context-status-buffer event: active to idle (`GEN8_CTX_STATUS_ACTIVE_IDLE`).
pub const CSB_ACTIVE_TO_IDLE: u32 = 1 << 3;
/// Context-status-buffer event: context complete (`GEN8_CTX_STATUS_COMPLETE`).
pub const CSB_CTX_COMPLETE: u32 = 1 << 4;
/// Context-status-buffer event: the preempting submission resubmitted the running context
/// (`GEN8_CTX_STATUS_LITE_RESTORE`).
pub const CSB_LITE_RESTORE: u32 = 1 << 15;
/// Number of CSB entries with registers (GEN8/GEN9; GEN11 has 12, in the status page only).
pub const CSB_ENTRIES: u32 = 6;
/// Dword index in the hardware status page where the CSB is mirrored (`I915_HWS_CSB_BUF0_INDEX`).
pub const HWS_CSB_INDEX: u32 = 0x10;

/// CSB entries on `gen`.
pub fn csb_entries(gen: Gen) -> u32 {
    match gen {
        Gen::Gen11 => 12,
        _ => CSB_ENTRIES,
    }
}

/// Dword index in the hardware status page of the CSB write pointer
/// (`INTEL_HWS_CSB_WRITE_INDEX`).
pub fn hws_csb_write_index(gen: Gen) -> u32 {
    match gen {
        Gen::Gen11 => 0x2f,
        _ => 0x1f,
    }
}

/// The four engines a vGPU exposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum EngineId {
    /// RCS.
    Render,
    /// BCS.
    Blitter,
    /// VCS.
    Video,
    /// VECS.
    VideoEnhance,
}

impl EngineId {
    /// Every engine.
    pub const ALL: [EngineId; 4] = [
        EngineId::Render,
        EngineId::Blitter,
        EngineId::Video,
        EngineId::VideoEnhance,
    ];

    /// Index 0..4.
    pub fn index(self) -> usize {
        match self {
            EngineId::Render => 0,
            EngineId::Blitter => 1,
            EngineId::Video => 2,
            EngineId::VideoEnhance => 3,
        }
    }

    /// MMIO base of the engine's ring registers on `gen` (GEN11 moved the video engines).
    pub fn mmio_base_for(self, gen: Gen) -> u32 {
        match (gen, self) {
            (Gen::Gen11, EngineId::Video) => 0x1c_0000,
            (Gen::Gen11, EngineId::VideoEnhance) => 0x1c_8000,
            _ => self.mmio_base(),
        }
    }

    /// The engine whose ring registers on `gen` contain `offset`, with the offset relative to its
    /// base.
    pub fn from_reg_for(gen: Gen, offset: u32) -> Option<(EngineId, u32)> {
        EngineId::ALL.into_iter().find_map(|e| {
            let rel = offset.checked_sub(e.mmio_base_for(gen))?;
            (rel < 0x800).then_some((e, rel))
        })
    }

    /// MMIO base of the engine's ring registers (GEN8/GEN9).
    pub fn mmio_base(self) -> u32 {
        match self {
            EngineId::Render => 0x2000,
            EngineId::Blitter => 0x22000,
            EngineId::Video => 0x12000,
            EngineId::VideoEnhance => 0x1a000,
        }
    }

    /// The engine whose ring registers contain `offset`, with the offset relative to its base.
    pub fn from_reg(offset: u32) -> Option<(EngineId, u32)> {
        EngineId::ALL.into_iter().find_map(|e| {
            let rel = offset.checked_sub(e.mmio_base())?;
            (rel < 0x800).then_some((e, rel))
        })
    }

    /// The interrupt identity register and the user-interrupt bit for this engine.
    pub fn user_interrupt(self) -> (u32, u32) {
        let (iir, shift) = self.irq_bank();
        (iir, 1 << shift)
    }

    /// The GT interrupt identity register (`GEN8_GT_IIR(n)`) of this engine and the shift of its
    /// bits in it.
    pub fn irq_bank(self) -> (u32, u32) {
        match self {
            EngineId::Render => (GT_IIR0, 0),
            EngineId::Blitter => (GT_IIR0, 16),
            EngineId::Video => (GT_IIR1, 0),
            EngineId::VideoEnhance => (GT_IIR3, 0),
        }
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            EngineId::Render => "rcs",
            EngineId::Blitter => "bcs",
            EngineId::Video => "vcs",
            EngineId::VideoEnhance => "vecs",
        }
    }
}

/// Logical-ring context image layout (GEN8 LRC): page 0 is the per-process HWSP, page 1 holds the
/// register state as `MI_LOAD_REGISTER_IMM` (offset, value) pairs. Indices are dwords into page 1
/// and name the *value* dword.
pub mod lrc {
    /// Byte offset of the register-state page from the LRCA.
    pub const STATE_OFFSET: u64 = 4096;
    /// Pages of a context image.
    pub const CONTEXT_PAGES: u64 = 2;
    /// `CTX_CONTEXT_CONTROL`.
    pub const CONTEXT_CONTROL: usize = 0x02 + 1;
    /// `CTX_RING_HEAD`.
    pub const RING_HEAD: usize = 0x04 + 1;
    /// `CTX_RING_TAIL`.
    pub const RING_TAIL: usize = 0x06 + 1;
    /// `CTX_RING_BUFFER_START`: a GGTT address.
    pub const RING_START: usize = 0x08 + 1;
    /// `CTX_RING_BUFFER_CONTROL`: `(pages - 1) << 12 | 1`.
    pub const RING_CTL: usize = 0x0a + 1;
    /// `CTX_BB_HEAD_U`.
    pub const BB_HEAD_U: usize = 0x0c + 1;
    /// `CTX_BB_HEAD_L`.
    pub const BB_HEAD_L: usize = 0x0e + 1;
    /// `CTX_TIMESTAMP`: the context's accumulated runtime in 12 MHz ticks (saved by the
    /// hardware when the context switches out; i915 reads it for busyness).
    pub const CTX_TIMESTAMP: usize = 0x22 + 1;
    /// `CTX_PDP0_UDW`: upper half of the PML4 address (4-level PPGTT).
    pub const PDP0_UDW: usize = 0x30 + 1;
    /// `CTX_PDP0_LDW`: lower half of the PML4 address.
    pub const PDP0_LDW: usize = 0x32 + 1;
    /// Dwords of register state the model reads and writes.
    pub const STATE_DWORDS: usize = 0x40;
}

/// Execlist context descriptor fields (the 64-bit value written to ELSP).
pub mod desc {
    /// Valid.
    pub const VALID: u64 = 1 << 0;
    /// Addressing mode shift (bits 4:3); 3 = legacy 64-bit (4-level PPGTT).
    pub const ADDRESSING_SHIFT: u32 = 3;
    /// Privileged context.
    pub const PRIVILEGE: u64 = 1 << 8;
    /// LRCA mask (bits 31:12).
    pub const LRCA_MASK: u64 = 0xffff_f000;
    /// Context ID shift (upper dword).
    pub const CTX_ID_SHIFT: u32 = 32;
}

/// The registers whose values are GGTT addresses the hardware dereferences (the vGPU keeps a
/// host-side shadow of each, rebased into the host slices). Returns the mask of address bits.
pub fn address_register(gen: Gen, fences: u32, offset: u32) -> Option<u32> {
    if PLANE_SURF.contains(&offset) || CUR_BASE.contains(&offset) {
        return Some(0xffff_f000);
    }
    if let Some((_, rel)) = EngineId::from_reg_for(gen, offset) {
        if rel == ring::HWS_PGA {
            return Some(0xffff_f000);
        }
    }
    let fence_end = FENCE_REG_BASE + 8 * fences.min(FENCE_COUNT);
    if (FENCE_REG_BASE..fence_end).contains(&offset) {
        return Some(0xffff_f000);
    }
    None
}
