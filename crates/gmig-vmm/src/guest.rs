//! The guest GPU driver (`guest/driver.c`, built from source by `build.rs`) and what the VMM
//! and it share: the boot parameters the VMM writes before the vCPU starts, and the telemetry
//! page the guest keeps (the TSC gap it observed: downtime as the guest sees it).

use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::{Error, Result};

/// The guest program, a flat image loaded at [`crate::kvm::LOAD_ADDR`].
pub const IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/guest.bin"));

/// Guest-physical address of the boot parameters.
pub const BOOT_PARAMS: u64 = 0x7000;
/// Guest-physical address of the telemetry page (the differential comparison leaves it out:
/// it holds TSC readings, which differ from run to run).
pub const TELEMETRY: u64 = 0x6000;
const BOOT_MAGIC: u64 = 0x746f_6f62_6769_6d67;
const TELEMETRY_MAGIC: u64 = 0x6d6c_6574_6769_6d67;
/// Where the guest starts allocating GPU objects.
pub const ALLOC_BASE: u64 = 4 << 20;

/// What the guest program draws or computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GuestProfile {
    /// Desktop composition: blitter fills into windows, CPU text rows, a compositor copying
    /// every window into a back buffer, page flips.
    Desktop,
    /// Compute-like: scattered MI_STORE_DATA_IMM into a buffer, band copies into another.
    Compute,
}

impl GuestProfile {
    /// Every profile the guest program supports.
    pub const ALL: [GuestProfile; 2] = [GuestProfile::Desktop, GuestProfile::Compute];

    /// The name the CLI uses.
    pub fn name(self) -> &'static str {
        match self {
            GuestProfile::Desktop => "desktop",
            GuestProfile::Compute => "compute",
        }
    }

    /// Parses [`GuestProfile::name`].
    pub fn from_name(s: &str) -> Option<GuestProfile> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// The guest program's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestConfig {
    /// What it renders.
    pub profile: GuestProfile,
    /// Frames before it prints its checksum and halts.
    pub frames: u32,
    /// Framebuffer width in pixels.
    pub width: u32,
    /// Framebuffer height.
    pub height: u32,
    /// Pages of ordinary RAM the CPU rewrites each frame.
    pub scratch_pages: u32,
    /// Seed of its random choices.
    pub seed: u64,
}

impl Default for GuestConfig {
    fn default() -> Self {
        GuestConfig {
            profile: GuestProfile::Desktop,
            frames: 48,
            width: 256,
            height: 192,
            scratch_pages: 64,
            seed: 1,
        }
    }
}

impl GuestConfig {
    /// Writes the boot parameters into guest RAM of `ram_bytes`.
    pub fn write(&self, mem: &GuestMemoryMmap, ram_bytes: u64, tsc_khz: u32) -> Result<()> {
        let w = |off: u64, v: &[u8]| {
            mem.write_slice(v, GuestAddress(BOOT_PARAMS + off))
                .map_err(|e| Error::Ram(e.to_string()))
        };
        let profile = match self.profile {
            GuestProfile::Desktop => 0u32,
            GuestProfile::Compute => 1,
        };
        w(0, &BOOT_MAGIC.to_le_bytes())?;
        w(8, &1u32.to_le_bytes())?;
        w(12, &profile.to_le_bytes())?;
        w(16, &self.frames.to_le_bytes())?;
        w(20, &self.width.to_le_bytes())?;
        w(24, &self.height.to_le_bytes())?;
        w(28, &self.scratch_pages.to_le_bytes())?;
        w(32, &self.seed.to_le_bytes())?;
        w(40, &ram_bytes.to_le_bytes())?;
        w(48, &u64::from(tsc_khz).to_le_bytes())?;
        w(56, &ALLOC_BASE.to_le_bytes())
    }
}

/// What the guest recorded about itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Telemetry {
    /// The largest gap between two consecutive TSC readings in its wait loop, in TSC ticks.
    pub max_gap_tsc: u64,
    /// Frames completed.
    pub frames_done: u64,
    /// 1: PCI, 2: GGTT setup, 3: frames, 4: done (0: not started).
    pub phase: u64,
}

impl Telemetry {
    /// Reads the telemetry page.
    pub fn read(mem: &GuestMemoryMmap) -> Result<Telemetry> {
        let r = |off: u64| -> Result<u64> {
            mem.read_obj::<u64>(GuestAddress(TELEMETRY + off))
                .map_err(|e| Error::Ram(e.to_string()))
        };
        if r(0)? != TELEMETRY_MAGIC {
            return Ok(Telemetry::default());
        }
        Ok(Telemetry {
            max_gap_tsc: r(16)?,
            frames_done: r(24)?,
            phase: r(32)?,
        })
    }
}

/// The same guest GPU driver as an ELF with a PVH entry (`guest/pvh.c`, `guest/start-pvh.S`),
/// for cloud-hypervisor's `--kernel`: parameters come from its `--cmdline` (the Linux program's
/// option names: `--profile desktop --frames 16 …`), it keeps the BAR addresses the VMM assigned,
/// prints on COM1 and powers the VM off through cloud-hypervisor's ACPI shutdown port when done.
pub const PVH_ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/guest-pvh.elf"));
