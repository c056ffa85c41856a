//! The plain data the reader builds and the writer consumes: a whole capture ([`AubCapture`]; its
//! parsing, writing and migration are in `capture`) and the bounds on reading ([`ReadLimits`]).
//! Both `reader` and `writer` depend on this module, and `capture` on both of them, so the three
//! do not import one another in a circle.

use std::collections::BTreeMap;

use super::image::MemoryImage;
use super::submission::Submission;
use crate::Gen;

/// What a capture leaves: the generation, memory, registers and submissions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AubCapture {
    /// Generation named by the version packet (None when absent or unknown).
    pub gen: Option<Gen>,
    /// Application name of the version packet.
    pub app_name: String,
    /// GGTT entries and physical pages.
    pub memory: MemoryImage,
    /// Last value written to every register other than the execlist ports.
    pub registers: BTreeMap<u32, u32>,
    /// Submissions, in order.
    pub submissions: Vec<Submission>,
}

/// Bounds on what a reader may build from untrusted input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// Most physical pages the memory image may hold.
    pub max_pages: u64,
    /// Most submissions.
    pub max_submissions: usize,
    /// Most distinct registers remembered.
    pub max_registers: usize,
}

impl Default for ReadLimits {
    /// 64 Ki pages (256 MiB), 64 Ki submissions, 64 Ki registers.
    fn default() -> Self {
        Self {
            max_pages: 1 << 16,
            max_submissions: 1 << 16,
            max_registers: 1 << 16,
        }
    }
}
