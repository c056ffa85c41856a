//! The interface a migration engine drives, and generic save/load drivers over it.
//!
//! [`MigrationTarget`] is implemented both by [`crate::handle::MigrationHandle`] (any in-process
//! [`crate::device::MigrationDevice`], e.g. a gmig vGPU) and by [`crate::kernel::KernelDevice`]
//! (a kernel VFIO device reached through ioctls), so one engine migrates either. Unlike the
//! handle, a target tracks its own open stream: the caller just reads or writes "the" stream of
//! the current state, as QEMU does with its cached `data_fd`.
//!
//! The free functions are the standard sequences:
//!
//! ```text
//! source                                   destination
//! RUNNING -> PRE_COPY      (if supported)
//! drain_precopy: read until NoDataNow ---> (bytes buffered or sent)
//! -> STOP_COPY             (downtime starts)
//! drain_stop_copy: read until End -------> STOP -> RESUMING, load(bytes) -> STOP -> RUNNING
//! -> STOP
//! ```

use std::io::{Read, Write};

use crate::device::{DeviceError, MigrationDevice, PrecopyInfo};
use crate::dma_log::IovaRange;
use crate::handle::{HandleError, MigrationHandle, ReadOutcome};
use crate::state::{DeviceState, MigrationFeatures};

/// Errors of a migration target or driver.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// The in-process state machine refused or failed.
    #[error(transparent)]
    Handle(#[from] HandleError),
    /// The kernel device refused or failed (errno-level detail inside).
    #[error(transparent)]
    Kernel(#[from] crate::kernel::error::KernelError),
    /// Reading the source or writing the sink of a driver failed.
    #[error("stream I/O: {0}")]
    Io(#[from] std::io::Error),
    /// No stream is open in the current state.
    #[error("no data stream is open in state {0}")]
    NoStream(DeviceState),
    /// A driver needed a capability the target lacks.
    #[error("target lacks {0}")]
    Unsupported(&'static str),
    /// A driver's byte limit was exceeded.
    #[error("stream exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
}

/// Result type of targets and drivers.
pub type Result<T> = std::result::Result<T, TargetError>;

/// What a migration engine drives: one device's v2 migration interface.
pub trait MigrationTarget {
    /// `VFIO_DEVICE_FEATURE_MIGRATION`: the supported features.
    fn features(&mut self) -> Result<MigrationFeatures>;
    /// The current device state.
    fn state(&mut self) -> Result<DeviceState>;
    /// Requests a state; on success a stream is open exactly when the new state has one.
    fn set_state(&mut self, target: DeviceState) -> Result<()>;
    /// Reads from the open saving stream.
    fn read_data(&mut self, buf: &mut [u8]) -> Result<ReadOutcome>;
    /// Writes all of `data` to the open resuming stream.
    fn write_data(&mut self, data: &[u8]) -> Result<()>;
    /// `VFIO_MIG_GET_PRECOPY_INFO` (PRE_COPY and PRE_COPY_P2P only).
    fn precopy_info(&mut self) -> Result<PrecopyInfo>;
    /// `VFIO_DEVICE_FEATURE_MIG_DATA_SIZE`.
    fn stop_copy_size(&mut self) -> Result<u64>;
    /// `VFIO_DEVICE_RESET`.
    fn reset(&mut self) -> Result<()>;

    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_START`: log device writes to `ranges` at `page_size`;
    /// returns the page size used. Default: unsupported.
    fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> Result<u64> {
        let _ = (page_size, ranges);
        Err(TargetError::Unsupported("DMA logging"))
    }

    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT`: read-and-clear bitmap of `range`.
    fn dma_logging_report(&mut self, range: IovaRange, page_size: u64) -> Result<Vec<u64>> {
        let _ = (range, page_size);
        Err(TargetError::Unsupported("DMA logging"))
    }

    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP`.
    fn dma_logging_stop(&mut self) -> Result<()> {
        Err(TargetError::Unsupported("DMA logging"))
    }
}

impl<D: MigrationDevice> MigrationTarget for MigrationHandle<D> {
    fn features(&mut self) -> Result<MigrationFeatures> {
        Ok(MigrationHandle::features(self))
    }

    fn state(&mut self) -> Result<DeviceState> {
        Ok(MigrationHandle::state(self))
    }

    fn set_state(&mut self, target: DeviceState) -> Result<()> {
        MigrationHandle::set_state(self, target)?;
        Ok(())
    }

    fn read_data(&mut self, buf: &mut [u8]) -> Result<ReadOutcome> {
        let s = self
            .open_stream()
            .ok_or(TargetError::NoStream(MigrationHandle::state(self)))?;
        Ok(self.read(s.id, buf)?)
    }

    fn write_data(&mut self, data: &[u8]) -> Result<()> {
        let s = self
            .open_stream()
            .ok_or(TargetError::NoStream(MigrationHandle::state(self)))?;
        self.write(s.id, data)?;
        Ok(())
    }

    fn precopy_info(&mut self) -> Result<PrecopyInfo> {
        let s = self
            .open_stream()
            .ok_or(TargetError::NoStream(MigrationHandle::state(self)))?;
        Ok(MigrationHandle::precopy_info(self, s.id)?)
    }

    fn stop_copy_size(&mut self) -> Result<u64> {
        Ok(MigrationHandle::stop_copy_size(self)?)
    }

    fn reset(&mut self) -> Result<()> {
        Ok(MigrationHandle::reset(self)?)
    }

    fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> Result<u64> {
        Ok(MigrationHandle::dma_logging_start(self, page_size, ranges)?)
    }

    fn dma_logging_report(&mut self, range: IovaRange, page_size: u64) -> Result<Vec<u64>> {
        Ok(MigrationHandle::dma_logging_report(
            self,
            range.iova,
            range.length,
            page_size,
        )?)
    }

    fn dma_logging_stop(&mut self) -> Result<()> {
        Ok(MigrationHandle::dma_logging_stop(self)?)
    }
}

/// Chunk size the drivers read and write with (QEMU uses 1 MiB; any size gives the same bytes).
pub const DEFAULT_CHUNK: usize = 64 * 1024;

/// `total` plus `n` bytes, or [`TargetError::TooLarge`] when that passes `limit`.
fn within_limit(total: u64, n: usize, limit: u64) -> Result<u64> {
    let total = total.saturating_add(n as u64);
    if total > limit {
        return Err(TargetError::TooLarge { limit });
    }
    Ok(total)
}

/// Reads the open saving stream into `sink` until the device has nothing *now*
/// ([`ReadOutcome::NoDataNow`], in PRE_COPY) or the stream ends ([`ReadOutcome::End`], in
/// STOP_COPY). Returns the bytes copied. `limit` bounds the total (a guard against a device that
/// never stops producing).
pub fn drain<T: MigrationTarget + ?Sized>(
    target: &mut T,
    sink: &mut dyn Write,
    chunk: usize,
    limit: u64,
) -> Result<u64> {
    let mut buf = vec![0u8; chunk.max(1)];
    let mut total = 0u64;
    loop {
        match target.read_data(&mut buf)? {
            ReadOutcome::Data(n) => {
                let bytes = buf
                    .get(..n)
                    .ok_or(TargetError::Handle(HandleError::Contract(
                        "read longer than the buffer",
                    )))?;
                sink.write_all(bytes)?;
                total = within_limit(total, n, limit)?;
            }
            ReadOutcome::NoDataNow | ReadOutcome::End => return Ok(total),
        }
    }
}

/// Writes everything `source` yields into the open resuming stream, `chunk` bytes at a time.
/// Returns the bytes written.
pub fn load<T: MigrationTarget + ?Sized>(
    target: &mut T,
    source: &mut dyn Read,
    chunk: usize,
    limit: u64,
) -> Result<u64> {
    let mut buf = vec![0u8; chunk.max(1)];
    let mut total = 0u64;
    loop {
        let n = source.read(&mut buf)?;
        if n == 0 {
            return Ok(total);
        }
        total = within_limit(total, n, limit)?;
        let bytes = buf.get(..n).ok_or(TargetError::Io(std::io::Error::other(
            "source read longer than the buffer",
        )))?;
        target.write_data(bytes)?;
    }
}

/// Figures from one [`migrate`] run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Bytes sent while the source kept running (pre-copy).
    pub precopy_bytes: u64,
    /// Bytes sent in STOP_COPY (during downtime).
    pub stop_copy_bytes: u64,
    /// MIG_DATA_SIZE queried just before switching to STOP_COPY.
    pub stop_copy_estimate: u64,
}

/// Options of [`migrate`].
#[derive(Debug, Clone, Copy)]
pub struct MigrateOptions {
    /// Use PRE_COPY when the source supports it (the destination only ever sees RESUMING).
    pub precopy: bool,
    /// Read/write chunk size.
    pub chunk: usize,
    /// Upper bound of the whole stream.
    pub limit: u64,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            precopy: true,
            chunk: DEFAULT_CHUNK,
            limit: 1 << 34,
        }
    }
}

/// Migrates `src` (RUNNING) into `dst` (RUNNING, to be overwritten) in one process:
/// optional pre-copy, stop-copy, resume; leaves `src` in STOP and `dst` in RUNNING.
///
/// `between` runs after the pre-copy pass while the source still runs (a test uses it to dirty
/// state; an engine uses it to send guest RAM).
pub fn migrate<S, T>(
    src: &mut S,
    dst: &mut T,
    opts: MigrateOptions,
    mut between: impl FnMut(&mut S) -> Result<()>,
) -> Result<(Vec<u8>, MigrationReport)>
where
    S: MigrationTarget + ?Sized,
    T: MigrationTarget + ?Sized,
{
    let mut report = MigrationReport::default();
    let mut stream = Vec::new();
    let features = src.features()?;
    if opts.precopy && features.contains(MigrationFeatures::PRE_COPY) {
        src.set_state(DeviceState::PreCopy)?;
        report.precopy_bytes = drain(src, &mut stream, opts.chunk, opts.limit)?;
    }
    between(src)?;
    if features.contains(MigrationFeatures::P2P) {
        let to = if src.state()? == DeviceState::PreCopy {
            DeviceState::PreCopyP2p
        } else {
            DeviceState::RunningP2p
        };
        src.set_state(to)?;
    }
    if src.state()? == DeviceState::Running || src.state()? == DeviceState::RunningP2p {
        src.set_state(DeviceState::Stop)?;
    }
    report.stop_copy_estimate = src.stop_copy_size()?;
    src.set_state(DeviceState::StopCopy)?;
    report.stop_copy_bytes = drain(
        src,
        &mut stream,
        opts.chunk,
        opts.limit.saturating_sub(report.precopy_bytes),
    )?;
    src.set_state(DeviceState::Stop)?;

    dst.set_state(DeviceState::Resuming)?;
    load(dst, &mut stream.as_slice(), opts.chunk, opts.limit)?;
    dst.set_state(DeviceState::Running)?;
    Ok((stream, report))
}

impl From<DeviceError> for TargetError {
    fn from(e: DeviceError) -> TargetError {
        TargetError::Handle(HandleError::Device(e))
    }
}
