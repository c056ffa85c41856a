//! Emulation of the deprecated VFIO migration **v1** region (Linux 5.8–5.17), over the same
//! [`MigrationDevice`] trait, for the kernels and QEMUs (5.x–7.x) of the GVT-g migration era.
//!
//! v1 exposed migration as a device region (`VFIO_REGION_TYPE_MIGRATION_DEPRECATED`, subtype
//! `VFIO_REGION_SUBTYPE_MIGRATION_DEPRECATED`) starting with `struct vfio_device_migration_info`:
//!
//! | offset | size | field | access |
//! |---|---|---|---|
//! | 0 | 4 | `device_state` (bits `_RUNNING` 1, `_SAVING` 2, `_RESUMING` 4) | read/write |
//! | 4 | 4 | `reserved` | read as 0 |
//! | 8 | 8 | `pending_bytes` | read: starts a save iteration, bytes still to save |
//! | 16 | 8 | `data_offset` | read: stages the next buffer; its offset in the region |
//! | 24 | 8 | `data_size` | read (saving): staged bytes; write (resuming): bytes written at `data_offset` |
//!
//! and a data section at [`V1_DATA_OFFSET`]. The offsets come from `vfio-bindings` (`offset_of!`
//! on `vfio_device_migration_info`), not from hand-written numbers.
//!
//! State bits map to v2 states: `_RUNNING` → RUNNING, `_SAVING|_RUNNING` → PRE_COPY (emulated
//! with nothing to pre-copy on a device without PRE_COPY), `_SAVING` → STOP_COPY, `0` → STOP,
//! `_RESUMING` → RESUMING; ERROR reads back as `_SAVING|_RESUMING`, v1's error state. A write
//! of any other combination with `_RESUMING` is refused.

use std::mem::offset_of;

use vfio_bindings::bindings::vfio::{
    vfio_device_migration_info, VFIO_DEVICE_STATE_MASK, VFIO_DEVICE_STATE_V1_RESUMING,
    VFIO_DEVICE_STATE_V1_RUNNING, VFIO_DEVICE_STATE_V1_SAVING, VFIO_DEVICE_STATE_V1_STOP,
};

use crate::device::MigrationDevice;
use crate::handle::{HandleError, MigrationHandle, ReadOutcome, StreamId};
use crate::state::{DeviceState, MigrationFeatures};

/// Offset of `device_state`.
pub const OFF_DEVICE_STATE: u64 = offset_of!(vfio_device_migration_info, device_state) as u64;
/// Offset of `reserved`.
pub const OFF_RESERVED: u64 = offset_of!(vfio_device_migration_info, reserved) as u64;
/// Offset of `pending_bytes`.
pub const OFF_PENDING_BYTES: u64 = offset_of!(vfio_device_migration_info, pending_bytes) as u64;
/// Offset of `data_offset`.
pub const OFF_DATA_OFFSET: u64 = offset_of!(vfio_device_migration_info, data_offset) as u64;
/// Offset of `data_size`.
pub const OFF_DATA_SIZE: u64 = offset_of!(vfio_device_migration_info, data_size) as u64;
/// Size of the header structure.
pub const HEADER_SIZE: u64 = std::mem::size_of::<vfio_device_migration_info>() as u64;
/// Where the data section starts (page aligned, so it can be mmapped as v1 allowed).
pub const V1_DATA_OFFSET: u64 = 4096;
/// Default size of the data section.
pub const DEFAULT_WINDOW: usize = 64 * 1024;
/// v1's error state (`_SAVING | _RESUMING`).
pub const V1_ERROR_STATE: u32 = VFIO_DEVICE_STATE_V1_SAVING | VFIO_DEVICE_STATE_V1_RESUMING;

/// Errors of the v1 emulation (the region access would fail with `EINVAL`/`EIO`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum V1Error {
    /// An access that does not match a field exactly, or lies outside the region.
    #[error("bad region access at offset 0x{offset:x}, {len} bytes")]
    BadAccess {
        /// Offset in the region.
        offset: u64,
        /// Access size.
        len: usize,
    },
    /// A write to a read-only field.
    #[error("field at offset 0x{0:x} is read-only")]
    ReadOnly(u64),
    /// A `device_state` value v1 does not allow.
    #[error("invalid v1 device_state 0x{0:x}")]
    InvalidState(u32),
    /// A field access that makes no sense in the current state (e.g. `pending_bytes` while
    /// running, `data_size` writes while saving).
    #[error("{field} access invalid in v1 state 0x{state:x}")]
    WrongPhase {
        /// The field.
        field: &'static str,
        /// Current v1 `device_state`.
        state: u32,
    },
    /// `data_size` larger than the data section.
    #[error("data_size 0x{size:x} exceeds the data section (0x{window:x})")]
    TooLarge {
        /// Size written.
        size: u64,
        /// Data section size.
        window: usize,
    },
    /// The underlying v2 state machine failed.
    #[error(transparent)]
    Handle(#[from] HandleError),
    /// The save or load loop's sink or source failed.
    #[error("stream I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// Result type of the v1 emulation.
pub type Result<T> = std::result::Result<T, V1Error>;

/// The v1 `device_state` bits for a v2 state.
pub fn v1_bits(state: DeviceState) -> u32 {
    match state {
        DeviceState::Running | DeviceState::RunningP2p => VFIO_DEVICE_STATE_V1_RUNNING,
        DeviceState::PreCopy | DeviceState::PreCopyP2p => {
            VFIO_DEVICE_STATE_V1_RUNNING | VFIO_DEVICE_STATE_V1_SAVING
        }
        DeviceState::StopCopy => VFIO_DEVICE_STATE_V1_SAVING,
        DeviceState::Stop => VFIO_DEVICE_STATE_V1_STOP,
        DeviceState::Resuming => VFIO_DEVICE_STATE_V1_RESUMING,
        DeviceState::Error => V1_ERROR_STATE,
    }
}

/// The v2 state a v1 `device_state` write asks for.
pub fn v2_target(bits: u32) -> Result<DeviceState> {
    const R: u32 = VFIO_DEVICE_STATE_V1_RUNNING;
    const S: u32 = VFIO_DEVICE_STATE_V1_SAVING;
    const L: u32 = VFIO_DEVICE_STATE_V1_RESUMING;
    match bits & VFIO_DEVICE_STATE_MASK {
        0 => Ok(DeviceState::Stop),
        x if x == R => Ok(DeviceState::Running),
        x if x == R | S => Ok(DeviceState::PreCopy),
        x if x == S => Ok(DeviceState::StopCopy),
        x if x == L => Ok(DeviceState::Resuming),
        _ => Err(V1Error::InvalidState(bits)),
    }
}

/// A v1 migration region emulated over a v2 [`MigrationHandle`].
#[derive(Debug)]
pub struct V1Region<D> {
    handle: MigrationHandle<D>,
    window: Vec<u8>,
    window_cap: usize,
    /// Bytes currently staged in `window` (saving) or declared by `data_size` (resuming).
    staged: usize,
    /// Whether `data_offset` handed the staged window out (the next `pending_bytes` read drops it).
    handed_out: bool,
    stream: Option<StreamId>,
    ended: bool,
    /// `_SAVING|_RUNNING` on a device without PRE_COPY: running, nothing to pre-copy.
    emulated_precopy: bool,
}

impl<D: MigrationDevice> V1Region<D> {
    /// A region over a running device, with a data section of `window` bytes (at least 1).
    pub fn new(handle: MigrationHandle<D>, window: usize) -> V1Region<D> {
        let window_cap = window.max(1);
        V1Region {
            handle,
            window: vec![0; window_cap],
            window_cap,
            staged: 0,
            handed_out: false,
            stream: None,
            ended: false,
            emulated_precopy: false,
        }
    }

    /// Size of the whole region (header page plus data section).
    pub fn region_size(&self) -> u64 {
        V1_DATA_OFFSET + self.window_cap as u64
    }

    /// The v2 handle underneath.
    pub fn handle(&mut self) -> &mut MigrationHandle<D> {
        &mut self.handle
    }

    /// Gives the handle back.
    pub fn into_handle(self) -> MigrationHandle<D> {
        self.handle
    }

    /// The current v1 `device_state`.
    pub fn device_state(&self) -> u32 {
        if self.emulated_precopy {
            VFIO_DEVICE_STATE_V1_RUNNING | VFIO_DEVICE_STATE_V1_SAVING
        } else {
            v1_bits(self.handle.state())
        }
    }

    /// `VFIO_DEVICE_RESET` through the region's device.
    pub fn reset(&mut self) -> Result<()> {
        self.emulated_precopy = false;
        self.stream = None;
        self.staged = 0;
        self.handle.reset()?;
        Ok(())
    }

    fn set_device_state(&mut self, bits: u32) -> Result<()> {
        let mut target = v2_target(bits)?;
        let precopy_capable = self.handle.features().contains(MigrationFeatures::PRE_COPY);
        let wants_emulated = target == DeviceState::PreCopy && !precopy_capable;
        if wants_emulated {
            target = DeviceState::Running;
        }
        let result = self.handle.set_state(target);
        self.emulated_precopy = wants_emulated && result.is_ok();
        let t = result?;
        if let Some(s) = t.new_stream {
            self.stream = Some(s.id);
            self.staged = 0;
            self.handed_out = false;
            self.ended = false;
        } else if !target.has_stream() {
            self.stream = None;
            self.staged = 0;
        }
        Ok(())
    }

    fn saving(&self) -> bool {
        self.handle.state().is_saving() || self.emulated_precopy
    }

    /// Fills the window from the stream (if it is not already holding unconsumed data).
    fn stage(&mut self) -> Result<()> {
        if self.staged > 0 && !self.handed_out {
            return Ok(());
        }
        self.staged = 0;
        self.handed_out = false;
        let Some(id) = self.stream else {
            return Ok(());
        };
        while self.staged < self.window_cap && !self.ended {
            let buf = self
                .window
                .get_mut(self.staged..)
                .ok_or(V1Error::BadAccess {
                    offset: V1_DATA_OFFSET + self.staged as u64,
                    len: 0,
                })?;
            match self.handle.read(id, buf)? {
                ReadOutcome::Data(n) => self.staged += n,
                ReadOutcome::NoDataNow => break,
                ReadOutcome::End => self.ended = true,
            }
        }
        Ok(())
    }

    fn pending_bytes(&mut self) -> Result<u64> {
        if !self.saving() {
            return Err(V1Error::WrongPhase {
                field: "pending_bytes",
                state: self.device_state(),
            });
        }
        if self.emulated_precopy {
            return Ok(0);
        }
        // A new iteration: the window handed out last time has been consumed.
        self.stage()?;
        let beyond = match self.handle.state() {
            DeviceState::StopCopy if self.ended => 0,
            DeviceState::StopCopy => self.handle.stop_copy_size()?,
            _ => match self.stream {
                Some(id) => {
                    let info = self.handle.precopy_info(id)?;
                    info.initial_bytes.saturating_add(info.dirty_bytes)
                }
                None => 0,
            },
        };
        Ok((self.staged as u64).saturating_add(beyond))
    }

    /// Reads `buf.len()` bytes of the region at `offset` (a `pread` on the region).
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let bad = V1Error::BadAccess {
            offset,
            len: buf.len(),
        };
        match (offset, buf.len()) {
            (OFF_DEVICE_STATE, 4) => buf.copy_from_slice(&self.device_state().to_le_bytes()),
            (OFF_RESERVED, 4) => buf.copy_from_slice(&0u32.to_le_bytes()),
            (OFF_PENDING_BYTES, 8) => {
                let p = self.pending_bytes()?;
                buf.copy_from_slice(&p.to_le_bytes());
            }
            (OFF_DATA_OFFSET, 8) => {
                if self.saving() && !self.emulated_precopy {
                    self.stage()?;
                    self.handed_out = true;
                } else if self.handle.state() != DeviceState::Resuming {
                    return Err(V1Error::WrongPhase {
                        field: "data_offset",
                        state: self.device_state(),
                    });
                }
                buf.copy_from_slice(&V1_DATA_OFFSET.to_le_bytes());
            }
            (OFF_DATA_SIZE, 8) => buf.copy_from_slice(&(self.staged as u64).to_le_bytes()),
            _ => {
                let rel = offset.checked_sub(V1_DATA_OFFSET).ok_or(bad)?;
                let start = usize::try_from(rel).map_err(|_| V1Error::BadAccess {
                    offset,
                    len: buf.len(),
                })?;
                let end = start.checked_add(buf.len()).ok_or(V1Error::BadAccess {
                    offset,
                    len: buf.len(),
                })?;
                let src = self.window.get(start..end).ok_or(V1Error::BadAccess {
                    offset,
                    len: buf.len(),
                })?;
                buf.copy_from_slice(src);
            }
        }
        Ok(())
    }

    /// Writes `data` into the region at `offset` (a `pwrite` on the region).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let bad = || V1Error::BadAccess {
            offset,
            len: data.len(),
        };
        match (offset, data.len()) {
            (OFF_DEVICE_STATE, 4) => {
                let mut b = [0u8; 4];
                b.copy_from_slice(data);
                self.set_device_state(u32::from_le_bytes(b))
            }
            (OFF_RESERVED, 4) | (OFF_PENDING_BYTES | OFF_DATA_OFFSET, 8) => {
                Err(V1Error::ReadOnly(offset))
            }
            (OFF_DATA_SIZE, 8) => {
                let mut b = [0u8; 8];
                b.copy_from_slice(data);
                let size = u64::from_le_bytes(b);
                let (Some(id), DeviceState::Resuming) = (self.stream, self.handle.state()) else {
                    return Err(V1Error::WrongPhase {
                        field: "data_size write",
                        state: self.device_state(),
                    });
                };
                let n = usize::try_from(size)
                    .ok()
                    .filter(|n| *n <= self.window_cap)
                    .ok_or(V1Error::TooLarge {
                        size,
                        window: self.window_cap,
                    })?;
                let bytes = self.window.get(..n).ok_or_else(bad)?;
                self.handle.write(id, bytes)?;
                self.staged = n;
                Ok(())
            }
            _ => {
                if self.handle.state() != DeviceState::Resuming {
                    return Err(V1Error::WrongPhase {
                        field: "data section write",
                        state: self.device_state(),
                    });
                }
                let rel = offset.checked_sub(V1_DATA_OFFSET).ok_or_else(bad)?;
                let start = usize::try_from(rel).map_err(|_| bad())?;
                let end = start.checked_add(data.len()).ok_or_else(bad)?;
                let dst = self.window.get_mut(start..end).ok_or_else(bad)?;
                dst.copy_from_slice(data);
                Ok(())
            }
        }
    }

    fn read_u64(&mut self, offset: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn write_state(&mut self, bits: u32) -> Result<()> {
        self.write(OFF_DEVICE_STATE, &bits.to_le_bytes())
    }

    /// One save iteration as QEMU's v1 driver did it: read `pending_bytes`; if non-zero read
    /// `data_offset` and `data_size` and copy the data out. Returns the bytes copied (0 when
    /// nothing was pending).
    pub fn save_iteration(&mut self, sink: &mut dyn std::io::Write) -> Result<u64> {
        let pending = self.read_u64(OFF_PENDING_BYTES)?;
        if pending == 0 {
            return Ok(0);
        }
        let off = self.read_u64(OFF_DATA_OFFSET)?;
        let size = self.read_u64(OFF_DATA_SIZE)?;
        let size_usize = usize::try_from(size).map_err(|_| V1Error::TooLarge {
            size,
            window: self.window_cap,
        })?;
        let mut buf = vec![0u8; size_usize.min(self.window_cap)];
        self.read(off, &mut buf)?;
        sink.write_all(&buf)?;
        Ok(size)
    }

    /// The v1 save sequence (QEMU 5.x–7.x): `_SAVING|_RUNNING` and iterate while `pending_bytes`
    /// is non-zero (if `precopy`), run `between`, then `_SAVING` and iterate until
    /// `pending_bytes` is 0, then `device_state = 0` (STOP). Returns (pre-copy, stop-copy) bytes.
    pub fn save(
        &mut self,
        sink: &mut dyn std::io::Write,
        precopy: bool,
        mut between: impl FnMut(&mut Self) -> Result<()>,
    ) -> Result<(u64, u64)> {
        let mut pre = 0u64;
        if precopy {
            self.write_state(VFIO_DEVICE_STATE_V1_RUNNING | VFIO_DEVICE_STATE_V1_SAVING)?;
            loop {
                let n = self.save_iteration(sink)?;
                if n == 0 {
                    break;
                }
                pre += n;
            }
        }
        between(self)?;
        self.write_state(VFIO_DEVICE_STATE_V1_SAVING)?;
        let mut stop = 0u64;
        loop {
            let n = self.save_iteration(sink)?;
            if n == 0 {
                break;
            }
            stop += n;
        }
        self.write_state(VFIO_DEVICE_STATE_V1_STOP)?;
        Ok((pre, stop))
    }

    /// The v1 resume sequence: `_RESUMING`; per buffer read `data_offset`, write the bytes there,
    /// write `data_size`; finally `_RUNNING` (which validates the stream).
    pub fn load(&mut self, source: &mut dyn std::io::Read) -> Result<u64> {
        self.write_state(VFIO_DEVICE_STATE_V1_RESUMING)?;
        let mut buf = vec![0u8; self.window_cap];
        let mut total = 0u64;
        loop {
            let n = source.read(&mut buf)?;
            if n == 0 {
                break;
            }
            let off = self.read_u64(OFF_DATA_OFFSET)?;
            let bytes = buf.get(..n).ok_or(V1Error::BadAccess {
                offset: off,
                len: n,
            })?;
            self.write(off, bytes)?;
            self.write(OFF_DATA_SIZE, &(n as u64).to_le_bytes())?;
            total += n as u64;
        }
        self.write_state(VFIO_DEVICE_STATE_V1_RUNNING)?;
        Ok(total)
    }
}
