//! The GGTT surface states that privileged buffers' work commands use: found by following their
//! indirect state, and audited against the vGPU's slices.

use std::collections::HashSet;

use super::types::{Result, WalkedCommand};
use crate::addr::{AddressSpace, VgpuSlices, MAX_SURFACE_BYTES};
use crate::audit::AuditError;
use crate::indirect::{
    surface_state_addresses, IndirectState, StateAddress, SurfaceKey, Work, SURFACE_STATE_BYTES,
};
use crate::memory::GpuMemory;
use crate::table::Gen;

/// The surface states privileged buffers' work commands use, found by following their indirect
/// state.
///
/// Memory does not change during a walk, so a work command whose state is that of an earlier one
/// (equal [`SurfaceKey`]s) uses the same surface states, all already seen: its footprint is not
/// worked out again. Drivers re-emit the same pipeline state around most draws.
pub(super) struct PrivilegedSurfaces {
    state: IndirectState,
    seen: HashSet<u64>,
    /// Keys of the work already resolved in this walk, most recent last (at most
    /// [`MAX_SURFACE_KEYS`]; a key dropped is only resolved again).
    keys: Vec<SurfaceKey>,
    /// Where in `keys` the last work's key was found.
    last_hit: usize,
}

/// Most [`SurfaceKey`]s a walk remembers.
const MAX_SURFACE_KEYS: usize = 32;

/// A surface state: its GGTT address, dwords and address fields.
pub(super) type SurfaceState = (u64, [u32; SURFACE_STATE_BYTES / 4], Vec<StateAddress>);

impl PrivilegedSurfaces {
    pub(super) fn new(gen: Gen) -> PrivilegedSurfaces {
        PrivilegedSurfaces {
            state: IndirectState::new(gen, AddressSpace::Ggtt),
            seen: HashSet::new(),
            keys: Vec::new(),
            last_hit: 0,
        }
    }

    /// Feeds `w`; returns the GGTT surface states its footprint uses that earlier commands did
    /// not. Unprivileged commands are skipped (their state is PPGTT-addressed).
    #[inline]
    pub(super) fn step(
        &mut self,
        gen: Gen,
        w: &WalkedCommand<'_>,
        mem: &dyn GpuMemory,
    ) -> Result<Vec<SurfaceState>> {
        if !w.ctx.privileged || w.stateless {
            return Ok(Vec::new());
        }
        match self.state.advance(&w.cmd, &w.ctx) {
            None => Ok(Vec::new()),
            Some(work) => self.resolve(gen, w, work, mem),
        }
    }

    /// [`PrivilegedSurfaces::step`] into `out` (cleared first), without a new list per command:
    /// `true` when it found any.
    #[inline]
    pub(super) fn step_into(
        &mut self,
        gen: Gen,
        w: &WalkedCommand<'_>,
        mem: &dyn GpuMemory,
        out: &mut Vec<SurfaceState>,
    ) -> Result<bool> {
        // A stateless row's step records nothing; the state's space is the GGTT throughout
        // (only privileged commands reach it), so skipping its `enter` changes nothing either.
        if !w.ctx.privileged || w.stateless {
            return Ok(false);
        }
        match self.state.advance(&w.cmd, &w.ctx) {
            None => Ok(false),
            Some(work) => {
                *out = self.resolve(gen, w, work, mem)?;
                Ok(!out.is_empty())
            }
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
        if !matches!(work, Work::Draw | Work::Dispatch) {
            // No surface key: no surface state.
            return Ok(Vec::new());
        }
        // The key that matched last time first (drivers alternate among a few), then the rest,
        // each compared in place against the state.
        let (state, cmd) = (&self.state, &w.cmd);
        let hit = self
            .keys
            .get(self.last_hit)
            .is_some_and(|k| state.has_surface_key(cmd, work, k))
            || match self
                .keys
                .iter()
                .rposition(|k| state.has_surface_key(cmd, work, k))
            {
                Some(i) => {
                    self.last_hit = i;
                    true
                }
                None => false,
            };
        if hit {
            return Ok(Vec::new());
        }
        let Some(key) = self.state.surface_key(&w.cmd, work) else {
            return Ok(Vec::new());
        };
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
pub(super) fn audit_surface_state(
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
