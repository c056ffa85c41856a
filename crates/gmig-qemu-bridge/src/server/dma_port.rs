//! The device's DMA during one request ([`Dma`] for the server): regions mapped with a
//! descriptor through `vm-memory`, regions without one through DMA_READ / DMA_WRITE exchanges with
//! the client.

use std::collections::VecDeque;
use std::io;
use std::os::unix::net::UnixStream;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::device::Dma;
use super::state::{DmaRegion, Pending, ServerError};
use super::wire::{recv_message, write_message};
use super::{DMA_REPLY_TIMEOUT, MAX_PENDING};
use crate::proto::{Command, DmaAccess, Errno, Header, FLAG_ERROR};

/// The server's side of a device's DMA during one request: regions mapped with a descriptor
/// through `vm-memory`, regions without one through DMA_READ / DMA_WRITE on the client's socket.
pub(super) struct DmaPort<'a> {
    pub(super) stream: &'a mut UnixStream,
    pub(super) mem: Option<&'a GuestMemoryMmap>,
    pub(super) dma: &'a [DmaRegion],
    pub(super) pending: &'a mut VecDeque<Pending>,
    pub(super) next_id: &'a mut u16,
    pub(super) xfer: u64,
    pub(super) broken: &'a mut Option<io::Error>,
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
        // A region the client mapped without the write flag: refused, as an IOMMU refuses it
        // (and its descriptor-backed mapping is PROT_READ).
        if !r.writable {
            return Err(libc::EPERM);
        }
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
