//! Migration v2 device states, feature flags and the path planner.
//!
//! The states and flags are the Linux uAPI values from `vfio-bindings`. The planner follows the
//! kernel's rules for `VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE` (the behaviour of
//! `vfio_mig_get_next_state()` in `drivers/vfio/vfio_main.c`):
//!
//! * a request names only the final state; the kernel walks *direct arcs*, one at a time;
//! * optional states (the P2P ones, the PRE_COPY ones) exist only when the device advertises
//!   `VFIO_MIGRATION_P2P` / `VFIO_MIGRATION_PRE_COPY`; arcs that would touch an unsupported state
//!   are skipped over, which makes e.g. `RUNNING -> STOP` direct on a device without P2P;
//! * the walk is a shortest path that never passes *through* a saving state (`PRE_COPY`,
//!   `PRE_COPY_P2P`, `STOP_COPY`) nor through `RESUMING`; the one composite walk that stays
//!   inside the saving group, `PRE_COPY -> PRE_COPY_P2P -> STOP_COPY`, keeps the data stream;
//! * `STOP_COPY -> PRE_COPY` and `STOP_COPY -> PRE_COPY_P2P` are refused, `ERROR` can never be
//!   requested and is left only by a device reset.

use std::fmt;

use vfio_bindings::bindings::vfio as uapi;

/// Errors of the state module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// A raw value that is not one of the eight uAPI states.
    #[error("unknown VFIO device migration state {0}")]
    UnknownState(u32),
    /// The target (or, for a corrupted caller, the current) state needs a feature the device
    /// does not advertise.
    #[error("state {state} needs migration features {needed} but the device has {have}")]
    Unsupported {
        /// The state that is unavailable.
        state: DeviceState,
        /// The flags that state needs.
        needed: MigrationFeatures,
        /// The flags the device advertises.
        have: MigrationFeatures,
    },
    /// `ERROR` was requested; the uAPI never accepts it as a target.
    #[error("ERROR cannot be requested as a device state")]
    ErrorRequested,
    /// The device is in `ERROR`; only a reset leaves it.
    #[error("the device is in ERROR; only a reset leaves it")]
    InError,
    /// The uAPI blocks this request (the kernel answers `EINVAL`).
    #[error("transition {from} -> {to} is blocked by the migration uAPI")]
    Blocked {
        /// Current state.
        from: DeviceState,
        /// Requested state.
        to: DeviceState,
    },
    /// A device advertised flags without `VFIO_MIGRATION_STOP_COPY`, which every v2 device needs.
    #[error("migration features {0} lack the mandatory STOP_COPY flag")]
    NoStopCopy(MigrationFeatures),
}

/// Result type of the state module.
pub type Result<T> = std::result::Result<T, StateError>;

/// One of the eight VFIO migration v2 device states (`enum vfio_device_mig_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum DeviceState {
    /// `VFIO_DEVICE_STATE_ERROR` (0): a failed transition left the device unusable until reset.
    Error = uapi::vfio_device_mig_state_VFIO_DEVICE_STATE_ERROR,
    /// `VFIO_DEVICE_STATE_STOP` (1): not running, internal state frozen, no DMA.
    Stop = uapi::vfio_device_mig_state_VFIO_DEVICE_STATE_STOP,
    /// `VFIO_DEVICE_STATE_RUNNING` (2): normal operation.
    Running = uapi::vfio_device_mig_state_VFIO_DEVICE_STATE_RUNNING,
    /// `VFIO_DEVICE_STATE_STOP_COPY` (3): stopped, the final state is readable from the stream.
    StopCopy = uapi::vfio_device_mig_state_VFIO_DEVICE_STATE_STOP_COPY,
    /// `VFIO_DEVICE_STATE_RESUMING` (4): stopped, accepting a state stream.
    Resuming = uapi::vfio_device_mig_state_VFIO_DEVICE_STATE_RESUMING,
    /// `VFIO_DEVICE_STATE_RUNNING_P2P` (5): running but initiating no peer-to-peer DMA.
    RunningP2p = uapi::vfio_device_mig_state_VFIO_DEVICE_STATE_RUNNING_P2P,
    /// `VFIO_DEVICE_STATE_PRE_COPY` (6): running while the initial state is streamed.
    PreCopy = uapi::vfio_device_mig_state_VFIO_DEVICE_STATE_PRE_COPY,
    /// `VFIO_DEVICE_STATE_PRE_COPY_P2P` (7): PRE_COPY without initiating P2P DMA.
    PreCopyP2p = uapi::vfio_device_mig_state_VFIO_DEVICE_STATE_PRE_COPY_P2P,
}

impl DeviceState {
    /// All eight states in uAPI order.
    pub const ALL: [DeviceState; 8] = [
        DeviceState::Error,
        DeviceState::Stop,
        DeviceState::Running,
        DeviceState::StopCopy,
        DeviceState::Resuming,
        DeviceState::RunningP2p,
        DeviceState::PreCopy,
        DeviceState::PreCopyP2p,
    ];

    /// The raw uAPI value.
    pub const fn raw(self) -> u32 {
        self as u32
    }

    /// The uAPI name without the `VFIO_DEVICE_STATE_` prefix.
    pub const fn name(self) -> &'static str {
        match self {
            DeviceState::Error => "ERROR",
            DeviceState::Stop => "STOP",
            DeviceState::Running => "RUNNING",
            DeviceState::StopCopy => "STOP_COPY",
            DeviceState::Resuming => "RESUMING",
            DeviceState::RunningP2p => "RUNNING_P2P",
            DeviceState::PreCopy => "PRE_COPY",
            DeviceState::PreCopyP2p => "PRE_COPY_P2P",
        }
    }

    /// Whether this is a *saving* state (PRE_COPY, PRE_COPY_P2P, STOP_COPY): the saving group
    /// shares one data stream.
    pub const fn is_saving(self) -> bool {
        matches!(
            self,
            DeviceState::PreCopy | DeviceState::PreCopyP2p | DeviceState::StopCopy
        )
    }

    /// Whether a data stream is open in this state (a saving state or RESUMING).
    pub const fn has_stream(self) -> bool {
        self.is_saving() || matches!(self, DeviceState::Resuming)
    }

    /// Whether the device executes (RUNNING, RUNNING_P2P, PRE_COPY, PRE_COPY_P2P).
    pub const fn is_running(self) -> bool {
        matches!(
            self,
            DeviceState::Running
                | DeviceState::RunningP2p
                | DeviceState::PreCopy
                | DeviceState::PreCopyP2p
        )
    }

    /// The migration features a device must advertise for this state to exist
    /// (`state_flags_table` of the kernel). `ERROR` needs every flag: it can never be requested.
    pub const fn required_features(self) -> MigrationFeatures {
        match self {
            DeviceState::Stop
            | DeviceState::Running
            | DeviceState::StopCopy
            | DeviceState::Resuming => MigrationFeatures::STOP_COPY,
            DeviceState::RunningP2p => {
                MigrationFeatures(MigrationFeatures::STOP_COPY.0 | MigrationFeatures::P2P.0)
            }
            DeviceState::PreCopy => {
                MigrationFeatures(MigrationFeatures::STOP_COPY.0 | MigrationFeatures::PRE_COPY.0)
            }
            DeviceState::PreCopyP2p => MigrationFeatures(
                MigrationFeatures::STOP_COPY.0
                    | MigrationFeatures::P2P.0
                    | MigrationFeatures::PRE_COPY.0,
            ),
            DeviceState::Error => MigrationFeatures(u64::MAX),
        }
    }
}

impl TryFrom<u32> for DeviceState {
    type Error = StateError;

    fn try_from(raw: u32) -> Result<Self> {
        DeviceState::ALL
            .get(raw as usize)
            .copied()
            .ok_or(StateError::UnknownState(raw))
    }
}

impl From<DeviceState> for u32 {
    fn from(s: DeviceState) -> u32 {
        s.raw()
    }
}

impl fmt::Display for DeviceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The `flags` of `VFIO_DEVICE_FEATURE_MIGRATION`: which optional parts of the state machine a
/// device implements.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MigrationFeatures(pub u64);

impl MigrationFeatures {
    /// `VFIO_MIGRATION_STOP_COPY`: mandatory; STOP, RUNNING, STOP_COPY, RESUMING exist.
    pub const STOP_COPY: MigrationFeatures =
        MigrationFeatures(uapi::VFIO_MIGRATION_STOP_COPY as u64);
    /// `VFIO_MIGRATION_P2P`: RUNNING_P2P (and with PRE_COPY, PRE_COPY_P2P) exist.
    pub const P2P: MigrationFeatures = MigrationFeatures(uapi::VFIO_MIGRATION_P2P as u64);
    /// `VFIO_MIGRATION_PRE_COPY`: PRE_COPY (and with P2P, PRE_COPY_P2P) exist.
    pub const PRE_COPY: MigrationFeatures = MigrationFeatures(uapi::VFIO_MIGRATION_PRE_COPY as u64);
    /// Every flag this crate knows.
    pub const ALL: MigrationFeatures =
        MigrationFeatures(Self::STOP_COPY.0 | Self::P2P.0 | Self::PRE_COPY.0);

    /// The four valid combinations (STOP_COPY with any subset of P2P and PRE_COPY).
    pub const COMBINATIONS: [MigrationFeatures; 4] = [
        Self::STOP_COPY,
        MigrationFeatures(Self::STOP_COPY.0 | Self::P2P.0),
        MigrationFeatures(Self::STOP_COPY.0 | Self::PRE_COPY.0),
        Self::ALL,
    ];

    /// Union of two flag sets.
    pub const fn union(self, other: MigrationFeatures) -> MigrationFeatures {
        MigrationFeatures(self.0 | other.0)
    }

    /// Whether every flag of `other` is set in `self`.
    pub const fn contains(self, other: MigrationFeatures) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether `state` exists on a device with these features.
    pub const fn supports(self, state: DeviceState) -> bool {
        self.contains(state.required_features())
    }

    /// Checks that a device's advertised flags are a valid v2 set (STOP_COPY present).
    pub fn validate(self) -> Result<MigrationFeatures> {
        if self.contains(Self::STOP_COPY) {
            Ok(self)
        } else {
            Err(StateError::NoStopCopy(self))
        }
    }
}

impl fmt::Display for MigrationFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (flag, name) in [
            (Self::STOP_COPY, "STOP_COPY"),
            (Self::P2P, "P2P"),
            (Self::PRE_COPY, "PRE_COPY"),
        ] {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        let unknown = self.0 & !Self::ALL.0;
        if unknown != 0 {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "0x{unknown:x}")?;
            first = false;
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

impl fmt::Debug for MigrationFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MigrationFeatures({self})")
    }
}

/// The step the full-featured state machine takes from `cur` towards `target`, or `None` where the
/// uAPI refuses the request (from or to ERROR, STOP_COPY -> PRE_COPY*).
///
/// This is the routing table of a device that supports every optional state; rows are the
/// current state, the answer is the next hop. Feature-reduced devices skip hops that are absent
/// (see [`next_step`]).
const fn full_step(cur: DeviceState, target: DeviceState) -> Option<DeviceState> {
    use DeviceState::{Error, PreCopy, PreCopyP2p, Resuming, Running, RunningP2p, Stop, StopCopy};
    if matches!(cur, Error) || matches!(target, Error) {
        return None;
    }
    if cur as u32 == target as u32 {
        return Some(cur);
    }
    Some(match cur {
        // Stopped: STOP_COPY and RESUMING are one hop; everything running goes via RUNNING_P2P.
        Stop => match target {
            StopCopy | Resuming => target,
            _ => RunningP2p,
        },
        // Running: PRE_COPY is one hop; everything else goes via RUNNING_P2P.
        Running => match target {
            PreCopy => PreCopy,
            _ => RunningP2p,
        },
        // Running with P2P quiesced: the hub between running and stopped states.
        RunningP2p => match target {
            Running | PreCopy => Running,
            PreCopyP2p => PreCopyP2p,
            _ => Stop,
        },
        // Saving while running: leaving the group goes via RUNNING; STOP_COPY via PRE_COPY_P2P
        // (inside the group, so the stream is kept).
        PreCopy => match target {
            PreCopyP2p | StopCopy => PreCopyP2p,
            _ => Running,
        },
        PreCopyP2p => match target {
            PreCopy => PreCopy,
            StopCopy => StopCopy,
            _ => RunningP2p,
        },
        // Stop-copy can only fall back to STOP; re-entering pre-copy is refused.
        StopCopy => match target {
            PreCopy | PreCopyP2p => return None,
            _ => Stop,
        },
        // Resuming only ends in STOP.
        Resuming => Stop,
        Error => return None,
    })
}

/// The next direct arc the device takes from `cur` towards `target` on a device with `features`:
/// the hop of the full-featured machine, with hops into unsupported optional states skipped.
///
/// Errors exactly where the kernel answers `EINVAL`: ERROR involved, a state the device lacks, or
/// a blocked request.
pub fn next_step(
    cur: DeviceState,
    target: DeviceState,
    features: MigrationFeatures,
) -> Result<DeviceState> {
    if cur == DeviceState::Error {
        return Err(StateError::InError);
    }
    if target == DeviceState::Error {
        return Err(StateError::ErrorRequested);
    }
    for s in [cur, target] {
        if !features.supports(s) {
            return Err(StateError::Unsupported {
                state: s,
                needed: s.required_features(),
                have: features,
            });
        }
    }
    let blocked = StateError::Blocked {
        from: cur,
        to: target,
    };
    let mut hop = full_step(cur, target).ok_or(blocked)?;
    // Each skip moves strictly closer in the full machine, so this ends within 8 hops.
    let mut guard = 0;
    while !features.supports(hop) {
        hop = full_step(hop, target).ok_or(blocked)?;
        guard += 1;
        if guard > DeviceState::ALL.len() {
            return Err(blocked);
        }
    }
    Ok(hop)
}

/// The whole walk from `cur` to `target`: the states entered, in order, ending with `target`
/// (empty when `cur == target`).
pub fn plan(
    cur: DeviceState,
    target: DeviceState,
    features: MigrationFeatures,
) -> Result<Vec<DeviceState>> {
    let mut path = Vec::new();
    let mut at = cur;
    // Validate even the no-op request (ERROR -> ERROR, unsupported state) like the kernel does.
    next_step(cur, target, features)?;
    while at != target {
        let hop = next_step(at, target, features)?;
        path.push(hop);
        at = hop;
        if path.len() > DeviceState::ALL.len() {
            return Err(StateError::Blocked {
                from: cur,
                to: target,
            });
        }
    }
    Ok(path)
}

/// Whether `from -> to` is a direct arc of a device with `features` (one the device implements
/// itself, as opposed to a combination the planner composes).
pub fn is_direct_arc(from: DeviceState, to: DeviceState, features: MigrationFeatures) -> bool {
    from != to && matches!(next_step(from, to, features), Ok(hop) if hop == to)
}

/// What a direct arc does, from the device's point of view. One variant per kind of work a
/// device implements (see [`crate::device::MigrationDevice`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArcKind {
    /// RUNNING -> RUNNING_P2P or PRE_COPY -> PRE_COPY_P2P: stop initiating peer-to-peer DMA.
    QuiesceP2p,
    /// RUNNING_P2P -> RUNNING or PRE_COPY_P2P -> PRE_COPY: allow peer-to-peer DMA again.
    ResumeP2p,
    /// RUNNING_P2P -> STOP, or RUNNING -> STOP without P2P: stop executing, freeze state.
    Stop,
    /// STOP -> RUNNING_P2P, or STOP -> RUNNING without P2P: execute again.
    Run,
    /// RUNNING -> PRE_COPY or RUNNING_P2P -> PRE_COPY_P2P: open the saving stream while running.
    StartPreCopy,
    /// PRE_COPY -> RUNNING or PRE_COPY_P2P -> RUNNING_P2P: abandon saving, close the stream.
    AbortPreCopy,
    /// STOP -> STOP_COPY: open the saving stream on a stopped device.
    StartStopCopy,
    /// PRE_COPY_P2P -> STOP_COPY (or PRE_COPY -> STOP_COPY without P2P): stop the device and
    /// continue the *same* stream with the final state.
    PreCopyToStopCopy,
    /// STOP_COPY -> STOP: end saving, close the stream.
    EndStopCopy,
    /// STOP -> RESUMING: open a fresh stream to load state into.
    StartResuming,
    /// RESUMING -> STOP: validate and apply the loaded stream, close it.
    FinishResuming,
}

impl ArcKind {
    /// Classifies a direct arc; `None` when `from -> to` is not an arc of any feature set.
    pub fn of(from: DeviceState, to: DeviceState) -> Option<ArcKind> {
        use DeviceState::{PreCopy, PreCopyP2p, Resuming, Running, RunningP2p, Stop, StopCopy};
        Some(match (from, to) {
            (Running, RunningP2p) | (PreCopy, PreCopyP2p) => ArcKind::QuiesceP2p,
            (RunningP2p, Running) | (PreCopyP2p, PreCopy) => ArcKind::ResumeP2p,
            (RunningP2p | Running, Stop) => ArcKind::Stop,
            (Stop, RunningP2p | Running) => ArcKind::Run,
            (Running, PreCopy) | (RunningP2p, PreCopyP2p) => ArcKind::StartPreCopy,
            (PreCopy, Running) | (PreCopyP2p, RunningP2p) => ArcKind::AbortPreCopy,
            (Stop, StopCopy) => ArcKind::StartStopCopy,
            (PreCopyP2p | PreCopy, StopCopy) => ArcKind::PreCopyToStopCopy,
            (StopCopy, Stop) => ArcKind::EndStopCopy,
            (Stop, Resuming) => ArcKind::StartResuming,
            (Resuming, Stop) => ArcKind::FinishResuming,
            _ => return None,
        })
    }
}
