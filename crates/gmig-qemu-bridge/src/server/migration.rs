//! Migration handlers: DEVICE_FEATURE (migration v2 and DMA logging), MIG_DATA_READ and
//! MIG_DATA_WRITE, through the device's migration handle.

use gmig_vfio_migration::dma_log::MAX_RANGES;
use gmig_vfio_migration::{DeviceState, IovaRange, ReadOutcome};

use super::device::UserDevice;
use super::state::DmaLogControl;
use super::state::Server;
use super::MAX_DATA_XFER;
use crate::proto::{
    Errno, Feature, MigData, Put, Reader, DMA_LOGGING_CONTROL_LEN, DMA_LOGGING_REPORT_LEN,
    FEATURE_DMA_LOGGING_REPORT, FEATURE_DMA_LOGGING_START, FEATURE_DMA_LOGGING_STOP, FEATURE_GET,
    FEATURE_GFX_PLANE, FEATURE_MIGRATION, FEATURE_MIG_DATA_SIZE, FEATURE_MIG_DEVICE_STATE,
    FEATURE_MIG_PRECOPY_INFO, FEATURE_PROBE, FEATURE_SET,
};

impl<D: UserDevice> Server<D> {
    pub(super) fn feature(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let (f, data) = Feature::parse(p).map_err(|_| libc::EINVAL)?;
        if f.index() == FEATURE_GFX_PLANE {
            return self.gfx_plane(f, data);
        }
        let ops = f.flags & (FEATURE_GET | FEATURE_SET | FEATURE_PROBE);
        // argsz covers at least what was sent; a GET's argsz is the room for its reply, which
        // for MIGRATION, MIG_DEVICE_STATE and MIG_DATA_SIZE is 8 bytes of data (the request may
        // carry them, as a kernel-style buffer, or only the header, as libvfio-user's client
        // sends); a DMA log report's room is checked against its bitmap below.
        let reply_data = match (f.index(), ops) {
            (FEATURE_MIGRATION | FEATURE_MIG_DEVICE_STATE | FEATURE_MIG_DATA_SIZE, FEATURE_GET) => {
                8
            }
            (FEATURE_MIG_PRECOPY_INFO, FEATURE_GET) => 16,
            _ => 0,
        };
        if (f.argsz as usize) < Feature::LEN + data.len().max(reply_data) {
            return Err(libc::EINVAL);
        }
        // DMA_LOGGING_START with no ranges logs every mapped region the device can reach
        // (listed before the device is borrowed).
        let mapped: Vec<IovaRange> = if f.index() == FEATURE_DMA_LOGGING_START {
            self.dma
                .iter()
                .filter(|r| r.file.is_some() || r.remote)
                .map(|r| IovaRange {
                    iova: r.address,
                    length: r.size,
                })
                .collect()
        } else {
            Vec::new()
        };
        let controls = self.controls;
        let logging = matches!(
            f.index(),
            FEATURE_DMA_LOGGING_START | FEATURE_DMA_LOGGING_STOP | FEATURE_DMA_LOGGING_REPORT
        );
        if controls.no_migration || (logging && controls.dma_log == DmaLogControl::Off) {
            return Err(libc::ENOTSUP);
        }
        let h = self.device.migration().ok_or(libc::ENOTSUP)?;
        let (get, set) = match f.index() {
            FEATURE_MIGRATION
            | FEATURE_MIG_DATA_SIZE
            | FEATURE_DMA_LOGGING_REPORT
            | FEATURE_MIG_PRECOPY_INFO => (true, false),
            FEATURE_MIG_DEVICE_STATE => (true, true),
            FEATURE_DMA_LOGGING_START | FEATURE_DMA_LOGGING_STOP => (false, true),
            _ => return Err(libc::ENOTSUP),
        };
        if ops & FEATURE_PROBE != 0 {
            if (ops & FEATURE_GET != 0 && !get) || (ops & FEATURE_SET != 0 && !set) {
                return Err(libc::ENOTSUP);
            }
            return Ok(Feature::to_bytes(f.flags, &[]));
        }
        let mut out = Vec::new();
        match (f.index(), ops) {
            (FEATURE_MIGRATION, FEATURE_GET) => out.put64(h.features().0),
            (FEATURE_MIG_DATA_SIZE, FEATURE_GET) => {
                out.put64(h.stop_copy_size().map_err(|_| libc::EINVAL)?);
            }
            (FEATURE_MIG_PRECOPY_INFO, FEATURE_GET) => {
                let id = h.open_stream().map(|s| s.id).ok_or(libc::EINVAL)?;
                let info = h.precopy_info(id).map_err(|_| libc::EINVAL)?;
                out.put64(info.initial_bytes);
                out.put64(info.dirty_bytes);
            }
            (FEATURE_MIG_DEVICE_STATE, FEATURE_GET) => {
                out.put32(h.state() as u32);
                out.put32(u32::MAX);
            }
            (FEATURE_MIG_DEVICE_STATE, FEATURE_SET) => {
                let mut r = Reader::new(data);
                let want = r.u32().map_err(|_| libc::EINVAL)?;
                let state = DeviceState::try_from(want).map_err(|_| libc::EINVAL)?;
                if state == DeviceState::Resuming {
                    // A new stream: its refusal, if any, is logged again.
                    self.refusal_logged = None;
                }
                h.set_state(state).map_err(|_| libc::EINVAL)?;
                out.put32(h.state() as u32);
                out.put32(u32::MAX);
            }
            (FEATURE_DMA_LOGGING_START, FEATURE_SET) => {
                let mut r = Reader::new(data);
                let page_size = r.u64().map_err(|_| libc::EINVAL)?;
                let num = r.u32().map_err(|_| libc::EINVAL)? as usize;
                let _reserved = r.u32().map_err(|_| libc::EINVAL)?;
                if data.len() != DMA_LOGGING_CONTROL_LEN + 16 * num || num > MAX_RANGES {
                    return Err(libc::EINVAL);
                }
                let mut ranges = Vec::with_capacity(num);
                for _ in 0..num {
                    let iova = r.u64().map_err(|_| libc::EINVAL)?;
                    let length = r.u64().map_err(|_| libc::EINVAL)?;
                    ranges.push(IovaRange { iova, length });
                }
                if ranges.is_empty() {
                    ranges = mapped;
                }
                let chosen = h
                    .dma_logging_start(page_size, &ranges)
                    .map_err(|e| dma_errno(&e))?;
                out.put64(chosen);
                out.extend_from_slice(&data[8..]);
            }
            (FEATURE_DMA_LOGGING_STOP, FEATURE_SET) => {
                h.dma_logging_stop().map_err(|e| dma_errno(&e))?;
                out.extend_from_slice(data);
            }
            (FEATURE_DMA_LOGGING_REPORT, FEATURE_GET) => {
                let mut r = Reader::new(data);
                let iova = r.u64().map_err(|_| libc::EINVAL)?;
                let length = r.u64().map_err(|_| libc::EINVAL)?;
                let page_size = r.u64().map_err(|_| libc::EINVAL)?;
                if data.len() != DMA_LOGGING_REPORT_LEN || page_size == 0 {
                    return Err(libc::EINVAL);
                }
                let words = length.div_ceil(page_size).div_ceil(64);
                let need = (Feature::LEN + DMA_LOGGING_REPORT_LEN) as u64 + 8 * words;
                if need > u64::from(MAX_DATA_XFER) {
                    return Err(libc::E2BIG);
                }
                if u64::from(f.argsz) < need {
                    return Err(libc::ENOSPC);
                }
                let bitmap = h
                    .dma_logging_report(iova, length, page_size)
                    .map_err(|e| dma_errno(&e))?;
                out.extend_from_slice(data);
                let blind = controls.dma_log == DmaLogControl::Blind;
                for w in bitmap {
                    out.put64(if blind { 0 } else { w });
                }
            }
            _ => return Err(libc::EINVAL),
        }
        Ok(Feature::to_bytes(f.flags, &out))
    }

    pub(super) fn mig_read(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let (m, rest) = MigData::parse(p).map_err(|_| libc::EINVAL)?;
        // argsz is the room for the reply: the fixed part and `size` bytes (libvfio-user refuses
        // less, and QEMU sends exactly that).
        if !rest.is_empty() || u64::from(m.argsz) < MigData::LEN as u64 + u64::from(m.size) {
            return Err(libc::EINVAL);
        }
        if m.size > MAX_DATA_XFER {
            return Err(libc::EINVAL);
        }
        let h = self.device.migration().ok_or(libc::ENOTSUP)?;
        let id = h.open_stream().map(|s| s.id).ok_or(libc::EINVAL)?;
        // The reply is built in place: the fixed part, then the device reads straight after it.
        let mut out = std::mem::take(&mut self.spare);
        out.clear();
        out.resize(MigData::LEN + m.size as usize, 0);
        let n = match h.read(id, &mut out[MigData::LEN..]) {
            Ok(ReadOutcome::Data(n)) => Ok(n),
            Ok(ReadOutcome::End) => Ok(0),
            Ok(ReadOutcome::NoDataNow) => Err(libc::ENOMSG),
            Err(_) => Err(libc::EINVAL),
        };
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                self.spare = out; // kept for the next read
                return Err(e);
            }
        };
        out.truncate(MigData::LEN + n);
        let fixed = MigData::to_bytes((MigData::LEN + n) as u32, n as u32, &[]);
        out[..MigData::LEN].copy_from_slice(&fixed);
        Ok(out)
    }

    pub(super) fn mig_write(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let (m, data) = MigData::parse(p).map_err(|_| libc::EINVAL)?;
        if m.size as usize != data.len() || m.argsz as usize != MigData::LEN + data.len() {
            return Err(libc::EINVAL);
        }
        if m.size > MAX_DATA_XFER {
            return Err(libc::EINVAL);
        }
        let h = self.device.migration().ok_or(libc::ENOTSUP)?;
        let id = h.open_stream().map(|s| s.id).ok_or(libc::EINVAL)?;
        if let Err(e) = h.write(id, data) {
            // The client hears EINVAL; the person reads why here, once per stream.
            let why = e.to_string();
            if self.refusal_logged.as_deref() != Some(why.as_str()) {
                tracing::error!(error = %why, "the destination refuses the migration stream");
                self.refusal_logged = Some(why);
            }
            return Err(libc::EINVAL);
        }
        Ok(Vec::new())
    }
}

/// The errno a DMA logging failure answers with: EINVAL for what the request got wrong
/// (ranges, page size, logging not started), EIO when the device failed.
fn dma_errno(e: &gmig_vfio_migration::handle::HandleError) -> Errno {
    match e {
        gmig_vfio_migration::handle::HandleError::Device(
            gmig_vfio_migration::DeviceError::Failed(_),
        ) => libc::EIO,
        _ => libc::EINVAL,
    }
}
