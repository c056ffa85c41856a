//! Write sets: the memory a command may write, for sound dirty-page narrowing.
//!
//! A write set over-approximates: [`WriteSet::Unknown`] whenever a command may write memory that
//! its fields do not bound (3D draws, GPGPU and media dispatches, video and VEBOX work, commands
//! whose layout is not modelled, stores of unbounded size). Writes the hardware does on its own —
//! context images and hardware status pages on context switches — are not commands' writes; the
//! caller must treat those pages as always dirty.

use crate::addr::AddressSpace;
use crate::decode::{BatchContext, Decoded};
use crate::table::Flags;

/// One range of graphics memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct AddressRange {
    /// Translation it goes through.
    pub space: AddressSpace,
    /// First byte.
    pub start: u64,
    /// Length in bytes (`>= 1`).
    pub len: u64,
}

/// The memory a command may write.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WriteSet {
    /// Writes no memory.
    Nothing,
    /// Writes only inside these ranges.
    Ranges(Vec<AddressRange>),
    /// May write anywhere its context can reach.
    Unknown,
}

impl WriteSet {
    /// Union of two write sets.
    pub fn union(self, other: WriteSet) -> WriteSet {
        match (self, other) {
            (WriteSet::Unknown, _) | (_, WriteSet::Unknown) => WriteSet::Unknown,
            (WriteSet::Nothing, o) | (o, WriteSet::Nothing) => o,
            (WriteSet::Ranges(mut a), WriteSet::Ranges(b)) => {
                a.extend(b);
                WriteSet::Ranges(a)
            }
        }
    }

    /// Whether the set is [`WriteSet::Unknown`].
    pub fn is_unknown(&self) -> bool {
        matches!(self, WriteSet::Unknown)
    }
}

impl Decoded<'_> {
    /// The memory this command may write when run from a buffer of context `ctx`.
    pub fn write_set(&self, ctx: &BatchContext) -> WriteSet {
        let f = self.desc.flags;
        if f.has(Flags::UNBOUNDED_WRITES) || f.has(Flags::OPAQUE) {
            return WriteSet::Unknown;
        }
        let mut out = Vec::new();
        for u in self.addresses(ctx) {
            if !u.access.writes() {
                continue;
            }
            if !u.bounded || u.start.checked_add(u.len).is_none() {
                return WriteSet::Unknown;
            }
            if u.len == 0 {
                continue;
            }
            out.push(AddressRange {
                space: u.space,
                start: u.start,
                len: u.len,
            });
        }
        if out.is_empty() {
            WriteSet::Nothing
        } else {
            WriteSet::Ranges(out)
        }
    }
}
