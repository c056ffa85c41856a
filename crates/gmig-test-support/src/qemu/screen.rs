//! The guest's screen as tests see it: `gmig-kms-draw`'s known images, the PNG that `gmig serve
//! --screen` writes, and QMP `screendump` of a QEMU whose `vfio-user-pci` has `display=on`
//! (gmig's QEMU patch 0006), read back as `0x00RRGGBB` pixels.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Vm;

/// A picture: width, height, `0x00RRGGBB` pixels row after row.
pub type Picture = (u32, u32, Vec<u32>);

/// `gmig-kms-draw`'s image `k` at `w` x `h`, `0x00RRGGBB` (the recipe of
/// `crates/gmig-vmm/guest/kms.c`, written again).
pub fn kms_image(w: u32, h: u32, k: u32) -> Vec<u32> {
    let mut v = Vec::with_capacity((w * h) as usize);
    for y in 0..h {
        for x in 0..w {
            v.push(
                ((x * 255 / (w - 1)) << 16)
                    | ((y * 255 / (h - 1)) << 8)
                    | ((x ^ y ^ (0x55 * k)) & 0xff),
            );
        }
    }
    v
}

/// A PNG's size and pixels, read with the `png` crate; `None` while it is not (yet) a whole
/// 8-bit RGB picture.
pub fn read_png(path: &Path) -> Option<Picture> {
    let file = std::fs::File::open(path).ok()?;
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .ok()?;
    let mut buf = vec![0; reader.output_buffer_size()?];
    let info = reader.next_frame(&mut buf).ok()?;
    if info.color_type != png::ColorType::Rgb || info.bit_depth != png::BitDepth::Eight {
        return None;
    }
    let px = buf[..info.buffer_size()]
        .chunks(3)
        .map(|c| (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]))
        .collect();
    Some((info.width, info.height, px))
}

/// Writes a picture as an 8-bit RGB PNG.
pub fn write_png(path: &Path, (w, h, px): &Picture) -> std::io::Result<()> {
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut enc = png::Encoder::new(file, *w, *h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header().map_err(std::io::Error::other)?;
    let rgb: Vec<u8> = px
        .iter()
        .flat_map(|p| [(p >> 16) as u8, (p >> 8) as u8, *p as u8])
        .collect();
    wr.write_image_data(&rgb).map_err(std::io::Error::other)?;
    wr.finish().map_err(std::io::Error::other)
}

/// Polls `path` (the server looks at the plane every 100 ms; `limit` is a bound far above that)
/// until it holds `want`; the last picture read.
pub fn wait_png(path: &Path, want: &[u32], limit: Duration) -> Option<Picture> {
    let t = Instant::now();
    let mut seen = None;
    while t.elapsed() < limit {
        seen = read_png(path);
        if seen.as_ref().is_some_and(|(_, _, p)| p == want) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    seen
}

/// A binary PPM (`P6`, maxval 255, what QEMU's `screendump` writes by default).
pub fn read_ppm(bytes: &[u8]) -> Result<Picture, String> {
    // Header: "P6", width, height, maxval, separated by whitespace, then one whitespace byte.
    let mut fields = Vec::new();
    let mut at = 0;
    while fields.len() < 4 {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        let start = at;
        while at < bytes.len() && !bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        if start == at {
            return Err("PPM header ends early".into());
        }
        fields.push(String::from_utf8_lossy(&bytes[start..at]).into_owned());
    }
    if fields[0] != "P6" || fields[3] != "255" {
        return Err(format!("not an 8-bit P6 PPM: {fields:?}"));
    }
    let num = |s: &str| s.parse::<u32>().map_err(|e| format!("PPM size {s}: {e}"));
    let (w, h) = (num(&fields[1])?, num(&fields[2])?);
    let data = bytes.get(at + 1..).ok_or("PPM without pixels")?;
    let n = (w as usize) * (h as usize);
    if data.len() != 3 * n {
        return Err(format!("PPM {w}x{h} has {} bytes of pixels", data.len()));
    }
    let px = data
        .chunks(3)
        .map(|c| (u32::from(c[0]) << 16) | (u32::from(c[1]) << 8) | u32::from(c[2]))
        .collect();
    Ok((w, h, px))
}

/// QMP `screendump` of `vm`'s first graphic console into `path` (PPM), read back; `Err` with
/// QEMU's answer when it refuses (no graphic console: `display` off).
pub fn screendump(vm: &mut Vm, path: &Path) -> Result<Picture, String> {
    let _ = std::fs::remove_file(path);
    let cmd = serde_json::json!({
        "execute": "screendump",
        "arguments": {"filename": path.to_string_lossy()},
    });
    let mut events = Vec::new();
    let answer = vm.qmp(&cmd.to_string(), &mut events)?;
    if !answer.contains("\"return\"") {
        return Err(answer);
    }
    read_ppm(&std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?)
}

/// Whether `qemu`'s `vfio-user-pci` has the `display` property (gmig's QEMU patch 0006); says
/// loudly that the display checks skip when it has not.
pub fn qemu_has_display(qemu: &Path) -> bool {
    let out = Command::new(qemu)
        .args(["-device", "vfio-user-pci,help"])
        .stdin(Stdio::null())
        .output();
    let has = out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("display="));
    if !has {
        eprintln!(
            "SKIPPED (display checks): {} has no vfio-user-pci display property \
             (integrations/qemu/patches/0006 not applied)",
            qemu.display()
        );
    }
    has
}
