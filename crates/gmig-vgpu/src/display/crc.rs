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

/// Pixels hashed per step: the bytes of one step sit in a buffer on the stack.
const CHUNK_PIXELS: usize = 1024;

/// The five result words for `frame`.
pub fn crc_words(frame: &Frame) -> [u32; 5] {
    words_of(frame.width, frame.height, frame.pixels.chunks(CHUNK_PIXELS))
}

/// The five result words for a black frame of `width` x `height`, without the frame.
pub(super) fn black_words(width: u32, height: u32) -> [u32; 5] {
    let zeros = [0u32; CHUNK_PIXELS];
    let n = width as usize * height as usize;
    let chunks = (0..n)
        .step_by(CHUNK_PIXELS)
        .map(|at| &zeros[..(n - at).min(CHUNK_PIXELS)]);
    words_of(width, height, chunks)
}

/// The result words of the bytes a frame of `width` x `height` hashes as (its size, then its
/// pixels in `0x00RRGGBB` little-endian), the pixels given in pieces and hashed as they come:
/// no copy of the frame is made.
fn words_of<'a>(width: u32, height: u32, pixels: impl Iterator<Item = &'a [u32]>) -> [u32; 5] {
    let mut xxh = xxhash_rust::xxh3::Xxh3::new();
    let mut crc = crc32fast::Hasher::new();
    let mut head = [0u8; 8];
    head[..4].copy_from_slice(&width.to_le_bytes());
    head[4..].copy_from_slice(&height.to_le_bytes());
    xxh.update(&head);
    crc.update(&head);
    let mut buf = [0u8; 4 * CHUNK_PIXELS];
    for chunk in pixels {
        for piece in chunk.chunks(CHUNK_PIXELS) {
            let bytes = &mut buf[..4 * piece.len()];
            for (b, p) in bytes.chunks_exact_mut(4).zip(piece) {
                b.copy_from_slice(&(p & 0x00ff_ffff).to_le_bytes());
            }
            xxh.update(bytes);
            crc.update(bytes);
        }
    }
    let h = xxh.digest128();
    [
        h as u32,
        (h >> 32) as u32,
        (h >> 64) as u32,
        (h >> 96) as u32,
        crc.finalize(),
    ]
}

impl Vgpu {
    /// Whether the guest has the CRC of `pipe` on.
    pub(crate) fn pipe_crc_enabled(&self, pipe: usize) -> bool {
        self.reg_value(PIPE_CRC_CTL_A + PIPE_STRIDE * pipe as u32) & PIPE_CRC_ENABLE != 0
    }

    /// Latches the CRC of what `pipe` scans out now into its result registers.
    pub(crate) fn latch_pipe_crc(&mut self, pipe: usize) {
        let words = match self.scan_out(pipe) {
            Ok(frame) => crc_words(&frame),
            Err(_) => {
                let src = self.reg_value(PIPESRC_A + PIPE_STRIDE * pipe as u32);
                black_words(((src >> 16) & 0x1fff) + 1, (src & 0x1fff) + 1)
            }
        };
        let base = PIPE_CRC_RES_1_A + PIPE_STRIDE * pipe as u32;
        for (i, w) in words.into_iter().enumerate() {
            self.vregs.insert(base + 4 * i as u32, w);
        }
    }
}
