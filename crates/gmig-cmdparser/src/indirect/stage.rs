//! Shader stages: a leaf of the indirect state, which the row roles and the footprints share.

use serde::{Deserialize, Serialize};

/// Shader stages with a binding table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Vertex shader.
    Vs,
    /// Hull shader.
    Hs,
    /// Domain shader.
    Ds,
    /// Geometry shader.
    Gs,
    /// Pixel shader.
    Ps,
    /// A GPGPU / media kernel (interface descriptor).
    Compute,
}

impl Stage {
    pub(super) const GRAPHICS: [Stage; 5] = [Stage::Vs, Stage::Hs, Stage::Ds, Stage::Gs, Stage::Ps];

    pub(super) fn index(self) -> usize {
        self as usize
    }
}
