//! The VMM side of vfio-user: connect, negotiate, map guest RAM by file descriptor, access
//! regions, set IRQs, reset, and drive migration v2 (DEVICE_FEATURE, MIG_DATA_READ,
//! MIG_DATA_WRITE). Requests are sent one at a time and each waits for its reply.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;

use gmig_vfio_migration::DeviceState;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::proto::{
    Command, DmaMap, DmaUnmap, Feature, Header, MigData, ProtoError, Put, Reader, RegionAccess,
    DMA_LOGGING_REPORT_LEN, FEATURE_DMA_LOGGING_REPORT, FEATURE_DMA_LOGGING_START,
    FEATURE_DMA_LOGGING_STOP, FEATURE_GET, FEATURE_MIGRATION, FEATURE_MIG_DATA_SIZE,
    FEATURE_MIG_DEVICE_STATE, FEATURE_SET, FLAG_COMMAND, FLAG_ERROR, HEADER_LEN,
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
    #[error("{command:?} refused with errno {errno}")]
    Refused {
        /// The command.
        command: Command,
        /// The errno.
        errno: i32,
    },
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

/// A vfio-user client connected to one server.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    next_id: u16,
    /// The server's VERSION capabilities (JSON text).
    pub capabilities: String,
}

impl Client {
    /// Connects to the server at `path` and negotiates the version.
    pub fn connect(path: &Path) -> Result<Client> {
        let stream = UnixStream::connect(path)?;
        let mut c = Client {
            stream,
            next_id: 1,
            capabilities: String::new(),
        };
        let mut v = Vec::new();
        v.put16(0);
        v.put16(2);
        v.extend_from_slice(b"{\"capabilities\":{\"max_msg_fds\":8}}\0");
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
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let h = Header {
            msg_id: id,
            command: command as u16,
            size: (HEADER_LEN + payload.len()) as u32,
            flags: FLAG_COMMAND,
            error: 0,
        };
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
        let mut head = [0u8; HEADER_LEN];
        self.stream.read_exact(&mut head)?;
        let r = Header::parse(&head, u32::MAX)?;
        let mut body = vec![0u8; r.payload_len()];
        self.stream.read_exact(&mut body)?;
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
        Ok(body)
    }

    /// Maps `size` bytes of `file` from `offset` at DMA address `address`, read-write.
    pub fn dma_map(&mut self, file: &File, offset: u64, address: u64, size: u64) -> Result<()> {
        let m = DmaMap {
            argsz: DmaMap::LEN as u32,
            flags: 3,
            offset,
            address,
            size,
        };
        self.request(Command::DmaMap, &m.to_bytes(), &[file])?;
        Ok(())
    }

    /// Unmaps a range mapped with [`Client::dma_map`].
    pub fn dma_unmap(&mut self, address: u64, size: u64) -> Result<()> {
        let u = DmaUnmap {
            argsz: DmaUnmap::LEN as u32,
            flags: 0,
            address,
            size,
        };
        self.request(Command::DmaUnmap, &u.to_bytes(), &[])?;
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
        let mut p = Vec::new();
        p.put32(32);
        p.put32(0);
        p.put32(index);
        p.put32(0);
        p.put64(0);
        p.put64(0);
        let r = self.request(Command::DeviceGetRegionInfo, &p, &[])?;
        let mut r = Reader::new(&r);
        let (_argsz, flags, _index, _cap) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        Ok((flags, r.u64()?))
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

    fn feature(&mut self, flags: u32, data: &[u8]) -> Result<Vec<u8>> {
        let r = self.request(Command::DeviceFeature, &Feature::to_bytes(flags, data), &[])?;
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
        let p = MigData::to_bytes(MigData::LEN as u32, max, &[]);
        match self.request(Command::MigDataRead, &p, &[]) {
            Ok(r) => {
                let (m, data) = MigData::parse(&r)?;
                if m.size as usize != data.len() || m.size > max {
                    return Err(ClientError::Mismatch {
                        command: Command::MigDataRead,
                        what: "size",
                    });
                }
                Ok(Some(data.to_vec()))
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

    /// `DMA_LOGGING_STOP`.
    pub fn dma_logging_stop(&mut self) -> Result<()> {
        let mut d = Vec::new();
        d.put64(0);
        d.put32(0);
        d.put32(0);
        self.feature(FEATURE_SET | FEATURE_DMA_LOGGING_STOP, &d)?;
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
