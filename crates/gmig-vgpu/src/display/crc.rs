//! The pipe CRC, which i915 offers as `debugfs/dri/0/crtc-N/crc` and IGT's display tests read to
//! compare what two framebuffers put on the screen.
//!
//! On Skylake the guest enables it in `PIPE_CRC_CTL` (any source: the vGPU has one plane that
//! scans out, so every source sees the same picture); at each vblank of that pipe the display
//! engine then latches five result words (`PIPE_CRC_RES_1..5`) and raises `CDCLK_CRC_DONE` in the
//! pipe's DE interrupt register, and i915's handler reads the words. Hardware's CRC polynomial is
//! not documented; what i915 and IGT rely on is that the words are a function of the pixels the
//! pipe sends, equal for equal pictures and different for different ones. The vGPU latches the
//! 128-bit XXH3 of the scanned-out frame (its size and its `0x00RRGGBB` pixels, whatever the
//! framebuffer's format or tiling) in words 1–4 and its CRC-32 in word 5; a pipe whose plane is
//! off or cannot be scanned out sends black, hashed as a frame of its source size
//! (`PIPESRC`) of zero pixels.

use super::plane::Frame;
use crate::regs::display::{PIPESRC_A, PIPE_STRIDE};
use crate::vgpu::Vgpu;

/// `PIPE_CRC_CTL(A)` (the transcoder's register; pipes B and C at `PIPE_STRIDE` steps).
pub const PIPE_CRC_CTL_A: u32 = 0x6_0050;
/// `PIPE_CRC_RES_1_IVB(A)`; results 2–5 follow at 4-byte steps.
pub const PIPE_CRC_RES_1_A: u32 = 0x6_0064;
/// `PIPE_CRC_ENABLE` in `PIPE_CRC_CTL`.
pub const PIPE_CRC_ENABLE: u32 = 1 << 31;
/// `GEN8_PIPE_CDCLK_CRC_DONE` in the DE pipe interrupt registers.
pub const PIPE_CRC_DONE: u32 = 1 << 28;

/// The five result words for `frame`.
pub fn crc_words(frame: &Frame) -> [u32; 5] {
    let mut bytes = Vec::with_capacity(8 + frame.pixels.len() * 4);
    bytes.extend_from_slice(&frame.width.to_le_bytes());
    bytes.extend_from_slice(&frame.height.to_le_bytes());
    bytes.extend(
        frame
            .pixels
            .iter()
            .flat_map(|p| (p & 0x00ff_ffff).to_le_bytes()),
    );
    let h = xxhash_rust::xxh3::xxh3_128(&bytes);
    [
        h as u32,
        (h >> 32) as u32,
        (h >> 64) as u32,
        (h >> 96) as u32,
        crc32fast::hash(&bytes),
    ]
}

impl Vgpu {
    /// Whether the guest has the CRC of `pipe` on.
    pub(crate) fn pipe_crc_enabled(&self, pipe: usize) -> bool {
        self.reg_value(PIPE_CRC_CTL_A + PIPE_STRIDE * pipe as u32) & PIPE_CRC_ENABLE != 0
    }

    /// Latches the CRC of what `pipe` scans out now into its result registers.
    pub(crate) fn latch_pipe_crc(&mut self, pipe: usize) {
        let frame = self.scan_out(pipe).unwrap_or_else(|_| {
            let src = self.reg_value(PIPESRC_A + PIPE_STRIDE * pipe as u32);
            let (width, height) = (((src >> 16) & 0x1fff) + 1, (src & 0x1fff) + 1);
            Frame {
                width,
                height,
                pixels: vec![0; width as usize * height as usize],
            }
        });
        let base = PIPE_CRC_RES_1_A + PIPE_STRIDE * pipe as u32;
        for (i, w) in crc_words(&frame).into_iter().enumerate() {
            self.vregs.insert(base + 4 * i as u32, w);
        }
    }
}
