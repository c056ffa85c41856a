//! The vGPU as the VMM sees it, attached two ways behind one trait ([`GpuLink`]):
//!
//! * [`Linked`]: in process, gmig's [`VgpuBackend`] called directly (the device trait a rust-vmm
//!   VMM links against);
//! * [`Remote`]: out of process, a `gmig serve` reached over vfio-user with gmig's client, guest
//!   RAM shared by passing the memfd in DMA_MAP.
//!
//! Either way the device sees the same region accesses (configuration space, BAR0, BAR2) in the
//! same order, so a guest gets the same results from both. [`GpuPci`] puts a link on the VMM's
//! PCI bus: it forwards configuration accesses, keeps the BARs the guest placed, and routes MMIO
//! exits that fall in them.

use std::fs::File;
use std::path::Path;

use gmig_qemu_bridge::client::Client;
use gmig_qemu_bridge::server::UserDevice;
use gmig_qemu_bridge::vgpu_backend::VgpuBackend;
use gmig_vfio_migration::{DeviceState, IovaRange, ReadOutcome};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use crate::pci::PciDevice;
use crate::{Error, Result};

/// PCI region indices (`linux/vfio.h`).
pub const REGION_BAR0: u32 = 0;
/// The aperture BAR.
pub const REGION_BAR2: u32 = 2;
/// Configuration space.
pub const REGION_CONFIG: u32 = 7;
/// The MSI interrupt index.
pub const IRQ_MSI: u32 = 1;
/// DMA logging granularity.
pub const PAGE: u64 = 4096;

fn dev(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Device(format!("{what}: {e}"))
}

/// A vGPU attached to the VMM: region accesses, MSI, and the VFIO migration v2 interface with
/// DMA logging.
pub trait GpuLink: Send {
    /// Gives the device the guest's RAM (DMA_MAP of the whole memfd at IOVA 0).
    fn attach_ram(&mut self, mem: &GuestMemoryMmap, file: &File) -> Result<()>;
    /// Size of region `index`, `None` if the device has no such region.
    fn region_size(&mut self, index: u32) -> Result<Option<u64>>;
    /// Reads `data.len()` bytes at `offset` of region `index`.
    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<()>;
    /// Writes `data` at `offset` of region `index`.
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<()>;
    /// The eventfd the device signals MSI on.
    fn set_msi(&mut self, fd: &EventFd) -> Result<()>;
    /// MIG_DEVICE_STATE SET.
    fn set_state(&mut self, state: DeviceState) -> Result<()>;
    /// Up to `max` bytes of saving data: `Some(empty)` when PRE_COPY has nothing now, `None` at the
    /// end of STOP_COPY.
    fn save_read(&mut self, max: usize) -> Result<Option<Vec<u8>>>;
    /// Resuming data.
    fn resume_write(&mut self, data: &[u8]) -> Result<()>;
    /// DMA_LOGGING_START over `ranges` at 4 KiB pages.
    fn dma_log_start(&mut self, ranges: &[IovaRange]) -> Result<()>;
    /// DMA_LOGGING_REPORT (read and clear) of `length` bytes from `iova`: one bit per page.
    fn dma_log_report(&mut self, iova: u64, length: u64) -> Result<Vec<u64>>;
    /// DMA_LOGGING_STOP.
    fn dma_log_stop(&mut self) -> Result<()>;
    /// The in-process backend, when the link is one (for tests that look inside the vGPU).
    fn backend(&self) -> Option<&VgpuBackend> {
        None
    }
}

/// The in-process vGPU as a VFIO v2 migration device.
type VgpuHandle = gmig_vfio_migration::MigrationHandle<
    gmig_core::migration::VmDevice<gmig_vgpu::migratable::VgpuFactory>,
>;

/// The vGPU in process.
#[derive(Debug)]
pub struct Linked(pub VgpuBackend);

fn errno(what: &str, e: i32) -> Error {
    Error::Device(format!("{what}: {}", std::io::Error::from_raw_os_error(e)))
}

impl Linked {
    fn handle(&mut self) -> Result<&mut VgpuHandle> {
        self.0
            .migration()
            .ok_or_else(|| Error::Device("the vGPU has no guest RAM yet".into()))
    }
}

impl Linked {
    /// The open migration stream's id (saving or resuming).
    fn stream(&mut self, what: &str) -> Result<(&mut VgpuHandle, gmig_vfio_migration::StreamId)> {
        let h = self.handle()?;
        let id = h
            .open_stream()
            .map(|s| s.id)
            .ok_or_else(|| Error::Device(format!("no {what} stream")))?;
        Ok((h, id))
    }
}

impl GpuLink for Linked {
    fn attach_ram(&mut self, mem: &GuestMemoryMmap, _file: &File) -> Result<()> {
        self.0.dma_changed(Some(mem));
        self.handle().map(|_| ())
    }

    fn region_size(&mut self, index: u32) -> Result<Option<u64>> {
        Ok(self.0.region_info(index).map(|(_, size)| size))
    }

    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<()> {
        self.0
            .region_read(index, offset, data)
            .map_err(|e| errno("region read", e))
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<()> {
        self.0
            .region_write(index, offset, data)
            .map_err(|e| errno("region write", e))
    }

    fn set_msi(&mut self, fd: &EventFd) -> Result<()> {
        let file = eventfd_file(fd)?;
        self.0
            .set_irqs(
                IRQ_MSI,
                gmig_qemu_bridge::IRQ_EVENTFD_TRIGGER,
                0,
                1,
                vec![file],
            )
            .map_err(|e| errno("SET_IRQS", e))
    }

    fn set_state(&mut self, state: DeviceState) -> Result<()> {
        self.handle()?
            .set_state(state)
            .map(|_| ())
            .map_err(|e| dev("MIG_DEVICE_STATE", e))
    }

    fn save_read(&mut self, max: usize) -> Result<Option<Vec<u8>>> {
        let (h, id) = self.stream("saving")?;
        let mut buf = vec![0u8; max];
        match h.read(id, &mut buf).map_err(|e| dev("save read", e))? {
            ReadOutcome::Data(n) => {
                buf.truncate(n);
                Ok(Some(buf))
            }
            ReadOutcome::NoDataNow => Ok(Some(Vec::new())),
            ReadOutcome::End => Ok(None),
        }
    }

    fn resume_write(&mut self, data: &[u8]) -> Result<()> {
        let (h, id) = self.stream("resuming")?;
        h.write(id, data)
            .map(|_| ())
            .map_err(|e| dev("resume write", e))
    }

    fn dma_log_start(&mut self, ranges: &[IovaRange]) -> Result<()> {
        self.handle()?
            .dma_logging_start(PAGE, ranges)
            .map(|_| ())
            .map_err(|e| dev("DMA_LOGGING_START", e))
    }

    fn dma_log_report(&mut self, iova: u64, length: u64) -> Result<Vec<u64>> {
        self.handle()?
            .dma_logging_report(iova, length, PAGE)
            .map_err(|e| dev("DMA_LOGGING_REPORT", e))
    }

    fn dma_log_stop(&mut self) -> Result<()> {
        self.handle()?
            .dma_logging_stop()
            .map_err(|e| dev("DMA_LOGGING_STOP", e))
    }

    fn backend(&self) -> Option<&VgpuBackend> {
        Some(&self.0)
    }
}

/// The vGPU out of process, over vfio-user.
#[derive(Debug)]
pub struct Remote(pub Client);

impl Remote {
    /// Connects to a vfio-user server (e.g. `gmig serve --socket PATH`).
    pub fn connect(path: &Path) -> Result<Remote> {
        Client::connect(path)
            .map(Remote)
            .map_err(|e| dev(&format!("vfio-user connect {}", path.display()), e))
    }
}

impl GpuLink for Remote {
    fn attach_ram(&mut self, mem: &GuestMemoryMmap, file: &File) -> Result<()> {
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        // One DMA_MAP per region of guest RAM, at its place in the memfd.
        for r in mem.iter() {
            let offset = r.file_offset().map_or(0, vm_memory::FileOffset::start);
            self.0
                .dma_map(file, offset, r.start_addr().0, r.len())
                .map_err(|e| dev("DMA_MAP", e))?;
        }
        Ok(())
    }

    fn region_size(&mut self, index: u32) -> Result<Option<u64>> {
        match self.0.region_info(index) {
            Ok((_, size)) if size > 0 => Ok(Some(size)),
            Ok(_) | Err(gmig_qemu_bridge::client::ClientError::Refused { .. }) => Ok(None),
            Err(e) => Err(dev("REGION_INFO", e)),
        }
    }

    fn region_read(&mut self, index: u32, offset: u64, data: &mut [u8]) -> Result<()> {
        let d = self
            .0
            .region_read(index, offset, data.len() as u32)
            .map_err(|e| dev("REGION_READ", e))?;
        if d.len() != data.len() {
            return Err(Error::Device("REGION_READ returned a short read".into()));
        }
        data.copy_from_slice(&d);
        Ok(())
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<()> {
        self.0
            .region_write(index, offset, data)
            .map_err(|e| dev("REGION_WRITE", e))
    }

    fn set_msi(&mut self, fd: &EventFd) -> Result<()> {
        let file = eventfd_file(fd)?;
        self.0
            .set_irq_eventfds(IRQ_MSI, 0, &[&file])
            .map_err(|e| dev("SET_IRQS", e))
    }

    fn set_state(&mut self, state: DeviceState) -> Result<()> {
        self.0
            .set_device_state(state)
            .map_err(|e| dev("MIG_DEVICE_STATE", e))
    }

    fn save_read(&mut self, max: usize) -> Result<Option<Vec<u8>>> {
        match self
            .0
            .mig_read(max as u32)
            .map_err(|e| dev("MIG_DATA_READ", e))?
        {
            None => Ok(Some(Vec::new())),
            Some(d) if d.is_empty() => Ok(None),
            Some(d) => Ok(Some(d)),
        }
    }

    fn resume_write(&mut self, data: &[u8]) -> Result<()> {
        self.0.mig_write(data).map_err(|e| dev("MIG_DATA_WRITE", e))
    }

    fn dma_log_start(&mut self, ranges: &[IovaRange]) -> Result<()> {
        let r: Vec<(u64, u64)> = ranges.iter().map(|r| (r.iova, r.length)).collect();
        self.0
            .dma_logging_start(PAGE, &r)
            .map(|_| ())
            .map_err(|e| dev("DMA_LOGGING_START", e))
    }

    fn dma_log_report(&mut self, iova: u64, length: u64) -> Result<Vec<u64>> {
        self.0
            .dma_logging_report(iova, length, PAGE)
            .map_err(|e| dev("DMA_LOGGING_REPORT", e))
    }

    fn dma_log_stop(&mut self) -> Result<()> {
        self.0
            .dma_logging_stop()
            .map_err(|e| dev("DMA_LOGGING_STOP", e))
    }
}

/// A second descriptor of `fd` as a File (what SET_IRQS hands the device).
fn eventfd_file(fd: &EventFd) -> Result<File> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let clone = fd.try_clone().map_err(|e| dev("eventfd", e))?;
    // SAFETY: `into_raw_fd` gives up the clone's ownership of its fresh descriptor, which the
    // File now owns alone and closes once.
    Ok(unsafe { File::from_raw_fd(clone.into_raw_fd()) })
}

/// A [`GpuLink`] on the VMM's PCI bus: configuration accesses go to the device's config region;
/// the BARs the guest places are remembered (re-read after each configuration write, as a VMM
/// must to route MMIO), and MMIO exits inside them reach BAR0 or BAR2.
pub struct GpuPci {
    link: Box<dyn GpuLink>,
    sizes: [Option<u64>; 2],
    bars: [Option<u64>; 2],
    /// The first error a device access met (the guest sees all-ones; the VMM reports it).
    pub error: Option<Error>,
}

impl std::fmt::Debug for GpuPci {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPci")
            .field("bars", &self.bars)
            .finish_non_exhaustive()
    }
}

impl GpuPci {
    /// Puts `link` on the bus.
    pub fn new(mut link: Box<dyn GpuLink>) -> Result<GpuPci> {
        let sizes = [
            link.region_size(REGION_BAR0)?,
            link.region_size(REGION_BAR2)?,
        ];
        Ok(GpuPci {
            link,
            sizes,
            bars: [None, None],
            error: None,
        })
    }

    /// The link.
    pub fn link(&mut self) -> &mut dyn GpuLink {
        self.link.as_mut()
    }

    /// The link, shared.
    pub fn link_ref(&self) -> &dyn GpuLink {
        self.link.as_ref()
    }

    fn note(&mut self, r: Result<()>) {
        if let (Err(e), None) = (r, &self.error) {
            self.error = Some(e);
        }
    }

    fn cfg32(&mut self, offset: u64) -> Result<u32> {
        let mut b = [0u8; 4];
        self.link.region_read(REGION_CONFIG, offset, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Re-reads where the guest put the BARs (only while memory decoding is on).
    fn refresh_bars(&mut self) -> Result<()> {
        let cmd = self.cfg32(0x04)?;
        for (i, off) in [(0usize, 0x10u64), (1, 0x18)] {
            let lo = self.cfg32(off)?;
            let hi = self.cfg32(off + 4)?;
            let base = (u64::from(hi) << 32) | u64::from(lo & !0xf);
            self.bars[i] = (cmd & 2 != 0 && base != 0).then_some(base);
        }
        Ok(())
    }

    /// Which region, at which offset, guest-physical `addr` falls in.
    pub fn decode(&self, addr: u64) -> Option<(u32, u64)> {
        [(0usize, REGION_BAR0), (1, REGION_BAR2)]
            .into_iter()
            .find_map(|(i, region)| {
                let base = self.bars[i]?;
                let off = addr.checked_sub(base)?;
                (off < self.sizes[i]?).then_some((region, off))
            })
    }

    /// Configuration space, all 256 bytes (migrated by the VMM, as QEMU migrates a PCI
    /// device's config space).
    pub fn save_config(&mut self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(256);
        for off in (0..256u64).step_by(4) {
            out.extend_from_slice(&self.cfg32(off)?.to_le_bytes());
        }
        Ok(out)
    }

    /// Writes a saved configuration space back: the BARs, then the rest (the device keeps its
    /// read-only fields), then the command register, so decoding turns on with the BARs placed.
    pub fn restore_config(&mut self, saved: &[u8]) -> Result<()> {
        if saved.len() != 256 {
            return Err(Error::Device("saved config space is not 256 bytes".into()));
        }
        let dword = |off: usize| -> [u8; 4] {
            let mut b = [0u8; 4];
            b.copy_from_slice(&saved[off..off + 4]);
            b
        };
        let order = (0x10..0x28)
            .step_by(4)
            .chain((0x28..0x100).step_by(4))
            .chain([0x04]);
        for off in order {
            self.link
                .region_write(REGION_CONFIG, off as u64, &dword(off))?;
        }
        self.refresh_bars()
    }

    /// MMIO read; false if `addr` is not in a BAR.
    pub fn mmio_read(&mut self, addr: u64, data: &mut [u8]) -> bool {
        let Some((region, off)) = self.decode(addr) else {
            return false;
        };
        let r = self.link.region_read(region, off, data);
        if r.is_err() {
            data.fill(0xff);
        }
        self.note(r);
        true
    }

    /// MMIO write; false if `addr` is not in a BAR.
    pub fn mmio_write(&mut self, addr: u64, data: &[u8]) -> bool {
        let Some((region, off)) = self.decode(addr) else {
            return false;
        };
        let r = self.link.region_write(region, off, data);
        self.note(r);
        true
    }
}

impl PciDevice for GpuPci {
    fn config_read(&mut self, offset: u16) -> u32 {
        match self.cfg32(u64::from(offset)) {
            Ok(v) => v,
            Err(e) => {
                self.note(Err(e));
                u32::MAX
            }
        }
    }

    fn config_write(&mut self, offset: u16, value: u32) {
        let r = self
            .link
            .region_write(REGION_CONFIG, u64::from(offset), &value.to_le_bytes());
        self.note(r);
        if offset == 0x04 || (0x10..0x28).contains(&offset) {
            let r = self.refresh_bars();
            self.note(r);
        }
    }

    fn bar_read(&mut self, _bar: u8, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn bar_write(&mut self, _bar: u8, _offset: u64, _data: &[u8]) {}
}
