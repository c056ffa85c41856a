//! An in-memory [`VfioMigrationOps`]: a simulated kernel VFIO device that records every call and
//! fails on command.
//!
//! The simulated device is a [`MigrationHandle`] over any [`MigrationDevice`], so its state
//! machine, data-fd and ENOMSG behaviour are the crate's own v2 semantics, and the kernel-side
//! driver ([`super::KernelDevice`]) can be tested against them call by call.

use std::io;

use super::VfioMigrationOps;
use crate::device::{MigrationDevice, PrecopyInfo};
use crate::dma_log::IovaRange;
use crate::handle::{HandleError, MigrationHandle, ReadOutcome, StreamId};
use crate::state::DeviceState;

/// One recorded call on the seam.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `migration_flags`.
    MigrationFlags,
    /// `get_state`.
    GetState,
    /// `set_state(raw)`.
    SetState(u32),
    /// `data_size`.
    DataSize,
    /// `precopy_info`.
    PrecopyInfo,
    /// `read_data` with this buffer length.
    Read(usize),
    /// `write_data` of this many bytes.
    Write(usize),
    /// `dma_logging_start`.
    LogStart(u64, Vec<IovaRange>),
    /// `dma_logging_stop`.
    LogStop,
    /// `dma_logging_report`.
    LogReport(IovaRange, u64),
    /// `reset`.
    Reset,
}

/// Which call an injected failure hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// `migration_flags`.
    MigrationFlags,
    /// `get_state`.
    GetState,
    /// `set_state`.
    SetState,
    /// `data_size`.
    DataSize,
    /// `precopy_info`.
    PrecopyInfo,
    /// `read_data`.
    Read,
    /// `write_data`.
    Write,
    /// any DMA logging call.
    DmaLog,
    /// `reset`.
    Reset,
}

/// A simulated kernel VFIO device.
#[derive(Debug)]
pub struct MockVfio<D> {
    handle: MigrationHandle<D>,
    /// Every call, in order.
    pub calls: Vec<Call>,
    fail: Vec<(CallKind, i32)>,
    no_migration: bool,
    fd: Option<StreamId>,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

fn handle_errno(e: &HandleError) -> i32 {
    match e {
        HandleError::StaleStream { .. } => libc::EBADF,
        HandleError::ArcFailed { .. } | HandleError::ResetFailed(_) => libc::EIO,
        HandleError::Device(crate::device::DeviceError::StreamTooLarge { .. }) => libc::ENOSPC,
        _ => libc::EINVAL,
    }
}

impl<D: MigrationDevice> MockVfio<D> {
    /// A simulated kernel device around `device` (RUNNING).
    pub fn new(device: D) -> Result<Self, HandleError> {
        Ok(MockVfio {
            handle: MigrationHandle::new(device)?,
            calls: Vec::new(),
            fail: Vec::new(),
            no_migration: false,
            fd: None,
        })
    }

    /// Makes the device answer `VFIO_DEVICE_FEATURE_MIGRATION` with `ENOTTY` (no v2 support).
    pub fn without_migration(mut self) -> Self {
        self.no_migration = true;
        self
    }

    /// Makes the next call of `kind` fail with `errno` before reaching the device. One-shot.
    pub fn fail_next(&mut self, kind: CallKind, errno: i32) {
        self.fail.push((kind, errno));
    }

    /// The simulated device's state machine (to drive the device itself, e.g. run a workload,
    /// or to inject device-level failures).
    pub fn handle(&mut self) -> &mut MigrationHandle<D> {
        &mut self.handle
    }

    /// The `SetState` calls recorded, as states.
    pub fn set_state_calls(&self) -> Vec<u32> {
        self.calls
            .iter()
            .filter_map(|c| match c {
                Call::SetState(s) => Some(*s),
                _ => None,
            })
            .collect()
    }

    fn injected(&mut self, kind: CallKind) -> io::Result<()> {
        if let Some(i) = self.fail.iter().position(|(k, _)| *k == kind) {
            let (_, e) = self.fail.remove(i);
            return Err(errno(e));
        }
        Ok(())
    }

    fn fd(&self) -> io::Result<StreamId> {
        self.fd.ok_or_else(|| errno(libc::EBADF))
    }
}

impl<D: MigrationDevice> VfioMigrationOps for MockVfio<D> {
    fn migration_flags(&mut self) -> io::Result<Option<u64>> {
        self.calls.push(Call::MigrationFlags);
        self.injected(CallKind::MigrationFlags)?;
        if self.no_migration {
            return Ok(None);
        }
        Ok(Some(self.handle.features().0))
    }

    fn get_state(&mut self) -> io::Result<u32> {
        self.calls.push(Call::GetState);
        self.injected(CallKind::GetState)?;
        Ok(self.handle.state().raw())
    }

    fn set_state(&mut self, state: u32) -> io::Result<()> {
        self.calls.push(Call::SetState(state));
        self.injected(CallKind::SetState)?;
        let target = DeviceState::try_from(state).map_err(|_| errno(libc::EINVAL))?;
        match self.handle.set_state(target) {
            Ok(t) => {
                if let Some(s) = t.new_stream {
                    self.fd = Some(s.id);
                } else if !target.has_stream() {
                    self.fd = None;
                }
                Ok(())
            }
            Err(e) => {
                // Like vfio-ioctls, the cached fd is dropped on any failure.
                self.fd = None;
                Err(errno(handle_errno(&e)))
            }
        }
    }

    fn data_size(&mut self) -> io::Result<u64> {
        self.calls.push(Call::DataSize);
        self.injected(CallKind::DataSize)?;
        self.handle
            .stop_copy_size()
            .map_err(|e| errno(handle_errno(&e)))
    }

    fn precopy_info(&mut self) -> io::Result<PrecopyInfo> {
        self.calls.push(Call::PrecopyInfo);
        self.injected(CallKind::PrecopyInfo)?;
        let fd = self.fd()?;
        self.handle
            .precopy_info(fd)
            .map_err(|e| errno(handle_errno(&e)))
    }

    fn read_data(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.calls.push(Call::Read(buf.len()));
        self.injected(CallKind::Read)?;
        let fd = self.fd()?;
        match self.handle.read(fd, buf) {
            Ok(ReadOutcome::Data(n)) => Ok(n),
            Ok(ReadOutcome::End) => Ok(0),
            Ok(ReadOutcome::NoDataNow) => Err(errno(libc::ENOMSG)),
            Err(e) => Err(errno(handle_errno(&e))),
        }
    }

    fn write_data(&mut self, data: &[u8]) -> io::Result<()> {
        self.calls.push(Call::Write(data.len()));
        self.injected(CallKind::Write)?;
        let fd = self.fd()?;
        self.handle
            .write(fd, data)
            .map(|_| ())
            .map_err(|e| errno(handle_errno(&e)))
    }

    fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> io::Result<u64> {
        self.calls.push(Call::LogStart(page_size, ranges.to_vec()));
        self.injected(CallKind::DmaLog)?;
        self.handle
            .device_mut()
            .dma_logging_start(page_size, ranges)
            .map_err(|_| errno(libc::EINVAL))
    }

    fn dma_logging_stop(&mut self) -> io::Result<()> {
        self.calls.push(Call::LogStop);
        self.injected(CallKind::DmaLog)?;
        self.handle
            .device_mut()
            .dma_logging_stop()
            .map_err(|_| errno(libc::EINVAL))
    }

    fn dma_logging_report(&mut self, range: IovaRange, page_size: u64) -> io::Result<Vec<u64>> {
        self.calls.push(Call::LogReport(range, page_size));
        self.injected(CallKind::DmaLog)?;
        self.handle
            .device_mut()
            .dma_logging_report(range.iova, range.length, page_size)
            .map_err(|_| errno(libc::EINVAL))
    }

    fn reset(&mut self) -> io::Result<()> {
        self.calls.push(Call::Reset);
        self.injected(CallKind::Reset)?;
        self.fd = None;
        self.handle.reset().map_err(|e| errno(handle_errno(&e)))
    }
}
