//! Comparing the guest-visible state of two vGPUs (the differential tests' oracle).

use std::collections::BTreeSet;

use gmig_cmdparser::GgttOffset;
use vm_memory::{Bytes, GuestAddress};

use crate::gm::{Gfn, PAGE_SIZE};
use crate::mmio::{self, pvinfo};
use crate::vgpu::Vgpu;

/// A difference in guest-visible state between two vGPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateDiff {
    /// Registers whose guest-visible values differ: `(offset, a, b)`.
    pub registers: Vec<(u32, u32, u32)>,
    /// Guest-view GGTT pages whose entries differ.
    pub ggtt_entries: Vec<u64>,
    /// Guest frames whose contents differ.
    pub pages: Vec<Gfn>,
    /// Guest RAM sizes differ.
    pub ram_size: Option<(u64, u64)>,
    /// Fault records differ.
    pub faults: bool,
}

impl StateDiff {
    /// Nothing differs.
    pub fn is_identical(&self) -> bool {
        *self == StateDiff::default()
    }
}

/// Compares what a guest can observe of two vGPUs: registers (MMIO reads), GGTT entries (through
/// the MMIO GTT range, at guest-view offsets), reported faults and every byte of guest RAM.
pub fn compare_guest_visible(a: &Vgpu, b: &Vgpu) -> StateDiff {
    let mut d = StateDiff::default();
    let keys: BTreeSet<u32> = a.vregs.keys().chain(b.vregs.keys()).copied().collect();
    for k in keys {
        let (x, y) = (
            a.vregs.get(&k).copied().unwrap_or(0),
            b.vregs.get(&k).copied().unwrap_or(0),
        );
        if x != y {
            d.registers.push((k, x, y));
        }
    }
    if a.guest_view != b.guest_view {
        d.registers
            .push((mmio::VGT_PVINFO_PAGE + pvinfo::APERTURE_BASE, 0, 0));
    }
    let pages = a.guest_view.aperture.size / PAGE_SIZE + a.guest_view.hidden.size / PAGE_SIZE;
    let (ga, gb) = (a.ggtt.save(), b.ggtt.save());
    if ga != gb {
        for p in 0..pages {
            let off = if p < a.guest_view.aperture.size / PAGE_SIZE {
                a.guest_view.aperture.base.0 + p * PAGE_SIZE
            } else {
                a.guest_view.hidden.base.0
                    + (p - a.guest_view.aperture.size / PAGE_SIZE) * PAGE_SIZE
            };
            if a.ggtt.entry(&a.guest_view, GgttOffset(off))
                != b.ggtt.entry(&b.guest_view, GgttOffset(off))
            {
                d.ggtt_entries.push(off);
            }
        }
    }
    d.faults = a.faults != b.faults;
    let (sa, sb) = (crate::gtt::ram_size(&a.mem), crate::gtt::ram_size(&b.mem));
    if sa != sb {
        d.ram_size = Some((sa, sb));
        return d;
    }
    let mut pa = vec![0u8; PAGE_SIZE as usize];
    let mut pb = vec![0u8; PAGE_SIZE as usize];
    for gfn in 0..sa / PAGE_SIZE {
        let addr = GuestAddress(gfn * PAGE_SIZE);
        let ra = a.mem.read_slice(&mut pa, addr);
        let rb = b.mem.read_slice(&mut pb, addr);
        if ra.is_err() || rb.is_err() || pa != pb {
            d.pages.push(Gfn(gfn));
        }
    }
    d
}

/// One 64-bit digest (XXH3) of everything [`compare_guest_visible`] compares: guest-visible
/// registers, the GGTT entries at guest-view offsets, the fault records and every byte of guest
/// RAM. Two vGPUs with equal guest-visible state have equal digests, so separate processes can
/// check that a migrated or resumed guest matches a reference by printing it.
pub fn guest_visible_digest(v: &Vgpu) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (k, val) in &v.vregs {
        h.update(&k.to_le_bytes());
        h.update(&val.to_le_bytes());
    }
    for r in [v.guest_view.aperture, v.guest_view.hidden] {
        h.update(&r.base.0.to_le_bytes());
        h.update(&r.size.to_le_bytes());
        for p in 0..r.size / PAGE_SIZE {
            let e = v
                .ggtt
                .entry(&v.guest_view, GgttOffset(r.base.0 + p * PAGE_SIZE));
            h.update(&[u8::from(e.is_some())]);
            h.update(&e.unwrap_or(0).to_le_bytes());
        }
    }
    h.update(format!("{:?}", v.faults).as_bytes());
    let size = crate::gtt::ram_size(&v.mem);
    h.update(&size.to_le_bytes());
    let mut page = vec![0u8; PAGE_SIZE as usize];
    for gfn in 0..size / PAGE_SIZE {
        if v.mem
            .read_slice(&mut page, GuestAddress(gfn * PAGE_SIZE))
            .is_err()
        {
            page.fill(0xff);
        }
        h.update(&page);
    }
    h.digest()
}
