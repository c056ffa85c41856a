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

/// The GTT reach of a context: every frame its translations map. A GPU writes guest memory only
/// through its GTTs, so the reach bounds whatever a command writes that its fields and state do
/// not name.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Reach {
    /// The frames the GGTT maps.
    pub ggtt: bool,
    /// The frames the context's PPGTT maps.
    pub ppgtt: bool,
}

impl Reach {
    /// What a command in a buffer of context `ctx` can reach, when its context addresses
    /// memory through `space`: that space, and the GGTT too from a privileged buffer.
    pub fn of(space: AddressSpace, ctx: &BatchContext) -> Reach {
        Reach {
            ggtt: ctx.privileged || space == AddressSpace::Ggtt,
            ppgtt: space == AddressSpace::Ppgtt,
        }
    }

    /// What a shader of a context addressing `space` can reach (shaders never select the GGTT
    /// of a context that has a PPGTT).
    pub fn shader(space: AddressSpace) -> Reach {
        Reach {
            ggtt: space == AddressSpace::Ggtt,
            ppgtt: space == AddressSpace::Ppgtt,
        }
    }

    /// Both reaches.
    pub fn union(self, o: Reach) -> Reach {
        Reach {
            ggtt: self.ggtt || o.ggtt,
            ppgtt: self.ppgtt || o.ppgtt,
        }
    }
}

/// The memory a command may write.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WriteSet {
    /// Writes no memory.
    Nothing,
    /// Writes only inside these ranges.
    Ranges(Vec<AddressRange>),
    /// Writes inside these ranges and possibly anywhere else `reach` maps: the state does not
    /// bound it, but the GTTs do.
    WithinReach {
        /// The ranges the command or its state names.
        ranges: Vec<AddressRange>,
        /// The translations that bound the rest.
        reach: Reach,
    },
    /// May write anything (the command could not even be decoded).
    Unknown,
}

impl WriteSet {
    /// Union of two write sets.
    pub fn union(self, other: WriteSet) -> WriteSet {
        use WriteSet::*;
        match (self, other) {
            (Unknown, _) | (_, Unknown) => Unknown,
            (Nothing, o) | (o, Nothing) => o,
            (Ranges(mut a), Ranges(b)) => {
                a.extend(b);
                Ranges(a)
            }
            (WithinReach { mut ranges, reach }, Ranges(b))
            | (Ranges(b), WithinReach { mut ranges, reach }) => {
                ranges.extend(b);
                WithinReach { ranges, reach }
            }
            (
                WithinReach {
                    mut ranges,
                    reach: r1,
                },
                WithinReach {
                    ranges: b,
                    reach: r2,
                },
            ) => {
                ranges.extend(b);
                WithinReach {
                    ranges,
                    reach: r1.union(r2),
                }
            }
        }
    }

    /// Whether the set is [`WriteSet::Unknown`].
    pub fn is_unknown(&self) -> bool {
        matches!(self, WriteSet::Unknown)
    }

    /// The same set with an unbounded command's writes bounded by `reach`: a decoded command
    /// writes only through the GTTs its buffer may use.
    pub fn bounded_by(self, reach: Reach) -> WriteSet {
        match self {
            WriteSet::Unknown => WriteSet::WithinReach {
                ranges: Vec::new(),
                reach,
            },
            o => o,
        }
    }

    /// The named ranges (empty for [`WriteSet::Unknown`]).
    pub fn ranges(&self) -> &[AddressRange] {
        match self {
            WriteSet::Ranges(r) | WriteSet::WithinReach { ranges: r, .. } => r,
            _ => &[],
        }
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
