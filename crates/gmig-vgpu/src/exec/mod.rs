//! The reference engine: really executes a subset of GEN commands against guest memory.
//!
//! It runs a shadowed [`Workload`] (control flow already followed by the walk, GGTT addresses
//! already in host slices). Executed: `MI_NOOP`, `MI_BATCH_BUFFER_START/END` (flow), `MI_STORE_DATA_IMM`,
//! `MI_STORE_DATA_INDEX`, `MI_LOAD_REGISTER_IMM/REG/MEM`, `MI_STORE_REGISTER_MEM`, `MI_MATH`,
//! `MI_CONDITIONAL_BATCH_BUFFER_END`, `MI_SEMAPHORE_WAIT` (see `exec/mi.rs`), `MI_FLUSH_DW` and
//! `PIPE_CONTROL` post-sync writes (to an address, or by "store data index" into the context's
//! status page), `MI_USER_INTERRUPT`,
//! `XY_COLOR_BLT`, `XY_SRC_COPY_BLT`, `XY_FAST_COPY_BLT` (linear and X-tiled), and a model of
//! the work commands — `3DPRIMITIVE`, `3DSTATE_WM_HZ_OP`, `GPGPU_WALKER` and the media objects,
//! the video decoders' BSD objects — that writes what gmig-cmdparser's indirect-state walk
//! ([`gmig_cmdparser::IndirectState`]) says the command writes. Every other valid command is
//! decoded, skipped and counted.
//!
//! A work command is modelled as a deterministic fill of the surfaces its [`Footprint`] marks as
//! written: the render targets and buffers its kernels' SEND messages write, depth, stencil, HiZ
//! and stream output, video destinations and row stores. The engine has no private idea of what a
//! draw writes: it takes the parser's. Its writes are recorded separately
//! ([`crate::work::WriteLog::actual`]) so tests can check candidate sets stay sound.

use gmig_cmdparser::{BatchLevel, Footprint, Gen, SurfaceRole};

use crate::gm::Gfn;
use crate::gtt::{GpuView, GttError, Space};
use crate::work::{ShadowCommand, Workload, WriteLog};

/// Bytes per pixel from a BR13-style colour-depth field (bits 25:24).
fn br13_bpp(dw1: u32) -> u32 {
    match (dw1 >> 24) & 3 {
        0 => 1,
        1 | 2 => 2,
        _ => 4,
    }
}

/// A 48-bit address from two dwords, low bits masked.
fn addr48(lo: u32, hi: u32, low_mask: u32) -> u64 {
    (u64::from(hi & 0xffff) << 32) | u64::from(lo & !low_mask)
}

/// Surface tiling the blitter understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tiling {
    Linear,
    X,
    Y,
}

/// A 2D surface in GPU address space.
#[derive(Clone, Copy, Debug)]
struct Surface {
    space: Space,
    base: u64,
    /// Bytes from one row to the next: negative for a bottom-up linear surface.
    pitch: i64,
    tiling: Tiling,
}

/// A blit's pitch field (BR13 or the source pitch dword, bits 15:0), as the parser reads it:
/// a signed 16-bit byte count for a linear surface; for a tiled one its magnitude in dwords.
fn blit_pitch(field: u32, tiled: bool) -> i64 {
    let pitch = i64::from((field as u16).cast_signed());
    if tiled {
        pitch.abs() * 4
    } else {
        pitch
    }
}

impl Surface {
    /// Address of byte `x` of row `y`, and how many bytes are contiguous from there (within row
    /// length `len`).
    fn span(&self, x: u64, y: u64, len: u64) -> Option<(u64, u64)> {
        match self.tiling {
            Tiling::Linear => {
                let row = i64::try_from(y).ok()?.checked_mul(self.pitch)?;
                let off = row.checked_add(i64::try_from(x).ok()?)?;
                let addr = if off >= 0 {
                    self.base.checked_add(off.unsigned_abs())?
                } else {
                    self.base.checked_sub(off.unsigned_abs())?
                };
                Some((addr, len))
            }
            Tiling::X => {
                // X tile: 512 bytes x 8 rows = 4 KiB, tiles laid out row-major.
                let tiles_per_row = self.pitch.unsigned_abs() / 512;
                let tile = (y / 8).checked_mul(tiles_per_row)?.checked_add(x / 512)?;
                let off = tile.checked_mul(4096)? + (y % 8) * 512 + x % 512;
                Some((self.base.checked_add(off)?, len.min(512 - x % 512)))
            }
            Tiling::Y => {
                // Legacy Y tile: 128 bytes x 32 rows = 4 KiB, made of 16-byte columns of 32 rows.
                let tiles_per_row = self.pitch.unsigned_abs() / 128;
                let tile = (y / 32).checked_mul(tiles_per_row)?.checked_add(x / 128)?;
                let within = (x % 128) / 16 * 512 + (y % 32) * 16 + x % 16;
                let off = tile.checked_mul(4096)?.checked_add(within)?;
                Some((self.base.checked_add(off)?, len.min(16 - x % 16)))
            }
        }
    }
}

/// Per-workload state the work model needs beyond the parser's footprint.
#[derive(Clone, Copy, Debug, Default)]
struct PipeState {
    depth_clear: u32,
}

impl PipeState {
    /// Records what `cmd` (named `name`) sets of the pipeline state; whether it set any. The
    /// engine and the replay after a restore both go through here.
    fn observe(&mut self, name: &str, cmd: &ShadowCommand) -> bool {
        match name {
            // 3DSTATE_CLEAR_PARAMS: DW1 depth clear value (the depth fill of later draws).
            "3DSTATE_CLEAR_PARAMS" => {
                self.depth_clear = dw(cmd, 1);
                true
            }
            _ => false,
        }
    }
}

struct Ctx<'a> {
    view: GpuView<'a>,
    written: Vec<Gfn>,
    gen: Gen,
    engine: gmig_cmdparser::Engine,
    /// The engine's MMIO base (its general purpose registers sit above it).
    mmio_base: u32,
    regs: mi::RegFile<'a>,
    /// The workload's status pages (host GGTT): the context's per-process page (the first page
    /// of its image) and the engine's global one (`HWS_PGA`), if the guest set it.
    per_process_hwsp: u64,
    global_hwsp: Option<u64>,
    /// Pages the hardware wrote through a status-page index: no parser write set names them
    /// (they depend on the context), so they join the candidate set as they are written.
    indexed: Vec<Gfn>,
}

impl Ctx<'_> {
    fn write(&mut self, space: Space, addr: u64, data: &[u8]) -> Result<(), GttError> {
        self.view.write(space, addr, data, &mut self.written)
    }

    /// A store-data-index write of `data` at `offset` into a status page (the audit kept it
    /// inside the page).
    fn write_index(&mut self, per_process: bool, offset: u64, data: &[u8]) -> Result<(), GttError> {
        let page = if per_process {
            Some(self.per_process_hwsp)
        } else {
            self.global_hwsp
        };
        // A global page never set: the hardware would write at GGTT 0, outside every slice.
        let addr = page.unwrap_or(0).saturating_add(offset);
        let before = self.written.len();
        let r = self.view.write(Space::Ggtt, addr, data, &mut self.written);
        self.indexed.extend_from_slice(&self.written[before..]);
        r
    }

    /// `cmd`'s store-data-index write, if it makes one (the table's rule).
    fn index_use(&self, cmd: &ShadowCommand) -> Option<gmig_cmdparser::IndexUse> {
        let desc = gmig_cmdparser::lookup(self.gen, self.engine, dw(cmd, 0))?;
        gmig_cmdparser::Decoded {
            gen: self.gen,
            engine: self.engine,
            offset: 0,
            desc,
            dwords: &cmd.dwords,
        }
        .status_index()
    }
}

/// Register writes and interrupts an executed command asks for.
enum SideEffect {
    Reg(u32, u32),
    Interrupt,
}

/// What executing one workload did, for the device to apply ([`crate::vgpu::Vgpu`] records the
/// statistics, register writes, interrupt and fault, and completes the context).
#[derive(Debug, Default)]
pub struct Execution {
    /// Pages the workload wrote (`actual`) and the parser's sound candidate set (`candidate`).
    pub log: WriteLog,
    /// How many distinct pages the commands actually wrote.
    pub pages_written: u64,
    /// The engine clock after the last command.
    pub clock: u64,
    /// Commands executed.
    pub executed: u64,
    /// Commands recognised but not modelled, by name.
    pub skipped: Vec<&'static str>,
    /// Register writes the commands asked for, in order: `(offset, value)`.
    pub reg_writes: Vec<(u32, u32)>,
    /// Whether a command raised the engine's user interrupt.
    pub interrupt: bool,
    /// Why execution stopped early (a memory fault), if it did.
    pub fault: Option<String>,
    /// Where the span's limit stopped the workload part-way (the next command), if it did.
    pub next: Option<usize>,
}

/// The engine's state inside a running workload: what a context save keeps besides the ring
/// head and batch position (the indirect state the commands so far set, the pipeline values the
/// work model uses), at the boundary before `commands[next]` of workload `seq`.
#[derive(Clone, Debug)]
pub struct RunState {
    seq: u64,
    next: usize,
    indirect: gmig_cmdparser::IndirectState,
    pipe: PipeState,
}

/// How far one call of [`execute_span`] may go.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    /// Commands it may run.
    pub commands: u64,
    /// When it must stop, at the next command boundary.
    pub deadline: Option<std::time::Instant>,
}

impl Limit {
    /// To the end of the workload.
    pub const ALL: Limit = Limit {
        commands: u64::MAX,
        deadline: None,
    };
}

/// Executes `w`'s commands against guest memory through `view` (the host addressing the
/// workload runs in), starting at engine clock `clock`.
pub fn execute(gen: Gen, view: GpuView<'_>, w: &Workload, clock: u64) -> Execution {
    let regs = |_| 0;
    let same = |a| a;
    let io = EngineIo {
        regs: &regs,
        global_hwsp: None,
        rebase: &same,
    };
    execute_span(gen, view, w, io, None, Limit::ALL, clock).0
}

/// What the engine reaches of the device besides memory while it runs a workload.
#[derive(Clone, Copy)]
pub struct EngineIo<'a> {
    /// Reads a register as the guest would (register loads and stores, `MI_MATH`'s GPRs).
    pub regs: &'a dyn Fn(u32) -> u32,
    /// The engine's global status page (host GGTT), where store-data-index writes without
    /// "per-process" land.
    pub global_hwsp: Option<u64>,
    /// Rebases a guest-view GGTT offset into the host slices the workload runs in (a loop's
    /// target in a shadowed `MI_BATCH_BUFFER_START` is a host address).
    pub rebase: &'a dyn Fn(u64) -> u64,
}

/// Executes `w` from its next command ([`Workload::next_command`]) until it ends, faults or
/// `limit` stops it at a command boundary ([`Execution::next`] then says where). `state` is the
/// engine's state where the last span stopped; without it (after a restore, on another host)
/// the engine rebuilds it by replaying the state the commands already run set, writing
/// nothing, as a context restore would load it. Returns the state to continue with when the
/// workload stopped part-way. An `MI_SEMAPHORE_WAIT` whose condition does not hold stops the
/// span before it as a limit would.
pub fn execute_span<'a>(
    gen: Gen,
    view: GpuView<'a>,
    w: &Workload,
    io: EngineIo<'a>,
    state: Option<RunState>,
    limit: Limit,
    clock: u64,
) -> (Execution, Option<RunState>) {
    let from = w.next_command().min(w.commands.len());
    let (indirect, mut pipe) = match state {
        Some(s) if s.seq == w.seq && s.next == from => (s.indirect, s.pipe),
        _ => replay(gen, &view, w, from),
    };
    let mut effects = Vec::new();
    let mut out = Execution {
        clock,
        ..Execution::default()
    };
    let mut written = Vec::new();
    let mut candidate = Vec::new();
    let mut at = from;
    let kept;
    {
        let mut ctx = Ctx {
            view,
            written: Vec::new(),
            gen,
            engine: crate::shadow::parser_engine(w.engine),
            mmio_base: w.engine.mmio_base_for(gen),
            regs: mi::RegFile::new(io.regs),
            per_process_hwsp: w.lrca.0,
            global_hwsp: io.global_hwsp,
            indexed: Vec::new(),
        };
        let mut sets = crate::shadow::WriteSets::resume(indirect, &mut candidate);
        while let Some(cmd) = w.commands.get(at) {
            let ran = (at - from) as u64;
            if ran > 0
                && (ran >= limit.commands
                    || limit
                        .deadline
                        .is_some_and(|d| std::time::Instant::now() >= d))
            {
                out.next = Some(at);
                break;
            }
            let (name, footprint) = crate::shadow::log_write_set(
                gen,
                w.engine,
                cmd,
                &ctx.view,
                &mut out.log,
                &mut sets,
            );
            out.clock += 1;
            let work = Work {
                name,
                footprint: footprint.as_ref(),
                clock: out.clock,
            };
            at += 1;
            match run_command(&mut ctx, &mut pipe, cmd, work, &mut effects) {
                Ok(Outcome::Executed) => {
                    out.executed += 1;
                    if let Some(k) = loop_target(&w.commands, at - 1, io.rebase) {
                        // A batch that loops (a spinner): one turn per span, so that the
                        // engines yield and the CPU's write that ends it is seen.
                        out.next = Some(k);
                        break;
                    }
                }
                Ok(Outcome::Skipped(name)) => out.skipped.push(name),
                Ok(Outcome::EndBatch) => {
                    out.executed += 1;
                    at = batch_end(&w.commands, at, cmd.ctx.level);
                }
                Ok(Outcome::Wait) => {
                    // Not run: the span stops before it, to try it again later.
                    at -= 1;
                    out.clock -= 1;
                    out.next = Some(at);
                    break;
                }
                Err(e) => {
                    out.fault = Some(format!(
                        "{e} at {:#x} ({:?})",
                        cmd.guest_addr, cmd.ctx.level
                    ));
                    break;
                }
            }
        }
        // Only a workload stopped part-way needs its state kept for the next span.
        kept = out.next.is_some().then(|| sets.state.clone());
        if sets.close(&view) {
            out.log.reach_workloads += 1;
        }
        written.append(&mut ctx.written);
        candidate.append(&mut ctx.indexed);
    }
    // Sorted, deduplicated bulk builds: far cheaper than inserting page by page.
    written.sort_unstable();
    written.dedup();
    out.pages_written = written.len() as u64;
    candidate.sort_unstable();
    candidate.dedup();
    out.log.actual = written.into_iter().collect();
    out.log.candidate = candidate.into_iter().collect();
    for e in effects {
        match e {
            SideEffect::Reg(r, v) => out.reg_writes.push((r, v)),
            SideEffect::Interrupt => out.interrupt = true,
        }
    }
    let state = out.next.zip(kept).map(|(next, indirect)| RunState {
        seq: w.seq,
        next,
        indirect,
        pipe,
    });
    (out, state)
}

/// The engine's state before `w.commands[upto]`, rebuilt from the commands before it: the
/// indirect state they set and the pipeline values, nothing written.
fn replay(
    gen: Gen,
    view: &GpuView<'_>,
    w: &Workload,
    upto: usize,
) -> (gmig_cmdparser::IndirectState, PipeState) {
    let mut pipe = PipeState::default();
    let mut scratch = Vec::new();
    let mut log = WriteLog::default();
    let mut sets = crate::shadow::WriteSets::new(gen, view, &mut scratch);
    for cmd in &w.commands[..upto] {
        let (name, _) = crate::shadow::log_write_set(gen, w.engine, cmd, view, &mut log, &mut sets);
        pipe.observe(name, cmd);
    }
    (sets.state, pipe)
}

/// Where the command at `i` loops back to, if it is a loop: a chaining `MI_BATCH_BUFFER_START`
/// in a first-level batch whose walk ended there ([`gmig_cmdparser::walk_looping`]: the next
/// command is back in the ring, or there is none) and whose target is an earlier first-level
/// command of the workload. The target is the command's host address (`rebase` maps a
/// command's guest-view GGTT address to it; PPGTT addresses are the same on both sides).
fn loop_target(commands: &[ShadowCommand], i: usize, rebase: &dyn Fn(u64) -> u64) -> Option<usize> {
    let cmd = commands.get(i)?;
    let d0 = dw(cmd, 0);
    let is_start = d0 >> 23 == 0x31;
    if !is_start || cmd.ctx.level != BatchLevel::First || d0 & (1 << 22) != 0 {
        return None;
    }
    if commands
        .get(i + 1)
        .is_some_and(|c| c.ctx.level != BatchLevel::Ring)
    {
        return None;
    }
    let ppgtt = d0 & (1 << 8) != 0;
    let target = addr48(dw(cmd, 1), dw(cmd, 2), 3);
    commands[..=i].iter().rposition(|c| {
        c.ctx.level == BatchLevel::First
            && match (ppgtt, c.space) {
                (true, Space::Ppgtt) => c.guest_addr == target,
                (false, Space::Ggtt) => rebase(c.guest_addr) == target,
                _ => false,
            }
    })
}

/// The index of the first command after `from` that is not in the batch a conditional end at
/// `level` ended (nor in a batch that one called): a first-level batch returns to the ring, a
/// second-level one to its caller.
fn batch_end(commands: &[ShadowCommand], from: usize, level: BatchLevel) -> usize {
    let inside = |l: BatchLevel| match level {
        BatchLevel::Ring => false,
        BatchLevel::First => l != BatchLevel::Ring,
        BatchLevel::Second => l == BatchLevel::Second,
    };
    commands
        .get(from..)
        .and_then(|rest| rest.iter().position(|c| !inside(c.ctx.level)))
        .map_or(commands.len(), |i| from + i)
}

enum Outcome {
    Executed,
    Skipped(&'static str),
    /// `MI_CONDITIONAL_BATCH_BUFFER_END` ended the batch it sits in.
    EndBatch,
    /// `MI_SEMAPHORE_WAIT` found its condition unmet: the command runs again later.
    Wait,
}

fn dw(cmd: &ShadowCommand, i: usize) -> u32 {
    cmd.dwords.get(i).copied().unwrap_or(0)
}

/// Whether the command's address field at dwords `first..first + width` lies within its
/// length. The parser yields no address for a field the length cuts off (nothing audited,
/// nothing rebased), so the engine writes nothing through it.
fn holds(cmd: &ShadowCommand, first: usize, width: usize) -> bool {
    cmd.dwords.len() >= first + width
}

/// One command as the engine runs it: its name, its footprint (work commands) and the clock.
#[derive(Clone, Copy)]
struct Work<'a> {
    name: &'static str,
    footprint: Option<&'a Footprint>,
    clock: u64,
}

fn run_command(
    ctx: &mut Ctx<'_>,
    pipe: &mut PipeState,
    cmd: &ShadowCommand,
    work: Work<'_>,
    effects: &mut Vec<SideEffect>,
) -> Result<Outcome, GttError> {
    if let Some(fp) = work.footprint {
        return run_work(ctx, pipe, cmd, fp);
    }
    match dw(cmd, 0) >> 29 {
        0 => mi::run_mi(ctx, cmd, work.name, work.clock, effects),
        2 => run_2d(ctx, cmd, work.name),
        _ => run_3d(ctx, pipe, cmd, work.name, work.clock),
    }
}

/// Runs a draw, a dispatch or a decode: every surface its footprint marks as written gets a
/// fill derived from the command (depth from the clear value).
fn run_work(
    ctx: &mut Ctx<'_>,
    pipe: &PipeState,
    cmd: &ShadowCommand,
    fp: &Footprint,
) -> Result<Outcome, GttError> {
    let seed = cmd
        .dwords
        .iter()
        .fold(0x811c_9dc5u32, |h, d| (h ^ d).wrapping_mul(0x0100_0193));
    for s in fp.writes() {
        let value = match s.role {
            SurfaceRole::Depth => pipe.depth_clear ^ (seed & 0xff),
            SurfaceRole::Bound { index, .. } => seed.rotate_left(u32::from(index)),
            _ => seed ^ 0x5a5a_5a5a,
        };
        let sh = s.shape;
        fill_linear(
            ctx,
            s.space,
            s.start,
            sh.pitch,
            sh.row_bytes,
            sh.rows,
            value.to_le_bytes(),
        )?;
    }
    Ok(Outcome::Executed)
}

fn run_2d(ctx: &mut Ctx<'_>, cmd: &ShadowCommand, name: &'static str) -> Result<Outcome, GttError> {
    let d0 = dw(cmd, 0);
    let space = cmd.space;
    match name {
        "XY_COLOR_BLT" => {
            // XY_COLOR_BLT: DW1 BR13, DW2 top-left, DW3 bottom-right (exclusive), DW4-5 dst, DW6 colour.
            let bpp = br13_bpp(dw(cmd, 1));
            let tiled = d0 & (1 << 11) != 0;
            let dst = Surface {
                space,
                base: addr48(dw(cmd, 4), dw(cmd, 5), 0),
                pitch: blit_pitch(dw(cmd, 1), tiled),
                tiling: if tiled { Tiling::X } else { Tiling::Linear },
            };
            let (x1, y1, x2, y2) = rect(dw(cmd, 2), dw(cmd, 3));
            let color = dw(cmd, 6).to_le_bytes();
            let row_bytes = u64::from(x2.saturating_sub(x1)) * u64::from(bpp);
            let row: Vec<u8> = (0..row_bytes)
                .map(|i| color[(i % u64::from(bpp)) as usize])
                .collect();
            for y in y1..y2 {
                put_row(
                    ctx,
                    &dst,
                    u64::from(x1) * u64::from(bpp),
                    u64::from(y),
                    &row,
                )?;
            }
            Ok(Outcome::Executed)
        }
        "XY_SRC_COPY_BLT" => {
            // XY_SRC_COPY_BLT: DW1 BR13 (dst pitch), DW2-3 dst rect, DW4-5 dst, DW6 src x/y,
            // DW7 src pitch, DW8-9 src. DW0 bit 11 dst tiled, bit 15 src tiled (X, pitch in dwords).
            let bpp = u64::from(br13_bpp(dw(cmd, 1)));
            let dt = d0 & (1 << 11) != 0;
            let st = d0 & (1 << 15) != 0;
            let dst = Surface {
                space,
                base: addr48(dw(cmd, 4), dw(cmd, 5), 0),
                pitch: blit_pitch(dw(cmd, 1), dt),
                tiling: if dt { Tiling::X } else { Tiling::Linear },
            };
            let src = Surface {
                space,
                base: addr48(dw(cmd, 8), dw(cmd, 9), 0),
                pitch: blit_pitch(dw(cmd, 7), st),
                tiling: if st { Tiling::X } else { Tiling::Linear },
            };
            let (x1, y1, x2, y2) = rect(dw(cmd, 2), dw(cmd, 3));
            let (sx, sy) = (dw(cmd, 6) & 0xffff, dw(cmd, 6) >> 16);
            copy_rect(ctx, &src, &dst, (sx, sy), (x1, y1, x2, y2), bpp)?;
            Ok(Outcome::Executed)
        }
        "XY_FAST_COPY_BLT" => {
            // XY_FAST_COPY_BLT: DW0 src tiling 21:20, dst tiling 14:13 (0 linear, 1 X, 2 Y/Yf,
            // 3 Ys); DW1 Yf selects 31/30, colour depth 26:24 (0: 8, 1: 16, 3: 32, 4: 64,
            // 5: 128 bpp), dst pitch 15:0; DW7 src pitch. Tiled pitches are in dwords.
            let d1 = dw(cmd, 1);
            let bpp = match (d1 >> 24) & 7 {
                0 => 1,
                1 | 2 => 2,
                3 => 4,
                4 => 8,
                _ => 16,
            };
            let dt = (d0 >> 13) & 3;
            let st = (d0 >> 20) & 3;
            if dt > 2 || st > 2 || d1 >> 30 != 0 {
                return Ok(Outcome::Skipped("XY_FAST_COPY_BLT(Ys/Yf)"));
            }
            let mk = |t: u32, pitch: u32, lo: u32, hi: u32| Surface {
                space,
                base: addr48(lo, hi, 0),
                pitch: blit_pitch(pitch, t != 0),
                tiling: match t {
                    0 => Tiling::Linear,
                    1 => Tiling::X,
                    _ => Tiling::Y,
                },
            };
            let dst = mk(dt, dw(cmd, 1), dw(cmd, 4), dw(cmd, 5));
            let src = mk(st, dw(cmd, 7), dw(cmd, 8), dw(cmd, 9));
            let (x1, y1, x2, y2) = rect(dw(cmd, 2), dw(cmd, 3));
            let (sx, sy) = (dw(cmd, 6) & 0xffff, dw(cmd, 6) >> 16);
            copy_rect(ctx, &src, &dst, (sx, sy), (x1, y1, x2, y2), bpp)?;
            Ok(Outcome::Executed)
        }
        _ => Ok(Outcome::Skipped(name)),
    }
}

fn rect(tl: u32, br: u32) -> (u32, u32, u32, u32) {
    (tl & 0xffff, tl >> 16, br & 0xffff, br >> 16)
}

fn put_row(
    ctx: &mut Ctx<'_>,
    s: &Surface,
    x_bytes: u64,
    y: u64,
    row: &[u8],
) -> Result<(), GttError> {
    let mut done = 0u64;
    while done < row.len() as u64 {
        let (addr, n) = s
            .span(x_bytes + done, y, row.len() as u64 - done)
            .ok_or(GttError::OutOfSlice(s.base))?;
        ctx.write(s.space, addr, &row[done as usize..(done + n) as usize])?;
        done += n;
    }
    Ok(())
}

fn get_row(
    ctx: &Ctx<'_>,
    s: &Surface,
    x_bytes: u64,
    y: u64,
    row: &mut [u8],
) -> Result<(), GttError> {
    let mut done = 0u64;
    let len = row.len() as u64;
    while done < len {
        let (addr, n) = s
            .span(x_bytes + done, y, len - done)
            .ok_or(GttError::OutOfSlice(s.base))?;
        ctx.view
            .read(s.space, addr, &mut row[done as usize..(done + n) as usize])?;
        done += n;
    }
    Ok(())
}

fn copy_rect(
    ctx: &mut Ctx<'_>,
    src: &Surface,
    dst: &Surface,
    (sx, sy): (u32, u32),
    (x1, y1, x2, y2): (u32, u32, u32, u32),
    bpp: u64,
) -> Result<(), GttError> {
    let w = u64::from(x2.saturating_sub(x1)) * bpp;
    let h = u64::from(y2.saturating_sub(y1));
    if src.tiling == Tiling::Linear && i64::try_from(w) == Ok(src.pitch) && w > 0 && h > 0 {
        // The source rows are back to back: fetch the block in one go.
        let start = src
            .base
            .checked_add(u64::from(sy) * w + u64::from(sx) * bpp)
            .ok_or(GttError::OutOfSlice(src.base))?;
        let total = usize::try_from(w * h).map_err(|_| GttError::OutOfSlice(src.base))?;
        let mut block = vec![0u8; total];
        ctx.view.read(src.space, start, &mut block)?;
        for (dy, row) in block.chunks_exact(w as usize).enumerate() {
            put_row(
                ctx,
                dst,
                u64::from(x1) * bpp,
                u64::from(y1) + dy as u64,
                row,
            )?;
        }
        return Ok(());
    }
    let mut row = vec![0u8; w as usize];
    for dy in 0..y2.saturating_sub(y1) {
        get_row(ctx, src, u64::from(sx) * bpp, u64::from(sy + dy), &mut row)?;
        put_row(ctx, dst, u64::from(x1) * bpp, u64::from(y1 + dy), &row)?;
    }
    Ok(())
}

/// Fills `height` rows of `row_bytes` at `pitch` with a repeating 4-byte pattern.
fn fill_linear(
    ctx: &mut Ctx<'_>,
    space: Space,
    base: u64,
    pitch: u64,
    row_bytes: u64,
    height: u64,
    pat: [u8; 4],
) -> Result<(), GttError> {
    let row: Vec<u8> = (0..row_bytes).map(|i| pat[(i % 4) as usize]).collect();
    if pitch == row_bytes {
        // Contiguous: write in large chunks.
        let total = row_bytes * height;
        let chunk: Vec<u8> = (0..(64 * 1024).min(total))
            .map(|i| pat[(i % 4) as usize])
            .collect();
        let mut done = 0u64;
        while done < total {
            let n = (total - done).min(chunk.len() as u64);
            ctx.write(space, base + done, &chunk[..n as usize])?;
            done += n;
        }
        return Ok(());
    }
    for y in 0..height {
        ctx.write(space, base + y * pitch, &row)?;
    }
    Ok(())
}

fn run_3d(
    ctx: &mut Ctx<'_>,
    pipe: &mut PipeState,
    cmd: &ShadowCommand,
    name: &'static str,
    clock: u64,
) -> Result<Outcome, GttError> {
    match name {
        "PIPE_CONTROL" => {
            // PIPE_CONTROL: DW1 post-sync op 15:14, bit 24 GGTT; DW2-3 address; DW4-5 data.
            let op = (dw(cmd, 1) >> 14) & 3;
            if op == 0 {
                return Ok(Outcome::Executed);
            }
            let value = match op {
                1 => u64::from(dw(cmd, 4)) | (u64::from(dw(cmd, 5)) << 32),
                _ => clock,
            };
            // "Store data index" (DW1 bit 21): DW2 is an offset into the context's status page
            // (i915's render flush writes its scratch dword there).
            if let Some(u) = ctx.index_use(cmd) {
                ctx.write_index(u.per_process, u.offset, &value.to_le_bytes())?;
                return Ok(Outcome::Executed);
            }
            if !holds(cmd, 2, 2) {
                return Ok(Outcome::Executed);
            }
            let sp = if dw(cmd, 1) & (1 << 24) != 0 {
                Space::Ggtt
            } else {
                Space::Ppgtt
            };
            let addr = addr48(dw(cmd, 2), dw(cmd, 3), 7);
            ctx.write(sp, addr, &value.to_le_bytes())?;
            Ok(Outcome::Executed)
        }
        _ if pipe.observe(name, cmd) => Ok(Outcome::Executed),
        _ => Ok(Outcome::Skipped(name)),
    }
}

mod mi;

#[cfg(test)]
mod i915_tests;
#[cfg(test)]
mod tests;
