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
//!
//! The parts: `types` (the ring, the budget, errors, what a walk visits and sums up), `walker`
//! (the walk itself: [`walk`], [`walk_batch`]), `privileged` (the surface states privileged
//! buffers' work uses), `audit` ([`audit_walk`]) and `remap` ([`remap_walk`]).
//!
//! [`GpuMemory`]: crate::GpuMemory
//! [`IndirectState`]: crate::IndirectState

mod audit;
mod privileged;
mod remap;
mod types;
mod walker;

#[cfg(test)]
mod tests;

pub use audit::audit_walk;
pub use remap::remap_walk;
pub use types::{Budget, Result, RingSpan, Visit, WalkError, WalkSummary, WalkedCommand};
pub use walker::{walk, walk_batch, walk_looping};
