//! Graphics translation: the vGPU's GGTT (shadowed from guest frames to host memory), the 4-level
//! PPGTT walk (with GEN9's 64 KiB, 2 MiB and 1 GiB pages), and GPU-side memory access through either.
//!
//! The guest writes GGTT entries at *guest-view* offsets (inside the slices the PV info page told it
//! about). The vGPU stores each entry at the same position inside its slice, so the table serves both
//! views: the guest reads its entries back at its old offsets, and the engine reaches the same page
//! at the *host* offset (the slice the partition manager gave this vGPU on this host). Entries are
//! GEN8 PTEs: bit 0 present, bits 47:12 the guest-physical frame.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use gmig_cmdparser::{GgttOffset, VgpuSlices};

use crate::gm::{Gfn, PAGE_SIZE};
use crate::mmio::{GTT_PTE_PRESENT, PTE_ADDR_MASK};
/// The address space a GPU access goes through (the parser's).
pub use gmig_cmdparser::AddressSpace as Space;

/// Guest RAM as a `vm-memory` mmap, shareable with a KVM VMM.
pub type GuestRam = GuestMemoryMmap<()>;

/// A failed GPU memory access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GttError {
    /// The GGTT offset lies outside the vGPU's slices.
    #[error("GGTT offset {0:#x} is outside this vGPU's slices")]
    OutOfSlice(u64),
    /// The GGTT entry for the page is not present.
    #[error("GGTT entry for {0:#x} is not present")]
    GgttNotPresent(u64),
    /// A PPGTT level had no present entry.
    #[error("PPGTT address {addr:#x} not mapped (level {level})")]
    PpgttNotPresent {
        /// Faulting address.
        addr: u64,
        /// 4 = PML4 ... 1 = PT.
        level: u8,
    },
    /// No PPGTT root is set for this access.
    #[error("PPGTT access to {0:#x} without a PPGTT root")]
    NoPpgtt(u64),
    /// Guest RAM has no page at this guest-physical address.
    #[error("guest-physical address {0:#x} is not backed by guest RAM")]
    NoRam(u64),
    /// The VMM mapped guest RAM here read-only to the device: a device write is refused.
    #[error("guest RAM at {0:#x} is mapped read-only to the device: write refused")]
    ReadOnly(u64),
}

/// Result type of this module.
pub type Result<T> = std::result::Result<T, GttError>;

/// The vGPU's GGTT entries, one table per slice, indexed by page within the slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ggtt {
    pub(crate) aperture: Vec<u64>,
    pub(crate) hidden: Vec<u64>,
}

/// Sparse serialized form of a [`Ggtt`]: present entries only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GgttState {
    /// Pages in the aperture slice.
    pub aperture_pages: u32,
    /// Pages in the hidden slice.
    pub hidden_pages: u32,
    /// `(page within the aperture slice, entry)`.
    pub aperture: Vec<(u32, u64)>,
    /// `(page within the hidden slice, entry)`.
    pub hidden: Vec<(u32, u64)>,
}

/// The GGTT slots written since logging started, each once (a migration sends the GGTT during
/// pre-copy and, at the stop, only these). Slots number the aperture's pages first, then the
/// hidden slice's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GgttLog {
    seen: Vec<u64>,
    slots: Vec<u32>,
}

impl GgttLog {
    /// An empty log for `table`'s slots (O(GTT size) bits, allocated now, not in downtime).
    pub fn new(table: &Ggtt) -> GgttLog {
        let slots = table.aperture.len() + table.hidden.len();
        GgttLog {
            seen: vec![0; slots.div_ceil(64)],
            slots: Vec::new(),
        }
    }

    fn mark(&mut self, slot: u32) {
        let (word, bit) = (slot as usize / 64, slot % 64);
        if let Some(w) = self.seen.get_mut(word) {
            if *w & (1 << bit) == 0 {
                *w |= 1 << bit;
                self.slots.push(slot);
            }
        }
    }

    /// Slots written so far.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no slot was written.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

impl Ggtt {
    /// An empty table for slices of these sizes.
    pub fn new(slices: &VgpuSlices) -> Ggtt {
        Ggtt {
            aperture: vec![0; (slices.aperture.size / PAGE_SIZE) as usize],
            hidden: vec![0; (slices.hidden.size / PAGE_SIZE) as usize],
        }
    }

    fn slot(&self, slices: &VgpuSlices, off: GgttOffset) -> Option<(bool, usize)> {
        if slices.aperture.contains(off.0, 1) {
            let i = off.0.checked_sub(slices.aperture.base.0)? / PAGE_SIZE;
            return Some((false, usize::try_from(i).ok()?));
        }
        if slices.hidden.contains(off.0, 1) {
            let i = off.0.checked_sub(slices.hidden.base.0)? / PAGE_SIZE;
            return Some((true, usize::try_from(i).ok()?));
        }
        None
    }

    /// The entry mapping GGTT offset `off` when the slices sit at `slices`.
    pub fn entry(&self, slices: &VgpuSlices, off: GgttOffset) -> Option<u64> {
        let (hidden, i) = self.slot(slices, off)?;
        if hidden {
            self.hidden.get(i).copied()
        } else {
            self.aperture.get(i).copied()
        }
    }

    /// [`Ggtt::set_entry`], recording the slot in `log`.
    pub fn set_entry_logged(
        &mut self,
        slices: &VgpuSlices,
        off: GgttOffset,
        pte: u64,
        log: Option<&mut GgttLog>,
    ) -> bool {
        let Some((hidden, i)) = self.slot(slices, off) else {
            return false;
        };
        let slot = if hidden { self.aperture.len() + i } else { i };
        let table = if hidden {
            &mut self.hidden
        } else {
            &mut self.aperture
        };
        let Some(e) = table.get_mut(i) else {
            return false;
        };
        *e = pte;
        if let (Some(log), Ok(slot)) = (log, u32::try_from(slot)) {
            log.mark(slot);
        }
        true
    }

    /// The entries of the slots `log` recorded, as they are now (cleared ones as 0): what a
    /// restore applies over the table it loaded from an earlier [`Ggtt::save`]. O(slots logged).
    pub fn changes(&self, log: &GgttLog) -> GgttState {
        let mut out = GgttState {
            aperture_pages: self.aperture.len() as u32,
            hidden_pages: self.hidden.len() as u32,
            aperture: Vec::new(),
            hidden: Vec::new(),
        };
        for &slot in &log.slots {
            let s = slot as usize;
            if let Some(e) = self.aperture.get(s) {
                out.aperture.push((slot, *e));
            } else if let Some(h) = s.checked_sub(self.aperture.len()) {
                if let Some(e) = self.hidden.get(h) {
                    out.hidden.push((h as u32, *e));
                }
            }
        }
        out
    }

    /// Sets the entry for `off`; `false` when `off` is outside `slices`.
    pub fn set_entry(&mut self, slices: &VgpuSlices, off: GgttOffset, pte: u64) -> bool {
        self.set_entry_logged(slices, off, pte, None)
    }

    /// Translates a GGTT offset to guest-physical memory.
    pub fn translate(&self, slices: &VgpuSlices, off: GgttOffset) -> Result<GuestAddress> {
        let pte = self.entry(slices, off).ok_or(GttError::OutOfSlice(off.0))?;
        if pte & GTT_PTE_PRESENT == 0 {
            return Err(GttError::GgttNotPresent(off.0));
        }
        Ok(GuestAddress((pte & PTE_ADDR_MASK) | (off.0 % PAGE_SIZE)))
    }

    /// Every guest frame a present entry maps.
    pub fn mapped_frames(&self) -> impl Iterator<Item = Gfn> + '_ {
        self.aperture
            .iter()
            .chain(self.hidden.iter())
            .filter(|e| *e & GTT_PTE_PRESENT != 0)
            .map(|e| Gfn((e & PTE_ADDR_MASK) / PAGE_SIZE))
    }

    /// Sparse form for checkpoints.
    pub fn save(&self) -> GgttState {
        let sparse = |t: &[u64]| -> Vec<(u32, u64)> {
            t.iter()
                .enumerate()
                .filter(|(_, e)| **e != 0)
                .map(|(i, e)| (i as u32, *e))
                .collect()
        };
        GgttState {
            aperture_pages: self.aperture.len() as u32,
            hidden_pages: self.hidden.len() as u32,
            aperture: sparse(&self.aperture),
            hidden: sparse(&self.hidden),
        }
    }

    /// Rebuilds a table for slices of these sizes; `None` when the state does not fit them.
    pub fn load(slices: &VgpuSlices, state: &GgttState) -> Option<Ggtt> {
        Ggtt::load_onto(Ggtt::new(slices), state)
    }

    /// An empty table for `slices` whose memory is already written, so that filling it later
    /// touches no new page. A destination builds it while pre-copy runs: the table is O(GTT size)
    /// (5 MiB at 512+2048), and first-touching it in downtime cost up to 9 ms on a machine where
    /// page faults are dear.
    pub fn prefaulted(slices: &VgpuSlices) -> Ggtt {
        let filled = |n: u64| {
            let mut v = vec![0u64; usize::try_from(n).unwrap_or(0)];
            // `vec!` may hand out lazily zeroed pages (calloc): write one entry per page so each
            // page is really there now, and the writes cannot be elided.
            for e in v.iter_mut().step_by(PAGE_SIZE as usize / 8) {
                *std::hint::black_box(e) = 0;
            }
            v
        };
        Ggtt {
            aperture: filled(slices.aperture.size / PAGE_SIZE),
            hidden: filled(slices.hidden.size / PAGE_SIZE),
        }
    }

    /// Loads `state` into `empty`, an all-invalid table of the right size (from [`Ggtt::new`] or
    /// [`Ggtt::prefaulted`]): O(present entries).
    pub fn load_onto(empty: Ggtt, state: &GgttState) -> Option<Ggtt> {
        let mut g = empty;
        if g.aperture.len() != state.aperture_pages as usize
            || g.hidden.len() != state.hidden_pages as usize
        {
            return None;
        }
        for &(i, e) in &state.aperture {
            *g.aperture.get_mut(i as usize)? = e;
        }
        for &(i, e) in &state.hidden {
            *g.hidden.get_mut(i as usize)? = e;
        }
        Some(g)
    }
}

/// PDE and PDPE bit 7 (`GEN8_PDE_PS_2M`, `GEN8_PDPE_PS_1G`): the entry maps a 2 MiB (PDE) or
/// 1 GiB (PDPE) page instead of pointing at the next table.
const PPGTT_PS: u64 = 1 << 7;
/// PDE bit 11 (`GEN8_PDE_IPS_64K`): the page table it points at maps 64 KiB pages, through every
/// 16th entry (i915 still writes the 4 KiB entries between them; the GPU does not read them).
const PPGTT_IPS_64K: u64 = 1 << 11;
/// Entries per PPGTT table.
const PPGTT_ENTRIES: u64 = 512;

/// The page a present PPGTT entry at `level` maps directly (a leaf), as its size, or `None` when
/// the entry points at a table. `ips`: the entry sits in a page table whose PDE set 64 KiB mode.
fn ppgtt_leaf(level: u8, pte: u64, ips: bool) -> Option<u64> {
    match level {
        1 if ips => Some(64 << 10),
        1 => Some(PAGE_SIZE),
        2 | 3 if pte & PPGTT_PS != 0 => Some(1 << (12 + 9 * u32::from(level - 1))),
        _ => None,
    }
}

/// Walks a 4-level PPGTT rooted at `pml4` (guest-physical) in guest RAM, as GEN9 hardware does:
/// 1 GiB pages in the PDPT (PS), 2 MiB pages in page directories (PS), page tables of 64 KiB
/// pages (the PDE's IPS bit: every 16th entry maps 64 KiB) or of 4 KiB pages.
pub fn ppgtt_translate(mem: &GuestRam, pml4: u64, addr: u64) -> Result<GuestAddress> {
    let mut table = pml4 & PTE_ADDR_MASK;
    let mut ips = false;
    for level in (1..=4u8).rev() {
        let shift = 12 + 9 * (u32::from(level) - 1);
        let mut idx = (addr >> shift) & (PPGTT_ENTRIES - 1);
        if level == 1 && ips {
            idx &= !0xf;
        }
        let pte: u64 = mem
            .read_obj(GuestAddress(table + idx * 8))
            .map_err(|_| GttError::NoRam(table + idx * 8))?;
        if pte & 1 == 0 {
            return Err(GttError::PpgttNotPresent { addr, level });
        }
        if let Some(size) = ppgtt_leaf(level, pte, ips) {
            let base = pte & PTE_ADDR_MASK & !(size - 1);
            return Ok(GuestAddress(base | (addr & (size - 1))));
        }
        ips = level == 2 && pte & PPGTT_IPS_64K != 0;
        table = pte & PTE_ADDR_MASK;
    }
    // Level 1 always ends in a leaf.
    Err(GttError::PpgttNotPresent { addr, level: 1 })
}

/// Every page a PPGTT rooted at `pml4` uses: its table pages and the frames it maps (a large
/// page's frames up to the end of guest RAM). Each table and each large page is visited once,
/// so tables the guest shares between entries (or points back at) cost nothing more: the work
/// is bounded by the distinct table pages and guest RAM, whatever the guest writes.
pub fn ppgtt_frames(mem: &GuestRam, pml4: u64, out: &mut BTreeSet<Gfn>) {
    struct Walk<'a> {
        mem: &'a GuestRam,
        ram_frames: u64,
        tables: BTreeSet<(u64, u8, bool)>,
        leaves: BTreeSet<(u64, u64)>,
        out: &'a mut BTreeSet<Gfn>,
    }
    impl Walk<'_> {
        fn table(&mut self, table: u64, level: u8, ips: bool) {
            if !self.tables.insert((table, level, ips)) {
                return;
            }
            self.out.insert(Gfn(table / PAGE_SIZE));
            let mut buf = [0u8; PAGE_SIZE as usize];
            if self.mem.read_slice(&mut buf, GuestAddress(table)).is_err() {
                return;
            }
            let step = if level == 1 && ips { 16 } else { 1 };
            for chunk in buf.chunks_exact(8).step_by(step) {
                let mut b = [0u8; 8];
                b.copy_from_slice(chunk);
                let pte = u64::from_le_bytes(b);
                if pte & 1 == 0 {
                    continue;
                }
                match ppgtt_leaf(level, pte, ips) {
                    Some(size) => self.leaf(pte & PTE_ADDR_MASK & !(size - 1), size),
                    None => self.table(
                        pte & PTE_ADDR_MASK,
                        level - 1,
                        level == 2 && pte & PPGTT_IPS_64K != 0,
                    ),
                }
            }
        }

        fn leaf(&mut self, base: u64, size: u64) {
            if size == PAGE_SIZE {
                self.out.insert(Gfn(base / PAGE_SIZE));
                return;
            }
            if !self.leaves.insert((base, size)) {
                return;
            }
            let first = base / PAGE_SIZE;
            let end = (first + size / PAGE_SIZE).min(self.ram_frames);
            self.out.extend((first..end).map(Gfn));
        }
    }
    let mut w = Walk {
        mem,
        ram_frames: ram_size(mem) / PAGE_SIZE,
        tables: BTreeSet::new(),
        leaves: BTreeSet::new(),
        out,
    };
    w.table(pml4 & PTE_ADDR_MASK, 4, false);
}

/// GPU-side access to guest memory through the GGTT (at `slices`) or a PPGTT.
#[derive(Clone, Copy)]
pub struct GpuView<'a> {
    /// The GGTT.
    pub ggtt: &'a Ggtt,
    /// Where the GGTT slices sit for this view (host slices for the engine, guest view for the
    /// guest's own accesses).
    pub slices: VgpuSlices,
    /// Guest RAM.
    pub mem: &'a GuestRam,
    /// PPGTT root, if the context has one.
    pub pml4: Option<u64>,
}

impl GpuView<'_> {
    /// Translates one address.
    pub fn translate(&self, space: Space, addr: u64) -> Result<GuestAddress> {
        match space {
            Space::Ggtt => self.ggtt.translate(&self.slices, GgttOffset(addr)),
            Space::Ppgtt => {
                ppgtt_translate(self.mem, self.pml4.ok_or(GttError::NoPpgtt(addr))?, addr)
            }
        }
    }

    /// The guest-physical run starting at `addr`: its address and how many of `len` bytes are
    /// contiguous in guest RAM (pages mapped back to back are coalesced into one run).
    fn run_at(&self, space: Space, addr: u64, len: usize) -> Result<(GuestAddress, usize)> {
        let gpa = self.translate(space, addr)?;
        let mut n = ((PAGE_SIZE - addr % PAGE_SIZE) as usize).min(len);
        while n < len {
            let next = addr
                .checked_add(n as u64)
                .ok_or(GttError::OutOfSlice(addr))?;
            match self.translate(space, next) {
                Ok(g) if Some(g.0) == gpa.0.checked_add(n as u64) => {
                    n = (n + PAGE_SIZE as usize).min(len);
                }
                _ => break,
            }
        }
        Ok((gpa, n))
    }

    /// Adds every frame `reach` maps in this view (the GGTT's, and the PPGTT's when the view
    /// has one): where a command whose writes its state does not bound can write.
    pub fn reach_frames(&self, reach: gmig_cmdparser::Reach, out: &mut BTreeSet<Gfn>) {
        if reach.ggtt {
            out.extend(self.ggtt.mapped_frames());
        }
        if let (true, Some(root)) = (reach.ppgtt, self.pml4) {
            ppgtt_frames(self.mem, root, out);
        }
    }

    /// Reads `out.len()` bytes at `addr`.
    pub fn read(&self, space: Space, addr: u64, out: &mut [u8]) -> Result<()> {
        let mut done = 0usize;
        while done < out.len() {
            let a = addr
                .checked_add(done as u64)
                .ok_or(GttError::OutOfSlice(addr))?;
            let (gpa, n) = self.run_at(space, a, out.len() - done)?;
            self.mem
                .read_slice(&mut out[done..done + n], gpa)
                .map_err(|_| GttError::NoRam(gpa.0))?;
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `addr`; appends the guest frames written to `pages`.
    pub fn write(&self, space: Space, addr: u64, data: &[u8], pages: &mut Vec<Gfn>) -> Result<()> {
        let mut done = 0usize;
        while done < data.len() {
            let a = addr
                .checked_add(done as u64)
                .ok_or(GttError::OutOfSlice(addr))?;
            let (gpa, n) = self.run_at(space, a, data.len() - done)?;
            if !crate::ram::device_writable(self.mem, gpa, n) {
                return Err(GttError::ReadOnly(gpa.0));
            }
            self.mem
                .write_slice(&data[done..done + n], gpa)
                .map_err(|_| GttError::NoRam(gpa.0))?;
            let first = gpa.0 / PAGE_SIZE;
            let last = (gpa.0 + n as u64 - 1) / PAGE_SIZE;
            pages.extend((first..=last).map(Gfn));
            done += n;
        }
        Ok(())
    }

    /// Reads one little-endian dword.
    pub fn read_u32(&self, space: Space, addr: u64) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read(space, addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

/// Creates zeroed guest RAM of `size` bytes at guest-physical 0.
pub fn new_guest_ram(
    size: usize,
) -> std::result::Result<GuestRam, vm_memory::mmap::FromRangesError> {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size)])
}

/// A fresh guest RAM of the same layout holding a byte copy of `src` (what a migration's page
/// transfer ends with; tests use it directly).
pub fn copy_guest_ram(
    src: &GuestRam,
) -> std::result::Result<GuestRam, vm_memory::mmap::FromRangesError> {
    use vm_memory::GuestMemoryRegion;
    let ranges: Vec<(GuestAddress, usize)> = src
        .iter()
        .map(|r| (r.start_addr(), r.len() as usize))
        .collect();
    let dst = GuestMemoryMmap::from_ranges(&ranges)?;
    let mut buf = vec![0u8; 1 << 20];
    for &(start, len) in &ranges {
        let mut off = 0usize;
        while off < len {
            let n = (len - off).min(buf.len());
            let at = GuestAddress(start.0 + off as u64);
            // Both memories have exactly these ranges, so these accesses are in bounds.
            if src.read_slice(&mut buf[..n], at).is_ok() {
                let _ = dst.write_slice(&buf[..n], at);
            }
            off += n;
        }
    }
    Ok(dst)
}

/// Bytes of guest-physical address space that guest RAM spans (the end of its highest region):
/// frames are numbered by guest-physical address, and a VMM's map may have holes (QEMU's
/// 0xc0000-0x100000 while the firmware shadows it, PCI below 4 GiB) that change while it runs.
pub fn ram_size(mem: &GuestRam) -> u64 {
    use vm_memory::GuestMemoryRegion;
    mem.iter()
        .map(|r| r.start_addr().0 + r.len())
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gm::{slices_at, MIB};

    proptest::proptest! {
        /// Whatever the guest writes after the table was saved, the saved table with the logged
        /// changes applied is the table now, and the changes name each written slot once.
        #[test]
        fn saved_table_plus_logged_changes_is_the_table_now(
            before in proptest::collection::vec((0u64..24, 0u64..4), 0..24),
            after in proptest::collection::vec((0u64..24, 0u64..4), 0..24),
        ) {
            let s = slices_at(64 * MIB, 64 * KIB, 1024 * MIB, 64 * KIB);
            let off = |i: u64| {
                if i < 16 {
                    GgttOffset(64 * MIB + i * PAGE_SIZE)
                } else {
                    GgttOffset(1024 * MIB + (i - 16) * PAGE_SIZE)
                }
            };
            let pte = |v: u64| if v == 0 { 0 } else { (v << 12) | GTT_PTE_PRESENT };
            let mut g = Ggtt::new(&s);
            for &(i, v) in &before {
                g.set_entry(&s, off(i), pte(v));
            }
            let saved = g.save();
            let mut log = GgttLog::new(&g);
            for &(i, v) in &after {
                proptest::prop_assert!(g.set_entry_logged(&s, off(i), pte(v), Some(&mut log)));
            }
            let changes = g.changes(&log);
            let mut slots: Vec<u64> = after.iter().map(|(i, _)| *i).collect();
            slots.sort_unstable();
            slots.dedup();
            proptest::prop_assert_eq!(log.len(), slots.len());
            proptest::prop_assert_eq!(changes.aperture.len() + changes.hidden.len(), slots.len());
            let rebuilt = Ggtt::load_onto(Ggtt::load(&s, &saved).unwrap(), &changes).unwrap();
            proptest::prop_assert_eq!(rebuilt, g);
        }
    }

    const KIB: u64 = 1024;

    #[test]
    fn ggtt_same_entry_at_guest_and_host_offsets() {
        let guest = slices_at(64 * MIB, 64 * MIB, 1024 * MIB, 384 * MIB);
        let host = slices_at(256 * MIB, 64 * MIB, 2048 * MIB, 384 * MIB);
        let mut g = Ggtt::new(&guest);
        assert!(g.set_entry(&guest, GgttOffset(1024 * MIB + 8192), 0x5000 | 1));
        assert!(!g.set_entry(&guest, GgttOffset(0), 1));
        assert_eq!(
            g.translate(&host, GgttOffset(2048 * MIB + 8192 + 12))
                .unwrap(),
            GuestAddress(0x500c)
        );
        assert_eq!(
            g.translate(&guest, GgttOffset(1024 * MIB + 8192)).unwrap(),
            GuestAddress(0x5000)
        );
        assert_eq!(
            g.translate(&host, GgttOffset(1024 * MIB + 8192)),
            Err(GttError::OutOfSlice(1024 * MIB + 8192))
        );
        assert!(matches!(
            g.translate(&host, GgttOffset(2048 * MIB)),
            Err(GttError::GgttNotPresent(_))
        ));
        let s = g.save();
        assert_eq!(s.hidden, vec![(2, 0x5001)]);
        assert_eq!(Ggtt::load(&host, &s).unwrap(), g);
    }

    #[test]
    fn accesses_span_contiguous_and_scattered_pages() {
        let mem = new_guest_ram(1 << 20).unwrap();
        let s = slices_at(0, 64 * MIB, 64 * MIB, 384 * MIB);
        let mut g = Ggtt::new(&s);
        for (page, gpa) in [(0u64, 0x5000u64), (1, 0x6000), (2, 0x2000)] {
            assert!(g.set_entry(&s, GgttOffset(page * PAGE_SIZE), gpa | 1));
        }
        let view = GpuView {
            ggtt: &g,
            slices: s,
            mem: &mem,
            pml4: None,
        };
        let data: Vec<u8> = (0..3 * 4096 - 100).map(|i| (i % 199) as u8).collect();
        let mut pages = Vec::new();
        view.write(Space::Ggtt, 50, &data, &mut pages).unwrap();
        assert_eq!(pages, vec![Gfn(5), Gfn(6), Gfn(2)]);
        let mut back = vec![0u8; data.len()];
        view.read(Space::Ggtt, 50, &mut back).unwrap();
        assert_eq!(back, data);
        let mut raw = [0u8; 4];
        mem.read_slice(&mut raw, GuestAddress(0x2000)).unwrap();
        assert_eq!(raw, data[4096 * 2 - 50..4096 * 2 - 46]);
        assert!(matches!(
            view.read(Space::Ggtt, 3 * 4096 - 8, &mut [0u8; 16]),
            Err(GttError::GgttNotPresent(_))
        ));
    }

    #[test]
    fn ppgtt_four_levels() {
        let mem = new_guest_ram(1 << 20).unwrap();
        // PML4 at 0x1000, PDP 0x2000, PD 0x3000, PT 0x4000, page 0x9000.
        let va: u64 = (1 << 39) | (2 << 30) | (3 << 21) | (4 << 12);
        mem.write_obj(0x2001u64, GuestAddress(0x1000 + 8)).unwrap();
        mem.write_obj(0x3001u64, GuestAddress(0x2000 + 16)).unwrap();
        mem.write_obj(0x4001u64, GuestAddress(0x3000 + 24)).unwrap();
        mem.write_obj(0x9001u64, GuestAddress(0x4000 + 32)).unwrap();
        assert_eq!(
            ppgtt_translate(&mem, 0x1000, va + 5).unwrap(),
            GuestAddress(0x9005)
        );
        assert_eq!(
            ppgtt_translate(&mem, 0x1000, va + 4096),
            Err(GttError::PpgttNotPresent {
                addr: va + 4096,
                level: 1
            })
        );
        let mut set = BTreeSet::new();
        ppgtt_frames(&mem, 0x1000, &mut set);
        assert_eq!(
            set.into_iter().map(|g| g.0).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 9]
        );
    }

    /// PML4 at 0x1000, PDPT at 0x2000 (entry 0 a 1 GiB page at 0 when `gib`), PD at 0x3000 with
    /// entry 1 a 2 MiB page at 6 MiB and entry 2 a 64 KiB-mode page table at 0x4000.
    fn large_pages(gib: bool) -> GuestRam {
        let mem = new_guest_ram(16 << 20).unwrap();
        let put = |a: u64, v: u64| mem.write_obj(v, GuestAddress(a)).unwrap();
        put(0x1000, 0x2001);
        put(0x2000 + 8, 0x3001);
        if gib {
            put(0x2000, PPGTT_PS | 1);
        }
        put(0x3000 + 8, (6 << 20) | PPGTT_PS | 1);
        put(0x3000 + 16, 0x4000 | PPGTT_IPS_64K | 1);
        // 64 KiB pages at 8 MiB and 9 MiB through entries 0 and 16; the 4 KiB entries between
        // them hold what i915 writes there too, except entry 1, which must not be used.
        for i in 0..16u64 {
            put(0x4000 + 8 * i, ((8 << 20) + i * 4096) | 1);
            put(0x4000 + 8 * (16 + i), ((9 << 20) + i * 4096) | 1);
        }
        put(0x4000 + 8, 0xf000 | 1);
        mem
    }

    #[test]
    fn ppgtt_large_pages_map_as_gen9_does() {
        let mem = large_pages(true);
        let t = |va: u64| ppgtt_translate(&mem, 0x1000, va).map(|g| g.0);
        const G: u64 = 1 << 30;
        // 1 GiB page: identity over its first gigabyte.
        assert_eq!(t(0x12_3456), Ok(0x12_3456));
        // 2 MiB page at 6 MiB (PDE 1 of the second gigabyte).
        assert_eq!(t(G + (2 << 20) + 0x1_2345), Ok((6 << 20) + 0x1_2345));
        // 64 KiB pages: entry 0 for the first 64 KiB (entry 1 is not read), entry 16 next.
        assert_eq!(t(G + (4 << 20) + 0x1234), Ok((8 << 20) + 0x1234));
        assert_eq!(t(G + (4 << 20) + 0xf_ff8), Ok((8 << 20) + 0xf_ff8));
        assert_eq!(t(G + (4 << 20) + 0x1_0010), Ok((9 << 20) + 0x10));
        assert_eq!(
            t(G + (4 << 20) + 0x2_0000),
            Err(GttError::PpgttNotPresent {
                addr: G + (4 << 20) + 0x2_0000,
                level: 1
            })
        );
        let mut set = BTreeSet::new();
        ppgtt_frames(&mem, 0x1000, &mut set);
        // Tables 1..=4; the 1 GiB page clipped to RAM's 4096 frames (covers all of them).
        assert_eq!(set.len(), 4096);
        let mem = large_pages(false);
        let mut set = BTreeSet::new();
        ppgtt_frames(&mem, 0x1000, &mut set);
        let mut want: BTreeSet<Gfn> = [1, 2, 3, 4].into_iter().map(Gfn).collect();
        want.extend((6 * 256..8 * 256).map(Gfn)); // the 2 MiB page
        want.extend((8 * 256..8 * 256 + 16).map(Gfn)); // two 64 KiB pages
        want.extend((9 * 256..9 * 256 + 16).map(Gfn));
        assert_eq!(
            set, want,
            "entry 1 of the 64 KiB table (frame 0xf) is not reached"
        );
    }

    #[test]
    fn ppgtt_frames_visits_shared_tables_once() {
        // Every entry of every level points at the same next table, and the PML4 at itself:
        // 512^4 paths, four distinct tables.
        let mem = new_guest_ram(1 << 20).unwrap();
        for i in 0..512u64 {
            mem.write_obj(0x1001u64, GuestAddress(0x1000 + 8 * i))
                .unwrap();
            mem.write_obj(0x3001u64, GuestAddress(0x2000 + 8 * i))
                .unwrap();
            mem.write_obj(0x4001u64, GuestAddress(0x3000 + 8 * i))
                .unwrap();
            mem.write_obj(0x9001u64, GuestAddress(0x4000 + 8 * i))
                .unwrap();
        }
        mem.write_obj(0x2001u64, GuestAddress(0x1000)).unwrap();
        // (A walk that followed every path would not end: 512^4 of them.)
        let mut set = BTreeSet::new();
        ppgtt_frames(&mem, 0x1000, &mut set);
        assert_eq!(
            set.into_iter().map(|g| g.0).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 9]
        );
    }
}
