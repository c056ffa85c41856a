//! DMA map bookkeeping: DMA_MAP and DMA_UNMAP, and the client's memory remapped into `vm-memory`
//! when its descriptor-backed part changes.

use std::fs::File;

use vm_memory::mmap::{GuestRegionMmap, MmapRegionBuilder};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

use super::device::UserDevice;
use super::state::{DmaRegion, Server};
use super::MAX_DMA_REGIONS;
use crate::proto::{DmaMap, DmaUnmap, Errno};
use crate::server_checks::{same_memory, Section};

/// `VFIO_DMA_UNMAP_FLAG_ALL`: DMA_UNMAP of every region.
const UNMAP_ALL: u32 = 1 << 1;
/// DMA_MAP flags: the device may read the region, write it.
pub const DMA_READ: u32 = 1 << 0;
/// See [`DMA_READ`].
pub const DMA_WRITE: u32 = 1 << 1;

impl<D: UserDevice> Server<D> {
    pub(super) fn dma_map(&mut self, p: &[u8], mut fds: Vec<File>) -> Result<Vec<u8>, Errno> {
        let m = DmaMap::parse(p).map_err(|_| libc::EINVAL)?;
        if m.argsz as usize != DmaMap::LEN || m.size == 0 || m.size % 4096 != 0 {
            return Err(libc::EINVAL);
        }
        let end = m.address.checked_add(m.size).ok_or(libc::EINVAL)?;
        if m.address % 4096 != 0 {
            return Err(libc::EINVAL);
        }
        // Readable, and writable or not (QEMU maps ROM and read-only sections without the
        // write flag); anything else is not a mapping the device can use.
        if m.flags & DMA_READ == 0 || m.flags & !(DMA_READ | DMA_WRITE) != 0 {
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
            writable: m.flags & DMA_WRITE != 0,
        });
        self.remap().inspect_err(|_| {
            self.dma.pop();
        })?;
        Ok(Vec::new())
    }

    pub(super) fn dma_unmap(&mut self, p: &[u8]) -> Result<Vec<u8>, Errno> {
        let u = DmaUnmap::parse(p).map_err(|_| libc::EINVAL)?;
        match u.flags {
            0 => {}
            // Every region at once (QEMU's client sends it when it tears the device's memory
            // down); address and size must then be 0.
            UNMAP_ALL if u.address == 0 && u.size == 0 => {
                self.dma.clear();
                self.remap()?;
                return Ok(u.to_bytes());
            }
            UNMAP_ALL => return Err(libc::EINVAL),
            _ => return Err(libc::ENOTSUP),
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
                    local.push(Section {
                        at: GuestAddress(r.address),
                        size,
                        file: f.clone(),
                        writable: r.writable,
                    });
                }
                None if r.remote => remote.push((r.address, r.size)),
                None => {}
            }
        }
        // The device hears of its memory only when the descriptor-backed part changed (a map
        // or unmap without a descriptor leaves it as it was).
        if !same_memory(self.mem.as_ref(), &local) {
            tracing::debug!(
                sections = ?local.iter().map(|s| (s.at.0, s.size, s.writable)).collect::<Vec<_>>(),
                "guest memory shared by descriptor changed"
            );
            self.mem = if local.is_empty() {
                None
            } else {
                Some(map_sections(&local)?)
            };
            self.device.dma_changed(self.mem.as_ref());
        }
        self.device.remote_dma_changed(&remote);
        Ok(())
    }
}

fn map_sections(sections: &[Section]) -> Result<GuestMemoryMmap, Errno> {
    let regions = sections
        .iter()
        .map(|s| {
            let prot = if s.writable {
                libc::PROT_READ | libc::PROT_WRITE
            } else {
                libc::PROT_READ
            };
            let m = MmapRegionBuilder::new(s.size)
                .with_file_offset(s.file.clone())
                .with_mmap_prot(prot)
                .with_mmap_flags(libc::MAP_SHARED | libc::MAP_NORESERVE)
                .build()
                .map_err(|_| libc::EINVAL)?;
            GuestRegionMmap::new(m, s.at).ok_or(libc::EINVAL)
        })
        .collect::<Result<Vec<_>, Errno>>()?;
    GuestMemoryMmap::from_regions(regions).map_err(|_| libc::EINVAL)
}
