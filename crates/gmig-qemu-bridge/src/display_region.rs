//! The guest's screen for a VMM's display (QEMU's `vfio-user-pci,display=on`): the vGPU's
//! primary plane of pipe A as a region-type graphics plane. The region (index
//! [`DisplayRegion::INDEX`], just past the PCI regions) is a memfd the client maps read-only;
//! at each GFX_PLANE query ([`crate::proto::FEATURE_GFX_PLANE`]) the server scans the plane out
//! ([`gmig_vgpu::Vgpu::scan_out`]) into it as XRGB8888 rows and answers with its size, so the
//! client reads the picture as of its query until it asks again.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

use gmig_vgpu::Vgpu;

use crate::proto::{GfxPlane, DRM_FORMAT_XRGB8888};

/// The region and its size.
#[derive(Debug)]
pub struct DisplayRegion {
    file: File,
    size: u64,
    too_large_logged: bool,
}

/// DRM's primary plane type.
pub const DRM_PLANE_TYPE_PRIMARY: u32 = 1;

impl DisplayRegion {
    /// The region's index: `VFIO_PCI_NUM_REGIONS` (BAR0–5, ROM, config space, VGA come first).
    pub const INDEX: u32 = 9;

    /// A region for planes of up to `width` x `height` XRGB8888 pixels (page-rounded).
    pub fn new(width: u32, height: u32) -> io::Result<DisplayRegion> {
        let size = (u64::from(width) * u64::from(height) * 4).next_multiple_of(4096);
        let name = CString::new("gmig-display").map_err(io::Error::other)?;
        // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size)?;
        Ok(DisplayRegion {
            file,
            size,
            too_large_logged: false,
        })
    }

    /// The memfd the client maps.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The region's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Reads `data.len()` bytes at `offset` (bounds checked by the server).
    pub fn read(&self, offset: u64, data: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(data, offset)
    }

    /// Scans pipe A's primary plane of `vgpu` into the region and describes it; a plane that is
    /// off or cannot be scanned out, or does not fit the region, is a plane of size 0 (nothing
    /// shown).
    pub fn fill(&mut self, vgpu: &Vgpu) -> GfxPlane {
        let none = Self::nothing();
        let Ok(frame) = vgpu.scan_out(0) else {
            return none;
        };
        let stride = u64::from(frame.width) * 4;
        let size = stride * u64::from(frame.height);
        if size > self.size || size == 0 {
            if !self.too_large_logged && size > 0 {
                tracing::warn!(
                    width = frame.width,
                    height = frame.height,
                    region = self.size,
                    "the plane does not fit the display region: not shown"
                );
                self.too_large_logged = true;
            }
            return none;
        }
        let bytes: Vec<u8> = frame.pixels.iter().flat_map(|p| p.to_le_bytes()).collect();
        if let Err(e) = self.file.write_all_at(&bytes, 0) {
            tracing::warn!(%e, "writing the display region");
            return none;
        }
        GfxPlane {
            drm_format: DRM_FORMAT_XRGB8888,
            width: frame.width,
            height: frame.height,
            stride: stride as u32,
            size: size as u32,
            ..none
        }
    }

    /// The answer while nothing is shown: a primary plane of size 0 in this region.
    pub fn nothing() -> GfxPlane {
        GfxPlane {
            region_index: Self::INDEX,
            ..GfxPlane::new(0, DRM_PLANE_TYPE_PRIMARY)
        }
    }
}
