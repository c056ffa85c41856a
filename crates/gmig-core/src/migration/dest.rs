//! The resuming side of the engine: a stream received into private memory, restored only once
//! the whole of it has validated.

use gmig_vfio_migration::{
    ArcFailure, ArcResult, DeviceError, DirtyLogging, MigrationDevice, RunControl, StateLoader,
    StateSaver,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::vm::{MigratableVm, RestoreTimes, VmFactory};
use crate::stream::{
    frame_ranges, FrameRange, Gfn, PageData, Section, StateKind, StreamDecoder, StreamError,
    StreamLimits, PAGE_SIZE,
};

/// Resuming side: receives a stream into private memory and restores a VM from it only once the
/// whole stream has validated.
pub struct DestDevice<F: VmFactory> {
    factory: F,
    limits: StreamLimits,
    decoder: Option<StreamDecoder>,
    memory: Option<GuestMemoryMmap>,
    states: Vec<(StateKind, Vec<u8>)>,
    vm: Option<F::Vm>,
    times: RestoreTimes,
    pages: u64,
    /// Frames written in this session (the factory's memory starts zero-filled).
    written: Vec<bool>,
    /// Sequence number of the last SYNC section applied.
    synced: Option<u64>,
    /// Why this stream was refused (offset, reason): the first error a write met, given again
    /// by every later write and by the stop that ends resuming (whoever reports the failure
    /// reports the real reason, not a missing END).
    refused: Option<(u64, String)>,
}

impl<F: VmFactory> std::fmt::Debug for DestDevice<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DestDevice")
            .field("pages", &self.pages)
            .field("restored", &self.vm.is_some())
            .finish_non_exhaustive()
    }
}

fn bad_stream(e: StreamError) -> DeviceError {
    let offset = match e {
        StreamError::Truncated { offset, .. }
        | StreamError::Io { offset, .. }
        | StreamError::BadHeaderField { offset, .. }
        | StreamError::UnknownSection { offset, .. }
        | StreamError::UnsupportedSectionVersion { offset, .. }
        | StreamError::SectionFlags { offset, .. }
        | StreamError::SectionTooLarge { offset, .. }
        | StreamError::SectionChecksum { offset, .. }
        | StreamError::StreamTooLarge { offset, .. }
        | StreamError::BadPageBatch { offset, .. }
        | StreamError::BadFrameHint { offset, .. }
        | StreamError::PageOutOfRange { offset, .. }
        | StreamError::BadPageEncoding { offset, .. }
        | StreamError::EndMismatch { offset, .. }
        | StreamError::DuplicateSection { offset, .. }
        | StreamError::SectionOutOfOrder { offset, .. }
        | StreamError::BadSectionLength { offset, .. }
        | StreamError::MissingSection { offset, .. }
        | StreamError::TrailingBytes { offset, .. }
        | StreamError::DecoderOverrun { offset } => offset,
        _ => 0,
    };
    DeviceError::BadStream {
        offset,
        reason: e.to_string(),
    }
}

/// Backs `frames` (sorted or not) of `mem` with memory without changing their contents
/// (`MADV_POPULATE_WRITE`), run by run; returns the frames backed. Best effort: a kernel without
/// it (before 5.14) or a frame outside `mem` just leaves the rest to fault in when written.
fn prefault(mem: &GuestMemoryMmap, frames: &[Gfn]) -> u64 {
    prefault_runs(mem, &frame_ranges(frames))
}

/// [`prefault`] of runs of frames.
fn prefault_runs(mem: &GuestMemoryMmap, runs: &[FrameRange]) -> u64 {
    let mut backed = 0;
    for run in runs {
        let (start, n) = (run.start.0, run.count);
        let (Some(addr), Some(len)) = (
            start.checked_mul(PAGE_SIZE as u64),
            n.checked_mul(PAGE_SIZE as u64),
        ) else {
            continue;
        };
        let Ok(len) = usize::try_from(len) else {
            continue;
        };
        // A run that crosses a region boundary (or leaves guest memory) is skipped whole.
        let Ok(slice) = mem.get_slice(GuestAddress(addr), len) else {
            continue;
        };
        // SAFETY: the range is one mapping of guest memory that `mem` owns and keeps mapped while
        // borrowed; MADV_POPULATE_WRITE only faults its pages in (contents unchanged) and touches
        // no memory outside it.
        let r = unsafe {
            libc::madvise(
                slice.ptr_guard_mut().as_ptr().cast(),
                len,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            return backed;
        }
        backed += n;
    }
    backed
}

impl<F: VmFactory> DestDevice<F> {
    /// A destination that builds its VM with `factory` and bounds the stream by `limits`.
    pub fn new(factory: F, limits: StreamLimits) -> Self {
        Self {
            factory,
            limits,
            decoder: None,
            memory: None,
            states: Vec::new(),
            vm: None,
            times: RestoreTimes::default(),
            pages: 0,
            written: Vec::new(),
            synced: None,
            refused: None,
        }
    }

    /// The sequence number of the last SYNC section applied in this session: every stream byte
    /// before it is applied too.
    pub fn synced(&self) -> Option<u64> {
        self.synced
    }

    /// Whether the stream's header has arrived and was accepted.
    pub fn header_accepted(&self) -> bool {
        self.decoder.as_ref().is_some_and(|d| d.header().is_some())
    }

    /// Whether END has arrived (the stream is complete and consistent).
    pub fn stream_complete(&self) -> bool {
        self.decoder
            .as_ref()
            .is_some_and(|d| d.finished().is_some())
    }

    /// Whether a restored VM exists.
    pub fn restored(&self) -> bool {
        self.vm.is_some()
    }

    /// Restore and remap times of the last restore.
    pub fn times(&self) -> RestoreTimes {
        self.times
    }

    /// Page records received.
    pub fn pages_received(&self) -> u64 {
        self.pages
    }

    /// Take the restored VM (after RESUMING → STOP succeeded).
    pub fn take_vm(&mut self) -> Option<F::Vm> {
        self.vm.take()
    }

    fn discard(&mut self) {
        self.refused = None;
        self.decoder = None;
        self.memory = None;
        self.states.clear();
        self.pages = 0;
        self.written = Vec::new();
        self.synced = None;
    }

    fn apply(&mut self, section: Section) -> Result<(), DeviceError> {
        match section {
            Section::Pages(batch) => {
                let mem = self
                    .memory
                    .as_ref()
                    .ok_or(DeviceError::Failed("no staging memory".into()))?;
                let zero = [0u8; PAGE_SIZE];
                for (gfn, data) in batch.iter() {
                    let slot = usize::try_from(gfn.0).ok();
                    let seen = slot.and_then(|i| self.written.get(i)).copied();
                    let page = match data {
                        // Fresh guest memory reads as zero: a zero page for a frame this stream
                        // has not written yet needs no write (and no page fault).
                        PageData::Zero if seen == Some(false) => {
                            self.pages += 1;
                            continue;
                        }
                        PageData::Zero => &zero,
                        PageData::Full(p) => p,
                    };
                    let addr = gfn
                        .addr()
                        .ok_or(DeviceError::Failed("frame overflow".into()))?;
                    // A frame the VMM mapped read-only to the device is not the device's
                    // to write (writing it would fault the process on the protected page).
                    if !gmig_dirty::memory::device_writable(mem, addr, page.len()) {
                        return Err(DeviceError::BadStream {
                            offset: 0,
                            reason: format!(
                                "frame 0x{:x} is mapped read-only to the device",
                                gfn.0
                            ),
                        });
                    }
                    mem.write_slice(page, addr)
                        .map_err(|e| DeviceError::BadStream {
                            offset: 0,
                            reason: format!("frame 0x{:x} not in guest memory: {e}", gfn.0),
                        })?;
                    if let Some(w) = slot.and_then(|i| self.written.get_mut(i)) {
                        *w = true;
                    }
                    self.pages += 1;
                }
            }
            Section::State { kind, payload } => {
                let header = self
                    .decoder
                    .as_ref()
                    .and_then(StreamDecoder::header)
                    .copied()
                    .ok_or(DeviceError::Failed("state before the header".into()))?;
                self.factory
                    .state_arrived(&header, kind, &payload)
                    .map_err(|e| DeviceError::BadStream {
                        offset: 0,
                        reason: format!("device-state section {kind:?} refused: {e}"),
                    })?;
                self.states.push((kind, payload));
                let frames = self.factory.take_prefault_frames();
                if let (Some(mem), false) = (&self.memory, frames.is_empty()) {
                    let n = prefault(mem, &frames);
                    tracing::debug!(
                        frames = frames.len(),
                        backed = n,
                        "destination: device-writable frames backed during pre-copy"
                    );
                }
            }
            Section::WritableFrames(runs) => {
                // Before the SYNC that follows is acknowledged, so while the guest still runs on
                // the source: frames pre-copy found zero were never touched here, and the device
                // may write them before the stop.
                if let Some(mem) = &self.memory {
                    let n = prefault_runs(mem, &runs);
                    tracing::debug!(
                        runs = runs.len(),
                        backed = n,
                        "destination: writable frames backed"
                    );
                }
            }
            Section::Sync(seq) => self.synced = Some(seq),
            Section::End(_) => {}
        }
        Ok(())
    }
}

impl<F: VmFactory> RunControl for DestDevice<F> {
    fn stop(&mut self) -> ArcResult {
        Ok(())
    }

    fn run(&mut self) -> ArcResult {
        if let Some(vm) = self.vm.as_mut() {
            vm.unquiesce()
                .map_err(|e| ArcFailure::rolled_back(DeviceError::Failed(e.to_string())))?;
        }
        Ok(())
    }

    fn reset(&mut self) -> gmig_vfio_migration::device::Result<()> {
        self.discard();
        self.vm = None;
        Ok(())
    }
}

impl<F: VmFactory> StateSaver for DestDevice<F> {
    fn start_stop_copy(&mut self) -> ArcResult {
        Err(ArcFailure::rolled_back(DeviceError::NotSupported(
            "saving on a destination",
        )))
    }

    fn save_read(&mut self, _buf: &mut [u8]) -> gmig_vfio_migration::device::Result<usize> {
        Err(DeviceError::NotSupported("saving on a destination"))
    }

    fn stop_copy_size(&mut self) -> gmig_vfio_migration::device::Result<u64> {
        Ok(0)
    }
}

impl<F: VmFactory> StateLoader for DestDevice<F> {
    fn start_resuming(&mut self) -> ArcResult {
        self.discard();
        self.vm = None;
        self.decoder = Some(StreamDecoder::new(
            self.limits,
            Some(self.factory.compatibility()),
        ));
        Ok(())
    }

    fn resume_write(&mut self, data: &[u8]) -> gmig_vfio_migration::device::Result<()> {
        if let Some((offset, reason)) = &self.refused {
            return Err(DeviceError::BadStream {
                offset: *offset,
                reason: reason.clone(),
            });
        }
        let r = self.feed(data);
        if let Err(e) = &r {
            let refused = match e {
                DeviceError::BadStream { offset, reason } => (*offset, reason.clone()),
                other => (0, other.to_string()),
            };
            self.refused = Some(refused);
        }
        r
    }

    fn finish_resuming(&mut self) -> ArcResult {
        if let Some((offset, reason)) = self.refused.take() {
            self.discard();
            return Err(ArcFailure::rolled_back(DeviceError::BadStream {
                offset,
                reason,
            }));
        }
        self.finish_stream()
    }
}

impl<F: VmFactory> DestDevice<F> {
    /// Feeds stream bytes to the decoder and applies every section they complete.
    fn feed(&mut self, data: &[u8]) -> gmig_vfio_migration::device::Result<()> {
        // Feed in slices no larger than one maximal section so the decoder's bound holds.
        let step = (self.limits.max_section_len as usize).max(4096);
        for piece in data.chunks(step) {
            let decoder = self
                .decoder
                .as_mut()
                .ok_or(DeviceError::Failed("not resuming".into()))?;
            decoder.feed(piece).map_err(bad_stream)?;
            loop {
                let decoder = self
                    .decoder
                    .as_mut()
                    .ok_or(DeviceError::Failed("not resuming".into()))?;
                let section = decoder.next_section().map_err(bad_stream)?;
                if self.memory.is_none() {
                    if let Some(header) = decoder.header().copied() {
                        let mem = self
                            .factory
                            .create_memory(&header)
                            .map_err(|e| DeviceError::Failed(e.to_string()))?;
                        self.memory = Some(mem);
                        // Bounded: the header's guest size passed `max_guest_pages`. Memory that is
                        // not known to be zero gets every zero page written (no `written` map).
                        self.written = if self.factory.memory_is_zeroed() {
                            vec![false; usize::try_from(header.guest_pages).unwrap_or(0)]
                        } else {
                            Vec::new()
                        };
                    }
                }
                match section {
                    Some(s) => self.apply(s)?,
                    None => break,
                }
            }
        }
        Ok(())
    }

    /// Ends a stream that every write accepted: it must be complete, and the device restores.
    fn finish_stream(&mut self) -> ArcResult {
        let fail =
            |reason: String| ArcFailure::rolled_back(DeviceError::BadStream { offset: 0, reason });
        let Some(decoder) = self.decoder.as_ref() else {
            return Err(fail("no stream received".into()));
        };
        if decoder.finished().is_none() {
            let at = decoder.bytes_fed();
            self.discard();
            return Err(ArcFailure::rolled_back(DeviceError::BadStream {
                offset: at,
                reason: "stream incomplete: END missing".into(),
            }));
        }
        let header = *decoder.header().ok_or_else(|| fail("no header".into()))?;
        let Some(memory) = self.memory.take() else {
            return Err(fail("no memory".into()));
        };
        let states = std::mem::take(&mut self.states);
        match self.factory.restore(&header, memory, &states) {
            Ok((vm, times)) => {
                self.vm = Some(vm);
                self.times = times;
                self.decoder = None;
                Ok(())
            }
            Err(e) => {
                self.discard();
                Err(fail(format!("restore refused: {e}")))
            }
        }
    }
}

impl<F: VmFactory> DirtyLogging for DestDevice<F> {}

impl<F: VmFactory> MigrationDevice for DestDevice<F> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn resident(mem: &GuestMemoryMmap, frame: u64) -> bool {
        let slice = mem
            .get_slice(GuestAddress(frame * PAGE_SIZE as u64), PAGE_SIZE)
            .unwrap();
        let mut v = 0u8;
        // SAFETY: mincore reports on one page of a mapping that `mem` keeps alive, and writes one
        // byte (for that one page) to `v`.
        let r = unsafe { libc::mincore(slice.ptr_guard_mut().as_ptr().cast(), PAGE_SIZE, &mut v) };
        assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
        v & 1 != 0
    }

    #[test]
    fn prefault_backs_the_frames_named_and_keeps_their_contents() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 * PAGE_SIZE)]).unwrap();
        mem.write_slice(&[7u8; 16], GuestAddress(3 * PAGE_SIZE as u64))
            .unwrap();
        assert!(!resident(&mem, 10));
        // Unsorted, with a run, and one frame outside guest memory (skipped).
        let n = prefault(
            &mem,
            &[Gfn(11), Gfn(10), Gfn(3), Gfn(12), Gfn(40), Gfn(1000)],
        );
        assert_eq!(n, 5);
        for f in [3, 10, 11, 12, 40] {
            assert!(resident(&mem, f), "frame {f}");
        }
        assert!(!resident(&mem, 20));
        let mut back = [0u8; 16];
        mem.read_slice(&mut back, GuestAddress(3 * PAGE_SIZE as u64))
            .unwrap();
        assert_eq!(back, [7u8; 16]);
        mem.read_slice(&mut back, GuestAddress(10 * PAGE_SIZE as u64))
            .unwrap();
        assert_eq!(back, [0u8; 16]);
    }

    /// A writable-frames hint is acted on as it arrives, before the SYNC after it is answered:
    /// the frames it names are backed, and nothing else is.
    #[test]
    fn a_writable_frames_hint_backs_its_frames_before_the_sync() {
        use crate::migration::synthetic::{SyntheticFactory, SYNTHETIC_TYPE};
        use crate::stream::{GpuGeneration, StreamHeader, StreamWriter};
        let factory = SyntheticFactory {
            aperture_base: 0,
            hidden_base: 0,
            skip_remap: false,
        };
        let mut d = DestDevice::new(factory, StreamLimits::default());
        d.start_resuming().unwrap();
        let header = StreamHeader::new(GpuGeneration::Gen9, SYNTHETIC_TYPE, 0, 0, 64);
        let mut w = StreamWriter::new(Vec::new(), &header).unwrap();
        w.write_writable_frames(&[Gfn(11), Gfn(10), Gfn(40)])
            .unwrap();
        w.write_sync(1).unwrap();
        d.resume_write(w.get_mut()).unwrap();
        assert_eq!(d.synced(), Some(1));
        let mem = d.memory.as_ref().unwrap();
        for f in [10, 11, 40] {
            assert!(resident(mem, f), "frame {f}");
        }
        for f in [9, 12, 20, 41] {
            assert!(!resident(mem, f), "frame {f}");
        }
    }

    /// A factory whose staging memory the VMM mapped read-only to the device: a page the stream
    /// brings for it is refused with the reason (not written: that would fault the process).
    /// The control, writable memory, takes the same page.
    #[test]
    fn a_page_for_memory_mapped_read_only_is_refused_with_the_reason() {
        use crate::migration::synthetic::{SyntheticFactory, SYNTHETIC_TYPE};
        use crate::stream::{GpuGeneration, PageBatch, StreamHeader, StreamWriter};
        struct Rom(SyntheticFactory, bool);
        impl VmFactory for Rom {
            type Vm = <SyntheticFactory as VmFactory>::Vm;
            fn compatibility(&self) -> crate::stream::Compatibility {
                self.0.compatibility()
            }
            fn create_memory(
                &mut self,
                h: &StreamHeader,
            ) -> Result<GuestMemoryMmap, crate::migration::vm::VmError> {
                let prot = if self.1 {
                    libc::PROT_READ | libc::PROT_WRITE
                } else {
                    libc::PROT_READ
                };
                let size = h.guest_pages as usize * PAGE_SIZE;
                let m = vm_memory::mmap::MmapRegionBuilder::new(size)
                    .with_mmap_prot(prot)
                    .build()
                    .unwrap();
                let r = vm_memory::mmap::GuestRegionMmap::new(m, GuestAddress(0)).unwrap();
                Ok(GuestMemoryMmap::from_regions(vec![r]).unwrap())
            }
            fn restore(
                &mut self,
                h: &StreamHeader,
                m: GuestMemoryMmap,
                s: &[(StateKind, Vec<u8>)],
            ) -> Result<(Self::Vm, RestoreTimes), crate::migration::vm::VmError> {
                self.0.restore(h, m, s)
            }
        }
        for writable in [false, true] {
            let factory = SyntheticFactory {
                aperture_base: 0,
                hidden_base: 0,
                skip_remap: false,
            };
            let mut d = DestDevice::new(Rom(factory, writable), StreamLimits::default());
            d.start_resuming().unwrap();
            let header = StreamHeader::new(GpuGeneration::Gen9, SYNTHETIC_TYPE, 0, 0, 64);
            let mut w = StreamWriter::new(Vec::new(), &header).unwrap();
            let mut batch = PageBatch::new();
            batch.push(Gfn(5), &[0x5a; PAGE_SIZE]);
            w.write_pages(&batch).unwrap();
            let got = d.resume_write(w.get_mut());
            if writable {
                got.unwrap();
                let mut b = [0u8; 4];
                d.memory
                    .as_ref()
                    .unwrap()
                    .read_slice(&mut b, GuestAddress(5 * PAGE_SIZE as u64))
                    .unwrap();
                assert_eq!(b, [0x5a; 4], "control: writable memory takes the page");
            } else {
                let e = got.unwrap_err().to_string();
                assert!(e.contains("frame 0x5 is mapped read-only"), "{e}");
            }
        }
    }
}
