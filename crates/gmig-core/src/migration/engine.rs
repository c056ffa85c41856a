//! The two-process engine: the source and destination ends of a migration over a connection.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use gmig_vfio_migration::handle::HandleError;
use gmig_vfio_migration::{
    DeviceState, MigrationHandle, MigrationTarget, ReadOutcome, TargetError,
};

use super::config::{
    ms, ns_ms, MigrationConfig, MigrationError, MigrationPhase, MigrationReport, Policy, Progress,
    Result,
};
use super::dest::DestDevice;
use super::source::SourceDevice;
use super::vm::{MigratableVm, RestoreTimes, VmFactory};
use crate::stream::{Control, HEADER_LEN};
use crate::transport::{Connection, Counted};

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
/// Who owns the vGPU when this returns:
/// - `Ok`: the destination runs it (it said RESUMED); the source is left in STOP.
/// - an error before COMMIT was sent: the source, back in RUNNING with its workload and queue
///   intact; the destination is told (ABORTED) to drop what it received, when the link still
///   works. The error says in which phase and why.
/// - [`MigrationError::InDoubt`]: COMMIT went out (or may have) but RESUMED never came, so the
///   destination may be running the vGPU. The source stays in STOP, still holding the complete
///   state (take it with `handle.into_device().into_vm()`, save it with [`record_stream`]), and
///   must not run it unless the destination is known not to.
pub fn migrate_source<V: MigratableVm, C: Connection>(
    handle: &mut MigrationHandle<SourceDevice<V>>,
    conn: C,
    cfg: &MigrationConfig,
    progress: &mut dyn FnMut(&Progress),
) -> Result<MigrationReport> {
    let mut conn = Counted::new(conn);
    let mut committed = false;
    let mut result = run_source(handle, &mut conn, cfg, progress, &mut committed);
    if committed {
        return result.map_err(|e| {
            tracing::error!(error = %e, "switch-over broke after COMMIT: in doubt; the source keeps its stopped copy");
            let _ = conn.shutdown();
            MigrationError::InDoubt {
                phase: MigrationPhase::from(&e),
                cause: Box::new(e),
            }
        });
    }
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
    if let Err(e) = &result {
        tracing::warn!(error = %e, "migration failed; returning the source to RUNNING");
        // A destination that already restored the vGPU would otherwise keep it in doubt.
        if conn
            .set_write_timeout(Some(Duration::from_millis(200)))
            .is_ok()
        {
            let _ = Control::Aborted(e.to_string()).write_to(&mut conn);
        }
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
    let mut switchover_wait = Duration::ZERO;
    let t_stop;
    let bytes_precopy;
    let mut verifications = 0u32;
    if precopy {
        MigrationTarget::set_state(handle, DeviceState::PreCopy).map_err(dev_err(P::PreCopy))?;
        tracing::debug!(
            policy = cfg.policy.name(),
            pages = pages_hint,
            "pre-copy started"
        );
        handshake(handle, conn, &mut buf)?;
        let mut batches_seen = 0u64;
        let mut last_verified = 0u64;
        loop {
            match MigrationTarget::read_data(handle, &mut buf).map_err(dev_err(P::PreCopy))? {
                ReadOutcome::Data(n) => {
                    conn.write_all(&buf[..n]).map_err(io_err(P::PreCopy))?;
                    let batches = handle.device().stats().precopy_batches;
                    while batches_seen < batches {
                        batches_seen += 1;
                        if cfg.step_every_batches > 0
                            && batches_seen
                                .wrapping_add(cfg.step_phase)
                                .is_multiple_of(cfg.step_every_batches)
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
                    // Verify (again) while the last verification found more than a round's worth
                    // changed: the guest wrote that much during the resend before it, and what
                    // it writes during this one would be paid in downtime.
                    let again = verifications == 0 || last_verified > cfg.converge_pages;
                    if cfg.policy == Policy::OneShotNarrow
                        && cfg.verify_before_stop
                        && again
                        && verifications < cfg.verify_rounds.max(1)
                    {
                        verifications += 1;
                        let queued = handle.device_mut().verify_candidates().map_err(|e| {
                            MigrationError::Device {
                                phase: P::PreCopy,
                                source: TargetError::Handle(HandleError::Device(e)),
                            }
                        })?;
                        last_verified = queued;
                        tracing::debug!(
                            queued,
                            verifications,
                            "overlapped verification before the stop"
                        );
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
        if cfg.switchover_ack {
            let t = Instant::now();
            switchover_ack(handle, conn, &mut buf)?;
            switchover_wait = t.elapsed();
        }
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
    let t_restored = Instant::now();
    // From the first byte of COMMIT on, the destination may run the vGPU: only RESUMED tells.
    *committed = true;
    Control::Commit.write_to(conn).map_err(io_err(P::Commit))?;
    tracing::debug!("committed: the vGPU belongs to the destination once it says RESUMED");
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
        dest_finish_ms: ms(t_restored.saturating_duration_since(t_sent)),
        commit_ms: ms(t_resumed.saturating_duration_since(t_restored)),
        restore_ms: ns_ms(restore_ns),
        remap_ms: ns_ms(remap_ns),
        precopy_ms: ms(t_stop - t_start),
        switchover_wait_ms: ms(switchover_wait),
        total_ms: ms(t_resumed - t_start),
        rounds: stats.rounds,
        steps_during_precopy: steps,
        drained_workloads: stats.drained,
        pages_precopy: stats.pages_precopy,
        pages_stop_copy: stats.pages_stop_copy,
        pages_total: stats.pages_precopy + stats.pages_stop_copy,
        zero_pages: stats.zero_pages,
        pages_rehashed: stats.rehashed,
        pages_verified: stats.verified,
        pages_verify_resent: stats.verify_resent,
        verify_rounds: verifications,
        widened: stats.widened,
        bytes_precopy,
        bytes_stop_copy: bytes_total - bytes_precopy,
        bytes_on_wire: counters.sent(),
    })
}

/// The switch-over acknowledgement: a SYNC marker after the last pre-copy byte, then wait (the
/// VM still running) until the destination says it applied everything up to it.
fn switchover_ack<V: MigratableVm, C: Connection>(
    handle: &mut MigrationHandle<SourceDevice<V>>,
    conn: &mut Counted<C>,
    buf: &mut [u8],
) -> Result<()> {
    use MigrationPhase as P;
    let seq = handle
        .device_mut()
        .request_sync()
        .map_err(|e| MigrationError::Device {
            phase: P::PreCopy,
            source: TargetError::Handle(HandleError::Device(e)),
        })?;
    while let ReadOutcome::Data(n) =
        MigrationTarget::read_data(handle, buf).map_err(dev_err(P::PreCopy))?
    {
        conn.write_all(&buf[..n]).map_err(io_err(P::PreCopy))?;
    }
    conn.flush().map_err(io_err(P::PreCopy))?;
    match expect_control(conn, P::PreCopy, &Control::Synced(0))? {
        Control::Synced(got) if got == seq => Ok(()),
        got => Err(MigrationError::Unexpected {
            phase: P::PreCopy,
            got: format!("{got:?} (waiting for Synced({seq}))"),
        }),
    }
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
    /// Where the destination's time went.
    pub phases: DestPhases,
}

/// The destination's phases, in nanoseconds of its own clock. `wait_ns + apply_ns` covers the
/// stream from the header to END; `tail_ns` is the destination's own share of the downtime once
/// the last byte arrived (validation, building the VM, restore and remap, RESTORED sent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DestPhases {
    /// Blocked reading the connection (the source had sent nothing new).
    pub wait_ns: u64,
    /// Decoding stream bytes and applying pages to the private staging memory.
    pub apply_ns: u64,
    /// The part of `wait_ns` after the switch-over acknowledgement (SYNCED sent): in downtime,
    /// waiting for stop-copy data. 0 without the acknowledgement.
    pub stop_wait_ns: u64,
    /// The part of `apply_ns` after the switch-over acknowledgement: in downtime, applying
    /// stop-copy pages and decoding the device-state sections. 0 without the acknowledgement.
    pub stop_apply_ns: u64,
    /// END applied → RESTORED sent: RESUMING → STOP (every section validated, the VM built,
    /// device state restored and remapped).
    pub tail_ns: u64,
    /// RESTORED sent → COMMIT received.
    pub commit_wait_ns: u64,
    /// COMMIT received → the VM running (STOP → RUNNING).
    pub resume_ns: u64,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Receive a migration on `conn` and return the restored, running VM.
///
/// Nothing is built until every section has validated; on any failure before the restore the
/// received memory and state are dropped, the source is told why (when the connection still
/// works), and the error is returned. A failure after the restore that leaves this side in doubt
/// drops the restored copy too and returns [`MigrationError::InDoubt`]: use [`receive_migration`]
/// to keep that copy.
pub fn migrate_destination<F: VmFactory, C: Connection>(
    factory: F,
    conn: C,
    cfg: &MigrationConfig,
) -> Result<(F::Vm, DestReport)> {
    match receive_migration(factory, conn, cfg)? {
        Incoming::Running(vm, report) => Ok((vm, report)),
        Incoming::InDoubt { error, .. } => Err(error),
    }
}

/// How an incoming migration ended, when it did not fail outright.
#[derive(Debug)]
pub enum Incoming<V> {
    /// COMMIT arrived: the vGPU runs here and this side owns it.
    Running(V, DestReport),
    /// The vGPU was restored, but neither COMMIT nor ABORTED arrived: the source may have died
    /// holding nothing (then this is the only copy) or may run the vGPU again (then this copy
    /// must be dropped). The VM is restored and stopped; it must not run unless the source is
    /// known not to.
    InDoubt {
        /// The restored, stopped VM.
        vm: V,
        /// [`MigrationError::InDoubt`], with what broke the hand-over.
        error: MigrationError,
    },
}

/// Receive a migration on `conn`: like [`migrate_destination`], but a destination left in doubt
/// keeps its restored copy ([`Incoming::InDoubt`]) instead of dropping it.
///
/// Ownership: before the restore the source owns the vGPU and any failure here drops what was
/// received (`Err`). After the restore this side holds a complete copy; COMMIT makes it the
/// owner, ABORTED (the source runs it again) makes it drop the copy (`Err`), and anything else —
/// the source vanishing, the link dying, a timeout — leaves it in doubt.
pub fn receive_migration<F: VmFactory, C: Connection>(
    factory: F,
    conn: C,
    cfg: &MigrationConfig,
) -> Result<Incoming<F::Vm>> {
    let mut conn = Counted::new(conn);
    let mut handle = MigrationHandle::new(DestDevice::new(factory, cfg.limits)).map_err(|e| {
        MigrationError::Device {
            phase: MigrationPhase::Handshake,
            source: TargetError::Handle(e),
        }
    })?;
    let e = match run_destination(&mut handle, &mut conn, cfg) {
        Ok((vm, report)) => return Ok(Incoming::Running(vm, report)),
        Err(e) => e,
    };
    let aborted = matches!(e, MigrationError::Aborted { .. });
    if !aborted {
        if let Some(vm) = handle.device_mut().take_vm() {
            tracing::error!(error = %e, "hand-over broke after the restore: in doubt; keeping the stopped copy");
            let _ = conn.shutdown();
            let error = MigrationError::InDoubt {
                phase: MigrationPhase::from(&e),
                cause: Box::new(e),
            };
            return Ok(Incoming::InDoubt { vm, error });
        }
    }
    if !matches!(
        e,
        MigrationError::Transport { .. } | MigrationError::Closed { .. }
    ) && !aborted
    {
        let _ = Control::Rejected(e.to_string()).write_to(&mut conn);
    }
    let _ = conn.shutdown();
    Err(e)
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
    let mut phases = DestPhases::default();
    let mut acked = None;
    while !handle.device().stream_complete() {
        let t = Instant::now();
        let n = conn.read(&mut buf).map_err(io_err(P::StopCopy))?;
        let waited = ns(t.elapsed());
        phases.wait_ns += waited;
        if acked.is_some() {
            phases.stop_wait_ns += waited;
        }
        if n == 0 {
            return Err(MigrationError::Closed { phase: P::StopCopy });
        }
        let t = Instant::now();
        MigrationTarget::write_data(handle, &buf[..n]).map_err(dev_err(P::StopCopy))?;
        let applied = ns(t.elapsed());
        phases.apply_ns += applied;
        if acked.is_some() {
            phases.stop_apply_ns += applied;
        }
        // The switch-over acknowledgement: everything up to the source's SYNC is applied.
        let synced = handle.device().synced();
        if synced > acked {
            if let Some(seq) = synced {
                Control::Synced(seq)
                    .write_to(conn)
                    .map_err(io_err(P::PreCopy))?;
            }
            acked = synced;
        }
    }
    let t_end = Instant::now();
    MigrationTarget::set_state(handle, DeviceState::Stop).map_err(dev_err(P::Restore))?;
    Control::Restored
        .write_to(conn)
        .map_err(io_err(P::Restore))?;
    let t_restored = Instant::now();
    phases.tail_ns = ns(t_restored - t_end);
    tracing::debug!(
        wait_ms = phases.wait_ns as f64 / 1e6,
        apply_ms = phases.apply_ns as f64 / 1e6,
        tail_ms = phases.tail_ns as f64 / 1e6,
        "destination: stream applied, vGPU restored; waiting for COMMIT"
    );
    match read_control(conn, P::Commit)? {
        Control::Commit => {}
        Control::Aborted(reason) => {
            return Err(MigrationError::Aborted {
                phase: P::Commit,
                reason,
            })
        }
        got => {
            return Err(MigrationError::Unexpected {
                phase: P::Commit,
                got: format!("{got:?}"),
            })
        }
    }
    let t_commit = Instant::now();
    phases.commit_wait_ns = ns(t_commit - t_restored);
    MigrationTarget::set_state(handle, DeviceState::Running).map_err(dev_err(P::Resume))?;
    phases.resume_ns = ns(t_commit.elapsed());
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
            phases,
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
            | MigrationError::Vm { phase, .. }
            | MigrationError::Aborted { phase, .. }
            | MigrationError::InDoubt { phase, .. } => *phase,
            MigrationError::Config(_) => MigrationPhase::Handshake,
        }
    }
}

/// Restore a VM from a whole stream held in memory — a checkpoint written with [`record_stream`],
/// such as the stopped copy a side left in doubt saves — and run it: RESUMING, the bytes, STOP,
/// RUNNING. As on a migration's destination, nothing is built until every section validated.
pub fn restore_stream<F: VmFactory>(
    factory: F,
    bytes: &[u8],
    cfg: &MigrationConfig,
) -> Result<F::Vm> {
    use MigrationPhase as P;
    let mut handle = MigrationHandle::new(DestDevice::new(factory, cfg.limits)).map_err(|e| {
        MigrationError::Device {
            phase: P::Handshake,
            source: TargetError::Handle(e),
        }
    })?;
    MigrationTarget::set_state(&mut handle, DeviceState::Resuming)
        .map_err(dev_err(P::Handshake))?;
    for piece in bytes.chunks(cfg.chunk.max(4096)) {
        MigrationTarget::write_data(&mut handle, piece).map_err(dev_err(P::StopCopy))?;
    }
    if !handle.device().stream_complete() {
        return Err(MigrationError::Unexpected {
            phase: P::StopCopy,
            got: format!(
                "end of input after {} bytes, before the stream's end",
                bytes.len()
            ),
        });
    }
    MigrationTarget::set_state(&mut handle, DeviceState::Stop).map_err(dev_err(P::Restore))?;
    MigrationTarget::set_state(&mut handle, DeviceState::Running).map_err(dev_err(P::Resume))?;
    handle
        .device_mut()
        .take_vm()
        .ok_or(MigrationError::Unexpected {
            phase: P::Resume,
            got: "no restored VM".into(),
        })
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
