//! The walker: ring → first-level batch → second-level batch.
//!
//! - The ring is read from `head` to `tail`, wrapping at its end; a command may straddle the wrap.
//! - MI_BATCH_BUFFER_START in the ring starts a first-level batch; when that batch (or one it
//!   chained to) ends with MI_BATCH_BUFFER_END, the walk returns to the ring after the start
//!   command.
//! - In a first-level batch, MI_BATCH_BUFFER_START with the second-level bit (DW0 bit 22) calls a
//!   second-level batch, which returns to the command after the call; without it, it chains
//!   (jumps, never returns).
//! - MI_BATCH_BUFFER_START inside a second-level batch, and a second-level call from the ring, are
//!   errors.
//! - A batch started through the GGTT from a privileged buffer is privileged; any other is not.
//! - A [`Budget`] bounds commands, batch bytes and batch starts, so that a batch that chains to
//!   itself ends in [`WalkError::Budget`], not a hang.
//!
//! Memory is read only through the caller's [`GpuMemory`]; batches are fetched page by page, so
//! the memory must not change during a walk.
//!
//! [`audit_walk`] and [`remap_walk`] also follow the indirect state of privileged buffers
//! ([`IndirectState`]): the RENDER_SURFACE_STATEs a privileged draw or dispatch uses hold GGTT
//! addresses that no command field shows. Each such surface state must lie in the vGPU's slices
//! and name surfaces inside them; the remap rebases its address fields in memory like command
//! fields (each surface state once per walk). Unprivileged buffers' state is PPGTT-addressed and
//! needs neither.

use thiserror::Error;

use std::collections::HashSet;

use crate::addr::{
    AddressSpace, GgttOffset, SliceMove, VgpuSlices, GTT_PAGE_SIZE, MAX_SURFACE_BYTES,
};
use crate::audit::{self, AuditError, AuditReport};
use crate::decode::{BatchContext, BatchLevel, DecodeError, Decoded};
use crate::indirect::{
    surface_state_addresses, IndirectState, StateAddress, SurfaceKey, Work, SURFACE_STATE_BYTES,
};
use crate::memory::{GpuMemory, GpuMemoryMut, MemoryError};
use crate::remap::{self, RemapError, RemapStats};
use crate::table::{self, CommandDesc, Engine, Gen, Hook};

/// A ring buffer: `size` bytes at `start` in the GGTT, commands from `head` up to `tail`
/// (byte offsets into the ring; `head > tail` wraps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RingSpan {
    /// GGTT offset of the ring.
    pub start: GgttOffset,
    /// Ring size in bytes (a multiple of 4 KiB).
    pub size: u64,
    /// Offset of the first command.
    pub head: u64,
    /// Offset one past the last command.
    pub tail: u64,
}

/// Bounds on the work of one walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Budget {
    /// Commands decoded, all levels together.
    pub max_commands: u64,
    /// Bytes of commands read from the ring and batches.
    pub max_batch_bytes: u64,
    /// MI_BATCH_BUFFER_START commands followed.
    pub max_batches: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_commands: 1 << 20,
            max_batch_bytes: 64 << 20,
            max_batches: 4096,
        }
    }
}

/// Why a walk stopped.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum WalkError {
    /// The ring description is invalid.
    #[error("bad ring: start 0x{start:x} size 0x{size:x} head 0x{head:x} tail 0x{tail:x}")]
    BadRing {
        /// Ring start.
        start: u64,
        /// Ring size.
        size: u64,
        /// Head offset.
        head: u64,
        /// Tail offset.
        tail: u64,
    },
    /// A command did not decode.
    #[error("{space} 0x{addr:x}: {err}")]
    Decode {
        /// Space of the buffer.
        space: AddressSpace,
        /// Address of the command.
        addr: u64,
        /// The error (offset: dwords from the buffer start).
        err: DecodeError,
    },
    /// Memory could not be read or written.
    #[error("memory: {0}")]
    Memory(#[from] MemoryError),
    /// The budget ran out.
    #[error("budget of {what} exhausted (limit {limit})")]
    Budget {
        /// Which budget.
        what: &'static str,
        /// Its limit.
        limit: u64,
    },
    /// MI_BATCH_BUFFER_START in a second-level batch, or a second-level call from the ring.
    #[error("{space} 0x{addr:x}: illegal batch nesting")]
    Nesting {
        /// Space of the buffer.
        space: AddressSpace,
        /// Address of the command.
        addr: u64,
    },
    /// A command failed the audit.
    #[error("{space} 0x{addr:x}: {err}")]
    Audit {
        /// Space of the buffer.
        space: AddressSpace,
        /// Address of the command.
        addr: u64,
        /// The error (offset: dwords from the buffer start).
        err: AuditError,
    },
    /// A command could not be remapped.
    #[error("{space} 0x{addr:x}: {err}")]
    Remap {
        /// Space of the buffer.
        space: AddressSpace,
        /// Address of the command.
        addr: u64,
        /// The error.
        err: RemapError,
    },
    /// The visitor refused a command.
    #[error("{space} 0x{addr:x}: {reason}")]
    Rejected {
        /// Space of the buffer.
        space: AddressSpace,
        /// Address of the command.
        addr: u64,
        /// Why.
        reason: &'static str,
    },
}

/// Result type of this module.
pub type Result<T> = core::result::Result<T, WalkError>;

/// A command met during a walk.
#[derive(Clone, Copy, Debug)]
pub struct WalkedCommand<'a> {
    /// The command (its `offset` counts dwords from the start of its buffer: the ring head, or
    /// the batch start).
    pub cmd: Decoded<'a>,
    /// Space the command was fetched through.
    pub space: AddressSpace,
    /// Address of DW0.
    pub addr: u64,
    /// The buffer's context.
    pub ctx: BatchContext,
    wrap: Option<(u64, u64)>,
}

impl WalkedCommand<'_> {
    /// Address of dword `i` of the command (following the ring's wrap).
    pub fn dword_addr(&self, i: usize) -> u64 {
        let delta = (i as u64).saturating_mul(4);
        match self.wrap {
            Some((start, size)) if size != 0 => {
                let off = self.addr.wrapping_sub(start).wrapping_add(delta) % size;
                start.wrapping_add(off)
            }
            _ => self.addr.wrapping_add(delta),
        }
    }
}

/// What a walk saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkSummary {
    /// Commands visited.
    pub commands: u64,
    /// Batch starts followed.
    pub batches: u64,
    /// Command bytes read.
    pub bytes: u64,
}

/// Visitor callback type.
pub type Visit<'v> = dyn FnMut(&WalkedCommand<'_>) -> Result<()> + 'v;

struct Walker<'m, 'v, 'f, M: GpuMemory + ?Sized> {
    gen: Gen,
    engine: Engine,
    mem: &'m M,
    budget: Budget,
    sum: WalkSummary,
    visit: &'v mut Visit<'f>,
    table: table::Table,
    buf: Vec<u32>,
    /// One cached page of the buffer being walked: (space, page address) and its dwords.
    page_at: Option<(AddressSpace, u64)>,
    page: Vec<u32>,
    /// Whether [`Walker::run_in_page`] runs (tests turn it off to compare with the general path).
    in_page: bool,
}

impl<'m, 'v, 'f, M: GpuMemory + ?Sized> Walker<'m, 'v, 'f, M> {
    fn new(gen: Gen, engine: Engine, mem: &'m M, budget: Budget, visit: &'v mut Visit<'f>) -> Self {
        Walker {
            gen,
            engine,
            mem,
            budget,
            sum: WalkSummary::default(),
            visit,
            table: table::Table::new(gen, engine),
            buf: Vec::new(),
            page_at: None,
            page: Vec::new(),
            in_page: true,
        }
    }
}

/// What the batch loop needs of a command once it has been visited.
struct Step {
    len: usize,
    hook: Hook,
    /// Where a BB_START goes (unused for other commands).
    target: (AddressSpace, u64),
    second_level: bool,
}

/// Counts a command against the walk's budget.
fn charge(sum: &mut WalkSummary, budget: &Budget, dwords: usize) -> Result<()> {
    sum.commands += 1;
    if sum.commands > budget.max_commands {
        return Err(WalkError::Budget {
            what: "commands",
            limit: budget.max_commands,
        });
    }
    sum.bytes = sum.bytes.saturating_add((dwords as u64).saturating_mul(4));
    if sum.bytes > budget.max_batch_bytes {
        return Err(WalkError::Budget {
            what: "batch bytes",
            limit: budget.max_batch_bytes,
        });
    }
    Ok(())
}

/// Target of a BB_START: (space, address).
fn bb_target(cmd: &Decoded<'_>, ctx: &BatchContext) -> (AddressSpace, u64) {
    match cmd.addresses(ctx).next() {
        Some(u) => (u.space, u.addr),
        None => (AddressSpace::Ggtt, 0),
    }
}

/// Hands a batch command to the visitor and keeps what the batch loop needs of it.
fn visit_one(
    visit: &mut Visit<'_>,
    cmd: Decoded<'_>,
    space: AddressSpace,
    addr: u64,
    ctx: BatchContext,
) -> Result<Step> {
    let w = WalkedCommand {
        cmd,
        space,
        addr,
        ctx,
        wrap: None,
    };
    visit(&w)?;
    let hook = w.cmd.desc.hook;
    let target = match hook {
        Hook::BatchStart => bb_target(&w.cmd, &ctx),
        _ => (AddressSpace::Ggtt, 0),
    };
    Ok(Step {
        len: w.cmd.len(),
        hook,
        target,
        second_level: w.cmd.is_second_level_call(),
    })
}

/// Largest command: a 16-bit length field plus bias.
const MAX_CMD_DWORDS: usize = (1 << 16) + 2;

impl<M: GpuMemory + ?Sized> Walker<'_, '_, '_, M> {
    fn charge(&mut self, dwords: usize) -> Result<()> {
        charge(&mut self.sum, &self.budget, dwords)
    }

    fn start_batch(&mut self) -> Result<()> {
        self.sum.batches += 1;
        if self.sum.batches > self.budget.max_batches {
            return Err(WalkError::Budget {
                what: "batches",
                limit: self.budget.max_batches,
            });
        }
        Ok(())
    }

    /// Reads dwords at `addr` (4-byte aligned) through a one-page cache: batches are read a
    /// page at a time. A page that cannot be read whole is read piecemeal, uncached.
    fn read(&mut self, space: AddressSpace, addr: u64, out: &mut [u32]) -> Result<()> {
        let page_dwords = (GTT_PAGE_SIZE / 4) as usize;
        let mut at = addr;
        let mut done = 0usize;
        while done < out.len() {
            let page = at & !(GTT_PAGE_SIZE - 1);
            let first = ((at - page) / 4) as usize;
            let n = (page_dwords - first).min(out.len() - done);
            let dst = out.get_mut(done..done + n).unwrap_or(&mut []);
            if self.page_at != Some((space, page)) && !self.cache_page(space, page) {
                self.mem.read_dwords(space, at, dst)?;
            } else if let Some(src) = self.page.get(first..first + n) {
                dst.copy_from_slice(src);
            }
            done += n;
            at = at
                .checked_add((n as u64) * 4)
                .ok_or(MemoryError::Overflow {
                    space,
                    addr,
                    len: out.len() * 4,
                })?;
        }
        Ok(())
    }

    /// Fetches the command at `addr` into `self.buf`; returns its length in dwords.
    fn fetch(&mut self, space: AddressSpace, addr: u64, offset: usize) -> Result<usize> {
        if !addr.is_multiple_of(4) {
            return Err(WalkError::Rejected {
                space,
                addr,
                reason: "command address is not dword aligned",
            });
        }
        let len = self.command_len(space, addr, offset)?;
        let bytes = self.room_for(len)?;
        addr.checked_add(bytes).ok_or(MemoryError::Overflow {
            space,
            addr,
            len: len * 4,
        })?;
        let mut buf = core::mem::take(&mut self.buf);
        buf.clear();
        buf.resize(len, 0);
        let r = self.read(space, addr, &mut buf);
        self.buf = buf;
        r?;
        Ok(len)
    }

    /// Decodes, charges and visits the command at `addr`. A command inside the cached page is
    /// decoded where it lies (no copy, one table lookup); one that crosses a page, or sits where
    /// no page could be cached, goes through [`Walker::fetch`]'s copy.
    fn step(
        &mut self,
        space: AddressSpace,
        addr: u64,
        offset: usize,
        ctx: BatchContext,
    ) -> Result<Step> {
        if let Some((first, desc, len)) = self.cached_command(space, addr, offset)? {
            self.room_for(len)?;
            let rest = self.page.get(first..first + len).unwrap_or(&[]);
            let cmd = crate::decode::decode_desc(desc, len, self.gen, self.engine, rest, offset)
                .map_err(|err| WalkError::Decode { space, addr, err })?;
            charge(&mut self.sum, &self.budget, cmd.len())?;
            return visit_one(self.visit, cmd, space, addr, ctx);
        }
        self.fetch(space, addr, offset)?;
        let buf = core::mem::take(&mut self.buf);
        let r = crate::decode::decode_one(self.gen, self.engine, &buf, offset)
            .map_err(|err| WalkError::Decode { space, addr, err })
            .and_then(|cmd| {
                charge(&mut self.sum, &self.budget, cmd.len())?;
                visit_one(self.visit, cmd, space, addr, ctx)
            });
        self.buf = buf;
        r
    }

    /// The command at `addr` when the page it starts in is (now) cached and holds all of it:
    /// its first dword's index in the page, its row and its length; `None` otherwise. An unknown
    /// opcode is the error [`Walker::fetch`] would give.
    fn cached_command(
        &mut self,
        space: AddressSpace,
        addr: u64,
        offset: usize,
    ) -> Result<Option<(usize, &'static CommandDesc, usize)>> {
        if !addr.is_multiple_of(4) {
            return Ok(None);
        }
        let page = addr & !(GTT_PAGE_SIZE - 1);
        if self.page_at != Some((space, page)) && !self.cache_page(space, page) {
            return Ok(None);
        }
        let first = ((addr - page) / 4) as usize;
        let Some(&dw0) = self.page.get(first) else {
            return Ok(None);
        };
        let (desc, len) = self.row_of(space, addr, offset, dw0)?;
        Ok((first + len.max(1) <= self.page.len()).then_some((first, desc, len)))
    }

    /// Caches the page at `page` (page aligned); `false` when it cannot be read whole.
    fn cache_page(&mut self, space: AddressSpace, page: u64) -> bool {
        self.page.resize((GTT_PAGE_SIZE / 4) as usize, 0);
        let ok = self.mem.read_dwords(space, page, &mut self.page).is_ok();
        self.page_at = ok.then_some((space, page));
        ok
    }

    /// The row and length (in dwords, as DW0 gives it: possibly 0, which decoding refuses) of
    /// the command whose DW0 at `addr` is `dw0`; an unknown opcode is a decode error.
    fn row_of(
        &self,
        space: AddressSpace,
        addr: u64,
        offset: usize,
        dw0: u32,
    ) -> Result<(&'static CommandDesc, usize)> {
        self.table.lookup_len(dw0).ok_or(WalkError::Decode {
            space,
            addr,
            err: DecodeError::UnknownOpcode { offset, dw0 },
        })
    }

    /// Reads the DW0 at `addr` (caching its page when it can) and returns the command's length
    /// in dwords; an unknown opcode is a decode error.
    fn command_len(&mut self, space: AddressSpace, addr: u64, offset: usize) -> Result<usize> {
        let mut dw0 = [0u32; 1];
        self.read(space, addr, &mut dw0)?;
        Ok(self
            .row_of(space, addr, offset, dw0[0])?
            .1
            .clamp(1, MAX_CMD_DWORDS))
    }

    /// Checks that a command of `len` dwords fits the batch-bytes budget; returns its bytes.
    fn room_for(&self, len: usize) -> Result<u64> {
        let bytes = (len as u64) * 4;
        if self.sum.bytes.saturating_add(bytes) > self.budget.max_batch_bytes {
            return Err(WalkError::Budget {
                what: "batch bytes",
                limit: self.budget.max_batch_bytes,
            });
        }
        Ok(bytes)
    }

    /// Visits the commands from `addr` on that lie wholly inside its page (cached here) and
    /// neither start nor end a batch, in a loop without [`Walker::step`]'s per-command `Result`s;
    /// returns the address of the first command it left to [`Walker::step`]. A command that does
    /// not decode, or would exceed the budget, is left there too, so that it fails exactly as it
    /// does on the general path.
    #[inline]
    fn run_in_page(
        &mut self,
        space: AddressSpace,
        mut addr: u64,
        start: u64,
        ctx: BatchContext,
    ) -> Result<u64> {
        let page = addr & !(GTT_PAGE_SIZE - 1);
        if !self.in_page
            || !addr.is_multiple_of(4)
            || (self.page_at != Some((space, page)) && !self.cache_page(space, page))
        {
            return Ok(addr);
        }
        let Walker {
            gen,
            engine,
            budget,
            sum,
            visit,
            table,
            page: words,
            ..
        } = self;
        let mut i = ((addr - page) / 4) as usize;
        while let Some(&dw0) = words.get(i) {
            let Some((desc, len)) = table.lookup_len(dw0) else {
                break;
            };
            let bytes = (len as u64) * 4;
            let (Some(rest), Some(next)) = (words.get(i..i + len), addr.checked_add(bytes)) else {
                break;
            };
            if len == 0
                || matches!(desc.hook, Hook::BatchStart | Hook::BatchEnd)
                || sum.commands >= budget.max_commands
                || sum.bytes.saturating_add(bytes) > budget.max_batch_bytes
            {
                break;
            }
            let offset = usize::try_from(addr.wrapping_sub(start) / 4).unwrap_or(usize::MAX);
            let Ok(cmd) = crate::decode::decode_desc(desc, len, *gen, *engine, rest, offset) else {
                break;
            };
            sum.commands += 1;
            sum.bytes += bytes;
            visit(&WalkedCommand {
                cmd,
                space,
                addr,
                ctx,
                wrap: None,
            })?;
            i += len;
            addr = next;
        }
        Ok(addr)
    }

    /// Walks a batch from `addr` until it returns. `ctx.level` is First or Second.
    fn batch(
        &mut self,
        mut space: AddressSpace,
        mut addr: u64,
        mut ctx: BatchContext,
    ) -> Result<()> {
        self.start_batch()?;
        let mut start = addr;
        loop {
            addr = self.run_in_page(space, addr, start, ctx)?;
            let offset = usize::try_from(addr.wrapping_sub(start) / 4).unwrap_or(usize::MAX);
            let step = self.step(space, addr, offset, ctx)?;
            let next = addr
                .checked_add((step.len as u64) * 4)
                .ok_or(MemoryError::Overflow {
                    space,
                    addr,
                    len: step.len * 4,
                })?;
            match step.hook {
                Hook::BatchEnd => return Ok(()),
                Hook::BatchStart => {
                    if ctx.level == BatchLevel::Second {
                        return Err(WalkError::Nesting { space, addr });
                    }
                    let (tspace, taddr) = step.target;
                    if step.second_level {
                        let child = BatchContext::batch(BatchLevel::Second, tspace, ctx);
                        self.batch(tspace, taddr, child)?;
                        addr = next;
                    } else {
                        // Chain: a new first-level batch; no return here.
                        self.start_batch()?;
                        ctx = BatchContext::batch(BatchLevel::First, tspace, ctx);
                        space = tspace;
                        addr = taddr;
                        start = taddr;
                    }
                    continue;
                }
                _ => {}
            }
            addr = next;
        }
    }

    fn ring(&mut self, ring: RingSpan) -> Result<()> {
        let bad = WalkError::BadRing {
            start: ring.start.0,
            size: ring.size,
            head: ring.head,
            tail: ring.tail,
        };
        if ring.size == 0
            || !ring.size.is_multiple_of(GTT_PAGE_SIZE)
            || ring.head >= ring.size
            || ring.tail >= ring.size
            || !ring.head.is_multiple_of(4)
            || !ring.tail.is_multiple_of(4)
            || !ring.start.0.is_multiple_of(GTT_PAGE_SIZE)
            || ring.start.0.checked_add(ring.size).is_none()
        {
            return Err(bad);
        }
        let used = if ring.tail >= ring.head {
            ring.tail - ring.head
        } else {
            ring.size - ring.head + ring.tail
        };
        if used > self.budget.max_batch_bytes {
            return Err(WalkError::Budget {
                what: "batch bytes",
                limit: self.budget.max_batch_bytes,
            });
        }
        let n = usize::try_from(used / 4).map_err(|_| bad)?;
        let mut lin = vec![0u32; n];
        let first = usize::try_from((ring.size - ring.head).min(used) / 4).map_err(|_| bad)?;
        let (a, b) = lin.split_at_mut(first.min(n));
        self.mem
            .read_dwords(AddressSpace::Ggtt, ring.start.0 + ring.head, a)?;
        if !b.is_empty() {
            self.mem.read_dwords(AddressSpace::Ggtt, ring.start.0, b)?;
        }
        let ctx = BatchContext::RING;
        let mut pos = 0usize;
        while pos < lin.len() {
            let addr = ring.start.0 + (ring.head + (pos as u64) * 4) % ring.size;
            let rest = lin.get(pos..).unwrap_or(&[]);
            let cmd =
                crate::decode::decode_one(self.gen, self.engine, rest, pos).map_err(|err| {
                    WalkError::Decode {
                        space: AddressSpace::Ggtt,
                        addr,
                        err,
                    }
                })?;
            self.charge(cmd.len())?;
            let w = WalkedCommand {
                cmd,
                space: AddressSpace::Ggtt,
                addr,
                ctx,
                wrap: Some((ring.start.0, ring.size)),
            };
            (self.visit)(&w)?;
            if cmd.desc.hook == Hook::BatchStart {
                if cmd.is_second_level_call() {
                    return Err(WalkError::Nesting {
                        space: AddressSpace::Ggtt,
                        addr,
                    });
                }
                let (tspace, taddr) = bb_target(&cmd, &ctx);
                self.batch(tspace, taddr, BatchContext::first_level(tspace))?;
            }
            pos += cmd.len();
        }
        Ok(())
    }
}

/// Walks the ring and every batch it starts, calling `visit` on each command in execution order.
pub fn walk<M: GpuMemory + ?Sized>(
    gen: Gen,
    engine: Engine,
    mem: &M,
    ring: RingSpan,
    budget: Budget,
    visit: &mut Visit<'_>,
) -> Result<WalkSummary> {
    let mut w = Walker::new(gen, engine, mem, budget, visit);
    w.ring(ring)?;
    Ok(w.sum)
}

/// Walks one batch buffer starting at (`space`, `addr`) with context `ctx` (a first-level batch
/// follows chains and second-level calls; a second-level one returns at its end).
#[allow(clippy::too_many_arguments)]
pub fn walk_batch<M: GpuMemory + ?Sized>(
    gen: Gen,
    engine: Engine,
    mem: &M,
    space: AddressSpace,
    addr: u64,
    ctx: BatchContext,
    budget: Budget,
    visit: &mut Visit<'_>,
) -> Result<WalkSummary> {
    let mut w = Walker::new(gen, engine, mem, budget, visit);
    let ctx = if ctx.level == BatchLevel::Ring {
        BatchContext::first_level(space)
    } else {
        ctx
    };
    w.batch(space, addr, ctx)?;
    Ok(w.sum)
}

fn audit_walked(w: &WalkedCommand<'_>, slices: &VgpuSlices, rep: &mut AuditReport) -> Result<()> {
    let wrap = |err| WalkError::Audit {
        space: w.space,
        addr: w.addr,
        err,
    };
    if w.space == AddressSpace::Ggtt {
        // The command's own bytes must lie in the vGPU's memory.
        let len = (w.cmd.len() as u64) * 4;
        let ok = if w.wrap.is_some() {
            slices.contains(w.addr, 4)
        } else {
            slices.contains(w.addr, len)
        };
        if !ok {
            return Err(wrap(AuditError::OutOfSlice {
                offset: w.cmd.offset,
                name: w.cmd.desc.name,
                field: "(command location)",
                start: w.addr,
                len,
            }));
        }
    }
    audit::audit_shape(&w.cmd, &w.ctx).map_err(wrap)?;
    for u in w.cmd.addresses(&w.ctx) {
        match u.space {
            AddressSpace::Ggtt => {
                audit::check_ggtt(&w.cmd, &w.ctx, &u, slices).map_err(wrap)?;
                rep.ggtt_uses += 1;
            }
            AddressSpace::Ppgtt => rep.ppgtt_uses += 1,
        }
    }
    rep.commands += 1;
    Ok(())
}

/// The surface states privileged buffers' work commands use, found by following their indirect
/// state.
///
/// Memory does not change during a walk, so a work command whose state is that of an earlier one
/// (equal [`SurfaceKey`]s) uses the same surface states, all already seen: its footprint is not
/// worked out again. Drivers re-emit the same pipeline state around most draws.
struct PrivilegedSurfaces {
    state: IndirectState,
    seen: HashSet<u64>,
    /// Keys of the work already resolved in this walk, most recent last (at most
    /// [`MAX_SURFACE_KEYS`]; a key dropped is only resolved again).
    keys: Vec<SurfaceKey>,
}

/// Most [`SurfaceKey`]s a walk remembers.
const MAX_SURFACE_KEYS: usize = 32;

/// A surface state: its GGTT address, dwords and address fields.
type SurfaceState = (u64, [u32; SURFACE_STATE_BYTES / 4], Vec<StateAddress>);

impl PrivilegedSurfaces {
    fn new(gen: Gen) -> PrivilegedSurfaces {
        PrivilegedSurfaces {
            state: IndirectState::new(gen, AddressSpace::Ggtt),
            seen: HashSet::new(),
            keys: Vec::new(),
        }
    }

    /// Feeds `w`; returns the GGTT surface states its footprint uses that earlier commands did
    /// not. Unprivileged commands are skipped (their state is PPGTT-addressed).
    #[inline]
    fn step(
        &mut self,
        gen: Gen,
        w: &WalkedCommand<'_>,
        mem: &dyn GpuMemory,
    ) -> Result<Vec<SurfaceState>> {
        if !w.ctx.privileged {
            return Ok(Vec::new());
        }
        match self.state.advance(&w.cmd, &w.ctx) {
            None => Ok(Vec::new()),
            Some(work) => self.resolve(gen, w, work, mem),
        }
    }

    /// [`PrivilegedSurfaces::step`] for work command `w`, of kind `work`.
    #[inline(never)]
    fn resolve(
        &mut self,
        gen: Gen,
        w: &WalkedCommand<'_>,
        work: Work,
        mem: &dyn GpuMemory,
    ) -> Result<Vec<SurfaceState>> {
        let Some(key) = self.state.surface_key(&w.cmd, work) else {
            return Ok(Vec::new());
        };
        if self.keys.iter().rev().any(|k| *k == key) {
            return Ok(Vec::new());
        }
        if self.keys.len() == MAX_SURFACE_KEYS {
            self.keys.remove(0);
        }
        self.keys.push(key);
        let mut out = Vec::new();
        for s in self.state.surface_states(&w.cmd, work, mem) {
            if s.space != AddressSpace::Ggtt || !self.seen.insert(s.addr) {
                continue;
            }
            let mut ss = [0u32; SURFACE_STATE_BYTES / 4];
            mem.read_dwords(AddressSpace::Ggtt, s.addr, &mut ss)?;
            let fields = surface_state_addresses(gen, &ss);
            out.push((s.addr, ss, fields));
        }
        Ok(out)
    }
}

/// Audits one GGTT surface state `w` uses against `slices`: where it lies and every address in it.
fn audit_surface_state(
    w: &WalkedCommand<'_>,
    (at, _, fields): &SurfaceState,
    slices: &VgpuSlices,
) -> core::result::Result<(), AuditError> {
    let (offset, name, state) = (w.cmd.offset, w.cmd.desc.name, *at);
    let out = |field, start, len| AuditError::SurfaceStateOutOfSlice {
        offset,
        state,
        field,
        start,
        len,
    };
    let here = SURFACE_STATE_BYTES as u64;
    if !slices.contains(state, here) {
        return Err(out("location", state, here));
    }
    for f in fields {
        let Some(len) = f.len else {
            return Err(AuditError::UnsizedSurface {
                offset,
                name,
                state,
            });
        };
        if len > MAX_SURFACE_BYTES {
            return Err(AuditError::SurfaceTooLarge {
                offset,
                name,
                field: f.field,
                len,
            });
        }
        if !slices.contains(f.addr, len) {
            return Err(out(f.field, f.addr, len));
        }
    }
    Ok(())
}

/// Walks and audits the ring and every batch it starts against `slices` (the ring itself must lie
/// inside them too), with the GGTT surface states privileged buffers' work commands use.
pub fn audit_walk<M: GpuMemory + ?Sized>(
    gen: Gen,
    engine: Engine,
    mem: &M,
    ring: RingSpan,
    budget: Budget,
    slices: &VgpuSlices,
) -> Result<AuditReport> {
    if !slices.contains(ring.start.0, ring.size) {
        return Err(WalkError::Audit {
            space: AddressSpace::Ggtt,
            addr: ring.start.0,
            err: AuditError::OutOfSlice {
                offset: 0,
                name: "(ring)",
                field: "(ring location)",
                start: ring.start.0,
                len: ring.size,
            },
        });
    }
    let mut rep = AuditReport::default();
    let mut surfaces = PrivilegedSurfaces::new(gen);
    let dyn_mem: &dyn GpuMemory = &mem;
    walk(gen, engine, mem, ring, budget, &mut |w| {
        audit_walked(w, slices, &mut rep)?;
        for s in surfaces.step(gen, w, dyn_mem)? {
            audit_surface_state(w, &s, slices).map_err(|err| WalkError::Audit {
                space: w.space,
                addr: w.addr,
                err,
            })?;
            rep.ggtt_uses += s.2.len() as u64;
        }
        Ok(())
    })?;
    Ok(rep)
}

/// One dword rewrite in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MemEdit {
    space: AddressSpace,
    addr: u64,
    old: u32,
    new: u32,
}

/// Plans the rewrite of one GGTT surface state's address fields from `mv.from` to `mv.to`.
fn plan_surface_state(
    w: &WalkedCommand<'_>,
    s: &SurfaceState,
    mv: &SliceMove,
    edits: &mut Vec<MemEdit>,
    stats: &mut RemapStats,
) -> core::result::Result<(), RemapError> {
    audit_surface_state(w, s, &mv.from).map_err(RemapError::Source)?;
    let (at, ss, fields) = s;
    for f in fields {
        // Sized, inside one source slice: the audit just said so.
        let len = f.len.unwrap_or(1);
        let (offset, name) = (w.cmd.offset, w.cmd.desc.name);
        let new = mv.rebase_range(f.addr, len).ok_or(RemapError::Source(
            AuditError::SurfaceStateOutOfSlice {
                offset,
                state: *at,
                field: f.field,
                start: f.addr,
                len,
            },
        ))?;
        if !mv.to.contains(new, len) {
            return Err(RemapError::Destination(
                AuditError::SurfaceStateOutOfSlice {
                    offset,
                    state: *at,
                    field: f.field,
                    start: new,
                    len,
                },
            ));
        }
        if new & !f.mask != 0 {
            return Err(RemapError::Overflow {
                offset,
                name,
                field: f.field,
                addr: new,
            });
        }
        let old = u64::from(ss[f.dword]) | (u64::from(ss[f.dword + 1]) << 32);
        let value = (old & !f.mask) | new;
        for i in 0..2 {
            let (o, n) = ((old >> (32 * i)) as u32, (value >> (32 * i)) as u32);
            if o != n {
                edits.push(MemEdit {
                    space: AddressSpace::Ggtt,
                    addr: at + 4 * (f.dword + i) as u64,
                    old: o,
                    new: n,
                });
            }
        }
        stats.ggtt_rewritten += 1;
    }
    Ok(())
}

/// Rebases every GGTT address in the ring and the batches it starts, in memory, from `mv.from`
/// to `mv.to`, and those in the surface states privileged buffers' work commands use. `mem` must
/// resolve the addresses the buffers hold (source-layout GGTT offsets).
/// All or nothing: every command is decoded, audited and rebased before the first write; should a
/// write fail, the writes already done are undone.
pub fn remap_walk<M: GpuMemoryMut + ?Sized>(
    gen: Gen,
    engine: Engine,
    mem: &mut M,
    ring: RingSpan,
    budget: Budget,
    mv: &SliceMove,
) -> Result<RemapStats> {
    let mut edits: Vec<MemEdit> = Vec::new();
    let mut stats = RemapStats::default();
    let mut local = Vec::new();
    let mut surfaces = PrivilegedSurfaces::new(gen);
    let ro: &M = mem;
    let dyn_mem: &dyn GpuMemory = &ro;
    walk(gen, engine, ro, ring, budget, &mut |w| {
        let wrap = |err| WalkError::Remap {
            space: w.space,
            addr: w.addr,
            err,
        };
        let cmd = Decoded { offset: 0, ..w.cmd };
        local.clear();
        remap::plan_command(&cmd, &w.ctx, mv, 0, &mut local, &mut stats).map_err(wrap)?;
        for e in &local {
            for i in 0..e.width.dwords() {
                let at = e.at + i;
                let old = cmd.dwords.get(at).copied().unwrap_or(0);
                let new = (e.value >> (32 * i)) as u32;
                if old != new {
                    edits.push(MemEdit {
                        space: w.space,
                        addr: w.dword_addr(at),
                        old,
                        new,
                    });
                }
            }
        }
        for s in surfaces.step(gen, w, dyn_mem)? {
            plan_surface_state(w, &s, mv, &mut edits, &mut stats).map_err(wrap)?;
        }
        Ok(())
    })?;
    for (i, e) in edits.iter().enumerate() {
        if let Err(err) = mem.write(e.space, e.addr, &e.new.to_le_bytes()) {
            for u in edits.iter().take(i).rev() {
                // Best effort: the same pages were just written successfully.
                let _ = mem.write(u.space, u.addr, &u.old.to_le_bytes());
            }
            return Err(WalkError::Memory(err));
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;
    use crate::aub::fixture::iris::{self, IrisLayout};
    use crate::build;
    use crate::isa::encode;
    use crate::memory::PageMemory;

    const GGTT: AddressSpace = AddressSpace::Ggtt;
    const A: IrisLayout = IrisLayout::packed(0x1000_0000);
    const B: IrisLayout = IrisLayout::packed(0x2000_0000);
    /// A's heaps with B's kernels, whose pixel shader writes another binding-table entry.
    const MIXED: IrisLayout = IrisLayout {
        kernels: B.kernels,
        ..A
    };
    const BATCH: u64 = 0x0100_0000;
    const RING: u64 = 0x0000_1000;

    fn state(gen: Gen, name: &str, len: u32) -> Vec<u32> {
        build::state_off(gen, name, len).unwrap()
    }

    /// One piece of a random privileged batch.
    fn piece(gen: Gen, which: u8, arg: u8) -> Vec<u32> {
        let l = if arg & 1 == 0 { &A } else { &B };
        match which % 10 {
            0 => iris::base_addresses(gen, l),
            9 => iris::base_addresses(gen, &MIXED),
            1 => {
                let mut v = state(gen, "3DSTATE_BINDING_TABLE_POINTERS_PS", 2);
                v[1] = [0x40, 0x80, 0xc0][usize::from(arg % 3)];
                v
            }
            2 => {
                let mut v = state(gen, "3DSTATE_PS", 12);
                v[1] = [0x100, 0x200][usize::from(arg % 2)];
                v[6] = u32::from(!arg.is_multiple_of(3));
                v
            }
            3 => {
                let mut v = state(gen, "3DSTATE_VS", 9);
                v[7] = u32::from(arg % 2);
                v
            }
            4 => build::primitive_3d(3),
            5 => {
                let mut v = state(gen, "MEDIA_INTERFACE_DESCRIPTOR_LOAD", 4);
                v[2] = [32, 64][usize::from(arg % 2)];
                v
            }
            6 => {
                let mut v = state(gen, "GPGPU_WALKER", 15);
                v[1] = u32::from(arg % 2);
                v[7] = 4;
                v
            }
            7 => iris::draw_batch(gen, l),
            _ => iris::dispatch_batch(gen, l),
        }
    }

    /// Both layouts' heaps, plus a binding table 0xc0 naming a fourth surface state and an
    /// interface descriptor 1 using that table; B's pixel shader writes binding-table entry 3.
    fn memory(gen: Gen, batch: &[u32]) -> PageMemory {
        let mut mem = PageMemory::new();
        for l in [&A, &B] {
            for (at, d) in iris::heaps(gen, l) {
                mem.put_dwords(GGTT, at, &d).unwrap();
            }
            mem.put_dwords(GGTT, l.surfaces + 192, &iris::raw_buffer(l.ssbo, 4096))
                .unwrap();
            let rel = if gen == Gen::Gen11 {
                192
            } else {
                (l.surfaces + 192 - l.binder) as u32
            };
            mem.put_dwords(GGTT, l.binder + 0xc0, &[rel]).unwrap();
            let mut id = [0u32; 8];
            id[0] = 0x200;
            id[4] = 0xc0;
            mem.put_dwords(GGTT, l.dynamic + 32, &id).unwrap();
        }
        let ps = encode::kernel(&[encode::untyped_write(3, true)]);
        mem.put_dwords(GGTT, B.kernels + 0x100, &ps).unwrap();
        mem.put_dwords(GGTT, BATCH, batch).unwrap();
        let ring = [
            build::mi_batch_buffer_start(GGTT, BATCH, false),
            build::mi_noop(),
        ]
        .concat();
        mem.put_dwords(GGTT, RING, &ring).unwrap();
        mem
    }

    /// A random batch: valid commands, batch ends, chains and second-level calls to the other
    /// batch, and raw dwords (unknown opcodes, zero lengths, commands cut by the batch's end).
    fn random_batch(gen: Gen, parts: &[(u8, u32)], other: u64) -> Vec<u32> {
        let mut v = Vec::new();
        for &(k, x) in parts {
            v.extend(match k % 8 {
                0 => build::mi_noop(),
                1 => build::pipe_control(Some((GGTT, 0x0400_0000 + u64::from(x % 64) * 8, 1))),
                2 => build::mi_load_register_imm(&[(0x2600, x)]),
                3 => state(gen, "3DSTATE_VS", 9),
                4 => build::mi_batch_buffer_end(),
                5 => build::mi_batch_buffer_start(GGTT, other, x % 2 == 0),
                6 => build::primitive_3d(x % 7),
                _ => vec![x],
            });
        }
        v
    }

    /// Every command a walk visits, as (space, address, offset, length, level), and how it ends.
    type Visits = (
        Vec<(AddressSpace, u64, usize, usize, BatchLevel)>,
        Result<WalkSummary>,
    );

    fn walk_recorded(mem: &PageMemory, ring: RingSpan, budget: Budget, in_page: bool) -> Visits {
        let mut seen = Vec::new();
        let mut visit = |w: &WalkedCommand<'_>| -> Result<()> {
            seen.push((w.space, w.addr, w.cmd.offset, w.cmd.len(), w.ctx.level));
            Ok(())
        };
        let mut w = Walker::new(Gen::Gen9, Engine::Render, mem, budget, &mut visit);
        w.in_page = in_page;
        let r = w.ring(ring).map(|()| w.sum);
        (seen, r)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// The in-page loop visits exactly what the general path visits, in the same order, and
        /// ends the same way (the same summary, or the same error), on valid and broken batches,
        /// batches that cross pages, and small budgets.
        #[test]
        fn the_in_page_loop_walks_as_the_general_path_does(
            first in proptest::collection::vec((any::<u8>(), any::<u32>()), 0..200),
            second in proptest::collection::vec((any::<u8>(), any::<u32>()), 0..50),
            first_at in 0u64..1024,
            max_commands in prop_oneof![Just(1u64 << 20), 1u64..300],
            max_batch_bytes in prop_oneof![Just(64u64 << 20), 4u64..8192],
        ) {
            let gen = Gen::Gen9;
            let (a, b) = (BATCH + first_at * 4, BATCH + 0x10_0000 + 0xff0);
            let mut mem = PageMemory::new();
            mem.put_dwords(GGTT, a, &random_batch(gen, &first, b)).unwrap();
            mem.put_dwords(GGTT, b, &random_batch(gen, &second, a)).unwrap();
            let ring = [build::mi_batch_buffer_start(GGTT, a, false), build::mi_noop()].concat();
            mem.put_dwords(GGTT, RING, &ring).unwrap();
            let span = RingSpan { start: GgttOffset(RING), size: 4096, head: 0, tail: 16 };
            let budget = Budget { max_commands, max_batch_bytes, max_batches: 64 };
            let fast = walk_recorded(&mem, span, budget, true);
            let general = walk_recorded(&mem, span, budget, false);
            prop_assert_eq!(fast, general);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The walk's surface states (resolved once per surface key) are exactly those the
        /// general `IndirectState::step` finds for every privileged work command, whatever the
        /// order in which state and work come.
        #[test]
        fn surface_keys_lose_no_surface_state(
            gen in prop_oneof![Just(Gen::Gen8), Just(Gen::Gen9), Just(Gen::Gen11)],
            pieces in proptest::collection::vec((any::<u8>(), any::<u8>()), 1..40),
        ) {
            let mut batch: Vec<u32> = pieces.iter().flat_map(|&(w, a)| piece(gen, w, a)).collect();
            batch.extend(build::mi_batch_buffer_end());
            let mem = memory(gen, &batch);
            let ring = RingSpan { start: GgttOffset(RING), size: 4096, head: 0, tail: 16 };
            let dyn_mem: &dyn GpuMemory = &mem;
            let mut keyed = PrivilegedSurfaces::new(gen);
            let mut general = IndirectState::new(gen, AddressSpace::Ggtt);
            let (mut found, mut expected) = (BTreeSet::new(), BTreeSet::new());
            walk(gen, Engine::Render, &mem, ring, Budget::default(), &mut |w| {
                for (at, _, _) in keyed.step(gen, w, dyn_mem)? {
                    found.insert(at);
                }
                if w.ctx.privileged {
                    if let (_, Some(fp)) = general.step(&w.cmd, &w.ctx, dyn_mem) {
                        expected.extend(
                            fp.surface_states.iter().filter(|s| s.space == GGTT).map(|s| s.addr),
                        );
                    }
                }
                Ok(())
            })
            .unwrap();
            prop_assert_eq!(found, expected);
        }
    }
}
