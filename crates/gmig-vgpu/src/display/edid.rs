//! The virtual monitor's EDID (VESA E-EDID 1.4, one 128-byte block), generated from the vGPU
//! type's resolution, and its mode: the timings i915 reads from the EDID's first detailed timing
//! descriptor and programs into the pipe, from which the vGPU's vblank rate follows.
//!
//! 1024x768 uses VESA DMT's 60 Hz timing (65 MHz), 1920x1200 DMT's reduced-blanking 60 Hz
//! timing (154 MHz), as GVT-g's two EDIDs do; any other size gets CVT reduced-blanking timings.

use serde::{Deserialize, Serialize};

/// Bytes of an EDID block.
pub const EDID_LEN: usize = 128;

/// The EDID header.
pub const EDID_HEADER: [u8; 8] = [0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00];

/// A display resolution in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resolution {
    /// Width.
    pub width: u16,
    /// Height.
    pub height: u16,
}

impl Resolution {
    /// GVT-g's resolution of the smallest vGPU types.
    pub const XGA: Resolution = Resolution {
        width: 1024,
        height: 768,
    };
    /// GVT-g's resolution of the larger vGPU types.
    pub const WUXGA: Resolution = Resolution {
        width: 1920,
        height: 1200,
    };
}

impl std::fmt::Display for Resolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.width, self.height)
    }
}

/// A display mode's timings (what an EDID detailed timing descriptor carries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    /// Pixel clock in kHz (a multiple of 10).
    pub clock_khz: u32,
    /// Active pixels per line.
    pub hactive: u16,
    /// Blanking pixels per line.
    pub hblank: u16,
    /// Pixels from the end of the active area to horizontal sync.
    pub hsync_offset: u16,
    /// Horizontal sync width.
    pub hsync_width: u16,
    /// Active lines.
    pub vactive: u16,
    /// Blanking lines.
    pub vblank: u16,
    /// Lines from the end of the active area to vertical sync.
    pub vsync_offset: u16,
    /// Vertical sync width.
    pub vsync_width: u16,
    /// Horizontal sync is positive.
    pub hsync_positive: bool,
    /// Vertical sync is positive.
    pub vsync_positive: bool,
}

impl Mode {
    /// The mode the monitor prefers at `res`.
    pub fn for_resolution(res: Resolution) -> Mode {
        match (res.width, res.height) {
            // VESA DMT 1024x768 at 60 Hz.
            (1024, 768) => Mode {
                clock_khz: 65_000,
                hactive: 1024,
                hblank: 320,
                hsync_offset: 24,
                hsync_width: 136,
                vactive: 768,
                vblank: 38,
                vsync_offset: 3,
                vsync_width: 6,
                hsync_positive: false,
                vsync_positive: false,
            },
            _ => Mode::cvt_reduced_blanking(res),
        }
    }

    /// CVT reduced-blanking timings at 60 Hz (VESA DMT's 1920x1200 RB mode is one of them):
    /// 160 pixels of horizontal blanking, at least 460 µs of vertical blanking, the pixel clock
    /// in 250 kHz steps.
    fn cvt_reduced_blanking(res: Resolution) -> Mode {
        let (w, h) = (u64::from(res.width), u64::from(res.height));
        let htotal = w + 160;
        // Line period estimate (ns) from the 60 Hz frame less the minimum blanking.
        let line_ns = (1_000_000_000 / 60 - 460_000) / h.max(1);
        let vblank = (460_000u64.div_ceil(line_ns.max(1))).max(3 + 6 + 6);
        let vtotal = h + vblank;
        let clock_khz = (htotal * vtotal * 60 / 1000) / 250 * 250;
        Mode {
            clock_khz: clock_khz as u32,
            hactive: res.width,
            hblank: 160,
            hsync_offset: 48,
            hsync_width: 32,
            vactive: res.height,
            vblank: vblank as u16,
            vsync_offset: 3,
            vsync_width: 6,
            hsync_positive: true,
            vsync_positive: false,
        }
    }

    /// Pixels per line, blanking included.
    pub fn htotal(&self) -> u32 {
        u32::from(self.hactive) + u32::from(self.hblank)
    }

    /// Lines per frame, blanking included.
    pub fn vtotal(&self) -> u32 {
        u32::from(self.vactive) + u32::from(self.vblank)
    }

    /// One frame in `hz` ticks of a clock (at least 1).
    pub fn frame_period(&self, hz: u64) -> u64 {
        let pixels = u64::from(self.htotal()) * u64::from(self.vtotal());
        (pixels * hz / (u64::from(self.clock_khz.max(1)) * 1000)).max(1)
    }

    /// The 18-byte detailed timing descriptor.
    fn descriptor(&self) -> [u8; 18] {
        let (ha, hb, va, vb) = (self.hactive, self.hblank, self.vactive, self.vblank);
        let (hso, hsw, vso, vsw) = (
            self.hsync_offset,
            self.hsync_width,
            self.vsync_offset,
            self.vsync_width,
        );
        let clk = (self.clock_khz / 10) as u16;
        // Image size in mm at about 96 pixels per inch.
        let (wmm, hmm) = (mm(ha), mm(va));
        let lo = |v: u16| (v & 0xff) as u8;
        let hi4 = |v: u16| ((v >> 8) & 0xf) as u8;
        let mut flags = 0x18; // digital separate sync
        if self.vsync_positive {
            flags |= 0x04;
        }
        if self.hsync_positive {
            flags |= 0x02;
        }
        [
            lo(clk),
            (clk >> 8) as u8,
            lo(ha),
            lo(hb),
            (hi4(ha) << 4) | hi4(hb),
            lo(va),
            lo(vb),
            (hi4(va) << 4) | hi4(vb),
            lo(hso),
            lo(hsw),
            (((vso & 0xf) as u8) << 4) | (vsw & 0xf) as u8,
            ((((hso >> 8) & 3) as u8) << 6)
                | ((((hsw >> 8) & 3) as u8) << 4)
                | ((((vso >> 4) & 3) as u8) << 2)
                | ((vsw >> 4) & 3) as u8,
            lo(wmm),
            lo(hmm),
            (hi4(wmm) << 4) | hi4(hmm),
            0,
            0,
            flags,
        ]
    }
}

fn mm(pixels: u16) -> u16 {
    (u32::from(pixels) * 254 / 960) as u16
}

/// A display descriptor (`tag` 0xfc name, 0xfd range limits, 0xff serial) with `text`.
fn text_descriptor(tag: u8, text: &[u8]) -> [u8; 18] {
    let mut d = [0u8; 18];
    d[3] = tag;
    let mut body = [0x20u8; 13];
    let n = text.len().min(13);
    body[..n].copy_from_slice(&text[..n]);
    if n < 13 {
        body[n] = b'\n';
    }
    d[5..].copy_from_slice(&body);
    d
}

/// The EDID of a monitor whose preferred (and largest) mode is `res`'s.
pub fn generate(res: Resolution) -> [u8; EDID_LEN] {
    let mode = Mode::for_resolution(res);
    let mut e = [0u8; EDID_LEN];
    e[..8].copy_from_slice(&EDID_HEADER);
    // Manufacturer "GMG" (three 5-bit letters, big endian), product 0x4740, serial 1.
    let letter = |c: u8| u16::from(c - b'A' + 1);
    let id = (letter(b'G') << 10) | (letter(b'M') << 5) | letter(b'G');
    e[8..10].copy_from_slice(&id.to_be_bytes());
    e[10..12].copy_from_slice(&0x4740u16.to_le_bytes());
    e[12..16].copy_from_slice(&1u32.to_le_bytes());
    e[16] = 1; // week
    e[17] = (2026 - 1990) as u8;
    e[18] = 1; // EDID 1.4
    e[19] = 4;
    e[20] = 0xa5; // digital, 8 bits per colour, DisplayPort
    e[21] = (mm(res.width) / 10) as u8;
    e[22] = (mm(res.height) / 10) as u8;
    e[23] = 120; // gamma 2.2
    e[24] = 0x06; // RGB 4:4:4, sRGB default, preferred mode native
                  // sRGB chromaticity.
    e[25..35].copy_from_slice(&[0xee, 0x91, 0xa3, 0x54, 0x4c, 0x99, 0x26, 0x0f, 0x50, 0x54]);
    // Established timings that fit: 640x480, 800x600, 1024x768 at 60 Hz.
    if res.width >= 640 && res.height >= 480 {
        e[35] |= 0x20;
    }
    if res.width >= 800 && res.height >= 600 {
        e[35] |= 0x01;
    }
    if res.width >= 1024 && res.height >= 768 {
        e[36] |= 0x08;
    }
    // No standard timings.
    for i in 0..8 {
        e[38 + 2 * i] = 1;
        e[39 + 2 * i] = 1;
    }
    e[54..72].copy_from_slice(&mode.descriptor());
    // Range limits: 50-75 Hz vertical, 30-160 kHz horizontal, pixel clock up to 200 MHz.
    let mut range = [0u8; 18];
    range[3] = 0xfd;
    range[5..11].copy_from_slice(&[50, 75, 30, 160, 20, 0]);
    range[11] = b'\n';
    range[12..].fill(0x20);
    e[72..90].copy_from_slice(&range);
    e[90..108].copy_from_slice(&text_descriptor(0xfc, b"gmig vGPU"));
    e[108..126].copy_from_slice(&text_descriptor(0xff, format!("{res}").as_bytes()));
    e[126] = 0; // no extensions
    e[127] = checksum_byte(&e[..127]);
    e
}

/// The byte that makes `bytes` plus it sum to 0 modulo 256.
pub fn checksum_byte(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)))
}

/// Why an EDID block is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EdidError {
    /// Not 128 bytes.
    #[error("EDID block of {0} bytes, not 128")]
    Length(usize),
    /// The header is not 00 ff ff ff ff ff ff 00.
    #[error("bad EDID header")]
    Header,
    /// The bytes do not sum to 0.
    #[error("EDID checksum: bytes sum to {0:#04x}")]
    Checksum(u8),
    /// The first descriptor is not a detailed timing.
    #[error("the first descriptor is not a detailed timing")]
    NoTiming,
}

/// Checks an EDID block and reads its preferred mode (the first detailed timing descriptor).
pub fn parse_preferred(edid: &[u8]) -> Result<Mode, EdidError> {
    if edid.len() != EDID_LEN {
        return Err(EdidError::Length(edid.len()));
    }
    if edid[..8] != EDID_HEADER {
        return Err(EdidError::Header);
    }
    let sum = edid.iter().fold(0u8, |a, b| a.wrapping_add(*b));
    if sum != 0 {
        return Err(EdidError::Checksum(sum));
    }
    let d = &edid[54..72];
    let clk = u16::from_le_bytes([d[0], d[1]]);
    if clk == 0 {
        return Err(EdidError::NoTiming);
    }
    let w12 = |lo: u8, hi: u8| u16::from(lo) | (u16::from(hi & 0xf) << 8);
    Ok(Mode {
        clock_khz: u32::from(clk) * 10,
        hactive: w12(d[2], d[4] >> 4),
        hblank: w12(d[3], d[4]),
        hsync_offset: u16::from(d[8]) | (u16::from(d[11] >> 6) << 8),
        hsync_width: u16::from(d[9]) | (u16::from((d[11] >> 4) & 3) << 8),
        vactive: w12(d[5], d[7] >> 4),
        vblank: w12(d[6], d[7]),
        vsync_offset: u16::from(d[10] >> 4) | (u16::from((d[11] >> 2) & 3) << 4),
        vsync_width: u16::from(d[10] & 0xf) | (u16::from(d[11] & 3) << 4),
        hsync_positive: d[17] & 0x02 != 0,
        vsync_positive: d[17] & 0x04 != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_edids_checksum_and_carry_the_resolution_as_preferred_mode() {
        for res in [
            Resolution::XGA,
            Resolution::WUXGA,
            Resolution {
                width: 1280,
                height: 720,
            },
        ] {
            let e = generate(res);
            let m = parse_preferred(&e).unwrap();
            assert_eq!((m.hactive, m.vactive), (res.width, res.height), "{res}");
            assert_eq!(m, Mode::for_resolution(res), "{res}: round trip");
            let hz = m.clock_khz as f64 * 1000.0 / f64::from(m.htotal() * m.vtotal());
            assert!((59.5..60.5).contains(&hz), "{res}: {hz} Hz");
        }
    }

    #[test]
    fn the_larger_types_get_dmts_reduced_blanking_1920x1200() {
        // VESA DMT 1920x1200 RB: 154 MHz, 2080 x 1235 total.
        let m = Mode::for_resolution(Resolution::WUXGA);
        assert_eq!(m.clock_khz, 154_000);
        assert_eq!((m.htotal(), m.vtotal()), (2080, 1235));
        // 12 MHz ticks per frame: 2080 * 1235 / 154 MHz.
        assert_eq!(m.frame_period(12_000_000), 200_166);
    }

    #[test]
    fn a_corrupted_edid_is_refused() {
        let mut e = generate(Resolution::XGA);
        e[60] ^= 1;
        assert!(matches!(parse_preferred(&e), Err(EdidError::Checksum(_))));
        let mut e = generate(Resolution::XGA);
        e[0] = 1;
        assert_eq!(parse_preferred(&e), Err(EdidError::Header));
        assert_eq!(parse_preferred(&e[..100]), Err(EdidError::Length(100)));
    }
}
