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
//! Built: the vfio-user wire format ([`proto`]), a server generic over a device backend
//! ([`server`]: VERSION, DMA_MAP/UNMAP with file descriptors into `vm-memory`, device, region and
//! IRQ info, SET_IRQS with passed descriptors, REGION_READ/WRITE, DEVICE_RESET, DEVICE_FEATURE for
//! MIGRATION, MIG_DEVICE_STATE and MIG_DATA_SIZE, MIG_DATA_READ/WRITE), and a client ([`client`])
//! that drives a migration between two servers. Not yet: the gmig vGPU as a backend and `gmig
//! serve`, DMA regions without descriptors, GET_REGION_IO_FDS, REGION_WRITE_MULTI, DMA logging over
//! vfio-user, QEMU's stream framing, and the interop test against the rust-vmm `vfio_user` crate.
#![warn(missing_docs)]

pub mod client;
pub mod framing;
pub mod proto;
pub mod server;
pub mod vgpu_backend;
