//! What the server needs from the device it serves ([`UserDevice`]), and what the device hands
//! back: its DMA port ([`Dma`]), mappable regions ([`RegionMmap`]) and ioeventfds ([`IoEventFd`]).

use std::fs::File;

use gmig_vfio_migration::{MigrationDevice, MigrationHandle};
use vm_memory::GuestMemoryMmap;

use crate::proto::{Errno, GfxPlane, SparseArea};

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
    /// How long the session may wait for the next message before it calls
    /// [`UserDevice::idle`]: `Some` while the device has work that advances without the client
    /// (a GPU engine spinning on memory the CPU will write). The default: wait for ever.
    fn idle_after(&self) -> Option<std::time::Duration> {
        None
    }
    /// No message came within [`UserDevice::idle_after`]: the device's turn.
    fn idle(&mut self) {}
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
    /// The graphics plane of type `drm_plane_type` for the GFX_PLANE feature (the kernel's
    /// `VFIO_DEVICE_QUERY_GFX_PLANE`, region type): with `probe`, `Ok` when the device has such
    /// a plane (the value is ignored); otherwise the plane shown now, its pixels written into
    /// its region ([`UserDevice::region_mmap`]) before the call returns, or a plane with
    /// `drm_format` and `size` 0 while nothing is shown. The default has no display (`ENOTSUP`).
    fn gfx_plane(&mut self, _drm_plane_type: u32, _probe: bool) -> Result<GfxPlane, Errno> {
        Err(libc::ENOTSUP)
    }
    /// The ioeventfds of region `index`. The default has none.
    fn region_io_fds(&self, _index: u32) -> Vec<IoEventFd<'_>> {
        Vec::new()
    }
}
