//! The memory image a capture builds: GGTT, physical pages and PPGTT translation.

use std::collections::BTreeMap;

use super::consts::{ADDRESS_LIMIT, GGTT_ENTRIES, PAGE, PAGE_SIZE, PTE_ADDRESS_MASK, PTE_PRESENT};
use super::error::MemFault;
use crate::GgttOffset;

// ------------------------------------------------------------------------------------------------
// Memory image
// ------------------------------------------------------------------------------------------------

/// GGTT entries and physical pages, as a capture leaves them.
///
/// Physical pages that were never written read as zeros; GGTT offsets without a present entry and
/// PPGTT addresses without present page-table entries do not read at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryImage {
    pub(crate) ggtt: BTreeMap<u64, u64>,
    pub(crate) phys: BTreeMap<u64, Box<[u8]>>,
}

impl MemoryImage {
    /// An empty image.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The GGTT entry (PTE) with this index, if one was written.
    #[must_use]
    pub fn ggtt_entry(&self, index: u64) -> Option<u64> {
        self.ggtt.get(&index).copied()
    }

    /// All written GGTT entries, by index.
    pub fn ggtt_entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ggtt.iter().map(|(&i, &e)| (i, e))
    }

    /// Number of written GGTT entries.
    #[must_use]
    pub fn ggtt_entry_count(&self) -> usize {
        self.ggtt.len()
    }

    /// Set GGTT entry `index` (must be below [`GGTT_ENTRIES`]).
    ///
    /// # Errors
    /// [`MemFault::GgttOutOfRange`] when the index is beyond the table.
    pub fn set_ggtt_entry(&mut self, index: u64, pte: u64) -> std::result::Result<(), MemFault> {
        if index >= GGTT_ENTRIES {
            return Err(MemFault::GgttOutOfRange {
                addr: index.saturating_mul(PAGE_SIZE),
            });
        }
        self.ggtt.insert(index, pte);
        Ok(())
    }

    /// Remove GGTT entry `index`, returning it.
    pub fn clear_ggtt_entry(&mut self, index: u64) -> Option<u64> {
        self.ggtt.remove(&index)
    }

    /// All physical pages that were written, by page number (physical address / 4096).
    pub fn phys_pages(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        self.phys.iter().map(|(&n, p)| (n, &p[..]))
    }

    /// Number of physical pages held.
    #[must_use]
    pub fn page_count(&self) -> u64 {
        self.phys.len() as u64
    }

    /// The physical address a GGTT offset maps to.
    ///
    /// # Errors
    /// [`MemFault::GgttOutOfRange`] or [`MemFault::GgttUnmapped`].
    pub fn translate_ggtt(&self, addr: GgttOffset) -> std::result::Result<u64, MemFault> {
        let index = addr.0 / PAGE_SIZE;
        if index >= GGTT_ENTRIES {
            return Err(MemFault::GgttOutOfRange { addr: addr.0 });
        }
        match self.ggtt.get(&index) {
            Some(&pte) if pte & PTE_PRESENT != 0 => {
                Ok((pte & PTE_ADDRESS_MASK) | (addr.0 % PAGE_SIZE))
            }
            _ => Err(MemFault::GgttUnmapped { addr: addr.0 }),
        }
    }

    /// Read physical memory; pages never written read as zeros.
    ///
    /// # Errors
    /// [`MemFault::Overflow`] past the 48-bit address space.
    pub fn read_phys(&self, addr: u64, out: &mut [u8]) -> std::result::Result<(), MemFault> {
        check_range(addr, out.len() as u64)?;
        let mut done = 0usize;
        while done < out.len() {
            let a = addr + done as u64;
            let in_page = (a % PAGE_SIZE) as usize;
            let n = (PAGE - in_page).min(out.len() - done);
            let dst = &mut out[done..done + n];
            match self.phys.get(&(a / PAGE_SIZE)) {
                Some(page) => dst.copy_from_slice(&page[in_page..in_page + n]),
                None => dst.fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// Write physical memory, creating pages as needed, at most `max_pages` pages in all.
    ///
    /// # Errors
    /// [`MemFault::Overflow`] or [`MemFault::PageLimit`]; on error nothing is written.
    pub fn write_phys(
        &mut self,
        addr: u64,
        data: &[u8],
        max_pages: u64,
    ) -> std::result::Result<(), MemFault> {
        check_range(addr, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        let first = addr / PAGE_SIZE;
        let last = (addr + data.len() as u64 - 1) / PAGE_SIZE;
        let new_pages = (first..=last)
            .filter(|p| !self.phys.contains_key(p))
            .count() as u64;
        if self.page_count().saturating_add(new_pages) > max_pages {
            return Err(MemFault::PageLimit { limit: max_pages });
        }
        let mut done = 0usize;
        while done < data.len() {
            let a = addr + done as u64;
            let in_page = (a % PAGE_SIZE) as usize;
            let n = (PAGE - in_page).min(data.len() - done);
            let page = self
                .phys
                .entry(a / PAGE_SIZE)
                .or_insert_with(|| vec![0u8; PAGE].into_boxed_slice());
            page[in_page..in_page + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// Read through the GGTT.
    ///
    /// # Errors
    /// A [`MemFault`] for the first page that does not translate.
    pub fn read_ggtt(&self, addr: GgttOffset, out: &mut [u8]) -> std::result::Result<(), MemFault> {
        self.read_translated(addr.0, out, |a| self.translate_ggtt(GgttOffset(a)))
    }

    /// Reads `out.len()` bytes at `addr` of an address space `translate` maps page by page onto
    /// physical memory.
    fn read_translated(
        &self,
        addr: u64,
        out: &mut [u8],
        translate: impl Fn(u64) -> std::result::Result<u64, MemFault>,
    ) -> std::result::Result<(), MemFault> {
        check_range(addr, out.len() as u64)?;
        let mut done = 0usize;
        while done < out.len() {
            let a = addr + done as u64;
            let n = (PAGE - (a % PAGE_SIZE) as usize).min(out.len() - done);
            let pa = translate(a)?;
            self.read_phys(pa, &mut out[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `addr` of an address space `translate` maps onto physical memory; every
    /// page is translated before anything is written, so a fault changes nothing.
    fn write_translated(
        &mut self,
        addr: u64,
        data: &[u8],
        max_pages: u64,
        translate: impl Fn(&Self, u64) -> std::result::Result<u64, MemFault>,
    ) -> std::result::Result<(), MemFault> {
        check_range(addr, data.len() as u64)?;
        let mut chunks = Vec::new();
        let mut done = 0usize;
        while done < data.len() {
            let a = addr + done as u64;
            let n = (PAGE - (a % PAGE_SIZE) as usize).min(data.len() - done);
            chunks.push((translate(self, a)?, done, n));
            done += n;
        }
        for (pa, from, n) in chunks {
            self.write_phys(pa, &data[from..from + n], max_pages)?;
        }
        Ok(())
    }

    /// Write through the GGTT; every page must already be mapped.
    ///
    /// # Errors
    /// A [`MemFault`]; translation is checked for every page before anything is written.
    pub fn write_ggtt(
        &mut self,
        addr: GgttOffset,
        data: &[u8],
        max_pages: u64,
    ) -> std::result::Result<(), MemFault> {
        self.write_translated(addr.0, data, max_pages, |m, a| {
            m.translate_ggtt(GgttOffset(a))
        })
    }

    /// The physical address a PPGTT address maps to under the 4-level tables rooted at `pml4`.
    ///
    /// # Errors
    /// [`MemFault::PpgttUnmapped`] or [`MemFault::Overflow`].
    pub fn translate_ppgtt(&self, pml4: u64, addr: u64) -> std::result::Result<u64, MemFault> {
        check_range(addr, 1)?;
        let mut table = pml4 & PTE_ADDRESS_MASK;
        for level in (1u8..=4).rev() {
            let shift = 12 + 9 * u32::from(level - 1);
            let index = (addr >> shift) & 0x1ff;
            let mut entry = [0u8; 8];
            self.read_phys(table + index * 8, &mut entry)?;
            let entry = u64::from_le_bytes(entry);
            if entry & PTE_PRESENT == 0 {
                return Err(MemFault::PpgttUnmapped { addr, level });
            }
            table = entry & PTE_ADDRESS_MASK;
        }
        Ok(table | (addr % PAGE_SIZE))
    }

    /// Read through the PPGTT rooted at `pml4`.
    ///
    /// # Errors
    /// A [`MemFault`] for the first page that does not translate.
    pub fn read_ppgtt(
        &self,
        pml4: u64,
        addr: u64,
        out: &mut [u8],
    ) -> std::result::Result<(), MemFault> {
        self.read_translated(addr, out, |a| self.translate_ppgtt(pml4, a))
    }

    /// Write through the PPGTT rooted at `pml4`; every page must already be mapped.
    ///
    /// # Errors
    /// A [`MemFault`]; translation is checked for every page before anything is written.
    pub fn write_ppgtt(
        &mut self,
        pml4: u64,
        addr: u64,
        data: &[u8],
        max_pages: u64,
    ) -> std::result::Result<(), MemFault> {
        self.write_translated(addr, data, max_pages, |m, a| m.translate_ppgtt(pml4, a))
    }

    /// Read little-endian dwords through the GGTT.
    ///
    /// # Errors
    /// As [`MemoryImage::read_ggtt`].
    pub fn read_ggtt_dwords(
        &self,
        addr: GgttOffset,
        count: usize,
    ) -> std::result::Result<Vec<u32>, MemFault> {
        let len = count.checked_mul(4).ok_or(MemFault::Overflow {
            addr: addr.0,
            len: u64::MAX,
        })?;
        check_range(addr.0, len as u64)?;
        let mut bytes = vec![0u8; len];
        self.read_ggtt(addr, &mut bytes)?;
        Ok(dwords_of(&bytes))
    }
}

pub(crate) fn check_range(addr: u64, len: u64) -> std::result::Result<(), MemFault> {
    match addr.checked_add(len) {
        Some(end) if end <= ADDRESS_LIMIT => Ok(()),
        _ => Err(MemFault::Overflow { addr, len }),
    }
}

/// Little-endian dwords of a byte slice (a trailing partial dword is dropped).
#[must_use]
pub fn dwords_of(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Little-endian bytes of dwords.
#[must_use]
pub fn bytes_of(dwords: &[u32]) -> Vec<u8> {
    dwords.iter().flat_map(|d| d.to_le_bytes()).collect()
}
