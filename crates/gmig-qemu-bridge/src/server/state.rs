//! The server's state ([`Server`]) and the types its parts share: the DMA regions mapped, a
//! message queued while the server waits for a reply of its own, a reply, and why a connection
//! ended ([`ServerError`]).

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::RawFd;

use vm_memory::{FileOffset, GuestMemoryMmap};

use super::device::UserDevice;
use super::MAX_DATA_XFER;
use crate::proto::{Errno, Header, ProtoError};

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

pub(super) struct DmaRegion {
    pub(super) address: u64,
    pub(super) size: u64,
    /// `None`: mapped without a descriptor, reached by DMA_READ / DMA_WRITE if `remote`.
    pub(super) file: Option<FileOffset>,
    /// Without a descriptor: whether the device reaches it by messages ([`UserDevice::remote_dma`]);
    /// if not, the map is taken (as an IOMMU takes a mapping the device never uses) and any
    /// access to it faults.
    pub(super) remote: bool,
    /// Whether the client allowed the device to write it (`DMA_WRITE`).
    pub(super) writable: bool,
}

/// A message the client sent while the server waited for a reply of its own.
pub(super) struct Pending {
    pub(super) head: Header,
    pub(super) payload: Vec<u8>,
    pub(super) fds: Vec<File>,
}

/// A vfio-user server for one device.
pub struct Server<D: UserDevice> {
    pub(super) device: D,
    pub(super) dma: Vec<DmaRegion>,
    pub(super) mem: Option<GuestMemoryMmap>,
    pub(super) negotiated: bool,
    /// The client's `max_data_xfer_size` (the spec's default until it says otherwise).
    pub(super) client_xfer: u64,
    pub(super) pending: VecDeque<Pending>,
    pub(super) next_id: u16,
    /// Buffers kept across messages: the payload received and a reply's payload. A megabyte
    /// allocated afresh per MIG_DATA message costs more in page faults than the copy itself.
    pub(super) rx: Vec<u8>,
    pub(super) spare: Vec<u8>,
    /// Features switched off for negative controls (all on by default).
    pub(super) controls: NegativeControls,
    /// The last refusal of migration data logged (vfio-user replies carry only an errno, so the
    /// reason goes to the log, once per stream).
    pub(super) refusal_logged: Option<String>,
    /// How long the session polls the socket for the next message before it sleeps in `recv`
    /// (`None`: it sleeps at once).
    pub(super) poll: Option<std::time::Duration>,
}

/// How the server's DMA logging behaves: as specified, or switched off for a negative control.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DmaLogControl {
    /// DMA logging as specified.
    #[default]
    On,
    /// DMA_LOGGING_START / STOP / REPORT refused (`ENOTSUP`): the client must not migrate.
    Off,
    /// Accepted, but every report is empty: the pages the device writes are never reported.
    Blind,
}

/// Features a test switches off to show that a migration depends on them (`gmig serve
/// --x-dma-log`, `--x-no-migration`). Never for production.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NegativeControls {
    /// DMA logging.
    pub dma_log: DmaLogControl,
    /// Offer no migration at all (DEVICE_FEATURE refused with `ENOTSUP`).
    pub no_migration: bool,
}

impl<D: UserDevice> std::fmt::Debug for Server<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("dma_regions", &self.dma.len())
            .field("negotiated", &self.negotiated)
            .finish_non_exhaustive()
    }
}

pub(super) struct Reply {
    pub(super) payload: Vec<u8>,
    pub(super) error: Option<Errno>,
    /// Descriptors sent with the reply (borrowed from the device, which keeps them open).
    pub(super) fds: Vec<RawFd>,
}

pub(super) fn ok(payload: Vec<u8>) -> Reply {
    Reply {
        payload,
        error: None,
        fds: Vec::new(),
    }
}

pub(super) fn err(e: Errno) -> Reply {
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
            refusal_logged: None,
            controls: NegativeControls::default(),
            poll: None,
        }
    }

    /// Switches features off for a negative control.
    pub fn set_negative_controls(&mut self, controls: NegativeControls) {
        self.controls = controls;
    }

    /// Poll the socket for up to `limit` after each message before sleeping until the next
    /// (`gmig serve --poll-us`): a message that comes within it is read without the wake-up of a
    /// sleeping thread, which is most of a round trip's time, at the price of a core kept busy
    /// for up to `limit` after every message. `None` (the default) sleeps at once.
    pub fn set_poll(&mut self, limit: Option<std::time::Duration>) {
        self.poll = limit.filter(|d| !d.is_zero());
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
}
