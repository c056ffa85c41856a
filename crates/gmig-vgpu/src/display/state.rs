//! The display's device state, migrated with the vGPU: the monitor, the display clock, each
//! pipe's counters and the AUX channel.

use serde::{Deserialize, Serialize};

use super::aux;
use super::edid::{Mode, Resolution};
use crate::regs::clock::TIMESTAMP_HZ;

/// One pipe's scan-out state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipeState {
    /// Enabled at the last tick.
    pub on: bool,
    /// Vblanks counted (`PIPE_FRMCOUNT`).
    pub frames: u32,
    /// Flips completed (`PIPE_FLIPCOUNT`).
    pub flips: u32,
    /// When the last vblank fell (display clock ticks).
    pub last_vblank: u64,
    /// A `PLANE_SURF` write waits for the next vblank.
    pub flip_pending: bool,
}

/// The display's device state (migrated with the vGPU).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisplayState {
    /// The virtual monitor on port D, by resolution; `None`: no monitor (no port is present).
    pub monitor: Option<Resolution>,
    /// The display clock at the last tick.
    pub clock: u64,
    /// Pipes A-C.
    pub pipes: [PipeState; 3],
    /// The monitor's AUX channel.
    pub aux: aux::AuxState,
}

impl DisplayState {
    /// A display with a monitor of `monitor`'s resolution (or none).
    pub fn new(monitor: Option<Resolution>) -> DisplayState {
        DisplayState {
            monitor,
            clock: 0,
            pipes: [PipeState::default(); 3],
            aux: aux::AuxState::default(),
        }
    }

    /// The mode the pipes scan out at: the monitor's preferred mode (60 Hz 1024x768 without a
    /// monitor).
    pub fn mode(&self) -> Mode {
        Mode::for_resolution(self.monitor.unwrap_or(Resolution::XGA))
    }

    /// A frame in display clock ticks.
    pub fn frame_period(&self) -> u64 {
        self.mode().frame_period(TIMESTAMP_HZ)
    }
}

impl Default for DisplayState {
    fn default() -> Self {
        DisplayState::new(None)
    }
}
