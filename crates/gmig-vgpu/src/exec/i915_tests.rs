//! A user request as Linux 6.1's i915 submits it on the blitter of a GVT-g guest with full
//! PPGTT (issue 32, stage 2), run through the whole vGPU: ELSP, the context image (4-level
//! PPGTT root in PDP0), the ring i915 writes (initial breadcrumb, TLB invalidate, a batch started
//! in the PPGTT, final breadcrumb with `MI_FLUSH_DW` post-sync, user interrupt), the batch its
//! command parser copies into the context's PPGTT, and what the engine writes. The ring's dwords
//! are those the vGPU received from i915 in QEMU (`tests/qemu_i915.rs`, traced with
//! `RUST_LOG=gmig_vgpu=trace`).

use vm_memory::{Bytes, GuestAddress};

use crate::checkpoint::RestoreOptions;
use crate::gm::{HostConfig, PartitionManager, VgpuType};
use crate::gtt::copy_guest_ram;

use crate::gm::PAGE_SIZE;
use crate::mmio::{self, desc, lrc, ring, EngineId};
use crate::regs::table::{GT_CONTEXT_SWITCH_INTERRUPT, GT_USER_INTERRUPT};
use crate::vgpu::Vgpu;
use crate::work::FaultKind;

const BCS: u32 = 0x2_2000;
/// Guest-physical homes: GGTT-mapped pages from 1 MiB, page tables from 2 MiB, the framebuffer
/// at 3 MiB (its pages mapped in reverse order), the sprite at 4 MiB, batch and status at 5 MiB.
const GGTT_RAM: u64 = 1 << 20;
const TABLES: u64 = 2 << 20;
const FB_RAM: u64 = 3 << 20;
const SPRITE_RAM: u64 = 4 << 20;
const BATCH_RAM: u64 = 5 << 20;
const STATUS_RAM: u64 = BATCH_RAM + PAGE_SIZE;
/// PPGTT addresses (the framebuffer and status where the guest program soft-pins them, the
/// sprite above 512 GiB, the batch where i915's command parser put its shadow copy).
const FB_VA: u64 = 0x100_0000;
const SPRITE_VA: u64 = 0x80_0000_0000;
const STATUS_VA: u64 = 0x300_0000;
const BATCH_VA: u64 = 0x300_1000;
const W: u32 = 256;
const H: u32 = 16;
const PITCH: u32 = W * 4;
const SEQNO: u32 = 4;
const CTX_ID: u32 = 0x21;

/// A vGPU with i915's blitter set up: GGTT pages 0..8 of the hidden slice map guest RAM from
/// 1 MiB (page 0 the engine's status page, 1-2 the context image, 3 the ring, 4 the
/// timeline's breadcrumb page); a PPGTT maps the framebuffer, sprite, status and batch.
struct Setup {
    v: Vgpu,
    base: u64,
    next_table: u64,
}

impl Setup {
    fn new() -> Setup {
        let mut v = crate::vgpu::lone_test_vgpu(1, 8 << 20);
        let base = v.host_slices().hidden.base.0;
        for p in 0..8 {
            let e = mmio::GTT_MMIO_BASE + ((base / PAGE_SIZE + p) * 8) as u32;
            v.mmio_write64(e, (GGTT_RAM + p * PAGE_SIZE) | 1).unwrap();
        }
        v.mmio_write32(BCS + ring::HWS_PGA, base as u32).unwrap();
        let mut s = Setup {
            v,
            base,
            next_table: TABLES + PAGE_SIZE,
        };
        for p in 0..(PITCH * H) as u64 / PAGE_SIZE {
            s.map(FB_VA + p * PAGE_SIZE, FB_RAM + (3 - p) * PAGE_SIZE);
        }
        s.map(SPRITE_VA, SPRITE_RAM);
        s.map(STATUS_VA, STATUS_RAM);
        s.map(BATCH_VA, BATCH_RAM);
        let state = GGTT_RAM + PAGE_SIZE + lrc::STATE_OFFSET;
        for (i, val) in [
            (lrc::RING_HEAD, 0),
            (lrc::RING_TAIL, 0),
            (lrc::RING_START, (base + 3 * PAGE_SIZE) as u32),
            (lrc::RING_CTL, 1),
            (lrc::PDP0_UDW, (TABLES >> 32) as u32),
            (lrc::PDP0_LDW, TABLES as u32),
        ] {
            s.put(state + 4 * i as u64, &[val]);
        }
        s
    }

    fn put(&self, gpa: u64, dwords: &[u32]) {
        for (i, d) in dwords.iter().enumerate() {
            self.v
                .guest_memory()
                .write_obj(*d, GuestAddress(gpa + 4 * i as u64))
                .unwrap();
        }
    }

    fn get(&self, gpa: u64) -> u32 {
        self.v.guest_memory().read_obj(GuestAddress(gpa)).unwrap()
    }

    /// Maps the 4 KiB page at `va` to `gpa`, allocating tables from 2 MiB up.
    fn map(&mut self, va: u64, gpa: u64) {
        let mut table = TABLES;
        for level in (2..=4u32).rev() {
            let slot = table + ((va >> (12 + 9 * (level - 1))) & 0x1ff) * 8;
            let pte: u64 = self.v.guest_memory().read_obj(GuestAddress(slot)).unwrap();
            table = if pte & 1 != 0 {
                pte & !0xfff
            } else {
                let t = self.next_table;
                self.next_table += PAGE_SIZE;
                self.v
                    .guest_memory()
                    .write_obj(t | 3, GuestAddress(slot))
                    .unwrap();
                t
            };
        }
        let slot = table + ((va >> 12) & 0x1ff) * 8;
        self.v
            .guest_memory()
            .write_obj(gpa | 3, GuestAddress(slot))
            .unwrap();
    }

    /// Writes i915's request and the batch and submits the context on the blitter; runs it.
    fn submit(&mut self, batch: &[u32]) {
        self.queue(batch);
        self.v.run_until_idle();
    }

    /// Writes i915's request into the ring (its tail into the context image) and the batch,
    /// and submits the context on the blitter (queued: this guest has no interrupt handler, so
    /// the work waits for the engine to be run).
    fn queue(&mut self, batch: &[u32]) {
        let tl = (self.base + 4 * PAGE_SIZE) as u32;
        let ring: Vec<u32> = [
            &[0x0280_0000, 0][..],              // MI_ARB_CHECK, MI_NOOP
            &[0x1324_0002, 0xd0, 0, 0],         // MI_FLUSH_DW: invalidate TLB
            &[0x1040_0002, tl, 0, SEQNO - 1],   // initial breadcrumb (GGTT)
            &[0, 0x0280_0000, 0x0400_0000],     // MI_NOOP, MI_ARB_CHECK, arbitration off
            &[0x1880_0101, BATCH_VA as u32, 0], // MI_BATCH_BUFFER_START, PPGTT
            &[0x1300_4002, tl | 4, 0, SEQNO],   // final breadcrumb: MI_FLUSH_DW post-sync
            &[0x0100_0000, 0x0400_0001],        // MI_USER_INTERRUPT, arbitration on
        ]
        .concat();
        self.put(GGTT_RAM + 3 * PAGE_SIZE, &ring);
        let state = GGTT_RAM + PAGE_SIZE + lrc::STATE_OFFSET;
        self.put(state + 4 * lrc::RING_TAIL as u64, &[4 * ring.len() as u32]);
        self.put(BATCH_RAM, batch);
        let d = (u64::from(CTX_ID) << desc::CTX_ID_SHIFT)
            | (self.base + PAGE_SIZE)
            | (3 << desc::ADDRESSING_SHIFT)
            | desc::PRIVILEGE
            | desc::VALID;
        for dw in [0, 0, (d >> 32) as u32, d as u32] {
            self.v.mmio_write32(BCS + ring::ELSP, dw).unwrap();
        }
    }

    /// The framebuffer's pixel (x, y), through the reversed page mapping.
    fn pixel(&self, x: u32, y: u32) -> u32 {
        let off = u64::from(y * PITCH + x * 4);
        let page = off / PAGE_SIZE;
        self.get(FB_RAM + (3 - page) * PAGE_SIZE + off % PAGE_SIZE)
    }

    fn breadcrumb(&self) -> u32 {
        self.get(GGTT_RAM + 4 * PAGE_SIZE)
    }

    /// The last context-status event: (status, context id).
    fn last_csb(&self) -> (u32, u32) {
        let wp = self.v.mmio_read32(BCS + ring::CSB_PTR).unwrap() & 7;
        let lo = self.v.mmio_read32(BCS + ring::CSB + 8 * wp).unwrap();
        let hi = self.v.mmio_read32(BCS + ring::CSB + 8 * wp + 4).unwrap();
        (lo, hi)
    }
}

const XY_COLOR_BLT: u32 = 0x5430_0005;
const XY_SRC_COPY_BLT: u32 = 0x54f0_0008;
const BR13_FILL: u32 = 3 << 24 | 0xf0 << 16;
const BR13_COPY: u32 = 3 << 24 | 0xcc << 16;

fn fill(x1: u32, y1: u32, x2: u32, y2: u32, c: u32) -> [u32; 7] {
    [
        XY_COLOR_BLT,
        BR13_FILL | PITCH,
        y1 << 16 | x1,
        y2 << 16 | x2,
        FB_VA as u32,
        0,
        c,
    ]
}

/// What gmig-i915-blit's batches hold: fills, a copy from the sprite (above 512 GiB), a flush,
/// a store, the end.
fn user_batch() -> Vec<u32> {
    [
        &fill(0, 0, W, H, 0xff11_2233)[..],
        &fill(10, 2, 50, 10, 0xffaa_bbcc),
        &[
            XY_SRC_COPY_BLT,
            BR13_COPY | PITCH,
            4 << 16 | 200,
            12 << 16 | 232,
            FB_VA as u32,
            0,
            0,
            32 * 4,
            SPRITE_VA as u32,
            (SPRITE_VA >> 32) as u32,
        ],
        &[0x1300_0002, 0, 0, 0], // MI_FLUSH_DW, no post-sync
        &[0x1000_0002, STATUS_VA as u32 + 8, 0, 0xc0de_0001], // MI_STORE_DATA_IMM, PPGTT
        &[0x0500_0000, 0],
    ]
    .concat()
}

#[test]
fn an_i915_blitter_request_runs_its_ppgtt_batch() {
    let mut s = Setup::new();
    for i in 0..32 * 8 {
        s.put(SPRITE_RAM + 4 * i, &[0xff00_0000 | i as u32]);
    }
    s.submit(&user_batch());
    assert!(s.v.faults().is_empty(), "{:?}", s.v.faults());
    for (x, y, want) in [
        (0, 0, 0xff11_2233),
        (255, 15, 0xff11_2233),
        (10, 2, 0xffaa_bbcc),
        (49, 9, 0xffaa_bbcc),
        (50, 9, 0xff11_2233),
        (200, 4, 0xff00_0000),
        (231, 11, 0xff00_0000 | (7 * 32 + 31)),
        (232, 11, 0xff11_2233),
    ] {
        assert_eq!(s.pixel(x, y), want, "pixel ({x}, {y})");
    }
    assert_eq!(s.get(STATUS_RAM + 8), 0xc0de_0001, "the batch's store");
    assert_eq!(s.breadcrumb(), SEQNO, "the final breadcrumb");
    assert_eq!(
        s.last_csb(),
        (mmio::CSB_CTX_COMPLETE | mmio::CSB_ACTIVE_TO_IDLE, CTX_ID)
    );
    let (iir, shift) = EngineId::Blitter.irq_bank();
    let bits = s.v.mmio_read32(iir).unwrap() >> shift;
    assert_eq!(
        bits & (GT_USER_INTERRUPT | GT_CONTEXT_SWITCH_INTERRUPT),
        GT_USER_INTERRUPT | GT_CONTEXT_SWITCH_INTERRUPT
    );
    // The ring was consumed: the context image's head is the tail.
    let state = GGTT_RAM + PAGE_SIZE + lrc::STATE_OFFSET;
    assert_eq!(
        s.get(state + 4 * lrc::RING_HEAD as u64),
        s.get(state + 4 * lrc::RING_TAIL as u64)
    );
    // The PPGTT's tables and pages are GTT-backed (sent and hashed by a migration).
    let backed = s.v.gtt_backed_pages();
    for gpa in [TABLES, FB_RAM, SPRITE_RAM, BATCH_RAM, STATUS_RAM] {
        assert!(
            backed.iter().any(|g| g.0 == gpa / PAGE_SIZE),
            "{gpa:#x} not GTT-backed"
        );
    }
}

#[test]
fn a_ppgtt_batch_may_not_reach_the_ggtt() {
    // A store through the GGTT from a batch started in the PPGTT (unprivileged): the whole
    // request is refused before anything runs, and completes so that i915 goes on.
    let mut s = Setup::new();
    let target = (s.base + 5 * PAGE_SIZE) as u32;
    let mut batch = user_batch();
    let n = batch.len();
    batch[n - 2..].copy_from_slice(&[0x1040_0002, target]);
    batch.extend([0, 0xbad, 0x0500_0000, 0]);
    s.submit(&batch);
    let f = s.v.faults();
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, FaultKind::Audit, "{}", f[0].reason);
    assert!(
        f[0].reason.contains("GGTT from an unprivileged batch"),
        "{}",
        f[0].reason
    );
    assert_eq!(s.get(GGTT_RAM + 5 * PAGE_SIZE), 0, "the GGTT target");
    assert_eq!(s.pixel(0, 0), 0, "nothing of the request ran");
    assert_eq!(s.breadcrumb(), 0);
    assert_eq!(
        s.last_csb(),
        (mmio::CSB_CTX_COMPLETE | mmio::CSB_ACTIVE_TO_IDLE, CTX_ID)
    );
}

#[test]
fn a_ppgtt_entry_outside_guest_ram_faults_without_writing() {
    // The framebuffer's first page mapped past the end of guest RAM (8 MiB): the fill faults
    // there; the GPU writes no other memory through it and the context completes.
    let mut s = Setup::new();
    s.map(FB_VA, 1 << 30);
    s.submit(&[&fill(0, 0, 16, 1, 0xffff_ffff)[..], &[0x0500_0000, 0]].concat());
    let f = s.v.faults();
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, FaultKind::Memory, "{}", f[0].reason);
    assert!(
        f[0].reason.contains("0x40000000 is not backed"),
        "{}",
        f[0].reason
    );
    assert_eq!(s.get(FB_RAM + 3 * PAGE_SIZE), 0);
    assert_eq!(
        s.last_csb(),
        (mmio::CSB_CTX_COMPLETE | mmio::CSB_ACTIVE_TO_IDLE, CTX_ID)
    );
}

/// The request queued, the vGPU checkpointed and restored onto other slices (a migration's
/// destination): the rebased request runs there; its PPGTT batch is found through the root the
/// checkpoint carries. Without the rebase (the negative twin) its first GGTT write faults.
#[test]
fn a_queued_i915_request_runs_after_a_restore_onto_other_slices() {
    for remap in [true, false] {
        let mut s = Setup::new();
        s.queue(&user_batch());
        assert_eq!(s.v.queued(), 1);
        let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
        pm.place(VgpuType::V5_2).unwrap();
        let (_, dest) = pm
            .place_avoiding(VgpuType::V5_8, Some(&s.v.host_slices()))
            .unwrap();
        let ram = copy_guest_ram(s.v.guest_memory()).unwrap();
        s.v = Vgpu::restore(&s.v.save(), ram, dest, RestoreOptions { remap }).unwrap();
        assert_eq!(s.v.run_until_idle(), 1);
        if remap {
            assert!(s.v.faults().is_empty(), "{:?}", s.v.faults());
            assert_eq!(s.pixel(10, 2), 0xffaa_bbcc);
            assert_eq!(s.get(STATUS_RAM + 8), 0xc0de_0001);
            assert_eq!(s.breadcrumb(), SEQNO);
        } else {
            // The initial breadcrumb still names the source's slice, outside this vGPU's: the
            // engine faults there and runs nothing after it (the status page, not rebased
            // either, faults next).
            let f = s.v.faults();
            assert_eq!(f[0].kind, FaultKind::Memory, "{}", f[0].reason);
            assert!(f[0].reason.contains("(Ring)"), "{}", f[0].reason);
            assert_eq!(s.pixel(10, 2), 0);
            assert_eq!(s.breadcrumb(), 0);
        }
        assert_eq!(
            s.last_csb(),
            (mmio::CSB_CTX_COMPLETE | mmio::CSB_ACTIVE_TO_IDLE, CTX_ID)
        );
    }
}

/// Where i915 6.1 puts its flushes' scratch writes: dword 0x34 of the per-process status page
/// (`LRC_PPHWSP_SCRATCH_ADDR`), the first page of the context image.
const PPHWSP_SCRATCH: u32 = 0xd0;
/// A page the PPGTT maps at address 0, where a post-sync write that ignores "store data
/// index" would land.
const VA0_RAM: u64 = 6 << 20;

#[test]
fn store_data_index_writes_land_in_the_contexts_status_page() {
    let mut s = Setup::new();
    s.map(0, VA0_RAM);
    let mut batch = user_batch();
    let n = batch.len();
    batch.truncate(n - 2);
    batch.extend([
        // MI_FLUSH_DW, post-sync write, store data index: i915's flush on the blitter.
        0x1320_4002,
        PPHWSP_SCRATCH,
        0,
        0xfeed_0001,
        // MI_STORE_DATA_INDEX, per-process page, dword 0x40 (IGT's spinners, gem_wsim).
        0x10a0_0001,
        0x100,
        0xfeed_0002,
        0x0500_0000,
        0,
    ]);
    s.submit(&batch);
    assert!(s.v.faults().is_empty(), "{:?}", s.v.faults());
    let pphwsp = GGTT_RAM + PAGE_SIZE;
    assert_eq!(s.get(pphwsp + u64::from(PPHWSP_SCRATCH)), 0xfeed_0001);
    assert_eq!(s.get(pphwsp + 0x100), 0xfeed_0002);
    for off in [PPHWSP_SCRATCH, 0x100] {
        assert_eq!(
            s.get(VA0_RAM + u64::from(off)),
            0,
            "an index was used as a PPGTT address"
        );
    }
    assert_eq!(s.breadcrumb(), SEQNO, "the request completed");
    // The status page is in the candidate set: nothing else names it.
    let log = s.v.take_write_log();
    assert!(log.candidate.contains(&crate::gm::Gfn(pphwsp / PAGE_SIZE)));
}

#[test]
fn a_user_batch_may_not_index_the_engines_global_status_page() {
    // MI_STORE_DATA_INDEX without "per-process" writes the engine's own page (i915's kernel
    // state): refused from a PPGTT batch, as past the page's end is from anywhere.
    for (cmd, what) in [
        ([0x1080_0001, 0x300, 0xbad], "global status page"),
        ([0x10a0_0001, 0x1000, 0xbad], "past the page's end"),
    ] {
        let mut s = Setup::new();
        let mut batch = user_batch();
        let n = batch.len();
        batch.truncate(n - 2);
        batch.extend(cmd);
        batch.extend([0x0500_0000, 0]);
        s.submit(&batch);
        let f = s.v.faults();
        assert_eq!(f.len(), 1, "{what}: {f:?}");
        assert_eq!(f[0].kind, FaultKind::Audit, "{what}: {}", f[0].reason);
        assert_eq!(
            s.get(GGTT_RAM + 0x300),
            0,
            "{what}: the global page was written"
        );
        assert_eq!(s.pixel(0, 0), 0, "{what}: nothing of the request ran");
    }
}

/// A user batch of `cmds` (after the usual fills) ending the batch, run on the blitter.
fn run_batch(cmds: &[u32]) -> Setup {
    let mut s = Setup::new();
    let mut batch = user_batch();
    let n = batch.len();
    batch.truncate(n - 2);
    batch.extend(cmds);
    batch.extend([0x0500_0000, 0]);
    s.submit(&batch);
    assert!(s.v.faults().is_empty(), "{:?}", s.v.faults());
    s
}

const GPR0: u32 = BCS + 0x600;
const LRI1: u32 = 0x1100_0001;
const SRM_PPGTT: u32 = 0x1200_0002;

#[test]
fn register_commands_and_mi_math_run_on_the_engines_gprs() {
    let srm = |reg: u32, off: u32| [SRM_PPGTT, reg, STATUS_VA as u32 + off, 0];
    let s = run_batch(
        &[
            // GPR0 = 0xffff_fff0_0000_0005, GPR1 = 0x10 (LRI), GPR2 = GPR1 (LRR).
            &[LRI1, GPR0, 5][..],
            &[LRI1, GPR0 + 4, 0xffff_fff0],
            &[LRI1, GPR0 + 8, 0x10],
            &[0x1500_0001, GPR0 + 8, GPR0 + 16],
            // MI_MATH: GPR3 = GPR0 + GPR2 (carry out of the top), GPR4 = CF, GPR5 = GPR2 ^ GPR2
            // and GPR6 = ZF.
            &[
                0x0d00_000a,
                0x0800_8000, // LOAD SRCA, R0
                0x0800_8402, // LOAD SRCB, R2
                0x1000_0000, // ADD
                0x1800_0c31, // STORE R3, ACCU
                0x1800_1033, // STORE R4, CF
                0x0800_8002, // LOAD SRCA, R2
                0x0800_8402, // LOAD SRCB, R2
                0x1040_0000, // XOR
                0x1800_1431, // STORE R5, ACCU
                0x1800_1832, // STORE R6, ZF
                0x5800_1c02, // STOREINV R7, R2
            ],
            // Store them to memory (SRM), and load one back from memory (LRM).
            &srm(GPR0 + 24, 0x40),
            &srm(GPR0 + 28, 0x44),
            &srm(GPR0 + 32, 0x48),
            &srm(GPR0 + 40, 0x4c),
            &srm(GPR0 + 48, 0x50),
            &srm(GPR0 + 56, 0x54),
            &[0x1480_0002, GPR0 + 64, STATUS_VA as u32 + 0x40, 0],
            &srm(GPR0 + 64, 0x58),
        ]
        .concat(),
    );
    let at = |off: u64| s.get(STATUS_RAM + off);
    // 0xffff_fff0_0000_0005 + 0x10 = 0xffff_fff0_0000_0015, no carry.
    assert_eq!((at(0x40), at(0x44)), (0x15, 0xffff_fff0), "ADD");
    assert_eq!(at(0x48), 0, "CF");
    assert_eq!(at(0x4c), 0, "XOR");
    assert_eq!(at(0x50), u32::MAX, "ZF as all ones");
    assert_eq!(at(0x54), !0x10, "STOREINV");
    assert_eq!(at(0x58), 0x15, "LRM then SRM");
    // The registers the batch wrote are the device's now.
    assert_eq!(s.v.mmio_read32(GPR0 + 8).unwrap(), 0x10);
    assert_eq!(s.v.mmio_read32(GPR0 + 16).unwrap(), 0x10);
}

#[test]
fn a_conditional_batch_end_ends_the_batch_when_its_dword_is_at_most_the_data() {
    // IGT's spinner test: compare the condition dword with MI_BATCH_BUFFER_END.
    const CONDITION: u32 = STATUS_VA as u32 + 0x80;
    let cond_end = [0x1b20_0002, 0x0500_0000, CONDITION, 0];
    let store = |v: u32| [0x1000_0002, STATUS_VA as u32 + 0x84, 0, v];
    for (condition, ends) in [(0x1880_0101, false), (0x0500_0000, true)] {
        let mut s = Setup::new();
        s.put(STATUS_RAM + 0x80, &[condition]);
        let mut batch = user_batch();
        let n = batch.len();
        batch.truncate(n - 2);
        batch.extend(store(1));
        batch.extend(cond_end);
        batch.extend(store(2));
        batch.extend([0x0500_0000, 0]);
        s.submit(&batch);
        assert!(s.v.faults().is_empty(), "{:?}", s.v.faults());
        let want = if ends { 1 } else { 2 };
        assert_eq!(s.get(STATUS_RAM + 0x84), want, "condition {condition:#x}");
        // Only the batch ended: the ring's final breadcrumb ran.
        assert_eq!(s.breadcrumb(), SEQNO, "condition {condition:#x}");
    }
}

#[test]
fn a_semaphore_wait_holds_the_workload_until_its_dword_is_written() {
    const SEMA: u32 = STATUS_VA as u32 + 0xc0;
    // Poll mode, "equal": wait until the dword is 7.
    let wait = [0x0e00_c002, 7, SEMA, 0];
    let store = [0x1000_0002, STATUS_VA as u32 + 0xc4, 0, 9];
    let mut s = Setup::new();
    let mut batch = user_batch();
    let n = batch.len();
    batch.truncate(n - 2);
    batch.extend(wait);
    batch.extend(store);
    batch.extend([0x0500_0000, 0]);
    s.submit(&batch);
    assert!(s.v.faults().is_empty(), "{:?}", s.v.faults());
    assert_eq!(s.get(STATUS_RAM + 0xc4), 0, "ran past an unmet semaphore");
    assert_eq!(s.breadcrumb(), SEQNO - 1, "the request completed");
    assert_eq!(s.v.queued(), 1);
    // The CPU signals; the engine goes on from the wait.
    s.put(STATUS_RAM + 0xc0, &[7]);
    assert_eq!(s.v.run_until_idle(), 1);
    assert_eq!(s.get(STATUS_RAM + 0xc4), 9);
    assert_eq!(s.breadcrumb(), SEQNO);
}

#[test]
fn an_igt_spinner_spins_until_the_cpu_ends_it() {
    // igt_spin's batch on GEN9: arbitration, some padding, a conditional end comparing its
    // condition dword with MI_BATCH_BUFFER_END, and a start of itself (PPGTT).
    const CONDITION: u32 = STATUS_VA as u32 + 0x100;
    let mut s = Setup::new();
    s.put(STATUS_RAM + 0x100, &[0x1880_0101]);
    let spin: Vec<u32> = [
        &[0x0280_0000, 0, 0, 0][..],
        &[0x1b20_0002, 0x0500_0000, CONDITION, 0],
        &[0x1880_0101, BATCH_VA as u32, 0],
    ]
    .concat();
    s.queue(&spin);
    for _ in 0..4 {
        s.v.run_until_idle();
    }
    assert!(s.v.faults().is_empty(), "{:?}", s.v.faults());
    assert_eq!(s.v.queued(), 1, "the spinner ended by itself");
    assert_eq!(
        s.breadcrumb(),
        SEQNO - 1,
        "the request completed while spinning"
    );
    // igt_spin_end(): the CPU writes MI_BATCH_BUFFER_END into the condition.
    s.put(STATUS_RAM + 0x100, &[0x0500_0000]);
    assert_eq!(s.v.run_until_idle(), 1);
    assert_eq!(s.breadcrumb(), SEQNO, "the final breadcrumb after the loop");
    assert_eq!(
        s.last_csb(),
        (mmio::CSB_CTX_COMPLETE | mmio::CSB_ACTIVE_TO_IDLE, CTX_ID)
    );
}

#[test]
fn a_post_sync_address_cut_off_by_the_length_writes_nothing() {
    // MI_FLUSH_DW with a timestamp post-sync and a length of 2 dwords: its address would run
    // past the command, so the parser neither audits nor rebases it and the engine must not
    // write through it (fuzz finding 4: the engine wrote a page the write set did not name).
    // A store data immediate of 2 dwords likewise carries no address.
    let mut s = Setup::new();
    s.put(STATUS_RAM + 0x10, &[0x5eed_0001, 0x5eed_0002]);
    let mut batch = user_batch();
    let n = batch.len();
    batch.truncate(n - 2);
    batch.extend([0x1300_c000, STATUS_VA as u32 + 0x10]);
    batch.extend([0x1000_0000, STATUS_VA as u32 + 0x14]);
    batch.extend([0x0500_0000, 0]);
    s.submit(&batch);
    assert!(s.v.faults().is_empty(), "{:?}", s.v.faults());
    assert_eq!(s.breadcrumb(), SEQNO, "the request completed");
    assert_eq!(s.get(STATUS_RAM + 0x10), 0x5eed_0001, "the flush wrote");
    assert_eq!(s.get(STATUS_RAM + 0x14), 0x5eed_0002, "the store wrote");
    let log = s.v.take_write_log();
    let missed: Vec<_> = log.actual.difference(&log.candidate).collect();
    assert!(
        missed.is_empty(),
        "written outside the write set: {missed:?}"
    );
}

#[test]
fn a_negative_blit_pitch_runs_rows_upwards_within_the_write_set() {
    // BR13's pitch is a signed 16-bit field: with -PITCH from the last row's address, row y of
    // the fill lands y rows above it, where the parser's write set puts it (fuzz finding 4: the
    // engine read the field unsigned and wrote pages 13 apart that the write set did not name).
    let up = PITCH.wrapping_neg() & 0xffff;
    let last_row = FB_VA as u32 + (H - 1) * PITCH;
    let s = run_batch(&[
        XY_COLOR_BLT,
        BR13_FILL | up,
        0,
        4 << 16 | 8,
        last_row,
        0,
        0xff44_5566,
    ]);
    for (x, y, want) in [
        (0, H - 1, 0xff44_5566),
        (7, H - 4, 0xff44_5566),
        (8, H - 1, 0xff11_2233),
        (0, H - 5, 0xff11_2233),
        (0, 0, 0xff11_2233),
    ] {
        assert_eq!(s.pixel(x, y), want, "pixel ({x}, {y})");
    }
    let mut s = s;
    let log = s.v.take_write_log();
    let missed: Vec<_> = log.actual.difference(&log.candidate).collect();
    assert!(
        missed.is_empty(),
        "written outside the write set: {missed:?}"
    );
}
