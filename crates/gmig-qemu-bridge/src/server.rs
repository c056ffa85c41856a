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
//! DMA regions mapped without a file descriptor are served by messages: a device that accepts them
//! ([`UserDevice::remote_dma`]) reaches them through a [`Dma`] port whose accesses become
//! `VFIO_USER_DMA_READ` / `VFIO_USER_DMA_WRITE` requests to the client (any other device takes
//! such maps and never uses them); commands the client sends while the server waits for such a
//! reply are queued and handled afterwards, in order. Regions
//! may be offered for `mmap` (a descriptor and sparse areas in the region-info reply) and may
//! carry ioeventfds (`GET_REGION_IO_FDS`).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use gmig_vfio_migration::dma_log::MAX_RANGES;
use gmig_vfio_migration::{DeviceState, IovaRange, MigrationDevice, MigrationHandle, ReadOutcome};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::proto::{
    sparse_mmap_cap, Command, DmaAccess, DmaMap, DmaUnmap, Feature, Header, IoFdEntry, IoFdsHead,
    MigData, ProtoError, Put, Reader, RegionAccess, RegionInfo, SparseArea, WriteMultiEntry,
    DMA_LOGGING_CONTROL_LEN, DMA_LOGGING_REPORT_LEN, FEATURE_DMA_LOGGING_REPORT,
    FEATURE_DMA_LOGGING_START, FEATURE_DMA_LOGGING_STOP, FEATURE_GET, FEATURE_MIGRATION,
    FEATURE_MIG_DATA_SIZE, FEATURE_MIG_DEVICE_STATE, FEATURE_PROBE, FEATURE_SET, FLAG_ERROR,
    FLAG_NO_REPLY, FLAG_TYPE_MASK, HEADER_LEN, IO_FD_DATAMATCH, IO_FD_IOEVENTFD,
};
use crate::server_checks::{irq_set_data, same_memory};
use vfio_bindings::bindings::vfio as uapi;

/// The highest protocol minor version this server speaks (major 0).
pub const MINOR_VERSION: u16 = 2;
/// Largest message the server accepts (header included).
pub const MAX_MSG_SIZE: u32 = (1 << 20) + 64;
/// Largest data transfer (REGION_READ/WRITE, MIG_DATA_READ/WRITE) the server accepts.
pub const MAX_DATA_XFER: u32 = 1 << 20;
/// Most file descriptors accepted with one message.
pub const MAX_MSG_FDS: usize = 8;
/// Most DMA regions mapped at once.
pub const MAX_DMA_REGIONS: usize = 64;
/// Most client commands queued while the server waits for the reply to a DMA_READ/WRITE it sent;
/// a client that sends more is cut off.
pub const MAX_PENDING: usize = 16;
/// How long the server waits for the client's reply to a DMA_READ/WRITE before it gives up on the
/// client (the access fails and the connection is closed).
pub const DMA_REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A device's access to the client's memory (DMA): regions mapped with a file descriptor are read
/// and written in place; regions mapped without one by DMA_READ / DMA_WRITE messages.
pub trait Dma {
    /// Reads `buf.len()` bytes at DMA address `address`.
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), Errno>;
    /// Writes `data` at DMA address `address`.
    fn write(&mut self, address: u64, data: &[u8]) -> Result<(), Errno>;
}

/// A region the client may `mmap`: the descriptor sent with the region-info reply, the offset to
/// map it at, and the parts of the region that may be mapped (the rest stays trapped).
#[derive(Debug)]
pub struct RegionMmap<'a> {
    /// The descriptor.
    pub file: &'a File,
    /// Offset in `file` of the region's start.
    pub offset: u64,
    /// The mappable parts (offsets within the region); empty: the whole region.
    pub areas: Vec<SparseArea>,
}

/// One ioeventfd of a region (`GET_REGION_IO_FDS`): a write of `size` bytes at `offset` signals
/// `file` instead of becoming a REGION_WRITE message.
#[derive(Debug)]
pub struct IoEventFd<'a> {
    /// Offset in the region.
    pub offset: u64,
    /// Access size.
    pub size: u64,
    /// Only writes of this value signal, when set.
    pub datamatch: Option<u64>,
    /// The eventfd.
    pub file: &'a File,
}

pub use crate::proto::Errno;

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
    /// The client's memory mapped with descriptors changed (`None`: nothing mapped): every such
    /// region, at its DMA address. Not called for maps and unmaps without a descriptor.
    fn dma_changed(&mut self, mem: Option<&GuestMemoryMmap>);
    /// The device's migration handle, `None` when it cannot migrate.
    fn migration(&mut self) -> Option<&mut MigrationHandle<Self::Mig>>;
    /// Called after every message the server handled: a device whose work advances on its own
    /// (a guest-driver model) takes a step here. The default does nothing.
    fn tick(&mut self) {}
    /// A REGION_WRITE with access to the client's memory: devices that DMA on a register write
    /// override this. The default is [`UserDevice::region_write`].
    fn region_write_dma(
        &mut self,
        index: u32,
        offset: u64,
        data: &[u8],
        _dma: &mut dyn Dma,
    ) -> Result<(), Errno> {
        self.region_write(index, offset, data)
    }
    /// Whether the device reaches DMA regions mapped without a file descriptor (through [`Dma`]
    /// by messages). The default does not: such maps are still accepted (as an IOMMU accepts a
    /// mapping; QEMU maps its ROMs so), never offered to the device, and a [`Dma`] access there
    /// fails with `EFAULT`.
    fn remote_dma(&self) -> bool {
        false
    }
    /// The client's memory regions mapped without a descriptor changed (their ranges).
    fn remote_dma_changed(&mut self, _ranges: &[(u64, u64)]) {}
    /// Region `index` offered for `mmap`, if it is. The default offers none.
    fn region_mmap(&self, _index: u32) -> Option<RegionMmap<'_>> {
        None
    }
    /// The ioeventfds of region `index`. The default has none.
    fn region_io_fds(&self, _index: u32) -> Vec<IoEventFd<'_>> {
        Vec::new()
    }
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
    /// `None`: mapped without a descriptor, reached by DMA_READ / DMA_WRITE if `remote`.
    file: Option<FileOffset>,
    /// Without a descriptor: whether the device reaches it by messages ([`UserDevice::remote_dma`]);
    /// if not, the map is taken (as an IOMMU takes a mapping the device never uses) and any
    /// access to it faults.
    remote: bool,
}

/// A message the client sent while the server waited for a reply of its own.
struct Pending {
    head: Header,
    payload: Vec<u8>,
    fds: Vec<File>,
}

/// A vfio-user server for one device.
pub struct Server<D: UserDevice> {
    device: D,
    dma: Vec<DmaRegion>,
    mem: Option<GuestMemoryMmap>,
    negotiated: bool,
    /// The client's `max_data_xfer_size` (the spec's default until it says otherwise).
    client_xfer: u64,
    pending: VecDeque<Pending>,
    next_id: u16,
    /// Buffers kept across messages: the payload received and a reply's payload. A megabyte
    /// allocated afresh per MIG_DATA message costs more in page faults than the copy itself.
    rx: Vec<u8>,
    spare: Vec<u8>,
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
    /// Descriptors sent with the reply (borrowed from the device, which keeps them open).
    fds: Vec<RawFd>,
}

fn ok(payload: Vec<u8>) -> Reply {
    Reply {
        payload,
        error: None,
        fds: Vec::new(),
    }
}

fn err(e: Errno) -> Reply {
    Reply {
        payload: Vec::new(),
        error: Some(e),
        fds: Vec::new(),
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
            client_xfer: u64::from(MAX_DATA_XFER),
            pending: VecDeque::new(),
            next_id: 0x8000,
            rx: Vec::new(),
            spare: Vec::new(),
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
            let Pending {
                head: h,
                payload,
                fds,
            } = match self.pending.pop_front() {
                Some(p) => p,
                None => {
                    let mut buf = std::mem::take(&mut self.rx);
                    let (head, fds) = recv_message_into(stream, &mut buf)?;
                    Pending {
                        head,
                        payload: buf,
                        fds,
                    }
                }
            };
            if h.is_reply() || h.flags & FLAG_TYPE_MASK != 0 {
                // A reply to nothing, or an unknown message type: refused, not fatal.
                if h.flags & FLAG_NO_REPLY == 0 && !h.is_reply() {
                    send(stream, h, &err(libc::EINVAL))?;
                }
                continue;
            }
            let mut broken = None;
            let reply = match Command::try_from(h.command) {
                Ok(c) => self.dispatch(c, &payload, fds, stream, &mut broken),
                Err(_) => err(libc::ENOTSUP),
            };
            if let Some(e) = broken {
                // The client stopped answering our DMA requests: it is gone or hostile.
                return Err(ServerError::Io(e));
            }
            if h.flags & FLAG_NO_REPLY == 0 {
                send(stream, h, &reply)?;
            }
            // Keep the larger buffers for the next messages.
            if payload.capacity() > self.rx.capacity() {
                self.rx = payload;
            }
            if reply.payload.capacity() > self.spare.capacity() {
                self.spare = reply.payload;
            }
            self.device.tick();
        }
    }

    fn dispatch(
        &mut self,
        c: Command,
        p: &[u8],
        fds: Vec<File>,
        stream: &mut UnixStream,
        broken: &mut Option<io::Error>,
    ) -> Reply {
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
            Command::DeviceGetRegionInfo => return self.region_info(p),
            Command::DeviceGetRegionIoFds => return self.region_io_fds(p),
            Command::DeviceGetIrqInfo => self.irq_info(p),
            Command::DeviceSetIrqs => self.set_irqs(p, fds),
            Command::RegionRead => self.region_read(p),
            Command::RegionWrite => self.region_write(p, stream, broken),
            Command::RegionWriteMulti => self.region_write_multi(p, stream, broken),
            Command::DeviceReset => self.device.reset().map(|()| Vec::new()),
            Command::DeviceFeature => self.feature(p),
            Command::MigDataRead => self.mig_read(p),
            Command::MigDataWrite => self.mig_write(p),
            // Server-to-client commands: a client does not send them.
            Command::DmaRead | Command::DmaWrite => Err(libc::EINVAL),
        };
        match r {
            Ok(v) => ok(v),
            Err(e) => err(e),
        }
    }

    /// One device write with DMA through a port over `stream` (for REGION_WRITE and each write
    /// of REGION_WRITE_MULTI).
    fn write_with_dma(
        &mut self,
        (index, offset, data): (u32, u64, &[u8]),
        stream: &mut UnixStream,
        broken: &mut Option<io::Error>,
    ) -> Result<(), Errno> {
        let mut port = DmaPort {
            stream,
            mem: self.mem.as_ref(),
            dma: &self.dma,
            pending: &mut self.pending,
            next_id: &mut self.next_id,
            xfer: self.client_xfer,
            broken,
        };
        self.device.region_write_dma(index, offset, data, &mut port)
    }

    fn version(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let mut r = Reader::new(p);
        let major = r.u16().map_err(|_| libc::EINVAL)?;
        let minor = r.u16().map_err(|_| libc::EINVAL)?;
        if major != 0 {
            return Err(libc::ENOTSUP);
        }
        self.client_xfer = client_max_xfer(r.rest());
        let json = format!(
            "{{\"capabilities\":{{\"max_msg_fds\":{MAX_MSG_FDS},\"max_data_xfer_size\":{MAX_DATA_XFER},\
             \"pgsizes\":4096,\"max_dma_maps\":{MAX_DMA_REGIONS},\"write_multiple\":true,\"migration\":{{\"pgsize\":4096,\
             \"max_bitmap_size\":{}}}}}}}",
            1u64 << 28
        );
        self.negotiated = true;
        let mut v = Vec::new();
        // The reply's minor may not exceed the client's (QEMU 10.2 offers 0 and refuses more);
        // nothing this server does depends on the minor.
        v.put16(0);
        v.put16(minor.min(MINOR_VERSION));
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
        if m.address % 4096 != 0 {
            return Err(libc::EINVAL);
        }
        // The specification: a map over an existing one fails with EEXIST.
        if self
            .dma
            .iter()
            .any(|r| m.address < r.address + r.size && r.address < end)
        {
            return Err(libc::EEXIST);
        }
        if self.dma.len() >= MAX_DMA_REGIONS {
            return Err(libc::ENOSPC);
        }
        let file = match (fds.pop(), fds.is_empty()) {
            (Some(f), true) => {
                let len = f.metadata().map_err(|_| libc::EINVAL)?.len();
                if m.offset.checked_add(m.size).is_none_or(|e| e > len) {
                    return Err(libc::EINVAL);
                }
                Some(FileOffset::new(f, m.offset))
            }
            // Without a descriptor the region is reached by DMA_READ / DMA_WRITE if the device
            // can work that way; otherwise the map is taken and left unused (QEMU maps its ROMs,
            // which no memory backend holds, like any RAM section).
            (None, _) => {
                if !self.device.remote_dma() {
                    tracing::debug!(
                        address = format_args!("{:#x}", m.address),
                        size = format_args!("{:#x}", m.size),
                        "DMA_MAP without a file descriptor: accepted, not used by this device \
                         (guest RAM it must reach has to be shared by descriptor: QEMU \
                         memory-backend-memfd with share=on; cloud-hypervisor --memory shared=on)"
                    );
                }
                None
            }
            (Some(_), false) => return Err(libc::EINVAL),
        };
        self.dma.push(DmaRegion {
            address: m.address,
            size: m.size,
            remote: file.is_none() && self.device.remote_dma(),
            file,
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
        let mut local = Vec::new();
        let mut remote = Vec::new();
        for r in &self.dma {
            match &r.file {
                Some(f) => {
                    let size = usize::try_from(r.size).map_err(|_| libc::EINVAL)?;
                    local.push((GuestAddress(r.address), size, Some(f.clone())));
                }
                None if r.remote => remote.push((r.address, r.size)),
                None => {}
            }
        }
        // The device hears of its memory only when the descriptor-backed part changed (a map
        // or unmap without a descriptor leaves it as it was).
        if !same_memory(self.mem.as_ref(), &local) {
            tracing::debug!(
                sections = ?local.iter().map(|(a, n, _)| (a.0, *n)).collect::<Vec<_>>(),
                "guest memory shared by descriptor changed"
            );
            self.mem = if local.is_empty() {
                None
            } else {
                Some(GuestMemoryMmap::from_ranges_with_files(local).map_err(|_| libc::EINVAL)?)
            };
            self.device.dma_changed(self.mem.as_ref());
        }
        self.device.remote_dma_changed(&remote);
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

    fn region_info(&mut self, p: &[u8]) -> Reply {
        let Ok((req, _)) = RegionInfo::parse(p) else {
            return err(libc::EINVAL);
        };
        if (req.argsz as usize) < RegionInfo::LEN {
            return err(libc::EINVAL);
        }
        // Indices below num_regions always answer (an absent BAR has size 0, as in the kernel).
        let (_, regions, _) = self.device.device_info();
        if req.index >= regions {
            return err(libc::EINVAL);
        }
        let (flags, size) = self.device.region_info(req.index).unwrap_or((0, 0));
        let mut info = RegionInfo {
            argsz: RegionInfo::LEN as u32,
            flags,
            index: req.index,
            cap_offset: 0,
            size,
            offset: 0,
        };
        let Some(m) = self.device.region_mmap(req.index).filter(|_| size > 0) else {
            return ok(info.to_bytes(&[]));
        };
        info.flags |= uapi::VFIO_REGION_INFO_FLAG_MMAP;
        info.offset = m.offset;
        let caps = if m.areas.is_empty() {
            Vec::new()
        } else {
            info.flags |= uapi::VFIO_REGION_INFO_FLAG_CAPS;
            sparse_mmap_cap(&m.areas)
        };
        info.argsz = (RegionInfo::LEN + caps.len()) as u32;
        // The chain goes only where the client made room for it; argsz tells it what it needs.
        let room = req.argsz >= info.argsz;
        if room && !caps.is_empty() {
            info.cap_offset = RegionInfo::LEN as u32;
        }
        Reply {
            payload: info.to_bytes(if room { &caps } else { &[] }),
            error: None,
            fds: vec![m.file.as_raw_fd()],
        }
    }

    fn region_io_fds(&mut self, p: &[u8]) -> Reply {
        let Ok((req, rest)) = IoFdsHead::parse(p) else {
            return err(libc::EINVAL);
        };
        if !rest.is_empty() || (req.argsz as usize) < IoFdsHead::LEN {
            return err(libc::EINVAL);
        }
        let (_, regions, _) = self.device.device_info();
        if req.index >= regions {
            return err(libc::EINVAL);
        }
        let fds = self.device.region_io_fds(req.index);
        if fds.len() > MAX_MSG_FDS {
            return err(libc::E2BIG);
        }
        let entries: Vec<IoFdEntry> = fds
            .iter()
            .zip(0u32..)
            .map(|(f, i)| IoFdEntry {
                offset: f.offset,
                size: f.size,
                fd_index: i,
                kind: IO_FD_IOEVENTFD,
                flags: if f.datamatch.is_some() {
                    IO_FD_DATAMATCH
                } else {
                    0
                },
                padding: 0,
                datamatch: f.datamatch.unwrap_or(0),
            })
            .collect();
        let head = IoFdsHead {
            argsz: (IoFdsHead::LEN + IoFdEntry::LEN * entries.len()) as u32,
            flags: 0,
            index: req.index,
            count: entries.len() as u32,
        };
        // Too little room: the count and the size needed, no entries and no descriptors.
        if req.argsz < head.argsz {
            return ok(head.to_bytes(&[]));
        }
        Reply {
            payload: head.to_bytes(&entries),
            error: None,
            fds: fds.iter().map(|f| f.file.as_raw_fd()).collect(),
        }
    }

    fn irq_info(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let mut r = Reader::new(p);
        let argsz = r.u32().map_err(|_| libc::EINVAL)?;
        let _flags = r.u32().map_err(|_| libc::EINVAL)?;
        let index = r.u32().map_err(|_| libc::EINVAL)?;
        if argsz < 16 {
            return Err(libc::EINVAL);
        }
        // Indices below num_irqs answer (an absent one has count 0, as in the kernel), except an
        // absent error-reporting IRQ, which vfio-pci refuses for a function without PCI Express
        // (QEMU then sets up no AER and warns of nothing).
        let (_, _, irqs) = self.device.device_info();
        if index >= irqs {
            return Err(libc::EINVAL);
        }
        let info = self.device.irq_info(index);
        if info.is_none() && index == uapi::VFIO_PCI_ERR_IRQ_INDEX {
            return Err(libc::EINVAL);
        }
        let (flags, count) = info.unwrap_or((0, 0));
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
        let data = irq_set_data(flags, (start, count, total), r.rest(), fds.len())?;
        match data {
            // Booleans: the action for each vector whose boolean is set, one at a time.
            Some(bools) => {
                let none = (flags & !uapi::VFIO_IRQ_SET_DATA_BOOL) | uapi::VFIO_IRQ_SET_DATA_NONE;
                for (i, _) in (start..).zip(bools).filter(|(_, &b)| b != 0) {
                    self.device.set_irqs(index, none, i, 1, Vec::new())?;
                }
            }
            None => self.device.set_irqs(index, flags, start, count, fds)?,
        }
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

    fn region_write(
        &mut self,
        p: &[u8],
        stream: &mut UnixStream,
        broken: &mut Option<io::Error>,
    ) -> Result<Vec<u8>, Errno> {
        let (a, data) = RegionAccess::parse(p).map_err(|_| libc::EINVAL)?;
        if data.len() != a.count as usize {
            return Err(libc::EINVAL);
        }
        self.checked_access(a)?;
        self.write_with_dma((a.region, a.offset, data), stream, broken)?;
        Ok(a.to_bytes(&[]))
    }

    /// REGION_WRITE_MULTI: every write is checked before the first is made; the writes are then
    /// made in order, stopping at the first the device refuses. The reply carries `wr_cnt`.
    fn region_write_multi(
        &mut self,
        p: &[u8],
        stream: &mut UnixStream,
        broken: &mut Option<io::Error>,
    ) -> Result<Vec<u8>, Errno> {
        let writes = WriteMultiEntry::parse_request(p).map_err(|_| libc::EINVAL)?;
        for w in &writes {
            if !(1..=8).contains(&w.count) {
                return Err(libc::EINVAL);
            }
            self.checked_access(RegionAccess {
                offset: w.offset,
                region: w.region,
                count: w.count,
            })?;
        }
        for w in &writes {
            let bytes = w.data.to_le_bytes();
            self.write_with_dma(
                (w.region, w.offset, &bytes[..w.count as usize]),
                stream,
                broken,
            )?;
        }
        let mut v = Vec::new();
        v.put64(writes.len() as u64);
        Ok(v)
    }

    fn feature(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let (f, data) = Feature::parse(p).map_err(|_| libc::EINVAL)?;
        let ops = f.flags & (FEATURE_GET | FEATURE_SET | FEATURE_PROBE);
        // argsz covers at least what was sent; a GET's argsz is the room for its reply, which
        // for MIGRATION, MIG_DEVICE_STATE and MIG_DATA_SIZE is 8 bytes of data (the request may
        // carry them, as a kernel-style buffer, or only the header, as libvfio-user's client
        // sends); a DMA log report's room is checked against its bitmap below.
        let reply_data = match (f.index(), ops) {
            (FEATURE_MIGRATION | FEATURE_MIG_DEVICE_STATE | FEATURE_MIG_DATA_SIZE, FEATURE_GET) => {
                8
            }
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
        if !rest.is_empty() || (m.argsz as usize) < MigData::LEN {
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
        self.pending.clear();
        self.client_xfer = u64::from(MAX_DATA_XFER);
        self.device.dma_changed(None);
        self.device.remote_dma_changed(&[]);
    }
}

/// The client's `max_data_xfer_size` from its VERSION capabilities (JSON text, NUL-terminated):
/// the spec's default (1 MiB) when absent or unreadable, capped at what this server accepts.
fn client_max_xfer(json: &[u8]) -> u64 {
    let text = json.split(|&b| b == 0).next().unwrap_or_default();
    serde_json::from_slice::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v["capabilities"]["max_data_xfer_size"].as_u64())
        .filter(|&n| n > 0)
        .map_or(u64::from(MAX_DATA_XFER), |n| {
            n.min(u64::from(MAX_DATA_XFER))
        })
}

/// The server's side of a device's DMA during one request: regions mapped with a descriptor
/// through `vm-memory`, regions without one through DMA_READ / DMA_WRITE on the client's socket.
struct DmaPort<'a> {
    stream: &'a mut UnixStream,
    mem: Option<&'a GuestMemoryMmap>,
    dma: &'a [DmaRegion],
    pending: &'a mut VecDeque<Pending>,
    next_id: &'a mut u16,
    xfer: u64,
    broken: &'a mut Option<io::Error>,
}

impl DmaPort<'_> {
    /// The region that holds `address..address+len` wholly, if one does.
    fn region(&self, address: u64, len: usize) -> Option<&DmaRegion> {
        let end = address.checked_add(len as u64)?;
        self.dma.iter().find(|r| {
            (r.file.is_some() || r.remote) && r.address <= address && end <= r.address + r.size
        })
    }

    /// Sends one DMA_READ / DMA_WRITE and waits for its reply; client commands that arrive
    /// meanwhile are queued. Returns the reply's payload, or the errno of an error reply.
    fn exchange(&mut self, command: Command, payload: &[u8]) -> Result<Vec<u8>, Errno> {
        if self.broken.is_some() {
            return Err(libc::EIO);
        }
        let id = *self.next_id;
        *self.next_id = self.next_id.wrapping_add(1) | 0x8000;
        let h = Header::command(id, command, payload.len());
        let r = self.await_reply(h, payload);
        let _ = self.stream.set_read_timeout(None);
        match r {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(%e, ?command, "client did not answer a DMA request");
                *self.broken = Some(e);
                Err(libc::EIO)
            }
        }
    }

    fn await_reply(&mut self, h: Header, payload: &[u8]) -> io::Result<Result<Vec<u8>, Errno>> {
        write_message(self.stream, h, payload)?;
        self.stream.set_read_timeout(Some(DMA_REPLY_TIMEOUT))?;
        loop {
            let m = recv_message(self.stream).map_err(|e| match e {
                ServerError::Io(e) => e,
                ServerError::Proto(p) => io::Error::new(io::ErrorKind::InvalidData, p),
            })?;
            if !m.head.is_reply() {
                if self.pending.len() >= MAX_PENDING {
                    return Err(io::Error::other(
                        "too many commands queued behind a DMA request",
                    ));
                }
                self.pending.push_back(m);
                continue;
            }
            if m.head.msg_id != h.msg_id || m.head.command != h.command {
                continue; // a reply to nothing: ignored, as elsewhere
            }
            if m.head.flags & FLAG_ERROR != 0 {
                let e = i32::try_from(m.head.error).unwrap_or(libc::EIO);
                return Ok(Err(if e == 0 { libc::EIO } else { e }));
            }
            return Ok(Ok(m.payload));
        }
    }
}

impl Dma for DmaPort<'_> {
    fn read(&mut self, address: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let r = self.region(address, buf.len()).ok_or(libc::EFAULT)?;
        if r.file.is_some() {
            let mem = self.mem.ok_or(libc::EFAULT)?;
            return mem
                .read_slice(buf, GuestAddress(address))
                .map_err(|_| libc::EFAULT);
        }
        let mut at = address;
        for chunk in buf.chunks_mut(self.xfer as usize) {
            let a = DmaAccess {
                address: at,
                count: chunk.len() as u64,
            };
            let reply = self.exchange(Command::DmaRead, &a.to_bytes(&[]))?;
            let (got, data) = DmaAccess::parse(&reply).map_err(|_| libc::EIO)?;
            if got != a || data.len() != chunk.len() {
                return Err(libc::EIO);
            }
            chunk.copy_from_slice(data);
            at += a.count;
        }
        Ok(())
    }

    fn write(&mut self, address: u64, data: &[u8]) -> Result<(), Errno> {
        let r = self.region(address, data.len()).ok_or(libc::EFAULT)?;
        if r.file.is_some() {
            let mem = self.mem.ok_or(libc::EFAULT)?;
            return mem
                .write_slice(data, GuestAddress(address))
                .map_err(|_| libc::EFAULT);
        }
        let mut at = address;
        for chunk in data.chunks(self.xfer as usize) {
            let a = DmaAccess {
                address: at,
                count: chunk.len() as u64,
            };
            let reply = self.exchange(Command::DmaWrite, &a.to_bytes(chunk))?;
            let (got, rest) = DmaAccess::parse(&reply).map_err(|_| libc::EIO)?;
            if got != a || !rest.is_empty() {
                return Err(libc::EIO);
            }
            at += a.count;
        }
        Ok(())
    }
}

/// Receives one message: its header, the file descriptors that came with it, and its payload.
fn recv_message(stream: &mut UnixStream) -> Result<Pending, ServerError> {
    let mut payload = Vec::new();
    let (head, fds) = recv_message_into(stream, &mut payload)?;
    Ok(Pending { head, payload, fds })
}

/// Receives one message into `payload` (its capacity kept from call to call).
pub(crate) fn recv_message_into(
    stream: &mut UnixStream,
    payload: &mut Vec<u8>,
) -> Result<(Header, Vec<File>), ServerError> {
    let (head, fds) = recv_header(stream)?;
    let head = Header::parse(&head, MAX_MSG_SIZE)?;
    payload.clear();
    payload.resize(head.payload_len(), 0);
    stream.read_exact(payload)?;
    Ok((head, fds))
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

/// Writes one message (header and payload) with vectored writes, without joining them first.
pub(crate) fn write_message(stream: &mut UnixStream, h: Header, payload: &[u8]) -> io::Result<()> {
    let head = h.to_bytes();
    let mut parts = [&head[..], payload];
    while !parts[0].is_empty() || !parts[1].is_empty() {
        let n = match stream.write_vectored(&[IoSlice::new(parts[0]), IoSlice::new(parts[1])]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let first = n.min(parts[0].len());
        parts[0] = &parts[0][first..];
        parts[1] = &parts[1][n - first..];
    }
    Ok(())
}

/// Sends the reply to `cmd`, with the descriptors the reply carries (they go with its first
/// bytes).
fn send(stream: &mut UnixStream, cmd: Header, r: &Reply) -> io::Result<()> {
    let h = Header::reply(cmd, r.payload.len(), r.error);
    if r.fds.is_empty() || r.error.is_some() {
        return write_message(stream, h, &r.payload);
    }
    let mut msg = h.to_bytes().to_vec();
    msg.extend_from_slice(&r.payload);
    let n = stream
        .send_with_fds(&[&msg[..]], &r.fds)
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    stream.write_all(&msg[n..])
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_transfer_size_comes_from_its_capabilities_within_bounds() {
        let caps = |s: &str| format!("{s}\0").into_bytes();
        let default = u64::from(MAX_DATA_XFER);
        assert_eq!(
            client_max_xfer(&caps(r#"{"capabilities":{"max_data_xfer_size":65536}}"#)),
            65536
        );
        // Absent, zero, not a number, not JSON, or outside `capabilities`: the default.
        assert_eq!(client_max_xfer(&caps(r#"{"capabilities":{}}"#)), default);
        assert_eq!(
            client_max_xfer(&caps(r#"{"capabilities":{"max_data_xfer_size":0}}"#)),
            default
        );
        assert_eq!(
            client_max_xfer(&caps(r#"{"capabilities":{"max_data_xfer_size":"1"}}"#)),
            default
        );
        assert_eq!(client_max_xfer(b"\xff\x00"), default);
        assert_eq!(
            client_max_xfer(&caps(r#"{"max_data_xfer_size":4096,"capabilities":{}}"#)),
            default
        );
        // More than this server accepts: capped.
        assert_eq!(
            client_max_xfer(&caps(r#"{"capabilities":{"max_data_xfer_size":99999999}}"#)),
            default
        );
    }
}
