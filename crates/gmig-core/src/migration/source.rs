//! The two migration devices the engine drives through `gmig-vfio-migration`'s state machine:
//! [`SourceDevice`] produces the gmig stream from a running VM, [`DestDevice`](super::DestDevice)
//! consumes it into a private VM that nobody sees until the whole stream has validated and the VM
//! is restored.
//!
//! Hashing is `gmig-dirty`'s: pre-copy pages go through [`Hasher::copy_for_send`] (the snapshot
//! records the hash of exactly the bytes copied into the batch), and downtime re-hashing runs
//! [`Hasher::diff_with`] on a pipeline thread whose workers hand dirty frames to the sender as they
//! find them.
//!
//! This file holds [`SourceDevice`], its session and pre-copy; `source/stop_copy.rs` the stop
//! (the downtime re-hash pipeline, the stop-copy stream and the size a stop would still send);
//! `source/device.rs` the `gmig-vfio-migration` device traits it implements.

mod device;
mod stop_copy;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use gmig_dirty::{DiffScratch, GuestPages, HashSnapshot, Hasher};
use gmig_vfio_migration::DeviceError;

use super::config::Policy;
use super::plan::{bitmap_of, dg, failed, read_page, Phase, Pipeline};
use super::vm::{Candidates, MigratableVm};
use crate::stream::{Gfn, PageBatch, StateKind, StreamWriter, PAGE_SIZE};

/// Per-phase counts and times of the source side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Page records sent while the VM ran (all pre-copy rounds).
    pub pages_precopy: u64,
    /// Page records sent after the stop.
    pub pages_stop_copy: u64,
    /// Zero-page markers among all page records.
    pub zero_pages: u64,
    /// Pre-copy rounds (1 for one-shot, more for iterative, 0 for stop-and-copy).
    pub rounds: u32,
    /// Page batches written in pre-copy (the engine steps the workload between batches).
    pub precopy_batches: u64,
    /// Workloads the bounded drain let finish after the stop.
    pub drained: u64,
    /// Pages re-hashed in downtime.
    pub rehashed: u64,
    /// Pages re-hashed before the stop by the overlapped verification (one-shot-narrow).
    pub verified: u64,
    /// Of those, pages found changed and sent again before the stop.
    pub verify_resent: u64,
    /// Whether the narrow candidate set had to widen to every page (an unknown write set).
    pub widened: bool,
    /// Time to quiesce and capture device state, ns.
    pub quiesce_ns: u64,
    /// Wall time of the downtime hash pipeline, ns (it overlaps the transfer).
    pub hash_ns: u64,
}

/// Saving side: a running VM whose state becomes a gmig stream.
pub struct SourceDevice<V: MigratableVm> {
    vm: V,
    policy: Policy,
    max_drain: super::Drain,
    batch_pages: usize,
    hasher: Arc<Hasher>,
    phase: Phase,
    quiesced: bool,
    writer: Option<StreamWriter<Vec<u8>>>,
    tail: Vec<u8>,
    out_pos: usize,
    guest_pages: u64,
    snap: Option<HashSnapshot>,
    /// The downtime re-hash's buffers, made when pre-copy starts (see [`DiffScratch`]).
    scratch_diff: Option<DiffScratch>,
    queue: VecDeque<Gfn>,
    first_pass_left: u64,
    batch: PageBatch,
    scratch: Vec<u8>,
    pipeline: Option<Pipeline>,
    states: Option<Vec<(StateKind, Vec<u8>)>>,
    /// Device-state sections pre-copy sends first ([`MigratableVm::precopy_state`]).
    early_states: Vec<(StateKind, Vec<u8>)>,
    /// Whether this session sent device state during pre-copy (the stop then sends the delta).
    sent_early: bool,
    /// A SYNC marker to write once the queued pre-copy pages are out, and the last sequence used.
    sync_pending: bool,
    sync_seq: u64,
    finished: bool,
    stop_copy_planned: u64,
    stats: SourceStats,
}

impl<V: MigratableVm> std::fmt::Debug for SourceDevice<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceDevice")
            .field("policy", &self.policy)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<V: MigratableVm> SourceDevice<V> {
    /// Wrap a running VM. `max_drain` bounds the in-flight work allowed to finish after the
    /// stop (the rest is preempted and carried); `batch_pages` is the page-batch size; `hash_threads` the hashers (0: one per core).
    pub fn new(
        vm: V,
        policy: Policy,
        max_drain: super::Drain,
        batch_pages: usize,
        hash_threads: usize,
    ) -> Result<Self, DeviceError> {
        let hasher = Hasher::new(hash_threads).map_err(|e| failed("hash pool", e))?;
        Ok(Self::with_hasher(
            vm,
            policy,
            max_drain,
            batch_pages,
            Arc::new(hasher),
        ))
    }

    /// [`SourceDevice::new`] sharing an existing hash pool.
    pub fn with_hasher(
        vm: V,
        policy: Policy,
        max_drain: super::Drain,
        batch_pages: usize,
        hasher: Arc<Hasher>,
    ) -> Self {
        let batch_pages = batch_pages.clamp(1, crate::stream::MAX_PAGES_PER_BATCH as usize);
        Self {
            vm,
            policy,
            max_drain,
            batch_pages,
            hasher,
            phase: Phase::Idle,
            quiesced: false,
            writer: None,
            tail: Vec::new(),
            out_pos: 0,
            guest_pages: 0,
            snap: None,
            scratch_diff: None,
            queue: VecDeque::new(),
            first_pass_left: 0,
            batch: PageBatch::with_capacity(batch_pages),
            scratch: Vec::new(),
            pipeline: None,
            states: None,
            early_states: Vec::new(),
            sent_early: false,
            sync_pending: false,
            sync_seq: 0,
            finished: false,
            stop_copy_planned: 0,
            stats: SourceStats::default(),
        }
    }

    /// Mark the VM as stopped (a VM restored from a stream is): the next STOP → RUNNING resumes it.
    pub(crate) fn stopped(mut self) -> Self {
        self.quiesced = true;
        self
    }

    /// The VM.
    pub fn vm(&self) -> &V {
        &self.vm
    }

    /// The VM, mutably (the engine runs its workload between pre-copy batches).
    pub fn vm_mut(&mut self) -> &mut V {
        &mut self.vm
    }

    /// Give the VM back.
    pub fn into_vm(self) -> V {
        self.vm
    }

    /// Counts and times so far.
    pub fn stats(&self) -> SourceStats {
        self.stats
    }

    fn reset_session(&mut self) {
        self.phase = Phase::Idle;
        self.writer = None;
        self.tail = Vec::new();
        self.out_pos = 0;
        self.snap = None;
        self.scratch_diff = None;
        self.queue.clear();
        self.batch.clear();
        self.states = None;
        self.early_states.clear();
        self.sent_early = false;
        self.sync_pending = false;
        self.finished = false;
        if let Some(p) = self.pipeline.take() {
            // Dropping the receiver makes the workers' sends fail; they finish their slice and stop.
            drop(p.rx);
            let _ = p.thread.join();
        }
        self.vm.stop_write_tracking();
    }

    fn open_stream(&mut self) -> Result<(), DeviceError> {
        let header = self.vm.stream_header();
        let writer = StreamWriter::new(Vec::with_capacity(1 << 20), &header)
            .map_err(|e| failed("stream", e))?;
        self.writer = Some(writer);
        self.guest_pages = header.guest_pages;
        self.stats = SourceStats::default();
        Ok(())
    }

    fn writer(&mut self) -> Result<&mut StreamWriter<Vec<u8>>, DeviceError> {
        self.writer
            .as_mut()
            .ok_or(DeviceError::Failed("no saving session".into()))
    }

    /// Copy up to one batch of queued pages and write them as a page batch. In pre-copy the copy
    /// goes through the hasher, which records in the snapshot the hash of exactly the bytes
    /// copied (a write landing after the copy shows as a changed hash later, never lost). Returns
    /// the pages written.
    fn send_queued(&mut self) -> Result<u64, DeviceError> {
        let n = self.queue.len().min(self.batch_pages);
        if n == 0 {
            return Ok(0);
        }
        let gfns: Vec<Gfn> = self.queue.drain(..n).collect();
        let mem = self.vm.memory();
        match (&self.phase, self.snap.as_mut()) {
            (Phase::PreCopy, Some(snap)) => {
                self.scratch.resize(n * PAGE_SIZE, 0);
                let pages = GuestPages::new(mem).map_err(|e| failed("guest memory", e))?;
                let d: Vec<gmig_dirty::Gfn> = gfns.iter().map(|g| dg(*g)).collect();
                self.hasher
                    .copy_for_send(&pages, snap, &d, &mut self.scratch)
                    .map_err(|e| failed("copy for send", e))?;
                for (g, page) in gfns.iter().zip(self.scratch.chunks_exact(PAGE_SIZE)) {
                    let page: &[u8; PAGE_SIZE] = page
                        .try_into()
                        .map_err(|_| DeviceError::Failed("page chunk".into()))?;
                    if !self.batch.push(*g, page) {
                        return Err(DeviceError::Failed("page batch full".into()));
                    }
                }
            }
            _ => {
                // Stop-copy: the VM is stopped and the session ends, so no hash needs keeping,
                // and each page is read straight into the batch.
                for g in &gfns {
                    if !self.batch.push_from(*g, |page| read_page(mem, *g, page))? {
                        return Err(DeviceError::Failed("page batch full".into()));
                    }
                }
            }
        }
        self.stats.zero_pages += self.batch.zero_pages() as u64;
        let batch = std::mem::take(&mut self.batch);
        let r = self.writer()?.write_pages(&batch);
        self.batch = batch;
        self.batch.clear();
        r.map_err(|e| failed("stream", e))?;
        Ok(n as u64)
    }

    /// The device state the stop captures: the whole of it, or, when pre-copy carried part of
    /// it, the rest and the updates to that part.
    fn stop_state(&self) -> Result<Vec<(StateKind, Vec<u8>)>, super::vm::VmError> {
        // Early sections not written yet would not be written at all: a stop sends the whole.
        if self.sent_early && self.early_states.is_empty() {
            self.vm.save_state_delta()
        } else {
            self.vm.save_state()
        }
    }

    /// Ask for a SYNC marker after the pages queued so far (pre-copy only); returns its
    /// sequence number. The destination answers it once it has applied everything before it.
    pub fn request_sync(&mut self) -> Result<u64, DeviceError> {
        if !matches!(self.phase, Phase::PreCopy) {
            return Err(DeviceError::Failed("SYNC outside PRE_COPY".into()));
        }
        self.sync_seq += 1;
        self.sync_pending = true;
        Ok(self.sync_seq)
    }

    /// Overlapped verification (one-shot-narrow): before the stop, while the VM still runs,
    /// re-hash the candidate set gathered so far and queue the pages that changed, so that the
    /// downtime re-hashes only what is written from now on. Returns the pages queued.
    ///
    /// Sound by its order: the VM starts a new candidate set *before* the old one is hashed, so a
    /// write that lands during or after the hash is in the new set, and one that landed before
    /// shows as a changed hash now (the resend records the hash of exactly what it copies). An
    /// unknown candidate set is left alone (the stop widens to every page, as it would have).
    pub fn verify_candidates(&mut self) -> Result<u64, DeviceError> {
        if !matches!(self.phase, Phase::PreCopy) {
            return Err(DeviceError::Failed("verification outside PRE_COPY".into()));
        }
        // One step: a write lands either in the set hashed now or in the new one.
        let Candidates::Pages(pages) = self.vm.restart_write_tracking() else {
            return Ok(0);
        };
        let snap = self
            .snap
            .as_ref()
            .ok_or(DeviceError::Failed("no snapshot".into()))?;
        let mut candidates = bitmap_of(self.guest_pages, pages)?;
        candidates.intersect(snap.tracked());
        let mem = GuestPages::new(self.vm.memory()).map_err(|e| failed("guest memory", e))?;
        let changed = self
            .hasher
            .diff(&mem, snap, Some(&candidates))
            .map_err(|e| failed("re-hash", e))?;
        self.stats.verified += candidates.count();
        let n = changed.count();
        self.stats.verify_resent += n;
        self.queue.extend(changed.iter().map(|g| Gfn(g.0)));
        Ok(n)
    }

    /// Iterative pre-copy: re-hash every page sent so far; when more than `min_pages` changed,
    /// queue them as a new round and return how many; otherwise queue nothing and return 0 (the
    /// rest is left to stop-copy).
    pub fn next_round(&mut self, min_pages: u64) -> Result<u64, DeviceError> {
        if !matches!(self.phase, Phase::PreCopy) {
            return Err(DeviceError::Failed("next_round outside PRE_COPY".into()));
        }
        let snap = self
            .snap
            .as_ref()
            .ok_or(DeviceError::Failed("no snapshot".into()))?;
        let pages = GuestPages::new(self.vm.memory()).map_err(|e| failed("guest memory", e))?;
        let dirty = self
            .hasher
            .diff(&pages, snap, None)
            .map_err(|e| failed("re-hash", e))?;
        let n = dirty.count();
        if n <= min_pages {
            return Ok(0);
        }
        self.queue.extend(dirty.iter().map(|g| Gfn(g.0)));
        self.stats.rounds += 1;
        Ok(n)
    }

    fn quiesce(&mut self) -> Result<(), DeviceError> {
        if !self.quiesced {
            let t = Instant::now();
            let drained = self
                .vm
                .quiesce(self.max_drain)
                .map_err(|e| failed("quiesce", e))?;
            self.quiesced = true;
            self.stats.drained = drained as u64;
            self.stats.quiesce_ns += t.elapsed().as_nanos() as u64;
        }
        Ok(())
    }

    /// Workloads a stop may still let finish (none once the VM is quiesced).
    fn drainable(&self) -> usize {
        if self.quiesced {
            0
        } else {
            self.max_drain.workloads
        }
    }

    fn pending(&mut self) -> Option<&mut Vec<u8>> {
        match self.writer.as_mut() {
            Some(w) => Some(w.get_mut()),
            None if self.finished => Some(&mut self.tail),
            None => None,
        }
    }
}
