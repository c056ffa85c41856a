//! A whole migration scenario in one process: boot a guest on a source host, run it, migrate it
//! over loopback TCP to a destination host that places its slices elsewhere, continue it there,
//! and compare the result with the same guest never migrated. `gmig demo` and the benchmarks use
//! it.

use std::net::{Ipv4Addr, SocketAddr};
use std::thread;
use std::time::Duration;

use serde::Serialize;

use crate::compare::compare_guest_visible;
use crate::gm::{HostConfig, PartitionManager, VgpuSlices, VgpuType};
use crate::migratable::{type_id, VgpuFactory, VgpuVm};
use crate::workload::{Profile, WorkloadConfig};
use gmig_core::migration::{
    migrate_destination, migrate_source, source_handle, ClockedVm, MigratableVm, MigrationConfig,
    MigrationError, MigrationPhase, MigrationReport, Policy, Progress, Result, VmError,
};
use gmig_core::transport::{Connection, Endpoint, Throttled};

/// How the guest's frames are timed while it is migrated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GuestClock {
    /// The guest runs on a thread of its own ([`ClockedVm`]), independent of the engine: a frame
    /// every `1 / fps` seconds, or frame after frame as fast as the vGPU runs them (`fps: None`),
    /// the GPU working through each frame between them.
    Clocked {
        /// Frames per second (`None`: as fast as the vGPU goes).
        fps: Option<f64>,
    },
    /// The engine runs one frame after every this many pre-copy batches (exactly reproducible:
    /// the frames land at the same points of the stream every run; the guest draws only while
    /// the engine sends).
    Batches(u64),
}

impl GuestClock {
    /// The default for `profile`: clocked, at [`default_fps`].
    pub fn for_profile(profile: Profile) -> Self {
        GuestClock::Clocked {
            fps: default_fps(profile),
        }
    }

    /// The clocked guest's frame interval (`None`: back to back, or batch-stepped).
    pub fn interval(&self) -> Option<Duration> {
        match self {
            GuestClock::Clocked { fps: Some(f) } if *f > 0.0 => {
                Duration::try_from_secs_f64(1.0 / f).ok()
            }
            _ => None,
        }
    }

    /// `step_every_batches` for the engine: 0 (the engine runs no frame) when clocked.
    pub fn step_every_batches(&self) -> u64 {
        match self {
            GuestClock::Clocked { .. } => 0,
            GuestClock::Batches(n) => *n,
        }
    }

    /// `60 fps`, `max fps`, `1/8 batches`.
    pub fn name(&self) -> String {
        match self {
            GuestClock::Clocked { fps: Some(f) } => format!("{f} fps"),
            GuestClock::Clocked { fps: None } => "max fps".into(),
            GuestClock::Batches(n) => format!("1 frame / {n} batches"),
        }
    }
}

/// The clocked guest's default frame rate for `profile`: idle and desktop at 60 fps (a
/// compositor follows the display's refresh); 3d, video and compute as fast as the vGPU runs
/// them (`None`): a GPU-bound game, a transcode or a compute job keeps the GPU busy, and that
/// is the heaviest dirty rate the model makes (docs/workloads.md).
pub fn default_fps(profile: Profile) -> Option<f64> {
    match profile {
        Profile::Idle | Profile::Desktop => Some(60.0),
        Profile::ThreeD | Profile::Video | Profile::Compute => None,
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Guest workload.
    pub profile: Profile,
    /// vGPU type.
    pub ty: VgpuType,
    /// Guest RAM in bytes.
    pub ram_bytes: u64,
    /// Workload sizes.
    pub workload: WorkloadConfig,
    /// Workload seed.
    pub seed: u64,
    /// Frames before the migration starts.
    pub frames_before: u64,
    /// Frames on the destination after it.
    pub frames_after: u64,
    /// Engine settings (the policy among them).
    pub cfg: MigrationConfig,
    /// Emulated link speed (unlimited when `None`).
    pub link_gbps: Option<f64>,
    /// How the guest's frames are timed during the migration (`cfg.step_every_batches` is
    /// taken from it).
    pub clock: GuestClock,
}

impl Scenario {
    /// The demo: `desktop` at 1024×768 with six windows, a 64+384 MiB vGPU, 128 MiB of guest RAM,
    /// five frames before and after, the guest on its own clock at 60 fps.
    pub fn demo(policy: Policy, seed: u64) -> Self {
        let cfg = MigrationConfig::new(policy);
        Self {
            profile: Profile::Desktop,
            ty: VgpuType::V5_8,
            ram_bytes: 128 << 20,
            workload: WorkloadConfig::default(),
            seed,
            frames_before: 5,
            frames_after: 5,
            cfg,
            link_gbps: None,
            clock: GuestClock::for_profile(Profile::Desktop),
        }
    }
}

/// What a scenario measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioReport {
    /// The engine's report.
    #[serde(flatten)]
    pub report: MigrationReport,
    /// The destination's guest-visible state equals the unmigrated reference run's.
    pub identical: bool,
    /// Workload profile.
    pub profile: &'static str,
    /// vGPU type as aperture+hidden MiB.
    pub vgpu_type: String,
    /// Frames the guest ran in all.
    pub frames: u64,
    /// How the guest's frames were timed.
    pub clock: GuestClock,
    /// Frames the source's guest had run when the vGPU stopped.
    pub frames_at_stop: u64,
    /// Emulated link speed, if any.
    pub link_gbps: Option<f64>,
    /// Source slices (aperture, hidden GGTT offsets).
    pub source_slices: [u64; 2],
    /// Destination slices.
    pub dest_slices: [u64; 2],
    /// Frames the guest-driver model completed on the destination after the switch-over.
    pub destination_frames: u64,
    /// GPU workloads the destination's vGPU ran after the switch-over (carried ones included).
    pub destination_workloads: u64,
}

fn vm_err(phase: MigrationPhase) -> impl Fn(VmError) -> MigrationError {
    move |source| MigrationError::Vm { phase, source }
}

fn hosts(ty: VgpuType) -> Result<(VgpuSlices, VgpuSlices)> {
    let cfg_err = |e: crate::gm::GmError| MigrationError::Config(format!("placement: {e}"));
    let mut src = PartitionManager::new(HostConfig::default()).map_err(cfg_err)?;
    let (_, s) = src.place(ty).map_err(cfg_err)?;
    // The destination already runs another vGPU, so the migrant lands elsewhere.
    let mut dst = PartitionManager::new(HostConfig::default()).map_err(cfg_err)?;
    dst.place(VgpuType::V5_4).map_err(cfg_err)?;
    let (_, d) = dst.place_avoiding(ty, Some(&s)).map_err(cfg_err)?;
    Ok((s, d))
}

/// Run `s`: source and destination in this process over loopback TCP.
pub fn run_loopback(s: &Scenario, progress: &mut dyn FnMut(&Progress)) -> Result<ScenarioReport> {
    use MigrationPhase as P;
    let (src_slices, dst_slices) = hosts(s.ty)?;
    let boot = || VgpuVm::boot(s.ty, src_slices, s.ram_bytes, s.profile, s.workload, s.seed);
    let mut vm = boot().map_err(vm_err(P::Handshake))?;
    vm.run_steps(s.frames_before)
        .map_err(vm_err(P::Handshake))?;

    let listener = Endpoint::Tcp(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .listen()
        .map_err(|e| MigrationError::Config(e.to_string()))?;
    let endpoint = listener
        .endpoint()
        .map_err(|e| MigrationError::Config(e.to_string()))?;
    let factory = VgpuFactory::new(vm.vgpu().config().gen, s.ty, dst_slices, s.ram_bytes);
    let dcfg = s.cfg.clone();
    let dest = thread::spawn(move || {
        let conn = listener
            .accept()
            .map_err(|e| MigrationError::Config(e.to_string()))?;
        migrate_destination(factory, conn, &dcfg)
    });
    let conn = endpoint
        .connect()
        .map_err(|e| MigrationError::Config(e.to_string()))?;
    let conn: Box<dyn Connection> = match s.link_gbps {
        Some(g) => {
            Box::new(Throttled::new(conn, g).map_err(|e| MigrationError::Config(e.to_string()))?)
        }
        None => conn,
    };
    let mut cfg = s.cfg.clone();
    cfg.step_every_batches = s.clock.step_every_batches();
    let (result, mut src) = match s.clock {
        GuestClock::Batches(_) => migrate_vm(vm, conn, &cfg, progress)?,
        GuestClock::Clocked { .. } => {
            let clocked = ClockedVm::start(vm, s.clock.interval()).map_err(vm_err(P::PreCopy))?;
            let (mut result, clocked) = migrate_vm(clocked, conn, &cfg, progress)?;
            let frames = clocked.frames();
            if let Ok(r) = result.as_mut() {
                r.steps_during_precopy = frames;
            }
            (result, clocked.stop().map_err(vm_err(P::PreCopy))?)
        }
    };
    let dest = dest
        .join()
        .map_err(|_| MigrationError::Config("destination thread panicked".into()))?;
    let report = result?;
    let (mut moved, _) = dest?;
    let frames_at_stop = src.frames();
    let driver = src
        .take_driver()
        .ok_or_else(|| MigrationError::Config("source lost its guest driver".into()))?;
    moved.attach_driver(driver);
    let (restored_frames, restored_workloads) = (moved.frames(), moved.vgpu().stats().workloads);
    moved.run_steps(s.frames_after).map_err(vm_err(P::Resume))?;
    moved.finish().map_err(vm_err(P::Resume))?;
    let destination_frames = moved.frames().saturating_sub(restored_frames);
    let destination_workloads = moved
        .vgpu()
        .stats()
        .workloads
        .saturating_sub(restored_workloads);

    let mut reference = boot().map_err(vm_err(P::Resume))?;
    reference
        .run_steps(moved.frames())
        .map_err(vm_err(P::Resume))?;
    reference.finish().map_err(vm_err(P::Resume))?;
    let identical = reference.frames() == moved.frames()
        && compare_guest_visible(reference.vgpu(), moved.vgpu()).is_identical();
    let id = type_id(s.ty);
    Ok(ScenarioReport {
        report,
        identical,
        profile: s.profile.name(),
        vgpu_type: format!("{}+{}", id.aperture_mib, id.hidden_mib),
        frames: moved.frames(),
        clock: s.clock,
        frames_at_stop,
        link_gbps: s.link_gbps,
        source_slices: [src_slices.aperture.base.0, src_slices.hidden.base.0],
        dest_slices: [dst_slices.aperture.base.0, dst_slices.hidden.base.0],
        destination_frames,
        destination_workloads,
    })
}

/// Migrates `vm` over `conn` and gives it back (the source's copy, stopped) with the result.
fn migrate_vm<V: MigratableVm + 'static>(
    vm: V,
    conn: Box<dyn Connection>,
    cfg: &MigrationConfig,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(Result<MigrationReport>, V)> {
    let mut handle = source_handle(vm, cfg)?;
    let r = migrate_source(&mut handle, conn, cfg, progress);
    Ok((r, handle.into_device().into_vm()))
}
