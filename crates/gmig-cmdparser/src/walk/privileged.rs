//! The GGTT surface states that privileged buffers' work commands use: found by following their
//! indirect state, and audited against the vGPU's slices.

use std::collections::HashSet;

use super::types::{Result, WalkedCommand};
use crate::addr::{AddressSpace, VgpuSlices, MAX_SURFACE_BYTES};
use crate::audit::AuditError;
use crate::indirect::{
    surface_state_addresses, IndirectState, StateAddress, SurfaceKey, Work, SURFACE_SKIP,
    SURFACE_STATE_BYTES, SURFACE_UNKNOWN,
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
    /// Whether every command is stepped the general way ([`IndirectState::advance`], by the
    /// row's role), whatever its surface code says (tests compare the two).
    general: bool,
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
            general: false,
        }
    }

    /// [`PrivilegedSurfaces::new`], stepping every command the general way: by its row's role,
    /// recording all the indirect state, whatever the walk's surface code says.
    pub(super) fn general(gen: Gen) -> PrivilegedSurfaces {
        PrivilegedSurfaces {
            general: true,
            ..PrivilegedSurfaces::new(gen)
        }
    }

    /// Steps `w` (of a privileged buffer) through the state: by its surface code when the walk
    /// knows it (no role lookup; only what surface states depend on is recorded), else by its
    /// row's role. Returns the work's kind for a work command.
    #[inline(always)]
    fn advance(&mut self, w: &WalkedCommand<'_>) -> Option<Work> {
        if self.general || w.surface == SURFACE_UNKNOWN {
            self.state.advance(&w.cmd, &w.ctx)
        } else {
            self.state.advance_surfaces(&w.cmd, w.surface)
        }
    }

    /// Whether `w` may change or use the surface states: a command of a privileged buffer
    /// whose surface code is not [`SURFACE_SKIP`] (or any privileged one, stepped the general
    /// way).
    #[inline]
    fn steps(&self, w: &WalkedCommand<'_>) -> bool {
        w.ctx.privileged && (w.surface != SURFACE_SKIP || self.general)
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
        if !self.steps(w) {
            return Ok(Vec::new());
        }
        match self.advance(w) {
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
        // A row that records nothing surface states depend on is skipped; the state's space is
        // the GGTT throughout (only privileged commands reach it), so skipping its `enter`
        // changes nothing either.
        if !self.steps(w) {
            return Ok(false);
        }
        match self.advance(w) {
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
