//! What a walk is given and gives: the ring, the budget, its errors, the commands it visits and its
//! summary.

use thiserror::Error;

use crate::addr::{AddressSpace, GgttOffset};
use crate::audit::AuditError;
use crate::decode::{BatchContext, DecodeError, Decoded};
use crate::memory::MemoryError;
use crate::remap::RemapError;

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
    pub(super) wrap: Option<(u64, u64)>,
    /// The row's [surface code](crate::indirect::surface_code), which the walk's in-page loop
    /// reads from the opcode index; elsewhere [`SURFACE_UNKNOWN`](crate::indirect::SURFACE_UNKNOWN)
    /// (the row's role is then looked up).
    pub(crate) surface: u8,
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
    /// Loops back to an entered batch, not followed ([`walk_looping`](super::walker::walk_looping)).
    pub loops: u64,
}

/// Visitor callback type.
pub type Visit<'v> = dyn FnMut(&WalkedCommand<'_>) -> Result<()> + 'v;
