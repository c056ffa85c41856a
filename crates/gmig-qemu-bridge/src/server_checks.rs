//! Checks the server ([`crate::server`]) makes before its device sees a request: SET_IRQS as
//! `linux/vfio.h` defines it, and whether the memory a DMA_MAP or DMA_UNMAP leaves is the memory
//! already mapped.

use vfio_bindings::bindings::vfio as uapi;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

use crate::proto::Errno;

/// Checks a SET_IRQS request (`linux/vfio.h` rules: one data type, one action, vectors within the
/// `total` the index has — except `start` = `count` = 0 with DATA_NONE, which acts on them all —
/// and, for DATA_EVENTFD, a descriptor per vector or none at all, which de-assigns them). Returns
/// the `count` booleans of a DATA_BOOL request.
pub(crate) fn irq_set_data(
    flags: u32,
    (start, count, total): (u32, u32, u32),
    data: &[u8],
    fds: usize,
) -> Result<Option<&[u8]>, Errno> {
    use uapi::{
        VFIO_IRQ_SET_ACTION_TYPE_MASK as ACTIONS, VFIO_IRQ_SET_DATA_BOOL as BOOL,
        VFIO_IRQ_SET_DATA_EVENTFD as EVENTFD, VFIO_IRQ_SET_DATA_NONE as NONE,
        VFIO_IRQ_SET_DATA_TYPE_MASK as TYPES,
    };
    let one = |m: u32| (flags & m).count_ones() == 1;
    if !one(TYPES) || !one(ACTIONS) || flags & !(TYPES | ACTIONS) != 0 {
        return Err(libc::EINVAL);
    }
    let all = start == 0 && count == 0 && flags & NONE != 0;
    if !all && start.checked_add(count).is_none_or(|e| e > total) {
        return Err(libc::EINVAL);
    }
    let eventfd = flags & EVENTFD != 0;
    // Descriptors only with DATA_EVENTFD: one per vector, or none at all.
    if fds != 0 && (!eventfd || fds != count as usize) {
        return Err(libc::EINVAL);
    }
    if flags & BOOL == 0 {
        return Ok(None);
    }
    data.get(..count as usize).map(Some).ok_or(libc::EINVAL)
}

/// One descriptor-backed DMA region as the server maps it.
pub(crate) struct Section {
    pub(crate) at: GuestAddress,
    pub(crate) size: usize,
    pub(crate) file: FileOffset,
    /// Mapped `PROT_READ | PROT_WRITE` when the client allowed writes, else `PROT_READ`: the
    /// vGPU refuses its own writes there (`gmig_vgpu::ram`), and any it missed would fault
    /// rather than write.
    pub(crate) writable: bool,
}

/// Whether `mem` is exactly the descriptor-backed `sections` (same addresses, sizes, files,
/// offsets and protection), so nothing needs remapping.
pub(crate) fn same_memory(mem: Option<&GuestMemoryMmap>, sections: &[Section]) -> bool {
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    let Some(mem) = mem else {
        return sections.is_empty();
    };
    mem.num_regions() == sections.len()
        && mem.iter().zip(sections).all(|(r, s)| {
            let same_file = r.file_offset().is_some_and(|a| {
                std::sync::Arc::ptr_eq(a.arc(), s.file.arc()) && a.start() == s.file.start()
            });
            let writable = r.prot() & libc::PROT_WRITE != 0;
            r.start_addr() == s.at
                && r.len() == s.size as u64
                && same_file
                && writable == s.writable
        })
}
