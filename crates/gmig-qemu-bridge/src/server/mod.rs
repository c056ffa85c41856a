//! A vfio-user server for one PCI device, generic over a [`UserDevice`] backend: version
//! negotiation, DMA regions mapped from the client's file descriptors into a `vm-memory`
//! [`GuestMemoryMmap`](vm_memory::GuestMemoryMmap) (the device reads and writes the client's RAM,
//! not a copy), regions, IRQs with eventfds, reset, and migration v2 (DEVICE_FEATURE,
//! MIG_DATA_READ, MIG_DATA_WRITE) through `gmig-vfio-migration`'s
//! [`MigrationHandle`](gmig_vfio_migration::MigrationHandle).
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
//!
//! The parts: [`UserDevice`] and what it hands the server (`device`), the server's state and the
//! types its parts share (`state`), the session loop and version negotiation (`session`), DMA map
//! bookkeeping (`dma_map`), region and IRQ handlers (`regions`), migration features and data
//! (`migration`), the GFX_PLANE feature (`gfx`), the device's DMA port (`dma_port`), and message framing on the socket (`wire`).

mod device;
mod dma_map;
mod dma_port;
mod gfx;
mod migration;
mod regions;
mod session;
mod state;
mod wire;

use std::time::Duration;

pub use self::device::{Dma, IoEventFd, RegionMmap, UserDevice};
pub use self::state::{DmaLogControl, NegativeControls, Server, ServerError};
pub(crate) use self::wire::{poll_for_message, recv_message_into, write_message};
pub use crate::proto::Errno;

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
