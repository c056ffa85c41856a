//! The VMM side of vfio-user: connect, negotiate, map guest RAM by file descriptor (or keep it in
//! the client and serve the server's DMA_READ / DMA_WRITE for it), access regions (by message, or
//! through the descriptor and sparse areas of a mappable region, or its ioeventfds), set IRQs,
//! reset, and drive migration v2 (DEVICE_FEATURE, MIG_DATA_READ, MIG_DATA_WRITE). Requests are
//! sent one at a time and each waits for its reply; DMA requests the server sends meanwhile are
//! served while waiting.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use gmig_vfio_migration::DeviceState;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::server::{poll_for_message, recv_message_into, write_message, ServerError};

use crate::proto::{
    parse_sparse_mmap, Command, DmaAccess, DmaMap, DmaUnmap, Feature, Header, IoFdEntry, IoFdsHead,
    MigData, ProtoError, Put, Reader, RegionAccess, RegionInfo, SparseArea, WriteMultiEntry,
    DMA_LOGGING_REPORT_LEN, FEATURE_DMA_LOGGING_REPORT, FEATURE_DMA_LOGGING_START,
    FEATURE_DMA_LOGGING_STOP, FEATURE_GET, FEATURE_MIGRATION, FEATURE_MIG_DATA_SIZE,
    FEATURE_MIG_DEVICE_STATE, FEATURE_SET, FLAG_ERROR,
};

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The socket failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// The server's reply was malformed.
    #[error("malformed reply: {0}")]
    Proto(#[from] ProtoError),
    /// The server answered with an error.
    #[error("{command:?} refused with errno {errno} (the server's log gives the reason)")]
    Refused {
        /// The command.
        command: Command,
        /// The errno.
        errno: i32,
    },
    /// The server did not answer within the client's timeout ([`Client::set_timeout`]).
    #[error("the server did not answer {command:?} within {after:?}")]
    TimedOut {
        /// The command.
        command: Command,
        /// The timeout.
        after: Duration,
    },
    /// An earlier request broke the connection (the socket failed, timed out or carried a
    /// malformed reply): nothing more is sent on it, since a late reply would be taken for the
    /// next request's.
    #[error("the connection to the vfio-user server broke earlier; no more requests go on it")]
    Broken,
    /// The reply did not match the request.
    #[error("reply to {command:?} does not match: {what}")]
    Mismatch {
        /// The command.
        command: Command,
        /// What was wrong.
        what: &'static str,
    },
}

/// Result of client calls.
pub type Result<T> = std::result::Result<T, ClientError>;

/// Most bytes the client accepts in one DMA_READ / DMA_WRITE from the server (its
/// `max_data_xfer_size`).
pub const CLIENT_MAX_XFER: u64 = 1 << 20;

/// Memory the client keeps itself and maps without a descriptor: the server reaches it only by
/// DMA_READ / DMA_WRITE.
#[derive(Debug)]
struct LocalRegion {
    address: u64,
    data: Vec<u8>,
}

/// What DEVICE_GET_REGION_INFO says of a region.
#[derive(Debug)]
pub struct RegionDetails {
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
    /// Size in bytes.
    pub size: u64,
    /// For a mappable region, the offset in `file` to map.
    pub offset: u64,
    /// The descriptor of a mappable region.
    pub file: Option<File>,
    /// The sparse-mmap areas, when the region has the capability.
    pub sparse: Option<Vec<SparseArea>>,
}

/// A vfio-user client connected to one server.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    next_id: u16,
    /// The server's VERSION capabilities (JSON text).
    pub capabilities: String,
    local: Vec<LocalRegion>,
    dma_served: u64,
    rx: Vec<u8>,
    timeout: Option<Duration>,
    poll: Option<Duration>,
    broken: bool,
}

impl Client {
    /// Connects to the server at `path` and negotiates the version.
    pub fn connect(path: &Path) -> Result<Client> {
        let stream = UnixStream::connect(path)?;
        let mut c = Client {
            stream,
            next_id: 1,
            capabilities: String::new(),
            local: Vec::new(),
            dma_served: 0,
            rx: Vec::new(),
            timeout: None,
            poll: None,
            broken: false,
        };
        let mut v = Vec::new();
        v.put16(0);
        v.put16(2);
        v.extend_from_slice(
            format!(
                "{{\"capabilities\":{{\"max_msg_fds\":8,\"max_data_xfer_size\":{CLIENT_MAX_XFER}}}}}\0"
            )
            .as_bytes(),
        );
        let reply = c.request(Command::Version, &v, &[])?;
        let mut r = Reader::new(&reply);
        let (major, _minor) = (r.u16()?, r.u16()?);
        if major != 0 {
            return Err(ClientError::Mismatch {
                command: Command::Version,
                what: "major version",
            });
        }
        c.capabilities = String::from_utf8_lossy(r.rest())
            .trim_end_matches('\0')
            .to_owned();
        Ok(c)
    }

    /// Sends one command with `fds` and returns the reply's payload.
    pub fn request(&mut self, command: Command, payload: &[u8], fds: &[&File]) -> Result<Vec<u8>> {
        self.request_fds(command, payload, fds).map(|(p, _)| p)
    }

    /// Sends one command with `fds` and returns the reply's payload and the descriptors that came
    /// with it. DMA_READ / DMA_WRITE requests from the server that arrive first are served.
    pub fn request_fds(
        &mut self,
        command: Command,
        payload: &[u8],
        fds: &[&File],
    ) -> Result<(Vec<u8>, Vec<File>)> {
        let fds = self.exchange(command, payload, fds)?;
        Ok((self.rx.clone(), fds))
    }

    /// Poll the socket for up to `limit` for each reply before sleeping until it comes
    /// (`None`, the default: sleep at once); the server's side is `Server::set_poll`.
    pub fn set_poll(&mut self, limit: Option<Duration>) {
        self.poll = limit.filter(|d| !d.is_zero());
    }

    /// How long a request may wait for the socket (each read or write of it) before it fails
    /// with [`ClientError::TimedOut`] (`None`: forever, the default). A server that hangs then
    /// cannot hang the VMM; after a timeout the connection is [`ClientError::Broken`].
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        self.stream.set_read_timeout(timeout)?;
        self.stream.set_write_timeout(timeout)?;
        self.timeout = timeout;
        Ok(())
    }

    /// Sends one command and waits for its reply, whose payload is left in `self.rx`. A failure
    /// other than the server's refusal breaks the connection for good.
    fn exchange(&mut self, command: Command, payload: &[u8], fds: &[&File]) -> Result<Vec<File>> {
        if self.broken {
            return Err(ClientError::Broken);
        }
        let r = self.exchange_once(command, payload, fds);
        match r {
            Err(ClientError::Refused { .. }) | Ok(_) => r,
            Err(ClientError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                self.broken = true;
                Err(ClientError::TimedOut {
                    command,
                    after: self.timeout.unwrap_or_default(),
                })
            }
            Err(e) => {
                self.broken = true;
                Err(e)
            }
        }
    }

    /// One request and its reply (a buffer kept from message to message: a megabyte allocated
    /// afresh per MIG_DATA_READ costs more in page faults than the copy).
    fn exchange_once(
        &mut self,
        command: Command,
        payload: &[u8],
        fds: &[&File],
    ) -> Result<Vec<File>> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let h = Header::command(id, command, payload.len());
        let mut msg = h.to_bytes().to_vec();
        msg.extend_from_slice(payload);
        if fds.is_empty() {
            self.stream.write_all(&msg)?;
        } else {
            let raw: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
            let n = self
                .stream
                .send_with_fds(&[&msg[..]], &raw)
                .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
            self.stream.write_all(&msg[n..])?;
        }
        let (r, fds) = loop {
            if let Some(limit) = self.poll {
                poll_for_message(&self.stream, limit)?;
            }
            let (head, fds) =
                recv_message_into(&mut self.stream, &mut self.rx).map_err(|e| match e {
                    ServerError::Io(e) => ClientError::Io(e),
                    ServerError::Proto(p) => ClientError::Proto(p),
                })?;
            if head.is_reply() {
                break (head, fds);
            }
            let request = std::mem::take(&mut self.rx);
            let served = self.serve_dma(head, &request);
            self.rx = request;
            served?;
        };
        if !r.is_reply() || r.msg_id != id || r.command != command as u16 {
            return Err(ClientError::Mismatch {
                command,
                what: "header",
            });
        }
        if r.flags & FLAG_ERROR != 0 {
            return Err(ClientError::Refused {
                command,
                errno: r.error.cast_signed(),
            });
        }
        Ok(fds)
    }

    /// Answers a command the server sent (DMA_READ / DMA_WRITE on the client's own memory);
    /// anything else gets an error reply.
    fn serve_dma(&mut self, h: Header, p: &[u8]) -> Result<()> {
        let answer = match Command::try_from(h.command) {
            Ok(Command::DmaRead) => self.dma_read_local(p),
            Ok(Command::DmaWrite) => self.dma_write_local(p),
            _ => Err(libc::EINVAL),
        };
        self.dma_served += 1;
        let (payload, error) = match answer {
            Ok(v) => (v, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        write_message(
            &mut self.stream,
            Header::reply(h, payload.len(), error),
            &payload,
        )?;
        Ok(())
    }

    /// The local region and offset holding `address..address+count`.
    fn local_range(&self, address: u64, count: u64) -> std::result::Result<(usize, usize), i32> {
        if count > CLIENT_MAX_XFER {
            return Err(libc::E2BIG);
        }
        let end = address.checked_add(count).ok_or(libc::EFAULT)?;
        self.local
            .iter()
            .position(|r| r.address <= address && end <= r.address + r.data.len() as u64)
            .map(|i| (i, (address - self.local[i].address) as usize))
            .ok_or(libc::EFAULT)
    }

    fn dma_read_local(&mut self, p: &[u8]) -> std::result::Result<Vec<u8>, i32> {
        let (a, rest) = DmaAccess::parse(p).map_err(|_| libc::EINVAL)?;
        if !rest.is_empty() {
            return Err(libc::EINVAL);
        }
        let (i, at) = self.local_range(a.address, a.count)?;
        Ok(a.to_bytes(&self.local[i].data[at..at + a.count as usize]))
    }

    fn dma_write_local(&mut self, p: &[u8]) -> std::result::Result<Vec<u8>, i32> {
        let (a, data) = DmaAccess::parse(p).map_err(|_| libc::EINVAL)?;
        if data.len() as u64 != a.count {
            return Err(libc::EINVAL);
        }
        let (i, at) = self.local_range(a.address, a.count)?;
        self.local[i].data[at..at + data.len()].copy_from_slice(data);
        Ok(a.to_bytes(&[]))
    }

    /// Maps `size` zeroed bytes kept by the client at DMA address `address`, without a file
    /// descriptor: the server reaches them by DMA_READ / DMA_WRITE, which the client serves while
    /// it waits for its replies.
    pub fn dma_map_local(&mut self, address: u64, size: u64) -> Result<()> {
        let len = usize::try_from(size).map_err(|_| ClientError::Mismatch {
            command: Command::DmaMap,
            what: "size",
        })?;
        let m = DmaMap {
            argsz: DmaMap::LEN as u32,
            flags: 3,
            offset: 0,
            address,
            size,
        };
        self.request(Command::DmaMap, &m.to_bytes(), &[])?;
        self.local.push(LocalRegion {
            address,
            data: vec![0; len],
        });
        Ok(())
    }

    /// The client-kept memory at `address..address+len`, if one local region holds it.
    pub fn local_memory(&self, address: u64, len: usize) -> Option<&[u8]> {
        let (i, at) = self.local_range(address, 0).ok()?;
        self.local[i].data.get(at..at.checked_add(len)?)
    }

    /// The client-kept memory at `address..address+len`, mutably.
    pub fn local_memory_mut(&mut self, address: u64, len: usize) -> Option<&mut [u8]> {
        let (i, at) = self.local_range(address, 0).ok()?;
        self.local[i].data.get_mut(at..at.checked_add(len)?)
    }

    /// DMA_READ / DMA_WRITE requests the server sent that this client answered.
    pub fn dma_requests_served(&self) -> u64 {
        self.dma_served
    }

    /// Maps `size` bytes of `file` from `offset` at DMA address `address`, read-write.
    pub fn dma_map(&mut self, file: &File, offset: u64, address: u64, size: u64) -> Result<()> {
        self.dma_map_flags(file, offset, address, size, 3)
    }

    /// [`Client::dma_map`] with the map's `flags` (bit 0 the device may read, bit 1 write): a
    /// map with bit 0 alone is read-only to the device, as QEMU maps ROM.
    pub fn dma_map_flags(
        &mut self,
        file: &File,
        offset: u64,
        address: u64,
        size: u64,
        flags: u32,
    ) -> Result<()> {
        let m = DmaMap {
            argsz: DmaMap::LEN as u32,
            flags,
            offset,
            address,
            size,
        };
        self.request(Command::DmaMap, &m.to_bytes(), &[file])?;
        Ok(())
    }

    /// Unmaps a range mapped with [`Client::dma_map`] or [`Client::dma_map_local`].
    pub fn dma_unmap(&mut self, address: u64, size: u64) -> Result<()> {
        let u = DmaUnmap {
            argsz: DmaUnmap::LEN as u32,
            flags: 0,
            address,
            size,
        };
        self.request(Command::DmaUnmap, &u.to_bytes(), &[])?;
        self.local
            .retain(|r| !(r.address == address && r.data.len() as u64 == size));
        Ok(())
    }

    /// `(flags, num_regions, num_irqs)`.
    pub fn device_info(&mut self) -> Result<(u32, u32, u32)> {
        let mut p = Vec::new();
        p.put32(16);
        p.put32(0);
        p.put32(0);
        p.put32(0);
        let r = self.request(Command::DeviceGetInfo, &p, &[])?;
        let mut r = Reader::new(&r);
        let _argsz = r.u32()?;
        Ok((r.u32()?, r.u32()?, r.u32()?))
    }

    /// `(flags, size)` of region `index`.
    pub fn region_info(&mut self, index: u32) -> Result<(u32, u64)> {
        let d = self.region_details(index)?;
        Ok((d.flags, d.size))
    }

    /// Everything DEVICE_GET_REGION_INFO says of region `index`: for a mappable region its
    /// descriptor and, with the capability, its sparse areas (asked again with the `argsz` the
    /// server says the capability chain needs).
    pub fn region_details(&mut self, index: u32) -> Result<RegionDetails> {
        let mut argsz = RegionInfo::LEN as u32;
        for _ in 0..2 {
            let req = RegionInfo {
                argsz,
                flags: 0,
                index,
                cap_offset: 0,
                size: 0,
                offset: 0,
            };
            let (r, mut fds) =
                self.request_fds(Command::DeviceGetRegionInfo, &req.to_bytes(&[]), &[])?;
            let (info, _) = RegionInfo::parse(&r)?;
            let bad = |what| ClientError::Mismatch {
                command: Command::DeviceGetRegionInfo,
                what,
            };
            if info.index != index || fds.len() > 1 {
                return Err(bad("index or descriptors"));
            }
            if info.argsz > argsz && argsz == RegionInfo::LEN as u32 {
                argsz = info.argsz; // the capability chain needs more room: ask again
                continue;
            }
            let sparse = if info.cap_offset != 0 {
                parse_sparse_mmap(&r, info.cap_offset)?
            } else {
                None
            };
            return Ok(RegionDetails {
                flags: info.flags,
                size: info.size,
                offset: info.offset,
                file: fds.pop(),
                sparse,
            });
        }
        Err(ClientError::Mismatch {
            command: Command::DeviceGetRegionInfo,
            what: "argsz keeps growing",
        })
    }

    /// The ioeventfds of region `index` (GET_REGION_IO_FDS): each sub-region with its
    /// descriptor. Asked again with the `argsz` the server says the entries need.
    pub fn region_io_fds(&mut self, index: u32) -> Result<Vec<(IoFdEntry, File)>> {
        let mut argsz = IoFdsHead::LEN as u32;
        for _ in 0..2 {
            let req = IoFdsHead {
                argsz,
                flags: 0,
                index,
                count: 0,
            };
            let (r, fds) =
                self.request_fds(Command::DeviceGetRegionIoFds, &req.to_bytes(&[]), &[])?;
            let (head, rest) = IoFdsHead::parse(&r)?;
            if head.argsz > argsz && rest.is_empty() && head.count > 0 {
                argsz = head.argsz;
                continue;
            }
            let entries = IoFdEntry::parse_all(rest, head.count)?;
            if head.index != index
                || entries.iter().any(|e| e.fd_index as usize >= fds.len())
                || (entries.is_empty() && !fds.is_empty())
            {
                return Err(ClientError::Mismatch {
                    command: Command::DeviceGetRegionIoFds,
                    what: "index or descriptors",
                });
            }
            // Entries may share a descriptor: each gets its own handle.
            return entries
                .into_iter()
                .map(|e| Ok((e, fds[e.fd_index as usize].try_clone()?)))
                .collect();
        }
        Err(ClientError::Mismatch {
            command: Command::DeviceGetRegionIoFds,
            what: "argsz keeps growing",
        })
    }

    /// REGION_WRITE_MULTI of up to 200 small writes; returns how many the server made.
    pub fn region_write_multi(&mut self, writes: &[WriteMultiEntry]) -> Result<u64> {
        let r = self.request(
            Command::RegionWriteMulti,
            &WriteMultiEntry::request(writes),
            &[],
        )?;
        Ok(Reader::new(&r).u64()?)
    }

    /// Reads `len` bytes at `offset` of region `region`.
    pub fn region_read(&mut self, region: u32, offset: u64, len: u32) -> Result<Vec<u8>> {
        let a = RegionAccess {
            offset,
            region,
            count: len,
        };
        let r = self.request(Command::RegionRead, &a.to_bytes(&[]), &[])?;
        let (got, data) = RegionAccess::parse(&r)?;
        if got != a || data.len() != len as usize {
            return Err(ClientError::Mismatch {
                command: Command::RegionRead,
                what: "length",
            });
        }
        Ok(data.to_vec())
    }

    /// Writes `data` at `offset` of region `region`.
    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> Result<()> {
        let a = RegionAccess {
            offset,
            region,
            count: data.len() as u32,
        };
        self.request(Command::RegionWrite, &a.to_bytes(data), &[])?;
        Ok(())
    }

    /// Sets eventfds for vectors `start..start+fds.len()` of IRQ `index` (ACTION_TRIGGER |
    /// DATA_EVENTFD).
    pub fn set_irq_eventfds(&mut self, index: u32, start: u32, fds: &[&File]) -> Result<()> {
        let mut p = Vec::new();
        p.put32(20);
        p.put32((1 << 5) | (1 << 2));
        p.put32(index);
        p.put32(start);
        p.put32(fds.len() as u32);
        self.request(Command::DeviceSetIrqs, &p, fds)?;
        Ok(())
    }

    /// DEVICE_RESET.
    pub fn reset(&mut self) -> Result<()> {
        self.request(Command::DeviceReset, &[], &[])?;
        Ok(())
    }

    /// A DEVICE_FEATURE request: `data` after the header, `argsz` the room for the reply (a GET
    /// that returns 8 bytes says so, as the specification's argsz rule and libvfio-user want).
    fn feature(&mut self, flags: u32, data: &[u8]) -> Result<Vec<u8>> {
        let room = if flags & FEATURE_GET != 0 {
            data.len().max(8)
        } else {
            data.len()
        };
        let req = Feature::to_bytes_with_argsz((Feature::LEN + room) as u32, flags, data);
        let r = self.request(Command::DeviceFeature, &req, &[])?;
        let (f, data) = Feature::parse(&r)?;
        if f.flags != flags {
            return Err(ClientError::Mismatch {
                command: Command::DeviceFeature,
                what: "flags",
            });
        }
        Ok(data.to_vec())
    }

    /// `VFIO_DEVICE_FEATURE_MIGRATION` GET: the `VFIO_MIGRATION_*` flags.
    pub fn migration_flags(&mut self) -> Result<u64> {
        let d = self.feature(FEATURE_GET | FEATURE_MIGRATION, &[])?;
        Ok(Reader::new(&d).u64()?)
    }

    /// `MIG_DEVICE_STATE` GET.
    pub fn device_state(&mut self) -> Result<u32> {
        let d = self.feature(FEATURE_GET | FEATURE_MIG_DEVICE_STATE, &[])?;
        Ok(Reader::new(&d).u32()?)
    }

    /// `MIG_DEVICE_STATE` SET to `state`.
    pub fn set_device_state(&mut self, state: DeviceState) -> Result<()> {
        let mut d = Vec::new();
        d.put32(state as u32);
        d.put32(u32::MAX);
        self.feature(FEATURE_SET | FEATURE_MIG_DEVICE_STATE, &d)?;
        Ok(())
    }

    /// `MIG_DATA_SIZE` GET.
    pub fn mig_data_size(&mut self) -> Result<u64> {
        let d = self.feature(FEATURE_GET | FEATURE_MIG_DATA_SIZE, &[])?;
        Ok(Reader::new(&d).u64()?)
    }

    /// MIG_DATA_READ of at most `max` bytes: `Ok(None)` for "no data now" (`ENOMSG`), an empty
    /// vector at the end of a STOP_COPY stream.
    pub fn mig_read(&mut self, max: u32) -> Result<Option<Vec<u8>>> {
        let mut out = Vec::new();
        Ok(self.mig_read_into(max, &mut out)?.map(|_| out))
    }

    /// [`Client::mig_read`] into `out` (replaced; its capacity is reused): `Ok(None)` for "no
    /// data now", `Ok(Some(0))` at the end of a STOP_COPY stream, else the bytes read.
    pub fn mig_read_into(&mut self, max: u32, out: &mut Vec<u8>) -> Result<Option<usize>> {
        // argsz: the room for the reply, the fixed part and `max` bytes of data.
        let argsz = (MigData::LEN as u32).saturating_add(max);
        let p = MigData::to_bytes(argsz, max, &[]);
        match self.exchange(Command::MigDataRead, &p, &[]) {
            Ok(_) => {
                let (m, data) = MigData::parse(&self.rx)?;
                if m.size as usize != data.len() || m.size > max {
                    return Err(ClientError::Mismatch {
                        command: Command::MigDataRead,
                        what: "size",
                    });
                }
                out.clear();
                out.extend_from_slice(data);
                Ok(Some(data.len()))
            }
            Err(ClientError::Refused { errno, .. }) if errno == libc::ENOMSG => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `DMA_LOGGING_START` over `ranges` (none: every mapped region) at `page_size`; returns the
    /// page size the device chose.
    pub fn dma_logging_start(&mut self, page_size: u64, ranges: &[(u64, u64)]) -> Result<u64> {
        let mut d = Vec::new();
        d.put64(page_size);
        d.put32(ranges.len() as u32);
        d.put32(0);
        for &(iova, length) in ranges {
            d.put64(iova);
            d.put64(length);
        }
        let r = self.feature(FEATURE_SET | FEATURE_DMA_LOGGING_START, &d)?;
        Ok(Reader::new(&r).u64()?)
    }

    /// `DMA_LOGGING_STOP` (no data, as in the kernel uAPI).
    pub fn dma_logging_stop(&mut self) -> Result<()> {
        self.feature(FEATURE_SET | FEATURE_DMA_LOGGING_STOP, &[])?;
        Ok(())
    }

    /// `DMA_LOGGING_REPORT` of `length` bytes from `iova`: one bit per `page_size` unit written
    /// since the last report (read and clear), as little-endian `u64` words.
    pub fn dma_logging_report(
        &mut self,
        iova: u64,
        length: u64,
        page_size: u64,
    ) -> Result<Vec<u64>> {
        let words = length.div_ceil(page_size.max(1)).div_ceil(64) as usize;
        let mut d = Vec::new();
        d.put64(iova);
        d.put64(length);
        d.put64(page_size);
        let flags = FEATURE_GET | FEATURE_DMA_LOGGING_REPORT;
        let argsz = Feature::LEN + DMA_LOGGING_REPORT_LEN + 8 * words;
        let r = self.request(
            Command::DeviceFeature,
            &Feature::to_bytes_with_argsz(argsz as u32, flags, &d),
            &[],
        )?;
        let (f, data) = Feature::parse(&r)?;
        let bad = |what| ClientError::Mismatch {
            command: Command::DeviceFeature,
            what,
        };
        if f.flags != flags || data.len() != DMA_LOGGING_REPORT_LEN + 8 * words {
            return Err(bad("DMA log report"));
        }
        let mut r = Reader::new(&data[DMA_LOGGING_REPORT_LEN..]);
        (0..words).map(|_| Ok(r.u64()?)).collect()
    }

    /// MIG_DATA_WRITE of `data`.
    pub fn mig_write(&mut self, data: &[u8]) -> Result<()> {
        let p = MigData::to_bytes((MigData::LEN + data.len()) as u32, data.len() as u32, data);
        self.request(Command::MigDataWrite, &p, &[])?;
        Ok(())
    }
}
