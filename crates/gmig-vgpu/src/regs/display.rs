//! The display engine's rows (GEN9 offsets): the DDI ports and their AUX channels, the DPLLs,
//! transcoder timings, pipes and their universal planes and cursors. The vGPU's virtual monitor
//! sits on port D (as GVT-g's does on Skylake); what a row's handler answers is in
//! [`crate::display`].

use super::Behaviour::{Handler as H, ReadOnly, Store};
use super::Block::Display;
use super::Handler::{
    AuxCtl, DdiBufCtl, DpllStatus, Monitor, PipeCounter, PlaneSurf, RequestAcked,
};
use super::{reg, PipeCounterKind, Reg};

/// `PIPECONF`/`TRANSCONF` of pipe A (pipes B and C at +0x1000 each).
pub const PIPECONF_A: u32 = 0x7_0008;
/// `PIPECONF_ENABLE`.
pub const PIPECONF_ENABLE: u32 = 1 << 31;
/// Offset between two pipes' (and transcoders') register blocks.
pub const PIPE_STRIDE: u32 = 0x1000;
/// `PLANE_CTL(A, 0)`, the primary plane's control.
pub const PLANE_CTL_A: u32 = 0x7_0180;
/// `PLANE_STRIDE(A, 0)`.
pub const PLANE_STRIDE_A: u32 = 0x7_0188;
/// `PLANE_SIZE(A, 0)`.
pub const PLANE_SIZE_A: u32 = 0x7_0190;
/// `PLANE_SURF(A, 0)`.
pub const PLANE_SURF_A: u32 = 0x7_019c;
/// `PLANE_OFFSET(A, 0)`.
pub const PLANE_OFFSET_A: u32 = 0x7_01a4;
/// `PIPESRC(A)`.
pub const PIPESRC_A: u32 = 0x6_001c;
/// `DP_AUX_CH_CTL(A)`; channels B-D at +0x100 each, data registers at +4..+0x14.
pub const AUX_CTL_A: u32 = 0x6_4010;
/// `DPLL_STATUS`.
pub const DPLL_STATUS: u32 = 0x6_c060;
/// The enable registers of DPLL0-3 (`LCPLL1_CTL`, `LCPLL2_CTL`, `WRPLL_CTL(0)`, `WRPLL_CTL(1)`):
/// bit 31 enables.
pub const DPLL_ENABLE_REGS: [u32; 4] = [0x4_6010, 0x4_6014, 0x4_6040, 0x4_6060];
/// `SDEISR`'s hot-plug bit of port D (`SDE_PORTD_HOTPLUG_CPT`): a monitor is connected.
pub const SDE_PORTD_HOTPLUG: u32 = 1 << 23;
/// `SFUSE_STRAP_DDID_DETECTED`: port D is present.
pub const SFUSE_STRAP_DDID: u32 = 1 << 0;
/// `DDI_BUF_CTL_ENABLE` and `DDI_BUF_IS_IDLE`.
pub const DDI_BUF_ENABLE: u32 = 1 << 31;
/// See [`DDI_BUF_ENABLE`].
pub const DDI_BUF_IDLE: u32 = 1 << 7;
/// `DP_TP_STATUS_IDLE_DONE`.
const DP_TP_IDLE_DONE: u32 = 1 << 25;

const FRAMES: super::Behaviour = H(PipeCounter(PipeCounterKind::Frames));
const FLIPS: super::Behaviour = H(PipeCounter(PipeCounterKind::Flips));
const SCANLINE: super::Behaviour = H(PipeCounter(PipeCounterKind::ScanLine));
const PIPE_ON: super::Behaviour = H(RequestAcked {
    request: PIPECONF_ENABLE,
});

/// The display rows, sorted.
pub const ROWS: &[Reg] = &[
    // Transcoders A-C: timings and source size (stored: the vGPU scans out what the plane
    // says, at the monitor's mode).
    reg(0x6_0000, "HTOTAL(A)", Display, 0, Store),
    reg(0x6_000c, "VTOTAL(A)", Display, 0, Store),
    reg(0x6_001c, "PIPESRC(A)", Display, 0, Store),
    reg(0x6_0400, "TRANS_DDI_FUNC_CTL(A)", Display, 0, Store),
    reg(0x6_1000, "HTOTAL(B)", Display, 0, Store),
    reg(0x6_100c, "VTOTAL(B)", Display, 0, Store),
    reg(0x6_101c, "PIPESRC(B)", Display, 0, Store),
    reg(0x6_1400, "TRANS_DDI_FUNC_CTL(B)", Display, 0, Store),
    reg(0x6_2000, "HTOTAL(C)", Display, 0, Store),
    reg(0x6_200c, "VTOTAL(C)", Display, 0, Store),
    reg(0x6_201c, "PIPESRC(C)", Display, 0, Store),
    reg(0x6_2400, "TRANS_DDI_FUNC_CTL(C)", Display, 0, Store),
    // DDI A-E: the buffer is idle while disabled; AUX channels A-D; link training status
    // (idle patterns are sent at once).
    reg(
        0x6_4000,
        "DDI_BUF_CTL(A)",
        Display,
        DDI_BUF_IDLE,
        H(DdiBufCtl),
    ),
    reg(0x6_4010, "DP_AUX_CH_CTL(A)", Display, 0, H(AuxCtl)),
    reg(0x6_4014, "DP_AUX_CH_DATA1(A)", Display, 0, Store),
    reg(0x6_4018, "DP_AUX_CH_DATA2(A)", Display, 0, Store),
    reg(0x6_401c, "DP_AUX_CH_DATA3(A)", Display, 0, Store),
    reg(0x6_4020, "DP_AUX_CH_DATA4(A)", Display, 0, Store),
    reg(0x6_4024, "DP_AUX_CH_DATA5(A)", Display, 0, Store),
    reg(0x6_4040, "DP_TP_CTL(A)", Display, 0, Store),
    reg(
        0x6_4044,
        "DP_TP_STATUS(A)",
        Display,
        DP_TP_IDLE_DONE,
        ReadOnly,
    ),
    reg(
        0x6_4100,
        "DDI_BUF_CTL(B)",
        Display,
        DDI_BUF_IDLE,
        H(DdiBufCtl),
    ),
    reg(0x6_4110, "DP_AUX_CH_CTL(B)", Display, 0, H(AuxCtl)),
    reg(0x6_4114, "DP_AUX_CH_DATA1(B)", Display, 0, Store),
    reg(0x6_4118, "DP_AUX_CH_DATA2(B)", Display, 0, Store),
    reg(0x6_411c, "DP_AUX_CH_DATA3(B)", Display, 0, Store),
    reg(0x6_4120, "DP_AUX_CH_DATA4(B)", Display, 0, Store),
    reg(0x6_4124, "DP_AUX_CH_DATA5(B)", Display, 0, Store),
    reg(0x6_4140, "DP_TP_CTL(B)", Display, 0, Store),
    reg(
        0x6_4144,
        "DP_TP_STATUS(B)",
        Display,
        DP_TP_IDLE_DONE,
        ReadOnly,
    ),
    reg(
        0x6_4200,
        "DDI_BUF_CTL(C)",
        Display,
        DDI_BUF_IDLE,
        H(DdiBufCtl),
    ),
    reg(0x6_4210, "DP_AUX_CH_CTL(C)", Display, 0, H(AuxCtl)),
    reg(0x6_4214, "DP_AUX_CH_DATA1(C)", Display, 0, Store),
    reg(0x6_4218, "DP_AUX_CH_DATA2(C)", Display, 0, Store),
    reg(0x6_421c, "DP_AUX_CH_DATA3(C)", Display, 0, Store),
    reg(0x6_4220, "DP_AUX_CH_DATA4(C)", Display, 0, Store),
    reg(0x6_4224, "DP_AUX_CH_DATA5(C)", Display, 0, Store),
    reg(0x6_4240, "DP_TP_CTL(C)", Display, 0, Store),
    reg(
        0x6_4244,
        "DP_TP_STATUS(C)",
        Display,
        DP_TP_IDLE_DONE,
        ReadOnly,
    ),
    reg(
        0x6_4300,
        "DDI_BUF_CTL(D)",
        Display,
        DDI_BUF_IDLE,
        H(DdiBufCtl),
    ),
    reg(0x6_4310, "DP_AUX_CH_CTL(D)", Display, 0, H(AuxCtl)),
    reg(0x6_4314, "DP_AUX_CH_DATA1(D)", Display, 0, Store),
    reg(0x6_4318, "DP_AUX_CH_DATA2(D)", Display, 0, Store),
    reg(0x6_431c, "DP_AUX_CH_DATA3(D)", Display, 0, Store),
    reg(0x6_4320, "DP_AUX_CH_DATA4(D)", Display, 0, Store),
    reg(0x6_4324, "DP_AUX_CH_DATA5(D)", Display, 0, Store),
    reg(0x6_4340, "DP_TP_CTL(D)", Display, 0, Store),
    reg(
        0x6_4344,
        "DP_TP_STATUS(D)",
        Display,
        DP_TP_IDLE_DONE,
        ReadOnly,
    ),
    reg(
        0x6_4400,
        "DDI_BUF_CTL(E)",
        Display,
        DDI_BUF_IDLE,
        H(DdiBufCtl),
    ),
    reg(0x6_4440, "DP_TP_CTL(E)", Display, 0, Store),
    reg(
        0x6_4444,
        "DP_TP_STATUS(E)",
        Display,
        DP_TP_IDLE_DONE,
        ReadOnly,
    ),
    // DPLLs: ports' clock selection (DDI clocks start gated: bits 19:15), link rates, and the
    // lock status, which follows each DPLL's enable bit at once.
    reg(0x6_c058, "DPLL_CTRL1", Display, 0, Store),
    reg(0x6_c05c, "DPLL_CTRL2", Display, 0x000f_8000, Store),
    reg(0x6_c060, "DPLL_STATUS", Display, 0, H(DpllStatus)),
    // Pipes A-C: scan line, enable (the state bit follows at once), frame and flip counters;
    // cursor; the primary plane (universal plane 1).
    reg(0x7_0000, "PIPEDSL(A)", Display, 0, SCANLINE),
    reg(0x7_0008, "PIPECONF(A)", Display, 0, PIPE_ON),
    reg(0x7_0040, "PIPE_FRMCOUNT(A)", Display, 0, FRAMES),
    reg(0x7_0044, "PIPE_FLIPCOUNT(A)", Display, 0, FLIPS),
    reg(0x7_0080, "CURCNTR(A)", Display, 0, Store),
    reg(0x7_0084, "CURBASE(A)", Display, 0, Store),
    reg(0x7_0180, "PLANE_CTL(A, 0)", Display, 0, Store),
    reg(0x7_0188, "PLANE_STRIDE(A, 0)", Display, 0, Store),
    reg(0x7_018c, "PLANE_POS(A, 0)", Display, 0, Store),
    reg(0x7_0190, "PLANE_SIZE(A, 0)", Display, 0, Store),
    reg(0x7_019c, "PLANE_SURF(A, 0)", Display, 0, H(PlaneSurf)),
    reg(0x7_01a4, "PLANE_OFFSET(A, 0)", Display, 0, Store),
    reg(0x7_1000, "PIPEDSL(B)", Display, 0, SCANLINE),
    reg(0x7_1008, "PIPECONF(B)", Display, 0, PIPE_ON),
    reg(0x7_1040, "PIPE_FRMCOUNT(B)", Display, 0, FRAMES),
    reg(0x7_1044, "PIPE_FLIPCOUNT(B)", Display, 0, FLIPS),
    reg(0x7_1080, "CURCNTR(B)", Display, 0, Store),
    reg(0x7_1084, "CURBASE(B)", Display, 0, Store),
    reg(0x7_1180, "PLANE_CTL(B, 0)", Display, 0, Store),
    reg(0x7_1188, "PLANE_STRIDE(B, 0)", Display, 0, Store),
    reg(0x7_118c, "PLANE_POS(B, 0)", Display, 0, Store),
    reg(0x7_1190, "PLANE_SIZE(B, 0)", Display, 0, Store),
    reg(0x7_119c, "PLANE_SURF(B, 0)", Display, 0, H(PlaneSurf)),
    reg(0x7_11a4, "PLANE_OFFSET(B, 0)", Display, 0, Store),
    reg(0x7_2000, "PIPEDSL(C)", Display, 0, SCANLINE),
    reg(0x7_2008, "PIPECONF(C)", Display, 0, PIPE_ON),
    reg(0x7_2040, "PIPE_FRMCOUNT(C)", Display, 0, FRAMES),
    reg(0x7_2044, "PIPE_FLIPCOUNT(C)", Display, 0, FLIPS),
    reg(0x7_2080, "CURCNTR(C)", Display, 0, Store),
    reg(0x7_2084, "CURBASE(C)", Display, 0, Store),
    reg(0x7_2180, "PLANE_CTL(C, 0)", Display, 0, Store),
    reg(0x7_2188, "PLANE_STRIDE(C, 0)", Display, 0, Store),
    reg(0x7_218c, "PLANE_POS(C, 0)", Display, 0, Store),
    reg(0x7_2190, "PLANE_SIZE(C, 0)", Display, 0, Store),
    reg(0x7_219c, "PLANE_SURF(C, 0)", Display, 0, H(PlaneSurf)),
    reg(0x7_21a4, "PLANE_OFFSET(C, 0)", Display, 0, Store),
    // Port presence: port D's DDI is strapped in while a monitor is there.
    reg(
        0xc_2014,
        "SFUSE_STRAP",
        Display,
        0,
        H(Monitor {
            bits: SFUSE_STRAP_DDID,
        }),
    ),
    // GMBUS: hardware ready, and every transfer is NAKed at once (the monitor is DP; its EDID
    // comes over AUX).
    reg(0xc_5108, "PCH_GMBUS2", Display, GMBUS2_NO_DEVICE, ReadOnly),
];

/// `GMBUS2` of a bus with nothing on it: `GMBUS_HW_WAIT_PHASE | GMBUS_HW_RDY | GMBUS_SATOER`
/// (the slave address was not acknowledged), `GMBUS_ACTIVE` clear.
pub const GMBUS2_NO_DEVICE: u32 = (1 << 14) | (1 << 11) | (1 << 10);

/// The pipe (0-2) whose register block holds `offset` (transcoder or pipe registers).
pub fn pipe_of(offset: u32) -> usize {
    ((offset >> 12) & 0xf) as usize % 3
}

/// The AUX channel (0 = A) of an AUX control register.
pub fn aux_channel_of(offset: u32) -> u32 {
    (offset - AUX_CTL_A) / 0x100
}
