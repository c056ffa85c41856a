//! The rows of the register model, grouped by block, sorted by offset (GEN9 offsets; GEN8 shares
//! them). Names are i915's. `cmd_reg` rows may also be written by a guest command buffer.

use super::Behaviour::{Handler as H, Masked, ReadOnly, SelfClearing, Store, WriteOneToClear};
use super::Block::{
    Error, Execlist, Forcewake, Fuse, Interrupt, Power, Reset, Ring, Tlb, Workaround,
};
use super::Handler::{
    CsbPointer, Elsp, EngineResetCtl, GraphicsReset, GtIir, GtMaskOrEnable, MasterIrq, MiMode,
    Monitor, PcodeMailbox, RequestAcked, Timestamp,
};
use super::{cmd_reg, reg, Reg};

/// `GEN8_MASTER_IRQ_CONTROL`: the master interrupt enable.
pub const MASTER_IRQ_CONTROL: u32 = 1 << 31;
/// GT interrupt bit: the engine's user interrupt (`MI_USER_INTERRUPT`).
pub const GT_USER_INTERRUPT: u32 = 1 << 0;
/// GT interrupt bit: the engine switched context (a context-status event was written).
pub const GT_CONTEXT_SWITCH_INTERRUPT: u32 = 1 << 8;
/// The engine interrupts enabled in each GT bank before the guest programs them (as the host
/// driver leaves them on a GVT-g host, whose register snapshot a vGPU starts from).
const IER_RESET: [u32; 4] = [0x0101_0101, 0x0101_0101, 0, 0x0000_0101];

/// Registers at fixed offsets, sorted.
pub const ABSOLUTE: &[Reg] = &[
    // Forcewake: acknowledges (the requests are below, at 0xa188..).
    reg(0x0d84, "FORCEWAKE_ACK_RENDER_GEN9", Forcewake, 0, ReadOnly),
    reg(0x0d88, "FORCEWAKE_ACK_MEDIA_GEN9", Forcewake, 0, ReadOnly),
    // Render-engine workaround registers inside the render window (render only).
    cmd_reg(0x2580, "GEN8_CS_CHICKEN1", Workaround, 0, Masked),
    // Faults the vGPU reports (the guest reads and clears them).
    reg(0x4094, "GEN8_RING_FAULT_REG", Error, 0, Store),
    reg(0x40a0, "ERROR_GEN6", Error, 0, Store),
    // TLB invalidation: done at once (the vGPU translates through the tables on every access).
    reg(0x4260, "GEN8_RTCR", Tlb, 0, SelfClearing),
    reg(0x4264, "GEN8_M1TCR", Tlb, 0, SelfClearing),
    reg(0x4268, "GEN8_M2TCR", Tlb, 0, SelfClearing),
    reg(0x426c, "GEN8_BTCR", Tlb, 0, SelfClearing),
    reg(0x4270, "GEN8_VTCR", Tlb, 0, SelfClearing),
    // Cache-mode and slice workaround registers i915 writes from every context.
    cmd_reg(0x7000, "CACHE_MODE_0_GEN7", Workaround, 0, Masked),
    cmd_reg(0x7004, "CACHE_MODE_1", Workaround, 0, Masked),
    cmd_reg(0x7008, "GEN7_GT_MODE", Workaround, 0, Masked),
    cmd_reg(0x7010, "GEN7_COMMON_SLICE_CHICKEN1", Workaround, 0, Masked),
    cmd_reg(0x7014, "COMMON_SLICE_CHICKEN2", Workaround, 0, Masked),
    cmd_reg(0x7018, "HIZ_CHICKEN", Workaround, 0, Masked),
    cmd_reg(0x7300, "HDC_CHICKEN0", Workaround, 0, Masked),
    cmd_reg(0x7304, "COMMON_SLICE_CHICKEN3", Workaround, 0, Masked),
    cmd_reg(
        0x7308,
        "GEN9_SLICE_COMMON_ECO_CHICKEN0",
        Workaround,
        0,
        Masked,
    ),
    // Fuses: a GT2 Skylake, one slice of three subslices of 8 EUs (24 EUs), all enabled.
    reg(0x9120, "GEN8_FUSE2", Fuse, SKL_GT2_FUSE2, ReadOnly),
    reg(0x9134, "GEN9_EU_DISABLE(0)", Fuse, 0, ReadOnly),
    reg(0x9138, "GEN9_EU_DISABLE(1)", Fuse, 0, ReadOnly),
    reg(0x913c, "GEN9_EU_DISABLE(2)", Fuse, 0, ReadOnly),
    // Reset: the whole GPU or single engines, acknowledged at once.
    reg(0x941c, "GEN6_GDRST", Reset, 0, H(GraphicsReset)),
    // Forcewake requests (GEN9 domains).
    reg(
        0xa188,
        "FORCEWAKE_GT_GEN9",
        Forcewake,
        0,
        H(super::Handler::Forcewake { ack: 0x13_0044 }),
    ),
    reg(
        0xa270,
        "FORCEWAKE_MEDIA_GEN9",
        Forcewake,
        0,
        H(super::Handler::Forcewake { ack: 0x0d88 }),
    ),
    reg(
        0xa278,
        "FORCEWAKE_RENDER_GEN9",
        Forcewake,
        0,
        H(super::Handler::Forcewake { ack: 0x0d84 }),
    ),
    // The GuC's microcontroller stays in reset: a vGPU has no GuC (i915 checks after resetting it).
    reg(0xc000, "GUC_STATUS", Power, 1, ReadOnly),
    cmd_reg(0xe184, "GEN8_HALF_SLICE_CHICKEN3", Workaround, 0, Masked),
    cmd_reg(0xe188, "GEN9_HALF_SLICE_CHICKEN5", Workaround, 0, Masked),
    cmd_reg(0xe194, "GEN9_HALF_SLICE_CHICKEN7", Workaround, 0, Masked),
    cmd_reg(0xe4f0, "GEN8_ROW_CHICKEN", Workaround, 0, Masked),
    cmd_reg(0xe4f4, "GEN7_ROW_CHICKEN2", Workaround, 0, Masked),
    // Display power: fuses distributed, power wells and PLLs granted as requested.
    reg(0x4_2000, "SKL_FUSE_STATUS", Power, 0x8e00_0000, ReadOnly),
    // GT interrupts: master, then per bank ISR, IMR, IIR, IER.
    reg(
        0x4_4200,
        "GEN8_MASTER_IRQ",
        Interrupt,
        MASTER_IRQ_CONTROL,
        H(MasterIrq),
    ),
    reg(0x4_4300, "GEN8_GT_ISR(0)", Interrupt, 0, ReadOnly),
    reg(0x4_4304, "GEN8_GT_IMR(0)", Interrupt, 0, H(GtMaskOrEnable)),
    reg(0x4_4308, "GEN8_GT_IIR(0)", Interrupt, 0, H(GtIir)),
    reg(
        0x4_430c,
        "GEN8_GT_IER(0)",
        Interrupt,
        IER_RESET[0],
        H(GtMaskOrEnable),
    ),
    reg(0x4_4310, "GEN8_GT_ISR(1)", Interrupt, 0, ReadOnly),
    reg(0x4_4314, "GEN8_GT_IMR(1)", Interrupt, 0, H(GtMaskOrEnable)),
    reg(0x4_4318, "GEN8_GT_IIR(1)", Interrupt, 0, H(GtIir)),
    reg(
        0x4_431c,
        "GEN8_GT_IER(1)",
        Interrupt,
        IER_RESET[1],
        H(GtMaskOrEnable),
    ),
    reg(0x4_4320, "GEN8_GT_ISR(2)", Interrupt, 0, ReadOnly),
    reg(0x4_4324, "GEN8_GT_IMR(2)", Interrupt, 0, H(GtMaskOrEnable)),
    reg(0x4_4328, "GEN8_GT_IIR(2)", Interrupt, 0, H(GtIir)),
    reg(
        0x4_432c,
        "GEN8_GT_IER(2)",
        Interrupt,
        IER_RESET[2],
        H(GtMaskOrEnable),
    ),
    reg(0x4_4330, "GEN8_GT_ISR(3)", Interrupt, 0, ReadOnly),
    reg(0x4_4334, "GEN8_GT_IMR(3)", Interrupt, 0, H(GtMaskOrEnable)),
    reg(0x4_4338, "GEN8_GT_IIR(3)", Interrupt, 0, H(GtIir)),
    reg(
        0x4_433c,
        "GEN8_GT_IER(3)",
        Interrupt,
        IER_RESET[3],
        H(GtMaskOrEnable),
    ),
    // Display interrupts: pipes raise vblank and flip done (`crate::display`), latched in the
    // IIR unless masked, summed up in the master register while enabled; i915 resets and checks
    // the others (IIRs must clear when written back).
    reg(0x4_4400, "GEN8_DE_PIPE_ISR(A)", Interrupt, 0, ReadOnly),
    reg(0x4_4404, "GEN8_DE_PIPE_IMR(A)", Interrupt, 0, Store),
    reg(
        0x4_4408,
        "GEN8_DE_PIPE_IIR(A)",
        Interrupt,
        0,
        WriteOneToClear,
    ),
    reg(0x4_440c, "GEN8_DE_PIPE_IER(A)", Interrupt, 0, Store),
    reg(0x4_4410, "GEN8_DE_PIPE_ISR(B)", Interrupt, 0, ReadOnly),
    reg(0x4_4414, "GEN8_DE_PIPE_IMR(B)", Interrupt, 0, Store),
    reg(
        0x4_4418,
        "GEN8_DE_PIPE_IIR(B)",
        Interrupt,
        0,
        WriteOneToClear,
    ),
    reg(0x4_441c, "GEN8_DE_PIPE_IER(B)", Interrupt, 0, Store),
    reg(0x4_4420, "GEN8_DE_PIPE_ISR(C)", Interrupt, 0, ReadOnly),
    reg(0x4_4424, "GEN8_DE_PIPE_IMR(C)", Interrupt, 0, Store),
    reg(
        0x4_4428,
        "GEN8_DE_PIPE_IIR(C)",
        Interrupt,
        0,
        WriteOneToClear,
    ),
    reg(0x4_442c, "GEN8_DE_PIPE_IER(C)", Interrupt, 0, Store),
    reg(0x4_4440, "GEN8_DE_PORT_ISR", Interrupt, 0, ReadOnly),
    reg(0x4_4444, "GEN8_DE_PORT_IMR", Interrupt, 0, Store),
    reg(0x4_4448, "GEN8_DE_PORT_IIR", Interrupt, 0, WriteOneToClear),
    reg(0x4_444c, "GEN8_DE_PORT_IER", Interrupt, 0, Store),
    reg(0x4_4460, "GEN8_DE_MISC_ISR", Interrupt, 0, ReadOnly),
    reg(0x4_4464, "GEN8_DE_MISC_IMR", Interrupt, 0, Store),
    reg(0x4_4468, "GEN8_DE_MISC_IIR", Interrupt, 0, WriteOneToClear),
    reg(0x4_446c, "GEN8_DE_MISC_IER", Interrupt, 0, Store),
    reg(0x4_44e0, "GEN8_PCU_ISR", Interrupt, 0, ReadOnly),
    reg(0x4_44e4, "GEN8_PCU_IMR", Interrupt, 0, Store),
    reg(0x4_44e8, "GEN8_PCU_IIR", Interrupt, 0, WriteOneToClear),
    reg(0x4_44ec, "GEN8_PCU_IER", Interrupt, 0, Store),
    reg(
        0x4_5008,
        "DBUF_CTL",
        Power,
        0,
        H(RequestAcked { request: 1 << 31 }),
    ),
    reg(
        0x4_5400,
        "HSW_PWR_WELL_CTL1 (BIOS)",
        Power,
        0,
        H(RequestAcked {
            request: 0xaaaa_aaaa,
        }),
    ),
    reg(
        0x4_5404,
        "HSW_PWR_WELL_CTL2 (driver)",
        Power,
        0,
        H(RequestAcked {
            request: 0xaaaa_aaaa,
        }),
    ),
    reg(
        0x4_5408,
        "HSW_PWR_WELL_CTL3 (KVMR)",
        Power,
        0,
        H(RequestAcked {
            request: 0xaaaa_aaaa,
        }),
    ),
    reg(
        0x4_540c,
        "HSW_PWR_WELL_CTL4 (debug)",
        Power,
        0,
        H(RequestAcked {
            request: 0xaaaa_aaaa,
        }),
    ),
    // LCPLL1 is enabled and locked by the firmware before the driver loads.
    reg(
        0x4_6010,
        "LCPLL1_CTL",
        Power,
        0xc000_0000,
        H(RequestAcked { request: 1 << 31 }),
    ),
    reg(0x6_4834, "EDP_PSR_IMR", Interrupt, 0, Store),
    reg(0x6_4838, "EDP_PSR_IIR", Interrupt, 0, WriteOneToClear),
    // South display (PCH) interrupts.
    // Hot-plug status: port D's monitor is connected while there is one.
    reg(
        0xc_4000,
        "SDEISR",
        Interrupt,
        0,
        H(Monitor {
            bits: super::display::SDE_PORTD_HOTPLUG,
        }),
    ),
    reg(0xc_4004, "SDEIMR", Interrupt, 0, Store),
    reg(0xc_4008, "SDEIIR", Interrupt, 0, WriteOneToClear),
    reg(0xc_400c, "SDEIER", Interrupt, 0, Store),
    reg(0x13_0044, "FORCEWAKE_ACK_GT_GEN9", Forcewake, 0, ReadOnly),
    // PCODE: the mailbox is never busy; data registers hold the answers.
    reg(0x13_8124, "GEN6_PCODE_MAILBOX", Power, 0, H(PcodeMailbox)),
    reg(0x13_8128, "GEN6_PCODE_DATA", Power, 0, Store),
    reg(0x13_812c, "GEN6_PCODE_DATA1", Power, 0, Store),
    // Memory controller (MCHBAR mirror): DDR4, two channels of one 8 GiB single-rank x8 DIMM,
    // which i915 reads for display watermarks.
    reg(
        0x14_5000,
        "SKL_MAD_INTER_CHANNEL_0_0_0_MCHBAR_MCMAIN",
        Power,
        0,
        ReadOnly,
    ),
    reg(
        0x14_500c,
        "SKL_MAD_DIMM_CH0_0_0_0_MCHBAR_MCMAIN",
        Power,
        8,
        ReadOnly,
    ),
    reg(
        0x14_5010,
        "SKL_MAD_DIMM_CH1_0_0_0_MCHBAR_MCMAIN",
        Power,
        8,
        ReadOnly,
    ),
    // RPS limits (MCHBAR mirror): RP0 1100 MHz, RP1 550 MHz, RPn 300 MHz in 50 MHz units
    // (i915 reads them for its frequency range even though it leaves RPS off on a vGPU).
    reg(
        0x14_5998,
        "GEN6_RP_STATE_CAP",
        Power,
        SKL_RP_STATE_CAP,
        ReadOnly,
    ),
];

/// `GEN6_RP_STATE_CAP` of the modelled GT2: RPn (bits 23:16) 6, RP1 (15:8) 11, RP0 (7:0) 22, in
/// 50 MHz units.
pub const SKL_RP_STATE_CAP: u32 = (6 << 16) | (11 << 8) | 22;

/// `GEN8_FUSE2` of a GT2 Skylake: slice 0 enabled (`GEN8_F2_S_ENA`, bits 27:25), subslice 3
/// disabled (`GEN9_F2_SS_DIS`, bits 23:20).
pub const SKL_GT2_FUSE2: u32 = (1 << 25) | (0b1000 << 20);

/// Registers relative to each engine's MMIO base, sorted.
pub const ENGINE: &[Reg] = &[
    reg(0x030, "RING_TAIL", Ring, 0, Store),
    reg(0x034, "RING_HEAD", Ring, 0, Store),
    reg(0x038, "RING_START", Ring, 0, Store),
    reg(0x03c, "RING_CTL", Ring, 0, Store),
    reg(0x080, "RING_HWS_PGA", Ring, 0, Store),
    reg(0x098, "RING_HWSTAM", Ring, 0, Store),
    cmd_reg(0x09c, "RING_MI_MODE", Ring, 0, H(MiMode)),
    reg(0x0a8, "RING_IMR", Ring, 0, Store),
    // Command streamer errors: none reported; the identity clears when written back.
    reg(0x0b0, "RING_EIR", Error, 0, WriteOneToClear),
    reg(0x0b4, "RING_EMR", Error, 0, Store),
    reg(0x0b8, "RING_ESR", Error, 0, ReadOnly),
    cmd_reg(0x0c0, "RING_INSTPM", Ring, 0, Masked),
    reg(0x0d0, "RING_RESET_CTL", Reset, 0, H(EngineResetCtl)),
    reg(0x230, "RING_ELSP", Execlist, 0, H(Elsp)),
    reg(0x234, "RING_EXECLIST_STATUS_LO", Execlist, 0, ReadOnly),
    reg(0x238, "RING_EXECLIST_STATUS_HI", Execlist, 0, ReadOnly),
    cmd_reg(0x29c, "RING_MODE_GEN7", Ring, 0, Masked),
    // The 12 MHz timestamp (both dwords), and the running context's.
    reg(
        0x358,
        "RING_TIMESTAMP",
        Ring,
        0,
        H(Timestamp { udw: false }),
    ),
    reg(
        0x35c,
        "RING_TIMESTAMP_UDW",
        Ring,
        0,
        H(Timestamp { udw: true }),
    ),
    reg(
        0x370,
        "RING_CONTEXT_STATUS_BUF_LO(0)",
        Execlist,
        0,
        ReadOnly,
    ),
    reg(
        0x374,
        "RING_CONTEXT_STATUS_BUF_HI(0)",
        Execlist,
        0,
        ReadOnly,
    ),
    reg(
        0x378,
        "RING_CONTEXT_STATUS_BUF_LO(1)",
        Execlist,
        0,
        ReadOnly,
    ),
    reg(
        0x37c,
        "RING_CONTEXT_STATUS_BUF_HI(1)",
        Execlist,
        0,
        ReadOnly,
    ),
    reg(
        0x380,
        "RING_CONTEXT_STATUS_BUF_LO(2)",
        Execlist,
        0,
        ReadOnly,
    ),
    reg(
        0x384,
        "RING_CONTEXT_STATUS_BUF_HI(2)",
        Execlist,
        0,
        ReadOnly,
    ),
    reg(
        0x388,
        "RING_CONTEXT_STATUS_BUF_LO(3)",
        Execlist,
        0,
        ReadOnly,
    ),
    reg(
        0x38c,
        "RING_CONTEXT_STATUS_BUF_HI(3)",
        Execlist,
        0,
        ReadOnly,
    ),
    reg(
        0x390,
        "RING_CONTEXT_STATUS_BUF_LO(4)",
        Execlist,
        0,
        ReadOnly,
    ),
    reg(
        0x394,
        "RING_CONTEXT_STATUS_BUF_HI(4)",
        Execlist,
        0,
        ReadOnly,
    ),
    reg(
        0x398,
        "RING_CONTEXT_STATUS_BUF_LO(5)",
        Execlist,
        0,
        ReadOnly,
    ),
    reg(
        0x39c,
        "RING_CONTEXT_STATUS_BUF_HI(5)",
        Execlist,
        0,
        ReadOnly,
    ),
    // Read and write pointers 7: no entry written yet.
    reg(
        0x3a0,
        "RING_CONTEXT_STATUS_PTR",
        Execlist,
        0x0707,
        H(CsbPointer),
    ),
    reg(
        0x3a8,
        "RING_CTX_TIMESTAMP",
        Ring,
        0,
        H(Timestamp { udw: false }),
    ),
];
