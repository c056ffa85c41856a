//! The `gmig-vfio-migration` device traits of [`SourceDevice`]: run control, saving (pre-copy and
//! stop-copy), and refusing to resume.

use gmig_dirty::{DiffScratch, HashSnapshot};
use gmig_vfio_migration::{
    ArcFailure, ArcResult, DeviceError, DirtyLogging, MigrationDevice, MigrationFeatures,
    PrecopyInfo, RunControl, StateLoader, StateSaver,
};

use super::SourceDevice;
use crate::migration::plan::{bitmap_of, failed, Phase, DRAIN_STATE_SLACK, SECTION};
use crate::migration::vm::MigratableVm;
use crate::stream::PAGE_SIZE;

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
