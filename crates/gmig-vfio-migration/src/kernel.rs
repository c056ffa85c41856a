//! VMM side: migrating a *kernel* VFIO device (mlx5, hisi_acc, the `mtty` sample, ...).
//!
//! `vfio-ioctls` 0.10 already wraps the migration uAPI on [`vfio_ioctls::VfioDevice`]
//! (`query_migration_support`, `set_migration_state` keeping the `data_fd`,
//! `mig_get_precopy_info`, `get_mig_data_size`, data reads/writes, DMA logging), so this module
//! does not re-issue those ioctls; it puts them behind a small syscall seam,
//! [`VfioMigrationOps`], and builds [`KernelDevice`] on that seam. `KernelDevice` implements the
//! engine's [`MigrationTarget`], so the engine migrates a kernel device exactly as it migrates a
//! gmig vGPU. [`mock::MockVfio`] implements the seam in memory (an emulated kernel around a
//! [`crate::handle::MigrationHandle`]), records every call and fails on command, so every
//! transition and failure path is tested without `/dev/vfio`.
//!
//! Kernel facts the driver relies on:
//! * `VFIO_DEVICE_FEATURE_MIGRATION` answers `ENOTTY`/`EINVAL` on devices without v2 migration.
//! * A failed `MIG_DEVICE_STATE` SET leaves the device in the original state, some state along
//!   the path, or ERROR; the driver re-reads the state (GET) and reports it.
//! * `read()` on the data fd in PRE_COPY fails with `ENOMSG` when nothing is pending; a read of
//!   0 bytes in STOP_COPY is the end of the stream.

use std::io;

use crate::device::PrecopyInfo;
use crate::handle::ReadOutcome;
use crate::state::{self, DeviceState, MigrationFeatures};
use crate::target::{MigrationTarget, Result as TargetResult, TargetError};

pub(crate) mod error;

pub use crate::dma_log::IovaRange;
pub use error::{KernelError, Result};

/// The syscall seam: the migration operations of one kernel VFIO device fd.
///
/// Errors are `io::Error`s carrying the kernel's errno (`raw_os_error()`).
pub trait VfioMigrationOps {
    /// `VFIO_DEVICE_FEATURE_MIGRATION` GET: `Ok(None)` when the device has no v2 migration.
    fn migration_flags(&mut self) -> io::Result<Option<u64>>;
    /// `VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE` GET.
    fn get_state(&mut self) -> io::Result<u32>;
    /// `VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE` SET; the implementation keeps any returned
    /// `data_fd` for the data operations below.
    fn set_state(&mut self, state: u32) -> io::Result<()>;
    /// `VFIO_DEVICE_FEATURE_MIG_DATA_SIZE` GET.
    fn data_size(&mut self) -> io::Result<u64>;
    /// `VFIO_MIG_GET_PRECOPY_INFO` on the data fd.
    fn precopy_info(&mut self) -> io::Result<PrecopyInfo>;
    /// `read()` on the data fd.
    fn read_data(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// `write()` of all of `data` on the data fd.
    fn write_data(&mut self, data: &[u8]) -> io::Result<()>;
    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_START`; returns the page size the device chose.
    fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> io::Result<u64>;
    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP`.
    fn dma_logging_stop(&mut self) -> io::Result<()>;
    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT`: the bitmap of `range` (bit i = page i dirty,
    /// little-endian u64 words), read-and-clear.
    fn dma_logging_report(&mut self, range: IovaRange, page_size: u64) -> io::Result<Vec<u64>>;
    /// `VFIO_DEVICE_RESET`.
    fn reset(&mut self) -> io::Result<()>;
}

fn vfio_err_to_io(e: vfio_ioctls::VfioError) -> io::Error {
    use vfio_ioctls::VfioError as E;
    match e {
        E::VfioDeviceFeature(s) | E::VfioMigGetPrecopyInfo(s) => {
            io::Error::from_raw_os_error(s.errno())
        }
        E::VfioMigrationDataIo(io) => io,
        E::NoMigrationDataFd => io::Error::from_raw_os_error(libc::EBADF),
        E::DmaLoggingAlreadyStarted => io::Error::from_raw_os_error(libc::EBUSY),
        E::DmaLoggingNotStarted | E::DmaLoggingInvalidArgument(_) => {
            io::Error::from_raw_os_error(libc::EINVAL)
        }
        other => io::Error::other(other.to_string()),
    }
}

impl VfioMigrationOps for vfio_ioctls::VfioDevice {
    fn migration_flags(&mut self) -> io::Result<Option<u64>> {
        self.query_migration_support().map_err(vfio_err_to_io)
    }
    fn get_state(&mut self) -> io::Result<u32> {
        self.get_migration_state().map_err(vfio_err_to_io)
    }
    fn set_state(&mut self, state: u32) -> io::Result<()> {
        self.set_migration_state(state).map_err(vfio_err_to_io)
    }
    fn data_size(&mut self) -> io::Result<u64> {
        self.get_mig_data_size().map_err(vfio_err_to_io)
    }
    fn precopy_info(&mut self) -> io::Result<PrecopyInfo> {
        let p = self.mig_get_precopy_info().map_err(vfio_err_to_io)?;
        Ok(PrecopyInfo {
            initial_bytes: p.initial_bytes,
            dirty_bytes: p.dirty_bytes,
        })
    }
    fn read_data(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_migration_data(buf).map_err(vfio_err_to_io)
    }
    fn write_data(&mut self, data: &[u8]) -> io::Result<()> {
        self.write_migration_data(data).map_err(vfio_err_to_io)
    }
    fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> io::Result<u64> {
        let r: Vec<vfio_ioctls::DmaLoggingRange> = ranges
            .iter()
            .map(|r| vfio_ioctls::DmaLoggingRange {
                iova: r.iova,
                length: r.length,
            })
            .collect();
        self.start_dma_logging(page_size, &r)
            .map_err(vfio_err_to_io)
    }
    fn dma_logging_stop(&mut self) -> io::Result<()> {
        self.stop_dma_logging().map_err(vfio_err_to_io)
    }
    fn dma_logging_report(&mut self, range: IovaRange, page_size: u64) -> io::Result<Vec<u64>> {
        self.report_dma_logging(
            vfio_ioctls::DmaLoggingRange {
                iova: range.iova,
                length: range.length,
            },
            page_size,
        )
        .map_err(vfio_err_to_io)
    }
    fn reset(&mut self) -> io::Result<()> {
        // vfio-ioctls ignores the reset ioctl's result.
        vfio_ioctls::VfioDevice::reset(self);
        Ok(())
    }
}

fn op(op: &'static str) -> impl FnOnce(io::Error) -> KernelError {
    move |source| KernelError::Op { op, source }
}

/// A kernel VFIO device driven through the migration v2 uAPI.
#[derive(Debug)]
pub struct KernelDevice<O> {
    ops: O,
    features: MigrationFeatures,
    state: DeviceState,
    stream_open: bool,
    stream_ended: bool,
    streams_opened: u64,
}

impl<O: VfioMigrationOps> KernelDevice<O> {
    /// Queries the device's migration support and current state.
    pub fn new(mut ops: O) -> Result<Self> {
        let flags = ops
            .migration_flags()
            .map_err(op("VFIO_DEVICE_FEATURE_MIGRATION"))?
            .ok_or(KernelError::NotMigratable)?;
        let features = MigrationFeatures(flags).validate()?;
        let raw = ops
            .get_state()
            .map_err(op("VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE GET"))?;
        let state = DeviceState::try_from(raw).map_err(|_| KernelError::UnknownState(raw))?;
        Ok(KernelDevice {
            ops,
            features,
            state,
            // A stream opened before we were handed the device is not ours to use.
            stream_open: false,
            stream_ended: false,
            streams_opened: 0,
        })
    }

    /// The device's migration features.
    pub fn features(&self) -> MigrationFeatures {
        self.features
    }

    /// The state last set or read.
    pub fn state(&self) -> DeviceState {
        self.state
    }

    /// How many data streams this driver has opened (a new one per entry into the saving group
    /// and per RESUMING).
    pub fn streams_opened(&self) -> u64 {
        self.streams_opened
    }

    /// Whether a data stream is open.
    pub fn stream_open(&self) -> bool {
        self.stream_open
    }

    /// The seam (for tests: the mock's call log).
    pub fn ops(&self) -> &O {
        &self.ops
    }

    /// The seam, mutably.
    pub fn ops_mut(&mut self) -> &mut O {
        &mut self.ops
    }

    /// Re-reads the state from the kernel.
    pub fn refresh_state(&mut self) -> Result<DeviceState> {
        let raw = self
            .ops
            .get_state()
            .map_err(op("VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE GET"))?;
        self.state = DeviceState::try_from(raw).map_err(|_| KernelError::UnknownState(raw))?;
        Ok(self.state)
    }

    /// Requests `target`. Returns the path the kernel walks (computed with the same planner the
    /// kernel uses, for logging); on failure reports the state read back.
    pub fn set_state(&mut self, target: DeviceState) -> Result<Vec<DeviceState>> {
        let from = self.state;
        let path = state::plan(from, target, self.features)?;
        if path.is_empty() {
            return Ok(path);
        }
        if let Err(source) = self.ops.set_state(target.raw()) {
            // vfio-ioctls drops its cached data fd on any failure, so the stream is gone.
            self.stream_open = false;
            let now = self.refresh_state().unwrap_or(DeviceState::Error);
            self.state = now;
            return Err(KernelError::SetState {
                requested: target,
                from,
                now,
                errno: source.raw_os_error(),
                source,
            });
        }
        let stays_in_group = from.is_saving() && target.is_saving();
        if target.has_stream() && !stays_in_group {
            self.stream_open = true;
            self.stream_ended = false;
            self.streams_opened += 1;
        } else if !target.has_stream() {
            self.stream_open = false;
        }
        self.state = target;
        Ok(path)
    }

    /// Reads from the saving stream: `ENOMSG` becomes [`ReadOutcome::NoDataNow`], a 0-byte read
    /// in STOP_COPY [`ReadOutcome::End`].
    pub fn read(&mut self, buf: &mut [u8]) -> Result<ReadOutcome> {
        if !self.stream_open || !self.state.is_saving() {
            return Err(KernelError::NoStream {
                op: "read",
                state: self.state,
            });
        }
        if buf.is_empty() {
            return Ok(ReadOutcome::Data(0));
        }
        if self.stream_ended {
            return Ok(ReadOutcome::End);
        }
        match self.ops.read_data(buf) {
            Ok(0) if self.state == DeviceState::StopCopy => {
                self.stream_ended = true;
                Ok(ReadOutcome::End)
            }
            Ok(0) => Ok(ReadOutcome::NoDataNow),
            Ok(n) if n <= buf.len() => Ok(ReadOutcome::Data(n)),
            Ok(_) => Err(KernelError::Op {
                op: "read",
                source: io::Error::other("read returned more than the buffer"),
            }),
            Err(e) if e.raw_os_error() == Some(libc::ENOMSG) => Ok(ReadOutcome::NoDataNow),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(ReadOutcome::Data(0)),
            Err(e) => Err(KernelError::Op {
                op: "read",
                source: e,
            }),
        }
    }

    /// Writes all of `data` to the resuming stream.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        if !self.stream_open || self.state != DeviceState::Resuming {
            return Err(KernelError::NoStream {
                op: "write",
                state: self.state,
            });
        }
        self.ops.write_data(data).map_err(op("write"))
    }

    /// `VFIO_MIG_GET_PRECOPY_INFO`.
    pub fn precopy_info(&mut self) -> Result<PrecopyInfo> {
        if !self.stream_open {
            return Err(KernelError::NoStream {
                op: "VFIO_MIG_GET_PRECOPY_INFO",
                state: self.state,
            });
        }
        self.ops
            .precopy_info()
            .map_err(op("VFIO_MIG_GET_PRECOPY_INFO"))
    }

    /// `VFIO_DEVICE_FEATURE_MIG_DATA_SIZE`.
    pub fn stop_copy_size(&mut self) -> Result<u64> {
        self.ops
            .data_size()
            .map_err(op("VFIO_DEVICE_FEATURE_MIG_DATA_SIZE"))
    }

    /// `VFIO_DEVICE_RESET`: the device returns to RUNNING.
    pub fn reset(&mut self) -> Result<()> {
        self.stream_open = false;
        self.ops.reset().map_err(op("VFIO_DEVICE_RESET"))?;
        self.refresh_state()?;
        Ok(())
    }

    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_START`; returns the page size the device uses.
    pub fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> Result<u64> {
        self.ops
            .dma_logging_start(page_size, ranges)
            .map_err(op("VFIO_DEVICE_FEATURE_DMA_LOGGING_START"))
    }

    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT` (read and clear).
    pub fn dma_logging_report(&mut self, range: IovaRange, page_size: u64) -> Result<Vec<u64>> {
        self.ops
            .dma_logging_report(range, page_size)
            .map_err(op("VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT"))
    }

    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP`.
    pub fn dma_logging_stop(&mut self) -> Result<()> {
        self.ops
            .dma_logging_stop()
            .map_err(op("VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP"))
    }
}

impl KernelDevice<vfio_ioctls::VfioDevice> {
    /// Opens the kernel VFIO device at `sysfs` (e.g. `/sys/bus/mdev/devices/<uuid>` for an
    /// `mtty` instance, or `/sys/bus/pci/devices/0000:01:00.0`) in a new type1 container and
    /// queries its migration support. Needs `/dev/vfio/vfio` and permission on the group.
    pub fn open(sysfs: &std::path::Path) -> Result<Self> {
        let container = vfio_ioctls::VfioContainer::new(None).map_err(|e| KernelError::Op {
            op: "open /dev/vfio/vfio",
            source: vfio_err_to_io(e),
        })?;
        let ops: std::sync::Arc<dyn vfio_ioctls::VfioOps> = std::sync::Arc::new(container);
        let device =
            vfio_ioctls::VfioDevice::new(sysfs, ops, false).map_err(|e| KernelError::Op {
                op: "open VFIO device",
                source: vfio_err_to_io(e),
            })?;
        KernelDevice::new(device)
    }
}

impl<O: VfioMigrationOps> MigrationTarget for KernelDevice<O> {
    fn features(&mut self) -> TargetResult<MigrationFeatures> {
        Ok(self.features)
    }
    fn state(&mut self) -> TargetResult<DeviceState> {
        Ok(self.refresh_state()?)
    }
    fn set_state(&mut self, target: DeviceState) -> TargetResult<()> {
        KernelDevice::set_state(self, target)?;
        Ok(())
    }
    fn read_data(&mut self, buf: &mut [u8]) -> TargetResult<ReadOutcome> {
        Ok(self.read(buf)?)
    }
    fn write_data(&mut self, data: &[u8]) -> TargetResult<()> {
        Ok(self.write(data)?)
    }
    fn precopy_info(&mut self) -> TargetResult<PrecopyInfo> {
        Ok(KernelDevice::precopy_info(self)?)
    }
    fn stop_copy_size(&mut self) -> TargetResult<u64> {
        Ok(KernelDevice::stop_copy_size(self)?)
    }
    fn reset(&mut self) -> TargetResult<()> {
        KernelDevice::reset(self).map_err(TargetError::from)
    }
    fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> TargetResult<u64> {
        Ok(KernelDevice::dma_logging_start(self, page_size, ranges)?)
    }
    fn dma_logging_report(&mut self, range: IovaRange, page_size: u64) -> TargetResult<Vec<u64>> {
        Ok(KernelDevice::dma_logging_report(self, range, page_size)?)
    }
    fn dma_logging_stop(&mut self) -> TargetResult<()> {
        Ok(KernelDevice::dma_logging_stop(self)?)
    }
}

pub mod mock;
