//! Indirect state: the surfaces a draw, a dispatch or a video decode reads and writes.
//!
//! A 3D draw or a GPGPU dispatch names no memory in its own dwords. What it touches is reached
//! through state set earlier in the same submission: STATE_BASE_ADDRESS gives the heaps, the
//! binding-table pointers (relative to the surface-state base, or to the binding-table pool on
//! GEN11) give binding tables, whose entries point at RENDER_SURFACE_STATEs, which describe the
//! surfaces; the shader kernels (relative to the instruction base) say, through their SEND
//! messages ([`crate::isa`]), which binding-table entries they read and write; the depth,
//! stencil, HiZ and stream-output buffers are written by the fixed-function pipeline. Video decode
//! writes the destinations MFX_PIPE_BUF_ADDR_STATE names, sized by MFX_SURFACE_STATE.
//!
//! [`IndirectState`] follows that state command by command, reading binding tables, surface
//! states, interface descriptors and kernels through the caller's [`GpuMemory`], and gives each
//! work command a [`Footprint`]. Everything is bounded and total: a bad pointer, an unmapped
//! heap, an oversized surface or a kernel it cannot follow never panics; it makes the footprint
//! fall back to the **GTT reach** of the context ([`Reach`]). A GPU writes guest memory only
//! through its GTTs, so "anywhere this context's GTTs map" is a sound bound for whatever the state
//! does not name.
//!
//! State is tracked per submission: a draw whose pipeline state was set by an earlier submission
//! (kept in the hardware context image, not in this submission's commands) is bounded by the reach,
//! never guessed. State lives in the space the buffer that sets it addresses implicitly: a
//! privileged (GGTT) batch's heaps are GGTT addresses, an unprivileged one's PPGTT addresses; when
//! execution moves between the two, the state recorded so far is dropped (what follows falls back
//! to the reach until it is stated again).
//!
//! A privileged batch's surface states hold GGTT addresses the command audit cannot see: each
//! footprint lists the surface states it read ([`Footprint::surface_states`]) and
//! [`surface_state_addresses`] names the GGTT address fields inside one, so the walk audits them
//! against the vGPU's slices and remaps them with the commands ([`mod@crate::walk`]).
//!
//! The parts: `footprint` (what a work command uses: [`Footprint`], [`SurfaceUse`], [`Stage`] …),
//! `state` ([`IndirectState`] and stepping commands through it), `roles` (what each command is to
//! the state), `observe` (recording state commands), `footprints` (a work command's footprint from
//! the state), `surfaces` (sizing a RENDER_SURFACE_STATE; [`surface_state_addresses`]) and
//! `fields` (dword field helpers).
//!
//! [`GpuMemory`]: crate::GpuMemory
//! [`Reach`]: crate::Reach

mod fields;
mod footprint;
mod footprints;
mod observe;
mod roles;
mod stage;
mod state;
mod surfaces;

#[cfg(test)]
mod tests;

pub use footprint::{Footprint, Shape, Stage, SurfaceRole, SurfaceStateAt, SurfaceUse};
pub(crate) use roles::{
    records_nothing, surface_code, Work, SURFACE_DISPATCH, SURFACE_DRAW, SURFACE_SKIP,
    SURFACE_UNKNOWN,
};
pub use state::IndirectState;
pub(crate) use state::SurfaceKey;
pub use surfaces::{surface_state_addresses, StateAddress, SURFACE_STATE_BYTES};
