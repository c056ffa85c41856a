//! The live-migration engine: one-shot pre-copy, hash-diff stop-and-copy, and the policies that
//! compare against it, driven through `gmig-vfio-migration`'s v2 state machine.
//!
//! ```text
//! source (MigrationHandle<SourceDevice>)           destination (MigrationHandle<DestDevice>)
//! RUNNING -> PRE_COPY   header ------------------> RUNNING -> STOP -> RESUMING
//!                       <---------------------- HeaderAccepted
//!   every migratable page once (copy, then hash the copy), workload keeps running
//!   [iterative: re-hash, resend changed pages, repeat]
//! -> STOP_COPY          (downtime starts)
//!   quiesce: stop submissions, drain <= N in-flight workloads, capture state (queue carried)
//!   hash pipeline (rayon) -> changed pages -> sender
//!   device-state sections, END -------------------> every section validated into private memory
//!                                                   RESUMING -> STOP: restore + remap
//!                       <---------------------- Restored (or Rejected: source -> RUNNING)
//!   Commit ---------------------------------------> STOP -> RUNNING
//! -> STOP               <---------------------- Resumed (downtime ends)
//! ```
//!
//! Until the source sends Commit, any failure (a cut connection, a rejection, a timeout) puts the
//! source back in RUNNING with its workload and queue intact, and the destination drops what it
//! received. After Commit the source never resumes on its own: the vGPU belongs to the
//! destination (if the Commit was lost too, the stopped source still holds the whole state).

pub mod device;
pub mod synthetic;
pub mod vm_device;

use std::io::{self, Read, Write};

use std::str::FromStr;
use std::time::{Duration, Instant};

use gmig_vfio_migration::handle::HandleError;
use gmig_vfio_migration::{
    DeviceState, MigrationHandle, MigrationTarget, ReadOutcome, TargetError,
};
use vm_memory::GuestMemoryMmap;

pub use device::{DestDevice, RestoreTimes, SourceDevice, SourceStats};
pub use vm_device::{SaveSettings, VmDevice};

use crate::stream::{
    Compatibility, Control, Gfn, StateKind, StreamHeader, StreamLimits, HEADER_LEN,
};
use crate::transport::{Connection, Counted};

/// How a vGPU is migrated. All policies leave the destination in the same state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Stop first, then send every page and the state.
    StopAndCopy,
    /// QEMU-like: send everything while running, then resend changed pages in rounds until few
    /// remain, then stop and send the rest.
    Iterative,
    /// gMig: send every page once while running; in downtime re-hash all of them and send those
    /// whose hash changed.
    OneShot,
    /// One-shot, re-hashing in downtime only the sound candidate set: pages the executed
    /// commands may have written plus CPU-dirty pages (an unknown write set widens to all).
    OneShotNarrow,
}

impl Policy {
    /// Every policy.
    pub const ALL: [Policy; 4] = [
        Policy::StopAndCopy,
        Policy::Iterative,
        Policy::OneShot,
        Policy::OneShotNarrow,
    ];

    /// The policy's name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Policy::StopAndCopy => "stop-and-copy",
            Policy::Iterative => "iterative",
            Policy::OneShot => "one-shot",
            Policy::OneShotNarrow => "one-shot-narrow",
        }
    }
}

impl FromStr for Policy {
    type Err = MigrationError;
    fn from_str(s: &str) -> Result<Self> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| MigrationError::Config(format!("unknown policy `{s}`")))
    }
}

/// Pages the guest may have written since write tracking started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidates {
    /// Exactly these pages may have changed (a superset of the truth).
    Pages(Vec<Gfn>),
    /// Some write set was not understood: any page may have changed.
    Unknown,
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
    /// Run the guest workload one step (a frame) while it is running.
    fn step(&mut self) -> std::result::Result<(), VmError>;
    /// Start recording the candidate set: pages written by executed commands and by the CPU.
    fn start_write_tracking(&mut self);
    /// Stop recording and forget the candidate set.
    fn stop_write_tracking(&mut self);
    /// The candidate set since `start_write_tracking`.
    fn write_candidates(&mut self) -> Candidates;
    /// Stop accepting submissions and let at most `max_drain` in-flight workloads finish; the
    /// rest stays queued (and is carried in the device state). Returns how many finished.
    fn quiesce(&mut self, max_drain: usize) -> std::result::Result<usize, VmError>;
    /// What the first `max_drain` queued workloads may write (a stop lets a drain run them),
    /// for the MIG_DATA_SIZE estimate; `None` when that cannot be said, which makes the estimate
    /// count every sent page as rewritten. The default is `None`.
    fn drain_writes(&self, max_drain: usize) -> Option<DrainWrites> {
        let _ = max_drain;
        None
    }
    /// Accept submissions again (after a failed migration, or on the destination).
    fn unquiesce(&mut self) -> std::result::Result<(), VmError>;
    /// The device state, one payload per [`StateKind`].
    fn save_state(&self) -> std::result::Result<Vec<(StateKind, Vec<u8>)>, VmError>;
}

/// How a destination builds a VM from a stream.
pub trait VmFactory: Send {
    /// The VM type built.
    type Vm: MigratableVm;
    /// What this destination accepts.
    fn compatibility(&self) -> Compatibility;
    /// Private, zero-filled guest memory for the incoming stream (nobody runs on it until
    /// restore; zero pages for frames not yet written are not written again).
    fn create_memory(
        &mut self,
        header: &StreamHeader,
    ) -> std::result::Result<GuestMemoryMmap, VmError>;
    /// Build the VM from the received memory and state, remapping onto this host's slices.
    fn restore(
        &mut self,
        header: &StreamHeader,
        memory: GuestMemoryMmap,
        states: &[(StateKind, Vec<u8>)],
    ) -> std::result::Result<(Self::Vm, RestoreTimes), VmError>;
}

/// The phase a migration was in when something happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MigrationPhase {
    /// Sending or checking the header.
    Handshake,
    /// Pre-copy while the VM runs.
    PreCopy,
    /// Stop-copy in downtime.
    StopCopy,
    /// Waiting for the destination to validate and restore.
    Restore,
    /// Sending or receiving the commit.
    Commit,
    /// Waiting for the destination to run the vGPU.
    Resume,
}

impl std::fmt::Display for MigrationPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            MigrationPhase::Handshake => "handshake",
            MigrationPhase::PreCopy => "pre-copy",
            MigrationPhase::StopCopy => "stop-copy",
            MigrationPhase::Restore => "restore",
            MigrationPhase::Commit => "commit",
            MigrationPhase::Resume => "resume",
        };
        f.write_str(s)
    }
}

/// Errors of the migration engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrationError {
    /// The connection failed.
    #[error("connection failed during {phase}: {source}")]
    Transport {
        /// Phase.
        phase: MigrationPhase,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The peer closed the connection.
    #[error("peer closed the connection during {phase}")]
    Closed {
        /// Phase.
        phase: MigrationPhase,
    },
    /// The destination refused the stream.
    #[error("destination rejected the migration during {phase}: {reason}")]
    Rejected {
        /// Phase.
        phase: MigrationPhase,
        /// The destination's reason.
        reason: String,
    },
    /// A control frame or stream was invalid.
    #[error("protocol error during {phase}: {source}")]
    Protocol {
        /// Phase.
        phase: MigrationPhase,
        /// What was wrong.
        #[source]
        source: crate::stream::StreamError,
    },
    /// The peer sent a valid but unexpected control message.
    #[error("unexpected {got} during {phase}")]
    Unexpected {
        /// Phase.
        phase: MigrationPhase,
        /// What arrived.
        got: String,
    },
    /// The state machine refused or a device arc failed.
    #[error("device state machine during {phase}: {source}")]
    Device {
        /// Phase.
        phase: MigrationPhase,
        /// The state machine's error.
        #[source]
        source: TargetError,
    },
    /// The VM model failed.
    #[error("VM during {phase}: {source}")]
    Vm {
        /// Phase.
        phase: MigrationPhase,
        /// The model's error.
        #[source]
        source: VmError,
    },
    /// A bad configuration.
    #[error("configuration: {0}")]
    Config(String),
}

/// Result of engine operations.
pub type Result<T> = std::result::Result<T, MigrationError>;

/// Knobs of a migration.
#[derive(Debug, Clone)]
pub struct MigrationConfig {
    /// The policy.
    pub policy: Policy,
    /// In-flight workloads allowed to finish after the stop (the rest is carried across).
    pub max_drain: usize,
    /// Pages per page batch.
    pub batch_pages: usize,
    /// Run one workload step after every this many pre-copy batches (0: never).
    pub step_every_batches: u64,
    /// Iterative: most rounds after the first pass.
    pub max_rounds: u32,
    /// Iterative: stop iterating when a round would resend this many pages or fewer.
    pub converge_pages: u64,
    /// Threads hashing in downtime.
    pub hash_threads: usize,
    /// Bounds the destination enforces on the stream.
    pub limits: StreamLimits,
    /// How long either end waits for the other before giving up.
    pub timeout: Duration,
    /// Bytes per read from the device and per write to the connection.
    pub chunk: usize,
}

impl MigrationConfig {
    /// Defaults for `policy`: drain at most 2 workloads, 256-page batches, one workload step per
    /// batch, iterative up to 8 rounds or 64 pages, all cores hashing, 30 s timeouts.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            max_drain: 2,
            batch_pages: 256,
            step_every_batches: 1,
            max_rounds: 8,
            converge_pages: 64,
            hash_threads: std::thread::available_parallelism().map_or(2, std::num::NonZero::get),
            limits: StreamLimits::default(),
            timeout: Duration::from_secs(30),
            chunk: 256 * 1024,
        }
    }
}

/// A moment of the source's progress, for progress bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Phase.
    pub phase: MigrationPhase,
    /// Bytes on the wire so far.
    pub bytes: u64,
    /// Page records sent so far.
    pub pages: u64,
    /// Pages of the first pass (an estimate of the total).
    pub pages_hint: u64,
}

/// What a migration measured, on the source (times in milliseconds).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MigrationReport {
    /// Policy used.
    pub policy: Policy,
    /// Source stop to destination resume (as the source sees the Resumed message).
    pub downtime_ms: f64,
    /// Quiescing the vGPU: stopping submissions, the bounded drain, capturing device state.
    pub quiesce_ms: f64,
    /// Busy time of the downtime hash pipeline (overlapped with `transfer_ms`).
    pub hash_ms: f64,
    /// From the end of quiesce to the last stop-copy byte written.
    pub transfer_ms: f64,
    /// Destination: applying the device state.
    pub restore_ms: f64,
    /// Destination: GGTT remapping.
    pub remap_ms: f64,
    /// Pre-copy duration (VM running).
    pub precopy_ms: f64,
    /// Whole migration, first byte to resume.
    pub total_ms: f64,
    /// Pre-copy rounds.
    pub rounds: u32,
    /// Workload steps the guest ran during pre-copy.
    pub steps_during_precopy: u64,
    /// Workloads drained after the stop.
    pub drained_workloads: u64,
    /// Page records sent while running.
    pub pages_precopy: u64,
    /// Page records sent in downtime.
    pub pages_stop_copy: u64,
    /// All page records.
    pub pages_total: u64,
    /// Zero-page markers among them.
    pub zero_pages: u64,
    /// Pages re-hashed in downtime.
    pub pages_rehashed: u64,
    /// Whether narrowing widened to every page.
    pub widened: bool,
    /// Bytes written while running.
    pub bytes_precopy: u64,
    /// Bytes written in downtime.
    pub bytes_stop_copy: u64,
    /// All bytes the source wrote.
    pub bytes_on_wire: u64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn ns_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Build the source handle for `vm` (the VM stays inside; take it back with
/// `handle.into_device().into_vm()`).
pub fn source_handle<V: MigratableVm>(
    vm: V,
    cfg: &MigrationConfig,
) -> Result<MigrationHandle<SourceDevice<V>>> {
    let dev = SourceDevice::new(
        vm,
        cfg.policy,
        cfg.max_drain,
        cfg.batch_pages,
        cfg.hash_threads,
    )
    .map_err(|e| MigrationError::Config(e.to_string()))?;
    MigrationHandle::new(dev).map_err(|e| MigrationError::Device {
        phase: MigrationPhase::Handshake,
        source: TargetError::Handle(e),
    })
}

fn dev_err(phase: MigrationPhase) -> impl Fn(TargetError) -> MigrationError {
    move |source| MigrationError::Device { phase, source }
}

fn io_err(phase: MigrationPhase) -> impl Fn(io::Error) -> MigrationError {
    move |source| MigrationError::Transport { phase, source }
}

fn read_control<C: Read>(conn: &mut C, phase: MigrationPhase) -> Result<Control> {
    Control::read_from(conn).map_err(|e| match e {
        crate::stream::StreamError::Truncated { .. } => MigrationError::Closed { phase },
        crate::stream::StreamError::Io { kind, .. } => MigrationError::Transport {
            phase,
            source: io::Error::from(kind),
        },
        other => MigrationError::Protocol {
            phase,
            source: other,
        },
    })
}

fn expect_control<C: Read>(conn: &mut C, phase: MigrationPhase, want: &Control) -> Result<Control> {
    match read_control(conn, phase)? {
        Control::Rejected(reason) => Err(MigrationError::Rejected { phase, reason }),
        got if std::mem::discriminant(&got) == std::mem::discriminant(want) => Ok(got),
        got => Err(MigrationError::Unexpected {
            phase,
            got: format!("{got:?}"),
        }),
    }
}

/// Migrate the VM inside `handle` (which must be RUNNING) over `conn`.
///
/// On success the source is left in STOP (the vGPU runs on the destination). On failure before
/// the commit the source is back in RUNNING with its workload and queue intact, and the error
/// says in which phase and why.
pub fn migrate_source<V: MigratableVm, C: Connection>(
    handle: &mut MigrationHandle<SourceDevice<V>>,
    conn: C,
    cfg: &MigrationConfig,
    progress: &mut dyn FnMut(&Progress),
) -> Result<MigrationReport> {
    let mut conn = Counted::new(conn);
    let mut committed = false;
    let mut result = run_source(handle, &mut conn, cfg, progress, &mut committed);
    if let Err(MigrationError::Transport { phase, .. } | MigrationError::Closed { phase }) = &result
    {
        let phase = *phase;
        // A destination that refuses the stream says why before it hangs up; a write that failed
        // because of that should report the reason, not just the broken pipe.
        if conn
            .set_read_timeout(Some(Duration::from_millis(200)))
            .is_ok()
        {
            if let Ok(Control::Rejected(reason)) = Control::read_from(&mut conn) {
                result = Err(MigrationError::Rejected { phase, reason });
            }
        }
    }
    if let (Err(e), false) = (&result, committed) {
        tracing::warn!(error = %e, "migration failed; returning the source to RUNNING");
        let _ = conn.shutdown();
        // Back to RUNNING: from PRE_COPY by aborting it, from STOP_COPY through STOP; a device in
        // ERROR is reset (which also resumes it).
        let back = if MigrationTarget::state(handle).ok() == Some(DeviceState::Error) {
            MigrationTarget::reset(handle)
        } else {
            MigrationTarget::set_state(handle, DeviceState::Running)
        };
        if back.is_err() {
            let _ = MigrationTarget::reset(handle);
        }
    }
    result
}

fn run_source<V: MigratableVm, C: Connection>(
    handle: &mut MigrationHandle<SourceDevice<V>>,
    conn: &mut Counted<C>,
    cfg: &MigrationConfig,
    progress: &mut dyn FnMut(&Progress),
    committed: &mut bool,
) -> Result<MigrationReport> {
    use MigrationPhase as P;
    let counters = conn.counters();
    conn.set_read_timeout(Some(cfg.timeout))
        .and_then(|()| conn.set_write_timeout(Some(cfg.timeout)))
        .map_err(io_err(P::Handshake))?;
    let t_start = Instant::now();
    let pages_hint = handle.device().vm().migratable_pages().len() as u64;
    let mut buf = vec![0u8; cfg.chunk.max(HEADER_LEN)];
    let mut steps = 0u64;
    let mut report_progress = |handle: &MigrationHandle<SourceDevice<V>>, phase| {
        let s = handle.device().stats();
        progress(&Progress {
            phase,
            bytes: counters.sent(),
            pages: s.pages_precopy + s.pages_stop_copy,
            pages_hint,
        });
    };

    let handshake = |handle: &mut MigrationHandle<SourceDevice<V>>,
                     conn: &mut Counted<C>,
                     buf: &mut [u8]|
     -> Result<()> {
        let mut got = 0;
        while got < HEADER_LEN {
            match MigrationTarget::read_data(handle, &mut buf[got..HEADER_LEN])
                .map_err(dev_err(P::Handshake))?
            {
                ReadOutcome::Data(n) => got += n,
                other => {
                    return Err(MigrationError::Unexpected {
                        phase: P::Handshake,
                        got: format!("{other:?} before the header was complete"),
                    })
                }
            }
        }
        conn.write_all(&buf[..HEADER_LEN])
            .and_then(|()| conn.flush())
            .map_err(io_err(P::Handshake))?;
        expect_control(conn, P::Handshake, &Control::HeaderAccepted)?;
        Ok(())
    };

    let precopy = cfg.policy != Policy::StopAndCopy;
    let t_stop;
    let bytes_precopy;
    if precopy {
        MigrationTarget::set_state(handle, DeviceState::PreCopy).map_err(dev_err(P::PreCopy))?;
        tracing::debug!(
            policy = cfg.policy.name(),
            pages = pages_hint,
            "pre-copy started"
        );
        handshake(handle, conn, &mut buf)?;
        let mut batches_seen = 0u64;
        loop {
            match MigrationTarget::read_data(handle, &mut buf).map_err(dev_err(P::PreCopy))? {
                ReadOutcome::Data(n) => {
                    conn.write_all(&buf[..n]).map_err(io_err(P::PreCopy))?;
                    let batches = handle.device().stats().precopy_batches;
                    while batches_seen < batches {
                        batches_seen += 1;
                        if cfg.step_every_batches > 0
                            && batches_seen.is_multiple_of(cfg.step_every_batches)
                        {
                            handle.device_mut().vm_mut().step().map_err(|source| {
                                MigrationError::Vm {
                                    phase: P::PreCopy,
                                    source,
                                }
                            })?;
                            steps += 1;
                        }
                    }
                    report_progress(handle, P::PreCopy);
                }
                ReadOutcome::NoDataNow => {
                    let rounds = handle.device().stats().rounds;
                    if cfg.policy == Policy::Iterative && rounds <= cfg.max_rounds {
                        let queued =
                            handle
                                .device_mut()
                                .next_round(cfg.converge_pages)
                                .map_err(|e| MigrationError::Device {
                                    phase: P::PreCopy,
                                    source: TargetError::Handle(HandleError::Device(e)),
                                })?;
                        if queued > 0 {
                            continue;
                        }
                    }
                    break;
                }
                ReadOutcome::End => {
                    return Err(MigrationError::Unexpected {
                        phase: P::PreCopy,
                        got: "end of stream in PRE_COPY".into(),
                    })
                }
            }
        }
        conn.flush().map_err(io_err(P::PreCopy))?;
        bytes_precopy = counters.sent();
        tracing::debug!(
            bytes = bytes_precopy,
            steps,
            "pre-copy done; stopping the vGPU"
        );
        t_stop = Instant::now();
        MigrationTarget::set_state(handle, DeviceState::StopCopy).map_err(dev_err(P::StopCopy))?;
    } else {
        t_stop = Instant::now();
        MigrationTarget::set_state(handle, DeviceState::StopCopy).map_err(dev_err(P::StopCopy))?;
        handshake(handle, conn, &mut buf)?;
        bytes_precopy = 0;
    }
    let t_quiesced = Instant::now();

    loop {
        match MigrationTarget::read_data(handle, &mut buf).map_err(dev_err(P::StopCopy))? {
            ReadOutcome::Data(n) => {
                conn.write_all(&buf[..n]).map_err(io_err(P::StopCopy))?;
                report_progress(handle, P::StopCopy);
            }
            ReadOutcome::End => break,
            ReadOutcome::NoDataNow => {
                return Err(MigrationError::Unexpected {
                    phase: P::StopCopy,
                    got: "no-data in STOP_COPY".into(),
                })
            }
        }
    }
    conn.flush().map_err(io_err(P::StopCopy))?;
    let t_sent = Instant::now();
    let bytes_total = counters.sent();
    tracing::debug!(
        bytes = bytes_total,
        "stop-copy sent; waiting for the destination"
    );

    expect_control(conn, P::Restore, &Control::Restored)?;
    Control::Commit.write_to(conn).map_err(io_err(P::Commit))?;
    *committed = true;
    tracing::debug!("committed: the vGPU belongs to the destination");
    let stats = handle.device().stats();
    // The session is over on this side; the source stays stopped.
    MigrationTarget::set_state(handle, DeviceState::Stop).map_err(dev_err(P::Commit))?;
    let (restore_ns, remap_ns) = match expect_control(
        conn,
        P::Resume,
        &Control::Resumed {
            restore_ns: 0,
            remap_ns: 0,
        },
    )? {
        Control::Resumed {
            restore_ns,
            remap_ns,
        } => (restore_ns, remap_ns),
        _ => (0, 0),
    };
    let t_resumed = Instant::now();
    report_progress(handle, P::Resume);

    Ok(MigrationReport {
        policy: cfg.policy,
        downtime_ms: ms(t_resumed - t_stop),
        quiesce_ms: ns_ms(stats.quiesce_ns),
        hash_ms: ns_ms(stats.hash_ns),
        transfer_ms: ms(t_sent.saturating_duration_since(t_quiesced)),
        restore_ms: ns_ms(restore_ns),
        remap_ms: ns_ms(remap_ns),
        precopy_ms: ms(t_stop - t_start),
        total_ms: ms(t_resumed - t_start),
        rounds: stats.rounds,
        steps_during_precopy: steps,
        drained_workloads: stats.drained,
        pages_precopy: stats.pages_precopy,
        pages_stop_copy: stats.pages_stop_copy,
        pages_total: stats.pages_precopy + stats.pages_stop_copy,
        zero_pages: stats.zero_pages,
        pages_rehashed: stats.rehashed,
        widened: stats.widened,
        bytes_precopy,
        bytes_stop_copy: bytes_total - bytes_precopy,
        bytes_on_wire: counters.sent(),
    })
}

/// What the destination measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestReport {
    /// Page records received.
    pub pages: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Restore and remap times.
    pub times: RestoreTimes,
}

/// Receive a migration on `conn` and return the restored, running VM.
///
/// Nothing is built until every section has validated; on any failure the received memory and
/// state are dropped, the source is told why (when the connection still works), and the error is
/// returned.
pub fn migrate_destination<F: VmFactory, C: Connection>(
    factory: F,
    conn: C,
    cfg: &MigrationConfig,
) -> Result<(F::Vm, DestReport)> {
    let mut conn = Counted::new(conn);
    let mut handle = MigrationHandle::new(DestDevice::new(factory, cfg.limits)).map_err(|e| {
        MigrationError::Device {
            phase: MigrationPhase::Handshake,
            source: TargetError::Handle(e),
        }
    })?;
    let result = run_destination(&mut handle, &mut conn, cfg);
    if let Err(e) = &result {
        if !matches!(
            e,
            MigrationError::Transport { .. } | MigrationError::Closed { .. }
        ) {
            let _ = Control::Rejected(e.to_string()).write_to(&mut conn);
        }
        let _ = conn.shutdown();
    }
    result
}

fn run_destination<F: VmFactory, C: Connection>(
    handle: &mut MigrationHandle<DestDevice<F>>,
    conn: &mut Counted<C>,
    cfg: &MigrationConfig,
) -> Result<(F::Vm, DestReport)> {
    use MigrationPhase as P;
    let counters = conn.counters();
    conn.set_read_timeout(Some(cfg.timeout))
        .and_then(|()| conn.set_write_timeout(Some(cfg.timeout)))
        .map_err(io_err(P::Handshake))?;
    MigrationTarget::set_state(handle, DeviceState::Resuming).map_err(dev_err(P::Handshake))?;

    let mut head = [0u8; HEADER_LEN];
    conn.read_exact(&mut head).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => MigrationError::Closed {
            phase: P::Handshake,
        },
        _ => MigrationError::Transport {
            phase: P::Handshake,
            source: e,
        },
    })?;
    MigrationTarget::write_data(handle, &head).map_err(dev_err(P::Handshake))?;
    if !handle.device().header_accepted() {
        return Err(MigrationError::Unexpected {
            phase: P::Handshake,
            got: "header not accepted".into(),
        });
    }
    Control::HeaderAccepted
        .write_to(conn)
        .map_err(io_err(P::Handshake))?;

    let mut buf = vec![0u8; cfg.chunk.max(4096)];
    while !handle.device().stream_complete() {
        let n = conn.read(&mut buf).map_err(io_err(P::StopCopy))?;
        if n == 0 {
            return Err(MigrationError::Closed { phase: P::StopCopy });
        }
        MigrationTarget::write_data(handle, &buf[..n]).map_err(dev_err(P::StopCopy))?;
    }
    MigrationTarget::set_state(handle, DeviceState::Stop).map_err(dev_err(P::Restore))?;
    Control::Restored
        .write_to(conn)
        .map_err(io_err(P::Restore))?;
    expect_control(conn, P::Commit, &Control::Commit)?;
    MigrationTarget::set_state(handle, DeviceState::Running).map_err(dev_err(P::Resume))?;
    let times = handle.device().times();
    let pages = handle.device().pages_received();
    let vm = handle
        .device_mut()
        .take_vm()
        .ok_or(MigrationError::Unexpected {
            phase: P::Resume,
            got: "no restored VM".into(),
        })?;
    // The vGPU runs here now; a lost Resumed only costs the source its downtime figure.
    let _ = Control::Resumed {
        restore_ns: times.restore_ns,
        remap_ns: times.remap_ns,
    }
    .write_to(conn);
    Ok((
        vm,
        DestReport {
            pages,
            bytes: counters.received(),
            times,
        },
    ))
}

impl From<&MigrationError> for MigrationPhase {
    fn from(e: &MigrationError) -> Self {
        match e {
            MigrationError::Transport { phase, .. }
            | MigrationError::Closed { phase }
            | MigrationError::Rejected { phase, .. }
            | MigrationError::Protocol { phase, .. }
            | MigrationError::Unexpected { phase, .. }
            | MigrationError::Device { phase, .. }
            | MigrationError::Vm { phase, .. } => *phase,
            MigrationError::Config(_) => MigrationPhase::Handshake,
        }
    }
}

/// Write helper used by tests and tools: a whole stream of `vm`'s current state, as stop-and-copy
/// would send it (the VM is quiesced and resumed around it).
pub fn record_stream<V: MigratableVm>(vm: V, cfg: &MigrationConfig) -> Result<(Vec<u8>, V)> {
    let mut handle = source_handle(vm, cfg)?;
    MigrationTarget::set_state(&mut handle, DeviceState::StopCopy)
        .map_err(dev_err(MigrationPhase::StopCopy))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while let ReadOutcome::Data(n) = MigrationTarget::read_data(&mut handle, &mut buf)
        .map_err(dev_err(MigrationPhase::StopCopy))?
    {
        out.extend_from_slice(&buf[..n]);
    }
    MigrationTarget::set_state(&mut handle, DeviceState::Running)
        .map_err(dev_err(MigrationPhase::StopCopy))?;
    Ok((out, handle.into_device().into_vm()))
}
