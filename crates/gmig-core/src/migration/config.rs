//! What a migration is asked to do and what it reports: the policies, the knobs, the phases,
//! the errors and the report.

use std::io;
use std::str::FromStr;
use std::time::Duration;

use gmig_vfio_migration::TargetError;

use super::vm::VmError;
use crate::stream::StreamLimits;

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
    /// The source called the migration off and runs the vGPU again (destination side: what it
    /// received is dropped, with certainty that no copy is lost).
    #[error(
        "the source called the migration off during {phase} and runs the vGPU again: {reason}"
    )]
    Aborted {
        /// Phase.
        phase: MigrationPhase,
        /// The source's reason.
        reason: String,
    },
    /// The switch-over broke at a point where this side cannot tell whether the other side runs
    /// the vGPU: the source after it sent COMMIT without hearing RESUMED, the destination after
    /// it restored the vGPU without hearing COMMIT or ABORTED. This side holds a complete,
    /// stopped copy and does not run it; exactly one of the two copies may be resumed, once the
    /// other side is known not to run (docs/reliability.md).
    #[error("in doubt after {phase}: {cause}")]
    InDoubt {
        /// The phase that broke.
        phase: MigrationPhase,
        /// What broke it.
        cause: Box<MigrationError>,
    },
}

impl MigrationError {
    /// Whether this side holds a stopped copy it must neither run nor drop on its own.
    pub fn in_doubt(&self) -> bool {
        matches!(self, MigrationError::InDoubt { .. })
    }
}

/// Result of engine operations.
pub type Result<T> = std::result::Result<T, MigrationError>;

/// Knobs of a migration.
#[derive(Debug, Clone)]
pub struct MigrationConfig {
    /// The policy.
    pub policy: Policy,
    /// What of the in-flight work the stop lets finish; the rest is preempted at a command
    /// boundary and carried across. Default [`super::Drain::CARRY`]: nothing runs in the downtime.
    pub max_drain: super::Drain,
    /// Pages per page batch.
    pub batch_pages: usize,
    /// Run one workload step after every this many pre-copy batches (0: never).
    pub step_every_batches: u64,
    /// Shifts those steps: one follows batch `b` when `b + step_phase` is a multiple of
    /// `step_every_batches`. Where a step lands relative to the stop then does not depend on the
    /// guest's size alone; benchmarks vary it between repetitions.
    pub step_phase: u64,
    /// Iterative: most rounds after the first pass.
    pub max_rounds: u32,
    /// Iterative: stop iterating when a round would resend this many pages or fewer.
    pub converge_pages: u64,
    /// Threads hashing in downtime (default: [`hash_threads_leaving`]`(1)`).
    pub hash_threads: usize,
    /// Bounds the destination enforces on the stream.
    pub limits: StreamLimits,
    /// How long either end waits for the other before giving up.
    pub timeout: Duration,
    /// Bytes per read from the device and per write to the connection.
    pub chunk: usize,
    /// Switch-over acknowledgement: after pre-copy the source sends a SYNC marker and stops the
    /// vGPU only once the destination says it has applied everything before it. Without it the
    /// downtime absorbs whatever pre-copy data the destination is still applying (zero pages cost
    /// a few bytes to send but a page write to apply). On by default; off only to measure that.
    pub switchover_ack: bool,
    /// Overlapped verification (one-shot-narrow only): when pre-copy's pass is done, re-hash the
    /// candidate set gathered so far while the VM still runs, resend what changed, and start a
    /// new set, so that the downtime re-hashes only the pages written after that. On by default.
    pub verify_before_stop: bool,
    /// Most overlapped verifications before the stop (one-shot-narrow, with
    /// `verify_before_stop`). After one, while the pages it found changed are more than
    /// `converge_pages`, the guest wrote that much during the previous resend (a frame landed
    /// there), and whatever it writes during this resend would be stop-copy data: verify again,
    /// so that the stop follows a resend in which the guest wrote little. 1: a single
    /// verification. Default 8.
    pub verify_rounds: u32,
}

impl MigrationConfig {
    /// Defaults for `policy`: carry the in-flight work (no drain), 256-page batches, one workload step per
    /// batch, iterative up to 8 rounds or 64 pages, [`hash_threads_leaving`]`(1)` threads hashing,
    /// 30 s timeouts, switch-over acknowledgement on.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            max_drain: super::Drain::CARRY,
            batch_pages: 256,
            step_every_batches: 1,
            step_phase: 0,
            max_rounds: 8,
            converge_pages: 64,
            hash_threads: hash_threads_leaving(1),
            limits: StreamLimits::default(),
            timeout: Duration::from_secs(30),
            chunk: 256 * 1024,
            switchover_ack: true,
            verify_before_stop: true,
            verify_rounds: 8,
        }
    }
}

/// Hashing threads for this machine that leave `reserved` cores to other work: one per core,
/// less `reserved` on machines of four cores or more (never fewer than two), all of them on
/// smaller ones.
///
/// The engine's default leaves one core: the source's thread that reads and sends the pages the
/// downtime re-hash finds runs beside the hash, and with every core hashing it waits for a core,
/// so the stop-copy pages trail the hash instead of overlapping it (measured on 16 cores:
/// full-hash one-shot downtime 24–26% shorter with two cores left, see docs/performance-history.md). On
/// two or three cores a hashing thread less costs more than the sender gains.
pub fn hash_threads_leaving(reserved: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    if cores >= 4 {
        cores.saturating_sub(reserved).max(2)
    } else {
        cores
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
    /// Last stop-copy byte written to the destination's Restored: the destination applying what
    /// was still in flight, validating END, restoring and remapping, and one network trip. (The
    /// destination may finish part of that before the source's last write returns, so
    /// `restore_ms` + `remap_ms` can exceed it.)
    pub dest_finish_ms: f64,
    /// Restored to Resumed: the commit's round trip and the destination's switch to RUNNING.
    /// `downtime_ms` = `quiesce_ms` + `transfer_ms` + `dest_finish_ms` + `commit_ms` (+ the
    /// state change that starts the stop).
    pub commit_ms: f64,
    /// Destination: applying the device state.
    pub restore_ms: f64,
    /// Destination: GGTT remapping.
    pub remap_ms: f64,
    /// Pre-copy duration (VM running), the switch-over wait included.
    pub precopy_ms: f64,
    /// End of pre-copy to the destination's switch-over acknowledgement (SYNCED): the
    /// destination catching up with pre-copy while the VM still runs (0 without the ack).
    pub switchover_wait_ms: f64,
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
    /// Pages re-hashed before the stop by the overlapped verification, and of those the pages
    /// that had changed and were sent again while the VM ran.
    pub pages_verified: u64,
    /// See `pages_verified`.
    pub pages_verify_resent: u64,
    /// Overlapped verifications run before the stop.
    pub verify_rounds: u32,
    /// Whether narrowing widened to every page.
    pub widened: bool,
    /// Bytes written while running.
    pub bytes_precopy: u64,
    /// Bytes written in downtime.
    pub bytes_stop_copy: u64,
    /// All bytes the source wrote.
    pub bytes_on_wire: u64,
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(crate) fn ns_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashing_leaves_cores_only_on_machines_of_four_or_more() {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        assert_eq!(hash_threads_leaving(0), cores);
        for reserved in 1..=cores + 1 {
            let n = hash_threads_leaving(reserved);
            if cores >= 4 {
                assert_eq!(
                    n,
                    cores.saturating_sub(reserved).max(2),
                    "{reserved} of {cores}"
                );
            } else {
                assert_eq!(n, cores, "{reserved} of {cores}");
            }
        }
        let cfg = MigrationConfig::new(Policy::OneShot);
        assert_eq!(cfg.hash_threads, hash_threads_leaving(1));
    }
}
