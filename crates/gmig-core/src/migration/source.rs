//! The two migration devices the engine drives through `gmig-vfio-migration`'s state machine:
//! [`SourceDevice`] produces the gmig stream from a running VM, [`DestDevice`] consumes it into a
//! private VM that nobody sees until the whole stream has validated and the VM is restored.
//!
//! Hashing is `gmig-dirty`'s: pre-copy pages go through [`Hasher::copy_for_send`] (the snapshot
//! records the hash of exactly the bytes copied into the batch), and downtime re-hashing runs
//! [`Hasher::diff_with`] on a pipeline thread whose workers hand dirty frames to the sender as they
//! find them.

use std::collections::VecDeque;
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::Instant;

use gmig_dirty::{DiffScratch, DirtyBitmap, GuestPages, HashSnapshot, Hasher};
use gmig_vfio_migration::{
    ArcFailure, ArcResult, DeviceError, DirtyLogging, MigrationDevice, MigrationFeatures,
    PrecopyInfo, RunControl, StateLoader, StateSaver,
};

use super::config::Policy;
use super::plan::{
    bitmap_of, dg, failed, read_page, untracked_pages, PagePlan, Phase, Pipeline, PipelineResult,
    DRAIN_STATE_SLACK, SECTION,
};
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
    max_drain: usize,
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
    /// Wrap a running VM. `max_drain` bounds the in-flight workloads allowed to finish after the
    /// stop; `batch_pages` is the page-batch size; `hash_threads` the hashers (0: one per core).
    pub fn new(
        vm: V,
        policy: Policy,
        max_drain: usize,
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
        max_drain: usize,
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
        let Candidates::Pages(pages) = self.vm.write_candidates() else {
            return Ok(0);
        };
        self.vm.start_write_tracking();
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

    /// The VM is stopped: capture its state and start the hash pipeline that finds the pages to
    /// send in downtime.
    fn enter_stop_copy(&mut self) -> Result<(), DeviceError> {
        self.quiesce()?;
        if !self.early_states.is_empty() {
            // Stopped before pre-copy wrote anything: the whole state goes now.
            self.early_states.clear();
            self.sent_early = false;
        }
        let t = Instant::now();
        let states = self.stop_state().map_err(|e| failed("save state", e))?;
        self.states = Some(states);
        self.stats.quiesce_ns += t.elapsed().as_nanos() as u64;

        let Some(snap) = self.snap.take() else {
            // Stop-and-copy: no pre-copy, every migratable page goes now.
            self.queue.clear();
            self.queue.extend(self.vm.migratable_pages());
            self.stop_copy_planned = self.queue.len() as u64;
            self.phase = Phase::StopCopy;
            return Ok(());
        };
        // Tracked pages pre-copy has not sent yet are found by the re-hash (a page with no
        // recorded hash counts as changed), so the pre-copy queue is dropped. Pages that became
        // migratable after pre-copy began were never tracked and go as they are; a VM whose
        // migratable set is fixed has none, and listing it again (O(guest)) is skipped.
        let tracked = snap.tracked().clone();
        self.queue.clear();
        if !self.vm.migratable_pages_fixed() {
            self.queue.extend(untracked_pages(&self.vm, &tracked));
        }
        let candidates = match (self.policy, self.vm.write_candidates()) {
            (Policy::OneShotNarrow, Candidates::Pages(pages)) => {
                let mut b = bitmap_of(self.guest_pages, pages)?;
                b.intersect(&tracked);
                Some(b)
            }
            (Policy::OneShotNarrow, Candidates::Unknown) => {
                self.stats.widened = true;
                None
            }
            _ => None,
        };
        self.stop_copy_planned = self.queue.len() as u64
            + candidates
                .as_ref()
                .map_or(tracked.count(), DirtyBitmap::count);
        self.stats.rehashed = candidates
            .as_ref()
            .map_or(tracked.count(), DirtyBitmap::count);

        let mem = self.vm.memory().clone();
        let hasher = Arc::clone(&self.hasher);
        let scratch = self.scratch_diff.take();
        let (tx, rx) = sync_channel::<Vec<Gfn>>(4096);
        let thread = std::thread::spawn(move || -> PipelineResult {
            let t = Instant::now();
            let pages = GuestPages::new(&mem).map_err(|e| failed("guest memory", e))?;
            let sink = |found: &[gmig_dirty::Gfn]| {
                // A failed send means the session was aborted; the diff just runs out.
                let _ = tx.send(found.iter().map(|g| Gfn(g.0)).collect());
            };
            let dirty = match scratch {
                Some(mut scratch) => {
                    hasher
                        .diff_into(&pages, &snap, candidates.as_ref(), &sink, &mut scratch)
                        .map_err(|e| failed("re-hash", e))?;
                    scratch.dirty().count()
                }
                None => hasher
                    .diff_with(&pages, &snap, candidates.as_ref(), &sink)
                    .map_err(|e| failed("re-hash", e))?
                    .count(),
            };
            Ok((t.elapsed().as_nanos() as u64, dirty))
        });
        self.pipeline = Some(Pipeline { rx, thread });
        self.phase = Phase::StopCopy;
        Ok(())
    }

    /// Produce more stop-copy bytes. Returns `false` once END has been written.
    fn produce_stop_copy(&mut self) -> Result<bool, DeviceError> {
        loop {
            if !self.queue.is_empty() {
                let n = self.send_queued()?;
                self.stats.pages_stop_copy += n;
                return Ok(true);
            }
            if let Some(p) = &self.pipeline {
                if let Ok(dirty) = p.rx.recv() {
                    self.queue.extend(dirty);
                    continue;
                }
                let p = self
                    .pipeline
                    .take()
                    .ok_or(DeviceError::Failed("pipeline".into()))?;
                let (ns, _) = p
                    .thread
                    .join()
                    .map_err(|_| DeviceError::Failed("hash pipeline panicked".into()))??;
                self.stats.hash_ns = ns;
                continue;
            }
            if let Some(states) = self.states.take() {
                let w = self.writer()?;
                for (kind, payload) in &states {
                    w.write_state(*kind, payload)
                        .map_err(|e| failed("stream", e))?;
                }
                return Ok(true);
            }
            if let Some(w) = self.writer.take() {
                let (rest, _) = w.finish().map_err(|e| failed("stream", e))?;
                // Bytes not yet handed out stay at the front of `rest`.
                self.tail = rest;
                self.finished = true;
                return Ok(true);
            }
            return Ok(false);
        }
    }

    /// Workloads a stop may still let finish (none once the VM is quiesced).
    fn drainable(&self) -> usize {
        if self.quiesced {
            0
        } else {
            self.max_drain
        }
    }

    /// The page records STOP_COPY would still produce if the device stopped now, for
    /// MIG_DATA_SIZE. Before the stop this is measured, not guessed: the pages that differ from
    /// what pre-copy sent are found by re-hashing the candidate set (every sent page where the
    /// write set is unknown), and zero pages are counted as the markers they travel as. What a
    /// stop's drain may still write is added on top.
    fn stop_copy_pages(&mut self) -> Result<PagePlan, DeviceError> {
        let mut plan = PagePlan {
            batch_pages: self.batch_pages as u64,
            ..PagePlan::default()
        };
        let listed = match self.phase {
            Phase::Idle => {
                // Stop-and-copy: every migratable page goes, each zero or not as it is now.
                let guest = self.vm.stream_header().guest_pages;
                let frames = bitmap_of(guest, self.vm.migratable_pages())?;
                plan.queued = frames.count();
                frames
            }
            Phase::PreCopy => {
                let snap = self
                    .snap
                    .as_ref()
                    .ok_or(DeviceError::Failed("no snapshot".into()))?;
                // Frames that became migratable after pre-copy began go as they are.
                let mut frames =
                    bitmap_of(self.guest_pages, untracked_pages(&self.vm, snap.tracked()))?;
                plan.queued = frames.count();
                // What changed since it was sent (never-sent tracked pages count as changed).
                let candidates = match self.vm.write_candidates() {
                    Candidates::Pages(p) => Some(bitmap_of(self.guest_pages, p)?),
                    Candidates::Unknown => None,
                };
                let pages = GuestPages::new(self.vm.memory()).map_err(|e| failed("memory", e))?;
                let changed = self
                    .hasher
                    .diff(&pages, snap, candidates.as_ref())
                    .map_err(|e| failed("re-hash", e))?;
                plan.found = changed.count();
                frames.merge(&changed).map_err(|e| failed("bitmap", e))?;
                frames
            }
            // While the re-hash runs, any planned page may still go; after it, only the queue.
            Phase::StopCopy => {
                plan.queued = if self.pipeline.is_some() {
                    self.stop_copy_planned
                        .saturating_sub(self.stats.pages_stop_copy)
                } else {
                    self.queue.len() as u64
                };
                return Ok(plan);
            }
        };
        let pages = GuestPages::new(self.vm.memory()).map_err(|e| failed("memory", e))?;
        let zero_in = |frames: &DirtyBitmap| {
            self.hasher
                .count_zero(&pages, frames)
                .map_err(|e| failed("zero scan", e))
        };
        plan.zero = zero_in(&listed)?;
        // Sent pages not due to go again: a drain's writes may land there.
        let sent_unlisted = self.snap.as_ref().map(|snap| {
            let mut rest = snap.recorded().clone();
            rest.subtract(&listed);
            rest
        });
        if self.drainable() > 0 {
            match self.vm.drain_writes(self.drainable()) {
                Some(w) => {
                    let span = listed.span_pages();
                    let mut touched = bitmap_of(span, w.pages)?;
                    let mut new = touched.clone();
                    new.subtract(&listed);
                    touched.intersect(&listed);
                    let unzeroed = zero_in(&touched)?;
                    // Pages known by count only land on the costliest frames they can reach:
                    // first ones not listed yet (only sent, unchanged pages can become listed),
                    // then listed zero pages.
                    let reach = w.within.map(|f| bitmap_of(span, f)).transpose()?;
                    let within = |mut b: DirtyBitmap| {
                        if let Some(r) = &reach {
                            b.intersect(r);
                        }
                        b
                    };
                    let room_new = sent_unlisted.map_or(0, |mut rest| {
                        rest.subtract(&new);
                        within(rest).count()
                    });
                    let by_count_new = w.more.min(room_new);
                    let mut rest = listed.clone();
                    rest.subtract(&touched);
                    let room_zero = zero_in(&within(rest))?;
                    plan.drain_new = new.count() + by_count_new;
                    plan.drain_unzeroed = unzeroed + (w.more - by_count_new).min(room_zero);
                }
                // Nothing can be said: every sent page may be rewritten.
                None => {
                    plan.drain_unzeroed = plan.zero;
                    plan.drain_new = sent_unlisted.map_or(0, |rest| rest.count());
                }
            }
        }
        if matches!(self.phase, Phase::PreCopy) {
            plan.sink_calls = self
                .hasher
                .diff_sink_calls_bound(plan.found + plan.drain_new);
        }
        Ok(plan)
    }

    fn pending(&mut self) -> Option<&mut Vec<u8>> {
        match self.writer.as_mut() {
            Some(w) => Some(w.get_mut()),
            None if self.finished => Some(&mut self.tail),
            None => None,
        }
    }
}

impl<V: MigratableVm> RunControl for SourceDevice<V> {
    fn stop(&mut self) -> ArcResult {
        self.quiesce().map_err(ArcFailure::rolled_back)
    }

    fn run(&mut self) -> ArcResult {
        if self.quiesced {
            self.vm
                .unquiesce()
                .map_err(|e| ArcFailure::fatal(DeviceError::Failed(e.to_string())))?;
            self.quiesced = false;
        }
        Ok(())
    }

    fn reset(&mut self) -> gmig_vfio_migration::device::Result<()> {
        self.reset_session();
        self.run().map_err(|f| f.error)
    }
}

impl<V: MigratableVm> StateSaver for SourceDevice<V> {
    fn start_stop_copy(&mut self) -> ArcResult {
        // STOP -> STOP_COPY: stop-and-copy (no pre-copy) sends every page in downtime.
        let (quiesce_ns, drained) = (self.stats.quiesce_ns, self.stats.drained);
        self.reset_session();
        self.open_stream().map_err(ArcFailure::rolled_back)?;
        self.stats.quiesce_ns = quiesce_ns;
        self.stats.drained = drained;
        self.enter_stop_copy().map_err(ArcFailure::rolled_back)
    }

    fn end_stop_copy(&mut self) -> ArcResult {
        self.reset_session();
        Ok(())
    }

    fn save_read(&mut self, buf: &mut [u8]) -> gmig_vfio_migration::device::Result<usize> {
        loop {
            let pos = self.out_pos;
            if let Some(out) = self.pending() {
                if pos < out.len() {
                    let n = buf.len().min(out.len() - pos);
                    buf[..n].copy_from_slice(&out[pos..pos + n]);
                    let new_pos = pos + n;
                    if new_pos == out.len() {
                        out.clear();
                        self.out_pos = 0;
                    } else {
                        self.out_pos = new_pos;
                    }
                    return Ok(n);
                }
            }
            match self.phase {
                Phase::PreCopy if !self.early_states.is_empty() => {
                    let states = std::mem::take(&mut self.early_states);
                    let w = self.writer()?;
                    for (kind, payload) in &states {
                        w.write_state(*kind, payload)
                            .map_err(|e| failed("stream", e))?;
                    }
                }
                Phase::PreCopy if self.sync_pending && self.queue.is_empty() => {
                    self.sync_pending = false;
                    let seq = self.sync_seq;
                    // Before the switch-over marker, so the destination backs them while the
                    // guest still runs: frames the device can write that pre-copy may have
                    // found zero (the destination never touched those).
                    // A frame outside guest memory (a GTT entry may name one) is left out.
                    let guest = self.guest_pages;
                    let mut writable = self.vm.device_writable_pages().unwrap_or_default();
                    writable.retain(|g| g.0 < guest);
                    let w = self.writer()?;
                    w.write_writable_frames(&writable)
                        .map_err(|e| failed("stream", e))?;
                    w.write_sync(seq).map_err(|e| failed("stream", e))?;
                }
                Phase::PreCopy => {
                    let n = self.send_queued()?;
                    if n == 0 {
                        return Ok(0);
                    }
                    self.stats.pages_precopy += n;
                    self.stats.precopy_batches += 1;
                    self.first_pass_left = self.first_pass_left.saturating_sub(n);
                }
                Phase::StopCopy => {
                    if !self.produce_stop_copy()? {
                        return Ok(0);
                    }
                }
                Phase::Idle => return Err(DeviceError::Failed("no saving session".into())),
            }
        }
    }

    fn stop_copy_size(&mut self) -> gmig_vfio_migration::device::Result<u64> {
        let pages = self.stop_copy_pages()?;
        let stopped = matches!(self.phase, Phase::StopCopy);
        // Device state still to be written: captured at the stop (and gone once written), or what
        // a capture now would give plus room for what a drain may add to it (a fault record, a
        // new counter; the drained workload itself leaves the queue, so the state usually shrinks).
        let state: u64 = match (&self.states, stopped) {
            (Some(s), _) => s.iter().map(|(_, p)| p.len() as u64 + SECTION).sum(),
            (None, true) => 0,
            (None, false) => {
                let now: u64 = self
                    .stop_state()
                    .map_err(|e| failed("save state", e))?
                    .iter()
                    .map(|(_, p)| p.len() as u64 + SECTION)
                    .sum();
                now + self.drainable() as u64 * DRAIN_STATE_SLACK
            }
        };
        let end = if self.writer.is_some() || !stopped {
            SECTION + crate::stream::END_PAYLOAD_LEN as u64
        } else {
            0
        };
        // With no saving session open, STOP_COPY starts a stream: its header comes first.
        let header = match self.phase {
            Phase::Idle => crate::stream::HEADER_LEN as u64,
            _ => 0,
        };
        let pos = self.out_pos as u64;
        let pending = self
            .pending()
            .map_or(0, |p| (p.len() as u64).saturating_sub(pos));
        Ok(header + pages.bytes() + state + end + pending)
    }

    fn start_precopy(&mut self) -> ArcResult {
        self.reset_session();
        self.open_stream().map_err(ArcFailure::rolled_back)?;
        let pages = self.vm.migratable_pages();
        let tracked =
            bitmap_of(self.guest_pages, pages.iter().copied()).map_err(ArcFailure::rolled_back)?;
        let snap = HashSnapshot::new(tracked)
            .map_err(|e| ArcFailure::rolled_back(failed("snapshot", e)))?;
        // Made and backed now: the re-hash thread would otherwise fault them in during downtime.
        self.scratch_diff = Some(
            DiffScratch::prepared(&snap)
                .map_err(|e| ArcFailure::rolled_back(failed("re-hash buffers", e)))?,
        );
        self.snap = Some(snap);
        self.vm.start_write_tracking();
        let early = self
            .vm
            .precopy_state()
            .map_err(|e| ArcFailure::rolled_back(failed("pre-copy state", e)))?;
        self.sent_early = !early.is_empty();
        self.early_states = early;
        self.first_pass_left = pages.len() as u64;
        self.queue.extend(pages);
        self.stats.rounds = 1;
        self.phase = Phase::PreCopy;
        Ok(())
    }

    fn abort_precopy(&mut self) -> ArcResult {
        self.reset_session();
        Ok(())
    }

    fn precopy_to_stop_copy(&mut self) -> ArcResult {
        self.enter_stop_copy().map_err(|e| {
            // Undo the stop so that the caller's RUNNING request finds a running VM.
            if self.quiesced && self.vm.unquiesce().is_ok() {
                self.quiesced = false;
            }
            ArcFailure::rolled_back(e)
        })
    }

    fn precopy_info(&mut self) -> gmig_vfio_migration::device::Result<PrecopyInfo> {
        let early: u64 = self
            .early_states
            .iter()
            .map(|(_, p)| p.len() as u64 + SECTION)
            .sum();
        Ok(PrecopyInfo {
            initial_bytes: self.first_pass_left * PAGE_SIZE as u64 + early,
            dirty_bytes: self
                .queue
                .len()
                .saturating_sub(self.first_pass_left as usize) as u64
                * PAGE_SIZE as u64,
        })
    }
}

impl<V: MigratableVm> StateLoader for SourceDevice<V> {
    fn start_resuming(&mut self) -> ArcResult {
        Err(ArcFailure::rolled_back(DeviceError::NotSupported(
            "resuming on a source",
        )))
    }

    fn resume_write(&mut self, _data: &[u8]) -> gmig_vfio_migration::device::Result<()> {
        Err(DeviceError::NotSupported("resuming on a source"))
    }

    fn finish_resuming(&mut self) -> ArcResult {
        Err(ArcFailure::rolled_back(DeviceError::NotSupported(
            "resuming on a source",
        )))
    }
}

impl<V: MigratableVm> DirtyLogging for SourceDevice<V> {}

impl<V: MigratableVm> MigrationDevice for SourceDevice<V> {
    fn migration_features(&self) -> MigrationFeatures {
        MigrationFeatures::STOP_COPY.union(MigrationFeatures::PRE_COPY)
    }
}
