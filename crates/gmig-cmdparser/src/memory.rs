//! Memory the caller owns: GGTT and PPGTT translation are the caller's; the walker only asks for
//! bytes at (space, address).

use std::collections::BTreeMap;

use thiserror::Error;

use crate::addr::{AddressSpace, GTT_PAGE_SIZE};

/// Why memory could not be read or written.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum MemoryError {
    /// Nothing is mapped at the address.
    #[error("{space} 0x{addr:x} is not mapped")]
    Unmapped {
        /// Address space.
        space: AddressSpace,
        /// First unmapped byte.
        addr: u64,
    },
    /// The access would wrap the 64-bit address space.
    #[error("{space} access at 0x{addr:x} of {len} bytes overflows")]
    Overflow {
        /// Address space.
        space: AddressSpace,
        /// Start of the access.
        addr: u64,
        /// Length of the access.
        len: usize,
    },
    /// The address is mapped but may not be accessed (the caller's policy).
    #[error("{space} 0x{addr:x} may not be accessed")]
    Denied {
        /// Address space.
        space: AddressSpace,
        /// The address.
        addr: u64,
    },
}

/// Read access to graphics memory through the GGTT or a PPGTT.
pub trait GpuMemory {
    /// Fills `out` with the bytes at `addr` in `space`.
    fn read(&self, space: AddressSpace, addr: u64, out: &mut [u8]) -> Result<(), MemoryError>;

    /// Reads little-endian dwords (a default over [`read`](Self::read), which reads straight
    /// into `out`). On error `out` holds whatever was read before it.
    fn read_dwords(
        &self,
        space: AddressSpace,
        addr: u64,
        out: &mut [u32],
    ) -> Result<(), MemoryError> {
        read_dwords_via_bytes(self, space, addr, out)
    }
}

/// [`GpuMemory::read_dwords`]'s default: `out` read as bytes through `mem.read`, then each dword
/// taken as little-endian (nothing to do on a little-endian host). No copy and no allocation:
/// the walker reads whole pages through it.
fn read_dwords_via_bytes<M: GpuMemory + ?Sized>(
    mem: &M,
    space: AddressSpace,
    addr: u64,
    out: &mut [u32],
) -> Result<(), MemoryError> {
    let n = out.len().checked_mul(4).ok_or(MemoryError::Overflow {
        space,
        addr,
        len: usize::MAX,
    })?;
    // SAFETY: the `n` bytes (no overflow: checked above) starting at `out`'s pointer are exactly
    // `out`'s memory, valid and initialised; `u8` has alignment 1 and every bit pattern is a
    // valid `u8` (and, written back, a valid `u32`); `bytes` reborrows `out` mutably and is
    // dropped before `out` is used again, so nothing aliases it.
    let bytes = unsafe { core::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), n) };
    mem.read(space, addr, bytes)?;
    for d in out.iter_mut() {
        *d = u32::from_le(*d);
    }
    Ok(())
}

/// Write access as well.
pub trait GpuMemoryMut: GpuMemory {
    /// Writes `data` at `addr` in `space`.
    fn write(&mut self, space: AddressSpace, addr: u64, data: &[u8]) -> Result<(), MemoryError>;
}

impl<M: GpuMemory + ?Sized> GpuMemory for &M {
    fn read(&self, space: AddressSpace, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        (**self).read(space, addr, out)
    }

    fn read_dwords(
        &self,
        space: AddressSpace,
        addr: u64,
        out: &mut [u32],
    ) -> Result<(), MemoryError> {
        (**self).read_dwords(space, addr, out)
    }
}

impl<M: GpuMemory + ?Sized> GpuMemory for &mut M {
    fn read(&self, space: AddressSpace, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        (**self).read(space, addr, out)
    }

    fn read_dwords(
        &self,
        space: AddressSpace,
        addr: u64,
        out: &mut [u32],
    ) -> Result<(), MemoryError> {
        (**self).read_dwords(space, addr, out)
    }
}

impl<M: GpuMemoryMut + ?Sized> GpuMemoryMut for &mut M {
    fn write(&mut self, space: AddressSpace, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        (**self).write(space, addr, data)
    }
}

/// A sparse, page-granular memory for tests, tools and fixtures: pages exist once written (or
/// mapped); reads of unmapped pages fail.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageMemory {
    pages: BTreeMap<(bool, u64), Box<[u8]>>,
    /// Upper bound on mapped pages (a guard against hostile inputs that map huge ranges).
    pub max_pages: usize,
}

impl PageMemory {
    /// An empty memory allowing up to 1 Mi pages (4 GiB).
    pub fn new() -> Self {
        PageMemory {
            pages: BTreeMap::new(),
            max_pages: 1 << 20,
        }
    }

    fn key(space: AddressSpace, page: u64) -> (bool, u64) {
        (space == AddressSpace::Ppgtt, page)
    }

    /// Number of mapped pages.
    pub fn page_count(&self) -> usize {
        self.pages.len()
    }

    /// Maps zeroed pages covering `[addr, addr + len)`.
    pub fn map(&mut self, space: AddressSpace, addr: u64, len: u64) -> Result<(), MemoryError> {
        if len == 0 {
            return Ok(());
        }
        let end = addr.checked_add(len).ok_or(MemoryError::Overflow {
            space,
            addr,
            len: usize::try_from(len).unwrap_or(usize::MAX),
        })?;
        let mut page = addr / GTT_PAGE_SIZE;
        let last = (end - 1) / GTT_PAGE_SIZE;
        while page <= last {
            if !self.pages.contains_key(&Self::key(space, page)) {
                if self.pages.len() >= self.max_pages {
                    return Err(MemoryError::Denied {
                        space,
                        addr: page.saturating_mul(GTT_PAGE_SIZE),
                    });
                }
                self.pages.insert(
                    Self::key(space, page),
                    vec![0u8; GTT_PAGE_SIZE as usize].into(),
                );
            }
            page += 1;
        }
        Ok(())
    }

    /// Maps and writes little-endian dwords at `addr`.
    pub fn put_dwords(
        &mut self,
        space: AddressSpace,
        addr: u64,
        dwords: &[u32],
    ) -> Result<(), MemoryError> {
        let bytes: Vec<u8> = dwords.iter().flat_map(|d| d.to_le_bytes()).collect();
        self.map(space, addr, bytes.len() as u64)?;
        self.write(space, addr, &bytes)
    }

    fn access(
        &self,
        space: AddressSpace,
        addr: u64,
        len: usize,
        mut f: impl FnMut(&[u8], usize, usize, usize),
    ) -> Result<(), MemoryError> {
        let end = addr
            .checked_add(len as u64)
            .ok_or(MemoryError::Overflow { space, addr, len })?;
        let mut at = addr;
        let mut done = 0usize;
        while at < end {
            let page = at / GTT_PAGE_SIZE;
            let off = (at % GTT_PAGE_SIZE) as usize;
            let n = ((GTT_PAGE_SIZE as usize) - off).min((end - at) as usize);
            let p = self
                .pages
                .get(&Self::key(space, page))
                .ok_or(MemoryError::Unmapped { space, addr: at })?;
            f(p, off, done, n);
            done += n;
            at += n as u64;
        }
        Ok(())
    }
}

impl GpuMemory for PageMemory {
    fn read(&self, space: AddressSpace, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        let len = out.len();
        self.access(space, addr, len, |p, off, done, n| {
            if let (Some(dst), Some(src)) = (out.get_mut(done..done + n), p.get(off..off + n)) {
                dst.copy_from_slice(src);
            }
        })
    }
}

impl GpuMemoryMut for PageMemory {
    fn write(&mut self, space: AddressSpace, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let off = (addr % GTT_PAGE_SIZE) as usize;
        if !data.is_empty() && off + data.len() <= GTT_PAGE_SIZE as usize {
            // Within one page (a remap's dword edits): one lookup.
            let p = self
                .pages
                .get_mut(&Self::key(space, addr / GTT_PAGE_SIZE))
                .ok_or(MemoryError::Unmapped { space, addr })?;
            if let Some(dst) = p.get_mut(off..off + data.len()) {
                dst.copy_from_slice(data);
            }
            return Ok(());
        }
        // Check every page first so that a failing write changes nothing.
        self.access(space, addr, data.len(), |_, _, _, _| {})?;
        let mut at = addr;
        let mut rest = data;
        while !rest.is_empty() {
            let page = at / GTT_PAGE_SIZE;
            let off = (at % GTT_PAGE_SIZE) as usize;
            let n = ((GTT_PAGE_SIZE as usize) - off).min(rest.len());
            if let Some(p) = self.pages.get_mut(&Self::key(space, page)) {
                if let (Some(dst), Some(src)) = (p.get_mut(off..off + n), rest.get(..n)) {
                    dst.copy_from_slice(src);
                }
            }
            rest = rest.get(n..).unwrap_or(&[]);
            at += n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_memory_reads_back_across_pages_and_refuses_unmapped() {
        let mut m = PageMemory::new();
        m.put_dwords(AddressSpace::Ggtt, 0xffc, &[1, 2, 3]).unwrap();
        let mut out = [0u32; 3];
        m.read_dwords(AddressSpace::Ggtt, 0xffc, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        let mut b = [0u8; 4];
        assert_eq!(
            m.read(AddressSpace::Ppgtt, 0xffc, &mut b),
            Err(MemoryError::Unmapped {
                space: AddressSpace::Ppgtt,
                addr: 0xffc
            })
        );
        assert!(m.read(AddressSpace::Ggtt, 0x2000, &mut b).is_err());
        assert!(m.write(AddressSpace::Ggtt, 0x1ffe, &[9; 4]).is_err());
        m.read(AddressSpace::Ggtt, 0x1ffc, &mut b).unwrap();
        assert_eq!(b, [0; 4], "a failing write changes nothing");
    }
}
