//! The walk itself: ring, first- and second-level batches, read a page at a time, under a budget.

use super::types::{Budget, Result, RingSpan, Visit, WalkError, WalkSummary, WalkedCommand};
use crate::addr::{AddressSpace, GTT_PAGE_SIZE};
use crate::decode::{BatchContext, BatchLevel, DecodeError, Decoded};
use crate::memory::{GpuMemory, MemoryError};
use crate::table::{self, CommandDesc, Engine, Gen, Hook};

/// The walk's state. Generic over the visitor `V` so that the audit and remap walks call theirs
/// directly (inlined into the batch loop); [`walk`] passes a `dyn` [`Visit`].
pub(super) struct Walker<
    'm,
    'v,
    M: GpuMemory + ?Sized,
    V: FnMut(&WalkedCommand<'_>) -> Result<()> + ?Sized,
> {
    gen: Gen,
    engine: Engine,
    mem: &'m M,
    budget: Budget,
    pub(super) sum: WalkSummary,
    visit: &'v mut V,
    table: table::Table,
    buf: Vec<u32>,
    /// One cached page of the buffer being walked: (space, page address) and its dwords.
    page_at: Option<(AddressSpace, u64)>,
    page: Vec<u32>,
    /// Whether [`Walker::run_in_page`] runs (tests turn it off to compare with the general path).
    pub(super) in_page: bool,
    /// Whether [`Walker::run_in_page`] counts commands of [quiet](crate::table::quiet) rows
    /// against the budget without decoding or visiting them (for visitors that do nothing with
    /// them: the remap walk's fast path).
    pub(super) skip_quiet: bool,
    /// Whether a first-level chain back to a batch it already entered ends the walk of that
    /// batch instead of being followed (see [`walk_looping`]).
    pub(super) loops: bool,
}

impl<'m, 'v, M: GpuMemory + ?Sized, V: FnMut(&WalkedCommand<'_>) -> Result<()> + ?Sized>
    Walker<'m, 'v, M, V>
{
    pub(super) fn new(
        gen: Gen,
        engine: Engine,
        mem: &'m M,
        budget: Budget,
        visit: &'v mut V,
    ) -> Self {
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
            skip_quiet: false,
            loops: false,
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
fn visit_one<V: FnMut(&WalkedCommand<'_>) -> Result<()> + ?Sized>(
    visit: &mut V,
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
        surface: crate::indirect::SURFACE_UNKNOWN,
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

impl<M: GpuMemory + ?Sized, V: FnMut(&WalkedCommand<'_>) -> Result<()> + ?Sized>
    Walker<'_, '_, M, V>
{
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
            skip_quiet,
            ..
        } = self;
        let mut i = ((addr - page) / 4) as usize;
        while let Some(&dw0) = words.get(i) {
            let Some(table::Entry {
                desc,
                len,
                quiet,
                surface,
            }) = table.lookup_entry(dw0)
            else {
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
            if quiet && *skip_quiet {
                // Decoding cannot fail here (no exact length, no hook, a length of at least one
                // dword inside the page), and the visitor does nothing with it.
                sum.commands += 1;
                sum.bytes += bytes;
                i += len;
                addr = next;
                continue;
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
                surface,
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
        // The batches this first-level chain entered (a second-level batch cannot chain).
        let mut entered = vec![(space, addr)];
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
                    } else if self.loops && entered.contains(&(tspace, taddr)) {
                        // A loop (IGT's spinners chain a batch to itself until the CPU ends
                        // it): walked once; the engine runs it again from there.
                        self.sum.loops += 1;
                        return Ok(());
                    } else {
                        // Chain: a new first-level batch; no return here.
                        entered.push((tspace, taddr));
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

    pub(super) fn ring(&mut self, ring: RingSpan) -> Result<()> {
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
                surface: crate::indirect::SURFACE_UNKNOWN,
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
    walk_with(gen, engine, mem, ring, budget, visit, false)
}

/// [`walk`] with a visitor of a known type, which the walk's loops call directly (the audit and
/// remap walks: one call per command, inlined, instead of one through a `dyn` pointer). With
/// `skip_quiet`, batch commands of [quiet](crate::table::quiet) rows inside a cached page are
/// counted but not visited.
pub(super) fn walk_with<M, V>(
    gen: Gen,
    engine: Engine,
    mem: &M,
    ring: RingSpan,
    budget: Budget,
    visit: &mut V,
    skip_quiet: bool,
) -> Result<WalkSummary>
where
    M: GpuMemory + ?Sized,
    V: FnMut(&WalkedCommand<'_>) -> Result<()> + ?Sized,
{
    let mut w = Walker::new(gen, engine, mem, budget, visit);
    w.skip_quiet = skip_quiet;
    w.ring(ring)?;
    Ok(w.sum)
}

/// [`walk`] for an engine that runs loops: a first-level batch that chains back to a batch the
/// same chain already entered (a spinner: `MI_BATCH_BUFFER_START` to itself, ended by an
/// `MI_CONDITIONAL_BATCH_BUFFER_END` or by the CPU) is walked once, and its walk ends at that
/// `MI_BATCH_BUFFER_START`, which the visitor sees with its target; the walk goes on in the ring.
/// The engine that runs the commands loops back itself. [`WalkSummary::loops`] counts them. A
/// plain [`walk`] follows such a chain until the budget refuses it.
pub fn walk_looping<M: GpuMemory + ?Sized>(
    gen: Gen,
    engine: Engine,
    mem: &M,
    ring: RingSpan,
    budget: Budget,
    visit: &mut Visit<'_>,
) -> Result<WalkSummary> {
    let mut w = Walker::new(gen, engine, mem, budget, visit);
    w.loops = true;
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
