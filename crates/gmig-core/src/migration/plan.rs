//! What the source's page phases share: reading and tracking pages, the byte accounting that
//! MIG_DATA_SIZE is built from, the per-phase page plan and the downtime pipeline's handles.

use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;

use gmig_dirty::DirtyBitmap;
use gmig_vfio_migration::DeviceError;
use vm_memory::{Bytes, GuestMemoryMmap};

use super::vm::MigratableVm;
use crate::stream::{Gfn, PAGE_SIZE};

pub(crate) fn dg(g: Gfn) -> gmig_dirty::Gfn {
    gmig_dirty::Gfn(g.0)
}

pub(crate) fn failed(what: &str, e: impl std::fmt::Display) -> DeviceError {
    DeviceError::Failed(format!("{what}: {e}"))
}

pub(crate) fn read_page(
    mem: &GuestMemoryMmap,
    gfn: Gfn,
    out: &mut [u8],
) -> Result<(), DeviceError> {
    let addr = gfn
        .addr()
        .ok_or_else(|| DeviceError::Failed(format!("frame 0x{:x} overflows", gfn.0)))?;
    mem.read_slice(out, addr)
        .map_err(|e| failed(&format!("reading guest frame 0x{:x}", gfn.0), e))
}

/// A bitmap over `pages` frames from frame 0 with `frames` set (frames outside are ignored: they
/// cannot be in guest memory).
pub(crate) fn bitmap_of(
    pages: u64,
    frames: impl IntoIterator<Item = Gfn>,
) -> Result<DirtyBitmap, DeviceError> {
    let mut b = DirtyBitmap::new(gmig_dirty::Gfn(0), pages).map_err(|e| failed("bitmap", e))?;
    for g in frames {
        if g.0 < pages {
            b.set(dg(g)).map_err(|e| failed("bitmap", e))?;
        }
    }
    Ok(b)
}

/// Migratable frames outside `tracked`: they became migratable after pre-copy began, were never
/// sent, and go in stop-copy as they are.
pub(crate) fn untracked_pages<V: MigratableVm>(vm: &V, tracked: &DirtyBitmap) -> Vec<Gfn> {
    vm.migratable_pages()
        .into_iter()
        .filter(|g| !tracked.in_span(dg(*g)) || !tracked.is_set(dg(*g)))
        .collect()
}

/// Bytes of a section header.
pub(crate) const SECTION: u64 = crate::stream::SECTION_HEADER_LEN as u64;
/// Bytes of framing per page batch (section header and batch header).
const FRAMING: u64 = SECTION + crate::stream::PAGE_BATCH_HEADER_LEN as u64;
/// Room left in the MIG_DATA_SIZE estimate for device state a drained workload may add.
pub(crate) const DRAIN_STATE_SLACK: u64 = 512;

/// The page records a STOP_COPY would produce, as MIG_DATA_SIZE counts them.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PagePlan {
    /// Pages sent from the queue, in batches of `batch_pages`.
    pub(crate) queued: u64,
    /// Pages the downtime re-hash would find changed, handed over by the hash pipeline.
    pub(crate) found: u64,
    /// Of `queued + found`, those that are zero now (sent as markers).
    pub(crate) zero: u64,
    /// Pages a drain may write that are not listed yet (full pages, found by the re-hash).
    pub(crate) drain_new: u64,
    /// Listed zero pages a drain may write (each would travel as a full page instead).
    pub(crate) drain_unzeroed: u64,
    /// Most page batches the pipeline's hand-overs may become.
    pub(crate) sink_calls: u64,
    /// Pages per batch.
    pub(crate) batch_pages: u64,
}

impl PagePlan {
    pub(crate) fn bytes(&self) -> u64 {
        let record = crate::stream::PAGE_RECORD_LEN as u64;
        let page = PAGE_SIZE as u64;
        let b = self.batch_pages.max(1);
        let listed = self.queued + self.found + self.drain_new;
        let full = listed.saturating_sub(self.zero) + self.drain_unzeroed.min(self.zero);
        // Each hand-over of up to SINK_BATCH pages is sent as its own batch(es).
        let per_call = (gmig_dirty::hasher::SINK_BATCH as u64).div_ceil(b);
        let batches = self.queued.div_ceil(b) + self.sink_calls * per_call;
        listed * record + full * page + batches * FRAMING
    }
}

pub(crate) enum Phase {
    Idle,
    PreCopy,
    StopCopy,
}

pub(crate) type PipelineResult = Result<(u64, u64), DeviceError>;

pub(crate) struct Pipeline {
    pub(crate) rx: Receiver<Vec<Gfn>>,
    pub(crate) thread: JoinHandle<PipelineResult>,
}
