//! The live-migration engine: one-shot pre-copy, hash-diff stop-and-copy, and the policies that
//! compare against it, driven through `gmig-vfio-migration`'s v2 state machine.
//!
//! ```text
//! source (MigrationHandle<SourceDevice>)           destination (MigrationHandle<DestDevice>)
//! RUNNING -> PRE_COPY   header ------------------> RUNNING -> STOP -> RESUMING
//!                       <---------------------- HeaderAccepted
//!   every migratable page once (copy, then hash the copy), workload keeps running
//!   [iterative: re-hash, resend changed pages, repeat]
//! -> STOP_COPY          (downtime starts)
//!   quiesce: stop submissions, drain <= N in-flight workloads, capture state (queue carried)
//!   hash pipeline (rayon) -> changed pages -> sender
//!   device-state sections, END -------------------> every section validated into private memory
//!                                                   RESUMING -> STOP: restore + remap
//!                       <---------------------- Restored (or Rejected: source -> RUNNING)
//!   Commit ---------------------------------------> STOP -> RUNNING
//! -> STOP               <---------------------- Resumed (downtime ends)
//! ```
//!
//! Until the source sends Commit, any failure (a cut connection, a rejection, a timeout) puts the
//! source back in RUNNING with its workload and queue intact, and the destination drops what it
//! received. After Commit the source never resumes on its own: the vGPU belongs to the
//! destination (if the Commit was lost too, the stopped source still holds the whole state).

mod clocked;
mod config;
mod dest;
mod engine;
mod plan;
mod source;
pub mod synthetic;
mod vm;
mod vm_device;

pub use clocked::{ClockedVm, FrameCounter};
pub use config::{
    hash_threads_leaving, MigrationConfig, MigrationError, MigrationPhase, MigrationReport, Policy,
    Progress, Result,
};
pub use dest::DestDevice;
pub use engine::{
    migrate_destination, migrate_source, receive_migration, record_stream, restore_stream,
    source_handle, DestPhases, DestReport, Incoming,
};
pub use source::{SourceDevice, SourceStats};
pub use vm::{
    decode_state, encode_state, Candidates, Drain, DrainWrites, MigratableVm, RestoreTimes,
    VmError, VmFactory,
};
pub use vm_device::{SaveSettings, VmDevice};
