//! [`remap_walk`]: a walk that rebases every GGTT address it meets, in commands and in the surface
//! states of privileged work, all or nothing.

use super::privileged::{audit_surface_state, PrivilegedSurfaces, SurfaceState};
use super::types::{Budget, Result, RingSpan, WalkError, WalkedCommand};
use super::walker::walk_with;
use crate::addr::{AddressSpace, SliceMove};
use crate::audit::AuditError;
use crate::decode::Decoded;
use crate::memory::{GpuMemory, GpuMemoryMut};
use crate::remap::{self, RemapError, RemapStats};
use crate::table::{Engine, Gen};

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

/// Plans the memory edits of walked command `w` the general way: [`remap::plan_command`]'s
/// edits of the command, each turned into the dwords it changes.
fn plan_walked_general(
    w: &WalkedCommand<'_>,
    mv: &SliceMove,
    local: &mut Vec<remap::Edit>,
    edits: &mut Vec<MemEdit>,
    stats: &mut RemapStats,
) -> core::result::Result<(), RemapError> {
    let cmd = Decoded { offset: 0, ..w.cmd };
    local.clear();
    remap::plan_command(&cmd, &w.ctx, mv, 0, local, stats)?;
    for e in local.iter() {
        push_field(w, e, edits);
    }
    Ok(())
}

/// The memory edits of field edit `e` of `w`: the dwords it changes.
#[inline]
fn push_field(w: &WalkedCommand<'_>, e: &remap::Edit, edits: &mut Vec<MemEdit>) {
    for i in 0..e.width.dwords() {
        let at = e.at + i;
        let old = w.cmd.dwords.get(at).copied().unwrap_or(0);
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

/// [`plan_walked_general`] without the intermediate list: each field's edit goes straight into
/// `edits` (the same edits in the same order, the same counts, the same first error; a proptest
/// holds the two to each other). Commands are counted from the walk's summary, since the fast
/// walk does not visit quiet ones.
#[inline]
fn plan_walked(
    w: &WalkedCommand<'_>,
    mv: &SliceMove,
    edits: &mut Vec<MemEdit>,
    stats: &mut RemapStats,
) -> core::result::Result<(), RemapError> {
    let cmd = Decoded { offset: 0, ..w.cmd };
    crate::audit::audit_shape(&cmd, &w.ctx).map_err(RemapError::Source)?;
    if cmd.desc.addrs.is_empty() {
        return Ok(());
    }
    for u in cmd.addresses(&w.ctx) {
        match u.space {
            AddressSpace::Ppgtt => stats.ppgtt_untouched += 1,
            AddressSpace::Ggtt => {
                let e = remap::plan_use(&cmd, &w.ctx, mv, &u, 0)?;
                push_field(w, &e, edits);
                stats.ggtt_rewritten += 1;
            }
        }
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
    remap_walk_with_path(gen, engine, mem, ring, budget, mv, true)
}

/// [`remap_walk`], on the fast path (`fast`: quiet commands counted, not visited, and each
/// command's edits planned straight into the list) or the general one (every command visited
/// and planned by [`remap::plan_command`]); tests compare the two.
pub(super) fn remap_walk_with_path<M: GpuMemoryMut + ?Sized>(
    gen: Gen,
    engine: Engine,
    mem: &mut M,
    ring: RingSpan,
    budget: Budget,
    mv: &SliceMove,
    fast: bool,
) -> Result<RemapStats> {
    let mut edits: Vec<MemEdit> = Vec::new();
    let mut stats = RemapStats::default();
    let mut local = Vec::new();
    let mut found = Vec::new();
    let mut surfaces = if fast {
        PrivilegedSurfaces::new(gen)
    } else {
        PrivilegedSurfaces::general(gen)
    };
    let ro: &M = mem;
    let dyn_mem: &dyn GpuMemory = &ro;
    let mut visit = |w: &WalkedCommand<'_>| {
        let wrap = |err| WalkError::Remap {
            space: w.space,
            addr: w.addr,
            err,
        };
        if fast {
            plan_walked(w, mv, &mut edits, &mut stats).map_err(wrap)?;
        } else {
            plan_walked_general(w, mv, &mut local, &mut edits, &mut stats).map_err(wrap)?;
        }
        if surfaces.step_into(gen, w, dyn_mem, &mut found)? {
            for s in found.drain(..) {
                plan_surface_state(w, &s, mv, &mut edits, &mut stats).map_err(wrap)?;
            }
        }
        Ok(())
    };
    let sum = walk_with(gen, engine, ro, ring, budget, &mut visit, fast)?;
    if fast {
        stats.commands = sum.commands;
    }
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
