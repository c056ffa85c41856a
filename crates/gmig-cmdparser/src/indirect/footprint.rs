//! What a work command uses: its surfaces, their roles and shapes, and the surface states read.

use serde::{Deserialize, Serialize};

use crate::addr::{AddressSpace, MAX_SURFACE_BYTES};
use crate::writeset::{AddressRange, Reach, WriteSet};

pub use super::stage::Stage;

/// What a surface is to the work that uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SurfaceRole {
    /// Binding-table entry `index` of `stage` (render target, texture, image or buffer).
    Bound {
        /// Stage.
        stage: Stage,
        /// Binding-table index.
        index: u8,
    },
    /// The auxiliary surface (CCS, MCS or HiZ) of a bound surface.
    Aux {
        /// Stage.
        stage: Stage,
        /// Binding-table index.
        index: u8,
    },
    /// The depth buffer.
    Depth,
    /// The separate stencil buffer.
    Stencil,
    /// The hierarchical-depth buffer.
    HierDepth,
    /// A stream-output buffer.
    StreamOut {
        /// SO buffer index.
        index: u8,
    },
    /// A stream-output buffer's write-offset dword.
    StreamOutOffset {
        /// SO buffer index.
        index: u8,
    },
    /// The general-state buffer stateless messages address (bounded by STATE_BASE_ADDRESS).
    Stateless,
    /// A video decode destination (pre- or post-deblocking).
    VideoDestination,
    /// A video decoder's row-store scratch buffer.
    VideoRowStore,
    /// The compressed bitstream a video decode reads.
    Bitstream,
}

/// The pixels of a surface the state describes: `rows` rows of `row_bytes` bytes, `pitch` apart
/// (no alignment padding, so always inside the surface's range). The reference GPU writes this
/// shape when it renders to a surface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    /// Bytes written per row (at most `pitch`).
    pub row_bytes: u64,
    /// Distance between rows.
    pub pitch: u64,
    /// Rows.
    pub rows: u64,
}

impl Shape {
    /// A contiguous run of `len` bytes.
    pub fn linear(len: u64) -> Shape {
        Shape {
            row_bytes: len,
            pitch: len,
            rows: 1,
        }
    }

    /// `rows` rows of `width_bytes` (clamped to the pitch) `pitch` apart.
    pub fn rows(width_bytes: u64, pitch: u64, rows: u64) -> Shape {
        Shape {
            row_bytes: width_bytes.min(pitch),
            pitch,
            rows,
        }
    }

    /// Bytes from the first to the last byte of the shape.
    pub fn span(&self) -> u64 {
        match self.rows {
            0 => 0,
            r => (r - 1)
                .saturating_mul(self.pitch)
                .saturating_add(self.row_bytes),
        }
    }
}

/// One surface a work command uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SurfaceUse {
    /// Role.
    #[serde(flatten)]
    pub role: SurfaceRole,
    /// Translation it goes through.
    pub space: AddressSpace,
    /// First byte.
    pub start: u64,
    /// Length in bytes (an upper bound derived from the state; `>= 1`).
    pub len: u64,
    /// Whether the work may write it.
    pub writes: bool,
    /// The pixels the state describes, inside `start .. start + len`.
    pub shape: Shape,
}

/// What one work command (a draw, a dispatch, a video decode) may read and write.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Footprint {
    /// Surfaces resolved from the state.
    pub surfaces: Vec<SurfaceUse>,
    /// Why the work may also write memory the state does not name (so the write set is bounded
    /// by the context's GTT reach); empty when the surfaces are the whole story.
    pub reach: Vec<String>,
    /// Every RENDER_SURFACE_STATE read to resolve the surfaces (each once), whatever it held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub surface_states: Vec<SurfaceStateAt>,
}

/// Where a RENDER_SURFACE_STATE a work command uses lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SurfaceStateAt {
    /// Stage whose binding table names it.
    pub stage: Stage,
    /// Binding-table index.
    pub index: u8,
    /// Space it was read through.
    pub space: AddressSpace,
    /// Address of its first dword.
    pub addr: u64,
}

impl Footprint {
    pub(super) fn widen(&mut self, why: impl Into<String>) {
        let why = why.into();
        if !self.reach.contains(&why) {
            self.reach.push(why);
        }
    }

    pub(super) fn add(
        &mut self,
        role: SurfaceRole,
        space: AddressSpace,
        start: u64,
        len: u64,
        shape: Shape,
        writes: bool,
    ) {
        if len == 0 {
            return;
        }
        let shape = if shape.span() <= len {
            shape
        } else {
            Shape::linear(len)
        };
        if len > MAX_SURFACE_BYTES || start.checked_add(len).is_none() {
            self.widen(format!(
                "{role:?} at {start:#x} spans {len:#x} bytes, beyond any surface"
            ));
            return;
        }
        self.surfaces.push(SurfaceUse {
            role,
            space,
            start,
            len,
            writes,
            shape,
        });
    }

    /// The ranges the work may write, with the reach when the state does not bound it.
    pub fn write_set(&self, reach: Reach) -> WriteSet {
        let ranges: Vec<AddressRange> = self
            .surfaces
            .iter()
            .filter(|s| s.writes)
            .map(|s| AddressRange {
                space: s.space,
                start: s.start,
                len: s.len,
            })
            .collect();
        if !self.reach.is_empty() {
            WriteSet::WithinReach { ranges, reach }
        } else if ranges.is_empty() {
            WriteSet::Nothing
        } else {
            WriteSet::Ranges(ranges)
        }
    }

    /// The written surfaces.
    pub fn writes(&self) -> impl Iterator<Item = &SurfaceUse> {
        self.surfaces.iter().filter(|s| s.writes)
    }
}
