//! # gmig-core
//!
//! The live-migration engine, for any device that implements [`migration::MigratableVm`].
//!
//! **Owns:** the device-facing traits ([`migration::MigratableVm`] for a running device and its
//! guest memory, [`migration::VmFactory`] for building one on a destination); the migration
//! policies (stop-and-copy, iterative, one-shot, one-shot-narrow) and the downtime hash pipeline;
//! the migration stream format ([`stream`]); transports ([`transport`]); and the adapters that put
//! a migratable device behind `gmig-vfio-migration`'s v2 state machine: [`VmDevice`] (the device
//! as one VFIO migration device, both ends, with DMA logging — what a VMM drives) and the
//! two-process engine ([`migration::migrate_source`] / [`migration::migrate_destination`]).
//! [`migration::synthetic`] is a small deterministic device for testing the engine on its own.
//!
//! **Must not know about:** the reference vGPU or any GPU model (that is `gmig-vgpu`, which
//! implements this crate's traits), vfio-user, QEMU's stream framing or any particular VMM
//! (`gmig-qemu-bridge`), or the benchmark harness (`gmig-cli`).
#![warn(missing_docs)]

pub mod migration;
pub mod stream;
pub mod transport;

pub use migration::{
    migrate_destination, migrate_source, MigratableVm, MigrationConfig, MigrationError,
    MigrationReport, Policy, SaveSettings, VmDevice, VmFactory,
};
