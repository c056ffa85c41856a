//! The device-side state machine: a [`MigrationDevice`] behind the exact v2 uAPI semantics.
//!
//! [`MigrationHandle`] is what a VFIO front end (a vfio-user server, an in-process VMM, the test
//! harness) holds. A state request is planned with [`crate::state::plan`] and executed one
//! direct arc at a time on the device. The handle owns the data-stream bookkeeping:
//!
//! * entering the saving group (PRE_COPY, PRE_COPY_P2P, STOP_COPY) from outside opens a new
//!   stream, returned like the kernel's `data_fd`; moves inside the group keep it;
//! * STOP → RESUMING opens a fresh stream; leaving the group or RESUMING closes the stream, after
//!   which its [`StreamId`] is stale (reads and writes fail, like a disabled `data_fd`);
//! * reads in PRE_COPY return [`ReadOutcome::NoDataNow`] (`ENOMSG`) when nothing is pending; in
//!   STOP_COPY a read of zero bytes is [`ReadOutcome::End`], and stays so;
//! * a failed arc leaves the handle in a reported state: the arc's source if the device rolled
//!   back, ERROR otherwise; ERROR is left only by [`MigrationHandle::reset`].

use crate::device::{ArcFailure, DeviceError, MigrationDevice, PrecopyInfo};
use crate::dma_log::IovaRange;
use crate::state::{self, ArcKind, DeviceState, MigrationFeatures, StateError};

/// Errors of the handle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError {
    /// The request was refused before any arc ran (the kernel's `EINVAL`); nothing changed.
    #[error("state request refused: {0}")]
    Refused(#[from] StateError),
    /// A direct arc failed; the device is now in `now` (the arc's source after a rollback,
    /// ERROR otherwise).
    #[error("arc {from} -> {to} (towards {requested}) failed, device now {now}: {source}")]
    ArcFailed {
        /// The state that was requested.
        requested: DeviceState,
        /// Source of the failed arc.
        from: DeviceState,
        /// Destination of the failed arc.
        to: DeviceState,
        /// Where the device is now.
        now: DeviceState,
        /// The device's error.
        #[source]
        source: DeviceError,
    },
    /// The stream is not the open one (never opened, or closed by a state change): `EBADF`.
    #[error("data stream {given:?} is not open (open stream: {open:?})")]
    StaleStream {
        /// The stream used.
        given: StreamId,
        /// The stream currently open, if any.
        open: Option<StreamId>,
    },
    /// The operation is invalid in the current state (a write to a saving stream, PRECOPY_INFO
    /// outside PRE_COPY): `EINVAL`.
    #[error("{op} is invalid in state {state}")]
    WrongState {
        /// The operation attempted.
        op: &'static str,
        /// The current state.
        state: DeviceState,
    },
    /// The device failed a data operation (the state is unchanged).
    #[error("device data operation failed: {0}")]
    Device(#[from] DeviceError),
    /// The device broke the trait contract (returned more bytes than asked).
    #[error("device contract violation: {0}")]
    Contract(&'static str),
    /// The device reset failed; the device stays in ERROR.
    #[error("device reset failed: {0}")]
    ResetFailed(#[source] DeviceError),
}

/// Result type of the handle.
pub type Result<T> = std::result::Result<T, HandleError>;

/// Identity of one data stream (the analogue of a `data_fd`). Identities are never reused by a
/// handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// Direction of a data stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// Opened by entering the saving group; readable.
    Saving,
    /// Opened by STOP → RESUMING; writable.
    Resuming,
}

/// A data stream handed out by a state change (the kernel's `data_fd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataStream {
    /// Its identity.
    pub id: StreamId,
    /// Its direction.
    pub kind: StreamKind,
}

/// The result of a successful state request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The state the request started in.
    pub from: DeviceState,
    /// Every state entered, in order; the last is the requested state. Empty for a no-op.
    pub path: Vec<DeviceState>,
    /// The new stream, when this request opened one (entering the saving group or RESUMING).
    pub new_stream: Option<DataStream>,
}

/// The result of a read from a saving stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadOutcome {
    /// This many bytes were read (non-zero unless the buffer was empty).
    Data(usize),
    /// PRE_COPY only: nothing to read right now (`ENOMSG`); more may come.
    NoDataNow,
    /// STOP_COPY only: the stream is complete (a zero-length read).
    End,
}

#[derive(Debug, Clone, Copy)]
struct OpenStream {
    stream: DataStream,
    ended: bool,
    bytes: u64,
}

/// A migratable device driven through the VFIO migration v2 state machine.
#[derive(Debug)]
pub struct MigrationHandle<D> {
    device: D,
    features: MigrationFeatures,
    state: DeviceState,
    stream: Option<OpenStream>,
    next_stream: u64,
}

impl<D: MigrationDevice> MigrationHandle<D> {
    /// Wraps a running device. Fails if its features lack STOP_COPY.
    pub fn new(device: D) -> Result<Self> {
        let features = device.migration_features().validate()?;
        Ok(MigrationHandle {
            device,
            features,
            state: DeviceState::Running,
            stream: None,
            next_stream: 1,
        })
    }

    /// The device's migration features (`VFIO_DEVICE_FEATURE_MIGRATION`).
    pub fn features(&self) -> MigrationFeatures {
        self.features
    }

    /// The current state (`VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE` GET).
    pub fn state(&self) -> DeviceState {
        self.state
    }

    /// The open data stream, if any.
    pub fn open_stream(&self) -> Option<DataStream> {
        self.stream.map(|s| s.stream)
    }

    /// Bytes moved through the open stream so far.
    pub fn stream_bytes(&self) -> u64 {
        self.stream.map_or(0, |s| s.bytes)
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device, mutably (for the device's own, non-migration work: running a workload).
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// Gives the device back.
    pub fn into_device(self) -> D {
        self.device
    }

    /// Requests `target` (`VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE` SET).
    ///
    /// Runs the planned direct arcs in order. On success returns the path taken and the stream
    /// opened, if any. On an arc failure the handle is in the reported state (see
    /// [`HandleError::ArcFailed`]).
    pub fn set_state(&mut self, target: DeviceState) -> Result<Transition> {
        let from = self.state;
        let path = state::plan(from, target, self.features)?;
        let mut new_stream = None;
        for &hop in &path {
            let at = self.state;
            if let Err(failure) = self.run_arc(at, hop) {
                let now = if failure.rolled_back {
                    at
                } else {
                    self.stream = None;
                    DeviceState::Error
                };
                self.state = now;
                tracing::warn!(%at, %hop, %now, error = %failure.error, "migration arc failed");
                return Err(HandleError::ArcFailed {
                    requested: target,
                    from: at,
                    to: hop,
                    now,
                    source: failure.error,
                });
            }
            self.state = hop;
            match (at.has_stream(), hop.has_stream()) {
                (false, true) => {
                    let kind = if hop == DeviceState::Resuming {
                        StreamKind::Resuming
                    } else {
                        StreamKind::Saving
                    };
                    let stream = DataStream {
                        id: StreamId(self.next_stream),
                        kind,
                    };
                    self.next_stream += 1;
                    self.stream = Some(OpenStream {
                        stream,
                        ended: false,
                        bytes: 0,
                    });
                    new_stream = Some(stream);
                }
                (true, false) => self.stream = None,
                _ => {}
            }
        }
        Ok(Transition {
            from,
            path,
            new_stream,
        })
    }

    fn run_arc(
        &mut self,
        from: DeviceState,
        to: DeviceState,
    ) -> std::result::Result<(), ArcFailure> {
        let Some(kind) = ArcKind::of(from, to) else {
            // The planner only yields direct arcs; reaching here is a planner bug, reported as
            // a clean refusal rather than a panic.
            return Err(ArcFailure::rolled_back(DeviceError::Failed(format!(
                "{from} -> {to} is not a direct arc"
            ))));
        };
        let d = &mut self.device;
        match kind {
            ArcKind::QuiesceP2p => d.quiesce_p2p(),
            ArcKind::ResumeP2p => d.release_p2p(),
            ArcKind::Stop => d.stop(),
            ArcKind::Run => d.run(),
            ArcKind::StartPreCopy => d.start_precopy(),
            ArcKind::AbortPreCopy => d.abort_precopy(),
            ArcKind::StartStopCopy => d.start_stop_copy(),
            ArcKind::PreCopyToStopCopy => d.precopy_to_stop_copy(),
            ArcKind::EndStopCopy => d.end_stop_copy(),
            ArcKind::StartResuming => d.start_resuming(),
            ArcKind::FinishResuming => d.finish_resuming(),
        }
    }

    fn check_stream(&self, id: StreamId, kind: StreamKind) -> Result<OpenStream> {
        match self.stream {
            Some(s) if s.stream.id == id => {
                if s.stream.kind == kind {
                    Ok(s)
                } else {
                    Err(HandleError::WrongState {
                        op: match kind {
                            StreamKind::Saving => "reading the stream",
                            StreamKind::Resuming => "writing the stream",
                        },
                        state: self.state,
                    })
                }
            }
            other => Err(HandleError::StaleStream {
                given: id,
                open: other.map(|s| s.stream.id),
            }),
        }
    }

    /// Reads saving data from stream `id` (a `read()` on the `data_fd`).
    pub fn read(&mut self, id: StreamId, buf: &mut [u8]) -> Result<ReadOutcome> {
        let open = self.check_stream(id, StreamKind::Saving)?;
        if buf.is_empty() {
            return Ok(ReadOutcome::Data(0));
        }
        if open.ended {
            return Ok(ReadOutcome::End);
        }
        let n = self.device.save_read(buf)?;
        if n > buf.len() {
            return Err(HandleError::Contract(
                "save_read returned more than the buffer",
            ));
        }
        let stop_copy = self.state == DeviceState::StopCopy;
        if let Some(s) = self.stream.as_mut() {
            s.bytes = s.bytes.saturating_add(n as u64);
            if n == 0 && stop_copy {
                s.ended = true;
            }
        }
        Ok(match (n, stop_copy) {
            (0, true) => ReadOutcome::End,
            (0, false) => ReadOutcome::NoDataNow,
            (n, _) => ReadOutcome::Data(n),
        })
    }

    /// Writes resuming data to stream `id` (a `write()` on the `data_fd`); all of `data` is
    /// accepted or an error is returned.
    pub fn write(&mut self, id: StreamId, data: &[u8]) -> Result<usize> {
        self.check_stream(id, StreamKind::Resuming)?;
        if data.is_empty() {
            return Ok(0);
        }
        self.device.resume_write(data)?;
        if let Some(s) = self.stream.as_mut() {
            s.bytes = s.bytes.saturating_add(data.len() as u64);
        }
        Ok(data.len())
    }

    /// `VFIO_MIG_GET_PRECOPY_INFO` on stream `id`; valid only in PRE_COPY and PRE_COPY_P2P.
    pub fn precopy_info(&mut self, id: StreamId) -> Result<PrecopyInfo> {
        self.check_stream(id, StreamKind::Saving)?;
        if !matches!(self.state, DeviceState::PreCopy | DeviceState::PreCopyP2p) {
            return Err(HandleError::WrongState {
                op: "PRECOPY_INFO",
                state: self.state,
            });
        }
        Ok(self.device.precopy_info()?)
    }

    /// `VFIO_DEVICE_FEATURE_MIG_DATA_SIZE`: the device's estimate of the stop-copy size.
    pub fn stop_copy_size(&mut self) -> Result<u64> {
        if matches!(self.state, DeviceState::Error | DeviceState::Resuming) {
            return Err(HandleError::WrongState {
                op: "MIG_DATA_SIZE",
                state: self.state,
            });
        }
        Ok(self.device.stop_copy_size()?)
    }

    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_START`, forwarded to the device's [`crate::device::DirtyLogging`].
    pub fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> Result<u64> {
        Ok(self.device.dma_logging_start(page_size, ranges)?)
    }

    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT` (read and clear).
    pub fn dma_logging_report(
        &mut self,
        iova: u64,
        length: u64,
        page_size: u64,
    ) -> Result<Vec<u64>> {
        Ok(self.device.dma_logging_report(iova, length, page_size)?)
    }

    /// `VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP`.
    pub fn dma_logging_stop(&mut self) -> Result<()> {
        Ok(self.device.dma_logging_stop()?)
    }

    /// `VFIO_DEVICE_RESET`: closes any stream and returns the device to RUNNING. A failed reset
    /// leaves the device in ERROR.
    pub fn reset(&mut self) -> Result<()> {
        self.stream = None;
        match self.device.reset() {
            Ok(()) => {
                self.state = DeviceState::Running;
                Ok(())
            }
            Err(e) => {
                self.state = DeviceState::Error;
                Err(HandleError::ResetFailed(e))
            }
        }
    }
}
