//! Glue to gmig-cmdparser: walking a submitted context's ring and batches in the guest's view,
//! auditing every command, copying it into a shadow workload with its GGTT addresses rebased into
//! the host slices, and per-command write sets for the migration engine.

use gmig_cmdparser::{
    audit, decode_one, remap_in_place, walk, AddressSpace, Budget, Engine, Footprint, GgttOffset,
    GpuMemory, IndirectState, MemoryError, Reach, RingSpan, SliceMove, WalkError, WriteSet,
};

use crate::gm::{Gfn, PAGE_SIZE};
use crate::gtt::GpuView;
use crate::mmio::{desc, lrc, EngineId};
use crate::work::{FaultKind, ShadowCommand, Workload, WriteLog};

/// Limits on one submission's walk (a self-looping batch runs into them and is refused).
pub const WALK_BUDGET: Budget = Budget {
    max_commands: 1 << 16,
    max_batch_bytes: 16 << 20,
    max_batches: 256,
};

/// The parser's engine for one of ours.
pub fn parser_engine(e: EngineId) -> Engine {
    match e {
        EngineId::Render => Engine::Render,
        EngineId::Blitter => Engine::Blitter,
        EngineId::Video => Engine::Video,
        EngineId::VideoEnhance => Engine::VideoEnhance,
    }
}

/// What shadowing a submission needs from the device that received it (implemented by
/// [`crate::vgpu::Vgpu`]; kept as a trait so that this module does not depend on the device).
pub(crate) trait ShadowSource {
    /// The GPU generation.
    fn shadow_gen(&self) -> gmig_cmdparser::Gen;
    /// The slices the guest believes it has (commands are audited against these).
    fn shadow_guest_slices(&self) -> gmig_cmdparser::VgpuSlices;
    /// Guest memory as the GPU sees it in the guest's addressing (`pml4`: the PPGTT root).
    fn shadow_view(&self, pml4: Option<u64>) -> GpuView<'_>;
    /// The ring offset up to which the context at `lrca` was already submitted (lite restore).
    fn shadow_head(&self, lrca: u64) -> Option<u32>;
    /// The move from the guest's slices to the host's, and whether commands are rebased by it.
    fn shadow_move(&self) -> (SliceMove, bool);
}

impl GpuMemory for GpuView<'_> {
    fn read(&self, space: AddressSpace, addr: u64, out: &mut [u8]) -> Result<(), MemoryError> {
        GpuView::read(self, space, addr, out).map_err(|_| MemoryError::Unmapped { space, addr })
    }
}

/// Reads a context image's register state in the guest's view.
fn ctx_state(view: &GpuView<'_>, lrca: u64, index: usize) -> Option<u32> {
    let addr = lrca.checked_add(lrc::STATE_OFFSET + 4 * index as u64)?;
    view.read_u32(AddressSpace::Ggtt, addr).ok()
}

/// Walks, audits and shadows the context `d` submitted on `engine`.
pub(crate) fn shadow_workload<S: ShadowSource>(
    vgpu: &S,
    engine: EngineId,
    d: u64,
    seq: u64,
) -> Result<Workload, (FaultKind, String)> {
    let guest = vgpu.shadow_guest_slices();
    let lrca = d & desc::LRCA_MASK;
    if !guest.contains(lrca, lrc::CONTEXT_PAGES * PAGE_SIZE) {
        return Err((
            FaultKind::Audit,
            format!("context image at {lrca:#x} is outside the vGPU's slices"),
        ));
    }
    let view0 = vgpu.shadow_view(None);
    let rd = |i| {
        ctx_state(&view0, lrca, i).ok_or((
            FaultKind::Context,
            format!("context image at {lrca:#x} unreadable"),
        ))
    };
    let head = match vgpu.shadow_head(lrca) {
        Some(h) => h,
        None => rd(lrc::RING_HEAD)? & 0x001f_fffc,
    };
    let tail = rd(lrc::RING_TAIL)? & 0x001f_fff8;
    let start = rd(lrc::RING_START)? & 0xffff_f000;
    let ctl = rd(lrc::RING_CTL)?;
    let pml4 = if (d >> desc::ADDRESSING_SHIFT) & 3 == 3 {
        Some((u64::from(rd(lrc::PDP0_UDW)?) << 32) | u64::from(rd(lrc::PDP0_LDW)?))
    } else {
        None
    };
    let size = u64::from((ctl >> 12) & 0x1ff) + 1;
    let ring = RingSpan {
        start: GgttOffset(u64::from(start)),
        size: size * PAGE_SIZE,
        head: u64::from(head),
        tail: u64::from(tail),
    };
    if !guest.contains(ring.start.0, ring.size) {
        return Err((
            FaultKind::Audit,
            format!("ring at {start:#x} is outside the vGPU's slices"),
        ));
    }
    let gen = vgpu.shadow_gen();
    let pe = parser_engine(engine);
    let (mv, remap) = vgpu.shadow_move();
    let moving = remap && mv.from != mv.to;
    let view = vgpu.shadow_view(pml4);
    let mut commands = Vec::new();
    let mut visit = |w: &gmig_cmdparser::WalkedCommand<'_>| -> Result<(), WalkError> {
        if w.space == AddressSpace::Ggtt && !guest.contains(w.addr, 4) {
            return Err(WalkError::Rejected {
                space: w.space,
                addr: w.addr,
                reason: "command outside the vGPU's slices",
            });
        }
        audit(&w.cmd, &w.ctx, &guest).map_err(|err| WalkError::Audit {
            space: w.space,
            addr: w.addr,
            err,
        })?;
        let mut dwords = w.cmd.dwords.to_vec();
        if moving {
            remap_in_place(gen, pe, &mut dwords, &w.ctx, &mv).map_err(|err| WalkError::Remap {
                space: w.space,
                addr: w.addr,
                err,
            })?;
        }
        commands.push(ShadowCommand {
            ctx: w.ctx,
            space: w.ctx.implicit_space(),
            guest_addr: w.addr,
            dwords,
        });
        Ok(())
    };
    walk(gen, pe, &view, ring, WALK_BUDGET, &mut visit).map_err(|e| {
        let kind = match e {
            WalkError::Audit { .. } | WalkError::Rejected { .. } | WalkError::Remap { .. } => {
                FaultKind::Audit
            }
            _ => FaultKind::Walk,
        };
        (kind, e.to_string())
    })?;
    let lrca_host = if remap {
        mv.rebase(GgttOffset(lrca)).unwrap_or(GgttOffset(lrca))
    } else {
        GgttOffset(lrca)
    };
    Ok(Workload {
        seq,
        engine,
        desc: d,
        lrca: lrca_host,
        ring_tail: tail,
        pml4,
        commands,
    })
}

/// Rebases the GGTT addresses in one shadowed command (checkpoint restore onto other slices).
pub(crate) fn remap_command(
    gen: gmig_cmdparser::Gen,
    engine: EngineId,
    cmd: &mut ShadowCommand,
    mv: &SliceMove,
) -> Result<(), String> {
    remap_in_place(gen, parser_engine(engine), &mut cmd.dwords, &cmd.ctx, mv)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Audits one shadowed command against `slices` (the host slices it will run in).
pub(crate) fn audit_command(
    gen: gmig_cmdparser::Gen,
    engine: EngineId,
    cmd: &ShadowCommand,
    slices: &gmig_cmdparser::VgpuSlices,
) -> Result<(), String> {
    let d = decode_one(gen, parser_engine(engine), &cmd.dwords, 0).map_err(|e| e.to_string())?;
    if d.len() != cmd.dwords.len() {
        return Err(format!(
            "{}: {} dwords stored, {} decoded",
            d.desc.name,
            cmd.dwords.len(),
            d.len()
        ));
    }
    audit(&d, &cmd.ctx, slices).map_err(|e| e.to_string())
}

/// What one workload's commands may write, collected command by command.
pub(crate) struct WriteSets<'a> {
    /// The workload's indirect state.
    pub state: IndirectState,
    /// Frames the commands' write sets name.
    pub candidate: &'a mut Vec<Gfn>,
    /// The GTT reach some command's writes are bounded by (nothing when all are named).
    pub reach: Reach,
}

impl<'a> WriteSets<'a> {
    /// Fresh sets for one workload run through `view` (its indirect state in the PPGTT when the
    /// context has one), collecting frames into `candidate`.
    pub(crate) fn new(
        gen: gmig_cmdparser::Gen,
        view: &GpuView<'_>,
        candidate: &'a mut Vec<Gfn>,
    ) -> WriteSets<'a> {
        let space = if view.pml4.is_some() {
            AddressSpace::Ppgtt
        } else {
            AddressSpace::Ggtt
        };
        WriteSets {
            state: IndirectState::new(gen, space),
            candidate,
            reach: Reach::default(),
        }
    }

    /// Whether some command's writes are bounded only by the reach.
    pub(crate) fn has_reach(&self) -> bool {
        self.reach != Reach::default()
    }

    /// Adds the reach's frames (in `view`) to the candidates; whether there was a reach.
    pub(crate) fn close(self, view: &GpuView<'_>) -> bool {
        if !self.has_reach() {
            return false;
        }
        let mut frames = std::collections::BTreeSet::new();
        view.reach_frames(self.reach, &mut frames);
        self.candidate.extend(frames);
        true
    }
}

/// Adds one executing command's write set (pages through the host view, indirect state
/// followed) to `log` and `sets`; returns the command's name and, for a draw, a dispatch or a
/// decode, its footprint.
pub(crate) fn log_write_set(
    gen: gmig_cmdparser::Gen,
    engine: EngineId,
    cmd: &ShadowCommand,
    view: &GpuView<'_>,
    log: &mut WriteLog,
    sets: &mut WriteSets<'_>,
) -> (&'static str, Option<Footprint>) {
    log.commands += 1;
    let Ok(d) = decode_one(gen, parser_engine(engine), &cmd.dwords, 0) else {
        log.unknown = true;
        return ("UNDECODABLE", None);
    };
    let (set, footprint) = sets.state.step(&d, &cmd.ctx, view);
    let ranges = match set {
        WriteSet::Nothing => Vec::new(),
        WriteSet::Unknown => {
            log.unknown = true;
            Vec::new()
        }
        WriteSet::Ranges(ranges) => ranges,
        WriteSet::WithinReach { ranges, reach } => {
            sets.reach = sets.reach.union(reach);
            ranges
        }
    };
    for r in ranges {
        let first = r.start / PAGE_SIZE;
        let last = r.start.saturating_add(r.len.max(1) - 1) / PAGE_SIZE;
        for p in first..=last {
            if let Ok(gpa) = view.translate(r.space, p * PAGE_SIZE) {
                sets.candidate.push(Gfn::containing(gpa));
            }
        }
    }
    (d.desc.name, footprint)
}
