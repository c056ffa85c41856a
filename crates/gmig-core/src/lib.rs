//! # gmig-core
//!
//! The reference GVT-g vGPU and the migration engine that moves it.
//!
//! **Owns:** the vGPU types and the per-host graphics-memory partition manager; the software vGPU
//! (MMIO, GGTT, PPGTT, fences, rings, execlists, status page, display planes) and its reference
//! engine that really executes a subset of GEN commands; the guest-driver workload generator;
//! versioned checkpoint/restore with GGTT remapping; the migration engine (stop-and-copy,
//! iterative, one-shot and one-shot-narrow policies); the migration stream format; transports.
//!
//! **Must not know about:** vfio-user, QEMU's stream framing or any particular VMM: those live in
//! `gmig-qemu-bridge` and talk to this crate through `gmig-vfio-migration`'s device trait.
#![warn(missing_docs)]

pub mod bench;
pub mod checkpoint;
pub mod exec;
pub mod gm;
pub mod gtt;
pub mod migration;
pub mod mmio;
pub mod shadow;
pub mod stream;
pub mod transport;
pub mod vgpu;
pub mod workload;
