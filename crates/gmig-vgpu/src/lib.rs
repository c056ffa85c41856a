//! # gmig-vgpu
//!
//! The reference GVT-g vGPU: a software model of a mediated Intel GEN8–GEN11 vGPU that really
//! executes a subset of GEN commands against guest memory, the guest-driver workloads that drive
//! it, and its checkpoint/restore with GGTT remapping.
//!
//! **Owns:** the vGPU types and the per-host graphics-memory partition manager ([`gm`]); the GGTT
//! and PPGTT ([`gtt`]); register offsets and the GVT-g PV info page ([`mmio`]); the register model as data — reset
//! values, behaviours, command access — and the MMIO accesses it answers ([`regs`]); execlist
//! submission with context-status events and resets ([`execlist`]); the device — MMIO, fences,
//! rings, execlists, status page, display planes ([`vgpu`]); the display — virtual DP monitor,
//! EDID, vblanks, primary-plane scan-out ([`display`]) and the values it shares with the
//! engine ([`work`]); comparing two vGPUs' guest-visible state ([`compare`]); shadowing guest submissions into host
//! addressing with audit ([`shadow`]); the reference engine ([`exec`]); the guest-driver model and
//! its five profiles ([`workload`]); the versioned checkpoint and restore with remapping
//! ([`checkpoint`]); the vGPU as a PCI function — config space, BAR0/BAR2 access, MSI ([`pci`]). With the default `engine` feature, also the vGPU as a device the migration
//! engine moves ([`migratable`]: `VgpuVm`, `VgpuFactory`) and a whole migration in one process
//! ([`scenario`], behind `gmig demo`).
//!
//! **Must not know about:** the migration engine's policies, stream or transports (it reaches
//! `gmig-core` only through `MigratableVm`/`VmFactory`, and only with the `engine` feature),
//! VFIO, vfio-user or any VMM.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod compare;
pub mod display;
pub mod exec;
pub mod execlist;
pub mod fence;
pub mod gm;
pub mod gtt;
#[cfg(feature = "engine")]
pub mod migratable;
pub mod mmio;
pub mod pci;
pub mod ram;
pub mod regs;
#[cfg(feature = "engine")]
pub mod scenario;
pub mod shadow;
pub mod vgpu;
pub mod work;
pub mod workload;

pub use compare::{compare_guest_visible, StateDiff};
pub use gm::{Gfn, VgpuSlices, VgpuType};
pub use vgpu::{Vgpu, VgpuConfig};
pub use work::{ExecStats, GpuFault, Workload, WriteLog};
pub use workload::{GuestDriver, Profile, WorkloadConfig};
