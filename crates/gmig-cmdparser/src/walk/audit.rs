//! [`audit_walk`]: a walk that audits every command, and the surface states of privileged work,
//! against the vGPU's slices.

use super::privileged::{audit_surface_state, PrivilegedSurfaces};
use super::types::{Budget, Result, RingSpan, WalkError, WalkedCommand};
use super::walker::walk_with;
use crate::addr::{AddressSpace, VgpuSlices};
use crate::audit::{self, AuditError, AuditReport};
use crate::memory::GpuMemory;
use crate::table::{Engine, Gen};

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
    walk_with(
        gen,
        engine,
        mem,
        ring,
        budget,
        &mut |w: &WalkedCommand<'_>| {
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
        },
        false,
    )?;
    Ok(rep)
}
