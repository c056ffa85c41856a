//! The device's writes into guest RAM, refused where the VMM mapped the RAM read-only.
//!
//! A VMM may give the device a range it may only read (a vfio-user DMA_MAP without the write
//! flag: QEMU does so for ROM and read-only memory sections). The server maps such a range
//! `PROT_READ`, and every write the vGPU makes into guest RAM — an engine's store, a context
//! switch event, a CPU write through the aperture — asks [`device_writable`] first and is refused
//! (`GttError::ReadOnly`, nothing written) as an IOMMU refuses a write through a read-only
//! mapping, instead of faulting the whole process on the protected page.

pub use gmig_dirty::memory::device_writable;
