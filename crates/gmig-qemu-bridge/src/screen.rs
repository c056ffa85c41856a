//! The guest's screen for people who run no display: while a pipe scans out, the server reads
//! the vGPU's primary plane of pipe A ([`gmig_vgpu::Vgpu::scan_out`]) at most every
//! [`Screen::INTERVAL`] and, when it changed, writes it as a PNG (8-bit RGB) to a path, through
//! a temporary file and a rename, so a reader never sees half a picture.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gmig_vgpu::display::plane::Frame;
use gmig_vgpu::Vgpu;

/// Where the screen goes and what was written last.
#[derive(Debug)]
pub struct Screen {
    path: PathBuf,
    last_look: Option<Instant>,
    last: Option<(u32, u32, u64)>,
    written: u64,
}

impl Screen {
    /// How often the plane is looked at, at most.
    pub const INTERVAL: Duration = Duration::from_millis(100);

    /// Screens written to `path`.
    pub fn new(path: PathBuf) -> Screen {
        Screen {
            path,
            last_look: None,
            last: None,
            written: 0,
        }
    }

    /// Pictures written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Looks at the plane if [`Screen::INTERVAL`] has passed; writes it when it changed. A
    /// plane that cannot be scanned out (disabled, unmapped) leaves the last picture.
    pub fn look(&mut self, vgpu: &Vgpu) {
        let now = Instant::now();
        if self
            .last_look
            .is_some_and(|t| now.duration_since(t) < Self::INTERVAL)
        {
            return;
        }
        self.last_look = Some(now);
        let Ok(frame) = vgpu.scan_out(0) else {
            return;
        };
        let key = (frame.width, frame.height, fingerprint(&frame));
        if self.last == Some(key) {
            return;
        }
        match write_png(&frame, &self.path) {
            Ok(()) => {
                self.last = Some(key);
                self.written += 1;
            }
            Err(e) => tracing::warn!(%e, path = %self.path.display(), "writing the screen"),
        }
    }
}

fn fingerprint(frame: &Frame) -> u64 {
    frame.pixels.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, p| {
        (h ^ u64::from(*p)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Writes `frame` to `path` as an 8-bit RGB PNG (through `path.tmp` and a rename).
pub fn write_png(frame: &Frame, path: &Path) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let file = io::BufWriter::new(std::fs::File::create(&tmp)?);
        let mut enc = png::Encoder::new(file, frame.width, frame.height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        enc.set_compression(png::Compression::Fast);
        let mut w = enc.write_header().map_err(io::Error::other)?;
        w.write_image_data(&frame.rgb_bytes())
            .map_err(io::Error::other)?;
        w.finish().map_err(io::Error::other)?;
    }
    std::fs::rename(&tmp, path)
}
