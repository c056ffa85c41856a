//! The vGPU's display: a virtual DisplayPort monitor on port D (as GVT-g gives each vGPU on
//! Skylake), whose resolution comes from the vGPU type; its AUX channel answering DPCD and
//! I2C-over-AUX EDID reads ([`aux`], [`edid`]); vblanks at the monitor mode's rate on every
//! enabled pipe, driven by the vGPU's display clock, which count `PIPE_FRMCOUNT`, complete
//! flips (`PIPE_FLIPCOUNT`) and raise the DE pipe interrupt; the scan-out of a pipe's
//! primary plane ([`plane`]); and the pipe CRC of what it scans out ([`crc`]).
//!
//! The registers are rows of the register model ([`crate::regs::display`]); this module holds
//! what their handlers answer and the state that migrates with the vGPU ([`DisplayState`]).
//!
//! # The display clock
//! The vGPU has no clock of its own: whoever runs it calls [`Vgpu::display_tick`] with the
//! time in 12 MHz ticks ([`crate::regs::clock`]), as often as it likes (`gmig serve` before
//! every BAR0 read of a register whose value the clock changes ([`reads_display_clock`]),
//! after every message and when the next vblank is due). A vblank falls due every frame period
//! of the monitor's mode after the pipe was seen enabled; a tick counts every vblank due since
//! the last one and raises one interrupt for them. Tests tick with chosen times, so what they see
//! is deterministic.

pub mod aux;
pub mod crc;
pub mod edid;
pub mod plane;
pub mod state;
#[cfg(test)]
mod tests;

use crate::regs::clock::TIMESTAMP_HZ;
use crate::regs::display::{
    aux_channel_of, pipe_of, DDI_BUF_ENABLE, DDI_BUF_IDLE, DPLL_ENABLE_REGS, PIPECONF_A,
    PIPECONF_ENABLE, PIPE_STRIDE,
};
use crate::regs::{Handler, PipeCounterKind};
use crate::vgpu::Vgpu;
pub use edid::{Mode, Resolution};
pub use state::{DisplayState, PipeState};

/// `GEN8_DE_PIPE_IIR(A)`; pipes B and C at +0x10 each (IMR at -4, IER at +4).
pub const DE_PIPE_IIR_A: u32 = 0x4_4408;
/// `GEN8_PIPE_VBLANK`.
pub const PIPE_VBLANK: u32 = 1 << 0;
/// `GEN9_PIPE_PLANE1_FLIP_DONE`.
pub const PIPE_FLIP_DONE: u32 = 1 << 3;
/// The master interrupt register's bit for pipe 0 (`GEN8_DE_PIPE_IRQ(A)`).
const MASTER_DE_PIPE_A: u32 = 1 << 16;
/// The AUX channel of port D, where the monitor is.
pub const MONITOR_AUX_CHANNEL: u32 = 3;
/// How close to a vblank `PIPEDSL` reads as the last active line: i915 evades vblanks by the
/// scan line (`intel_pipe_update_start`: it waits when less than 100 µs remain); under an
/// emulated CPU its register updates take milliseconds, so the vGPU tells it to wait whenever a
/// vblank is less than this near (3 ms; i915 waits up to 4 ms before it complains).
pub const VBLANK_GUARD_TICKS: u64 = 3 * TIMESTAMP_HZ / 1000;

/// The registers whose reads the display clock changes (GEN9 offsets): each pipe's `PIPEDSL`,
/// `PIPE_FRMCOUNT` and `PIPE_FLIPCOUNT`, its CRC results (latched at its vblanks) and its DE
/// interrupt identity register, and `GEN8_MASTER_IRQ`, which sums those up. A vblank or
/// flip-done wait polls these; no other read sees the clock.
fn display_clock_registers() -> impl Iterator<Item = u32> {
    (0..3u32)
        .flat_map(|p| {
            let pipe = PIPE_STRIDE * p;
            [0x7_0000 + pipe, 0x7_0040 + pipe, 0x7_0044 + pipe]
                .into_iter()
                .chain((0..5).map(move |i| crc::PIPE_CRC_RES_1_A + pipe + 4 * i))
                .chain([DE_PIPE_IIR_A + 0x10 * p])
        })
        .chain([crate::regs::irq::MASTER_IRQ])
}

/// Whether a BAR0 read of `len` bytes at `offset` reads a register whose value the display
/// clock changes: whoever runs the vGPU ticks the clock to now before such a read, so that it
/// reads the time of the read (i915 dates each vblank from the scan line it reads), and can
/// leave the clock alone before any other.
pub fn reads_display_clock(offset: u64, len: usize) -> bool {
    let end = offset.saturating_add(len as u64);
    display_clock_registers().any(|r| u64::from(r) < end && offset < u64::from(r) + 4)
}

/// `DP_AUX_CH_CTL` bits.
const AUX_SEND_BUSY: u32 = 1 << 31;
const AUX_DONE: u32 = 1 << 30;
const AUX_TIME_OUT_ERROR: u32 = 1 << 28;
const AUX_RECEIVE_ERROR: u32 = 1 << 25;
const AUX_SIZE_SHIFT: u32 = 20;
const AUX_SIZE_MASK: u32 = 0x1f << AUX_SIZE_SHIFT;
/// Bytes of the AUX data registers.
const AUX_DATA_BYTES: usize = 20;

impl Vgpu {
    /// The display state.
    pub fn display(&self) -> &DisplayState {
        &self.display
    }

    /// Connects a monitor of `res` to port D, or removes it (`None`). A guest sees the change
    /// when it next probes the port (the vGPU sends no hot-plug interrupt).
    pub fn set_monitor(&mut self, res: Option<Resolution>) {
        self.display.monitor = res;
    }

    /// Advances the display clock to `now` (12 MHz ticks): counts the vblanks due on every
    /// enabled pipe, completes armed flips and raises the DE pipe interrupts. A clock that goes
    /// back (another host's) counts nothing until it passes the last vblank.
    pub fn display_tick(&mut self, now: u64) {
        let period = self.display.frame_period();
        for p in 0..3 {
            let on = self.reg_value(PIPECONF_A + PIPE_STRIDE * p as u32) & PIPECONF_ENABLE != 0;
            let st = &mut self.display.pipes[p];
            if on != st.on {
                st.on = on;
                if on {
                    st.last_vblank = now;
                }
            }
            if !on || now <= st.last_vblank {
                continue;
            }
            let n = (now - st.last_vblank) / period;
            if n == 0 {
                continue;
            }
            st.frames = st.frames.wrapping_add(n as u32);
            st.last_vblank += n * period;
            let mut events = PIPE_VBLANK;
            if st.flip_pending {
                st.flip_pending = false;
                st.flips = st.flips.wrapping_add(1);
                events |= PIPE_FLIP_DONE;
            }
            if self.pipe_crc_enabled(p) {
                self.latch_pipe_crc(p);
                events |= crc::PIPE_CRC_DONE;
            }
            self.raise_de_pipe_irq(p, events);
        }
        self.display.clock = self.display.clock.max(now);
    }

    /// When the next vblank falls on an enabled pipe (display clock ticks), `None` when no pipe
    /// is on.
    pub fn next_vblank(&self) -> Option<u64> {
        let period = self.display.frame_period();
        self.display
            .pipes
            .iter()
            .filter(|p| p.on)
            .map(|p| p.last_vblank + period)
            .min()
    }

    /// Whether a pipe is enabled (the vGPU then needs display ticks to count its vblanks).
    pub fn display_active(&self) -> bool {
        (0..3u32).any(|p| self.reg_value(PIPECONF_A + PIPE_STRIDE * p) & PIPECONF_ENABLE != 0)
    }

    /// Pipe `pipe`'s DE interrupt `bits`: latched in its IIR unless masked, an interrupt when
    /// enabled.
    fn raise_de_pipe_irq(&mut self, pipe: usize, bits: u32) {
        let iir_off = DE_PIPE_IIR_A + 0x10 * pipe as u32;
        let latch = bits & !self.reg_value(iir_off - 4);
        if latch == 0 {
            return;
        }
        let iir = self.reg_value(iir_off);
        self.vregs.insert(iir_off, iir | latch);
        let ier = self.reg_value(iir_off + 4);
        self.irq_line_check(latch & ier);
    }

    /// The DE pipe bits of `GEN8_MASTER_IRQ`: a pipe's bit is set while its IIR holds an
    /// enabled bit.
    pub(crate) fn de_irq_summary(&self) -> u32 {
        (0..3u32)
            .filter(|&p| {
                let iir = DE_PIPE_IIR_A + 0x10 * p;
                self.reg_value(iir) & self.reg_value(iir + 4) != 0
            })
            .fold(0, |a, p| a | (MASTER_DE_PIPE_A << p))
    }

    /// What a display handler's register reads (`stored`: its stored value or reset value).
    pub(crate) fn display_read(&self, h: Handler, offset: u32, stored: u32) -> u32 {
        match h {
            Handler::Monitor { bits } if self.display.monitor.is_some() => stored | bits,
            Handler::DpllStatus => DPLL_ENABLE_REGS
                .iter()
                .enumerate()
                .filter(|(_, &r)| self.reg_value(r) & (1 << 31) != 0)
                .fold(0, |a, (id, _)| a | (1 << (8 * id))),
            Handler::PipeCounter(kind) => {
                let st = &self.display.pipes[pipe_of(offset)];
                match kind {
                    PipeCounterKind::Frames => st.frames,
                    PipeCounterKind::Flips => st.flips,
                    PipeCounterKind::ScanLine => self.scan_line(st),
                }
            }
            _ => stored,
        }
    }

    /// `PIPEDSL`: the line the pipe scans at the display clock; the last active line less one
    /// while a vblank is near (see [`VBLANK_GUARD_TICKS`]).
    fn scan_line(&self, st: &PipeState) -> u32 {
        if !st.on {
            return 0;
        }
        let mode = self.display.mode();
        let period = self.display.frame_period();
        let (vactive, vtotal) = (u32::from(mode.vactive), mode.vtotal());
        let phase = self.display.clock.saturating_sub(st.last_vblank) % period;
        if period - phase < VBLANK_GUARD_TICKS {
            return vactive.saturating_sub(2);
        }
        let line = (u128::from(phase) * u128::from(vtotal) / u128::from(period)) as u32;
        (vactive + line) % vtotal.max(1)
    }

    /// A write to a display handler's register other than the AUX control: the value stored.
    pub(crate) fn display_write(&mut self, h: Handler, offset: u32, merged: u32) -> u32 {
        match h {
            Handler::DdiBufCtl => {
                let idle = if merged & DDI_BUF_ENABLE == 0 {
                    DDI_BUF_IDLE
                } else {
                    0
                };
                (merged & !DDI_BUF_IDLE) | idle
            }
            Handler::PlaneSurf => {
                self.display.pipes[pipe_of(offset)].flip_pending = true;
                merged
            }
            _ => merged,
        }
    }

    /// An AUX transaction started on the channel of `offset` (`ctl`: the control value written
    /// with `SEND_BUSY`): the control value after it. The monitor's channel answers from the
    /// monitor; any other channel (or no monitor) times out, as a port with no sink does.
    pub(crate) fn aux_transaction(&mut self, offset: u32, ctl: u32) -> u32 {
        let done = ctl & !(AUX_SEND_BUSY | AUX_DONE | AUX_TIME_OUT_ERROR | AUX_RECEIVE_ERROR);
        let Some(res) = self.display.monitor else {
            return done | AUX_DONE | AUX_TIME_OUT_ERROR;
        };
        if aux_channel_of(offset) != MONITOR_AUX_CHANNEL {
            return done | AUX_DONE | AUX_TIME_OUT_ERROR;
        }
        let size = ((ctl & AUX_SIZE_MASK) >> AUX_SIZE_SHIFT) as usize;
        if size == 0 || size > AUX_DATA_BYTES {
            return done | AUX_DONE | AUX_RECEIVE_ERROR;
        }
        let mut req = [0u8; AUX_DATA_BYTES];
        for (i, b) in req.iter_mut().enumerate() {
            let reg = self.reg_value(offset + 4 + 4 * (i as u32 / 4));
            *b = (reg >> (24 - 8 * (i % 4))) as u8;
        }
        let edid = aux::edid_for(res);
        let Ok(reply) = self.display.aux.transaction(&req[..size], &edid) else {
            return done | AUX_DONE | AUX_RECEIVE_ERROR;
        };
        let mut out = [0u8; AUX_DATA_BYTES];
        let n = reply.len().min(AUX_DATA_BYTES);
        out[..n].copy_from_slice(&reply[..n]);
        for (i, chunk) in out.chunks(4).enumerate() {
            let v = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            self.vregs.insert(offset + 4 + 4 * i as u32, v);
        }
        (done & !AUX_SIZE_MASK) | AUX_DONE | ((n as u32) << AUX_SIZE_SHIFT)
    }
}
