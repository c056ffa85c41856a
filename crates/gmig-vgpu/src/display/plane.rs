//! Scan-out of a pipe's primary plane (universal plane 1) into pixels, as the display engine
//! reads it: `PLANE_CTL` (enable, pixel format, tiling), `PLANE_SURF` (its host-side shadow: the
//! GGTT address the hardware uses, remapped after a migration), `PLANE_STRIDE`, `PLANE_SIZE`
//! and `PLANE_OFFSET`, the surface read through the GGTT from guest RAM.
//!
//! Formats: 32-bit XRGB/XBGR 8:8:8:8 (what i915 uses for fbcon and for dumb buffers at depth
//! 24) and RGB 5:6:5. Tilings: linear, X (512 bytes x 8 rows per 4 KiB tile) and legacy Y
//! (128 bytes x 32 rows of 16-byte columns), without bit-6 swizzling (the vGPU's fences do
//! none either). Rotation, scaling and the other planes are not scanned out.

use crate::gtt::{GttError, Space};
use crate::regs::display::{
    PIPE_STRIDE, PLANE_CTL_A, PLANE_OFFSET_A, PLANE_SIZE_A, PLANE_STRIDE_A, PLANE_SURF_A,
};
use crate::vgpu::Vgpu;

/// `PLANE_CTL_ENABLE`.
const PLANE_ENABLE: u32 = 1 << 31;
/// `PLANE_CTL_FORMAT_MASK` (bits 27:24) and the formats read.
const FORMAT_SHIFT: u32 = 24;
const FORMAT_XRGB_8888: u32 = 0x4;
const FORMAT_RGB_565: u32 = 0xe;
/// `PLANE_CTL_ORDER_RGBX`: red in the low byte.
const ORDER_RGBX: u32 = 1 << 20;
/// `PLANE_CTL_TILED_MASK` (bits 12:10).
const TILING_SHIFT: u32 = 10;
/// The largest plane scanned out (GEN9's limit: 8192 x 4096).
const MAX_WIDTH: u32 = 8192;
const MAX_HEIGHT: u32 = 4096;

/// A scanned-out frame: `width` x `height` pixels, each `0x00RRGGBB`, row after row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// `0x00RRGGBB` per pixel.
    pub pixels: Vec<u32>,
}

impl Frame {
    /// The pixels as 8-bit RGB triples, row after row (what a PNG encoder takes).
    pub fn rgb_bytes(&self) -> Vec<u8> {
        self.pixels
            .iter()
            .flat_map(|p| [(p >> 16) as u8, (p >> 8) as u8, *p as u8])
            .collect()
    }
}

/// Why a plane cannot be scanned out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlaneError {
    /// No such pipe.
    #[error("no pipe {0}")]
    NoPipe(usize),
    /// The plane is disabled.
    #[error("the primary plane of pipe {0} is disabled")]
    Disabled(usize),
    /// A pixel format the scan-out does not read.
    #[error("pixel format {0:#x} (PLANE_CTL bits 27:24) is not scanned out")]
    Format(u32),
    /// A tiling the scan-out does not read.
    #[error("tiling {0} (PLANE_CTL bits 12:10) is not scanned out")]
    Tiling(u32),
    /// Size or stride out of range.
    #[error("plane of {width}x{height}, stride {stride} bytes, is out of range")]
    Geometry {
        /// Width.
        width: u32,
        /// Height.
        height: u32,
        /// Bytes per row.
        stride: u32,
    },
    /// The surface is not mapped in the GGTT.
    #[error("surface: {0}")]
    Memory(#[from] GttError),
}

#[derive(Clone, Copy)]
enum Tiling {
    Linear,
    X,
    Y,
}

impl Vgpu {
    /// The primary plane of `pipe` (0 = A) as the display engine scans it out now.
    pub fn scan_out(&self, pipe: usize) -> Result<Frame, PlaneError> {
        if pipe >= 3 {
            return Err(PlaneError::NoPipe(pipe));
        }
        let at = |base: u32| self.reg_value(base + PIPE_STRIDE * pipe as u32);
        let ctl = at(PLANE_CTL_A);
        if ctl & PLANE_ENABLE == 0 {
            return Err(PlaneError::Disabled(pipe));
        }
        let format = (ctl >> FORMAT_SHIFT) & 0xf;
        let bpp = match format {
            FORMAT_XRGB_8888 => 4,
            FORMAT_RGB_565 => 2,
            f => return Err(PlaneError::Format(f)),
        };
        let tiling = match (ctl >> TILING_SHIFT) & 0x7 {
            0 => Tiling::Linear,
            1 => Tiling::X,
            4 => Tiling::Y,
            t => return Err(PlaneError::Tiling(t)),
        };
        let size = at(PLANE_SIZE_A);
        let (width, height) = ((size & 0x1fff) + 1, ((size >> 16) & 0x1fff) + 1);
        let stride_units = at(PLANE_STRIDE_A) & 0x3ff;
        let stride = stride_units
            * match tiling {
                Tiling::Linear => 64,
                Tiling::X => 512,
                Tiling::Y => 128,
            };
        let offset = at(PLANE_OFFSET_A);
        let (x0, y0) = (offset & 0x1fff, (offset >> 16) & 0xfff);
        let geometry = PlaneError::Geometry {
            width,
            height,
            stride,
        };
        if width > MAX_WIDTH || height > MAX_HEIGHT || (x0 + width) * bpp > stride || stride == 0 {
            return Err(geometry);
        }
        let surf_reg = PLANE_SURF_A + PIPE_STRIDE * pipe as u32;
        let surf = u64::from(
            self.shadow_reg(surf_reg)
                .unwrap_or_else(|| self.reg_value(surf_reg))
                & 0xffff_f000,
        );
        let rows = match tiling {
            Tiling::Linear => y0 + height,
            Tiling::X => (y0 + height).div_ceil(8) * 8,
            Tiling::Y => (y0 + height).div_ceil(32) * 32,
        };
        let mut mem = vec![0u8; (stride as usize) * rows as usize];
        self.host_view(None).read(Space::Ggtt, surf, &mut mem)?;
        let order_rgbx = ctl & ORDER_RGBX != 0;
        let mut pixels = Vec::with_capacity((width * height) as usize);
        if let (Tiling::Linear, 4, false) = (tiling, bpp, order_rgbx) {
            // The common case (fbcon, dumb buffers, IGT's framebuffers), row by row: the pipe
            // CRC scans out every frame, in unoptimised test builds too.
            for y in y0..y0 + height {
                let start = (y * stride + x0 * 4) as usize;
                let row = &mem[start..start + width as usize * 4];
                pixels.extend(
                    row.chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x00ff_ffff),
                );
            }
            return Ok(Frame {
                width,
                height,
                pixels,
            });
        }
        for y in y0..y0 + height {
            for x in x0..x0 + width {
                let o = byte_offset(tiling, stride, x * bpp, y);
                let px = if bpp == 4 {
                    let v = u32::from_le_bytes([mem[o], mem[o + 1], mem[o + 2], mem[o + 3]]);
                    if order_rgbx {
                        ((v & 0xff) << 16) | (v & 0xff00) | ((v >> 16) & 0xff)
                    } else {
                        v & 0x00ff_ffff
                    }
                } else {
                    let v = u32::from(u16::from_le_bytes([mem[o], mem[o + 1]]));
                    let (r, g, b) = ((v >> 11) & 0x1f, (v >> 5) & 0x3f, v & 0x1f);
                    ((r << 3 | r >> 2) << 16) | ((g << 2 | g >> 4) << 8) | (b << 3 | b >> 2)
                };
                pixels.push(px);
            }
        }
        Ok(Frame {
            width,
            height,
            pixels,
        })
    }
}

/// Where byte `xb` of row `y` lies in a surface of `stride` bytes per row.
fn byte_offset(tiling: Tiling, stride: u32, xb: u32, y: u32) -> usize {
    let (s, xb, y) = (stride as usize, xb as usize, y as usize);
    match tiling {
        Tiling::Linear => y * s + xb,
        Tiling::X => {
            let tile = (y / 8) * (s / 512) + xb / 512;
            tile * 4096 + (y % 8) * 512 + xb % 512
        }
        Tiling::Y => {
            let tile = (y / 32) * (s / 128) + xb / 128;
            tile * 4096 + ((xb % 128) / 16) * 512 + (y % 32) * 16 + xb % 16
        }
    }
}
