//! The device-facing traits: what the engine needs from a migratable device and how a
//! destination builds one.

use vm_memory::GuestMemoryMmap;

use crate::stream::{Compatibility, Gfn, StateKind, StreamHeader};

/// Pages the guest may have written since write tracking started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidates {
    /// Exactly these pages may have changed (a superset of the truth).
    Pages(Vec<Gfn>),
    /// Some write set was not understood: any page may have changed.
    Unknown,
}

/// How much of the work a device has dispatched a stop lets finish before it preempts the rest
/// at a command boundary ([`MigratableVm::quiesce`]). What does not finish (the preempted
/// workload with its position, the queued ones) travels in the device state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Drain {
    /// Workloads that may complete (0: preempt at once and carry everything, the default).
    pub workloads: usize,
    /// Time the drain may take: when it runs out the running workload is preempted at the next
    /// command boundary (`None`: bounded by `workloads` only).
    pub time: Option<std::time::Duration>,
}

impl Drain {
    /// Nothing runs: the running workload is preempted where it stands and everything travels.
    pub const CARRY: Drain = Drain {
        workloads: 0,
        time: None,
    };

    /// At most `workloads` complete, with no time bound.
    pub fn workloads(workloads: usize) -> Drain {
        Drain {
            workloads,
            time: None,
        }
    }
}

/// What a stop's drain may write ([`MigratableVm::drain_writes`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainWrites {
    /// Guest frames the drained workloads' known write sets (and their completion records)
    /// cover.
    pub pages: Vec<Gfn>,
    /// Further pages, by count only: an estimate for workloads whose write set is not known
    /// page by page.
    pub more: u64,
    /// The frames those `more` pages must be among (what the device can reach at all, e.g. the
    /// frames its GTTs map); `None`: any guest frame.
    pub within: Option<Vec<Gfn>>,
}

/// A failure inside the VM model (the vGPU and its guest).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct VmError(pub String);

/// What the engine needs from a VM whose vGPU it migrates: guest memory, the workload, the
/// quiesce/drain, the candidate set for narrowing, and the device state.
pub trait MigratableVm: Send {
    /// The stream header describing this vGPU (generation, type, slices, guest size).
    fn stream_header(&self) -> StreamHeader;
    /// Guest memory.
    fn memory(&self) -> &GuestMemoryMmap;
    /// Guest frames the migration carries (the GTT-backed pages, and any the guest uses).
    fn migratable_pages(&self) -> Vec<Gfn>;
    /// Whether [`MigratableVm::migratable_pages`] is the same set for the VM's whole life (all of
    /// guest RAM, say). Then the engine does not list it again in downtime to find pages that
    /// became migratable after pre-copy began (there are none), which would cost O(guest size).
    /// The default, `false`, lists the set again at the stop.
    fn migratable_pages_fixed(&self) -> bool {
        false
    }
    /// Run the guest workload one step (a frame) while it is running.
    fn step(&mut self) -> std::result::Result<(), VmError>;
    /// One bounded piece of the work the guest has submitted and the device has not finished
    /// (for a GPU: a few commands of the queued workloads); returns whether any is left. A guest
    /// on a thread of its own ([`super::ClockedVm`]) runs the device this way between its steps,
    /// so that the engine (and the stop) wait for one piece, not for a whole frame's work. The
    /// default runs nothing and says nothing is left: the next [`MigratableVm::step`] runs it.
    fn run_device_piece(&mut self) -> std::result::Result<bool, VmError> {
        Ok(false)
    }
    /// Start recording the candidate set: pages written by executed commands and by the CPU.
    /// Called again, it forgets the set so far and starts a new one (the engine does so once it
    /// has verified the old set before the stop).
    fn start_write_tracking(&mut self);
    /// Stop recording and forget the candidate set.
    fn stop_write_tracking(&mut self);
    /// The candidate set since `start_write_tracking`.
    fn write_candidates(&mut self) -> Candidates;
    /// The candidate set so far and, when it is known, a new one started in the same step, so
    /// that a write lands in exactly one of the two; an [`Candidates::Unknown`] set is kept as it
    /// is (the stop must widen). The engine's overlapped verification calls it. The default,
    /// [`MigratableVm::write_candidates`] then [`MigratableVm::start_write_tracking`], is right
    /// for a VM whose guest runs only between the engine's calls; one whose guest runs on a
    /// thread of its own must do both without a write landing in between (see
    /// [`super::ClockedVm`]).
    fn restart_write_tracking(&mut self) -> Candidates {
        let c = self.write_candidates();
        if matches!(c, Candidates::Pages(_)) {
            self.start_write_tracking();
        }
        c
    }
    /// Stop accepting submissions and let what `drain` allows of the in-flight work finish,
    /// preempting the rest at a command boundary; it stays queued (and is carried in the device
    /// state). Returns how many workloads finished.
    fn quiesce(&mut self, drain: Drain) -> std::result::Result<usize, VmError>;
    /// What the first `max_drain` queued workloads may write (a stop lets a drain run them),
    /// for the MIG_DATA_SIZE estimate; `None` when that cannot be said, which makes the estimate
    /// count every sent page as rewritten. The default is `None`.
    fn drain_writes(&self, max_drain: usize) -> Option<DrainWrites> {
        let _ = max_drain;
        None
    }
    /// Every guest frame the device itself could write right now (for a GPU: the frames its
    /// GTTs map), which bounds what DMA logging must re-hash; `None` (the default) when the device
    /// may write anywhere, which makes every logged frame a candidate.
    fn device_writable_pages(&self) -> Option<Vec<Gfn>> {
        None
    }
    /// Accept submissions again (after a failed migration, or on the destination).
    fn unquiesce(&mut self) -> std::result::Result<(), VmError>;
    /// The device state, one payload per [`StateKind`].
    fn save_state(&self) -> std::result::Result<Vec<(StateKind, Vec<u8>)>, VmError>;
    /// Device-state sections that can travel while the VM still runs: pre-copy sends them first.
    /// From this call until [`MigratableVm::stop_write_tracking`] the VM records changes to
    /// them, and [`MigratableVm::save_state_delta`] carries only those changes, so that the
    /// downtime does not pay for state that is large but changes little (a GGTT). The default
    /// sends nothing early.
    fn precopy_state(&mut self) -> std::result::Result<Vec<(StateKind, Vec<u8>)>, VmError> {
        Ok(Vec::new())
    }
    /// The device state at the stop after [`MigratableVm::precopy_state`]: every section it did
    /// not carry, and for those it did, their update sections ([`StateKind::updates`]). The
    /// default is [`MigratableVm::save_state`] (which suits a VM that sends nothing early).
    fn save_state_delta(&self) -> std::result::Result<Vec<(StateKind, Vec<u8>)>, VmError> {
        self.save_state()
    }
}

/// How a destination builds a VM from a stream.
pub trait VmFactory: Send {
    /// The VM type built.
    type Vm: MigratableVm;
    /// What this destination accepts.
    fn compatibility(&self) -> Compatibility;
    /// Guest memory for the incoming stream: private and zero-filled (nobody runs on it until
    /// restore; zero pages for frames not yet written are not written again), or — when
    /// [`VmFactory::memory_is_zeroed`] says otherwise — memory the VMM handed over, into which every
    /// page is written, zero pages too.
    fn create_memory(
        &mut self,
        header: &StreamHeader,
    ) -> std::result::Result<GuestMemoryMmap, VmError>;
    /// Whether [`VmFactory::create_memory`] returns zero-filled memory (the default: yes). A
    /// factory that restores onto a VMM's own RAM, whose contents are not known, returns `false`.
    fn memory_is_zeroed(&self) -> bool {
        true
    }
    /// A device-state section arrived, in stream order, before END (a source that sends part of
    /// the state during pre-copy, [`MigratableVm::precopy_state`], sends it while the VM still
    /// runs). The factory may decode and stage it now, outside the downtime; an error refuses the
    /// stream. Every section is handed to [`VmFactory::restore`] as well. The default does
    /// nothing.
    fn state_arrived(
        &mut self,
        header: &StreamHeader,
        kind: StateKind,
        payload: &[u8],
    ) -> std::result::Result<(), VmError> {
        let _ = (header, kind, payload);
        Ok(())
    }
    /// Guest frames the device will likely have written by the stop, as far as the sections
    /// received so far tell (for a GPU: the frames its GGTT maps), taken once: the destination
    /// backs them with memory now, during pre-copy, so that stop-copy pages for frames that
    /// pre-copy found zero do not fault memory in during the downtime. The default names none.
    fn take_prefault_frames(&mut self) -> Vec<Gfn> {
        Vec::new()
    }
    /// Build the VM from the received memory and state, remapping onto this host's slices.
    fn restore(
        &mut self,
        header: &StreamHeader,
        memory: GuestMemoryMmap,
        states: &[(StateKind, Vec<u8>)],
    ) -> std::result::Result<(Self::Vm, RestoreTimes), VmError>;
}
/// Restore and remap times the destination reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreTimes {
    /// Applying the device-state sections, ns.
    pub restore_ns: u64,
    /// Rebasing GGTT addresses onto the destination slices, ns.
    pub remap_ns: u64,
}

/// Encodes one device-state section's value (postcard), for [`MigratableVm::save_state`].
///
/// # Errors
/// The value cannot be serialized (`encode: …`).
pub fn encode_state<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, VmError> {
    postcard::to_allocvec(value).map_err(|e| VmError(format!("encode: {e}")))
}

/// Finds the section of `kind` among `states` and decodes it (postcard), for
/// [`VmFactory::restore`]. `what` names the sections in errors (`"{what} section {kind:?} …"`).
///
/// # Errors
/// The section is missing or does not decode as a `T`.
pub fn decode_state<'a, T: serde::Deserialize<'a>>(
    states: &'a [(StateKind, Vec<u8>)],
    kind: StateKind,
    what: &str,
) -> Result<T, VmError> {
    let bytes = states
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, b)| b.as_slice())
        .ok_or_else(|| VmError(format!("{what} section {kind:?} missing")))?;
    postcard::from_bytes(bytes).map_err(|e| VmError(format!("{what} section {kind:?}: {e}")))
}
