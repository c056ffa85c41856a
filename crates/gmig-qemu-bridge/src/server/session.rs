//! The session loop: one client served until it disconnects, each command dispatched to its
//! handler, VERSION negotiated, and the device left running when the client goes.

use std::fs::File;
use std::io;
use std::os::unix::net::UnixStream;

use gmig_vfio_migration::DeviceState;

use super::device::UserDevice;
use super::dma_port::DmaPort;
use super::state::{err, ok, Pending, Reply, Server, ServerError};
use super::wire::{poll_for_message, readable_within, recv_message_into, send};
use super::{MAX_DATA_XFER, MAX_DMA_REGIONS, MAX_MSG_FDS, MINOR_VERSION};
use crate::proto::{Command, Errno, Put, Reader, FLAG_NO_REPLY, FLAG_TYPE_MASK};

impl<D: UserDevice> Server<D> {
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
                    if let Some(limit) = self.poll {
                        poll_for_message(stream, limit)?;
                    }
                    // A device whose work goes on without the client (an engine spinning on
                    // memory) is given its turn whenever no message comes for a while.
                    if let Some(after) = self.device.idle_after() {
                        if !readable_within(stream, after)? {
                            self.device.idle();
                            continue;
                        }
                    }
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
    pub(super) fn write_with_dma(
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
