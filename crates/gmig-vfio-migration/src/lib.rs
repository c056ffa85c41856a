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
//!
//! ## Map
//! | module | what |
//! |---|---|
//! | [`state`] | the eight states, feature flags, the path planner (`vfio_mig_get_next_state` rules) |
//! | [`device`] | the traits a device implements, one method per kind of direct arc |
//! | [`handle`] | [`MigrationHandle`]: a device behind the exact v2 semantics (paths, streams, errors) |
//! | [`target`] | [`MigrationTarget`], the engine-facing interface, and the `drain`/`load`/`migrate` drivers |
//! | [`kernel`] | [`KernelDevice`]: kernel VFIO devices through `vfio-ioctls`, a syscall seam and its mock |
//! | [`dma_log`] | DMA dirty logging (`LOGGING_START/REPORT/STOP`) in software |
//! | [`v1`] | the deprecated v1 migration region over the same traits |
//! | [`testdev`] | a blob device that changes while running, and a fault-injecting wrapper |
//! | [`conformance`] | the contract's acceptance checks, runnable on any device with one call |
//!
//! `docs/vfio-migration.md` describes the state machine, the data-stream rules and how to test
//! against the kernel's `mtty` sample driver.
//!
//! ## Example
//! ```
//! use gmig_vfio_migration::testdev::BlobDevice;
//! use gmig_vfio_migration::{target, DeviceState, MigrationFeatures, MigrationHandle, ReadOutcome};
//!
//! let f = MigrationFeatures::ALL;
//! let mut src = MigrationHandle::new(BlobDevice::new(10_000, 512, 1, f)).unwrap();
//! let mut dst = MigrationHandle::new(BlobDevice::new(10_000, 512, 2, f)).unwrap();
//!
//! // By hand: RUNNING -> PRE_COPY opens the saving stream.
//! let t = src.set_state(DeviceState::PreCopy).unwrap();
//! let stream = t.new_stream.unwrap();
//! let mut buf = [0u8; 4096];
//! assert!(matches!(src.read(stream.id, &mut buf).unwrap(), ReadOutcome::Data(_)));
//! src.set_state(DeviceState::Running).unwrap(); // abandon: the stream closes
//!
//! // With the standard sequence: pre-copy, stop-copy, resume.
//! let (_bytes, report) = target::migrate(&mut src, &mut dst, Default::default(), |s| {
//!     s.device_mut().tick(10); // the source keeps running between the passes
//!     Ok(())
//! })
//! .unwrap();
//! assert!(report.stop_copy_estimate >= report.stop_copy_bytes);
//! assert_eq!(dst.device().blob(), src.device().blob());
//! ```
#![warn(missing_docs)]

pub mod conformance;
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
pub use dma_log::IovaRange;
pub use handle::{DataStream, MigrationHandle, ReadOutcome, StreamId, StreamKind, Transition};
pub use kernel::{KernelDevice, VfioMigrationOps};
pub use state::{DeviceState, MigrationFeatures};
pub use target::{MigrationTarget, TargetError};
