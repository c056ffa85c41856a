//! The v2 state machine against the uAPI rules: every (from, to) pair for every feature set,
//! and random request sequences.

use std::collections::{HashSet, VecDeque};

use gmig_vfio_migration::handle::HandleError;
use gmig_vfio_migration::state::{self, ArcKind, StateError};
use gmig_vfio_migration::testdev::{BlobDevice, Faulty};
use gmig_vfio_migration::{
    DeviceState, MigrationFeatures, MigrationHandle, ReadOutcome, StreamKind,
};
use proptest::prelude::*;

use DeviceState::{Error, PreCopy, PreCopyP2p, Resuming, Running, RunningP2p, Stop, StopCopy};

type Dev = Faulty<BlobDevice>;

/// The direct arcs of each feature set, written out from the uAPI documentation (vfio.h and the
/// comment above `vfio_mig_get_next_state`), independently of the planner's routing table.
fn oracle_arcs(f: MigrationFeatures) -> Vec<(DeviceState, DeviceState)> {
    let p2p = f.contains(MigrationFeatures::P2P);
    let pre = f.contains(MigrationFeatures::PRE_COPY);
    let mut arcs = vec![
        (Stop, StopCopy),
        (StopCopy, Stop),
        (Stop, Resuming),
        (Resuming, Stop),
    ];
    if p2p {
        arcs.extend([
            (Running, RunningP2p),
            (RunningP2p, Running),
            (RunningP2p, Stop),
            (Stop, RunningP2p),
        ]);
    } else {
        arcs.extend([(Running, Stop), (Stop, Running)]);
    }
    if pre {
        arcs.extend([(Running, PreCopy), (PreCopy, Running)]);
        if p2p {
            arcs.extend([
                (RunningP2p, PreCopyP2p),
                (PreCopyP2p, RunningP2p),
                (PreCopy, PreCopyP2p),
                (PreCopyP2p, PreCopy),
                (PreCopyP2p, StopCopy),
            ]);
        } else {
            arcs.push((PreCopy, StopCopy));
        }
    }
    arcs
}

/// Length of the shortest walk from `from` to `to` over `arcs` whose intermediate states are
/// neither saving nor RESUMING, except that a walk from one saving state to another may stay
/// inside the saving group.
fn oracle_shortest(
    arcs: &[(DeviceState, DeviceState)],
    from: DeviceState,
    to: DeviceState,
) -> Option<usize> {
    let mut seen = HashSet::new();
    let mut q = VecDeque::from([(from, 0usize)]);
    seen.insert(from);
    while let Some((at, d)) = q.pop_front() {
        if at == to {
            return Some(d);
        }
        let may_leave = at == from
            || (!at.is_saving() && at != Resuming)
            || (from.is_saving() && to.is_saving() && at.is_saving());
        if !may_leave {
            continue;
        }
        for &(a, b) in arcs {
            if a == at && seen.insert(b) {
                q.push_back((b, d + 1));
            }
        }
    }
    None
}

fn features_of(i: usize) -> MigrationFeatures {
    MigrationFeatures::COMBINATIONS[i % 4]
}

fn new_handle(f: MigrationFeatures) -> MigrationHandle<Dev> {
    MigrationHandle::new(Faulty::new(BlobDevice::new(3000, 256, 7, f))).expect("valid features")
}

/// A handle in state `s` (ERROR via an injected fatal failure).
fn reach(f: MigrationFeatures, s: DeviceState) -> MigrationHandle<Dev> {
    let mut h = new_handle(f);
    if s == Error {
        h.device_mut().fail_next(ArcKind::Stop, false);
        let e = h.set_state(Stop).unwrap_err();
        assert!(
            matches!(e, HandleError::ArcFailed { now: Error, .. }),
            "{e}"
        );
    } else {
        h.set_state(s).expect("reachable");
    }
    if s == Resuming {
        // Load a valid stream so that RESUMING -> STOP succeeds.
        let stream = saved_stream(f);
        let id = h.open_stream().unwrap().id;
        h.write(id, &stream).unwrap();
    }
    assert_eq!(h.state(), s);
    h.device_mut().arcs.clear();
    h
}

/// The STOP_COPY stream of a device like the one `new_handle` builds.
fn saved_stream(f: MigrationFeatures) -> Vec<u8> {
    let mut src = new_handle(f);
    let s = src.set_state(StopCopy).unwrap().new_stream.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while let ReadOutcome::Data(n) = src.read(s.id, &mut buf).unwrap() {
        out.extend_from_slice(&buf[..n]);
    }
    out
}

#[test]
fn exhaustive_every_pair_every_feature_set() {
    let mut checked_ok = 0;
    for f in MigrationFeatures::COMBINATIONS {
        let arcs = oracle_arcs(f);
        // The planner's direct arcs are exactly the oracle's.
        for a in DeviceState::ALL {
            for b in DeviceState::ALL {
                assert_eq!(
                    state::is_direct_arc(a, b, f),
                    arcs.contains(&(a, b)),
                    "{f}: is {a} -> {b} direct?"
                );
            }
        }
        for from in DeviceState::ALL {
            if from != Error && !f.supports(from) {
                continue;
            }
            for to in DeviceState::ALL {
                let mut h = reach(f, from);
                let before = h.open_stream();
                let result = h.set_state(to);
                // Refusals: nothing runs, nothing changes.
                let refusal = if from == Error {
                    Some(StateError::InError)
                } else if to == Error {
                    Some(StateError::ErrorRequested)
                } else if !f.supports(to) {
                    Some(StateError::Unsupported {
                        state: to,
                        needed: to.required_features(),
                        have: f,
                    })
                } else if from == StopCopy && matches!(to, PreCopy | PreCopyP2p) {
                    Some(StateError::Blocked { from, to })
                } else {
                    None
                };
                if let Some(expected) = refusal {
                    match result {
                        Err(HandleError::Refused(e)) => assert_eq!(e, expected, "{f} {from}->{to}"),
                        other => panic!("{f} {from}->{to}: expected refusal, got {other:?}"),
                    }
                    assert_eq!(h.state(), from);
                    assert_eq!(h.open_stream(), before);
                    assert!(h.device().arcs.is_empty(), "{f} {from}->{to}: arcs ran");
                    continue;
                }
                let t = result.unwrap_or_else(|e| panic!("{f} {from}->{to}: {e}"));
                checked_ok += 1;
                assert_eq!(h.state(), to);
                assert_eq!(t.from, from);
                // Path: direct arcs only, ends at `to`, shortest, never through saving/resuming.
                let mut at = from;
                for (i, &hop) in t.path.iter().enumerate() {
                    assert!(
                        arcs.contains(&(at, hop)),
                        "{f} {from}->{to}: {at}->{hop} not an arc"
                    );
                    if i + 1 < t.path.len() {
                        let in_group = from.is_saving() && to.is_saving() && hop.is_saving();
                        assert!(
                            (!hop.is_saving() && hop != Resuming) || in_group,
                            "{f} {from}->{to}: passes through {hop}"
                        );
                    }
                    at = hop;
                }
                assert_eq!(t.path.last().copied().unwrap_or(from), to);
                assert_eq!(
                    Some(t.path.len()),
                    oracle_shortest(&arcs, from, to),
                    "{f} {from}->{to}: {:?} is not shortest",
                    t.path
                );
                // The device ran exactly one arc per hop, of the matching kind.
                let mut prev = from;
                let kinds: Vec<ArcKind> = t
                    .path
                    .iter()
                    .map(|&s| {
                        let k = ArcKind::of(prev, s).expect("direct");
                        prev = s;
                        k
                    })
                    .collect();
                assert_eq!(h.device().arcs, kinds, "{f} {from}->{to}");
                assert_eq!(
                    h.device().inner.is_running(),
                    to.is_running(),
                    "{f} {from}->{to}"
                );
                // Data streams.
                let after = h.open_stream();
                if from.is_saving() && to.is_saving() {
                    assert_eq!(
                        t.new_stream, None,
                        "{f} {from}->{to}: saving group keeps its stream"
                    );
                    assert_eq!(after, before);
                } else if from == to {
                    assert_eq!(t.new_stream, None);
                    assert_eq!(after, before);
                } else if to.has_stream() {
                    let s = t.new_stream.expect("a new stream");
                    assert_eq!(Some(s), after);
                    assert_ne!(
                        Some(s.id),
                        before.map(|b| b.id),
                        "{f} {from}->{to}: not fresh"
                    );
                    let kind = if to == Resuming {
                        StreamKind::Resuming
                    } else {
                        StreamKind::Saving
                    };
                    assert_eq!(s.kind, kind);
                } else {
                    assert_eq!(t.new_stream, None);
                    assert_eq!(after, None);
                }
                // A stream that was closed is stale for good.
                if let Some(old) = before {
                    if after.map(|a| a.id) != Some(old.id) {
                        let mut b = [0u8; 8];
                        assert!(matches!(
                            h.read(old.id, &mut b),
                            Err(HandleError::StaleStream { .. })
                        ));
                        assert!(matches!(
                            h.write(old.id, &b),
                            Err(HandleError::StaleStream { .. })
                        ));
                    }
                }
            }
        }
    }
    // 4 feature sets: 4*4 + 5*5 + 5*5 + 7*7 successful (from, to) pairs, minus the blocked ones.
    assert_eq!(checked_ok, 16 + 25 + (25 - 1) + (49 - 2));
}

#[test]
fn kernel_documented_combination_paths() {
    let f = MigrationFeatures::ALL;
    let cases: &[(DeviceState, DeviceState, &[DeviceState])] = &[
        (PreCopy, StopCopy, &[PreCopyP2p, StopCopy]),
        (PreCopy, RunningP2p, &[Running, RunningP2p]),
        (PreCopy, Stop, &[Running, RunningP2p, Stop]),
        (PreCopy, Resuming, &[Running, RunningP2p, Stop, Resuming]),
        (PreCopyP2p, Running, &[RunningP2p, Running]),
        (PreCopyP2p, Resuming, &[RunningP2p, Stop, Resuming]),
        (Resuming, PreCopyP2p, &[Stop, RunningP2p, PreCopyP2p]),
        (Resuming, PreCopy, &[Stop, RunningP2p, Running, PreCopy]),
        (Resuming, StopCopy, &[Stop, StopCopy]),
        (Running, PreCopyP2p, &[RunningP2p, PreCopyP2p]),
        (Running, StopCopy, &[RunningP2p, Stop, StopCopy]),
        (RunningP2p, PreCopy, &[Running, PreCopy]),
        (Stop, PreCopy, &[RunningP2p, Running, PreCopy]),
        (StopCopy, Running, &[Stop, RunningP2p, Running]),
    ];
    for &(from, to, path) in cases {
        assert_eq!(state::plan(from, to, f).unwrap(), path, "{from}->{to}");
    }
    // Without P2P the P2P states are skipped over.
    let f = MigrationFeatures::STOP_COPY.union(MigrationFeatures::PRE_COPY);
    assert_eq!(state::plan(PreCopy, StopCopy, f).unwrap(), [StopCopy]);
    assert_eq!(state::plan(Running, StopCopy, f).unwrap(), [Stop, StopCopy]);
    assert_eq!(state::plan(PreCopy, Stop, f).unwrap(), [Running, Stop]);
}

#[test]
fn raw_values_and_features() {
    for (i, s) in DeviceState::ALL.iter().enumerate() {
        assert_eq!(s.raw() as usize, i);
        assert_eq!(DeviceState::try_from(i as u32).unwrap(), *s);
    }
    assert_eq!(DeviceState::try_from(8), Err(StateError::UnknownState(8)));
    assert_eq!(
        MigrationFeatures::P2P.validate(),
        Err(StateError::NoStopCopy(MigrationFeatures::P2P))
    );
    assert_eq!(MigrationFeatures::ALL.to_string(), "STOP_COPY|P2P|PRE_COPY");
    assert_eq!(MigrationFeatures(0x11).to_string(), "STOP_COPY|0x10");
}

#[test]
fn error_is_left_only_by_reset_and_failed_reset_stays_in_error() {
    let mut h = reach(MigrationFeatures::ALL, Error);
    for to in DeviceState::ALL {
        assert!(matches!(
            h.set_state(to),
            Err(HandleError::Refused(StateError::InError))
        ));
        assert_eq!(h.state(), Error);
    }
    h.device_mut().fail_next_reset();
    assert!(matches!(h.reset(), Err(HandleError::ResetFailed(_))));
    assert_eq!(h.state(), Error);
    h.reset().unwrap();
    assert_eq!(h.state(), Running);
    assert!(h.device().inner.is_running());
    h.set_state(StopCopy).unwrap();
}

#[test]
fn failed_arc_reports_rollback_or_error() {
    let f = MigrationFeatures::ALL;
    // Rolled back mid-path: the handle stays at the failed arc's source.
    let mut h = new_handle(f);
    h.device_mut().fail_next(ArcKind::Stop, true);
    match h.set_state(StopCopy) {
        Err(HandleError::ArcFailed {
            requested,
            from,
            to,
            now,
            ..
        }) => {
            assert_eq!(
                (requested, from, to, now),
                (StopCopy, RunningP2p, Stop, RunningP2p)
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.state(), RunningP2p);
    // A retry succeeds from there.
    assert_eq!(h.set_state(StopCopy).unwrap().path, [Stop, StopCopy]);

    // Fatal inside the saving group: ERROR, the stream is gone.
    let mut h = new_handle(f);
    let s = h.set_state(PreCopy).unwrap().new_stream.unwrap();
    h.device_mut().fail_next(ArcKind::PreCopyToStopCopy, false);
    let e = h.set_state(StopCopy).unwrap_err();
    assert!(matches!(
        e,
        HandleError::ArcFailed {
            from: PreCopyP2p,
            to: StopCopy,
            now: Error,
            ..
        }
    ));
    assert_eq!(h.open_stream(), None);
    let mut b = [0u8; 4];
    assert!(matches!(
        h.read(s.id, &mut b),
        Err(HandleError::StaleStream { .. })
    ));
}

#[test]
fn read_semantics_precopy_nodata_vs_stopcopy_end() {
    let f = MigrationFeatures::ALL;
    let mut h = new_handle(f);
    let s = h.set_state(PreCopy).unwrap().new_stream.unwrap();
    let mut buf = vec![0u8; 1000];
    let mut n = 0;
    let first = h.precopy_info(s.id).unwrap();
    assert!(first.initial_bytes > 3000);
    assert_eq!(first.dirty_bytes, 0);
    let mut last_initial = first.initial_bytes;
    loop {
        match h.read(s.id, &mut buf).unwrap() {
            ReadOutcome::Data(k) => {
                n += k;
                // initial_bytes falls by exactly what was read.
                let info = h.precopy_info(s.id).unwrap();
                assert_eq!(info.initial_bytes, last_initial - k as u64);
                last_initial = info.initial_bytes;
            }
            ReadOutcome::NoDataNow => break,
            ReadOutcome::End => panic!("End in PRE_COPY"),
        }
    }
    assert_eq!(n as u64, first.initial_bytes);
    assert!(h.precopy_info(s.id).unwrap().is_empty());
    // The device runs and dirties state: data is available again, with no End in between.
    assert!(h.device_mut().inner.tick(3));
    assert!(h.precopy_info(s.id).unwrap().dirty_bytes > 0);
    assert!(matches!(
        h.read(s.id, &mut buf).unwrap(),
        ReadOutcome::Data(_)
    ));
    h.set_state(StopCopy).unwrap();
    assert_eq!(h.open_stream().unwrap().id, s.id);
    assert!(matches!(
        h.precopy_info(s.id),
        Err(HandleError::WrongState {
            op: "PRECOPY_INFO",
            ..
        })
    ));
    loop {
        match h.read(s.id, &mut buf).unwrap() {
            ReadOutcome::Data(_) => {}
            ReadOutcome::End => break,
            ReadOutcome::NoDataNow => panic!("ENOMSG in STOP_COPY"),
        }
    }
    // End is sticky.
    assert_eq!(h.read(s.id, &mut buf).unwrap(), ReadOutcome::End);
    assert!(matches!(
        h.write(s.id, b"x"),
        Err(HandleError::WrongState { .. })
    ));
}

#[derive(Debug, Clone)]
enum Op {
    Set(usize),
    Reset,
    Read(usize),
    Tick,
    FailNext(usize, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..8).prop_map(Op::Set),
        1 => Just(Op::Reset),
        2 => (1usize..700).prop_map(Op::Read),
        1 => Just(Op::Tick),
        1 => (0usize..11, any::<bool>()).prop_map(|(k, r)| Op::FailNext(k, r)),
    ]
}

const KINDS: [ArcKind; 11] = [
    ArcKind::QuiesceP2p,
    ArcKind::ResumeP2p,
    ArcKind::Stop,
    ArcKind::Run,
    ArcKind::StartPreCopy,
    ArcKind::AbortPreCopy,
    ArcKind::StartStopCopy,
    ArcKind::PreCopyToStopCopy,
    ArcKind::EndStopCopy,
    ArcKind::StartResuming,
    ArcKind::FinishResuming,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn random_request_sequences_keep_invariants(fi in 0usize..4, ops in prop::collection::vec(op(), 1..60)) {
        let f = features_of(fi);
        let mut h = new_handle(f);
        let mut seen_streams = HashSet::new();
        for op in ops {
            let before = h.state();
            let stream_before = h.open_stream();
            match op {
                Op::Set(i) => {
                    let to = DeviceState::ALL[i];
                    match h.set_state(to) {
                        Ok(t) => {
                            prop_assert!(before != Error, "left ERROR without reset");
                            prop_assert_eq!(h.state(), to);
                            for (k, hop) in t.path.iter().enumerate() {
                                if k + 1 < t.path.len() {
                                    prop_assert!(
                                        (!hop.is_saving() && *hop != Resuming)
                                            || (before.is_saving() && to.is_saving() && hop.is_saving()),
                                        "{} -> {} passes through {}", before, to, hop
                                    );
                                }
                            }
                            if before.is_saving() && to.is_saving() {
                                prop_assert_eq!(h.open_stream(), stream_before);
                            }
                            let stays = before == to || (before.is_saving() && to.is_saving());
                            if to.has_stream() && !stays {
                                // Entering the saving group or RESUMING: always a fresh stream.
                                let s = t.new_stream.expect("fresh stream");
                                prop_assert!(seen_streams.insert(s.id), "stream id reused");
                                prop_assert_eq!(h.open_stream(), Some(s));
                            } else {
                                prop_assert_eq!(t.new_stream, None);
                            }
                            if !to.has_stream() {
                                prop_assert_eq!(h.open_stream(), None);
                            }
                        }
                        Err(HandleError::Refused(_)) => {
                            prop_assert_eq!(h.state(), before);
                            prop_assert_eq!(h.open_stream(), stream_before);
                        }
                        Err(HandleError::ArcFailed { now, from, .. }) => {
                            prop_assert!(now == from || now == Error);
                            if now == Error {
                                prop_assert_eq!(h.open_stream(), None);
                            }
                        }
                        Err(e) => prop_assert!(false, "unexpected {}", e),
                    }
                    if before == Error {
                        prop_assert_eq!(h.state(), Error, "ERROR must be sticky");
                    }
                }
                Op::Reset => {
                    h.reset().unwrap();
                    prop_assert_eq!(h.state(), Running);
                    prop_assert_eq!(h.open_stream(), None);
                }
                Op::Read(n) => {
                    if let Some(s) = h.open_stream() {
                        let mut buf = vec![0u8; n];
                        let r = h.read(s.id, &mut buf);
                        match (h.state(), r) {
                            (Resuming, Err(HandleError::WrongState { .. }))
                            | (PreCopy | PreCopyP2p, Ok(ReadOutcome::Data(_) | ReadOutcome::NoDataNow))
                            | (StopCopy, Ok(ReadOutcome::Data(_) | ReadOutcome::End)) => {}
                            (st, r) => prop_assert!(false, "read in {}: {:?}", st, r),
                        }
                    }
                }
                Op::Tick => {
                    let ran = h.device_mut().inner.tick(2);
                    prop_assert_eq!(ran, h.state().is_running() || h.state() == Error && ran);
                }
                Op::FailNext(k, rolled_back) => h.device_mut().fail_next(KINDS[k], rolled_back),
            }
            prop_assert!(h.state() == Error || f.supports(h.state()));
        }
    }
}

/// The smallest possible device: only the required methods. Optional capabilities answer
/// "not supported"; a device breaking the read contract is caught.
struct Minimal {
    overread: bool,
}

impl gmig_vfio_migration::RunControl for Minimal {
    fn stop(&mut self) -> gmig_vfio_migration::ArcResult {
        Ok(())
    }
    fn run(&mut self) -> gmig_vfio_migration::ArcResult {
        Ok(())
    }
    fn reset(&mut self) -> gmig_vfio_migration::device::Result<()> {
        Ok(())
    }
}

impl gmig_vfio_migration::StateSaver for Minimal {
    fn start_stop_copy(&mut self) -> gmig_vfio_migration::ArcResult {
        Ok(())
    }
    fn save_read(&mut self, buf: &mut [u8]) -> gmig_vfio_migration::device::Result<usize> {
        Ok(if self.overread { buf.len() + 1 } else { 0 })
    }
    fn stop_copy_size(&mut self) -> gmig_vfio_migration::device::Result<u64> {
        Ok(0)
    }
}

impl gmig_vfio_migration::StateLoader for Minimal {
    fn resume_write(&mut self, _data: &[u8]) -> gmig_vfio_migration::device::Result<()> {
        Ok(())
    }
    fn finish_resuming(&mut self) -> gmig_vfio_migration::ArcResult {
        Ok(())
    }
}

impl gmig_vfio_migration::DirtyLogging for Minimal {}
impl gmig_vfio_migration::MigrationDevice for Minimal {}

#[test]
fn minimal_device_defaults_and_contract() {
    use gmig_vfio_migration::{DeviceError, DirtyLogging, StateSaver};
    let mut h = MigrationHandle::new(Minimal { overread: false }).unwrap();
    assert_eq!(h.features(), MigrationFeatures::STOP_COPY);
    assert!(matches!(
        h.set_state(RunningP2p),
        Err(HandleError::Refused(StateError::Unsupported { .. }))
    ));
    assert_eq!(h.set_state(StopCopy).unwrap().path, [Stop, StopCopy]);
    let id = h.open_stream().unwrap().id;
    assert_eq!(h.read(id, &mut [0u8; 4]).unwrap(), ReadOutcome::End);
    let d = h.device_mut();
    assert!(matches!(
        d.precopy_info(),
        Err(DeviceError::NotSupported(_))
    ));
    assert!(matches!(d.start_precopy(), Err(f) if f.rolled_back));
    assert!(matches!(
        d.dma_logging_start(4096, &[]),
        Err(DeviceError::NotSupported(_))
    ));
    let mut h = MigrationHandle::new(Minimal { overread: true }).unwrap();
    let id = h.set_state(StopCopy).unwrap().new_stream.unwrap().id;
    assert!(matches!(
        h.read(id, &mut [0u8; 4]),
        Err(HandleError::Contract(_))
    ));
}
