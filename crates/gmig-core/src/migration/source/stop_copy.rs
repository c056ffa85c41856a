//! The stop: the downtime re-hash pipeline, the stop-copy part of the stream, and the pages a stop
//! would still send (for MIG_DATA_SIZE).

use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::Instant;

use gmig_dirty::{DiffScratch, DirtyBitmap, GuestPages, HashSnapshot, Hasher};
use gmig_vfio_migration::DeviceError;
use vm_memory::GuestMemoryMmap;

use super::SourceDevice;
use crate::migration::config::Policy;
use crate::migration::plan::{
    bitmap_of, failed, untracked_pages, PagePlan, Phase, Pipeline, PipelineResult,
};
use crate::migration::vm::{Candidates, MigratableVm};
use crate::stream::Gfn;

impl<V: MigratableVm> SourceDevice<V> {
    /// The VM is stopped: capture its state and start the hash pipeline that finds the pages to
    /// send in downtime.
    pub(super) fn enter_stop_copy(&mut self) -> Result<(), DeviceError> {
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

        let snap = match self.snap.take() {
            Some(snap) if !snap.is_empty() => snap,
            // Stop-and-copy (no pre-copy), or a snapshot that tracks nothing (the VMM moves guest
            // RAM itself and the device stream carries only the device's state): no re-hash and
            // no bitmap as wide as guest RAM in the downtime; every migratable page goes now
            // (after an empty snapshot, only pages that became migratable since pre-copy began).
            _ => {
                self.queue.clear();
                self.queue.extend(self.vm.migratable_pages());
                self.stop_copy_planned = self.queue.len() as u64;
                self.phase = Phase::StopCopy;
                return Ok(());
            }
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
        if self.stats.rehashed <= gmig_dirty::hasher::MIN_TASK_PAGES {
            // A small re-hash (a desktop's few hundred candidate pages) runs here, on the
            // thread that stopped the vGPU: a pipeline thread spawned in downtime, and the
            // hash pool's workers, would each have to be scheduled first, which on a busy host
            // costs milliseconds for well under one of work.
            let t = Instant::now();
            let found = std::sync::Mutex::new(Vec::new());
            let sink = |f: &[gmig_dirty::Gfn]| {
                found
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend(f.iter().map(|g| Gfn(g.0)));
            };
            let done = rehash(&hasher, &mem, &snap, candidates.as_ref(), scratch, &sink)?;
            self.scratch_diff = done.into_scratch();
            let mut found = found
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            found.sort_unstable_by_key(|g| g.0);
            self.queue.extend(found);
            self.stats.hash_ns = t.elapsed().as_nanos() as u64;
            self.phase = Phase::StopCopy;
            return Ok(());
        }
        let (tx, rx) = sync_channel::<Vec<Gfn>>(4096);
        let thread = std::thread::spawn(move || -> PipelineResult {
            let t = Instant::now();
            let sink = |found: &[gmig_dirty::Gfn]| {
                // A failed send means the session was aborted; the diff just runs out.
                let _ = tx.send(found.iter().map(|g| Gfn(g.0)).collect());
            };
            let done = rehash(&hasher, &mem, &snap, candidates.as_ref(), scratch, &sink)?;
            let dirty = done.dirty().count();
            Ok((t.elapsed().as_nanos() as u64, dirty))
        });
        self.pipeline = Some(Pipeline { rx, thread });
        self.phase = Phase::StopCopy;
        Ok(())
    }

    /// Produce more stop-copy bytes. Returns `false` once END has been written.
    pub(super) fn produce_stop_copy(&mut self) -> Result<bool, DeviceError> {
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

    /// The page records STOP_COPY would still produce if the device stopped now, for
    /// MIG_DATA_SIZE. Before the stop this is measured, not guessed: the pages that differ from
    /// what pre-copy sent are found by re-hashing the candidate set (every sent page where the
    /// write set is unknown), and zero pages are counted as the markers they travel as. What a
    /// stop's drain may still write is added on top.
    pub(super) fn stop_copy_pages(&mut self) -> Result<PagePlan, DeviceError> {
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
}

/// What a re-hash leaves: the scratch it ran in (pre-copy's, kept for the next session), or the
/// bitmap it made without one.
enum Rehashed {
    Into(DiffScratch),
    Fresh(DirtyBitmap),
}

impl Rehashed {
    /// The pages found changed.
    fn dirty(&self) -> &DirtyBitmap {
        match self {
            Rehashed::Into(scratch) => scratch.dirty(),
            Rehashed::Fresh(dirty) => dirty,
        }
    }

    /// The scratch to keep, if the re-hash ran in one.
    fn into_scratch(self) -> Option<DiffScratch> {
        match self {
            Rehashed::Into(scratch) => Some(scratch),
            Rehashed::Fresh(_) => None,
        }
    }
}

/// The downtime re-hash, on the stopping thread or the pipeline's: `snap`'s tracked pages (only
/// `candidates`, when known) hashed again in `mem`, each batch of changed frames handed to
/// `sink`; into `scratch` when pre-copy prepared one (no allocation in downtime), else into
/// buffers made here.
fn rehash(
    hasher: &Hasher,
    mem: &GuestMemoryMmap,
    snap: &HashSnapshot,
    candidates: Option<&DirtyBitmap>,
    scratch: Option<DiffScratch>,
    sink: &(dyn Fn(&[gmig_dirty::Gfn]) + Sync),
) -> Result<Rehashed, DeviceError> {
    let pages = GuestPages::new(mem).map_err(|e| failed("guest memory", e))?;
    match scratch {
        Some(mut scratch) => {
            hasher
                .diff_into(&pages, snap, candidates, sink, &mut scratch)
                .map_err(|e| failed("re-hash", e))?;
            Ok(Rehashed::Into(scratch))
        }
        None => hasher
            .diff_with(&pages, snap, candidates, sink)
            .map(Rehashed::Fresh)
            .map_err(|e| failed("re-hash", e)),
    }
}
