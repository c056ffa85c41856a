//! The device's writes into guest RAM, refused where the VMM mapped the RAM read-only.
//!
//! A VMM may give the device a range it may only read (a vfio-user DMA_MAP without the write
//! flag: QEMU does so for ROM and read-only memory sections). The server maps such a range
//! `PROT_READ`, and every write the vGPU makes into guest RAM — an engine's store, a context
//! switch event, a CPU write through the aperture — asks [`device_writable`] first and is refused
//! (`GttError::ReadOnly`, nothing written) as an IOMMU refuses a write through a read-only
//! mapping, instead of faulting the whole process on the protected page.

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Whether the device may write guest RAM at `gpa..gpa + len`: every region the range touches
/// is mapped writable. A range RAM does not back answers `true` (the write itself then fails
/// with `GttError::NoRam`).
pub fn device_writable(mem: &GuestMemoryMmap, gpa: GuestAddress, len: usize) -> bool {
    let Some(end) = gpa.0.checked_add(len as u64) else {
        return true;
    };
    let mut at = gpa.0;
    while at < end {
        let Some(r) = mem.find_region(GuestAddress(at)) else {
            return true;
        };
        if r.prot() & libc::PROT_WRITE == 0 {
            return false;
        }
        at = r.start_addr().0.saturating_add(r.len());
    }
    true
}
