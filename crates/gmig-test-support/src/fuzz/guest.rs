//! The `vgpu_guest` harness: a hostile guest driving a booted vGPU through everything a guest
//! controls — BAR0 register and GGTT-entry accesses, its own RAM (context images, rings, batches,
//! page tables), the aperture — and letting the engines run.
//!
//! Per thread, one vGPU per guest-driver profile is booted (GEN9 64+384, guest RAM from
//! [`RAM_BASE`] to [`GUEST_RAM_END`], the driver's contexts, rings, status pages, PPGTT and
//! objects, two frames run) on the first input that asks for it, and cloned for each input; the
//! clones share the booted guest RAM, which goes back to its booted bytes after each input. A
//! second vGPU, the neighbour, sits in the next slot of the same host with its own RAM and is
//! never touched by an input.
//!
//! Input: byte 0 picks the profile (`Profile::ALL[b % 5]`); the rest is a sequence of operations
//! (at most [`MAX_OPS`](super::guest_ops::MAX_OPS)), each an opcode byte (`b % 14`,
//! [`op`](super::guest_ops::op)) and its operands. Reading past the end of the input gives
//! zeroes. Operand encodings bias addresses towards what the set-up uses: see `docs/fuzzing.md`
//! ("`vgpu_guest`") and the decoders in `guest_play.rs`.
//!
//! After the operations the engines run until idle, and the harness checks:
//! 1. no panic (anywhere in the vGPU);
//! 2. no access outside the guest's RAM and the vGPU's slices: every page the device reports
//!    written (its write log, aperture writes) lies in its RAM, and those the engine wrote are in
//!    its candidate write set (what migration's dirty tracking uses); every RAM page that changed was
//!    written by the guest's CPU (an input operation) or reported by the device — restoring those
//!    pages must give back the booted RAM byte for byte; the neighbour's RAM and registers are
//!    unchanged; the host-side shadows of address registers lie in the vGPU's host slices; GGTT
//!    entries around the slices read as 0;
//! 3. the vGPU still answers: after `GDRST` (full), a known-good submission on every engine (its
//!    own context image, ring and breadcrumb page, mapped by the probe) completes and its
//!    breadcrumb lands; if not, after `Vgpu::device_reset` it must (reported as
//!    [`GuestOutcome::gdrst_recovers`] `false`); if not even then, the harness panics.

use std::cell::RefCell;
use std::collections::BTreeMap;

use gmig_vgpu::gm::{HostConfig, PartitionManager, VgpuSlices, VgpuType, PAGE_SIZE};
use gmig_vgpu::gtt::{ram_size, GuestRam};
use gmig_vgpu::mmio::{self, desc, lrc, pvinfo, EngineId};
use gmig_vgpu::regs::table;
use gmig_vgpu::workload::{GuestDriver, Profile};
use gmig_vgpu::{Vgpu, VgpuConfig};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use super::guest_ops::{
    ggtt_entry, read_u32, region_bytes, restore, CtxLayout, GuestOutcome, Layout, GDRST,
    GUEST_RAM_END, NEIGHBOUR_COMPARE_EVERY, NEIGHBOUR_RAM_END, PROBE_PAGES, RAM_BASE,
};
use super::guest_play::Guest;
use super::guest_seed;
use super::{tiny_workload, RamImage};

const TY: VgpuType = VgpuType::V5_8;
/// One profile's booted vGPU.
struct GuestBase {
    vgpu: Vgpu,
    ram: GuestRam,
    image: RamImage,
    layout: Layout,
    seed: Vec<u8>,
    ram_unknown: bool,
}

/// The untouched vGPU in the next slot.
struct Neighbour {
    vgpu: Vgpu,
    image: RamImage,
    regs: BTreeMap<u32, u32>,
    /// Its RAM is mapped read-only (else it is compared after every input).
    read_only: bool,
    inputs: u64,
}

struct GuestHost {
    slices: VgpuSlices,
    bases: Vec<Option<GuestBase>>,
    neighbour: Neighbour,
    regs: Vec<u32>,
}

thread_local! {
    static HOST: RefCell<Option<GuestHost>> = const { RefCell::new(None) };
}

/// Plays `data` as a hostile guest on a booted vGPU and checks the guarantees above; panics
/// when one is broken.
pub fn vgpu_guest(data: &[u8]) -> GuestOutcome {
    HOST.with(|cell| {
        let mut cell = cell.borrow_mut();
        cell.get_or_insert_with(GuestHost::new).run(data)
    })
}

/// Valid inputs: three frames of each profile's guest driver recorded as BAR0 and RAM writes,
/// and a few hand-made sequences. `(name, input)`.
pub fn vgpu_guest_seeds() -> Vec<(String, Vec<u8>)> {
    HOST.with(|cell| {
        let mut cell = cell.borrow_mut();
        let host = cell.get_or_insert_with(GuestHost::new);
        let mut out = Vec::new();
        for (i, p) in Profile::ALL.into_iter().enumerate() {
            let b = host.base(i);
            out.push((format!("frames-{}", p.name()), b.seed.clone()));
            out.extend(guest_seed::hand_made(i as u8, p, &b.layout));
        }
        out
    })
}

fn boot(profile: Profile, slices: VgpuSlices, id: u32, end: u64) -> (Vgpu, GuestDriver) {
    let ram = GuestRam::from_ranges(&[(GuestAddress(RAM_BASE), (end - RAM_BASE) as usize)])
        .expect("guest RAM");
    let mut v = Vgpu::new(VgpuConfig::new(TY, id), slices, ram).expect("the harness vGPU");
    let mut d = GuestDriver::boot(&mut v, profile, tiny_workload(), 11).expect("boot the driver");
    d.run_frames(&mut v, 2).expect("run the guest's frames");
    let _ = v.take_write_log();
    (v, d)
}

impl GuestHost {
    fn new() -> GuestHost {
        let mut pm = PartitionManager::new(HostConfig::default()).expect("default host");
        let (_, slices) = pm.place(TY).expect("place the vGPU");
        let (_, next) = pm.place(TY).expect("place the neighbour");
        let (vgpu, _) = boot(Profile::Desktop, next, 2, NEIGHBOUR_RAM_END);
        let image = RamImage::new(region_bytes(vgpu.guest_memory()));
        let regs = vgpu.guest_registers().clone();
        let read_only = map_read_only(vgpu.guest_memory());
        GuestHost {
            slices,
            bases: (0..Profile::ALL.len()).map(|_| None).collect(),
            neighbour: Neighbour {
                vgpu,
                image,
                regs,
                read_only,
                inputs: 0,
            },
            regs: register_list(),
        }
    }

    fn base(&mut self, i: usize) -> &mut GuestBase {
        let slices = self.slices;
        self.bases[i].get_or_insert_with(|| GuestBase::boot(Profile::ALL[i], slices))
    }

    fn run(&mut self, data: &[u8]) -> GuestOutcome {
        // An empty input is the first profile's vGPU with no operations.
        let (sel, ops) = data.split_first().map_or((0, &[][..]), |(&s, o)| (s, o));
        let regs = std::mem::take(&mut self.regs);
        let base = self.base(usize::from(sel) % Profile::ALL.len());
        if std::mem::replace(&mut base.ram_unknown, true) {
            restore(&base.ram, &base.image.bytes, 0..base.image.bytes.len());
        }
        let mut g = Guest::new(base.vgpu.clone(), RAM_BASE, &base.layout, &regs);
        let outcome = g.play(ops);
        // Restore what the input may have written; anything else that changed was written
        // behind the write log's back.
        let page = PAGE_SIZE as usize;
        for p in g.touched() {
            let at = (p * PAGE_SIZE - RAM_BASE) as usize;
            restore(&base.ram, &base.image.bytes, at..at + page);
        }
        if !base.image.held_at(&base.ram, RAM_BASE) {
            let now = region_bytes(&base.ram);
            let bad: Vec<u64> = (0..now.len() / page)
                .filter(|p| now[p * page..][..page] != base.image.bytes[p * page..][..page])
                .map(|p| RAM_BASE / PAGE_SIZE + p as u64)
                .collect();
            panic!("guest RAM pages changed that neither the guest CPU nor the device's write log nor an aperture write account for: {bad:x?}");
        }
        base.ram_unknown = false;
        let n = &mut self.neighbour;
        n.inputs += 1;
        if !n.read_only || n.inputs.is_multiple_of(NEIGHBOUR_COMPARE_EVERY) {
            assert!(
                n.image.held_at(n.vgpu.guest_memory(), RAM_BASE),
                "the neighbour vGPU's guest RAM changed"
            );
        }
        assert!(
            n.vgpu.guest_registers() == &n.regs,
            "the neighbour vGPU's registers changed"
        );
        self.regs = regs;
        outcome
    }
}

impl GuestBase {
    fn boot(profile: Profile, slices: VgpuSlices) -> GuestBase {
        let (vgpu, driver) = boot(profile, slices, 1, GUEST_RAM_END);
        let ram = vgpu.guest_memory().clone();
        let image = RamImage::new(region_bytes(&ram));
        // The driver's frames, recorded on a clone (sharing the RAM, restored after).
        let index = Profile::ALL.iter().position(|&p| p == profile).unwrap_or(0) as u8;
        let (seed, descs) = guest_seed::record_frames(index, &vgpu, &driver, 3);
        restore(&ram, &image.bytes, 0..image.bytes.len());
        let layout = discover(&vgpu, &driver, &descs);
        let top = ram_size(&ram) - PROBE_PAGES * PAGE_SIZE;
        assert!(
            layout.ram_pages.iter().all(|&p| p < top),
            "the guest's set-up reaches the probe's pages"
        );
        GuestBase {
            vgpu,
            ram,
            image,
            layout,
            seed,
            ram_unknown: false,
        }
    }
}

extern "C" {
    fn mprotect(addr: *mut std::ffi::c_void, len: usize, prot: std::ffi::c_int) -> std::ffi::c_int;
}

/// Maps guest RAM `ram` (one region from [`RAM_BASE`]) read-only: any write into it, by any
/// code, faults at once. Whether that worked.
fn map_read_only(ram: &GuestRam) -> bool {
    let len = (ram_size(ram) - RAM_BASE) as usize;
    let Ok(slice) = ram.get_slice(GuestAddress(RAM_BASE), len) else {
        return false;
    };
    let guard = slice.ptr_guard();
    let at = guard.as_ptr();
    if !(at as usize).is_multiple_of(PAGE_SIZE as usize) {
        return false;
    }
    // SAFETY: `at..at + len` is the whole mapping of `ram`'s one region (mmap'd, page-aligned);
    // PROT_READ only forbids writes, which nothing makes: the neighbour is never written after
    // its boot, only read, and its mapping lives as long as `ram`, which the harness keeps.
    unsafe { mprotect(at.cast_mut().cast(), len, 1) == 0 }
}

/// Every register the model has a row for (engine rows for each engine), the PV info fields,
/// fences, display address registers and `GDRST`.
fn register_list() -> Vec<u32> {
    let mut r: Vec<u32> = table::ABSOLUTE.iter().map(|r| r.offset).collect();
    for e in EngineId::ALL {
        r.extend(table::ENGINE.iter().map(|x| e.mmio_base() + x.offset));
    }
    for f in [
        pvinfo::MAGIC,
        pvinfo::VERSION_MAJOR,
        pvinfo::VGT_ID,
        pvinfo::VGT_CAPS,
        pvinfo::APERTURE_BASE,
        pvinfo::HIDDEN_BASE,
        pvinfo::FENCE_NUM,
        pvinfo::DISPLAY_READY,
        pvinfo::G2V_NOTIFY,
        pvinfo::PDP0_LO,
        pvinfo::PDP0_LO + 4,
        pvinfo::EXECLIST_DESC_LO,
        pvinfo::EXECLIST_DESC_HI,
    ] {
        r.push(mmio::VGT_PVINFO_PAGE + f);
    }
    for i in 0..8 {
        r.extend([
            mmio::FENCE_REG_BASE + 8 * i,
            mmio::FENCE_REG_BASE + 8 * i + 4,
        ]);
    }
    r.extend(mmio::PLANE_SURF);
    r.extend(mmio::CUR_BASE);
    r.extend(mmio::PLANE_STRIDE);
    r.extend([GDRST, mmio::RING_FAULT_REG, mmio::ERROR_GEN6]);
    r.sort_unstable();
    r.dedup();
    r
}

/// The set-up's contexts (from the descriptors the driver's frames wrote to ELSP), the pages
/// the GGTT and PPGTT map, and the PPGTT's tables.
fn discover(v: &Vgpu, d: &GuestDriver, descs: &[(EngineId, u64)]) -> Layout {
    let ram = v.guest_memory();
    let mut l = Layout::default();
    let s = v.guest_view();
    for slice in [s.aperture, s.hidden] {
        for p in 0..slice.size / PAGE_SIZE {
            let off = slice.base.0 + p * PAGE_SIZE;
            if ggtt_entry(v, off) & mmio::GTT_PTE_PRESENT != 0 {
                l.ggtt_pages.push(off);
                if slice == s.aperture {
                    l.aperture_pages.push(off);
                }
            }
        }
    }
    let gpa_of = |ggtt: u64| ggtt_entry(v, ggtt) & mmio::PTE_ADDR_MASK;
    let mut pml4 = None;
    for &(engine, dsc) in descs {
        if l.ctxs.iter().any(|c| c.engine == engine) {
            continue;
        }
        let image = gpa_of(dsc & desc::LRCA_MASK);
        let state = |i: usize| read_u32(ram, image + lrc::STATE_OFFSET + 4 * i as u64);
        let ring = gpa_of(u64::from(state(lrc::RING_START)));
        let ring_size = ((state(lrc::RING_CTL) >> 12) + 1) * PAGE_SIZE as u32;
        if (dsc >> desc::ADDRESSING_SHIFT) & 3 == 3 {
            pml4 = Some(u64::from(state(lrc::PDP0_LDW)) | (u64::from(state(lrc::PDP0_UDW)) << 32));
        }
        l.ctxs.push(CtxLayout {
            engine,
            desc: dsc,
            image,
            ring,
            ring_size,
            batch: d.next_batch(engine),
        });
    }
    assert!(!l.ctxs.is_empty(), "the driver's frames submitted nothing");
    l.ram_pages = v
        .gtt_backed_pages()
        .iter()
        .map(|g| g.0 * PAGE_SIZE)
        .collect();
    if let Some(root) = pml4 {
        let end = ram_size(ram);
        let mut level = vec![root];
        l.tables.push(root);
        for _ in 0..3 {
            let mut next = Vec::new();
            for t in level {
                for i in 0..512 {
                    let e: u64 = ram.read_obj(GuestAddress(t + 8 * i)).unwrap_or(0);
                    let a = e & mmio::PTE_ADDR_MASK;
                    if e & 1 != 0 && a + PAGE_SIZE <= end && !l.tables.contains(&a) {
                        l.tables.push(a);
                        next.push(a);
                    }
                }
            }
            level = next;
        }
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each profile's recorded frames replay on a clone of the booted vGPU: every submission
    /// completes, none is refused; after every seed GDRST alone recovers the vGPU.
    #[test]
    fn the_recorded_frames_replay_and_complete() {
        for (name, seed) in vgpu_guest_seeds() {
            let o = vgpu_guest(&seed);
            assert!(o.gdrst_recovers, "{name}: {o:?}");
            if name.starts_with("frames-") {
                assert!(o.completed >= 1 && o.refused == 0, "{name}: {o:?}");
            }
        }
    }

    /// A RAM change that neither the guest CPU nor the device reported is caught.
    #[test]
    #[should_panic(expected = "neither the guest CPU")]
    fn an_unreported_ram_change_is_caught() {
        vgpu_guest(&[1]);
        HOST.with(|cell| {
            let mut cell = cell.borrow_mut();
            let base = cell.as_mut().expect("booted").base(1);
            base.ram
                .write_obj(0xdead_u32, GuestAddress(RAM_BASE + 0x1000))
                .expect("write");
        });
        vgpu_guest(&[1]);
    }

    /// The neighbour's RAM is mapped read-only, and inputs do not depend on the ones before.
    #[test]
    fn the_neighbour_is_read_only_and_inputs_start_fresh() {
        let seeds = vgpu_guest_seeds();
        let first: Vec<_> = seeds.iter().map(|(_, s)| vgpu_guest(s)).collect();
        let again: Vec<_> = seeds.iter().rev().map(|(_, s)| vgpu_guest(s)).collect();
        assert!(first.iter().eq(again.iter().rev()));
        HOST.with(|cell| {
            assert!(cell.borrow().as_ref().expect("booted").neighbour.read_only);
        });
    }
}
