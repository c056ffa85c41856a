//! The device side of the contract: what a migratable device implements.
//!
//! The traits are *consumer-side* and layered by capability, in the style of cloud-hypervisor's
//! `Pausable`/`Snapshottable`/`Transportable`: a device implements the handful of required
//! methods, and every optional capability has a default that answers
//! [`DeviceError::NotSupported`] (never a panic). The state machine in
//! [`crate::handle::MigrationHandle`] decides *which* arc runs; the device only does the work of
//! one direct arc at a time, so it never has to know about combination transitions, data-stream
//! identity or the uAPI's error rules.
//!
//! | trait | arcs / operations |
//! |---|---|
//! | [`RunControl`] | `stop` (RUNNING_P2P→STOP, or RUNNING→STOP without P2P), `run` (the reverse), `quiesce_p2p` / `release_p2p` (the P2P arcs, optional), `reset` |
//! | [`StateSaver`] | `start_stop_copy` (STOP→STOP_COPY), `end_stop_copy` (STOP_COPY→STOP), `save_read`, `stop_copy_size` (MIG_DATA_SIZE); optional pre-copy: `start_precopy`, `abort_precopy`, `precopy_to_stop_copy`, `precopy_info` |
//! | [`StateLoader`] | `start_resuming` (STOP→RESUMING), `resume_write`, `finish_resuming` (RESUMING→STOP, validates) |
//! | [`DirtyLogging`] | DMA logging start / report / stop (optional) |
//! | [`MigrationDevice`] | all four plus `migration_features()` |
//!
//! ## Data-stream rules a device must keep
//! * The bytes `save_read` returns from the moment saving starts (PRE_COPY or STOP_COPY) until
//!   STOP_COPY is drained form **one** stream; the destination receives exactly those bytes, in
//!   that order, through `resume_write`. Segmentation is arbitrary on both sides: a device must
//!   accept its stream split at any byte boundary, so its records must be self-delimiting.
//! * In PRE_COPY, `save_read` returning `0` means "nothing to send *now*" (the uAPI's `ENOMSG`);
//!   more may come later as the running device dirties state. In STOP_COPY, `0` means the stream
//!   is complete.
//! * `finish_resuming` validates the whole stream (truncation, corruption, wrong device) and
//!   fails with [`DeviceError::BadStream`] rather than loading a partial state.
//! * `stop_copy_size` is an honest upper bound of what STOP_COPY would still produce if the device
//!   stopped now; VMMs (QEMU) gate switch-over on it.

use std::fmt;

use crate::dma_log::IovaRange;
use crate::state::MigrationFeatures;

/// Errors a device reports from an arc or a data operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The device does not implement this optional operation.
    #[error("{0} is not supported by this device")]
    NotSupported(&'static str),
    /// The stream being loaded is invalid (truncated, corrupt, for another device).
    #[error("bad migration stream at offset 0x{offset:x}: {reason}")]
    BadStream {
        /// Byte offset in the stream where the problem was found.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The stream being loaded exceeds what the device accepts.
    #[error("migration stream too large: {len} bytes, at most {max} accepted")]
    StreamTooLarge {
        /// Bytes received so far.
        len: u64,
        /// The device's limit.
        max: u64,
    },
    /// The device cannot complete the operation (a hardware or model failure).
    #[error("device failure: {0}")]
    Failed(String),
    /// DMA logging refused the request.
    #[error("DMA logging: {0}")]
    DmaLog(#[from] crate::dma_log::DmaLogError),
    /// An I/O error from a backing system interface (a kernel device, a socket).
    #[error("device I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Result type of data operations.
pub type Result<T> = std::result::Result<T, DeviceError>;

/// What a device says when an arc fails: the error, and where the device is now.
///
/// `rolled_back: false` (what [`ArcFailure::fatal`] and `From<DeviceError>` give) means the
/// device could not undo its partial work and is unusable: the state machine moves to ERROR.
/// `rolled_back: true` ([`ArcFailure::rolled_back`]) reports the recovery state "the arc's
/// source state, unchanged": the state machine stays there and the request fails cleanly.
#[derive(Debug)]
pub struct ArcFailure {
    /// Why the arc failed.
    pub error: DeviceError,
    /// Whether the device is back, intact, in the arc's source state.
    pub rolled_back: bool,
}

impl ArcFailure {
    /// A failure that leaves the device unusable (it goes to ERROR).
    pub fn fatal(error: DeviceError) -> ArcFailure {
        ArcFailure {
            error,
            rolled_back: false,
        }
    }

    /// A failure after which the device is intact in the arc's source state.
    pub fn rolled_back(error: DeviceError) -> ArcFailure {
        ArcFailure {
            error,
            rolled_back: true,
        }
    }
}

impl From<DeviceError> for ArcFailure {
    fn from(error: DeviceError) -> ArcFailure {
        ArcFailure::fatal(error)
    }
}

impl fmt::Display for ArcFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rolled_back {
            write!(f, "{} (device rolled back)", self.error)
        } else {
            write!(f, "{} (device unrecoverable)", self.error)
        }
    }
}

/// Result of one direct arc.
pub type ArcResult = std::result::Result<(), ArcFailure>;

/// `VFIO_MIG_GET_PRECOPY_INFO`: what remains to be read in PRE_COPY.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PrecopyInfo {
    /// Bytes of the initial state not yet read; falls to 0 as the first pass is read and never
    /// grows again within one saving session.
    pub initial_bytes: u64,
    /// Bytes of state dirtied since it was last read (an estimate; it may grow while running).
    pub dirty_bytes: u64,
}

impl PrecopyInfo {
    /// Whether a read now would return "no data" (`ENOMSG`).
    pub fn is_empty(&self) -> bool {
        self.initial_bytes == 0 && self.dirty_bytes == 0
    }
}

/// Execution control: the arcs that start, stop and P2P-quiesce the device.
pub trait RunControl {
    /// RUNNING_P2P → STOP (or RUNNING → STOP on a device without P2P): stop executing, stop all
    /// DMA, freeze the internal state so that saving it later is consistent.
    fn stop(&mut self) -> ArcResult;

    /// STOP → RUNNING_P2P (or STOP → RUNNING without P2P): execute again from the frozen (or
    /// freshly loaded) state.
    fn run(&mut self) -> ArcResult;

    /// RUNNING → RUNNING_P2P and PRE_COPY → PRE_COPY_P2P: keep running but initiate no
    /// peer-to-peer DMA (accesses to other devices' MMIO). Needed only with
    /// [`MigrationFeatures::P2P`].
    fn quiesce_p2p(&mut self) -> ArcResult {
        Err(ArcFailure::rolled_back(DeviceError::NotSupported(
            "P2P quiesce",
        )))
    }

    /// RUNNING_P2P → RUNNING and PRE_COPY_P2P → PRE_COPY: allow peer-to-peer DMA again.
    fn release_p2p(&mut self) -> ArcResult {
        Err(ArcFailure::rolled_back(DeviceError::NotSupported(
            "P2P release",
        )))
    }

    /// `VFIO_DEVICE_RESET`: drop any migration session and return to RUNNING. The only way out
    /// of ERROR.
    fn reset(&mut self) -> Result<()>;
}

/// The saving side: producing the state stream.
pub trait StateSaver {
    /// STOP → STOP_COPY: the device is stopped; prepare the complete final state for reading.
    fn start_stop_copy(&mut self) -> ArcResult;

    /// STOP_COPY → STOP: end the saving session (whether or not everything was read) and release
    /// its buffers. The default does nothing.
    fn end_stop_copy(&mut self) -> ArcResult {
        Ok(())
    }

    /// Reads the next bytes of the saving stream into `buf` (never empty); returns how many
    /// were written (at most `buf.len()`). `0` in PRE_COPY means "no data now"; `0` in STOP_COPY
    /// means the stream is complete.
    fn save_read(&mut self, buf: &mut [u8]) -> Result<usize>;

    /// `VFIO_DEVICE_FEATURE_MIG_DATA_SIZE`: the bytes STOP_COPY would still produce if the
    /// device were stopped now (in STOP_COPY: what is left to read). Must not under-estimate.
    fn stop_copy_size(&mut self) -> Result<u64>;

    /// RUNNING → PRE_COPY and RUNNING_P2P → PRE_COPY_P2P: start a saving session while the
    /// device keeps running; the initial state becomes readable and the device starts tracking
    /// which of its state it changes. Needed only with [`MigrationFeatures::PRE_COPY`].
    fn start_precopy(&mut self) -> ArcResult {
        Err(ArcFailure::rolled_back(DeviceError::NotSupported(
            "pre-copy",
        )))
    }

    /// PRE_COPY → RUNNING and PRE_COPY_P2P → RUNNING_P2P: abandon the saving session; the
    /// device keeps running.
    fn abort_precopy(&mut self) -> ArcResult {
        Err(ArcFailure::rolled_back(DeviceError::NotSupported(
            "pre-copy abort",
        )))
    }

    /// PRE_COPY_P2P → STOP_COPY (PRE_COPY → STOP_COPY without P2P): stop the device and continue
    /// the **same** stream with whatever the pre-copy phase has not yet sent.
    fn precopy_to_stop_copy(&mut self) -> ArcResult {
        Err(ArcFailure::rolled_back(DeviceError::NotSupported(
            "pre-copy to stop-copy",
        )))
    }

    /// `VFIO_MIG_GET_PRECOPY_INFO`, valid in PRE_COPY and PRE_COPY_P2P.
    fn precopy_info(&mut self) -> Result<PrecopyInfo> {
        Err(DeviceError::NotSupported("pre-copy info"))
    }
}

/// The resuming side: consuming a state stream.
pub trait StateLoader {
    /// STOP → RESUMING: prepare to receive a fresh stream. The default does nothing.
    fn start_resuming(&mut self) -> ArcResult {
        Ok(())
    }

    /// Accepts the next bytes of the stream (any segmentation). A device may buffer or parse
    /// incrementally; it must bound what it buffers ([`DeviceError::StreamTooLarge`]).
    fn resume_write(&mut self, data: &[u8]) -> Result<()>;

    /// RESUMING → STOP: validate the complete stream and make it the device state. Bad data
    /// fails with [`DeviceError::BadStream`]; the device then either stays in RESUMING with its
    /// previous state intact ([`ArcFailure::rolled_back`]) or is unusable ([`ArcFailure::fatal`],
    /// ERROR).
    fn finish_resuming(&mut self) -> ArcResult;
}

/// DMA dirty logging (`VFIO_DEVICE_FEATURE_DMA_LOGGING_*`) for a device without hardware dirty
/// tracking; see [`crate::dma_log`]. A device that logs keeps a [`crate::dma_log::DmaLogger`] (usually in an
/// `Option`, see [`crate::dma_log::DmaLogSlot`]) and records its guest-RAM writes in it.
/// Every method defaults to "not supported".
pub trait DirtyLogging {
    /// `LOGGING_START`: track `ranges` at `page_size`; returns the page size used.
    fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> Result<u64> {
        let _ = (page_size, ranges);
        Err(DeviceError::NotSupported("DMA logging"))
    }

    /// `LOGGING_STOP`.
    fn dma_logging_stop(&mut self) -> Result<()> {
        Err(DeviceError::NotSupported("DMA logging"))
    }

    /// `LOGGING_REPORT`: read-and-clear bitmap of `[iova, iova+length)` at `page_size`.
    fn dma_logging_report(&mut self, iova: u64, length: u64, page_size: u64) -> Result<Vec<u64>> {
        let _ = (iova, length, page_size);
        Err(DeviceError::NotSupported("DMA logging"))
    }
}

/// A device that can be migrated through the VFIO migration v2 state machine.
pub trait MigrationDevice: RunControl + StateSaver + StateLoader + DirtyLogging {
    /// The optional parts of the state machine this device implements. Must contain
    /// [`MigrationFeatures::STOP_COPY`]; the default is STOP_COPY only.
    fn migration_features(&self) -> MigrationFeatures {
        MigrationFeatures::STOP_COPY
    }
}

impl<T: RunControl + ?Sized> RunControl for Box<T> {
    fn stop(&mut self) -> ArcResult {
        (**self).stop()
    }
    fn run(&mut self) -> ArcResult {
        (**self).run()
    }
    fn quiesce_p2p(&mut self) -> ArcResult {
        (**self).quiesce_p2p()
    }
    fn release_p2p(&mut self) -> ArcResult {
        (**self).release_p2p()
    }
    fn reset(&mut self) -> Result<()> {
        (**self).reset()
    }
}

impl<T: StateSaver + ?Sized> StateSaver for Box<T> {
    fn start_stop_copy(&mut self) -> ArcResult {
        (**self).start_stop_copy()
    }
    fn end_stop_copy(&mut self) -> ArcResult {
        (**self).end_stop_copy()
    }
    fn save_read(&mut self, buf: &mut [u8]) -> Result<usize> {
        (**self).save_read(buf)
    }
    fn stop_copy_size(&mut self) -> Result<u64> {
        (**self).stop_copy_size()
    }
    fn start_precopy(&mut self) -> ArcResult {
        (**self).start_precopy()
    }
    fn abort_precopy(&mut self) -> ArcResult {
        (**self).abort_precopy()
    }
    fn precopy_to_stop_copy(&mut self) -> ArcResult {
        (**self).precopy_to_stop_copy()
    }
    fn precopy_info(&mut self) -> Result<PrecopyInfo> {
        (**self).precopy_info()
    }
}

impl<T: StateLoader + ?Sized> StateLoader for Box<T> {
    fn start_resuming(&mut self) -> ArcResult {
        (**self).start_resuming()
    }
    fn resume_write(&mut self, data: &[u8]) -> Result<()> {
        (**self).resume_write(data)
    }
    fn finish_resuming(&mut self) -> ArcResult {
        (**self).finish_resuming()
    }
}

impl<T: DirtyLogging + ?Sized> DirtyLogging for Box<T> {
    fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> Result<u64> {
        (**self).dma_logging_start(page_size, ranges)
    }
    fn dma_logging_stop(&mut self) -> Result<()> {
        (**self).dma_logging_stop()
    }
    fn dma_logging_report(&mut self, iova: u64, length: u64, page_size: u64) -> Result<Vec<u64>> {
        (**self).dma_logging_report(iova, length, page_size)
    }
}

impl<T: MigrationDevice + ?Sized> MigrationDevice for Box<T> {
    fn migration_features(&self) -> MigrationFeatures {
        (**self).migration_features()
    }
}
