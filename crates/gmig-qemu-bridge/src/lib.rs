//! # gmig-qemu-bridge
//!
//! How VMMs reach a gmig vGPU.
//!
//! **Owns:** a vfio-user server and client (base protocol plus DEVICE_FEATURE, MIG_DATA_READ and
//! MIG_DATA_WRITE), QEMU's VFIO migration stream framing, and glue for rust-vmm based VMMs.
//!
//! **Must not know about:** nothing is off limits here; it sits at the top of the library stack and
//! may use every other gmig crate.
#![warn(missing_docs)]
