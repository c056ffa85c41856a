//! The reference engine: really executes a subset of GEN commands against guest memory.
//!
//! It runs a shadowed [`Workload`] (control flow already followed by the walk, GGTT addresses
//! already in host slices). Executed: `MI_NOOP`, `MI_BATCH_BUFFER_START/END` (flow), `MI_STORE_DATA_IMM`,
//! `MI_LOAD_REGISTER_IMM`, `MI_FLUSH_DW` and `PIPE_CONTROL` post-sync writes, `MI_USER_INTERRUPT`,
//! `XY_COLOR_BLT`, `XY_SRC_COPY_BLT`, `XY_FAST_COPY_BLT` (linear and X-tiled), and a model of
//! `3DPRIMITIVE` / `GPGPU_WALKER` / the media object that writes the bound render target and depth
//! buffer (or the bound output buffer). Every other valid command is decoded, skipped and counted.
//!
//! A draw is modelled as a deterministic fill of its bound surfaces. Real hardware runs shaders that
//! may write anywhere the context can reach, which is why gmig-cmdparser's write set for a draw is
//! *unknown* and dirty-page narrowing must widen there; the model's own writes are recorded
//! separately ([`crate::vgpu::WriteLog::actual`]) so tests can check candidate sets stay sound.

use crate::gm::Gfn;
use crate::gtt::{GpuView, GttError, Space};
use crate::mmio::lrc;
use crate::vgpu::{FaultKind, GpuFault, ShadowCommand, Vgpu, Workload};

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
    pitch: u64,
    tiling: Tiling,
}

impl Surface {
    /// Address of byte `x` of row `y`, and how many bytes are contiguous from there (within row
    /// length `len`).
    fn span(&self, x: u64, y: u64, len: u64) -> Option<(u64, u64)> {
        match self.tiling {
            Tiling::Linear => Some((
                self.base
                    .checked_add(y.checked_mul(self.pitch)?.checked_add(x)?)?,
                len,
            )),
            Tiling::X => {
                // X tile: 512 bytes x 8 rows = 4 KiB, tiles laid out row-major.
                let tiles_per_row = self.pitch / 512;
                let tile = (y / 8).checked_mul(tiles_per_row)?.checked_add(x / 512)?;
                let off = tile.checked_mul(4096)? + (y % 8) * 512 + x % 512;
                Some((self.base.checked_add(off)?, len.min(512 - x % 512)))
            }
            Tiling::Y => {
                // Legacy Y tile: 128 bytes x 32 rows = 4 KiB, made of 16-byte columns of 32 rows.
                let tiles_per_row = self.pitch / 128;
                let tile = (y / 32).checked_mul(tiles_per_row)?.checked_add(x / 128)?;
                let within = (x % 128) / 16 * 512 + (y % 32) * 16 + x % 16;
                let off = tile.checked_mul(4096)?.checked_add(within)?;
                Some((self.base.checked_add(off)?, len.min(16 - x % 16)))
            }
        }
    }
}

/// Per-workload 3D/media state the draw model needs.
#[derive(Clone, Copy, Debug, Default)]
struct PipeState {
    surface_base: Option<u64>,
    binding_table: Option<u32>,
    depth: Option<(u64, u64, u32, u32)>, // address, pitch, width, height
    depth_clear: u32,
    media_out: Option<(u64, u64, u32, u32)>, // NV12 output: address, pitch, width, height
}

struct Ctx<'a> {
    view: GpuView<'a>,
    written: Vec<Gfn>,
}

impl Ctx<'_> {
    fn write(&mut self, space: Space, addr: u64, data: &[u8]) -> Result<(), GttError> {
        self.view.write(space, addr, data, &mut self.written)
    }
}

/// Register writes and interrupts an executed command asks for.
enum SideEffect {
    Reg(u32, u32),
    Interrupt,
}

/// Executes one workload on the vGPU, then completes its context.
pub(crate) fn execute(vgpu: &mut Vgpu, w: &Workload) {
    let gen = vgpu.cfg.gen;
    let mut effects = Vec::new();
    let mut pipe = PipeState::default();
    let mut fault: Option<String> = None;
    let mut clock = vgpu.stats.clock;
    let mut executed = 0u64;
    let mut skipped: Vec<&'static str> = Vec::new();
    let mut written = Vec::new();
    let mut log = crate::vgpu::WriteLog::default();
    let mut candidate = Vec::new();
    {
        let mut ctx = Ctx {
            view: vgpu.host_view(w.pml4),
            written: Vec::new(),
        };
        for cmd in &w.commands {
            let name = crate::shadow::log_write_set(
                gen,
                w.engine,
                cmd,
                &ctx.view,
                &mut log,
                &mut candidate,
            );
            clock += 1;
            match run_command(&mut ctx, &mut pipe, cmd, name, clock, &mut effects) {
                Ok(Outcome::Executed) => executed += 1,
                Ok(Outcome::Skipped(name)) => skipped.push(name),
                Err(e) => {
                    fault = Some(format!(
                        "{e} at {:#x} ({:?})",
                        cmd.guest_addr, cmd.ctx.level
                    ));
                    break;
                }
            }
        }
        written.append(&mut ctx.written);
    }
    // Sorted, deduplicated bulk builds: far cheaper than inserting page by page.
    written.sort_unstable();
    written.dedup();
    vgpu.stats.max_workload_pages = vgpu.stats.max_workload_pages.max(written.len() as u64);
    candidate.sort_unstable();
    candidate.dedup();
    log.actual = written.into_iter().collect();
    log.candidate = candidate.into_iter().collect();
    vgpu.write_log.merge(log);
    vgpu.stats.clock = clock;
    vgpu.stats.executed += executed;
    for s in skipped {
        *vgpu.stats.skipped.entry(s.to_string()).or_insert(0) += 1;
    }
    for e in effects {
        match e {
            SideEffect::Reg(r, v) => {
                vgpu.vregs.insert(r, v);
            }
            SideEffect::Interrupt => {
                let (reg, bit) = w.engine.user_interrupt();
                *vgpu.vregs.entry(reg).or_insert(0) |= bit;
            }
        }
    }
    match fault {
        Some(reason) => {
            vgpu.report_fault(GpuFault {
                engine: w.engine,
                ctx_id: w.ctx_id(),
                kind: FaultKind::Memory,
                reason,
            });
        }
        None => vgpu.stats.workloads += 1,
    }
    vgpu.write_ctx_state(w.lrca, lrc::RING_HEAD, w.ring_tail);
    vgpu.complete_csb(w.engine, w.ctx_id());
}

enum Outcome {
    Executed,
    Skipped(&'static str),
}

fn dw(cmd: &ShadowCommand, i: usize) -> u32 {
    cmd.dwords.get(i).copied().unwrap_or(0)
}

fn run_command(
    ctx: &mut Ctx<'_>,
    pipe: &mut PipeState,
    cmd: &ShadowCommand,
    name: &'static str,
    clock: u64,
    effects: &mut Vec<SideEffect>,
) -> Result<Outcome, GttError> {
    match dw(cmd, 0) >> 29 {
        0 => run_mi(ctx, cmd, name, clock, effects),
        2 => run_2d(ctx, cmd, name),
        _ => run_3d(ctx, pipe, cmd, name, clock),
    }
}

fn run_mi(
    ctx: &mut Ctx<'_>,
    cmd: &ShadowCommand,
    name: &'static str,
    clock: u64,
    effects: &mut Vec<SideEffect>,
) -> Result<Outcome, GttError> {
    let d0 = dw(cmd, 0);
    match name {
        "MI_USER_INTERRUPT" => {
            effects.push(SideEffect::Interrupt);
            Ok(Outcome::Executed)
        }
        // Flow was already followed by the walk.
        "MI_NOOP" | "MI_BATCH_BUFFER_END" | "MI_BATCH_BUFFER_START" => Ok(Outcome::Executed),
        "MI_STORE_DATA_IMM" => {
            // MI_STORE_DATA_IMM: DW1-2 address, DW3.. data.
            let space = if d0 & (1 << 22) != 0 {
                Space::Ggtt
            } else {
                Space::Ppgtt
            };
            let addr = addr48(dw(cmd, 1), dw(cmd, 2), 3);
            let data: Vec<u8> = cmd
                .dwords
                .iter()
                .skip(3)
                .flat_map(|d| d.to_le_bytes())
                .collect();
            ctx.write(space, addr, &data)?;
            Ok(Outcome::Executed)
        }
        "MI_LOAD_REGISTER_IMM" => {
            // MI_LOAD_REGISTER_IMM: (register, value) pairs.
            for pair in cmd.dwords.get(1..).unwrap_or(&[]).chunks_exact(2) {
                effects.push(SideEffect::Reg(pair[0] & 0x7f_fffc, pair[1]));
            }
            Ok(Outcome::Executed)
        }
        "MI_FLUSH_DW" => {
            // MI_FLUSH_DW: post-sync op in DW0 15:14, DW1 bit 2 = GGTT.
            let op = (d0 >> 14) & 3;
            if op == 0 {
                return Ok(Outcome::Executed);
            }
            let space = if dw(cmd, 1) & (1 << 2) != 0 {
                Space::Ggtt
            } else {
                Space::Ppgtt
            };
            let addr = addr48(dw(cmd, 1), dw(cmd, 2), 7);
            let value = if op == 1 {
                u64::from(dw(cmd, 3)) | (u64::from(dw(cmd, 4)) << 32)
            } else {
                clock
            };
            let len = if op == 1 && cmd.dwords.len() < 5 {
                4
            } else {
                8
            };
            ctx.write(space, addr, &value.to_le_bytes()[..len])?;
            Ok(Outcome::Executed)
        }
        _ => Ok(Outcome::Skipped(name)),
    }
}

fn run_2d(ctx: &mut Ctx<'_>, cmd: &ShadowCommand, name: &'static str) -> Result<Outcome, GttError> {
    let d0 = dw(cmd, 0);
    let space = cmd.space;
    match name {
        "XY_COLOR_BLT" => {
            // XY_COLOR_BLT: DW1 BR13, DW2 top-left, DW3 bottom-right (exclusive), DW4-5 dst, DW6 colour.
            let bpp = br13_bpp(dw(cmd, 1));
            let tiled = d0 & (1 << 11) != 0;
            let pitch = u64::from(dw(cmd, 1) & 0xffff) * if tiled { 4 } else { 1 };
            let dst = Surface {
                space,
                base: addr48(dw(cmd, 4), dw(cmd, 5), 0),
                pitch,
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
                pitch: u64::from(dw(cmd, 1) & 0xffff) * if dt { 4 } else { 1 },
                tiling: if dt { Tiling::X } else { Tiling::Linear },
            };
            let src = Surface {
                space,
                base: addr48(dw(cmd, 8), dw(cmd, 9), 0),
                pitch: u64::from(dw(cmd, 7) & 0xffff) * if st { 4 } else { 1 },
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
                pitch: u64::from(pitch & 0xffff) * if t == 0 { 1 } else { 4 },
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
    if src.tiling == Tiling::Linear && src.pitch == w && w > 0 && h > 0 {
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
    let space = cmd.space;
    match name {
        "PIPE_CONTROL" => {
            // PIPE_CONTROL: DW1 post-sync op 15:14, bit 24 GGTT; DW2-3 address; DW4-5 data.
            let op = (dw(cmd, 1) >> 14) & 3;
            if op == 0 {
                return Ok(Outcome::Executed);
            }
            let sp = if dw(cmd, 1) & (1 << 24) != 0 {
                Space::Ggtt
            } else {
                Space::Ppgtt
            };
            let addr = addr48(dw(cmd, 2), dw(cmd, 3), 7);
            let value = match op {
                1 => u64::from(dw(cmd, 4)) | (u64::from(dw(cmd, 5)) << 32),
                _ => clock,
            };
            ctx.write(sp, addr, &value.to_le_bytes())?;
            Ok(Outcome::Executed)
        }
        "STATE_BASE_ADDRESS" => {
            // STATE_BASE_ADDRESS: DW4-5 surface state base (bit 0 = modify).
            if dw(cmd, 4) & 1 != 0 {
                pipe.surface_base = Some(addr48(dw(cmd, 4), dw(cmd, 5), 0xfff));
            }
            Ok(Outcome::Executed)
        }
        "3DSTATE_BINDING_TABLE_POINTERS_PS" => {
            // 3DSTATE_BINDING_TABLE_POINTERS_PS.
            pipe.binding_table = Some(dw(cmd, 1) & 0xffe0);
            Ok(Outcome::Executed)
        }
        "3DSTATE_DEPTH_BUFFER" => {
            // 3DSTATE_DEPTH_BUFFER: DW1 pitch-1 17:0; DW2-3 address; DW4 height-1 31:18, width-1 17:4.
            let pitch = u64::from(dw(cmd, 1) & 0x3ffff) + 1;
            let addr = addr48(dw(cmd, 2), dw(cmd, 3), 0);
            let h = ((dw(cmd, 4) >> 18) & 0x3fff) + 1;
            let w = ((dw(cmd, 4) >> 4) & 0x3fff) + 1;
            pipe.depth = (addr != 0).then_some((addr, pitch, w, h));
            Ok(Outcome::Executed)
        }
        "3DSTATE_CLEAR_PARAMS" => {
            // 3DSTATE_CLEAR_PARAMS: DW1 depth clear value.
            pipe.depth_clear = dw(cmd, 1);
            Ok(Outcome::Executed)
        }
        "3DPRIMITIVE" | "GPGPU_WALKER" => {
            // 3DPRIMITIVE / GPGPU_WALKER: the bound surface (binding table entry 0) is rewritten
            // with a colour derived from the command; a draw also rewrites the depth buffer.
            let seed = cmd
                .dwords
                .iter()
                .fold(0x811c_9dc5u32, |h, d| (h ^ d).wrapping_mul(0x0100_0193));
            if let (Some(base), Some(bt)) = (pipe.surface_base, pipe.binding_table) {
                let entry = ctx.view.read_u32(space, base + u64::from(bt))?;
                let ss = base + u64::from(entry & !0x3f);
                let mut s = [0u8; 64];
                ctx.view.read(space, ss, &mut s)?;
                let rd = |i: usize| {
                    u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]])
                };
                let width = u64::from(rd(2) & 0x3fff) + 1;
                let height = u64::from((rd(2) >> 16) & 0x3fff) + 1;
                let pitch = u64::from(rd(3) & 0x3ffff) + 1;
                let addr = addr48(rd(8), rd(9), 0);
                fill_linear(
                    ctx,
                    space,
                    addr,
                    pitch,
                    width * 4,
                    height,
                    seed.to_le_bytes(),
                )?;
            }
            if name == "3DPRIMITIVE" {
                if let Some((addr, pitch, w, h)) = pipe.depth {
                    let v = pipe.depth_clear ^ (seed & 0xff);
                    fill_linear(
                        ctx,
                        space,
                        addr,
                        pitch,
                        u64::from(w) * 4,
                        u64::from(h),
                        v.to_le_bytes(),
                    )?;
                }
            }
            Ok(Outcome::Executed)
        }
        "MFX_SURFACE_STATE" => {
            // MFX_SURFACE_STATE (video): DW2 height-1 31:18, width-1 17:4; DW3 pitch-1 19:3.
            let h = ((dw(cmd, 2) >> 18) & 0x3fff) + 1;
            let w = ((dw(cmd, 2) >> 4) & 0x3fff) + 1;
            let pitch = u64::from((dw(cmd, 3) >> 3) & 0x1ffff) + 1;
            let addr = pipe.media_out.map(|m| m.0).unwrap_or(0);
            pipe.media_out = Some((addr, pitch, w, h));
            Ok(Outcome::Executed)
        }
        "MFX_PIPE_BUF_ADDR_STATE" => {
            // MFX_PIPE_BUF_ADDR_STATE: DW1-2 pre-deblocking destination.
            let addr = addr48(dw(cmd, 1), dw(cmd, 2), 0x3f);
            let m = pipe.media_out.unwrap_or((0, 0, 0, 0));
            pipe.media_out = Some((addr, m.1, m.2, m.3));
            Ok(Outcome::Executed)
        }
        "MFD_AVC_BSD_OBJECT" => {
            // MFD_AVC_BSD_OBJECT: decode one picture into the NV12 destination:
            // luma (height rows) then interleaved chroma (height / 2 rows).
            if let Some((addr, pitch, w, h)) = pipe.media_out.filter(|m| m.0 != 0) {
                let seed = cmd
                    .dwords
                    .iter()
                    .fold(0x9e37_79b9u32, |h, d| (h ^ d).wrapping_mul(0x0100_0193));
                let rows = u64::from(h) + u64::from(h) / 2;
                fill_linear(
                    ctx,
                    space,
                    addr,
                    pitch,
                    u64::from(w),
                    rows,
                    seed.to_le_bytes(),
                )?;
            }
            Ok(Outcome::Executed)
        }
        _ => Ok(Outcome::Skipped(name)),
    }
}

#[cfg(test)]
mod tests {
    use gmig_cmdparser::build::{self, Rect};
    use gmig_cmdparser::{BatchContext, GgttOffset};
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::gm::{HostConfig, PartitionManager, VgpuType, PAGE_SIZE};
    use crate::gtt::new_guest_ram;
    use crate::mmio::{self, EngineId};
    use crate::vgpu::{VgpuConfig, Workload};

    /// A vGPU whose hidden slice's first `pages` pages map guest RAM from 1 MiB up.
    fn setup(pages: u64) -> (Vgpu, u64) {
        let mut pm = PartitionManager::new(HostConfig::default()).unwrap();
        let (_, s) = pm.place(VgpuType::V5_8).unwrap();
        let mut v = Vgpu::new(
            VgpuConfig::new(VgpuType::V5_8, 1),
            s,
            new_guest_ram(8 << 20).unwrap(),
        )
        .unwrap();
        let base = s.hidden.base.0;
        for p in 0..pages {
            let e = mmio::GTT_MMIO_BASE + ((base / PAGE_SIZE + p) * 8) as u32;
            v.mmio_write64(e, ((1 << 20) + p * PAGE_SIZE) | 1).unwrap();
        }
        (v, base)
    }

    fn run(v: &mut Vgpu, engine: EngineId, cmds: Vec<Vec<u32>>) {
        let w = Workload {
            seq: 0,
            engine,
            desc: 1 << 32,
            lrca: GgttOffset(0),
            ring_tail: 0,
            pml4: None,
            commands: cmds
                .into_iter()
                .map(|dwords| ShadowCommand {
                    ctx: BatchContext::RING,
                    space: Space::Ggtt,
                    guest_addr: 0,
                    dwords,
                })
                .collect(),
        };
        execute(v, &w);
    }

    /// A 32 bpp XY_FAST_COPY_BLT (the encoding IGT and i915 use: depth 3 = 32 bpp).
    fn fast_copy(dst: u64, dst_pitch: i16, r: Rect, src: u64, src_pitch: i16) -> Vec<u32> {
        gmig_cmdparser::build::xy_fast_copy_blt(dst, dst_pitch, r, src, src_pitch, 0, 0, 4)
    }

    fn gpa_of(base: u64, gpu: u64) -> GuestAddress {
        GuestAddress((1 << 20) + (gpu - base))
    }

    #[test]
    fn copies_through_an_x_tiled_surface_and_back() {
        let (mut v, base) = setup(64);
        let (a, b, c) = (base, base + 16 * PAGE_SIZE, base + 40 * PAGE_SIZE);
        // A: 200x16 pixels, pitch 800, a gradient.
        let img: Vec<u8> = (0..800 * 16).map(|i| (i * 31 % 253) as u8).collect();
        v.guest_memory().write_slice(&img, gpa_of(base, a)).unwrap();
        let rect = Rect {
            x1: 0,
            y1: 0,
            x2: 200,
            y2: 16,
        };
        // A -> B (X-tiled, pitch 1024 bytes = 256 dwords), B -> C (linear).
        let mut to_tiled = build::xy_src_copy_blt(b, 256, rect, a, 800, 0, 0, 4);
        to_tiled[0] |= 1 << 11;
        let mut from_tiled = build::xy_src_copy_blt(c, 800, rect, b, 256, 0, 0, 4);
        from_tiled[0] |= 1 << 15;
        run(&mut v, EngineId::Blitter, vec![to_tiled, from_tiled]);
        assert!(v.faults().is_empty(), "{:?}", v.faults());
        let mut out = vec![0u8; img.len()];
        v.guest_memory()
            .read_slice(&mut out, gpa_of(base, c))
            .unwrap();
        assert_eq!(out, img);
        // Pixel (150, 9) lives in tile 3 (second tile row, second column), row 1, byte 88.
        let mut px = [0u8; 4];
        v.guest_memory()
            .read_slice(&mut px, gpa_of(base, b + 3 * 4096 + 512 + 88))
            .unwrap();
        let want = &img[9 * 800 + 600..9 * 800 + 604];
        assert_eq!(&px, want);
    }

    #[test]
    fn fast_copies_through_a_y_tiled_surface_and_back() {
        let (mut v, base) = setup(64);
        let (a, b, c) = (base, base + 16 * PAGE_SIZE, base + 40 * PAGE_SIZE);
        // A: 64x40 pixels linear (pitch 256); B: Y-tiled, pitch 256 bytes = 2 tiles per row.
        let img: Vec<u8> = (0..256 * 40).map(|i| (i * 13 % 251) as u8).collect();
        v.guest_memory().write_slice(&img, gpa_of(base, a)).unwrap();
        let rect = Rect {
            x1: 0,
            y1: 0,
            x2: 64,
            y2: 40,
        };
        let mut to_tiled = fast_copy(b, 64, rect, a, 256);
        to_tiled[0] |= 2 << 13;
        let mut from_tiled = fast_copy(c, 256, rect, b, 64);
        from_tiled[0] |= 2 << 20;
        run(&mut v, EngineId::Blitter, vec![to_tiled, from_tiled]);
        assert!(v.faults().is_empty(), "{:?}", v.faults());
        let mut out = vec![0u8; img.len()];
        v.guest_memory()
            .read_slice(&mut out, gpa_of(base, c))
            .unwrap();
        assert_eq!(out, img);
        // Pixel (37, 33): byte 148 of row 33 -> tile 3 (second row, second column), column 1,
        // row 1, byte 4.
        let mut px = [0u8; 4];
        v.guest_memory()
            .read_slice(&mut px, gpa_of(base, b + 3 * 4096 + 512 + 16 + 4))
            .unwrap();
        assert_eq!(&px, &img[33 * 256 + 148..33 * 256 + 152]);
        assert!(v.stats().skipped.is_empty());
    }

    #[test]
    fn color_fill_and_fast_copy() {
        let (mut v, base) = setup(16);
        let (a, b) = (base, base + 8 * PAGE_SIZE);
        let fill = build::xy_color_blt(
            a,
            256,
            4,
            Rect {
                x1: 4,
                y1: 2,
                x2: 8,
                y2: 3,
            },
            0x1122_3344,
        );
        let copy = fast_copy(
            b,
            256,
            Rect {
                x1: 0,
                y1: 0,
                x2: 64,
                y2: 4,
            },
            a,
            256,
        );
        run(&mut v, EngineId::Blitter, vec![fill, copy]);
        let mut row = vec![0u8; 256];
        v.guest_memory()
            .read_slice(&mut row, gpa_of(base, b + 2 * 256))
            .unwrap();
        assert_eq!(&row[..16], &[0u8; 16]);
        assert_eq!(&row[16..32], &[0x44, 0x33, 0x22, 0x11].repeat(4)[..]);
        assert_eq!(&row[32..], &vec![0u8; 224][..]);
        assert_eq!(v.stats().executed, 2);
    }

    #[test]
    fn post_sync_writes_and_interrupts() {
        let (mut v, base) = setup(4);
        run(
            &mut v,
            EngineId::Render,
            vec![
                build::mi_store_data_imm(gmig_cmdparser::AddressSpace::Ggtt, base + 8, &[0xabcd]),
                build::pipe_control(Some((
                    gmig_cmdparser::AddressSpace::Ggtt,
                    base + 16,
                    0x1_0000_0002,
                ))),
                build::mi_flush_dw(Some((gmig_cmdparser::AddressSpace::Ggtt, base + 32, 7))),
                build::mi_load_register_imm(&[(0x2600, 99)]),
                build::mi_user_interrupt(),
            ],
        );
        let mut m = [0u8; 40];
        v.guest_memory()
            .read_slice(&mut m, gpa_of(base, base))
            .unwrap();
        assert_eq!(u32::from_le_bytes(m[8..12].try_into().unwrap()), 0xabcd);
        assert_eq!(
            u64::from_le_bytes(m[16..24].try_into().unwrap()),
            0x1_0000_0002
        );
        assert_eq!(u64::from_le_bytes(m[32..40].try_into().unwrap()), 7);
        assert_eq!(v.mmio_read32(0x2600).unwrap(), 99);
        assert_eq!(v.mmio_read32(mmio::GT_IIR0).unwrap() & 1, 1);
        let log = v.take_write_log();
        assert!(!log.unknown);
        assert!(log.actual.is_subset(&log.candidate));
    }

    #[test]
    fn a_draw_rewrites_render_target_and_depth() {
        let (mut v, base) = setup(32);
        let heap = base;
        let rt = base + PAGE_SIZE;
        let depth = base + 9 * PAGE_SIZE;
        // Binding table entry 0 -> SURFACE_STATE at 64: 32x16, pitch 128.
        let mut ss = [0u32; 16];
        ss[2] = (15 << 16) | 31;
        ss[3] = 127;
        ss[8] = rt as u32;
        let mut bytes = 64u32.to_le_bytes().to_vec();
        bytes.resize(64, 0);
        bytes.extend(ss.iter().flat_map(|d| d.to_le_bytes()));
        v.guest_memory()
            .write_slice(&bytes, gpa_of(base, heap))
            .unwrap();
        let mut db = vec![0u32; 8];
        db[0] = 0x7805_0006;
        db[1] = 127;
        db[2] = depth as u32;
        db[4] = (15 << 18) | (31 << 4);
        run(
            &mut v,
            EngineId::Render,
            vec![
                build::state_base_address(heap, heap),
                vec![0x782a_0000, 0],
                db,
                vec![0x7804_0001, 0x3f80_0000, 1],
                build::primitive_3d(3),
            ],
        );
        assert!(v.faults().is_empty(), "{:?}", v.faults());
        let mut px = [0u8; 4];
        v.guest_memory()
            .read_slice(&mut px, gpa_of(base, rt + 15 * 128 + 124))
            .unwrap();
        assert_ne!(px, [0; 4], "last pixel of the render target written");
        v.guest_memory()
            .read_slice(&mut px, gpa_of(base, depth + 15 * 128 + 124))
            .unwrap();
        assert_ne!(px, [0; 4], "last depth value written");
        let log = v.take_write_log();
        assert!(log.unknown, "a draw's write set is unknown to the parser");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]
        #[test]
        fn any_command_soup_executes_without_panicking(
            cmds in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u32>(), 1..24), 1..16),
            engine in 0usize..4,
        ) {
            let (mut v, _) = setup(8);
            run(&mut v, EngineId::ALL[engine], cmds);
            proptest::prop_assert_eq!(v.stats().workloads + v.stats().refused, 1);
        }
    }
}
