//! The software vGPU device: MMIO register file with the GVT-g PV info page, the GGTT written
//! through the MMIO GTT range, fences, display planes, per-engine execlist submission, and a queue
//! of shadowed workloads that the reference engine ([`crate::exec`]) runs. The guest's MMIO
//! accesses are answered in [`crate::regs`] (the register model), submissions and context-status
//! events in [`crate::execlist`].
//!
//! # Two views of graphics memory
//! The guest was told its slices by the PV info page when it booted (the *guest view*) and keeps
//! using those GGTT offsets for its whole life. The vGPU lives in *host* slices given by the host's
//! [`crate::gm::PartitionManager`]. Before migration both are the same; after a restore onto other
//! slices they differ, and the vGPU remaps everything the guest hands to the hardware:
//! - GGTT entries the guest writes land at the same page of the host slice ([`crate::gtt::Ggtt`]);
//! - registers that hold GGTT addresses (status page, plane surfaces, cursor, fences) keep the
//!   guest's value for guest reads and a rebased *shadow* for the hardware;
//! - each submitted workload is walked, audited against the guest view and copied into a shadow
//!   whose GGTT addresses are rebased into the host slices (as GVT-g shadows ring and batch
//!   buffers); guest memory itself is never rewritten.

use super::work::Drain;
use super::work::DrainReport;
use super::work::EngineState;
use super::work::ExecStats;
use super::work::FaultKind;
use super::work::GpuFault;
use super::work::Preemption;
use super::work::Workload;
use super::work::WriteLog;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress};

use crate::gm::{Gfn, VgpuType};
use crate::gtt::{ppgtt_frames, Ggtt, GgttLog, GpuView, GttError, GuestRam, Space};
use crate::mmio::{self, desc, lrc};
use gmig_cmdparser::{Gen, GgttOffset, SliceMove, VgpuSlices};

/// Submissions one engine may have waiting. A frame of the guest-driver model queues one per
/// context; a guest that writes ELSP faster than the engine runs its work is refused beyond this
/// ([`FaultKind::Flood`]), before any shadowing, so the queue, the host's memory and the
/// migrated state stay bounded.
pub const MAX_PENDING_PER_ENGINE: usize = 64;

/// Fault records a vGPU keeps (the latest; [`ExecStats::refused`] counts them all).
pub const MAX_FAULT_RECORDS: usize = 64;

/// Errors of the vGPU device model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VgpuError {
    /// An MMIO access outside the BAR or misaligned.
    #[error("bad MMIO access at {offset:#x} ({len} bytes)")]
    BadMmio {
        /// BAR offset.
        offset: u32,
        /// Access width.
        len: u32,
    },
    /// A submission arrived while the vGPU is paused.
    #[error("vGPU is paused; submission on {0} refused")]
    Paused(&'static str),
    /// Guest RAM is smaller than the model needs.
    #[error("guest RAM access at {0:#x} failed")]
    Ram(u64),
    /// The slices given do not match the vGPU type.
    #[error("slices do not match vGPU type {0}")]
    SliceMismatch(&'static str),
}

/// Result type of this module.
pub type Result<T> = std::result::Result<T, VgpuError>;

/// Static configuration of one vGPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VgpuConfig {
    /// GPU generation the vGPU presents.
    pub gen: Gen,
    /// vGPU type (slice sizes).
    pub ty: VgpuType,
    /// Fence registers granted to the guest.
    pub fence_num: u32,
    /// `vgt_id` shown in the PV info page.
    pub vgt_id: u32,
}

impl VgpuConfig {
    /// A GEN9 vGPU of type `ty` with four fences.
    pub fn new(ty: VgpuType, vgt_id: u32) -> VgpuConfig {
        VgpuConfig {
            gen: Gen::Gen9,
            ty,
            fence_num: 4,
            vgt_id,
        }
    }
}

/// The software vGPU.
#[derive(Clone, Debug)]
pub struct Vgpu {
    pub(crate) cfg: VgpuConfig,
    pub(crate) guest_view: VgpuSlices,
    pub(crate) host: VgpuSlices,
    pub(crate) remap: bool,
    pub(crate) mem: GuestRam,
    pub(crate) vregs: BTreeMap<u32, u32>,
    pub(crate) sregs: BTreeMap<u32, u32>,
    pub(crate) ggtt: Ggtt,
    /// GGTT slots the guest wrote since a migration's pre-copy sent the table (not migrated).
    pub(crate) ggtt_log: Option<GgttLog>,
    pub(crate) engines: [EngineState; 4],
    pub(crate) queue: VecDeque<Workload>,
    pub(crate) accepting: bool,
    pub(crate) faults: Vec<GpuFault>,
    pub(crate) stats: ExecStats,
    pub(crate) ppgtt_roots: BTreeSet<u64>,
    pub(crate) next_seq: u64,
    pub(crate) write_log: WriteLog,
    /// Per context with work pending (guest-view LRCA): the ring offset up to which work was
    /// already submitted, so a resubmission (the hardware's lite restore) walks only the new
    /// commands. An entry lives while the context has queued work: once it completes (or a
    /// reset drops it) the head is in the context image, where the hardware takes it from, so
    /// a new context at a freed image's address starts where its own image says.
    pub(crate) ctx_heads: BTreeMap<u64, u32>,
    /// Interrupts signalled since this vGPU was created on this host (not migrated: a VMM
    /// compares it before and after running work to know when to signal MSI).
    pub(crate) irqs_raised: u64,
    /// Registers touched that the register model has no row for (not migrated).
    pub(crate) unmodelled: crate::regs::unmodelled::Unmodelled,
    /// The engine's state where the workload at the head of the queue stopped part-way (not
    /// migrated: a destination rebuilds it from the workload's commands).
    pub(crate) live: Option<crate::exec::RunState>,
    /// The display: monitor, pipes' counters, AUX channel.
    pub(crate) display: crate::display::state::DisplayState,
}

impl Vgpu {
    /// A fresh vGPU living in `slices` (which the guest will also see), on guest RAM `mem`.
    pub fn new(cfg: VgpuConfig, slices: VgpuSlices, mem: GuestRam) -> Result<Vgpu> {
        if slices.aperture.size != cfg.ty.aperture_size()
            || slices.hidden.size != cfg.ty.hidden_size()
        {
            return Err(VgpuError::SliceMismatch(cfg.ty.name()));
        }
        Ok(Vgpu {
            cfg,
            guest_view: slices,
            host: slices,
            remap: true,
            mem,
            vregs: BTreeMap::new(),
            sregs: BTreeMap::new(),
            ggtt: Ggtt::new(&slices),
            ggtt_log: None,
            engines: Default::default(),
            queue: VecDeque::new(),
            accepting: true,
            faults: Vec::new(),
            stats: ExecStats::default(),
            ppgtt_roots: BTreeSet::new(),
            next_seq: 0,
            write_log: WriteLog::default(),
            ctx_heads: BTreeMap::new(),
            irqs_raised: 0,
            unmodelled: Default::default(),
            live: None,
            display: crate::display::state::DisplayState::new(Some(cfg.ty.resolution())),
        })
    }

    /// Configuration.
    pub fn config(&self) -> VgpuConfig {
        self.cfg
    }

    /// The slices the guest believes it has (from its PV info page at boot).
    pub fn guest_view(&self) -> VgpuSlices {
        self.guest_view
    }

    /// The slices the vGPU occupies on this host.
    pub fn host_slices(&self) -> VgpuSlices {
        self.host
    }

    /// Guest RAM (shared handle).
    pub fn guest_memory(&self) -> &GuestRam {
        &self.mem
    }

    /// GPU errors reported so far.
    pub fn faults(&self) -> &[GpuFault] {
        &self.faults
    }

    /// Execution counters.
    pub fn stats(&self) -> &ExecStats {
        &self.stats
    }

    /// Workloads queued and not yet executed.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Whether submissions are accepted (false while paused for migration).
    pub fn is_accepting(&self) -> bool {
        self.accepting
    }

    /// Takes the write log accumulated since the last call.
    pub fn take_write_log(&mut self) -> WriteLog {
        std::mem::take(&mut self.write_log)
    }

    /// The move from guest-view GGTT offsets to host ones.
    pub(crate) fn guest_to_host(&self) -> SliceMove {
        SliceMove {
            from: self.guest_view,
            to: self.host,
        }
    }

    /// The GPU's view of memory (host slices), with the given PPGTT root.
    pub fn host_view(&self, pml4: Option<u64>) -> GpuView<'_> {
        GpuView {
            ggtt: &self.ggtt,
            slices: self.host,
            mem: &self.mem,
            pml4,
        }
    }

    /// The guest's view of graphics memory (its own GGTT offsets), as the driver and the command
    /// walk before shadowing see it.
    pub fn guest_gpu_view(&self, pml4: Option<u64>) -> GpuView<'_> {
        GpuView {
            ggtt: &self.ggtt,
            slices: self.guest_view,
            mem: &self.mem,
            pml4,
        }
    }

    /// Interrupts the vGPU signalled on this host so far (a counter the device front end
    /// compares to decide when to signal the guest's MSI): user and context-switch events the
    /// guest enabled, while its master interrupt enable is on.
    pub fn interrupts_raised(&self) -> u64 {
        self.irqs_raised
    }

    /// Runs the workload at the head of the queue on the reference engine, from where it
    /// stands until it ends, faults or `limit` stops it at a command boundary, and applies what
    /// it did: statistics, write log, register writes, the user interrupt or a fault; when it
    /// ended, completes its context and takes it off the queue, else records where it stopped
    /// ([`Workload::preempted`]). Returns the commands run and whether the workload completed.
    fn execute_head(&mut self, limit: crate::exec::Limit) -> Option<(u64, bool)> {
        let live = self.live.take();
        let w = self.queue.front()?;
        let hwsp = self
            .sregs
            .get(&(w.engine.mmio_base_for(self.cfg.gen) + mmio::ring::HWS_PGA))
            .filter(|h| **h != 0)
            .map(|h| u64::from(h & 0xffff_f000));
        let regs = |r: u32| self.mmio_read32(r).unwrap_or(0);
        let mv = self.guest_to_host();
        let rebase = |a: u64| mv.rebase(GgttOffset(a)).map_or(a, |h| h.0);
        let io = crate::exec::EngineIo {
            regs: &regs,
            global_hwsp: hwsp,
            rebase: &rebase,
        };
        let (out, live) = crate::exec::execute_span(
            self.cfg.gen,
            self.host_view(w.pml4),
            w,
            io,
            live,
            limit,
            self.stats.clock,
        );
        let (engine, ctx_id) = (w.engine, w.ctx_id());
        let ran = out.clock - self.stats.clock;
        self.stats.max_workload_pages = self.stats.max_workload_pages.max(out.pages_written);
        self.write_log.merge(out.log);
        self.stats.clock = out.clock;
        self.stats.executed += out.executed;
        for s in out.skipped {
            *self.stats.skipped.entry(s.to_string()).or_insert(0) += 1;
        }
        for (r, v) in out.reg_writes {
            self.command_reg_write(r, v);
        }
        if out.interrupt {
            self.raise_engine_irq(engine, crate::regs::table::GT_USER_INTERRUPT);
        }
        match (out.fault, out.next) {
            (Some(reason), _) => self.report_fault(GpuFault {
                engine,
                ctx_id,
                kind: FaultKind::Memory,
                reason,
            }),
            (None, Some(next)) => {
                let w = self.queue.front_mut()?;
                // Stopped before its first command (a semaphore not signalled yet): not started.
                w.preempted = (next > 0)
                    .then(|| Preemption::at(&w.commands, next))
                    .flatten();
                self.live = live;
                return Some((ran, false));
            }
            (None, None) => self.stats.workloads += 1,
        }
        let w = self.queue.pop_front()?;
        self.write_ctx_state(w.lrca, lrc::RING_HEAD, w.ring_tail);
        // The context's runtime, as the context save writes it: modelled from the commands run
        // (deterministic, unlike the free-running RING_TIMESTAMP).
        let runtime = self
            .read_ctx_state(Some(w.lrca), lrc::CTX_TIMESTAMP)
            .unwrap_or(0);
        let commands = u32::try_from(w.commands.len()).unwrap_or(u32::MAX);
        let ticks = commands.saturating_mul(crate::regs::clock::TICKS_PER_COMMAND);
        self.write_ctx_state(w.lrca, lrc::CTX_TIMESTAMP, runtime.wrapping_add(ticks));
        self.forget_idle_heads();
        self.switch_out(w.engine, w.seq);
        Some((ran, true))
    }

    /// Runs one whole workload (the head of the queue, from where it stands).
    #[cfg(test)]
    pub(crate) fn execute(&mut self, w: &Workload) {
        self.queue.push_front(w.clone());
        self.execute_head(crate::exec::Limit::ALL);
    }

    /// Drops the submitted-up-to heads of contexts with no queued work left: their heads are in
    /// their images now (written back at completion, or rewritten by the driver after a reset).
    pub(crate) fn forget_idle_heads(&mut self) {
        let queue = &self.queue;
        self.ctx_heads
            .retain(|lrca, _| queue.iter().any(|w| w.desc & desc::LRCA_MASK == *lrca));
    }

    pub(crate) fn report_fault(&mut self, fault: GpuFault) {
        let v = 1 | (fault.kind.code() << 1) | ((fault.engine.index() as u32) << 12);
        self.vregs.insert(mmio::RING_FAULT_REG, v);
        *self.vregs.entry(mmio::ERROR_GEN6).or_insert(0) |= 1 << fault.engine.index();
        self.stats.refused += 1;
        // A guest that provokes faults in a loop is logged at a bounded rate and keeps only its
        // latest records, so it can grow neither the host's log nor the migrated state.
        if self.stats.refused <= MAX_FAULT_RECORDS as u64 || self.stats.refused.is_power_of_two() {
            tracing::warn!(engine = fault.engine.name(), ctx = fault.ctx_id, reason = %fault.reason, refused = self.stats.refused, "GPU fault");
        }
        if self.faults.len() >= MAX_FAULT_RECORDS {
            self.faults.remove(0);
        }
        self.faults.push(fault);
    }

    /// Reads one register-state dword of a context image at host offset `lrca`.
    pub(crate) fn read_ctx_state(&self, lrca: Option<GgttOffset>, index: usize) -> Option<u32> {
        let addr = lrca?.0.checked_add(lrc::STATE_OFFSET + 4 * index as u64)?;
        self.host_view(None).read_u32(Space::Ggtt, addr).ok()
    }

    pub(crate) fn write_ctx_state(&mut self, lrca: GgttOffset, index: usize, value: u32) {
        let Some(addr) = lrca.0.checked_add(lrc::STATE_OFFSET + 4 * index as u64) else {
            return;
        };
        let mut pages = Vec::new();
        let _ = self
            .host_view(None)
            .write(Space::Ggtt, addr, &value.to_le_bytes(), &mut pages);
        // Context-image write-back is the hardware's own write, not a command's: always dirty.
        self.write_log.actual.extend(pages.iter().copied());
        self.write_log.candidate.extend(pages);
    }

    // ---- execution ----

    /// Runs at most `max` queued workloads in submission order (a preempted one from where it
    /// stopped); returns how many completed.
    pub fn run(&mut self, max: usize) -> usize {
        self.run_within(max, None)
    }

    /// Runs at most `max` queued workloads, none started once `deadline` has passed and the
    /// one running then preempted at the next command boundary; returns how many completed.
    fn run_within(&mut self, max: usize, deadline: Option<std::time::Instant>) -> usize {
        let mut n = 0;
        while n < max && deadline.is_none_or(|d| std::time::Instant::now() < d) {
            let limit = crate::exec::Limit {
                commands: u64::MAX,
                deadline,
            };
            match self.execute_head(limit) {
                Some((_, true)) => n += 1,
                Some((_, false)) | None => break,
            }
        }
        n
    }

    /// Runs every queued workload.
    pub fn run_until_idle(&mut self) -> usize {
        self.run(usize::MAX)
    }

    /// Lets the engines run at most `commands` commands of the queued work, in submission order,
    /// the last workload it reaches possibly stopped part-way (a GPU that has been running while
    /// the guest did other things). Returns the commands run.
    pub fn advance(&mut self, commands: u64) -> u64 {
        let mut ran = 0;
        while ran < commands {
            let limit = crate::exec::Limit {
                commands: commands - ran,
                deadline: None,
            };
            match self.execute_head(limit) {
                Some((n, done)) => {
                    ran += n;
                    if !done {
                        break;
                    }
                }
                None => break,
            }
        }
        ran
    }

    /// The workload the engines stopped part-way, and where: `(seq, next command)`.
    pub fn preempted(&self) -> Option<(u64, u32)> {
        let w = self.queue.front()?;
        w.preempted.map(|p| (w.seq, p.next))
    }

    /// Stops accepting submissions; lets at most `drain.workloads` queued workloads finish
    /// within `drain.time`, and preempts the one running when either runs out at a command
    /// boundary. Everything left (the preempted workload with its position, the queued ones)
    /// stays queued and travels in a checkpoint. [`Drain::CARRY`] runs nothing.
    pub fn pause(&mut self, drain: Drain) -> DrainReport {
        self.accepting = false;
        let deadline = drain.time.map(|t| std::time::Instant::now() + t);
        let executed = self.run_within(drain.workloads, deadline);
        DrainReport {
            executed,
            queued: self.queue.len(),
            preempted: self.preempted(),
        }
    }

    /// Accepts submissions again.
    pub fn resume(&mut self) {
        self.accepting = true;
    }

    // ---- what migration needs ----

    /// Every guest frame the GGTT or a known PPGTT maps (page-table pages included), sorted.
    pub fn gtt_backed_pages(&self) -> Vec<Gfn> {
        let mut set: BTreeSet<Gfn> = self.ggtt.mapped_frames().collect();
        for &root in &self.ppgtt_roots {
            ppgtt_frames(&self.mem, root, &mut set);
        }
        set.into_iter().collect()
    }

    /// The guest-visible registers (what the guest would read), PV info page excluded.
    pub fn guest_registers(&self) -> &BTreeMap<u32, u32> {
        &self.vregs
    }

    /// Reads guest RAM at a guest-physical address.
    pub fn read_ram(&self, addr: u64, out: &mut [u8]) -> Result<()> {
        self.mem
            .read_slice(out, GuestAddress(addr))
            .map_err(|_| VgpuError::Ram(addr))
    }

    /// Translates a GPU address the way the hardware would now (host slices).
    pub fn translate(
        &self,
        space: Space,
        addr: u64,
        pml4: Option<u64>,
    ) -> std::result::Result<Gfn, GttError> {
        self.host_view(pml4)
            .translate(space, addr)
            .map(Gfn::containing)
    }
}
impl crate::shadow::ShadowSource for Vgpu {
    fn shadow_gen(&self) -> Gen {
        self.cfg.gen
    }
    fn shadow_guest_slices(&self) -> VgpuSlices {
        self.guest_view
    }
    fn shadow_view(&self, pml4: Option<u64>) -> GpuView<'_> {
        self.guest_gpu_view(pml4)
    }
    fn shadow_head(&self, lrca: u64) -> Option<u32> {
        self.ctx_heads.get(&lrca).copied()
    }
    fn shadow_move(&self) -> (SliceMove, bool) {
        (self.guest_to_host(), self.remap)
    }
}

/// A 64+384 vGPU numbered `id`, placed first on an empty default host, with `ram` bytes of guest
/// RAM: the unit tests' common set-up (integration tests use `gmig_test_support::lone_vgpu`).
#[cfg(test)]
pub(crate) fn lone_test_vgpu(id: u32, ram: usize) -> Vgpu {
    use crate::gm::{HostConfig, PartitionManager};
    let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
    let (_, s) = pm.place(VgpuType::V5_8).unwrap();
    let ram = crate::gtt::new_guest_ram(ram).unwrap();
    Vgpu::new(VgpuConfig::new(VgpuType::V5_8, id), s, ram).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gm::{MIB, PAGE_SIZE};
    use crate::mmio::{pvinfo, ring, EngineId};
    use proptest::prelude::*;

    fn vgpu() -> Vgpu {
        lone_test_vgpu(7, 4 << 20)
    }

    #[test]
    fn pv_info_page_describes_the_balloon() {
        let v = vgpu();
        let s = v.guest_view();
        let r = |f| v.mmio_read32(mmio::VGT_PVINFO_PAGE + f).unwrap();
        assert_eq!(
            v.mmio_read64(mmio::VGT_PVINFO_PAGE).unwrap(),
            0x4776_5447_7654_4776
        );
        assert_eq!(r(pvinfo::VERSION_MAJOR), 1);
        assert_eq!(r(pvinfo::VGT_ID), 7);
        assert_eq!(u64::from(r(pvinfo::APERTURE_BASE)), s.aperture.base.0);
        assert_eq!(u64::from(r(pvinfo::APERTURE_SIZE)), 64 * MIB);
        assert_eq!(u64::from(r(pvinfo::HIDDEN_BASE)), s.hidden.base.0);
        assert_eq!(u64::from(r(pvinfo::HIDDEN_SIZE)), 384 * MIB);
        assert_eq!(r(pvinfo::FENCE_NUM), 4);
    }

    #[test]
    fn ggtt_through_mmio_stays_in_the_balloon() {
        let mut v = vgpu();
        let s = v.guest_view();
        let entry = |off: u64| mmio::GTT_MMIO_BASE + (off / PAGE_SIZE * 8) as u32;
        v.mmio_write64(entry(s.hidden.base.0 + 3 * PAGE_SIZE), 0x7000 | 1)
            .unwrap();
        assert_eq!(
            v.mmio_read64(entry(s.hidden.base.0 + 3 * PAGE_SIZE))
                .unwrap(),
            0x7001
        );
        assert_eq!(v.gtt_backed_pages(), vec![Gfn(7)]);
        // Outside the balloon: ignored.
        v.mmio_write64(entry(0), 0x9000 | 1).unwrap();
        assert_eq!(v.mmio_read64(entry(0)).unwrap(), 0);
        assert!(matches!(
            v.mmio_write32(3, 0),
            Err(VgpuError::BadMmio { .. })
        ));
        assert!(matches!(
            v.mmio_read32(mmio::MMIO_BAR_SIZE),
            Err(VgpuError::BadMmio { .. })
        ));
    }

    #[test]
    fn address_registers_get_host_shadows() {
        let mut v = vgpu();
        let s = v.guest_view();
        // Pretend the vGPU was moved: the host slices sit 256 MiB higher.
        v.host.aperture.base = GgttOffset(s.aperture.base.0 + 256 * MIB);
        let surf = s.aperture.base.0 as u32 + 0x10000;
        v.mmio_write32(mmio::PLANE_SURF[0], surf).unwrap();
        assert_eq!(
            v.mmio_read32(mmio::PLANE_SURF[0]).unwrap(),
            surf,
            "the guest reads its own value"
        );
        assert_eq!(
            v.shadow_reg(mmio::PLANE_SURF[0]),
            Some(surf + (256 * MIB) as u32)
        );
        // An address outside the guest's slices never reaches the hardware.
        v.mmio_write32(mmio::PLANE_SURF[1], 0x1000).unwrap();
        assert_eq!(v.shadow_reg(mmio::PLANE_SURF[1]), Some(0));
    }

    #[test]
    fn elsp_takes_four_writes_and_refuses_while_paused() {
        let mut v = vgpu();
        let elsp = EngineId::Blitter.mmio_base() + ring::ELSP;
        for _ in 0..3 {
            v.mmio_write32(elsp, 0).unwrap();
        }
        assert_eq!(v.engines[1].elsp.len(), 3);
        // Fourth write: both elements invalid, nothing queued.
        v.mmio_write32(elsp, 0).unwrap();
        assert!(v.engines[1].elsp.is_empty());
        assert_eq!(v.queued(), 0);
        v.pause(Drain::CARRY);
        assert_eq!(v.mmio_write32(elsp, 0), Err(VgpuError::Paused("bcs")));
        v.resume();
        assert!(v.mmio_write32(elsp, 0).is_ok());
    }

    #[test]
    fn bad_context_is_reported_not_executed() {
        let mut v = vgpu();
        let elsp = EngineId::Render.mmio_base() + ring::ELSP;
        // A context descriptor pointing outside the guest's slices.
        for w in [0u32, 0, 5, 0x1000 | 1] {
            v.mmio_write32(elsp, w).unwrap();
        }
        assert_eq!(v.queued(), 0);
        assert_eq!(v.faults().len(), 1);
        assert_eq!(v.faults()[0].kind, FaultKind::Audit);
        assert_eq!(v.faults()[0].ctx_id, 5);
        assert_eq!(v.mmio_read32(mmio::RING_FAULT_REG).unwrap() & 1, 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn random_mmio_never_panics_and_ggtt_stays_inside(ops in proptest::collection::vec((0u32..0x100_0000, any::<u32>()), 1..64)) {
            let mut v = vgpu();
            for (off, val) in ops {
                let _ = v.mmio_write32(off & !3, val);
                let _ = v.mmio_read32(off & !3);
            }
            v.run_until_idle();
            let s = v.guest_view();
            for (hidden, table) in [(false, &v.ggtt.aperture), (true, &v.ggtt.hidden)] {
                let size = if hidden { s.hidden.size } else { s.aperture.size };
                prop_assert_eq!(table.len() as u64, size / PAGE_SIZE);
            }
        }
    }
}
