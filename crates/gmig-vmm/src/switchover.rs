//! What the guest and its vGPU had done at the switch-over, and what the destination did after
//! it: the evidence that a migration moved a VM with work still to do, and that the destination
//! did that work.
//!
//! The source records a [`Progress`] the moment its vCPU pauses for good; the destination records
//! one the moment the restored VM is complete (before its vCPU runs). After the destination ran,
//! [`Progress::work_since`] gives the frames the guest completed and the GPU workloads the vGPU
//! executed on the destination. Frames come from the guest's own telemetry page (so they travel
//! in guest RAM and read the same in and out of process); workloads and queued work come from
//! the vGPU's execution statistics, which travel in its checkpoint — visible to the VMM only when
//! the vGPU is linked in process ([`crate::GpuLink::backend`]); over vfio-user they are read from
//! the server's side.

use serde::{Deserialize, Serialize};

use crate::machine::Machine;

/// The vGPU's execution counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProgress {
    /// Workloads run to completion since the vGPU was created (carried across migrations).
    pub workloads: u64,
    /// Workloads submitted and not yet run.
    pub queued: u64,
    /// Faults the vGPU recorded (carried across migrations).
    pub faults: u64,
}

impl GpuProgress {
    /// The counters of an in-process vGPU, `None` before it has guest RAM.
    pub fn of(backend: &gmig_qemu_bridge::vgpu_backend::VgpuBackend) -> Option<GpuProgress> {
        let vm = backend.vm()?;
        let v = vm.vgpu();
        Some(GpuProgress {
            workloads: v.stats().workloads,
            queued: v.queued() as u64,
            faults: v.faults().len() as u64,
        })
    }
}

/// Where a VM was at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Frames the guest had completed (its telemetry).
    pub frames: u64,
    /// Whether the guest program had finished (halted).
    pub halted: bool,
    /// The guest's phase (its telemetry: 1 PCI, 2 GGTT setup, 3 frames, 4 done; 0 not started).
    pub phase: u64,
    /// VM exits handled by this VMM so far (not carried by migration: a destination starts at 0).
    pub exits: u64,
    /// The vGPU's counters, when the VMM can see them (in process).
    pub gpu: Option<GpuProgress>,
}

/// What a VM did between two [`Progress`] records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Work {
    /// Frames the guest completed.
    pub frames: u64,
    /// GPU workloads the vGPU ran to completion (`None`: the VMM cannot see the vGPU's counters).
    pub workloads: Option<u64>,
    /// Faults the vGPU recorded (`None` as above).
    pub faults: Option<u64>,
    /// VM exits.
    pub exits: u64,
}

impl Progress {
    /// Where `m` is now.
    pub fn of(m: &Machine) -> Progress {
        let tel = m.telemetry().unwrap_or_default();
        Progress {
            frames: tel.frames_done,
            halted: m.halted(),
            phase: tel.phase,
            exits: m.exits,
            gpu: m.gpu_ref().link_ref().backend().and_then(GpuProgress::of),
        }
    }

    /// What happened between `earlier` and `self` (both of the same VM, across a migration:
    /// the source's record at the stop or the destination's at the restore, then the
    /// destination's now).
    pub fn work_since(&self, earlier: &Progress) -> Work {
        let gpu = self.gpu.zip(earlier.gpu);
        Work {
            frames: self.frames.saturating_sub(earlier.frames),
            workloads: gpu.map(|(now, then)| now.workloads.saturating_sub(then.workloads)),
            faults: gpu.map(|(now, then)| now.faults.saturating_sub(then.faults)),
            exits: self.exits.saturating_sub(earlier.exits),
        }
    }
}
