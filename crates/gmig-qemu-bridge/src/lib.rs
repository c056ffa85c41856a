//! # gmig-qemu-bridge
//!
//! How VMMs reach a gmig vGPU.
//!
//! **Owns:** a vfio-user server and client (base protocol plus DEVICE_FEATURE, MIG_DATA_READ and
//! MIG_DATA_WRITE), QEMU's VFIO migration stream framing, and glue for rust-vmm based VMMs.
//!
//! **Must not know about:** nothing is off limits here; it sits at the top of the library stack and
//! may use every other gmig crate.
//!
//! ## Status
//! Built: the vfio-user wire format ([`proto`]); a server generic over a device backend
//! ([`server`]: every base command — VERSION, DMA_MAP/UNMAP with file descriptors into `vm-memory`
//! or without them through DMA_READ/WRITE to the client, device, region (mmap and sparse areas)
//! and IRQ info, GET_REGION_IO_FDS, SET_IRQS with passed descriptors, REGION_READ/WRITE and
//! REGION_WRITE_MULTI, DEVICE_RESET — and DEVICE_FEATURE for migration v2 and DMA logging with
//! MIG_DATA_READ/WRITE); a client ([`client`]) that serves the server's DMA requests and drives a
//! migration between two servers; QEMU's stream framing ([`framing`]); and the reference vGPU as a
//! vfio-user device ([`vgpu_backend`], behind `gmig serve`), whose screen it can write as PNG
//! ([`screen`]). See `docs/vfio-user.md`.
#![warn(missing_docs)]

pub mod client;
pub mod display_region;
pub mod framing;
mod irqs;

/// SET_IRQS flags that arm a vector with an eventfd (`VFIO_IRQ_SET_DATA_EVENTFD |
/// VFIO_IRQ_SET_ACTION_TRIGGER`), for in-process callers of [`server::UserDevice::set_irqs`].
pub const IRQ_EVENTFD_TRIGGER: u32 = vfio_bindings::bindings::vfio::VFIO_IRQ_SET_DATA_EVENTFD
    | vfio_bindings::bindings::vfio::VFIO_IRQ_SET_ACTION_TRIGGER;
pub mod proto;
pub mod screen;
pub mod server;
mod server_checks;
pub mod vgpu_backend;
