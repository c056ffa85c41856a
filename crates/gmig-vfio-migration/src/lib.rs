//! # gmig-vfio-migration
//!
//! The VFIO migration contract, generic over any device.
//!
//! **Owns:** the VFIO migration v2 device state machine (states, direct arcs, shortest-path
//! composition that never passes through a saving state, shared saving data stream, fresh
//! resuming stream, ERROR left only by reset); the device trait a migratable device implements;
//! PRECOPY_INFO and MIG_DATA_SIZE semantics; DMA dirty logging backed by `gmig-dirty`; emulation of
//! the deprecated v1 migration region; and a VMM-side driver for kernel VFIO devices through
//! `vfio-ioctls`.
//!
//! **Must not know about:** GEN commands or the vGPU model: devices are opaque behind the trait.
#![warn(missing_docs)]

pub mod device;
pub mod dma_log;
pub mod handle;
pub mod kernel;
pub mod state;
pub mod target;
pub mod testdev;
pub mod v1;

pub use device::{
    ArcFailure, ArcResult, DeviceError, DirtyLogging, MigrationDevice, PrecopyInfo, RunControl,
    StateLoader, StateSaver,
};
pub use handle::{DataStream, MigrationHandle, ReadOutcome, StreamId, StreamKind, Transition};
pub use kernel::{IovaRange, KernelDevice, VfioMigrationOps};
pub use state::{DeviceState, MigrationFeatures};
pub use target::{MigrationTarget, TargetError};
