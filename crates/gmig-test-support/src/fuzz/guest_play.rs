//! The `vgpu_guest` harness's guest ([`super::guest`]): the input decoded into operations a
//! guest controls, played on a clone of the booted vGPU with the pages written to its RAM
//! recorded, then the checks on the vGPU itself and the probe that it still answers.

use gmig_cmdparser::{build, AddressSpace};
use gmig_vgpu::gm::PAGE_SIZE;
use gmig_vgpu::gtt::ram_size;
use gmig_vgpu::mmio::{self, desc, lrc, pvinfo, ring, EngineId};
use gmig_vgpu::{pci, Vgpu};
use vm_memory::{Bytes, GuestAddress};

use super::guest_ops::{
    ggtt_entry, op, read_u32, GuestOutcome, Layout, GDRST, GRDOM_FULL, MAX_OPS, PROBE_MAGIC,
    PROBE_PAGES,
};

/// Bytes of an input, read in order; past the end every read gives zeroes.
pub(super) struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn bytes(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn le<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let got = self.bytes(N);
        b[..got.len()].copy_from_slice(got);
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.le())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.le())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.le())
    }
    fn dwords(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.u32()).collect()
    }
}

fn pick<T: Copy>(list: &[T], i: impl Into<u64>) -> Option<T> {
    (!list.is_empty()).then(|| list[(i.into() % list.len() as u64) as usize])
}

/// One input's guest: a clone of the booted vGPU, and the pages written to its RAM.
pub(super) struct Guest<'a> {
    pub v: Vgpu,
    /// Guest RAM (one region).
    pub ram: std::ops::Range<u64>,
    l: &'a Layout,
    regs: &'a [u32],
    /// Pages written by the guest's CPU or reported written by the device (a bitmap from
    /// page 0).
    written: Vec<u64>,
}

impl<'a> Guest<'a> {
    /// The guest of an input on `v`, whose RAM is one region from `ram_start`.
    pub fn new(v: Vgpu, ram_start: u64, l: &'a Layout, regs: &'a [u32]) -> Guest<'a> {
        let ram = ram_start..ram_size(v.guest_memory());
        let pages = (ram.end / PAGE_SIZE) as usize;
        Guest {
            v,
            ram,
            l,
            regs,
            written: vec![0; pages.div_ceil(64)],
        }
    }

    /// Records a page written; a page outside the guest's RAM is a broken guarantee (the
    /// device reported writing it).
    pub fn mark(&mut self, page: u64) {
        assert!(
            (self.ram.start / PAGE_SIZE..self.ram.end / PAGE_SIZE).contains(&page),
            "the device reports writing guest page {page:#x}, outside the guest's RAM {:#x?}",
            self.ram
        );
        self.written[(page / 64) as usize] |= 1 << (page % 64);
    }

    /// The pages written (all in RAM).
    pub fn touched(&self) -> impl Iterator<Item = u64> + '_ {
        (self.ram.start / PAGE_SIZE..self.ram.end / PAGE_SIZE)
            .filter(|p| self.written[(p / 64) as usize] & (1 << (p % 64)) != 0)
    }

    /// A guest CPU write: what lies in RAM is written, the rest dropped.
    pub fn cpu_write(&mut self, gpa: u64, data: &[u8]) {
        let start = gpa.max(self.ram.start);
        let end = gpa.saturating_add(data.len() as u64).min(self.ram.end);
        if start >= end {
            return;
        }
        for p in start / PAGE_SIZE..=(end - 1) / PAGE_SIZE {
            self.mark(p);
        }
        let from = (start - gpa) as usize;
        let n = (end - start) as usize;
        let _ = self
            .v
            .guest_memory()
            .write_slice(&data[from..from + n], GuestAddress(start));
    }

    pub fn cpu_write_dwords(&mut self, gpa: u64, dwords: &[u32]) {
        let b: Vec<u8> = dwords.iter().flat_map(|d| d.to_le_bytes()).collect();
        self.cpu_write(gpa, &b);
    }

    pub fn base_of(&self, e: EngineId) -> u32 {
        e.mmio_base_for(self.v.config().gen)
    }

    // ---- operand decoders ----

    fn reg(&self, r: &mut Reader<'_>) -> u32 {
        match r.u8() % 4 {
            0 => pick(self.regs, r.u16()).unwrap_or(0),
            1 => r.u32() & (mmio::MMIO_BAR_SIZE - 1),
            2 => {
                let e = EngineId::ALL[usize::from(r.u8() % 4)];
                self.base_of(e) + (u32::from(r.u16()) & 0x7fc)
            }
            _ => mmio::GTT_MMIO_BASE + 8 * self.ggtt_page(r),
        }
    }

    /// A GGTT page number: a mapped one, or any page of the slices.
    fn ggtt_page(&self, r: &mut Reader<'_>) -> u32 {
        let i = r.u16();
        let s = self.v.guest_view();
        let off = if i & 0x8000 == 0 {
            pick(&self.l.ggtt_pages, i).unwrap_or(0)
        } else if i & 0x4000 == 0 {
            s.aperture.base.0 + u64::from(i & 0x3fff) * PAGE_SIZE
        } else {
            s.hidden.base.0 + u64::from(i & 0x3fff) * PAGE_SIZE
        };
        (off / PAGE_SIZE) as u32
    }

    fn v32(&self, r: &mut Reader<'_>) -> u32 {
        match r.u8() % 4 {
            0 => r.u32(),
            1 => u32::from(r.u8()),
            2 => pick(&self.l.ggtt_pages, r.u8()).unwrap_or(0) as u32 | u32::from(r.u8()),
            _ => 0xffff_0000 | u32::from(r.u16()),
        }
    }

    fn v64(&self, r: &mut Reader<'_>) -> u64 {
        match r.u8() % 3 {
            0 => r.u64(),
            1 => pick(&self.l.ram_pages, r.u8()).unwrap_or(0) | u64::from(r.u8()),
            _ => (u64::from(r.u16()) << 12) | 1,
        }
    }

    fn desc(&self, r: &mut Reader<'_>) -> u64 {
        match r.u8() % 3 {
            0 => {
                let d = pick(&self.l.ctxs, r.u8()).map_or(0, |c| c.desc);
                d ^ (u64::from(r.u8()) << 1)
            }
            1 => r.u64(),
            _ => {
                let lrca = pick(&self.l.ggtt_pages, r.u8()).unwrap_or(0);
                lrca | u64::from(r.u8()) | (u64::from(r.u8() & 1) << 8) | (u64::from(r.u8()) << 32)
            }
        }
    }

    fn addr(&self, r: &mut Reader<'_>) -> u64 {
        match r.u8() % 4 {
            0 => pick(&self.l.ram_pages, r.u8()).unwrap_or(0) + u64::from(r.u16() & 0xfff),
            1 => u64::from(r.u32()),
            2 => {
                let image = pick(&self.l.ctxs, r.u8()).map_or(0, |c| c.image);
                image + lrc::STATE_OFFSET + 4 * u64::from(r.u8())
            }
            _ => pick(&self.l.tables, r.u8()).unwrap_or(0) + 8 * u64::from(r.u16() & 0x1ff),
        }
    }

    // ---- operations ----

    pub fn play(&mut self, ops: &[u8]) -> GuestOutcome {
        let before = (self.v.stats().workloads, self.v.stats().refused);
        let mut r = Reader(ops);
        let mut n = 0;
        while !r.0.is_empty() && n < MAX_OPS {
            self.step(&mut r);
            n += 1;
        }
        // The guest waits for its work at the end.
        self.v.run_until_idle();
        let completed = self.v.stats().workloads - before.0;
        let refused = self.v.stats().refused - before.1;
        self.check_slices();
        let mut gdrst_recovers = true;
        if let Err(failed) = self.probe(false) {
            gdrst_recovers = false;
            if let Err(still) = self.probe(true) {
                panic!(
                    "the vGPU no longer answers: after GDRST the probe failed on {failed:?}, after a device reset on {still:?}; faults {:?}",
                    self.v.faults()
                );
            }
        }
        let log = self.v.take_write_log();
        // What migration's dirty tracking takes from the log: the pages the engine wrote must
        // be among the candidates (unless some command's writes were unknown).
        if !log.unknown {
            let missed: Vec<u64> = log.actual.difference(&log.candidate).map(|g| g.0).collect();
            assert!(
                missed.is_empty(),
                "the device wrote guest pages its candidate write set does not name: {missed:#x?}"
            );
        }
        for g in log.actual {
            self.mark(g.0);
        }
        GuestOutcome {
            ops: n,
            completed,
            refused,
            gdrst_recovers,
        }
    }

    fn step(&mut self, r: &mut Reader<'_>) {
        match r.u8() % op::COUNT {
            op::WRITE32 => {
                let (o, v) = (self.reg(r), self.v32(r));
                let _ = self.v.mmio_write32(o, v);
            }
            op::WRITE64 => {
                let (o, v) = (self.reg(r), self.v64(r));
                let _ = self.v.mmio_write64(o, v);
            }
            op::READ => {
                let o = self.reg(r);
                let w = r.u8();
                match w % 3 {
                    0 => drop(self.v.mmio_read32(o)),
                    1 => drop(self.v.mmio_read64(o)),
                    _ => {
                        let mut b = [0u8; 2];
                        let n = 1 + usize::from(w & 4 != 0);
                        pci::bar0_read(&self.v, u64::from(o) + u64::from(w >> 3 & 3), &mut b[..n]);
                    }
                }
            }
            op::BAR0 => {
                let off = u64::from(r.u32() & 0x00ff_ffff);
                let n = 1 << (r.u8() % 4);
                let data = r.bytes(n).to_vec();
                pci::bar0_write(&mut self.v, off, &data);
                let mut back = vec![0u8; data.len()];
                pci::bar0_read(&self.v, off, &mut back);
            }
            op::ELSP => {
                let e = EngineId::ALL[usize::from(r.u8() % 4)];
                let x = r.u8();
                let (d0, d1) = (self.desc(r), self.desc(r));
                let writes = if x & 2 != 0 {
                    1 + usize::from(x >> 2) % 3
                } else {
                    4
                };
                self.elsp(e, d0, d1, writes);
            }
            op::RAM => {
                let at = self.addr(r);
                let n = usize::from(r.u8());
                let data = r.bytes(n).to_vec();
                self.cpu_write(at, &data);
            }
            op::RING => {
                let ci = r.u8();
                let n = usize::from(r.u8() % 65);
                let cmds = r.dwords(n);
                self.ring_submit(ci, &cmds);
            }
            op::BATCH => {
                let ci = r.u8();
                let n = usize::from(r.u8() % 65);
                let mut cmds = r.dwords(n);
                if let Some(c) = pick(&self.l.ctxs, ci) {
                    cmds.extend(build::mi_batch_buffer_end());
                    self.cpu_write_dwords(c.batch.gpa, &cmds);
                    let start = build::mi_batch_buffer_start(c.batch.space, c.batch.gpu, false);
                    self.ring_submit(ci, &start);
                }
            }
            op::APERTURE => {
                let m = r.u8();
                let off = if m & 1 == 0 {
                    pick(&self.l.aperture_pages, r.u8()).unwrap_or(0) + u64::from(r.u16() & 0xfff)
                } else {
                    u64::from(r.u32())
                };
                let n = usize::from(r.u8());
                if m & 2 != 0 {
                    let data = r.bytes(n).to_vec();
                    for g in pci::aperture_write(&self.v, off, &data) {
                        self.mark(g.0);
                    }
                } else {
                    let mut b = vec![0u8; n];
                    pci::aperture_read(&self.v, off, &mut b);
                }
            }
            op::RUN => match r.u8() % 3 {
                0 => drop(self.v.run_until_idle()),
                1 => drop(self.v.run(1 + usize::from(r.u8() % 4))),
                _ => drop(self.v.advance(u64::from(r.u16() % 4097))),
            },
            op::GDRST => {
                let d = u32::from(r.u8() & 0x1f);
                let _ = self.v.mmio_write32(GDRST, d);
            }
            op::GGTT_MAP => {
                let page = self.ggtt_page(r);
                let pte = self.v64(r);
                let _ = self.v.mmio_write64(mmio::GTT_MMIO_BASE + 8 * page, pte);
            }
            op::PPGTT => {
                let x = r.u8();
                let i = r.u8();
                let root = if x & 2 == 0 {
                    pick(&self.l.tables, i)
                } else {
                    pick(&self.l.ram_pages, i)
                }
                .unwrap_or(0);
                let pv = mmio::VGT_PVINFO_PAGE;
                let _ = self.v.mmio_write32(pv + pvinfo::PDP0_LO, root as u32);
                let _ = self
                    .v
                    .mmio_write32(pv + pvinfo::PDP0_LO + 4, (root >> 32) as u32);
                let n = if x & 1 == 0 {
                    mmio::VGT_G2V_PPGTT_L4_PAGE_TABLE_CREATE
                } else {
                    mmio::VGT_G2V_PPGTT_L4_PAGE_TABLE_DESTROY
                };
                let _ = self.v.mmio_write32(pv + pvinfo::G2V_NOTIFY, n);
            }
            _ => {
                let i = u32::from(r.u8() % 8);
                let (lo, hi) = (self.v32(r), self.v32(r));
                let _ = self.v.mmio_write32(mmio::FENCE_REG_BASE + 8 * i, lo);
                let _ = self.v.mmio_write32(mmio::FENCE_REG_BASE + 8 * i + 4, hi);
            }
        }
    }

    /// ELSP writes: element 1 high, low, element 0 high, low (the first `writes` of them).
    pub fn elsp(&mut self, e: EngineId, d0: u64, d1: u64, writes: usize) {
        let port = self.base_of(e) + ring::ELSP;
        let words = [(d1 >> 32) as u32, d1 as u32, (d0 >> 32) as u32, d0 as u32];
        for w in words.into_iter().take(writes) {
            let _ = self.v.mmio_write32(port, w);
        }
    }

    /// As the driver submits: `cmds` (padded to whole qwords) at the tail its context image
    /// holds (wrapping with MI_NOOPs at the ring's end), the new tail into the image, then ELSP.
    fn ring_submit(&mut self, ci: u8, cmds: &[u32]) {
        let Some(c) = pick(&self.l.ctxs, ci) else {
            return;
        };
        let tail_at = c.image + lrc::STATE_OFFSET + 4 * lrc::RING_TAIL as u64;
        let mut tail = (read_u32(self.v.guest_memory(), tail_at) % c.ring_size) & !7;
        let mut cmds = cmds.to_vec();
        if cmds.len() % 2 == 1 {
            cmds.push(0);
        }
        cmds.truncate((c.ring_size as usize / 4 - 2) & !1);
        let bytes = 4 * cmds.len() as u32;
        if tail + bytes >= c.ring_size {
            let pad = vec![0u32; ((c.ring_size - tail) / 4) as usize];
            self.cpu_write_dwords(c.ring + u64::from(tail), &pad);
            tail = 0;
        }
        self.cpu_write_dwords(c.ring + u64::from(tail), &cmds);
        tail = (tail + bytes) % c.ring_size;
        self.cpu_write_dwords(tail_at, &[tail]);
        self.elsp(c.engine, c.desc, 0, 4);
    }
}

impl Guest<'_> {
    // ---- checks ----

    /// What the hardware would be handed stays inside the vGPU's host slices: the shadows of
    /// address registers, and GGTT entries around the slices (they read as 0).
    pub(super) fn check_slices(&self) {
        let host = self.v.host_slices();
        let gen = self.v.config().gen;
        let mut regs: Vec<u32> = mmio::PLANE_SURF.into_iter().chain(mmio::CUR_BASE).collect();
        regs.extend(EngineId::ALL.map(|e| e.mmio_base_for(gen) + ring::HWS_PGA));
        regs.extend((0..2 * self.v.config().fence_num).map(|i| mmio::FENCE_REG_BASE + 4 * i));
        for o in regs {
            if let Some(s) = self.v.shadow_reg(o) {
                let a = u64::from(s & 0xffff_f000);
                assert!(
                    a == 0 || host.contains(a, PAGE_SIZE),
                    "register {o:#x} hands the hardware {s:#x}, outside the vGPU's slices {host:x?}"
                );
            }
        }
        let s = self.v.guest_view();
        for off in [
            0,
            s.aperture.base.0.wrapping_sub(PAGE_SIZE),
            s.aperture.end(),
            s.hidden.base.0 - PAGE_SIZE,
            s.hidden.end(),
        ] {
            if off < 1 << 32 {
                assert_eq!(
                    ggtt_entry(&self.v, off),
                    0,
                    "GGTT entry {off:#x} outside the slices"
                );
            }
        }
    }

    /// `GDRST` (or a device reset), then on every engine a context of the probe's own (image,
    /// ring and breadcrumb page at the top of RAM, mapped at the top of the hidden slice) whose
    /// ring stores a breadcrumb. `Err` names the engines whose breadcrumb did not land.
    pub(super) fn probe(&mut self, device_reset: bool) -> Result<(), Vec<&'static str>> {
        if device_reset {
            self.v.device_reset();
        } else {
            let _ = self.v.mmio_write32(GDRST, GRDOM_FULL);
        }
        let s = self.v.guest_view();
        let ggtt0 = s.hidden.end() - PROBE_PAGES * PAGE_SIZE;
        let ram0 = self.ram.end - PROBE_PAGES * PAGE_SIZE;
        for p in 0..PROBE_PAGES {
            let entry = mmio::GTT_MMIO_BASE + ((ggtt0 / PAGE_SIZE + p) * 8) as u32;
            let _ = self
                .v
                .mmio_write64(entry, (ram0 + p * PAGE_SIZE) | mmio::GTT_PTE_PRESENT);
        }
        let crumbs = 12 * PAGE_SIZE;
        self.cpu_write(ram0 + crumbs, &[0; 16]);
        for (i, e) in EngineId::ALL.into_iter().enumerate() {
            let at = 3 * i as u64 * PAGE_SIZE;
            let ring_at = at + 2 * PAGE_SIZE;
            let mut cmds = build::mi_store_data_imm(
                AddressSpace::Ggtt,
                ggtt0 + crumbs + 4 * i as u64,
                &[PROBE_MAGIC + i as u32],
            );
            cmds.extend(build::mi_user_interrupt());
            if cmds.len() % 2 == 1 {
                cmds.extend(build::mi_noop());
            }
            self.cpu_write_dwords(ram0 + ring_at, &cmds);
            let base = self.base_of(e);
            let mut state = vec![0u32; lrc::STATE_DWORDS];
            state[1] = (0x22 << 23) | (2 * 14 - 1);
            for (idx, reg, v) in [
                (lrc::CONTEXT_CONTROL, 0x244, 0),
                (lrc::RING_HEAD, ring::HEAD, 0),
                (lrc::RING_TAIL, ring::TAIL, 4 * cmds.len() as u32),
                (lrc::RING_START, ring::START, (ggtt0 + ring_at) as u32),
                (lrc::RING_CTL, ring::CTL, 1),
                (lrc::PDP0_UDW, 0x274, 0),
                (lrc::PDP0_LDW, 0x270, 0),
            ] {
                state[idx - 1] = base + reg;
                state[idx] = v;
            }
            self.cpu_write_dwords(ram0 + at + lrc::STATE_OFFSET, &state);
            let d = desc::VALID
                | (ggtt0 + at)
                | (1 << desc::ADDRESSING_SHIFT)
                | desc::PRIVILEGE
                | ((0x7f0 + i as u64) << desc::CTX_ID_SHIFT);
            self.elsp(e, d, 0, 4);
        }
        self.v.run_until_idle();
        let failed: Vec<&'static str> = EngineId::ALL
            .into_iter()
            .enumerate()
            .filter(|&(i, _)| {
                read_u32(self.v.guest_memory(), ram0 + crumbs + 4 * i as u64)
                    != PROBE_MAGIC + i as u32
            })
            .map(|(_, e)| e.name())
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed)
        }
    }
}
