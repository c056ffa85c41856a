//! The GPU's timestamp counter: `RING_TIMESTAMP` (and its upper dword) and `CTX_TIMESTAMP`
//! count at GEN9's command-streamer frequency, 12 MHz (i915's `CS_TIMESTAMP_FREQUENCY` on
//! Skylake).
//!
//! The count is the host's real-time clock in 12 MHz ticks since the Unix epoch, so it needs no
//! device state: after a live migration the destination's count goes on from the source's as
//! far as the two hosts' clocks agree (as a guest's wall clock does; hosts that migrate VMs run
//! NTP), and a saved device stream stays the same bytes for the same guest. The count is not
//! part of what two runs must agree on: a register read is the only way the guest sees it; what
//! the engine writes to memory (post-sync timestamps, a context's runtime in its image) is
//! modelled from the commands run and stays deterministic.

use std::time::{SystemTime, UNIX_EPOCH};

/// Timestamp ticks per second on GEN9 (12 MHz).
pub const TIMESTAMP_HZ: u64 = 12_000_000;

/// Ticks a context's runtime (`CTX_TIMESTAMP` in its image) grows by per command the engine runs:
/// the modelled engine spends 1 µs a command.
pub const TICKS_PER_COMMAND: u32 = (TIMESTAMP_HZ / 1_000_000) as u32;

/// The count now (0 on a host whose clock is before 1970).
pub fn ticks_now() -> u64 {
    let ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let ticks = ns.saturating_mul(u128::from(TIMESTAMP_HZ)) / 1_000_000_000;
    u64::try_from(ticks).unwrap_or(u64::MAX)
}
