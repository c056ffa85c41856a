//! A reusable conformance check for any [`MigrationDevice`]: the acceptance checks of the
//! migration contract, packaged so that a device crate (the gmig vGPU in `gmig-core`) runs the
//! same checks on its own device with one call.
//!
//! [`check`] builds devices with a caller's factory (`make(seed)` must be deterministic: the same
//! seed gives the same device, and `run` must advance it deterministically), then:
//!
//! 1. migrates through v2 ([`crate::target::migrate`]) with `run` applied to the source between
//!    the pre-copy pass and stop-copy; the destination must equal the source (`same`);
//! 2. migrates an identical pair through the **v1 region emulation** ([`crate::v1::V1Region`]):
//!    the stream must be byte-identical to the v2 stream and the destination equal to the source;
//! 3. checks MIG_DATA_SIZE: the estimate taken just before STOP_COPY is at least the stop-copy
//!    bytes produced and at most twice them;
//! 4. reloads the v2 stream in odd-sized 7-byte writes (segmentation must not matter);
//! 5. loads a truncated stream and requires RESUMING → STOP to fail.

use crate::device::MigrationDevice;
use crate::handle::{HandleError, MigrationHandle};
use crate::state::DeviceState;
use crate::target::{self, MigrateOptions, TargetError};
use crate::v1::{V1Error, V1Region};

/// Why a device failed the conformance check.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConformanceError {
    /// Building a handle failed (bad feature flags).
    #[error("handle: {0}")]
    Handle(#[from] HandleError),
    /// The v2 migration failed.
    #[error("v2 migration: {0}")]
    V2(#[from] TargetError),
    /// The v1 emulation failed.
    #[error("v1 emulation: {0}")]
    V1(#[from] V1Error),
    /// A destination differs from its source.
    #[error("{0}: destination state differs from the source")]
    Mismatch(&'static str),
    /// v1 and v2 produced different streams.
    #[error("v1 stream ({v1} bytes) differs from the v2 stream ({v2} bytes) at byte {at}")]
    StreamsDiffer {
        /// v1 stream length.
        v1: usize,
        /// v2 stream length.
        v2: usize,
        /// First differing byte.
        at: usize,
    },
    /// The MIG_DATA_SIZE estimate is not within [actual, 2 × actual].
    #[error("MIG_DATA_SIZE estimate {estimate} vs {actual} stop-copy bytes produced")]
    DishonestEstimate {
        /// The estimate.
        estimate: u64,
        /// The bytes produced.
        actual: u64,
    },
    /// A truncated stream was accepted.
    #[error("a truncated stream ({0} bytes) was accepted by RESUMING -> STOP")]
    AcceptedTruncated(usize),
}

/// Figures from a passed check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConformanceReport {
    /// Total stream bytes.
    pub stream_bytes: u64,
    /// Bytes sent in pre-copy.
    pub precopy_bytes: u64,
    /// Bytes sent in stop-copy.
    pub stop_copy_bytes: u64,
    /// MIG_DATA_SIZE just before STOP_COPY.
    pub stop_copy_estimate: u64,
}

impl ConformanceReport {
    /// estimate / actual stop-copy bytes.
    pub fn estimate_ratio(&self) -> f64 {
        self.stop_copy_estimate as f64 / self.stop_copy_bytes.max(1) as f64
    }
}

/// Runs the checks described in the module docs. `make(0)` builds sources, `make(1)`
/// destinations; `run` advances a running source; `same` compares device states.
pub fn check<D, M, R, S>(
    make: M,
    mut run: R,
    same: S,
    window: usize,
) -> Result<ConformanceReport, ConformanceError>
where
    D: MigrationDevice,
    M: Fn(u64) -> D,
    R: FnMut(&mut D),
    S: Fn(&D, &D) -> bool,
{
    // 1. v2.
    let mut src = MigrationHandle::new(make(0))?;
    let mut dst = MigrationHandle::new(make(1))?;
    let (stream, report) = target::migrate(&mut src, &mut dst, MigrateOptions::default(), |s| {
        run(s.device_mut());
        Ok(())
    })?;
    if !same(src.device(), dst.device()) {
        return Err(ConformanceError::Mismatch("v2"));
    }
    // 2. v1.
    let mut v1src = V1Region::new(MigrationHandle::new(make(0))?, window);
    let mut v1dst = V1Region::new(MigrationHandle::new(make(1))?, window);
    let mut v1stream = Vec::new();
    v1src.save(&mut v1stream, true, |r| {
        run(r.handle().device_mut());
        Ok(())
    })?;
    v1dst.load(&mut v1stream.as_slice())?;
    if v1stream != stream {
        let at = v1stream
            .iter()
            .zip(&stream)
            .position(|(a, b)| a != b)
            .unwrap_or(v1stream.len().min(stream.len()));
        return Err(ConformanceError::StreamsDiffer {
            v1: v1stream.len(),
            v2: stream.len(),
            at,
        });
    }
    let (a, b) = (v1src.into_handle(), v1dst.into_handle());
    if !same(a.device(), b.device()) {
        return Err(ConformanceError::Mismatch("v1"));
    }
    if !same(a.device(), src.device()) {
        return Err(ConformanceError::Mismatch("v1 source vs v2 source"));
    }
    // 3. MIG_DATA_SIZE.
    let (estimate, actual) = (report.stop_copy_estimate, report.stop_copy_bytes);
    if estimate < actual || estimate > actual.saturating_mul(2) {
        return Err(ConformanceError::DishonestEstimate { estimate, actual });
    }
    // 4. Segmentation.
    let mut seg = MigrationHandle::new(make(1))?;
    let id = seg
        .set_state(DeviceState::Resuming)?
        .new_stream
        .map(|s| s.id)
        .ok_or(ConformanceError::Mismatch("RESUMING opened no stream"))?;
    for piece in stream.chunks(7) {
        seg.write(id, piece)?;
    }
    seg.set_state(DeviceState::Running)?;
    if !same(seg.device(), src.device()) {
        return Err(ConformanceError::Mismatch("7-byte segmented load"));
    }
    // 5. Truncation.
    let cut = stream.len() / 2;
    let mut bad = MigrationHandle::new(make(1))?;
    let id = bad
        .set_state(DeviceState::Resuming)?
        .new_stream
        .map(|s| s.id)
        .ok_or(ConformanceError::Mismatch("RESUMING opened no stream"))?;
    bad.write(id, stream.get(..cut).unwrap_or_default())?;
    if bad.set_state(DeviceState::Stop).is_ok() {
        return Err(ConformanceError::AcceptedTruncated(cut));
    }
    Ok(ConformanceReport {
        stream_bytes: stream.len() as u64,
        precopy_bytes: report.precopy_bytes,
        stop_copy_bytes: actual,
        stop_copy_estimate: estimate,
    })
}
