//! [`VmDevice`]: one migration device that is both ends of the contract, as a VFIO device is.
//!
//! The engine drives a source ([`SourceDevice`]) and a destination ([`DestDevice`]) as two types,
//! because each end only ever does half of the work. A VMM sees one device per vGPU instead: it
//! saves that device while it runs, and it loads a stream into a fresh device of the same kind
//! (which may already hold a VM that the stream replaces). `VmDevice` is that device:
//!
//! * while it holds a VM, the saving arcs (PRE_COPY, STOP_COPY, MIG_DATA_SIZE, PRECOPY_INFO) are
//!   the [`SourceDevice`]'s;
//! * STOP → RESUMING stages the incoming stream in a [`DestDevice`]; the VM it holds (if any)
//!   stays untouched until RESUMING → STOP has validated the whole stream and restored a new VM,
//!   which then replaces it — a truncated, corrupt or foreign stream loses nothing;
//! * the restored VM is stopped; STOP → RUNNING resumes it, and it can be saved again (a vGPU
//!   migrated back, or onward).
//!
//! This is what `gmig_vfio_migration::conformance::check` and the v1 region emulation take: one
//! device type for both ends.
//!
//! **DMA logging.** A mediated vGPU has no IOMMU dirty bits, and QEMU will not migrate a VFIO
//! device without `LOGGING_START/REPORT/STOP`. `VmDevice` answers them from `gmig-dirty`: START
//! hashes every guest frame the ranges cover (IOVA = guest-physical address, the identity
//! mapping a VMM gives guest RAM); each REPORT re-hashes them, records the new hashes
//! ([`Hasher::diff_update`]) and reports what changed — every page the vGPU wrote (and, harmlessly,
//! those the vCPUs wrote, which KVM's log has anyway). Nothing is lost between reports: a write
//! after a page was hashed shows at the next report, one before it is in the bytes the VMM reads
//! after this report.

use std::sync::Arc;

use gmig_dirty::{DirtyBitmap, GuestPages, HashSnapshot, Hasher};
use gmig_vfio_migration::dma_log::{DmaLogError, DmaLogSlot};

use super::config::{MigrationConfig, Policy};
use super::dest::DestDevice;
use super::source::{SourceDevice, SourceStats};
use super::vm::{MigratableVm, VmFactory};
use crate::stream::StreamLimits;

use gmig_vfio_migration::{
    device, ArcFailure, ArcResult, DeviceError, DirtyLogging, IovaRange, MigrationDevice,
    MigrationFeatures, PrecopyInfo, RunControl, StateLoader, StateSaver,
};

/// How a [`VmDevice`] saves: the source settings of [`SourceDevice::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveSettings {
    /// Migration policy (what pre-copy and stop-copy send).
    pub policy: Policy,
    /// What of the in-flight work a stop lets finish.
    pub max_drain: super::Drain,
    /// Pages per page batch.
    pub batch_pages: usize,
    /// Hashing threads (0: one per core). Hand-overs from several threads interleave, so only
    /// one thread gives the same byte order on every run.
    pub hash_threads: usize,
}

impl From<&MigrationConfig> for SaveSettings {
    fn from(c: &MigrationConfig) -> SaveSettings {
        SaveSettings {
            policy: c.policy,
            max_drain: c.max_drain,
            batch_pages: c.batch_pages,
            hash_threads: c.hash_threads,
        }
    }
}

fn no_vm() -> DeviceError {
    DeviceError::NotSupported("saving a device that holds no VM")
}

/// A device that saves the VM it holds and resumes a stream into a new one (module docs).
pub struct VmDevice<F: VmFactory> {
    source: Option<SourceDevice<F::Vm>>,
    dest: DestDevice<F>,
    settings: SaveSettings,
    hasher: Arc<Hasher>,
    dma: DmaLogSlot,
    /// Hashes of the guest frames DMA logging tracks, as of the last report.
    dma_hashes: Option<HashSnapshot>,
    /// The guest frames the logged ranges cover.
    dma_covered: Option<DirtyBitmap>,
}

impl<F: VmFactory> std::fmt::Debug for VmDevice<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmDevice")
            .field("holds_vm", &self.source.is_some())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl<F: VmFactory> VmDevice<F> {
    /// A device holding `vm` (running, or `None` for a fresh device that only a stream will
    /// fill), building incoming VMs with `factory` within `limits`.
    pub fn new(
        vm: Option<F::Vm>,
        factory: F,
        limits: StreamLimits,
        settings: SaveSettings,
    ) -> Result<Self, DeviceError> {
        let hasher = Arc::new(
            Hasher::new(settings.hash_threads)
                .map_err(|e| DeviceError::Failed(format!("hash pool: {e}")))?,
        );
        let mut dev = VmDevice {
            source: None,
            dest: DestDevice::new(factory, limits),
            settings,
            hasher,
            dma: DmaLogSlot::default(),
            dma_hashes: None,
            dma_covered: None,
        };
        dev.source = vm.map(|vm| dev.source_for(vm));
        Ok(dev)
    }

    fn source_for(&self, vm: F::Vm) -> SourceDevice<F::Vm> {
        let s = self.settings;
        SourceDevice::with_hasher(
            vm,
            s.policy,
            s.max_drain,
            s.batch_pages,
            Arc::clone(&self.hasher),
        )
    }

    fn source(&mut self) -> Result<&mut SourceDevice<F::Vm>, DeviceError> {
        self.source.as_mut().ok_or_else(no_vm)
    }

    fn saving(&mut self) -> Result<&mut SourceDevice<F::Vm>, ArcFailure> {
        self.source().map_err(ArcFailure::rolled_back)
    }

    /// The VM this device holds.
    pub fn vm(&self) -> Option<&F::Vm> {
        self.source.as_ref().map(SourceDevice::vm)
    }

    /// The VM, mutably (to run its workload).
    pub fn vm_mut(&mut self) -> Option<&mut F::Vm> {
        self.source.as_mut().map(SourceDevice::vm_mut)
    }

    /// Give the VM back.
    pub fn into_vm(self) -> Option<F::Vm> {
        self.source.map(SourceDevice::into_vm)
    }

    /// The saving side's counts (zero when no VM is held).
    pub fn stats(&self) -> SourceStats {
        self.source
            .as_ref()
            .map(SourceDevice::stats)
            .unwrap_or_default()
    }

    /// The resuming side (restore times, pages received).
    pub fn resuming(&self) -> &DestDevice<F> {
        &self.dest
    }
}

impl<F: VmFactory> RunControl for VmDevice<F> {
    fn stop(&mut self) -> ArcResult {
        self.source.as_mut().map_or(Ok(()), RunControl::stop)
    }

    fn run(&mut self) -> ArcResult {
        self.source.as_mut().map_or(Ok(()), RunControl::run)
    }

    fn reset(&mut self) -> device::Result<()> {
        self.dest.reset()?;
        self.source.as_mut().map_or(Ok(()), RunControl::reset)
    }
}

impl<F: VmFactory> StateSaver for VmDevice<F> {
    fn start_stop_copy(&mut self) -> ArcResult {
        self.saving()?.start_stop_copy()
    }

    fn end_stop_copy(&mut self) -> ArcResult {
        self.saving()?.end_stop_copy()
    }

    fn save_read(&mut self, buf: &mut [u8]) -> device::Result<usize> {
        self.source()?.save_read(buf)
    }

    fn stop_copy_size(&mut self) -> device::Result<u64> {
        self.source()?.stop_copy_size()
    }

    fn start_precopy(&mut self) -> ArcResult {
        self.saving()?.start_precopy()
    }

    fn abort_precopy(&mut self) -> ArcResult {
        self.saving()?.abort_precopy()
    }

    fn precopy_to_stop_copy(&mut self) -> ArcResult {
        self.saving()?.precopy_to_stop_copy()
    }

    fn precopy_info(&mut self) -> device::Result<PrecopyInfo> {
        self.source()?.precopy_info()
    }
}

impl<F: VmFactory> StateLoader for VmDevice<F> {
    fn start_resuming(&mut self) -> ArcResult {
        self.dest.start_resuming()
    }

    fn resume_write(&mut self, data: &[u8]) -> device::Result<()> {
        self.dest.resume_write(data)
    }

    fn finish_resuming(&mut self) -> ArcResult {
        self.dest.finish_resuming()?;
        let vm = self.dest.take_vm().ok_or_else(|| {
            ArcFailure::rolled_back(DeviceError::Failed("restore gave no VM".into()))
        })?;
        // Only now, with the new VM restored, is the old one (if any) let go.
        self.source = Some(self.source_for(vm).stopped());
        // Guest memory was replaced wholesale: if DMA logging runs, every logged page is new,
        // and what the new vGPU can reach is hashed afresh.
        if let (Some(_), Some(covered)) = (self.dma_hashes.as_ref(), self.dma_covered.clone()) {
            if let Some(log) = self.dma.logger() {
                let _ = log.merge_guest_dirty(&covered, 0);
            }
            if let Ok(snap) = self.dma_reach(&covered).and_then(|r| self.dma_snapshot(r)) {
                self.dma_hashes = Some(snap);
            }
        }
        Ok(())
    }
}

/// `frames` in a bitmap from the first to the last of them (its base a multiple of 64 frames),
/// so what is kept per frame scales with the frames, not with guest RAM; empty where there are
/// none.
fn tight<I>(frames: I) -> Result<DirtyBitmap, DeviceError>
where
    I: Iterator<Item = gmig_dirty::Gfn> + Clone,
{
    let lo = frames.clone().map(|g| g.0).min().map_or(0, |g| g / 64 * 64);
    let hi = frames.clone().map(|g| g.0 + 1).max().unwrap_or(lo);
    let mut b = DirtyBitmap::new(gmig_dirty::Gfn(lo), hi.saturating_sub(lo))
        .map_err(|e| dma_failed("bitmap", e))?;
    for g in frames {
        b.set(g).map_err(|e| dma_failed("bitmap", e))?;
    }
    Ok(b)
}

fn dma_failed(what: &str, e: impl std::fmt::Display) -> DeviceError {
    DeviceError::Failed(format!("DMA logging: {what}: {e}"))
}

impl<F: VmFactory> VmDevice<F> {
    /// The guest frames that `ranges` cover.
    fn dma_covered(&self, ranges: &[IovaRange]) -> Result<DirtyBitmap, DeviceError> {
        let vm = self.vm().ok_or_else(no_vm)?;
        let pages = GuestPages::new(vm.memory()).map_err(|e| dma_failed("guest memory", e))?;
        let mut frames = pages.frames().map_err(|e| dma_failed("guest memory", e))?;
        let mut covered = DirtyBitmap::new(frames.base(), frames.span_pages())
            .map_err(|e| dma_failed("bitmap", e))?;
        let page = gmig_dirty::PAGE_SIZE as u64;
        for r in ranges {
            let first = r.iova / page;
            let end = r.iova.saturating_add(r.length).div_ceil(page);
            let lo = first.max(frames.base().0);
            let hi = end.min(frames.end().0);
            if lo < hi {
                covered
                    .set_range(gmig_dirty::Gfn(lo), hi - lo)
                    .map_err(|e| dma_failed("bitmap", e))?;
            }
        }
        frames.intersect(&covered);
        Ok(frames)
    }

    /// The covered frames the device could write now (all of them when it cannot say), in a
    /// bitmap spanning only them ([`tight`]): the snapshot hashed from it, and every re-hash,
    /// scale with the GTT-backed frames the device reaches, not with guest RAM.
    fn dma_reach(&self, covered: &DirtyBitmap) -> Result<DirtyBitmap, DeviceError> {
        let vm = self.vm().ok_or_else(no_vm)?;
        let Some(reach) = vm.device_writable_pages() else {
            return tight(covered.iter());
        };
        tight(
            reach
                .iter()
                .map(|g| gmig_dirty::Gfn(g.0))
                .filter(|&g| covered.is_set(g)),
        )
    }

    /// Hashes of `frames` as they are now.
    fn dma_snapshot(&self, frames: DirtyBitmap) -> Result<HashSnapshot, DeviceError> {
        let vm = self.vm().ok_or_else(no_vm)?;
        let pages = GuestPages::new(vm.memory()).map_err(|e| dma_failed("guest memory", e))?;
        let mut snap = HashSnapshot::new(frames).map_err(|e| dma_failed("snapshot", e))?;
        self.hasher
            .record_in_place(&pages, &mut snap)
            .map_err(|e| dma_failed("hash", e))?;
        Ok(snap)
    }

    /// Re-hash the tracked frames and put what changed into the log. Frames the device can reach
    /// now but did not when they were last hashed (a GTT entry written since) are logged as
    /// dirty and tracked from now on: the device may have written them in between.
    fn dma_refresh(&mut self) -> Result<(), DeviceError> {
        let (Some(snap), Some(vm), Some(covered)) = (
            self.dma_hashes.as_mut(),
            self.source.as_ref(),
            self.dma_covered.as_ref(),
        ) else {
            return Err(DeviceError::DmaLog(DmaLogError::NotStarted));
        };
        let pages = GuestPages::new(vm.vm().memory()).map_err(|e| dma_failed("memory", e))?;
        let dirty = self
            .hasher
            .diff_update(&pages, snap)
            .map_err(|e| dma_failed("re-hash", e))?;
        // Frames the device reaches now that the snapshot does not track: looked up frame by
        // frame (the reach is the GTT-backed pages, far fewer than guest RAM), so a report costs
        // no pass over the whole of guest RAM's bitmap unless the reach grew.
        let fresh: Vec<gmig_dirty::Gfn> = match vm.vm().device_writable_pages() {
            Some(reach) => reach
                .into_iter()
                .map(|g| gmig_dirty::Gfn(g.0))
                .filter(|&g| covered.is_set(g) && !snap.tracked().is_set(g))
                .collect(),
            // Everything covered is tracked from the start.
            None => Vec::new(),
        };
        if !fresh.is_empty() {
            let reach = tight(snap.tracked().iter().chain(fresh.iter().copied()))?;
            self.dma_hashes = Some(self.dma_snapshot(reach)?);
        }
        if let Some(log) = self.dma.logger() {
            log.merge_guest_dirty(&dirty, 0)?;
            log.merge_guest_dirty(&tight(fresh.into_iter())?, 0)?;
        }
        Ok(())
    }
}

impl<F: VmFactory> DirtyLogging for VmDevice<F> {
    fn dma_logging_start(&mut self, page_size: u64, ranges: &[IovaRange]) -> device::Result<u64> {
        // A device with no VM refuses before the log exists; bad ranges before anything is hashed.
        if self.source.is_none() {
            return Err(no_vm());
        }
        let ps = self.dma.start(page_size, ranges)?;
        let snap = self.dma_covered(ranges).and_then(|covered| {
            let reach = self.dma_reach(&covered)?;
            self.dma_covered = Some(covered);
            self.dma_snapshot(reach)
        });
        match snap {
            Ok(snap) => {
                self.dma_hashes = Some(snap);
                Ok(ps)
            }
            Err(e) => {
                let _ = self.dma.stop();
                Err(e)
            }
        }
    }

    fn dma_logging_stop(&mut self) -> device::Result<()> {
        self.dma.stop()?;
        self.dma_hashes = None;
        self.dma_covered = None;
        Ok(())
    }

    fn dma_logging_report(
        &mut self,
        iova: u64,
        length: u64,
        page_size: u64,
    ) -> device::Result<Vec<u64>> {
        self.dma_refresh()?;
        Ok(self.dma.report(iova, length, page_size)?)
    }
}

impl<F: VmFactory> MigrationDevice for VmDevice<F> {
    fn migration_features(&self) -> MigrationFeatures {
        MigrationFeatures::STOP_COPY.union(MigrationFeatures::PRE_COPY)
    }
}

#[cfg(test)]
mod tests {
    use super::tight;
    use gmig_dirty::{DirtyBitmap, Gfn};

    #[test]
    fn tight_spans_the_set_frames_and_the_extra_ones() {
        let mut b = DirtyBitmap::new(Gfn(0), 1 << 21).unwrap();
        for g in [70_000, 70_001, 90_000] {
            b.set(Gfn(g)).unwrap();
        }
        let t = tight(b.iter().chain([Gfn(100_000)])).unwrap();
        assert_eq!(t.base(), Gfn(70_000 / 64 * 64));
        assert_eq!(t.base().0 + t.span_pages(), 100_001);
        let got: Vec<u64> = t.iter().map(|g| g.0).collect();
        assert_eq!(got, vec![70_000, 70_001, 90_000, 100_000]);
        let empty = tight(DirtyBitmap::new(Gfn(0), 1 << 21).unwrap().iter()).unwrap();
        assert_eq!((empty.span_pages(), empty.count()), (0, 0));
    }
}
