//! `VFIO_USER_DEVICE_FEATURE`: the feature flags and indices, the layouts of the migration and DMA
//! logging features, and the message's fixed part ([`Feature`]).

use super::codec::{then_data, wire_struct, with_rest, Field, ProtoError, Reader};

/// `VFIO_DEVICE_FEATURE` flags: feature index mask.
pub const FEATURE_MASK: u32 = 0xffff;
/// `VFIO_DEVICE_FEATURE_GET`.
pub const FEATURE_GET: u32 = 1 << 16;
/// `VFIO_DEVICE_FEATURE_SET`.
pub const FEATURE_SET: u32 = 1 << 17;
/// `VFIO_DEVICE_FEATURE_PROBE`.
pub const FEATURE_PROBE: u32 = 1 << 18;
/// `VFIO_DEVICE_FEATURE_MIGRATION`: `u64 flags` (STOP_COPY 1, P2P 2, PRE_COPY 4).
pub const FEATURE_MIGRATION: u32 = 1;
/// `VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE`: `u32 device_state, s32 data_fd`.
pub const FEATURE_MIG_DEVICE_STATE: u32 = 2;
/// `VFIO_DEVICE_FEATURE_DMA_LOGGING_START`.
pub const FEATURE_DMA_LOGGING_START: u32 = 6;
/// `VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP`.
pub const FEATURE_DMA_LOGGING_STOP: u32 = 7;
/// `VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT`.
pub const FEATURE_DMA_LOGGING_REPORT: u32 = 8;
/// Bytes before the ranges of a DMA_LOGGING_START/STOP request (`page_size`, `num_ranges`,
/// reserved) and before the bitmap of a DMA_LOGGING_REPORT (`iova`, `length`, `page_size`).
pub const DMA_LOGGING_CONTROL_LEN: usize = 16;
/// See [`DMA_LOGGING_CONTROL_LEN`].
pub const DMA_LOGGING_REPORT_LEN: usize = 24;
/// `VFIO_DEVICE_FEATURE_MIG_DATA_SIZE`: `u64 stop_copy_length`.
pub const FEATURE_MIG_DATA_SIZE: u32 = 9;

wire_struct! {
    /// `VFIO_USER_DEVICE_FEATURE` fixed part (`struct vfio_device_feature`: `argsz`, `flags`),
    /// followed by the feature's data.
    Feature, 8, {
        /// `argsz`: the fixed part plus the data.
        argsz: u32,
        /// Feature index (low 16 bits) and GET / SET / PROBE.
        flags: u32,
    }
}

impl Feature {
    /// Decodes the fixed part; returns it and the data after it.
    pub fn parse(p: &[u8]) -> Result<(Self, &[u8]), ProtoError> {
        with_rest(p, Self::read_fields)
    }

    /// Encodes the fixed part followed by `data`, with `argsz` covering both.
    pub fn to_bytes(flags: u32, data: &[u8]) -> Vec<u8> {
        let f = Feature {
            argsz: (Self::LEN + data.len()) as u32,
            flags,
        };
        then_data(Self::LEN, |v| f.put_fields(v), data)
    }

    /// Encodes the fixed part followed by `data`, with `argsz` (the room for the reply) given:
    /// a GET whose reply is longer than its request (DMA_LOGGING_REPORT) says so here.
    pub fn to_bytes_with_argsz(argsz: u32, flags: u32, data: &[u8]) -> Vec<u8> {
        let f = Feature { argsz, flags };
        then_data(Self::LEN, |v| f.put_fields(v), data)
    }

    /// The feature index.
    pub fn index(self) -> u32 {
        self.flags & FEATURE_MASK
    }
}

/// vfio-user's own PRECOPY_INFO device feature (index 0x8000, from gmig's QEMU patches: the
/// specification has no way to carry `VFIO_MIG_GET_PRECOPY_INFO`): GET, in PRE_COPY only;
/// `u64 initial_bytes, u64 dirty_bytes`.
pub const FEATURE_MIG_PRECOPY_INFO: u32 = 0x8000;

/// vfio-user's own GFX_PLANE device feature (index 0x8001, from gmig's QEMU patches): the
/// kernel's `VFIO_DEVICE_QUERY_GFX_PLANE` ioctl as a GET whose request and reply data are
/// [`GfxPlane`] (`struct vfio_device_gfx_plane_info`).
pub const FEATURE_GFX_PLANE: u32 = 0x8001;
/// `VFIO_GFX_PLANE_TYPE_PROBE`: does the device support the plane type asked for?
pub const GFX_PLANE_PROBE: u32 = 1 << 0;
/// `VFIO_GFX_PLANE_TYPE_DMABUF`: the plane as a dma-buf (never over a socket).
pub const GFX_PLANE_DMABUF: u32 = 1 << 1;
/// `VFIO_GFX_PLANE_TYPE_REGION`: the plane's pixels in a region of the device.
pub const GFX_PLANE_REGION: u32 = 1 << 2;
/// DRM's `DRM_FORMAT_XRGB8888` (fourcc `XR24`): 32-bit little-endian `x:R:G:B`.
pub const DRM_FORMAT_XRGB8888: u32 = u32::from_le_bytes(*b"XR24");

wire_struct! {
    /// `struct vfio_device_gfx_plane_info` of `linux/vfio.h`: the data of a GFX_PLANE request
    /// (argsz, flags, drm_plane_type) and of its reply (the plane; zeros in `drm_format` and
    /// `size` while nothing is shown).
    GfxPlane, 64, {
        /// `argsz`: 64.
        argsz: u32,
        /// `GFX_PLANE_*`.
        flags: u32,
        /// DRM plane type (1 primary, 2 cursor).
        drm_plane_type: u32,
        /// DRM fourcc of the pixels.
        drm_format: u32,
        /// DRM format modifier (0: linear).
        drm_format_mod: u64,
        /// Pixels per row.
        width: u32,
        /// Rows.
        height: u32,
        /// Bytes per row.
        stride: u32,
        /// Bytes of the plane.
        size: u32,
        /// Position (cursor planes).
        x_pos: u32,
        /// Position (cursor planes).
        y_pos: u32,
        /// Hot spot (cursor planes).
        x_hot: u32,
        /// Hot spot (cursor planes).
        y_hot: u32,
        /// The region holding the pixels (`dmabuf_id` for a dma-buf).
        region_index: u32,
        /// Reserved.
        reserved: u32,
    }
}

impl GfxPlane {
    /// A plane of type `drm_plane_type` with `flags`, every other field zero (`argsz` 64): the
    /// data of a request, and of a reply while nothing is shown.
    pub fn new(flags: u32, drm_plane_type: u32) -> Self {
        GfxPlane {
            argsz: Self::LEN as u32,
            flags,
            drm_plane_type,
            drm_format: 0,
            drm_format_mod: 0,
            width: 0,
            height: 0,
            stride: 0,
            size: 0,
            x_pos: 0,
            y_pos: 0,
            x_hot: 0,
            y_hot: 0,
            region_index: 0,
            reserved: 0,
        }
    }

    /// Decodes a plane; the bytes after it are refused by the caller.
    pub fn parse(p: &[u8]) -> Result<(Self, &[u8]), ProtoError> {
        with_rest(p, Self::read_fields)
    }

    /// Encodes the plane.
    pub fn to_bytes(self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::LEN);
        self.put_fields(&mut v);
        v
    }
}
