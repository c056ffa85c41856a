//! Errors of the kernel VFIO driver (kept apart so that the engine-facing `target` module can
//! wrap them without importing the driver).

use std::io;

use crate::state::{DeviceState, StateError};

/// Errors of the kernel driver.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The device does not implement VFIO migration v2.
    #[error("device does not support VFIO migration v2")]
    NotMigratable,
    /// The request was refused before any ioctl (invalid for this device's features).
    #[error("state request refused: {0}")]
    Refused(#[from] StateError),
    /// The kernel reported a state value outside the uAPI.
    #[error("kernel reported unknown state {0}")]
    UnknownState(u32),
    /// `MIG_DEVICE_STATE` SET failed; `now` is the state the kernel reports afterwards.
    #[error("setting state {requested} from {from} failed (errno {errno:?}), device now {now}: {source}")]
    SetState {
        /// The state requested.
        requested: DeviceState,
        /// The state before the request.
        from: DeviceState,
        /// The state read back after the failure (ERROR if it could not be read).
        now: DeviceState,
        /// The errno.
        errno: Option<i32>,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Another ioctl or data-fd operation failed.
    #[error("{op} failed (errno {errno:?}): {source}", errno = source.raw_os_error())]
    Op {
        /// The operation.
        op: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A data operation was attempted with no stream open.
    #[error("{op}: no data stream is open in state {state}")]
    NoStream {
        /// The operation.
        op: &'static str,
        /// The current state.
        state: DeviceState,
    },
}

/// Result type of the kernel driver.
pub type Result<T> = std::result::Result<T, KernelError>;
