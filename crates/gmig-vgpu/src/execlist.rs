//! Execlist submission as GEN8/GEN9 hardware does it: four ELSP writes make a submission of one
//! or two contexts; the engine reports each switch as a context-status (CSB) event, in the CSB
//! registers and mirrored into the engine's hardware status page with the write pointer, and
//! raises the context-switch interrupt. Engine and whole-GPU resets clear what the engine holds.
//!
//! Events follow what i915's `process_csb()` expects on GEN8/GEN9 (and what GVT-g's
//! `execlist.c` emulates):
//! - a submission to an idle engine: *idle to active*;
//! - a submission while contexts run: *preempted* (with *lite restore* when it resubmits the
//!   running context); the contexts it replaces switch out without another event (their queued
//!   work still runs, in order, as a lite restore's ring tail covers it);
//! - each submitted context whose work completes: *context complete* with *element switch* when
//!   the second element follows, *active to idle* after the last.
//!
//! A refused context (the audit, a flood) completes at once, in its place in that order.

use gmig_cmdparser::GgttOffset;

use crate::mmio::{self, desc, lrc, ring, EngineId};
use crate::regs::table::GT_CONTEXT_SWITCH_INTERRUPT;
use crate::vgpu::{Result, Vgpu, VgpuError, MAX_PENDING_PER_ENGINE};
use crate::work::{FaultKind, GpuFault, Port};

/// `GEN6_GDRST` domain bits: the whole GPU, then each engine.
const GRDOM_FULL: u32 = 1 << 0;
const GRDOM_RENDER: u32 = 1 << 1;
const GRDOM_MEDIA: u32 = 1 << 2;
const GRDOM_BLT: u32 = 1 << 3;
const GRDOM_VECS: u32 = 1 << 4;

/// Engine registers a reset returns to their reset values (relative to the engine's base).
const RESET_REGS: [u32; 7] = [
    ring::TAIL,
    ring::HEAD,
    ring::START,
    ring::CTL,
    0x9c, // RING_MI_MODE
    ring::MODE,
    ring::CSB_PTR,
];

impl Vgpu {
    /// One ELSP write; the fourth makes a submission (element 1 high, low, element 0 high,
    /// low). Element 0 runs first; a submission whose element 0 is not valid is ignored.
    pub(crate) fn elsp_write(&mut self, engine: EngineId, value: u32) -> Result<()> {
        if !self.accepting {
            return Err(VgpuError::Paused(engine.name()));
        }
        let st = &mut self.engines[engine.index()];
        st.elsp.push(value);
        if st.elsp.len() < 4 {
            return Ok(());
        }
        let w = std::mem::take(&mut st.elsp);
        let e1 = (u64::from(w[0]) << 32) | u64::from(w[1]);
        let e0 = (u64::from(w[2]) << 32) | u64::from(w[3]);
        if e0 & desc::VALID == 0 {
            return Ok(());
        }
        self.schedule_in(engine, e0);
        for d in [e0, e1] {
            if d & desc::VALID != 0 {
                let port = self.submit(engine, d);
                self.engines[engine.index()].running.push(port);
            }
        }
        self.retire_refused(engine);
        Ok(())
    }

    /// The event of a new submission: idle to active, or preempted (lite restore when element
    /// 0 is the context running now).
    fn schedule_in(&mut self, engine: EngineId, e0: u64) {
        let st = &mut self.engines[engine.index()];
        let (status, ctx_id) = match st.running.first() {
            None => (mmio::CSB_IDLE_TO_ACTIVE, 0),
            Some(p) => {
                let lite = if p.lrca == e0 & desc::LRCA_MASK {
                    mmio::CSB_LITE_RESTORE
                } else {
                    0
                };
                (mmio::CSB_PREEMPTED | lite, p.ctx_id)
            }
        };
        st.running.clear();
        self.csb_event(engine, status, ctx_id);
    }

    /// Walks, audits and queues one submitted context; a refused one is reported and its ring
    /// consumed (it completes at once, see [`Vgpu::retire_refused`]).
    fn submit(&mut self, engine: EngineId, d: u64) -> Port {
        let seq = self.next_seq;
        self.next_seq += 1;
        let lrca_guest = d & desc::LRCA_MASK;
        let ctx_id = (d >> desc::CTX_ID_SHIFT) as u32;
        let pending = self.queue.iter().filter(|w| w.engine == engine).count();
        let shadowed = if pending >= MAX_PENDING_PER_ENGINE {
            // Refused before any shadowing work: a flood costs the host O(1) per ELSP write.
            Err((
                FaultKind::Flood,
                format!("{pending} submissions already pending on {}", engine.name()),
            ))
        } else {
            crate::shadow::shadow_workload(self, engine, d, seq)
        };
        let seq = match shadowed {
            Ok(w) => {
                self.ctx_heads.insert(lrca_guest, w.ring_tail);
                if let Some(r) = w.pml4 {
                    self.ppgtt_roots.insert(r);
                }
                self.queue.push_back(w);
                Some(seq)
            }
            Err((kind, reason)) => {
                self.report_fault(GpuFault {
                    engine,
                    ctx_id,
                    kind,
                    reason,
                });
                // The refused context is completed (its ring consumed) so the guest can go on.
                let lrca = self.guest_to_host().rebase(GgttOffset(lrca_guest));
                let tail = self.read_ctx_state(lrca, lrc::RING_TAIL);
                if let (Some(l), Some(t)) = (lrca, tail) {
                    self.write_ctx_state(l, lrc::RING_HEAD, t);
                    // Work still queued for the context would make the next submission a lite
                    // restore: it must start past the refused commands too.
                    if let Some(h) = self.ctx_heads.get_mut(&lrca_guest) {
                        *h = t & 0x001f_fff8;
                    }
                }
                None
            }
        };
        Port {
            seq,
            ctx_id,
            lrca: lrca_guest,
        }
    }

    /// The workload `seq` on `engine` finished: if it is the element the engine runs, the
    /// context switches out (a context replaced by a later submission already did).
    pub(crate) fn switch_out(&mut self, engine: EngineId, seq: u64) {
        let st = &mut self.engines[engine.index()];
        if st.running.first().and_then(|p| p.seq) != Some(seq) {
            return;
        }
        let p = st.running.remove(0);
        self.context_complete(engine, p.ctx_id);
        self.retire_refused(engine);
    }

    /// Completes refused elements at the head of the running list.
    fn retire_refused(&mut self, engine: EngineId) {
        while let Some(p) = self.engines[engine.index()]
            .running
            .first()
            .filter(|p| p.seq.is_none())
            .cloned()
        {
            self.engines[engine.index()].running.remove(0);
            self.context_complete(engine, p.ctx_id);
        }
    }

    fn context_complete(&mut self, engine: EngineId, ctx_id: u32) {
        let st = &mut self.engines[engine.index()];
        st.completed += 1;
        let next = if st.running.is_empty() {
            mmio::CSB_ACTIVE_TO_IDLE
        } else {
            mmio::CSB_ELEMENT_SWITCH
        };
        self.csb_event(engine, mmio::CSB_CTX_COMPLETE | next, ctx_id);
    }

    /// Writes one context-status event: the next CSB entry (registers and status page), the
    /// write pointer (register and status page), then the context-switch interrupt.
    pub(crate) fn csb_event(&mut self, engine: EngineId, status: u32, ctx_id: u32) {
        let gen = self.cfg.gen;
        let base = engine.mmio_base_for(gen);
        let ptr_reg = base + ring::CSB_PTR;
        let ptr = self.reg_value(ptr_reg);
        let entries = mmio::csb_entries(gen);
        let wp_mask = if entries > 8 { 0xf } else { 0x7 };
        let wp = ptr & wp_mask;
        // After a reset the pointer reads 7 ("none written"): the first event goes to entry 0.
        let next = if wp >= entries { 0 } else { (wp + 1) % entries };
        if next < mmio::CSB_ENTRIES {
            self.vregs.insert(base + ring::CSB + 8 * next, status);
            self.vregs.insert(base + ring::CSB + 8 * next + 4, ctx_id);
        }
        self.vregs.insert(ptr_reg, (ptr & !wp_mask) | next);
        self.vregs.insert(
            base + ring::EXECLIST_STATUS,
            (ctx_id & 0xffff) << 16 | 1 << 12,
        );
        if let Some(hws) = self
            .sregs
            .get(&(base + ring::HWS_PGA))
            .copied()
            .filter(|h| *h != 0)
        {
            let page = u64::from(hws & 0xffff_f000);
            let mut entry = [0u8; 8];
            entry[..4].copy_from_slice(&status.to_le_bytes());
            entry[4..].copy_from_slice(&ctx_id.to_le_bytes());
            let writes = [
                (
                    page + 4 * u64::from(mmio::HWS_CSB_INDEX + 2 * next),
                    &entry[..],
                ),
                (
                    page + 4 * u64::from(mmio::hws_csb_write_index(gen)),
                    &next.to_le_bytes()[..],
                ),
            ];
            for (addr, bytes) in writes {
                let mut pages = Vec::new();
                let r =
                    self.host_view(None)
                        .write(crate::gtt::Space::Ggtt, addr, bytes, &mut pages);
                // The status page is written by the hardware, not by a command: always dirty.
                self.write_log.actual.extend(pages.iter().copied());
                self.write_log.candidate.extend(pages);
                if let Err(e) = r {
                    self.report_fault(GpuFault {
                        engine,
                        ctx_id,
                        kind: FaultKind::Memory,
                        reason: format!("status page write: {e}"),
                    });
                    break;
                }
            }
        }
        self.raise_engine_irq(engine, GT_CONTEXT_SWITCH_INTERRUPT);
    }

    /// `GEN6_GDRST` written with `domains`: each engine in them is reset at once.
    /// A device (function-level) reset of every engine: queued work dropped, execlists and
    /// half-written ELSP submissions cleared, ring and CSB registers at their reset values.
    pub fn reset_engines(&mut self) {
        self.graphics_reset(GRDOM_FULL);
    }

    /// A device-level reset (FLR, or the VMM's device reset), as GVT-g resets a vGPU with
    /// `dmlr` set: every engine reset, the GGTT invalidated, every register (fences, status
    /// pages, interrupts, display) back to its reset value, the PPGTTs the guest announced
    /// forgotten. What stays is what belongs to the host: the vGPU's slices and its guest
    /// memory, and the counters and fault records the host reads.
    pub fn device_reset(&mut self) {
        self.reset_engines();
        self.ggtt = crate::gtt::Ggtt::new(&self.host);
        self.vregs.clear();
        self.sregs.clear();
        self.ppgtt_roots.clear();
        self.ctx_heads.clear();
        self.live = None;
        self.accepting = true;
    }

    pub(crate) fn graphics_reset(&mut self, domains: u32) {
        for e in EngineId::ALL {
            let bit = match e {
                EngineId::Render => GRDOM_RENDER,
                EngineId::Blitter => GRDOM_BLT,
                EngineId::Video => GRDOM_MEDIA,
                EngineId::VideoEnhance => GRDOM_VECS,
            };
            if domains & (GRDOM_FULL | bit) != 0 {
                self.reset_engine(e);
            }
        }
    }

    /// An engine reset: its queued work is dropped, its execlist emptied, its ring, mode and
    /// CSB registers back to their reset values. The status page address stays (i915 writes it
    /// again on resume).
    fn reset_engine(&mut self, engine: EngineId) {
        let before = self.queue.len();
        self.queue.retain(|w| w.engine != engine);
        let dropped = before - self.queue.len();
        if dropped > 0 {
            tracing::info!(
                engine = engine.name(),
                dropped,
                "engine reset dropped queued work"
            );
        }
        self.forget_idle_heads();
        let st = &mut self.engines[engine.index()];
        st.elsp.clear();
        st.running.clear();
        let base = engine.mmio_base_for(self.cfg.gen);
        for rel in RESET_REGS {
            self.vregs.remove(&(base + rel));
        }
        for i in 0..2 * mmio::CSB_ENTRIES {
            self.vregs.remove(&(base + ring::CSB + 4 * i));
        }
        self.vregs.remove(&(base + ring::EXECLIST_STATUS));
    }
}

#[cfg(test)]
mod tests {
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::gm::PAGE_SIZE;

    /// A vGPU whose hidden slice's first 8 pages map guest RAM from 1 MiB up, with the render
    /// engine's status page in page 0 and, per context `i` (0..2), an image at page 1 + 2i with
    /// an empty ring in page 5 + i. Returns the vGPU and the slice base.
    fn setup() -> (Vgpu, u64) {
        let mut v = crate::vgpu::lone_test_vgpu(1, 8 << 20);
        let base = v.host_slices().hidden.base.0;
        for p in 0..8 {
            let e = mmio::GTT_MMIO_BASE + ((base / PAGE_SIZE + p) * 8) as u32;
            v.mmio_write64(e, ((1 << 20) + p * PAGE_SIZE) | 1).unwrap();
        }
        v.mmio_write32(0x2000 + ring::HWS_PGA, base as u32).unwrap();
        for i in 0..2u64 {
            let state = (1 << 20) + (1 + 2 * i) * PAGE_SIZE + lrc::STATE_OFFSET;
            let put = |idx: usize, val: u32| {
                v.guest_memory()
                    .write_obj(val, GuestAddress(state + 4 * idx as u64))
                    .unwrap();
            };
            put(lrc::RING_START, (base + (5 + i) * PAGE_SIZE) as u32);
            put(lrc::RING_CTL, 1);
        }
        (v, base)
    }

    fn desc(base: u64, ctx: u64, id: u32) -> u64 {
        (u64::from(id) << 32) | (base + (1 + 2 * ctx) * PAGE_SIZE) | (1 << 3) | (1 << 8) | 1
    }

    fn elsp(v: &mut Vgpu, e0: u64, e1: u64) {
        for d in [e1 >> 32, e1, e0 >> 32, e0] {
            v.mmio_write32(0x2000 + ring::ELSP, d as u32).unwrap();
        }
    }

    /// The last `count` CSB events (register entries, checked against the status page), and the
    /// write pointer.
    fn events(v: &Vgpu, base: u64, count: u32) -> (Vec<(u32, u32)>, u32) {
        let wp = v.mmio_read32(0x2000 + ring::CSB_PTR).unwrap() & 7;
        let mut out = Vec::new();
        for k in 0..count {
            let i = (wp + mmio::CSB_ENTRIES - (count - 1 - k)) % mmio::CSB_ENTRIES;
            let lo = v.mmio_read32(0x2000 + ring::CSB + 8 * i).unwrap();
            let hi = v.mmio_read32(0x2000 + ring::CSB + 8 * i + 4).unwrap();
            // The status page mirrors the registers, with the write pointer.
            let hws = (1 << 20) + 4 * u64::from(mmio::HWS_CSB_INDEX + 2 * i);
            let mirrored: u64 = v.guest_memory().read_obj(GuestAddress(hws)).unwrap();
            assert_eq!(mirrored, u64::from(lo) | (u64::from(hi) << 32));
            out.push((lo, hi));
        }
        let hws_wp: u32 = v
            .guest_memory()
            .read_obj(GuestAddress((1 << 20) + 4 * 0x1f))
            .unwrap();
        assert_eq!(
            hws_wp, wp,
            "write pointer in the status page (base {base:#x})"
        );
        (out, wp)
    }

    const DONE_IDLE: u32 = mmio::CSB_CTX_COMPLETE | mmio::CSB_ACTIVE_TO_IDLE;

    #[test]
    fn a_submission_goes_idle_to_active_then_complete_to_idle_with_interrupts() {
        let (mut v, base) = setup();
        assert_eq!(v.mmio_read32(0x2000 + ring::CSB_PTR).unwrap(), 0x0707);
        elsp(&mut v, desc(base, 0, 5), 0);
        assert_eq!(
            events(&v, base, 1),
            (vec![(mmio::CSB_IDLE_TO_ACTIVE, 0)], 0)
        );
        assert_eq!(
            v.mmio_read32(mmio::GT_IIR0).unwrap(),
            1 << 8,
            "context switch"
        );
        let irqs = v.interrupts_raised();
        v.mmio_write32(mmio::GT_IIR0, !0).unwrap();
        assert_eq!(v.run_until_idle(), 1);
        assert_eq!(events(&v, base, 1), (vec![(DONE_IDLE, 5)], 1));
        assert_eq!(v.interrupts_raised(), irqs + 1);
        // i915 resets its pointers to 5 (the last entry): the next event goes to entry 0.
        v.mmio_write32(0x2000 + ring::CSB_PTR, 0xffff_0505).unwrap();
        elsp(&mut v, desc(base, 1, 6), 0);
        assert_eq!(events(&v, base, 1).1, 0);
    }

    #[test]
    fn two_elements_switch_then_go_idle() {
        let (mut v, base) = setup();
        elsp(&mut v, desc(base, 0, 5), desc(base, 1, 6));
        assert_eq!(v.run_until_idle(), 2);
        let (ev, _) = events(&v, base, 3);
        assert_eq!(
            ev,
            vec![
                (mmio::CSB_IDLE_TO_ACTIVE, 0),
                (mmio::CSB_CTX_COMPLETE | mmio::CSB_ELEMENT_SWITCH, 5),
                (DONE_IDLE, 6),
            ]
        );
    }

    #[test]
    fn a_resubmission_while_running_is_a_lite_restore_and_only_it_completes() {
        let (mut v, base) = setup();
        elsp(&mut v, desc(base, 0, 5), 0);
        elsp(&mut v, desc(base, 0, 5), 0);
        assert_eq!(v.run_until_idle(), 2);
        let (ev, _) = events(&v, base, 3);
        assert_eq!(
            ev,
            vec![
                (mmio::CSB_IDLE_TO_ACTIVE, 0),
                (mmio::CSB_PREEMPTED | mmio::CSB_LITE_RESTORE, 5),
                (DONE_IDLE, 5),
            ]
        );
    }

    #[test]
    fn a_refused_context_completes_in_its_place() {
        let (mut v, base) = setup();
        // Element 0 outside the vGPU's slices: refused, completes at once; element 1 runs.
        elsp(&mut v, (7 << 32) | 0x1000 | (1 << 8) | 1, desc(base, 1, 6));
        assert_eq!(v.faults().len(), 1);
        let (ev, _) = events(&v, base, 2);
        assert_eq!(
            ev,
            vec![
                (mmio::CSB_IDLE_TO_ACTIVE, 0),
                (mmio::CSB_CTX_COMPLETE | mmio::CSB_ELEMENT_SWITCH, 7),
            ]
        );
        assert_eq!(v.run_until_idle(), 1);
        assert_eq!(events(&v, base, 1).0, vec![(DONE_IDLE, 6)]);
    }

    #[test]
    fn gdrst_resets_the_engines_asked_for_and_self_clears() {
        let (mut v, base) = setup();
        elsp(&mut v, desc(base, 0, 5), 0);
        v.mmio_write32(0x2000 + ring::TAIL, 0x40).unwrap();
        assert_eq!(v.queued(), 1);
        // Blitter only: the render engine keeps its work.
        v.mmio_write32(0x941c, GRDOM_BLT).unwrap();
        assert_eq!(v.queued(), 1);
        assert_eq!(v.mmio_read32(0x941c).unwrap(), 0, "self-clearing");
        v.mmio_write32(0x941c, GRDOM_RENDER).unwrap();
        assert_eq!(v.queued(), 0);
        assert_eq!(v.mmio_read32(0x2000 + ring::TAIL).unwrap(), 0);
        assert_eq!(v.mmio_read32(0x2000 + ring::CSB_PTR).unwrap(), 0x0707);
        assert!(v.engines[0].running.is_empty());
        // The next submission starts from idle again.
        elsp(&mut v, desc(base, 0, 5), 0);
        assert_eq!(events(&v, base, 1).0, vec![(mmio::CSB_IDLE_TO_ACTIVE, 0)]);
    }

    /// Writes `ring` dwords at the start of context `ctx`'s ring page and sets its image's
    /// `RING_HEAD`/`RING_TAIL` to `head` and the ring's end, as i915 does for a new context.
    fn program(v: &mut Vgpu, ctx: u64, head: u32, ring: &[u32]) -> u32 {
        let ring_at = (1 << 20) + (5 + ctx) * PAGE_SIZE;
        for (i, d) in ring.iter().enumerate() {
            v.guest_memory()
                .write_obj(*d, GuestAddress(ring_at + 4 * i as u64))
                .unwrap();
        }
        let state = (1 << 20) + (1 + 2 * ctx) * PAGE_SIZE + lrc::STATE_OFFSET;
        let tail = 4 * ring.len() as u32;
        for (idx, val) in [(lrc::RING_HEAD, head), (lrc::RING_TAIL, tail)] {
            v.guest_memory()
                .write_obj(val, GuestAddress(state + 4 * idx as u64))
                .unwrap();
        }
        tail
    }

    /// `MI_STORE_DATA_IMM` through the GGTT of `value` into page 7 of the hidden slice.
    fn store(base: u64, value: u32) -> [u32; 4] {
        [0x1040_0002, (base + 7 * PAGE_SIZE) as u32, 0, value]
    }

    fn stored(v: &Vgpu) -> u32 {
        v.guest_memory()
            .read_obj(GuestAddress((1 << 20) + 7 * PAGE_SIZE))
            .unwrap()
    }

    #[test]
    fn a_new_context_at_a_freed_contexts_address_runs_from_its_images_head() {
        let (mut v, base) = setup();
        program(&mut v, 0, 0, &store(base, 0x11));
        elsp(&mut v, desc(base, 0, 5), 0);
        assert_eq!(v.run_until_idle(), 1);
        assert_eq!(stored(&v), 0x11);
        assert!(v.ctx_heads.is_empty(), "a completed context keeps a head");
        // i915 frees the context and makes a new one in the same pages: a fresh ring whose
        // image says head 0. The hardware takes the head from the image.
        program(&mut v, 0, 0, &store(base, 0x22));
        elsp(&mut v, desc(base, 0, 9), 0);
        assert_eq!(v.run_until_idle(), 1);
        assert_eq!(stored(&v), 0x22, "the new context's commands did not run");
        assert!(v.faults().is_empty(), "{:?}", v.faults());
    }

    #[test]
    fn a_lite_restore_of_a_pending_context_walks_only_the_new_commands() {
        let (mut v, base) = setup();
        let first = store(base, 0x11);
        program(&mut v, 0, 0, &first);
        elsp(&mut v, desc(base, 0, 5), 0);
        // Before it runs, i915 appends to the ring and resubmits: the image still says head 0
        // (the hardware writes it back when the context switches out), the lite restore
        // continues from the tail submitted before.
        let both: Vec<u32> = first.iter().chain(&store(base, 0x22)).copied().collect();
        program(&mut v, 0, 0, &both);
        elsp(&mut v, desc(base, 0, 5), 0);
        let lens: Vec<usize> = v.queue.iter().map(|w| w.commands.len()).collect();
        assert_eq!(lens, vec![1, 1], "each submission's own commands");
        assert_eq!(v.run_until_idle(), 2);
        assert_eq!(stored(&v), 0x22);
        assert!(v.ctx_heads.is_empty());
    }

    #[test]
    fn a_reset_forgets_the_heads_of_the_work_it_drops() {
        let (mut v, base) = setup();
        program(&mut v, 0, 0, &store(base, 0x11));
        elsp(&mut v, desc(base, 0, 5), 0);
        assert_eq!(v.ctx_heads.len(), 1);
        v.mmio_write32(0x941c, GRDOM_RENDER).unwrap();
        assert!(
            v.ctx_heads.is_empty(),
            "a reset kept a dropped context's head"
        );
        // After the reset i915 rewrites the image (head 0) and submits again: the work runs.
        program(&mut v, 0, 0, &store(base, 0x33));
        elsp(&mut v, desc(base, 0, 5), 0);
        assert_eq!(v.run_until_idle(), 1);
        assert_eq!(stored(&v), 0x33);
    }

    #[test]
    fn a_context_accumulates_its_runtime_in_its_image() {
        let (mut v, base) = setup();
        let per = crate::regs::clock::TICKS_PER_COMMAND;
        let runtime = |v: &Vgpu| -> u32 {
            let state = (1 << 20) + PAGE_SIZE + lrc::STATE_OFFSET;
            v.guest_memory()
                .read_obj(GuestAddress(state + 4 * lrc::CTX_TIMESTAMP as u64))
                .unwrap()
        };
        let two: Vec<u32> = [store(base, 1), store(base, 2)].concat();
        program(&mut v, 0, 0, &two);
        elsp(&mut v, desc(base, 0, 5), 0);
        assert_eq!(v.run_until_idle(), 1);
        assert_eq!(runtime(&v), 2 * per);
        let three: Vec<u32> = [&two[..], &store(base, 3)].concat();
        program(&mut v, 0, 32, &three);
        elsp(&mut v, desc(base, 0, 5), 0);
        assert_eq!(v.run_until_idle(), 1);
        assert_eq!(runtime(&v), 3 * per, "the runtime restarted");
    }
}
