//! # gmig-cmdparser
//!
//! Decoding, walking, auditing and remapping of Intel GEN8–GEN11 GPU command buffers — the
//! "dynamic graphics address remapping" half of gMig.
//!
//! **Owns:** the per-generation, per-engine command tables (opcodes, length rules, address fields);
//! a zero-copy, total decoder over little-endian dwords; the ring → first-level → second-level batch
//! walker with a work budget; the GGTT audit against a vGPU's aperture and hidden slices; in-place
//! remapping of GGTT addresses between two slice layouts; per-command write sets; and reading and
//! writing GEN8+ AUB captures.
//!
//! **Must not know about:** VFIO, page hashing, migration streams or transports. Memory is reached
//! only through a trait the caller implements (GGTT and PPGTT translation are the caller's).
#![warn(missing_docs)]

pub mod aub;

// ---- TEMPORARY (aub helper): stand-ins for the types `wip/cmdparser` defines; dropped at merge. ----
/// GEN generation (temporary stand-in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Gen {
    /// Broadwell.
    Gen8,
    /// Skylake family.
    Gen9,
    /// Ice Lake.
    Gen11,
}
/// Engine (temporary stand-in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Engine {
    /// RCS.
    Render,
    /// BCS.
    Blitter,
    /// VCS.
    Video,
    /// VECS.
    VideoEnhance,
}
/// GGTT offset (temporary stand-in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GgttOffset(pub u64);
