//! The GFX_PLANE device feature (gmig's vfio-user extension, index 0x8001): the kernel's
//! `VFIO_DEVICE_QUERY_GFX_PLANE` for a region-type plane, answered by the device
//! ([`UserDevice::gfx_plane`]).

use super::device::UserDevice;
use super::state::Server;
use crate::proto::{
    Errno, Feature, GfxPlane, FEATURE_GET, FEATURE_PROBE, FEATURE_SET, GFX_PLANE_DMABUF,
    GFX_PLANE_PROBE, GFX_PLANE_REGION,
};

impl<D: UserDevice> Server<D> {
    /// GET with a [`GfxPlane`] request (argsz, flags, plane type) as data; the reply's data is the
    /// plane the device shows now (a PROBE's is the request). PROBE of the feature itself (no
    /// data) says whether the device has a display.
    pub(super) fn gfx_plane(&mut self, f: Feature, data: &[u8]) -> Result<Vec<u8>, Errno> {
        let ops = f.flags & (FEATURE_GET | FEATURE_SET | FEATURE_PROBE);
        if ops & FEATURE_PROBE != 0 {
            if ops & FEATURE_SET != 0 || self.device.gfx_plane(1, true).is_err() {
                return Err(libc::ENOTSUP);
            }
            return Ok(Feature::to_bytes(f.flags, &[]));
        }
        if ops != FEATURE_GET || (f.argsz as usize) < Feature::LEN + GfxPlane::LEN {
            return Err(libc::EINVAL);
        }
        let (req, rest) = GfxPlane::parse(data).map_err(|_| libc::EINVAL)?;
        if !rest.is_empty() || (req.argsz as usize) < GfxPlane::LEN {
            return Err(libc::EINVAL);
        }
        // Only a region-type plane crosses a socket; a dma-buf belongs to the server's host.
        let kind = req.flags & !GFX_PLANE_PROBE;
        if kind != GFX_PLANE_REGION || req.flags & GFX_PLANE_DMABUF != 0 {
            return Err(libc::EINVAL);
        }
        let probe = req.flags & GFX_PLANE_PROBE != 0;
        let plane = self.device.gfx_plane(req.drm_plane_type, probe)?;
        let reply = if probe {
            req
        } else {
            GfxPlane {
                argsz: req.argsz,
                flags: req.flags,
                ..plane
            }
        };
        Ok(Feature::to_bytes(f.flags, &reply.to_bytes()))
    }
}
