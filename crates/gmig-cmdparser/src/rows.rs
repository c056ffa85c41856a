//! The command tables: one row per command, GEN8, GEN9 and GEN11, all engines.
//!
//! Sources of the facts (no code carried over): Intel's PRMs as summarised by GVT-g's
//! `gvt/cmd_parser.c` command list (names, opcodes, engines, length masks, the commands a mediated
//! parser refuses) and Mesa's genxml descriptions (field positions, `type="address"` fields). The
//! `genxml` integration test checks these rows against `../shared/genxml/gen{8,9,11}.xml`.
//!
//! Conventions: `dword` positions count DW0 as 0; address fields name their lowest address bit;
//! length rules are `(DW0 & mask) + bias`.

use crate::desc::{
    Access, AddrField, Class, CommandDesc, Cond, Engines, Flags, Gens, Hook, IndexRule, LengthRule,
    SizeRule, SpaceRule, StatusPage, Width,
};

const fn v(bits: u8) -> LengthRule {
    LengthRule::Variable { bits, bias: 2 }
}
const F1: LengthRule = LengthRule::Fixed(1);

const fn row(name: &'static str, class: Class, opcode: u32, length: LengthRule) -> CommandDesc {
    let engines = match class {
        Class::Mi => Engines::ALL,
        Class::Blit => Engines::BCS,
        Class::Render3d => Engines::RCS,
        Class::Mfx => Engines::VCS,
        Class::Vebox => Engines::VECS,
    };
    CommandDesc {
        name,
        class,
        opcode,
        length,
        exact_len: None,
        engines,
        gens: Gens::ALL,
        flags: Flags::NONE,
        addrs: &[],
        hook: Hook::None,
    }
}

const fn mi(name: &'static str, op: u32, length: LengthRule) -> CommandDesc {
    row(name, Class::Mi, op, length)
}
const fn blt(name: &'static str, op: u32) -> CommandDesc {
    row(name, Class::Blit, 0x100 | op, v(8))
}
const fn r3(name: &'static str, st: u32, op: u32, sub: u32) -> CommandDesc {
    row(
        name,
        Class::Render3d,
        0x6000 | (st << 11) | (op << 8) | sub,
        v(8),
    )
}
const fn media(name: &'static str, op: u32, sub: u32) -> CommandDesc {
    row(
        name,
        Class::Render3d,
        0x6000 | (2 << 11) | (op << 8) | sub,
        v(16),
    )
    .flags(Flags::UNBOUNDED_WRITES)
}
const fn mfx(name: &'static str, p: u32, op: u32, a: u32, b: u32) -> CommandDesc {
    row(
        name,
        Class::Mfx,
        0x6000 | (p << 11) | (op << 8) | (a << 5) | b,
        v(12),
    )
    .flags(Flags::OPAQUE.with(Flags::UNBOUNDED_WRITES))
}
const fn veb(name: &'static str, p: u32, op: u32, a: u32, b: u32) -> CommandDesc {
    row(
        name,
        Class::Vebox,
        0x6000 | (p << 11) | (op << 8) | (a << 5) | b,
        v(12),
    )
    .flags(Flags::OPAQUE.with(Flags::UNBOUNDED_WRITES))
}

impl CommandDesc {
    const fn engines(mut self, e: Engines) -> Self {
        self.engines = e;
        self
    }
    const fn gens(mut self, g: Gens) -> Self {
        self.gens = g;
        self
    }
    const fn flags(mut self, f: Flags) -> Self {
        self.flags = self.flags.with(f);
        self
    }
    const fn exact(mut self, n: u8) -> Self {
        self.exact_len = Some(n);
        self
    }
    const fn addrs(mut self, a: &'static [AddrField]) -> Self {
        self.addrs = a;
        self
    }
    const fn hook(mut self, h: Hook) -> Self {
        self.hook = h;
        self
    }
}

const REFUSED: Flags = Flags::REFUSED;
const UNB: Flags = Flags::UNBOUNDED_WRITES;
const OPAQUE: Flags = Flags::OPAQUE.with(Flags::UNBOUNDED_WRITES);
const GGTT_DW0_22: SpaceRule = SpaceRule::GgttIfBit { dword: 0, bit: 22 };

const fn a(name: &'static str, dword: u8, lo: u8) -> AddrField {
    AddrField::new(name, dword, lo)
}
const fn a64(name: &'static str, dword: u8, lo: u8) -> AddrField {
    AddrField::new(name, dword, lo).width(Width::A64)
}
const fn a32(name: &'static str, dword: u8, lo: u8) -> AddrField {
    AddrField::new(name, dword, lo).width(Width::A32)
}
const fn nz(dword: u8, lo: u8, bits: u8) -> Cond {
    Cond::NonZero { dword, lo, bits }
}
const fn set(dword: u8, bit: u8) -> Cond {
    Cond::BitSet { dword, bit }
}
const fn clear(dword: u8, bit: u8) -> Cond {
    Cond::BitClear { dword, bit }
}
const fn field(dword: u8, lo: u8, bits: u8, scale: u32, add: u32) -> SizeRule {
    SizeRule::Field {
        dword,
        lo,
        bits,
        scale,
        add,
    }
}

// ---- address-field sets ----------------------------------------------------------------------

const SDI: &[AddrField] = &[a("address", 1, 2)
    .space(GGTT_DW0_22)
    .access(Access::Write)
    .size(SizeRule::TrailingDwords { first: 3 })];
const REG_MEM_STORE: &[AddrField] = &[a64("memory", 2, 2)
    .space(GGTT_DW0_22)
    .access(Access::Write)
    .size(SizeRule::Fixed(4))];
const REG_MEM_LOAD: &[AddrField] = &[a64("memory", 2, 2)
    .space(GGTT_DW0_22)
    .size(SizeRule::Fixed(4))];
// Post-sync writes: an address unless "store data index" (bit 21 of the dword holding the
// post-sync op) makes it an offset into the context's status page.
const FLUSH_DW: &[AddrField] = &[a("post_sync", 1, 3)
    .space(SpaceRule::GgttIfBit { dword: 1, bit: 2 })
    .access(Access::Write)
    .size(SizeRule::Fixed(8))
    .when(Cond::All(&[nz(0, 14, 2), clear(0, 21)]))];
const FLUSH_DW_INDEX: IndexRule = IndexRule {
    when: Cond::All(&[nz(0, 14, 2), set(0, 21)]),
    dword: 1,
    lo: 3,
    page: StatusPage::PerProcess,
    size: SizeRule::Fixed(8),
};
const PIPE_CONTROL: &[AddrField] = &[a("post_sync", 2, 2)
    .space(SpaceRule::GgttIfBit { dword: 1, bit: 24 })
    .access(Access::Write)
    .size(SizeRule::Fixed(8))
    .when(Cond::All(&[nz(1, 14, 2), clear(1, 21)]))];
const PIPE_CONTROL_INDEX: IndexRule = IndexRule {
    when: Cond::All(&[nz(1, 14, 2), set(1, 21)]),
    dword: 2,
    lo: 2,
    page: StatusPage::PerProcess,
    size: SizeRule::Fixed(8),
};
// MI_STORE_DATA_INDEX: DW1 the offset, DW2.. the data; DW0 bit 21 "use per-process HWS".
const SDI_INDEX: IndexRule = IndexRule {
    when: Cond::Always,
    dword: 1,
    lo: 2,
    page: StatusPage::PerProcessIfBit { dword: 0, bit: 21 },
    size: SizeRule::TrailingDwords { first: 2 },
};
const BB_START: &[AddrField] =
    &[a("batch", 1, 2).space(SpaceRule::PpgttIfBit { dword: 0, bit: 8 })];
const ATOMIC: &[AddrField] = &[a("memory", 1, 2)
    .space(GGTT_DW0_22)
    .access(Access::ReadWrite)
    .size(SizeRule::Fixed(16))];
const SEMA_WAIT: &[AddrField] = &[a("semaphore", 2, 2)
    .space(GGTT_DW0_22)
    .size(SizeRule::Fixed(4))];
const COND_BB_END: &[AddrField] = &[a("compare", 2, 3)
    .space(GGTT_DW0_22)
    .size(SizeRule::Fixed(8))];
const COPY_MEM_MEM: &[AddrField] = &[
    a64("dst", 1, 2)
        .space(GGTT_DW0_22)
        .access(Access::Write)
        .size(SizeRule::Fixed(4)),
    a64("src", 3, 2).space(GGTT_DW0_22).size(SizeRule::Fixed(4)),
];
const CLFLUSH: &[AddrField] = &[a("page", 1, 12).space(GGTT_DW0_22)];
const PERF_COUNT: &[AddrField] = &[a64("memory", 1, 6).space(GGTT_DW0_22).access(Access::Write)];
const RS_SDI: &[AddrField] = &[a64("address", 1, 2)
    .access(Access::Write)
    .size(SizeRule::Fixed(4))];
const URB_LOAD: &[AddrField] = &[a64("memory", 2, 6)];
const URB_STORE: &[AddrField] = &[a64("memory", 2, 6).access(Access::Write)];
const SET_CONTEXT: &[AddrField] =
    &[a32("context", 1, 12).space(SpaceRule::GgttIfBit { dword: 0, bit: 31 })];
const DISPLAY_FLIP: &[AddrField] =
    &[a32("display", 2, 12).space(SpaceRule::GgttIfBit { dword: 0, bit: 31 })];

// Blits (GEN8+ layouts, 48-bit addresses in two dwords).
const XY_DST: AddrField = a("dst", 4, 0).access(Access::Write).size(SizeRule::XyDst);
const XY_COLOR: &[AddrField] = &[XY_DST];
const XY_SRC_COPY: &[AddrField] = &[XY_DST, a("src", 8, 0).size(SizeRule::XySrc)];
const XY_SETUP: &[AddrField] = &[a("dst", 4, 0), a("pattern", 8, 0)];
const XY_PAT: &[AddrField] = &[XY_DST, a("pattern", 6, 0).size(SizeRule::Fixed(256))];
const XY_MONO_SRC: &[AddrField] = &[XY_DST, a("src", 6, 0)];
const XY_FAST_COPY: &[AddrField] = &[
    a("dst", 4, 0).access(Access::Write).size(SizeRule::FastDst),
    a("src", 8, 0).size(SizeRule::FastSrc),
];

// 3D state.
const SBA: &[AddrField] = &[
    a64("general_state", 1, 12)
        .when(nz(1, 0, 1))
        .size(field(12, 12, 20, 4096, 0)),
    a64("surface_state", 4, 12).when(nz(4, 0, 1)),
    a64("dynamic_state", 6, 12)
        .when(nz(6, 0, 1))
        .size(field(13, 12, 20, 4096, 0)),
    a64("indirect_object", 8, 12)
        .when(nz(8, 0, 1))
        .size(field(14, 12, 20, 4096, 0)),
    a64("instruction", 10, 12)
        .when(nz(10, 0, 1))
        .size(field(15, 12, 20, 4096, 0)),
    a64("bindless_surface_state", 16, 12)
        .when(nz(16, 0, 1))
        .size(field(18, 12, 20, 4096, 0)),
    a64("bindless_sampler_state", 19, 12)
        .when(nz(19, 0, 1))
        .size(field(21, 12, 20, 4096, 0)),
];
const DEPTH_LIKE: &[AddrField] = &[a64("surface", 2, 0)];
// The stencil buffer's address is in use only with Stencil Buffer Enable (DW1 bit 31).
const STENCIL: &[AddrField] = &[a64("surface", 2, 0).when(nz(1, 31, 1))];
const INDEX_BUFFER: &[AddrField] = &[a64("buffer", 2, 0).size(field(4, 0, 32, 1, 0))];
const VERTEX_BUFFERS: &[AddrField] = &[a64("buffer", 2, 0).size(field(4, 0, 32, 1, 0)).repeat(4)];
const CONSTANT_BODY: &[AddrField] = &[
    a64("buffer0", 3, 5).when(nz(1, 0, 16)),
    a64("buffer1", 5, 5).when(nz(1, 16, 16)),
    a64("buffer2", 7, 5).when(nz(2, 0, 16)),
    a64("buffer3", 9, 5).when(nz(2, 16, 16)),
];
const SO_BUFFER: &[AddrField] = &[
    a("surface", 2, 2)
        .access(Access::Write)
        .size(field(4, 0, 30, 4, 4))
        .when(nz(1, 31, 1)),
    a("offset", 5, 2)
        .access(Access::ReadWrite)
        .size(SizeRule::Fixed(4))
        .when(nz(1, 31, 1)),
];
const POOL_ALLOC: &[AddrField] = &[a64("pool", 1, 12).size(field(3, 12, 20, 4096, 0))];
const BASE_DW1_12: &[AddrField] = &[a64("base", 1, 12)];
const SWTESS: &[AddrField] = &[a("base", 1, 12)];
const PREFETCH: &[AddrField] = &[a32("pointer", 1, 6)];
const RS_CONSTANT: &[AddrField] = &[a64("constant", 2, 6)];

/// Every command row. Order matters only for duplicate keys (the first available row wins; the
/// tables test checks there are none).
pub(crate) static COMMANDS: &[CommandDesc] = &[
    // ---- MI (type 0), all engines --------------------------------------------------------------
    mi("MI_NOOP", 0x00, F1),
    mi("MI_SET_PREDICATE", 0x01, F1),
    mi("MI_USER_INTERRUPT", 0x02, F1),
    mi("MI_WAIT_FOR_EVENT", 0x03, F1).engines(Engines::RCS_BCS),
    mi("MI_FLUSH", 0x04, F1).gens(Gens::GEN8_9),
    mi("MI_WAIT_FOR_EVENT_2", 0x04, F1)
        .gens(Gens::GEN11)
        .engines(Engines::RCS_BCS),
    mi("MI_ARB_CHECK", 0x05, F1),
    mi("MI_RS_CONTROL", 0x06, F1).engines(Engines::RCS),
    mi("MI_REPORT_HEAD", 0x07, F1).flags(UNB),
    mi("MI_ARB_ON_OFF", 0x08, F1),
    mi("MI_URB_ATOMIC_ALLOC", 0x09, F1).engines(Engines::RCS),
    mi("MI_BATCH_BUFFER_END", 0x0a, F1).hook(Hook::BatchEnd),
    mi("MI_SUSPEND_FLUSH", 0x0b, F1),
    mi("MI_PREDICATE", 0x0c, F1),
    mi("MI_TOPOLOGY_FILTER", 0x0d, F1),
    mi("MI_SET_APPID", 0x0e, F1),
    mi("MI_RS_CONTEXT", 0x0f, F1).engines(Engines::RCS),
    mi("MI_LOAD_SCAN_LINES_INCL", 0x12, v(6))
        .exact(2)
        .engines(Engines::RCS_BCS),
    mi("MI_LOAD_SCAN_LINES_EXCL", 0x13, v(6))
        .exact(2)
        .engines(Engines::RCS_BCS),
    mi("MI_DISPLAY_FLIP", 0x14, v(8))
        .engines(Engines::RCS_BCS)
        .flags(REFUSED)
        .addrs(DISPLAY_FLIP),
    mi("MI_SEMAPHORE_MBOX", 0x16, v(8)).exact(3),
    mi("MI_SET_CONTEXT", 0x18, v(8))
        .flags(REFUSED.with(UNB))
        .addrs(SET_CONTEXT),
    mi("MI_URB_CLEAR", 0x19, v(8))
        .exact(2)
        .engines(Engines::RCS),
    mi("MI_MATH", 0x1a, v(6)).gens(Gens(1)),
    mi("MI_MATH", 0x1a, v(8)).gens(Gens::GEN9_PLUS),
    mi("MI_SEMAPHORE_SIGNAL", 0x1b, v(8)).exact(2),
    mi("MI_SEMAPHORE_WAIT", 0x1c, v(8))
        .exact(4)
        .addrs(SEMA_WAIT),
    mi("MI_FORCE_WAKEUP", 0x1d, v(8))
        .exact(2)
        .gens(Gens::GEN9_PLUS),
    mi("MI_STORE_DATA_IMM", 0x20, v(10)).addrs(SDI),
    mi("MI_STORE_DATA_INDEX", 0x21, v(8)).hook(Hook::StatusIndex(&SDI_INDEX)),
    mi("MI_LOAD_REGISTER_IMM", 0x22, v(8)).hook(Hook::LoadRegImm),
    mi("MI_UPDATE_GTT", 0x23, v(10)).flags(REFUSED.with(UNB)),
    mi("MI_STORE_REGISTER_MEM", 0x24, v(8))
        .exact(4)
        .addrs(REG_MEM_STORE)
        .hook(Hook::StoreRegMem),
    mi("MI_FLUSH_DW", 0x26, v(6))
        .addrs(FLUSH_DW)
        .hook(Hook::StatusIndex(&FLUSH_DW_INDEX)),
    mi("MI_CLFLUSH", 0x27, v(10)).flags(REFUSED).addrs(CLFLUSH),
    mi("MI_REPORT_PERF_COUNT", 0x28, v(6))
        .exact(4)
        .flags(REFUSED.with(UNB))
        .addrs(PERF_COUNT),
    mi("MI_LOAD_REGISTER_MEM", 0x29, v(8))
        .exact(4)
        .addrs(REG_MEM_LOAD)
        .hook(Hook::LoadRegMem),
    mi("MI_LOAD_REGISTER_REG", 0x2a, v(8))
        .exact(3)
        .hook(Hook::LoadRegReg),
    mi("MI_RS_STORE_DATA_IMM", 0x2b, v(8))
        .exact(4)
        .engines(Engines::RCS)
        .addrs(RS_SDI),
    mi("MI_LOAD_URB_MEM", 0x2c, v(8))
        .exact(4)
        .engines(Engines::RCS)
        .addrs(URB_LOAD),
    mi("MI_STORE_URB_MEM", 0x2d, v(8))
        .engines(Engines::RCS)
        .addrs(URB_STORE),
    mi("MI_COPY_MEM_MEM", 0x2e, v(8))
        .exact(5)
        .flags(REFUSED)
        .addrs(COPY_MEM_MEM),
    mi("MI_ATOMIC", 0x2f, v(8)).addrs(ATOMIC),
    mi("MI_BATCH_BUFFER_START", 0x31, v(8))
        .exact(3)
        .addrs(BB_START)
        .hook(Hook::BatchStart),
    mi("MI_CONDITIONAL_BATCH_BUFFER_END", 0x36, v(8)).addrs(COND_BB_END),
    // ---- 2D (type 2), blitter ------------------------------------------------------------------
    blt("XY_SETUP_BLT", 0x01).addrs(XY_SETUP),
    blt("XY_SETUP_CLIP_BLT", 0x03),
    blt("XY_SETUP_MONO_PATTERN_SL_BLT", 0x11).flags(OPAQUE),
    blt("XY_PIXEL_BLT", 0x24).flags(UNB),
    blt("XY_SCANLINES_BLT", 0x25).flags(UNB),
    blt("XY_TEXT_BLT", 0x26).flags(OPAQUE),
    blt("XY_TEXT_IMMEDIATE_BLT", 0x31).flags(UNB),
    blt("XY_FAST_COPY_BLT", 0x42)
        .gens(Gens::GEN9_PLUS)
        .addrs(XY_FAST_COPY),
    blt("XY_COLOR_BLT", 0x50).addrs(XY_COLOR),
    blt("XY_PAT_BLT", 0x51).addrs(XY_PAT),
    blt("XY_MONO_PAT_BLT", 0x52).addrs(XY_COLOR),
    blt("XY_SRC_COPY_BLT", 0x53).addrs(XY_SRC_COPY),
    blt("XY_MONO_SRC_COPY_BLT", 0x54).addrs(XY_MONO_SRC),
    blt("XY_FULL_BLT", 0x55).flags(OPAQUE),
    blt("XY_FULL_MONO_SRC_BLT", 0x56).flags(OPAQUE),
    blt("XY_FULL_MONO_PATTERN_BLT", 0x57).flags(OPAQUE),
    blt("XY_FULL_MONO_PATTERN_MONO_SRC_BLT", 0x58).flags(OPAQUE),
    blt("XY_MONO_PAT_FIXED_BLT", 0x59).addrs(XY_COLOR),
    blt("XY_MONO_SRC_COPY_IMMEDIATE_BLT", 0x71).addrs(XY_COLOR),
    blt("XY_PAT_BLT_IMMEDIATE", 0x72).addrs(XY_COLOR),
    blt("XY_SRC_COPY_CHROMA_BLT", 0x73).flags(OPAQUE),
    blt("XY_FULL_IMMEDIATE_PATTERN_BLT", 0x74).flags(OPAQUE),
    blt("XY_FULL_MONO_SRC_IMMEDIATE_PATTERN_BLT", 0x75).flags(OPAQUE),
    blt("XY_PAT_CHROMA_BLT", 0x76).flags(OPAQUE),
    blt("XY_PAT_CHROMA_BLT_IMMEDIATE", 0x77).flags(OPAQUE),
    // ---- 3D / media / GPGPU (type 3), render ---------------------------------------------------
    r3("STATE_PREFETCH", 0, 0, 0x03)
        .gens(Gens::GEN8_9)
        .addrs(PREFETCH),
    r3("STATE_BASE_ADDRESS", 0, 1, 0x01).addrs(SBA),
    r3("STATE_SIP", 0, 1, 0x02),
    r3("SWTESS_BASE_ADDRESS", 0, 1, 0x03)
        .gens(Gens(1))
        .addrs(SWTESS),
    r3("GPGPU_CSR_BASE_ADDRESS", 0, 1, 0x04)
        .gens(Gens::GEN8_9)
        .addrs(BASE_DW1_12),
    r3("3DSTATE_VF_STATISTICS", 1, 0, 0x0b).length_fixed1(),
    r3("PIPELINE_SELECT", 1, 1, 0x04).length_fixed1(),
    media("MEDIA_VFE_STATE", 0, 0x00),
    media("MEDIA_CURBE_LOAD", 0, 0x01),
    media("MEDIA_INTERFACE_DESCRIPTOR_LOAD", 0, 0x02),
    media("MEDIA_GATEWAY_STATE", 0, 0x03),
    media("MEDIA_STATE_FLUSH", 0, 0x04),
    media("MEDIA_POOL_STATE", 0, 0x05),
    media("MEDIA_OBJECT", 1, 0x00),
    media("MEDIA_OBJECT_PRT", 1, 0x02),
    media("MEDIA_OBJECT_WALKER", 1, 0x03),
    r3("GPGPU_WALKER", 2, 1, 0x05).flags(UNB),
    media("MEDIA_OBJECT_GRPID", 1, 0x06),
    r3("3DSTATE_CLEAR_PARAMS", 3, 0, 0x04),
    r3("3DSTATE_DEPTH_BUFFER", 3, 0, 0x05).addrs(DEPTH_LIKE),
    r3("3DSTATE_STENCIL_BUFFER", 3, 0, 0x06).addrs(STENCIL),
    r3("3DSTATE_HIER_DEPTH_BUFFER", 3, 0, 0x07).addrs(DEPTH_LIKE),
    r3("3DSTATE_VERTEX_BUFFERS", 3, 0, 0x08).addrs(VERTEX_BUFFERS),
    r3("3DSTATE_VERTEX_ELEMENTS", 3, 0, 0x09),
    r3("3DSTATE_INDEX_BUFFER", 3, 0, 0x0a).addrs(INDEX_BUFFER),
    r3("3DSTATE_VF_STATISTICS_LEGACY", 3, 0, 0x0b).length_fixed1(),
    r3("3DSTATE_VF", 3, 0, 0x0c),
    r3("3DSTATE_MULTISAMPLE", 3, 0, 0x0d),
    r3("3DSTATE_CC_STATE_POINTERS", 3, 0, 0x0e),
    r3("3DSTATE_SCISSOR_STATE_POINTERS", 3, 0, 0x0f),
    r3("3DSTATE_VS", 3, 0, 0x10),
    r3("3DSTATE_GS", 3, 0, 0x11),
    r3("3DSTATE_CLIP", 3, 0, 0x12),
    r3("3DSTATE_SF", 3, 0, 0x13),
    r3("3DSTATE_WM", 3, 0, 0x14),
    r3("3DSTATE_CONSTANT_VS", 3, 0, 0x15).addrs(CONSTANT_BODY),
    r3("3DSTATE_CONSTANT_GS", 3, 0, 0x16).addrs(CONSTANT_BODY),
    r3("3DSTATE_CONSTANT_PS", 3, 0, 0x17).addrs(CONSTANT_BODY),
    r3("3DSTATE_SAMPLE_MASK", 3, 0, 0x18),
    r3("3DSTATE_CONSTANT_HS", 3, 0, 0x19).addrs(CONSTANT_BODY),
    r3("3DSTATE_CONSTANT_DS", 3, 0, 0x1a).addrs(CONSTANT_BODY),
    r3("3DSTATE_HS", 3, 0, 0x1b),
    r3("3DSTATE_TE", 3, 0, 0x1c),
    r3("3DSTATE_DS", 3, 0, 0x1d),
    r3("3DSTATE_STREAMOUT", 3, 0, 0x1e),
    r3("3DSTATE_SBE", 3, 0, 0x1f),
    r3("3DSTATE_PS", 3, 0, 0x20),
    r3("3DSTATE_VIEWPORT_STATE_POINTERS_SF_CLIP", 3, 0, 0x21),
    r3("3DSTATE_CPS", 3, 0, 0x22).gens(Gens::GEN11),
    r3("3DSTATE_VIEWPORT_STATE_POINTERS_CC", 3, 0, 0x23),
    r3("3DSTATE_BLEND_STATE_POINTERS", 3, 0, 0x24),
    r3("3DSTATE_DEPTH_STENCIL_STATE_POINTERS", 3, 0, 0x25),
    r3("3DSTATE_BINDING_TABLE_POINTERS_VS", 3, 0, 0x26),
    r3("3DSTATE_BINDING_TABLE_POINTERS_HS", 3, 0, 0x27),
    r3("3DSTATE_BINDING_TABLE_POINTERS_DS", 3, 0, 0x28),
    r3("3DSTATE_BINDING_TABLE_POINTERS_GS", 3, 0, 0x29),
    r3("3DSTATE_BINDING_TABLE_POINTERS_PS", 3, 0, 0x2a),
    r3("3DSTATE_SAMPLER_STATE_POINTERS_VS", 3, 0, 0x2b),
    r3("3DSTATE_SAMPLER_STATE_POINTERS_HS", 3, 0, 0x2c),
    r3("3DSTATE_SAMPLER_STATE_POINTERS_DS", 3, 0, 0x2d),
    r3("3DSTATE_SAMPLER_STATE_POINTERS_GS", 3, 0, 0x2e),
    r3("3DSTATE_SAMPLER_STATE_POINTERS_PS", 3, 0, 0x2f),
    r3("3DSTATE_URB_VS", 3, 0, 0x30),
    r3("3DSTATE_URB_HS", 3, 0, 0x31),
    r3("3DSTATE_URB_DS", 3, 0, 0x32),
    r3("3DSTATE_URB_GS", 3, 0, 0x33),
    r3("3DSTATE_GATHER_CONSTANT_VS", 3, 0, 0x34),
    r3("3DSTATE_GATHER_CONSTANT_GS", 3, 0, 0x35),
    r3("3DSTATE_GATHER_CONSTANT_HS", 3, 0, 0x36),
    r3("3DSTATE_GATHER_CONSTANT_DS", 3, 0, 0x37),
    r3("3DSTATE_GATHER_CONSTANT_PS", 3, 0, 0x38),
    r3("3DSTATE_DX9_CONSTANTF_VS", 3, 0, 0x39).len_bits(11),
    r3("3DSTATE_DX9_CONSTANTF_PS", 3, 0, 0x3a).len_bits(11),
    r3("3DSTATE_DX9_CONSTANTI_VS", 3, 0, 0x3b),
    r3("3DSTATE_DX9_CONSTANTI_PS", 3, 0, 0x3c),
    r3("3DSTATE_DX9_CONSTANTB_VS", 3, 0, 0x3d),
    r3("3DSTATE_DX9_CONSTANTB_PS", 3, 0, 0x3e),
    r3("3DSTATE_DX9_LOCAL_VALID_VS", 3, 0, 0x3f),
    r3("3DSTATE_DX9_LOCAL_VALID_PS", 3, 0, 0x40),
    r3("3DSTATE_DX9_GENERATE_ACTIVE_VS", 3, 0, 0x41),
    r3("3DSTATE_DX9_GENERATE_ACTIVE_PS", 3, 0, 0x42),
    r3("3DSTATE_BINDING_TABLE_EDIT_VS", 3, 0, 0x43).len_bits(9),
    r3("3DSTATE_BINDING_TABLE_EDIT_GS", 3, 0, 0x44).len_bits(9),
    r3("3DSTATE_BINDING_TABLE_EDIT_HS", 3, 0, 0x45).len_bits(9),
    r3("3DSTATE_BINDING_TABLE_EDIT_DS", 3, 0, 0x46).len_bits(9),
    r3("3DSTATE_BINDING_TABLE_EDIT_PS", 3, 0, 0x47).len_bits(9),
    r3("3DSTATE_VF_INSTANCING", 3, 0, 0x49),
    r3("3DSTATE_VF_SGVS", 3, 0, 0x4a),
    r3("3DSTATE_VF_TOPOLOGY", 3, 0, 0x4b),
    r3("3DSTATE_WM_CHROMAKEY", 3, 0, 0x4c),
    r3("3DSTATE_PS_BLEND", 3, 0, 0x4d),
    r3("3DSTATE_WM_DEPTH_STENCIL", 3, 0, 0x4e),
    r3("3DSTATE_PS_EXTRA", 3, 0, 0x4f),
    r3("3DSTATE_RASTER", 3, 0, 0x50),
    r3("3DSTATE_SBE_SWIZ", 3, 0, 0x51),
    r3("3DSTATE_WM_HZ_OP", 3, 0, 0x52).flags(UNB),
    r3("3DSTATE_RS_CONSTANT_POINTER", 3, 0, 0x54)
        .gens(Gens::GEN9_PLUS)
        .addrs(RS_CONSTANT),
    r3("3DSTATE_VF_COMPONENT_PACKING", 3, 0, 0x55).gens(Gens::GEN9_PLUS),
    r3("3DSTATE_VF_SGVS_2", 3, 0, 0x56).gens(Gens::GEN11),
    r3("3DSTATE_DRAWING_RECTANGLE", 3, 1, 0x00),
    r3("3DSTATE_SAMPLER_PALETTE_LOAD0", 3, 1, 0x02),
    r3("3DSTATE_CHROMA_KEY", 3, 1, 0x04),
    r3("3DSTATE_POLY_STIPPLE_OFFSET", 3, 1, 0x06),
    r3("3DSTATE_POLY_STIPPLE_PATTERN", 3, 1, 0x07),
    r3("3DSTATE_LINE_STIPPLE", 3, 1, 0x08),
    r3("3DSTATE_AA_LINE_PARAMETERS", 3, 1, 0x0a),
    r3("3DSTATE_GS_SVB_INDEX", 3, 1, 0x0b),
    r3("3DSTATE_SAMPLER_PALETTE_LOAD1", 3, 1, 0x0c),
    r3("3DSTATE_MONOFILTER_SIZE", 3, 1, 0x11),
    r3("3DSTATE_PUSH_CONSTANT_ALLOC_VS", 3, 1, 0x12),
    r3("3DSTATE_PUSH_CONSTANT_ALLOC_HS", 3, 1, 0x13),
    r3("3DSTATE_PUSH_CONSTANT_ALLOC_DS", 3, 1, 0x14),
    r3("3DSTATE_PUSH_CONSTANT_ALLOC_GS", 3, 1, 0x15),
    r3("3DSTATE_PUSH_CONSTANT_ALLOC_PS", 3, 1, 0x16),
    r3("3DSTATE_SO_DECL_LIST", 3, 1, 0x17).len_bits(9),
    r3("3DSTATE_SO_BUFFER", 3, 1, 0x18).addrs(SO_BUFFER),
    r3("3DSTATE_BINDING_TABLE_POOL_ALLOC", 3, 1, 0x19).addrs(POOL_ALLOC),
    r3("3DSTATE_GATHER_POOL_ALLOC", 3, 1, 0x1a).addrs(POOL_ALLOC),
    r3("3DSTATE_DX9_CONSTANT_BUFFER_POOL_ALLOC", 3, 1, 0x1b).addrs(POOL_ALLOC),
    r3("3DSTATE_SAMPLE_PATTERN", 3, 1, 0x1c),
    r3("3DSTATE_URB_CLEAR", 3, 1, 0x1d).gens(Gens::GEN9_PLUS),
    r3("3DSTATE_3D_MODE", 3, 1, 0x1e).gens(Gens::GEN11),
    r3("3DSTATE_SLICE_TABLE_STATE_POINTERS", 3, 1, 0x20).gens(Gens::GEN11),
    r3("PIPE_CONTROL", 3, 2, 0x00)
        .addrs(PIPE_CONTROL)
        .hook(Hook::StatusIndex(&PIPE_CONTROL_INDEX)),
    r3("3DPRIMITIVE", 3, 3, 0x00).flags(UNB),
    // ---- MFX (type 3), video: address layouts not modelled -------------------------------------
    mfx("MFX_WAIT", 1, 0, 0, 0).len_bits(6),
    mfx("MFX_PIPE_MODE_SELECT", 2, 0, 0, 0),
    mfx("MFX_SURFACE_STATE", 2, 0, 0, 1),
    mfx("MFX_PIPE_BUF_ADDR_STATE", 2, 0, 0, 2),
    mfx("MFX_IND_OBJ_BASE_ADDR_STATE", 2, 0, 0, 3),
    mfx("MFX_BSP_BUF_BASE_ADDR_STATE", 2, 0, 0, 4),
    mfx("MFX_2_0_0_5", 2, 0, 0, 5),
    mfx("MFX_STATE_POINTER", 2, 0, 0, 6),
    mfx("MFX_QM_STATE", 2, 0, 0, 7),
    mfx("MFX_FQM_STATE", 2, 0, 0, 8),
    mfx("MFX_DBK_OBJECT", 2, 0, 0, 9),
    mfx("MFD_IT_OBJECT", 2, 0, 1, 9),
    mfx("MFX_PAK_INSERT_OBJECT", 2, 0, 2, 8),
    mfx("MFX_STITCH_OBJECT", 2, 0, 2, 10),
    mfx("MFX_AVC_IMG_STATE", 2, 1, 0, 0),
    mfx("MFX_AVC_QM_STATE", 2, 1, 0, 1),
    mfx("MFX_AVC_DIRECTMODE_STATE", 2, 1, 0, 2),
    mfx("MFX_AVC_SLICE_STATE", 2, 1, 0, 3),
    mfx("MFX_AVC_REF_IDX_STATE", 2, 1, 0, 4),
    mfx("MFX_AVC_WEIGHTOFFSET_STATE", 2, 1, 0, 5),
    mfx("MFD_AVC_PICID_STATE", 2, 1, 1, 5),
    mfx("MFD_AVC_DPB_STATE", 2, 1, 1, 6),
    mfx("MFD_AVC_SLICEADDR", 2, 1, 1, 7),
    mfx("MFD_AVC_BSD_OBJECT", 2, 1, 1, 8),
    mfx("MFC_AVC_PAK_OBJECT", 2, 1, 2, 9),
    mfx("MFX_VC1_PRED_PIPE_STATE", 2, 2, 0, 1),
    mfx("MFX_VC1_DIRECTMODE_STATE", 2, 2, 0, 2),
    mfx("MFD_VC1_SHORT_PIC_STATE", 2, 2, 1, 0),
    mfx("MFD_VC1_LONG_PIC_STATE", 2, 2, 1, 1),
    mfx("MFD_VC1_BSD_OBJECT", 2, 2, 1, 8),
    mfx("MFX_MPEG2_PIC_STATE", 2, 3, 0, 0),
    mfx("MFX_MPEG2_QM_STATE", 2, 3, 0, 1),
    mfx("MFD_MPEG2_BSD_OBJECT", 2, 3, 1, 8),
    mfx("MFC_MPEG2_SLICEGROUP_STATE", 2, 3, 2, 3),
    mfx("MFC_MPEG2_PAK_OBJECT", 2, 3, 2, 9),
    mfx("MFX_VP8_PIC_STATE", 2, 4, 0, 0),
    mfx("MFD_VP8_BSD_OBJECT", 2, 4, 1, 8),
    mfx("MFX_VP8_ENCODER_CFG", 2, 4, 2, 1).gens(Gens::GEN9_PLUS),
    mfx("MFX_VP8_BSP_BUF_BASE_ADDR_STATE", 2, 4, 2, 3).gens(Gens::GEN9_PLUS),
    mfx("MFX_VP8_PAK_OBJECT", 2, 4, 2, 9),
    mfx("MFX_2_6_0_0", 2, 6, 0, 0).len_bits(16),
    mfx("MFX_2_6_0_8", 2, 6, 0, 8).len_bits(16),
    mfx("MFX_2_6_0_9", 2, 6, 0, 9).len_bits(16),
    mfx("MFX_JPEG_PIC_STATE", 2, 7, 0, 0),
    mfx("MFX_JPEG_HUFF_TABLE_STATE", 2, 7, 0, 2),
    mfx("MFD_JPEG_BSD_OBJECT", 2, 7, 1, 8),
    mfx("MFC_JPEG_HUFF_TABLE_STATE", 2, 7, 2, 3).gens(Gens::GEN9_PLUS),
    mfx("MFC_JPEG_SCAN_OBJECT", 2, 7, 2, 9).gens(Gens::GEN9_PLUS),
    // GEN9+ HEVC (HCP), HuC, VDEnc and scaler (SFC) commands.
    mfx("VDENC_PIPE_MODE_SELECT", 2, 0, 4, 0).gens(Gens::GEN9_PLUS),
    mfx("VDENC_SRC_SURFACE_STATE", 2, 0, 4, 1).gens(Gens::GEN9_PLUS),
    mfx("VDENC_REF_SURFACE_STATE", 2, 0, 4, 2).gens(Gens::GEN9_PLUS),
    mfx("VDENC_DS_REF_SURFACE_STATE", 2, 0, 4, 3).gens(Gens::GEN9_PLUS),
    mfx("VDENC_PIPE_BUF_ADDR_STATE", 2, 0, 4, 4).gens(Gens::GEN9_PLUS),
    mfx("VDENC_IMG_STATE", 2, 0, 4, 5).gens(Gens::GEN9_PLUS),
    mfx("VDENC_CONST_QPT_STATE", 2, 0, 4, 6).gens(Gens::GEN9_PLUS),
    mfx("VDENC_WALKER_STATE", 2, 0, 4, 7).gens(Gens::GEN9_PLUS),
    mfx("VDENC_WEIGHTSOFFSETS_STATE", 2, 0, 4, 8).gens(Gens::GEN11),
    mfx("HCP_PIPE_MODE_SELECT", 2, 3, 4, 0).gens(Gens::GEN9_PLUS),
    mfx("HCP_SURFACE_STATE", 2, 3, 4, 1).gens(Gens::GEN9_PLUS),
    mfx("HCP_PIPE_BUF_ADDR_STATE", 2, 3, 4, 2).gens(Gens::GEN9_PLUS),
    mfx("HCP_IND_OBJ_BASE_ADDR_STATE", 2, 3, 4, 3).gens(Gens::GEN9_PLUS),
    mfx("HCP_QM_STATE", 2, 3, 4, 4).gens(Gens::GEN9_PLUS),
    mfx("HCP_FQM_STATE", 2, 3, 4, 5).gens(Gens::GEN9_PLUS),
    mfx("HEVC_VP9_RDOQ_STATE", 2, 3, 4, 8).gens(Gens::GEN9_PLUS),
    mfx("HCP_PIC_STATE", 2, 3, 4, 16).gens(Gens::GEN9_PLUS),
    mfx("HCP_TILE_STATE", 2, 3, 4, 17).gens(Gens::GEN9_PLUS),
    mfx("HCP_REF_IDX_STATE", 2, 3, 4, 18).gens(Gens::GEN9_PLUS),
    mfx("HCP_WEIGHTOFFSET_STATE", 2, 3, 4, 19).gens(Gens::GEN9_PLUS),
    mfx("HCP_SLICE_STATE", 2, 3, 4, 20).gens(Gens::GEN9_PLUS),
    mfx("HCP_TILE_CODING", 2, 3, 4, 21)
        .gens(Gens::GEN9_PLUS)
        .bias1(),
    mfx("HCP_BSD_OBJECT", 2, 3, 5, 0).gens(Gens::GEN9_PLUS),
    mfx("HCP_PAK_OBJECT", 2, 3, 5, 1).gens(Gens::GEN9_PLUS),
    mfx("HCP_PAK_INSERT_OBJECT", 2, 3, 5, 2).gens(Gens::GEN9_PLUS),
    mfx("HCP_VP9_PIC_STATE", 2, 3, 5, 16).gens(Gens::GEN9_PLUS),
    mfx("HCP_VP9_SEGMENT_STATE", 2, 3, 5, 18).gens(Gens::GEN9_PLUS),
    mfx("HCP_VP9_PAK_OBJECT", 2, 3, 5, 21).gens(Gens::GEN11),
    mfx("SFC_LOCK", 2, 5, 0, 0).gens(Gens::GEN9_PLUS),
    mfx("SFC_STATE", 2, 5, 0, 1).gens(Gens::GEN9_PLUS),
    mfx("SFC_AVS_STATE", 2, 5, 0, 2).gens(Gens::GEN9_PLUS),
    mfx("SFC_IEF_STATE", 2, 5, 0, 3).gens(Gens::GEN9_PLUS),
    mfx("SFC_FRAME_START", 2, 5, 0, 4).gens(Gens::GEN9_PLUS),
    mfx("SFC_AVS_LUMA_COEFF_TABLE", 2, 5, 0, 5).gens(Gens::GEN9_PLUS),
    mfx("SFC_AVS_CHROMA_COEFF_TABLE", 2, 5, 0, 6).gens(Gens::GEN9_PLUS),
    mfx("HUC_PIPE_MODE_SELECT", 2, 5, 4, 0).gens(Gens::GEN9_PLUS),
    mfx("HUC_IMEM_STATE", 2, 5, 4, 1).gens(Gens::GEN9_PLUS),
    mfx("HUC_DMEM_STATE", 2, 5, 4, 2).gens(Gens::GEN9_PLUS),
    mfx("HUC_CFG_STATE", 2, 5, 4, 3).gens(Gens::GEN9_PLUS),
    mfx("HUC_VIRTUAL_ADDR_STATE", 2, 5, 4, 4).gens(Gens::GEN9_PLUS),
    mfx("HUC_IND_OBJ_BASE_ADDR_STATE", 2, 5, 4, 5).gens(Gens::GEN9_PLUS),
    mfx("HUC_STREAM_OBJECT", 2, 5, 5, 0).gens(Gens::GEN9_PLUS),
    mfx("HUC_START", 2, 5, 5, 1).gens(Gens::GEN9_PLUS),
    mfx("VD_PIPELINE_FLUSH", 2, 7, 4, 0).gens(Gens::GEN9_PLUS),
    // ---- VEBOX (type 3), video enhancement: address layouts not modelled -----------------------
    veb("VEBOX_SURFACE_STATE", 2, 4, 0, 0),
    veb("VEBOX_STATE", 2, 4, 0, 2),
    veb("VEB_DI_IECP", 2, 4, 0, 3),
];

impl CommandDesc {
    const fn length_fixed1(mut self) -> Self {
        self.length = LengthRule::Fixed(1);
        self
    }
    /// genxml gives a few video commands a length bias of 1.
    const fn bias1(mut self) -> Self {
        if let LengthRule::Variable { bits, .. } = self.length {
            self.length = LengthRule::Variable { bits, bias: 1 };
        }
        self
    }
    const fn len_bits(mut self, bits: u8) -> Self {
        self.length = LengthRule::Variable { bits, bias: 2 };
        self
    }
}
