//! A vfio-user server for one PCI device, generic over a [`UserDevice`] backend: version
//! negotiation, DMA regions mapped from the client's file descriptors into a `vm-memory`
//! [`GuestMemoryMmap`] (the device reads and writes the client's RAM, not a copy), regions, IRQs
//! with eventfds, reset, and migration v2 (DEVICE_FEATURE, MIG_DATA_READ, MIG_DATA_WRITE) through
//! `gmig-vfio-migration`'s [`MigrationHandle`].
//!
//! One client at a time; [`Server::serve`] returns when the client disconnects, leaving the device
//! running (a saving or resuming session is abandoned and the device brought back to RUNNING, by
//! reset if need be), and can be called again for the next client. Malformed messages get an error
//! reply with the errno the specification names; a message that cannot be framed (bad header) ends
//! the connection. Nothing a client sends can make the server panic or touch memory outside what
//! the client mapped.
//!
//! Not served yet: DMA regions without a file descriptor (their accesses would be DMA_READ /
//! DMA_WRITE messages to the client; such a DMA_MAP is refused with `ENOTSUP`),
//! `GET_REGION_IO_FDS`, `REGION_WRITE_MULTI` and the DMA-logging features (`ENOTSUP`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

use gmig_vfio_migration::dma_log::MAX_RANGES;
use gmig_vfio_migration::{DeviceState, IovaRange, MigrationDevice, MigrationHandle, ReadOutcome};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::proto::{
    Command, DmaMap, DmaUnmap, Feature, Header, MigData, ProtoError, Put, Reader, RegionAccess,
    DMA_LOGGING_CONTROL_LEN, DMA_LOGGING_REPORT_LEN, FEATURE_DMA_LOGGING_REPORT,
    FEATURE_DMA_LOGGING_START, FEATURE_DMA_LOGGING_STOP, FEATURE_GET, FEATURE_MIGRATION,
    FEATURE_MIG_DATA_SIZE, FEATURE_MIG_DEVICE_STATE, FEATURE_PROBE, FEATURE_SET, FLAG_ERROR,
    FLAG_NO_REPLY, FLAG_REPLY, FLAG_TYPE_MASK, HEADER_LEN,
};

/// Largest message the server accepts (header included).
pub const MAX_MSG_SIZE: u32 = (1 << 20) + 64;
/// Largest data transfer (REGION_READ/WRITE, MIG_DATA_READ/WRITE) the server accepts.
pub const MAX_DATA_XFER: u32 = 1 << 20;
/// Most file descriptors accepted with one message.
pub const MAX_MSG_FDS: usize = 8;
/// Most DMA regions mapped at once.
pub const MAX_DMA_REGIONS: usize = 64;

/// An errno for an error reply.
pub type Errno = i32;

/// What the server needs from the device it serves. Regions and IRQs are numbered as in
/// `linux/vfio.h` for PCI (BAR0–5 = 0–5, ROM 6, config space 7; INTx 0, MSI 1, MSI-X 2).
pub trait UserDevice {
    /// The migration device behind the backend.
    type Mig: MigrationDevice;
    /// `(flags, num_regions, num_irqs)` for DEVICE_GET_INFO.
    fn device_info(&self) -> (u32, u32, u32);
    /// `(flags, size)` of region `index` (`VFIO_REGION_INFO_FLAG_READ` 1, `WRITE` 2, `MMAP` 4),
    /// `None` when there is no such region.
    fn region_info(&self, index: u32) -> Option<(u32, u64)>;
    /// A read of `data.len()` bytes at `offset` in region `index` (bounds already checked).
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<(), Errno>;
    /// A write at `offset` in region `index` (bounds already checked).
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno>;
    /// `(flags, count)` of IRQ index `index`, `None` when there is none.
    fn irq_info(&self, index: u32) -> Option<(u32, u32)>;
    /// SET_IRQS: `flags` as in `struct vfio_irq_set`; with `DATA_EVENTFD` the eventfds for vectors
    /// `start..start+count`.
    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<File>,
    ) -> Result<(), Errno>;
    /// DEVICE_RESET.
    fn reset(&mut self) -> Result<(), Errno>;
    /// The client's DMA-mapped memory changed (`None`: nothing mapped).
    fn dma_changed(&mut self, mem: Option<&GuestMemoryMmap>);
    /// The device's migration handle, `None` when it cannot migrate.
    fn migration(&mut self) -> Option<&mut MigrationHandle<Self::Mig>>;
    /// Called after every message the server handled: a device whose work advances on its own
    /// (a guest-driver model) takes a step here. The default does nothing.
    fn tick(&mut self) {}
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The socket failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// A header could not be framed; the connection was closed.
    #[error("unframeable message: {0}")]
    Proto(#[from] ProtoError),
}

struct DmaRegion {
    address: u64,
    size: u64,
    file: FileOffset,
}

/// A vfio-user server for one device.
pub struct Server<D: UserDevice> {
    device: D,
    dma: Vec<DmaRegion>,
    mem: Option<GuestMemoryMmap>,
    negotiated: bool,
}

impl<D: UserDevice> std::fmt::Debug for Server<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("dma_regions", &self.dma.len())
            .field("negotiated", &self.negotiated)
            .finish_non_exhaustive()
    }
}

struct Reply {
    payload: Vec<u8>,
    error: Option<Errno>,
}

fn ok(payload: Vec<u8>) -> Reply {
    Reply {
        payload,
        error: None,
    }
}

fn err(e: Errno) -> Reply {
    Reply {
        payload: Vec::new(),
        error: Some(e),
    }
}

impl<D: UserDevice> Server<D> {
    /// A server for `device`.
    pub fn new(device: D) -> Self {
        Server {
            device,
            dma: Vec::new(),
            mem: None,
            negotiated: false,
        }
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device, mutably.
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// The device back.
    pub fn into_device(self) -> D {
        self.device
    }

    /// Serves one client until it disconnects. The device is left running and unmapped.
    pub fn serve(&mut self, mut stream: UnixStream) -> Result<(), ServerError> {
        let r = self.serve_inner(&mut stream);
        self.disconnected();
        match r {
            Err(ServerError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(()),
            other => other,
        }
    }

    fn serve_inner(&mut self, stream: &mut UnixStream) -> Result<(), ServerError> {
        loop {
            let (head, fds) = recv_header(stream)?;
            let h = Header::parse(&head, MAX_MSG_SIZE)?;
            let mut payload = vec![0u8; h.payload_len()];
            stream.read_exact(&mut payload)?;
            if h.is_reply() || h.flags & FLAG_TYPE_MASK != 0 {
                // A reply to nothing, or an unknown message type: refused, not fatal.
                if h.flags & FLAG_NO_REPLY == 0 && !h.is_reply() {
                    send(stream, h, &err(libc::EINVAL))?;
                }
                continue;
            }
            let reply = match Command::try_from(h.command) {
                Ok(c) => self.dispatch(c, &payload, fds),
                Err(_) => err(libc::ENOTSUP),
            };
            if h.flags & FLAG_NO_REPLY == 0 {
                send(stream, h, &reply)?;
            }
            self.device.tick();
        }
    }

    fn dispatch(&mut self, c: Command, p: &[u8], fds: Vec<File>) -> Reply {
        if !self.negotiated && c != Command::Version {
            return err(libc::EINVAL);
        }
        let want_fds = matches!(c, Command::DmaMap | Command::DeviceSetIrqs);
        if !want_fds && !fds.is_empty() {
            return err(libc::EINVAL);
        }
        let r = match c {
            Command::Version => self.version(p),
            Command::DmaMap => self.dma_map(p, fds),
            Command::DmaUnmap => self.dma_unmap(p),
            Command::DeviceGetInfo => self.device_info(p),
            Command::DeviceGetRegionInfo => self.region_info(p),
            Command::DeviceGetIrqInfo => self.irq_info(p),
            Command::DeviceSetIrqs => self.set_irqs(p, fds),
            Command::RegionRead => self.region_read(p),
            Command::RegionWrite => self.region_write(p),
            Command::DeviceReset => self.device.reset().map(|()| Vec::new()),
            Command::DeviceFeature => self.feature(p),
            Command::MigDataRead => self.mig_read(p),
            Command::MigDataWrite => self.mig_write(p),
            Command::DmaRead
            | Command::DmaWrite
            | Command::DeviceGetRegionIoFds
            | Command::RegionWriteMulti => Err(libc::ENOTSUP),
        };
        match r {
            Ok(v) => ok(v),
            Err(e) => err(e),
        }
    }

    fn version(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let mut r = Reader::new(p);
        let major = r.u16().map_err(|_| libc::EINVAL)?;
        let _minor = r.u16().map_err(|_| libc::EINVAL)?;
        if major != 0 {
            return Err(libc::ENOTSUP);
        }
        let json = format!(
            "{{\"capabilities\":{{\"max_msg_fds\":{MAX_MSG_FDS},\"max_data_xfer_size\":{MAX_DATA_XFER},\
             \"pgsizes\":4096,\"max_dma_maps\":{MAX_DMA_REGIONS},\"migration\":{{\"pgsize\":4096,\
             \"max_bitmap_size\":{}}}}}}}",
            1u64 << 28
        );
        self.negotiated = true;
        let mut v = Vec::new();
        v.put16(0);
        v.put16(2);
        v.extend_from_slice(json.as_bytes());
        v.push(0);
        Ok(v)
    }

    fn dma_map(&mut self, p: &[u8], mut fds: Vec<File>) -> Result<Vec<u8>, Errno> {
        let m = DmaMap::parse(p).map_err(|_| libc::EINVAL)?;
        if m.argsz as usize != DmaMap::LEN || m.size == 0 || m.size % 4096 != 0 {
            return Err(libc::EINVAL);
        }
        let end = m.address.checked_add(m.size).ok_or(libc::EINVAL)?;
        if m.address % 4096 != 0
            || self
                .dma
                .iter()
                .any(|r| m.address < r.address + r.size && r.address < end)
        {
            return Err(libc::EINVAL);
        }
        if self.dma.len() >= MAX_DMA_REGIONS {
            return Err(libc::ENOSPC);
        }
        let file = match (fds.pop(), fds.is_empty()) {
            (Some(f), true) => f,
            (None, _) => return Err(libc::ENOTSUP),
            (Some(_), false) => return Err(libc::EINVAL),
        };
        let len = file.metadata().map_err(|_| libc::EINVAL)?.len();
        if m.offset.checked_add(m.size).is_none_or(|e| e > len) {
            return Err(libc::EINVAL);
        }
        self.dma.push(DmaRegion {
            address: m.address,
            size: m.size,
            file: FileOffset::new(file, m.offset),
        });
        self.remap().inspect_err(|_| {
            self.dma.pop();
        })?;
        Ok(Vec::new())
    }

    fn dma_unmap(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let u = DmaUnmap::parse(p).map_err(|_| libc::EINVAL)?;
        if u.flags != 0 {
            return Err(libc::ENOTSUP);
        }
        let i = self
            .dma
            .iter()
            .position(|r| r.address == u.address && r.size == u.size)
            .ok_or(libc::EINVAL)?;
        self.dma.remove(i);
        self.remap()?;
        Ok(u.to_bytes())
    }

    fn remap(&mut self) -> Result<(), Errno> {
        self.dma.sort_by_key(|r| r.address);
        self.mem = if self.dma.is_empty() {
            None
        } else {
            let ranges: Vec<_> = self
                .dma
                .iter()
                .map(|r| {
                    let size = usize::try_from(r.size).map_err(|_| libc::EINVAL)?;
                    Ok((GuestAddress(r.address), size, Some(r.file.clone())))
                })
                .collect::<Result<_, Errno>>()?;
            Some(GuestMemoryMmap::from_ranges_with_files(ranges).map_err(|_| libc::EINVAL)?)
        };
        self.device.dma_changed(self.mem.as_ref());
        Ok(())
    }

    fn device_info(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let mut r = Reader::new(p);
        let argsz = r.u32().map_err(|_| libc::EINVAL)?;
        if argsz < 16 {
            return Err(libc::EINVAL);
        }
        let (flags, regions, irqs) = self.device.device_info();
        let mut v = Vec::new();
        v.put32(16);
        v.put32(flags);
        v.put32(regions);
        v.put32(irqs);
        Ok(v)
    }

    fn region_info(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let mut r = Reader::new(p);
        let argsz = r.u32().map_err(|_| libc::EINVAL)?;
        let _flags = r.u32().map_err(|_| libc::EINVAL)?;
        let index = r.u32().map_err(|_| libc::EINVAL)?;
        if argsz < 32 {
            return Err(libc::EINVAL);
        }
        // Indices below num_regions always answer (an absent BAR has size 0, as in the kernel).
        let (_, regions, _) = self.device.device_info();
        if index >= regions {
            return Err(libc::EINVAL);
        }
        let (flags, size) = self.device.region_info(index).unwrap_or((0, 0));
        let mut v = Vec::new();
        v.put32(32);
        v.put32(flags);
        v.put32(index);
        v.put32(0); // cap_offset
        v.put64(size);
        v.put64(0); // offset: regions are accessed by message, not mmapped
        Ok(v)
    }

    fn irq_info(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let mut r = Reader::new(p);
        let argsz = r.u32().map_err(|_| libc::EINVAL)?;
        let _flags = r.u32().map_err(|_| libc::EINVAL)?;
        let index = r.u32().map_err(|_| libc::EINVAL)?;
        if argsz < 16 {
            return Err(libc::EINVAL);
        }
        // Indices below num_irqs always answer (an absent one has count 0, as in the kernel).
        let (_, _, irqs) = self.device.device_info();
        if index >= irqs {
            return Err(libc::EINVAL);
        }
        let (flags, count) = self.device.irq_info(index).unwrap_or((0, 0));
        let mut v = Vec::new();
        v.put32(16);
        v.put32(flags);
        v.put32(index);
        v.put32(count);
        Ok(v)
    }

    fn set_irqs(&mut self, p: &[u8], fds: Vec<File>) -> Result<Vec<u8>, Errno> {
        let mut r = Reader::new(p);
        let field = |r: &mut Reader<'_>| r.u32().map_err(|_| libc::EINVAL);
        let (_argsz, flags, index, start, count) = (
            field(&mut r)?,
            field(&mut r)?,
            field(&mut r)?,
            field(&mut r)?,
            field(&mut r)?,
        );
        let (_, total) = self.device.irq_info(index).ok_or(libc::EINVAL)?;
        if start.checked_add(count).is_none_or(|e| e > total) {
            return Err(libc::EINVAL);
        }
        const DATA_EVENTFD: u32 = 1 << 2;
        if flags & DATA_EVENTFD != 0 && fds.len() != count as usize {
            return Err(libc::EINVAL);
        }
        if flags & DATA_EVENTFD == 0 && !fds.is_empty() {
            return Err(libc::EINVAL);
        }
        self.device.set_irqs(index, flags, start, count, fds)?;
        Ok(Vec::new())
    }

    fn checked_access(&self, a: RegionAccess) -> Result<(), Errno> {
        let (_, size) = self.device.region_info(a.region).ok_or(libc::EINVAL)?;
        if a.count > MAX_DATA_XFER {
            return Err(libc::E2BIG);
        }
        if a.offset
            .checked_add(u64::from(a.count))
            .is_none_or(|e| e > size)
        {
            return Err(libc::EINVAL);
        }
        Ok(())
    }

    fn region_read(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let (a, rest) = RegionAccess::parse(p).map_err(|_| libc::EINVAL)?;
        if !rest.is_empty() {
            return Err(libc::EINVAL);
        }
        self.checked_access(a)?;
        let mut data = vec![0u8; a.count as usize];
        self.device.region_read(a.region, a.offset, &mut data)?;
        Ok(a.to_bytes(&data))
    }

    fn region_write(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let (a, data) = RegionAccess::parse(p).map_err(|_| libc::EINVAL)?;
        if data.len() != a.count as usize {
            return Err(libc::EINVAL);
        }
        self.checked_access(a)?;
        self.device.region_write(a.region, a.offset, data)?;
        Ok(a.to_bytes(&[]))
    }

    fn feature(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let (f, data) = Feature::parse(p).map_err(|_| libc::EINVAL)?;
        let ops = f.flags & (FEATURE_GET | FEATURE_SET | FEATURE_PROBE);
        // A GET's argsz is the room for its reply: only a DMA log report needs more than its
        // request; every other request's argsz covers exactly what was sent.
        let report = f.index() == FEATURE_DMA_LOGGING_REPORT && ops == FEATURE_GET;
        if (!report && f.argsz as usize != Feature::LEN + data.len())
            || (f.argsz as usize) < Feature::LEN + data.len()
        {
            return Err(libc::EINVAL);
        }
        // DMA_LOGGING_START with no ranges logs every mapped region (listed before the device
        // is borrowed).
        let mapped: Vec<IovaRange> = if f.index() == FEATURE_DMA_LOGGING_START {
            self.dma
                .iter()
                .map(|r| IovaRange {
                    iova: r.address,
                    length: r.size,
                })
                .collect()
        } else {
            Vec::new()
        };
        let h = self.device.migration().ok_or(libc::ENOTSUP)?;
        let (get, set) = match f.index() {
            FEATURE_MIGRATION | FEATURE_MIG_DATA_SIZE | FEATURE_DMA_LOGGING_REPORT => (true, false),
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
            (FEATURE_MIG_DEVICE_STATE, FEATURE_GET) => {
                out.put32(h.state() as u32);
                out.put32(u32::MAX);
            }
            (FEATURE_MIG_DEVICE_STATE, FEATURE_SET) => {
                let mut r = Reader::new(data);
                let want = r.u32().map_err(|_| libc::EINVAL)?;
                let state = DeviceState::try_from(want).map_err(|_| libc::EINVAL)?;
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
                for w in bitmap {
                    out.put64(w);
                }
            }
            _ => return Err(libc::EINVAL),
        }
        Ok(Feature::to_bytes(f.flags, &out))
    }

    fn mig_read(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let (m, rest) = MigData::parse(p).map_err(|_| libc::EINVAL)?;
        if !rest.is_empty() || m.argsz as usize != MigData::LEN {
            return Err(libc::EINVAL);
        }
        if m.size > MAX_DATA_XFER {
            return Err(libc::EINVAL);
        }
        let h = self.device.migration().ok_or(libc::ENOTSUP)?;
        let id = h.open_stream().map(|s| s.id).ok_or(libc::EINVAL)?;
        let mut buf = vec![0u8; m.size as usize];
        let n = match h.read(id, &mut buf).map_err(|_| libc::EINVAL)? {
            ReadOutcome::Data(n) => n,
            ReadOutcome::End => 0,
            ReadOutcome::NoDataNow => return Err(libc::ENOMSG),
        };
        buf.truncate(n);
        Ok(MigData::to_bytes((MigData::LEN + n) as u32, n as u32, &buf))
    }

    fn mig_write(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let (m, data) = MigData::parse(p).map_err(|_| libc::EINVAL)?;
        if m.size as usize != data.len() || m.argsz as usize != MigData::LEN + data.len() {
            return Err(libc::EINVAL);
        }
        if m.size > MAX_DATA_XFER {
            return Err(libc::EINVAL);
        }
        let h = self.device.migration().ok_or(libc::ENOTSUP)?;
        let id = h.open_stream().map(|s| s.id).ok_or(libc::EINVAL)?;
        h.write(id, data).map_err(|_| libc::EINVAL)?;
        Ok(Vec::new())
    }

    /// The client is gone: abandon any migration session (back to RUNNING, through a reset if the
    /// state machine is in ERROR or refuses) and drop the DMA mappings.
    fn disconnected(&mut self) {
        self.negotiated = false;
        if let Some(h) = self.device.migration() {
            if h.state() != DeviceState::Running && h.set_state(DeviceState::Running).is_err() {
                tracing::warn!(state = ?h.state(), "client left mid-migration; resetting");
                let _ = h.reset();
                let _ = h.set_state(DeviceState::Running);
            }
        }
        self.dma.clear();
        self.mem = None;
        self.device.dma_changed(None);
    }
}

/// Receives exactly one header and the file descriptors that came with it.
fn recv_header(stream: &mut UnixStream) -> io::Result<([u8; HEADER_LEN], Vec<File>)> {
    let mut head = [0u8; HEADER_LEN];
    let mut raw: [RawFd; MAX_MSG_FDS] = [-1; MAX_MSG_FDS];
    let mut iov = [libc::iovec {
        iov_base: head.as_mut_ptr().cast(),
        iov_len: HEADER_LEN,
    }];
    // SAFETY: the iovec points at `head`, which is borrowed mutably for this call and is
    // HEADER_LEN bytes long; the kernel writes at most that many bytes into it.
    let (n, nfds) = unsafe { stream.recv_with_fds(&mut iov, &mut raw) }
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    let fds = raw[..nfds.min(MAX_MSG_FDS)]
        .iter()
        // SAFETY: each of the first `nfds` descriptors was just received with SCM_RIGHTS and is
        // owned by nobody else; wrapping it in a File makes it closed exactly once.
        .map(|&fd| unsafe { File::from_raw_fd(fd) })
        .collect();
    if n == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if n < HEADER_LEN {
        stream.read_exact(&mut head[n..])?;
    }
    Ok((head, fds))
}

fn send(stream: &mut UnixStream, cmd: Header, r: &Reply) -> io::Result<()> {
    let h = Header {
        msg_id: cmd.msg_id,
        command: cmd.command,
        size: (HEADER_LEN + r.payload.len()) as u32,
        flags: FLAG_REPLY | if r.error.is_some() { FLAG_ERROR } else { 0 },
        error: r.error.map_or(0, |e| e as u32),
    };
    let mut msg = h.to_bytes().to_vec();
    msg.extend_from_slice(&r.payload);
    stream.write_all(&msg)
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
