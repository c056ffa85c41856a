//! Glue to gmig-cmdparser: walking a submitted context's ring and batches in the guest's view,
//! auditing every command, copying it into a shadow workload with its GGTT addresses rebased into
//! the host slices, and per-command write sets for the migration engine.

use gmig_cmdparser::{
    audit_widened, decode_one, redirect_null_uses, remap_in_place, walk_looping, AddressSpace,
    AuditError, BatchContext, Budget, CmdRegister, Decoded, Engine, Footprint, Gen, GgttOffset,
    GpuMemory, IndirectState, MemoryError, Reach, RingSpan, SliceMove, VgpuSlices, WalkError,
    Widening, WriteSet,
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

/// gmig-cmdparser's audit widened by what the register model adds ([`gmig_cmdparser::widen`]):
/// the rows marked command access ([`crate::regs::Reg::cmd_access`], GVT-g's `F_CMD_ACCESS`)
/// join the whitelist for `MI_LOAD_REGISTER_IMM` — an engine's ring rows (`RING_MI_MODE`,
/// `RING_MODE_GEN7`, `RING_INSTPM`) from that engine only, the fixed-offset rows (render and
/// slice state) from the render engine only — and null state pointers are admitted (the shadow
/// points them at the vGPU's first page, [`redirect_null_uses`]).
pub(crate) fn audit_command_model(
    cmd: &Decoded<'_>,
    ctx: &BatchContext,
    slices: &VgpuSlices,
) -> Result<(), AuditError> {
    audit_widened(cmd, ctx, slices, &widening(cmd.gen))
}

/// The vGPU's [`Widening`] on `gen`: its command-access rows, per engine.
pub fn widening(gen: Gen) -> Widening<'static> {
    static ROWS: std::sync::OnceLock<[Vec<CmdRegister>; 3]> = std::sync::OnceLock::new();
    let rows = ROWS.get_or_init(|| {
        Gen::ALL.map(|gen| {
            let absolute = crate::regs::table::ABSOLUTE
                .iter()
                .filter(|r| r.cmd_access)
                .map(|r| CmdRegister {
                    offset: r.offset,
                    engine: Engine::Render,
                });
            let per_engine = EngineId::ALL.into_iter().flat_map(move |e| {
                crate::regs::table::ENGINE
                    .iter()
                    .filter(|r| r.cmd_access)
                    .map(move |r| CmdRegister {
                        offset: e.mmio_base_for(gen) + r.offset,
                        engine: parser_engine(e),
                    })
            });
            absolute.chain(per_engine).collect()
        })
    });
    Widening {
        cmd_registers: &rows[Gen::ALL.iter().position(|g| *g == gen).unwrap_or(0)],
        null_state_pointers: true,
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
        tracing::trace!(
            engine = engine.name(),
            space = ?w.space,
            addr = format_args!("{:#x}", w.addr),
            level = ?w.ctx.level,
            cmd = w.cmd.desc.name,
            dwords = ?w.cmd.dwords,
            "walked"
        );
        audit_command_model(&w.cmd, &w.ctx, &guest).map_err(|err| WalkError::Audit {
            space: w.space,
            addr: w.addr,
            err,
        })?;
        let mut dwords = w.cmd.dwords.to_vec();
        redirect_null_uses(&w.cmd, &w.ctx, &mut dwords, guest.aperture.base.0);
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
    walk_looping(gen, pe, &view, ring, WALK_BUDGET, &mut visit).map_err(|e| {
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
        preempted: None,
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
    audit_command_model(&d, &cmd.ctx, slices).map_err(|e| e.to_string())
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

    /// Sets for the rest of a workload whose commands so far left `state`.
    pub(crate) fn resume(state: IndirectState, candidate: &'a mut Vec<Gfn>) -> WriteSets<'a> {
        WriteSets {
            state,
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

#[cfg(test)]
mod tests {
    use gmig_cmdparser::{audit, BatchLevel};
    use proptest::prelude::*;

    use super::*;

    /// The context workarounds i915 6.1 writes into every render context on Skylake (as the
    /// vGPU received them).
    const I915_CTX_WA: [u32; 19] = [
        0x1100_0011,
        0x2580,
        0x0007_0004,
        0x7004,
        0x0042_0042,
        0x7014,
        0x2000_2000,
        0x7300,
        0x8030_8030,
        0xe180,
        0x2000_2000,
        0xe184,
        0x0002_0002,
        0xe188,
        0x0008_0000,
        0xe194,
        0x0114_0114,
        0xe4f0,
        0x8100_8100,
    ];

    fn slices() -> VgpuSlices {
        crate::vgpu::lone_test_vgpu(1, 1 << 20).guest_view()
    }

    fn admitted(engine: Engine, dwords: &[u32]) -> (bool, bool) {
        let d = decode_one(Gen::Gen9, engine, dwords, 0).unwrap();
        let s = slices();
        (
            audit(&d, &BatchContext::RING, &s).is_ok(),
            audit_command_model(&d, &BatchContext::RING, &s).is_ok(),
        )
    }

    fn lri(pairs: &[(u32, u32)]) -> Vec<u32> {
        gmig_cmdparser::build::mi_load_register_imm(pairs)
    }

    #[test]
    fn i915s_context_workarounds_are_admitted_from_the_render_engine_only() {
        assert_eq!(admitted(Engine::Render, &I915_CTX_WA), (false, true));
        assert_eq!(admitted(Engine::Blitter, &I915_CTX_WA), (false, false));
        // An engine's ring rows only from that engine.
        let ring_mode = |base: u32| lri(&[(base + 0x29c, 0x0008_0008)]);
        assert!(admitted(Engine::Blitter, &ring_mode(0x2_2000)).1);
        assert!(!admitted(Engine::Render, &ring_mode(0x2_2000)).1);
        // Registers without command access stay refused, alone or among admitted ones.
        for reg in [0x941c, 0x2030, 0x2230, 0xa278, 0x4_4200, 0x10_0000] {
            assert_eq!(admitted(Engine::Render, &lri(&[(reg, 1)])), (false, false));
            assert!(
                !admitted(Engine::Render, &lri(&[(0x7014, 1), (reg, 1)])).1,
                "{reg:#x}"
            );
        }
    }

    #[test]
    fn null_state_pointers_are_admitted_and_shadowed_into_the_slices() {
        let s = slices();
        let pool_off = [0x7919_0002, 0, 0, 0];
        let depth_off = [0x7805_0006, 0, 0, 0, 0, 0, 0, 0];
        for cmd in [&pool_off[..], &depth_off[..]] {
            assert_eq!(admitted(Engine::Render, cmd), (false, true));
            let d = decode_one(Gen::Gen9, Engine::Render, cmd, 0).unwrap();
            let mut shadow = cmd.to_vec();
            redirect_null_uses(&d, &BatchContext::RING, &mut shadow, s.aperture.base.0);
            // The shadow passes the parser as it is: nothing points outside the vGPU.
            let sd = decode_one(Gen::Gen9, Engine::Render, &shadow, 0).unwrap();
            assert!(audit(&sd, &BatchContext::RING, &s).is_ok(), "{shadow:x?}");
        }
        // A pool at 0 with a size, a depth buffer at 0 with a size: refused.
        assert!(!admitted(Engine::Render, &[0x7919_0002, 0, 0, 0x1000]).1);
        let depth_sized = [0x7805_0006, 0, 0, 0, 0x0010_0010, 0, 0, 0];
        assert!(!admitted(Engine::Render, &depth_sized).1);
        // From an unprivileged batch nothing changes: the parser refuses GGTT use outright.
        let ppgtt = BatchContext::batch(BatchLevel::First, AddressSpace::Ppgtt, BatchContext::RING);
        let d = decode_one(Gen::Gen9, Engine::Render, &pool_off, 0).unwrap();
        assert_eq!(
            audit_command_model(&d, &ppgtt, &s).is_ok(),
            audit(&d, &ppgtt, &s).is_ok()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The widened LRI check admits a register only if the parser does or the register
        /// model gives it command access, and a multi-register LRI exactly when each register
        /// alone would be.
        #[test]
        fn lri_widening_admits_only_command_access_rows(
            regs in proptest::collection::vec(
                prop_oneof![
                    (0u32..0x8_0000).prop_map(|r| r & !3),
                    proptest::sample::select(crate::regs::cmd_access_registers(Gen::Gen9)),
                ],
                1..6,
            ),
            engine in proptest::sample::select(vec![
                Engine::Render, Engine::Blitter, Engine::Video, Engine::VideoEnhance,
            ]),
        ) {
            let pairs: Vec<(u32, u32)> = regs.iter().map(|&r| (r, 0x0001_0001)).collect();
            let all = admitted(engine, &lri(&pairs)).1;
            let each = regs.iter().all(|&r| admitted(engine, &lri(&[(r, 1)])).1);
            prop_assert_eq!(all, each);
            for &r in &regs {
                let (parser, model) = admitted(engine, &lri(&[(r, 1)]));
                let row = crate::regs::lookup(Gen::Gen9, r).is_some_and(|x| x.cmd_access);
                prop_assert!(!model || parser || row, "{:#x}", r);
            }
        }

        /// Whatever pool-allocation or depth-buffer state the guest writes, the shadow the
        /// vGPU would run after admitting it passes the parser's own address checks.
        #[test]
        fn admitted_state_never_points_outside_the_vgpu(
            base in prop_oneof![Just(0u64), 0u64..(1 << 33)],
            size in prop_oneof![Just(0u32), any::<u32>()],
            dims in prop_oneof![Just(0u32), any::<u32>()],
            depth in any::<bool>(),
        ) {
            let s = slices();
            let cmd: Vec<u32> = if depth {
                vec![0x7805_0006, 0, base as u32, (base >> 32) as u32, dims, 0, 0, 0]
            } else {
                vec![0x7919_0002, base as u32 & !0xfff, (base >> 32) as u32, size & !0xfff]
            };
            let d = decode_one(Gen::Gen9, Engine::Render, &cmd, 0).unwrap();
            if audit_command_model(&d, &BatchContext::RING, &s).is_ok() {
                let mut shadow = cmd.clone();
                redirect_null_uses(&d, &BatchContext::RING, &mut shadow, s.aperture.base.0);
                let sd = decode_one(Gen::Gen9, Engine::Render, &shadow, 0).unwrap();
                prop_assert!(audit(&sd, &BatchContext::RING, &s).is_ok(), "{:x?}", shadow);
            }
        }
    }
}
