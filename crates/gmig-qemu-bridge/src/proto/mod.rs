//! vfio-user wire format: the 16-byte header, the command numbers, and the fixed parts of the
//! messages gmig serves, each with a total decoder (every length a peer supplies is checked against
//! the bytes that arrived) and an encoder. Layouts follow the vfio-user specification (QEMU's
//! `docs/interop/vfio-user.rst`) and the kernel VFIO uAPI it borrows from; all integers are
//! little-endian.
//!
//! The parts: the reader, writer and error every decoder shares (`codec`), the header and command
//! numbers (`header`), the fixed parts of the per-command messages (`messages`), DEVICE_FEATURE
//! and its feature layouts (`features`), and the sparse-mmap capability of a region-info reply
//! (`sparse`).

mod codec;
mod features;
mod header;
mod messages;
mod sparse;
#[cfg(test)]
mod tests;

pub use self::codec::{ProtoError, Put, Reader};
pub use self::features::{
    Feature, GfxPlane, DMA_LOGGING_CONTROL_LEN, DMA_LOGGING_REPORT_LEN, DRM_FORMAT_XRGB8888,
    FEATURE_DMA_LOGGING_REPORT, FEATURE_DMA_LOGGING_START, FEATURE_DMA_LOGGING_STOP, FEATURE_GET,
    FEATURE_GFX_PLANE, FEATURE_MASK, FEATURE_MIGRATION, FEATURE_MIG_DATA_SIZE,
    FEATURE_MIG_DEVICE_STATE, FEATURE_MIG_PRECOPY_INFO, FEATURE_PROBE, FEATURE_SET,
    GFX_PLANE_DMABUF, GFX_PLANE_PROBE, GFX_PLANE_REGION,
};
pub use self::header::{
    Command, Errno, Header, FLAG_COMMAND, FLAG_ERROR, FLAG_NO_REPLY, FLAG_REPLY, FLAG_TYPE_MASK,
    HEADER_LEN,
};
pub use self::messages::{
    DmaAccess, DmaMap, DmaUnmap, IoFdEntry, IoFdsHead, MigData, RegionAccess, RegionInfo,
    WriteMultiEntry, IO_FD_DATAMATCH, IO_FD_IOEVENTFD, WRITE_MULTI_MAX,
};
pub use self::sparse::{parse_sparse_mmap, sparse_mmap_cap, SparseArea, MAX_SPARSE_AREAS};
