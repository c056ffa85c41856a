//! The value types the device, the shadowing step and the reference engine share: shadowed
//! workloads and their commands, faults, per-engine state, execution statistics and the write
//! log.

use std::collections::{BTreeMap, BTreeSet};

use gmig_cmdparser::{BatchContext, BatchLevel, GgttOffset};
pub use gmig_core::migration::Drain;
use serde::{Deserialize, Serialize};

use crate::gm::Gfn;
use crate::gtt::Space;
use crate::mmio::{desc, EngineId};

/// One command of a shadowed workload, in execution order (control flow already followed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowCommand {
    /// The buffer the command came from (nesting level, privilege).
    pub ctx: BatchContext,
    /// Address space the command's implicit memory addresses use (GGTT for ring and GGTT batches).
    pub space: Space,
    /// Where the guest placed the command (guest-view GGTT offset or PPGTT address).
    pub guest_addr: u64,
    /// The command, DW0 first, GGTT addresses already in host slices.
    pub dwords: Vec<u32>,
}

/// A submitted, audited and shadowed workload waiting for (or in) execution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// Submission sequence number on this vGPU.
    pub seq: u64,
    /// Engine it was submitted to.
    pub engine: EngineId,
    /// The context descriptor the guest wrote to ELSP.
    pub desc: u64,
    /// Host-slice GGTT offset of the context image (the LRCA rebased).
    pub lrca: GgttOffset,
    /// Ring tail the context image asked for; written back as the head on completion.
    pub ring_tail: u32,
    /// PPGTT root of the context (guest-physical), if it has one.
    pub pml4: Option<u64>,
    /// The commands.
    pub commands: Vec<ShadowCommand>,
    /// Where the engine stopped this workload part-way (preempted at a command boundary), if it
    /// did: it resumes there, on this host or after a migration on another.
    pub preempted: Option<Preemption>,
}

impl Workload {
    /// The context ID (upper dword of the descriptor).
    pub fn ctx_id(&self) -> u32 {
        (self.desc >> desc::CTX_ID_SHIFT) as u32
    }

    /// Index of the next command to run (0 when the workload has not started).
    pub fn next_command(&self) -> usize {
        self.preempted.map_or(0, |p| p.next as usize)
    }

    /// Whether `p` is where this workload can have been preempted: part-way (at least one
    /// command run, at least one left) and with the ring head and batch position the command
    /// list gives there. A checkpoint that says otherwise is refused.
    pub fn is_consistent(&self, p: &Preemption) -> bool {
        (p.next as usize) > 0
            && (p.next as usize) < self.commands.len()
            && Preemption::at(&self.commands, p.next as usize).as_ref() == Some(p)
    }
}

/// Where a workload was preempted: the command boundary the engine stopped at, as the hardware
/// saves it in the context (the ring head and, inside a batch buffer, the batch position).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemption {
    /// Commands already run: the next one is `commands[next]`.
    pub next: u32,
    /// The guest-view GGTT address in the ring the head points at: the next command when it is
    /// a ring command, else the one after the `MI_BATCH_BUFFER_START` that started its batch.
    pub ring_head: u64,
    /// The next command's buffer and guest address when it sits in a batch buffer.
    pub batch: Option<(BatchLevel, u64)>,
}

impl Preemption {
    /// The position before `commands[next]` (`None` past the end).
    pub fn at(commands: &[ShadowCommand], next: usize) -> Option<Preemption> {
        let cmd = commands.get(next)?;
        let (ring_head, batch) = if cmd.ctx.level == BatchLevel::Ring {
            (cmd.guest_addr, None)
        } else {
            // A walk enters every batch from the ring, so a ring command precedes it.
            let start = commands[..next]
                .iter()
                .rev()
                .find(|c| c.ctx.level == BatchLevel::Ring);
            (
                start.map_or(0, |c| {
                    c.guest_addr.saturating_add(4 * c.dwords.len() as u64)
                }),
                Some((cmd.ctx.level, cmd.guest_addr)),
            )
        };
        Some(Preemption {
            next: u32::try_from(next).ok()?,
            ring_head,
            batch,
        })
    }
}

/// Why a workload was refused or stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FaultKind {
    /// The command parser's audit refused it (forbidden command, out-of-slice address, register).
    Audit,
    /// The walk failed: undecodable command, bad nesting, loop/budget exhausted.
    Walk,
    /// The context image or ring could not be read.
    Context,
    /// A GPU memory access faulted during execution.
    Memory,
    /// The engine already had [`crate::vgpu::MAX_PENDING_PER_ENGINE`] submissions waiting: the
    /// guest floods ELSP faster than the GPU runs its work.
    Flood,
}

impl FaultKind {
    pub(crate) fn code(self) -> u32 {
        match self {
            FaultKind::Audit => 1,
            FaultKind::Walk => 2,
            FaultKind::Context => 3,
            FaultKind::Memory => 4,
            FaultKind::Flood => 5,
        }
    }
}

/// A GPU error reported to the guest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFault {
    /// Engine.
    pub engine: EngineId,
    /// Context ID of the refused submission.
    pub ctx_id: u32,
    /// Category.
    pub kind: FaultKind,
    /// Human-readable reason (from the parser or the engine).
    pub reason: String,
}

/// One element of the execlist an engine runs (the last submission it took).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Port {
    /// Sequence number of its queued workload; `None` for a refused context (it completes at
    /// once, in its place).
    pub seq: Option<u64>,
    /// Context ID (upper dword of the descriptor), reported in its CSB events.
    pub ctx_id: u32,
    /// The context image (guest-view LRCA).
    pub lrca: u64,
}

/// Per-engine execlist state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineState {
    /// ELSP dwords written so far (a submission is four writes).
    pub elsp: Vec<u32>,
    /// The elements of the last submission that have not switched out yet, in order (empty:
    /// the engine is idle). The CSB write pointer is its register's.
    pub running: Vec<Port>,
    /// Contexts that switched out complete (refused ones included).
    pub completed: u64,
}

/// Counters of what the engine did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecStats {
    /// Commands executed with an effect modelled by the reference engine.
    pub executed: u64,
    /// Valid commands decoded and skipped, by name.
    pub skipped: BTreeMap<String, u64>,
    /// Workloads run to completion.
    pub workloads: u64,
    /// Workloads refused before execution or stopped by a fault.
    pub refused: u64,
    /// GPU clock (commands executed since creation), used for timestamps.
    pub clock: u64,
    /// The most guest pages one workload's commands wrote (the reference engine's own record):
    /// the MIG_DATA_SIZE estimate's figure for a queued workload whose write set is unknown.
    pub max_workload_pages: u64,
}

/// What executed commands may have written: the migration engine's candidate dirty set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteLog {
    /// Guest frames the executed commands' write sets (from gmig-cmdparser) cover.
    pub candidate: BTreeSet<Gfn>,
    /// Some executed command could not be decoded: assume it wrote anything.
    pub unknown: bool,
    /// Guest frames the reference engine actually wrote (always a subset of what a sound
    /// candidate set plus `unknown` allows; kept for checking that).
    pub actual: BTreeSet<Gfn>,
    /// Commands logged.
    pub commands: u64,
    /// Workloads some of whose writes are bounded only by their context's GTT reach (the
    /// reach's frames are in `candidate`).
    pub reach_workloads: u64,
}

impl WriteLog {
    /// Merges another log into this one.
    pub fn merge(&mut self, mut other: WriteLog) {
        self.candidate.append(&mut other.candidate);
        self.actual.append(&mut other.actual);
        self.unknown |= other.unknown;
        self.commands += other.commands;
        self.reach_workloads += other.reach_workloads;
    }
}

/// What a bounded drain did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainReport {
    /// Workloads completed during the drain.
    pub executed: usize,
    /// Workloads still queued (they travel in the checkpoint), the preempted one included.
    pub queued: usize,
    /// The workload the stop left part-way, and where: `(seq, next command)`.
    pub preempted: Option<(u64, u32)>,
}
