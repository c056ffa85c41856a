//! Device, region and IRQ handlers: DEVICE_GET_INFO, GET_REGION_INFO (with mmap and sparse
//! areas), GET_REGION_IO_FDS, GET_IRQ_INFO, SET_IRQS, REGION_READ, REGION_WRITE and
//! REGION_WRITE_MULTI.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use vfio_bindings::bindings::vfio as uapi;

use super::device::UserDevice;
use super::state::{err, ok, Reply, Server};
use super::{MAX_DATA_XFER, MAX_MSG_FDS};
use crate::proto::{
    sparse_mmap_cap, Errno, IoFdEntry, IoFdsHead, Put, Reader, RegionAccess, RegionInfo,
    WriteMultiEntry, IO_FD_DATAMATCH, IO_FD_IOEVENTFD,
};
use crate::server_checks::irq_set_data;

impl<D: UserDevice> Server<D> {
    pub(super) fn device_info(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
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

    pub(super) fn region_info(&mut self, p: &[u8]) -> Reply {
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

    pub(super) fn region_io_fds(&mut self, p: &[u8]) -> Reply {
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

    pub(super) fn irq_info(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
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

    pub(super) fn set_irqs(&mut self, p: &[u8], fds: Vec<File>) -> Result<Vec<u8>, Errno> {
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

    pub(super) fn region_read(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let (a, rest) = RegionAccess::parse(p).map_err(|_| libc::EINVAL)?;
        if !rest.is_empty() {
            return Err(libc::EINVAL);
        }
        self.checked_access(a)?;
        let mut data = vec![0u8; a.count as usize];
        self.device.region_read(a.region, a.offset, &mut data)?;
        Ok(a.to_bytes(&data))
    }

    pub(super) fn region_write(
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
    pub(super) fn region_write_multi(
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
}
