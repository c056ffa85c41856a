//! The register whitelist for MI_LOAD_REGISTER_IMM/MEM/REG and MI_STORE_REGISTER_MEM.
//!
//! The idea is i915's and GVT-g's: a guest's command buffers may touch only registers that are
//! part of its own context and harmless to the host — the engine's general-purpose and predicate
//! registers, statistics counters, stream-out state, a few cache-mode and MOCS registers — and may
//! read the engine's timestamps. Everything else (ring control, execlist ports, GGTT and fence
//! registers, display, interrupt, power and `FORCE_NONPRIV` registers …) is refused.

use crate::table::{Engine, Gen};

/// Whether a command reads or writes a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegAccess {
    /// MI_STORE_REGISTER_MEM, the source of MI_LOAD_REGISTER_REG.
    Read,
    /// MI_LOAD_REGISTER_IMM/MEM, the destination of MI_LOAD_REGISTER_REG.
    Write,
}

/// One whitelisted range of registers, relative to the engine's MMIO base or absolute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegRange {
    /// Name for documentation.
    pub name: &'static str,
    /// First byte offset.
    pub start: u32,
    /// One past the last byte offset.
    pub end: u32,
    /// Whether writes are allowed (reads always are).
    pub writable: bool,
}

const fn rr(name: &'static str, start: u32, end: u32, writable: bool) -> RegRange {
    RegRange {
        name,
        start,
        end,
        writable,
    }
}

/// Registers relative to each engine's MMIO base.
pub const PER_ENGINE: &[RegRange] = &[
    rr("RING_TIMESTAMP", 0x358, 0x360, false),
    rr("RING_CTX_TIMESTAMP", 0x3a8, 0x3ac, false),
    rr("CS_GPR[0..16]", 0x600, 0x680, true),
    rr("RING_PREDICATE_RESULT", 0x3b8, 0x3bc, true),
    rr("CSFE_CHICKEN1 (masked)", 0xd4, 0xd8, true),
];

/// Render-engine registers (absolute offsets).
pub const RENDER: &[RegRange] = &[
    rr("HS..PS_DEPTH statistics counters", 0x2300, 0x2358, true),
    rr("CS_INVOCATION_COUNT", 0x2290, 0x2298, true),
    rr("MI_PREDICATE_SRC0/SRC1/DATA/RESULT", 0x2400, 0x2420, true),
    // An indirect draw's parameters (Mesa loads them from the indirect buffer); they choose
    // which vertices are drawn, not what memory the draw reaches.
    rr(
        "3DPRIM_END_OFFSET..3DPRIM_BASE_VERTEX",
        0x2430,
        0x2448,
        true,
    ),
    rr("GPGPU_DISPATCHDIMX/Y/Z", 0x2500, 0x250c, true),
    rr("SO_NUM_PRIMS_WRITTEN[0..4]", 0x5200, 0x5220, true),
    rr("SO_PRIM_STORAGE_NEEDED[0..4]", 0x5240, 0x5260, true),
    rr("SO_WRITE_OFFSET[0..4]", 0x5280, 0x5290, true),
    rr("CACHE_MODE_0/1", 0x7000, 0x7008, true),
    rr("L3CNTLREG", 0x7034, 0x7038, true),
    // Masked workaround ("chicken") registers that GVT-g lets commands write and that Mesa and
    // i915 program from batches; they change how the GPU behaves, not what memory it reaches.
    rr("FF_SLICE_CS_CHICKEN1/2", 0x20e0, 0x20e8, true),
    rr("CS_DEBUG_MODE1", 0x20ec, 0x20f0, true),
    rr("FF slice chicken (0x2580)", 0x2580, 0x2584, true),
    rr("WM_CHICKEN3", 0x5588, 0x558c, true),
    rr("HDC_CHICKEN0/1", 0x7300, 0x7308, true),
    rr("L3SQCREG4", 0xb118, 0xb11c, true),
    rr("HALF_SLICE_CHICKEN2/3/5", 0xe180, 0xe18c, true),
    rr("HALF_SLICE_CHICKEN7", 0xe194, 0xe198, true),
    rr("ROW_CHICKEN/ROW_CHICKEN2", 0xe4f0, 0xe4f8, true),
    rr("L3 cache control (MOCS L3CC)", 0xb020, 0xb0a4, true),
    rr("MOCS tables", 0xc800, 0xcffc, true),
];

/// Blitter-engine registers (absolute offsets).
pub const BLITTER: &[RegRange] = &[rr("BCS_SWCTRL", 0x22200, 0x22204, true)];

/// MMIO bases of the engine instances an [`Engine`] stands for on `gen`.
pub fn engine_bases(gen: Gen, engine: Engine) -> &'static [u32] {
    match (gen, engine) {
        (_, Engine::Render) => &[0x2000],
        (_, Engine::Blitter) => &[0x22000],
        (Gen::Gen8 | Gen::Gen9, Engine::Video) => &[0x12000, 0x1c000],
        (Gen::Gen8 | Gen::Gen9, Engine::VideoEnhance) => &[0x1a000],
        (Gen::Gen11, Engine::Video) => &[0x1c_0000, 0x1c_4000, 0x1d_0000, 0x1d_4000],
        (Gen::Gen11, Engine::VideoEnhance) => &[0x1c_8000, 0x1d_8000],
    }
}

fn in_ranges(ranges: &[RegRange], reg: u32, access: RegAccess) -> bool {
    ranges
        .iter()
        .any(|r| reg >= r.start && reg < r.end && (r.writable || access == RegAccess::Read))
}

/// Whether a guest command may access register `reg` (byte offset) on `gen`/`engine`.
pub fn register_allowed(gen: Gen, engine: Engine, reg: u32, access: RegAccess) -> bool {
    if !reg.is_multiple_of(4) {
        return false;
    }
    let per_engine = engine_bases(gen, engine).iter().any(|&base| {
        reg.checked_sub(base)
            .is_some_and(|rel| in_ranges(PER_ENGINE, rel, access))
    });
    per_engine
        || match engine {
            Engine::Render => in_ranges(RENDER, reg, access),
            Engine::Blitter => in_ranges(BLITTER, reg, access),
            Engine::Video | Engine::VideoEnhance => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitelist_allows_context_registers_only() {
        let g = Gen::Gen9;
        assert!(register_allowed(
            g,
            Engine::Render,
            0x2600,
            RegAccess::Write
        ));
        assert!(register_allowed(g, Engine::Render, 0x2358, RegAccess::Read));
        assert!(!register_allowed(
            g,
            Engine::Render,
            0x2358,
            RegAccess::Write
        ));
        assert!(register_allowed(
            g,
            Engine::Blitter,
            0x22600,
            RegAccess::Write
        ));
        assert!(!register_allowed(
            g,
            Engine::Blitter,
            0x2600,
            RegAccess::Write
        ));
        // Ring control, ELSP, FORCE_NONPRIV, fences: refused.
        for reg in [0x2030, 0x2034, 0x2038, 0x203c, 0x2230, 0x24d0, 0x10_0000] {
            assert!(!register_allowed(g, Engine::Render, reg, RegAccess::Write));
        }
        assert!(!register_allowed(
            g,
            Engine::Render,
            0x2601,
            RegAccess::Write
        ));
        assert!(register_allowed(
            Gen::Gen11,
            Engine::Video,
            0x1c_0600,
            RegAccess::Write
        ));
        assert!(!register_allowed(
            Gen::Gen11,
            Engine::Video,
            0x1_2600,
            RegAccess::Write
        ));
    }
}
