//! The benchmark harness behind `gmig bench migrate` and `gmig bench paper` (a harness, not part
//! of the engine's library API).
//!
//! Benchmark scenarios for `gmig bench`: one migration of a booted reference vGPU over loopback
//! TCP (optionally paced to a link speed), with the memory-read bandwidth of the same guest
//! memory measured in the same run, and the lower bound on downtime derived from both.
//!
//! A *case* is one point of the matrix (profile × vGPU type × policy × link); a *sample* is one
//! repetition of it; a [`Summary`] condenses the samples' times into percentiles.
//!
//! **Guest memory.** The guest gets as much RAM as its vGPU type has graphics memory (448 MiB for
//! 64+384), so "vGPU size" and "pages the migration carries" grow together, as they do on a real
//! GVT-g host where the GTT-backed pages are what gMig hashes.
//!
//! **Lower bound.** `bound = stop-copy bytes / link rate + re-hashed bytes / read bandwidth`,
//! where the read bandwidth is the best of two plain read passes over the whole guest memory with
//! the same threads the engine hashes with, taken right before the migration starts. A paced link
//! has its set rate; an unlimited (unpaced) link is loopback TCP, whose own rate is probed the
//! same way (the best of two 32 MiB transfers over a fresh loopback connection, right before the
//! migration), since stop-copy bytes cannot cross it faster. Because hashing and sending overlap,
//! a downtime below this bound (ratio < 1) is possible and means the overlap worked.
//!
//! **Switch-over acknowledgement (`switchover_ack`).** Zero pages cost a few bytes on the wire
//! but a page write on the destination, so after a one-shot pass over mostly-zero guest memory
//! the destination is still applying megabytes of pre-copy stream when the source has written
//! its last byte. The engine's switch-over acknowledgement (on by default) makes the source wait,
//! the guest still running, until the destination has applied it all; turned off, the downtime
//! absorbs that backlog. (Before the engine had it, `sync_precopy` emulated it here.)
//!
//! **Pinning (`pinning`).** Both ends run in this process. With a [`Pinning`] the source's
//! thread and the destination's thread bind themselves (and so the pools and threads they start)
//! to two disjoint sets of cores, as two hosts would have; the loopback probe's reader runs on
//! the destination's cores too. Each repetition reads the affinity back ([`Affinity`]).

pub mod evacuate;
pub mod pin;

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use gmig_cmdparser::Gen;
use gmig_dirty::{GuestPages, Hasher};

use gmig_core::migration::{
    migrate_destination, migrate_source, source_handle, ClockedVm, DestPhases, MigratableVm,
    MigrationConfig, MigrationError, MigrationReport, Policy, VmError,
};
use gmig_core::transport::{Connection, Endpoint, Throttled, TransportError};
use gmig_vgpu::compare::compare_guest_visible;
use gmig_vgpu::gm::{HostConfig, PartitionManager, VgpuSlices, VgpuType, PAGE_SIZE};
use gmig_vgpu::migratable::{VgpuFactory, VgpuVm};
pub use gmig_vgpu::scenario::GuestClock;
use gmig_vgpu::workload::{Profile, WorkloadConfig};
pub use pin::{Affinity, CpuList, Pinning};

/// Errors of a benchmark run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The case itself is invalid (a bad link speed, no repetitions).
    #[error("bad benchmark case: {0}")]
    Config(String),
    /// Placing the vGPU's slices failed.
    #[error("placing a {ty} vGPU: {reason}")]
    Placement {
        /// The vGPU type.
        ty: &'static str,
        /// Why.
        reason: String,
    },
    /// Booting or running the guest failed.
    #[error("guest: {0}")]
    Vm(#[from] VmError),
    /// The loopback connection could not be made.
    #[error("loopback transport: {0}")]
    Transport(#[from] TransportError),
    /// Measuring memory bandwidth failed.
    #[error("memory probe: {0}")]
    Probe(String),
    /// The migration failed.
    #[error("migration: {0}")]
    Migration(#[from] MigrationError),
    /// The destination thread panicked.
    #[error("the destination thread panicked")]
    DestinationPanicked,
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, BenchError>;

/// One point of the benchmark matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchCase {
    /// Guest workload.
    pub profile: Profile,
    /// vGPU type (the guest's RAM is its graphics-memory size).
    pub ty: VgpuType,
    /// Migration policy.
    pub policy: Policy,
    /// Link speed in Gbit/s; `None` is unlimited (loopback TCP at full speed).
    pub link_gbps: Option<f64>,
    /// Workload seed.
    pub seed: u64,
    /// Frames the guest runs before the migration starts.
    pub warmup_steps: u64,
    /// Workload sizes.
    pub workload: WorkloadConfig,
    /// Threads hashing (and probing memory bandwidth); 0 means one per core less the two cores
    /// left to the source's sender and the destination's applier, which share this machine
    /// ([`hash_threads_leaving`](gmig_core::migration::hash_threads_leaving)`(2)`), or with
    /// `pinning`, [`Pinning::hash_threads`] (the source's cores less its sender's).
    pub hash_threads: usize,
    /// Source and destination on disjoint cores (`None`: wherever the scheduler puts them).
    pub pinning: Option<Pinning>,
    /// How the guest's frames are timed during the migration: on its own clock (the default,
    /// [`GuestClock::for_profile`]) or one frame after every N pre-copy batches.
    pub clock: GuestClock,
    /// Batch-stepped only: shifts the frames by this many batches
    /// (`MigrationConfig::step_phase`); the matrix varies it between repetitions
    /// ([`frame_phase`]).
    pub step_phase: u64,
    /// Guest RAM override in bytes (`None`: the vGPU type's graphics-memory size). Tests use
    /// small guests.
    pub ram_bytes: Option<u64>,
    /// The engine's switch-over acknowledgement (see the module docs; on by default).
    pub switchover_ack: bool,
    /// One-shot-narrow's overlapped verification (on by default).
    pub verify_before_stop: bool,
    /// Most overlapped verifications (`None`: the engine's default).
    pub verify_rounds: Option<u32>,
    /// Queued workloads the stop lets finish (`None`: the engine's default).
    pub max_drain: Option<gmig_core::migration::Drain>,
    /// Back every guest page with its own memory before the migration (read a byte of each page
    /// and write it back: contents unchanged). A fresh mapping reads its untouched pages from
    /// one shared zero page, which sits in cache and flatters both hashing and the read probe;
    /// a real guest's RAM is populated.
    pub touch_memory: bool,
    /// Commands of each frame the engines run as soon as it is submitted
    /// ([`VgpuVm::with_gpu_ahead`]): with it a stop finds a workload part-way.
    pub gpu_ahead: u64,
    /// After the migration, let the destination finish the guest's frames and compare its
    /// guest-visible state with an unmigrated run of as many frames (outside the timed part).
    pub check: bool,
}

/// The share of a vGPU type's graphics memory the bench guest keeps resident (mapped and filled,
/// read but not rewritten by frames): a quarter. A GVT-g desktop or 3D guest keeps its textures,
/// vertex buffers, shader caches and other clients' buffers resident; a quarter of the slice is a
/// middle figure (i915 guests commonly run with a few hundred MiB of GEM objects in a 512 MiB to
/// 2 GiB slice). Without it the bench guests were nearly empty and every policy looked better.
pub const RESIDENT_PERCENT: u64 = 25;

impl BenchCase {
    /// A case with the defaults `gmig bench` uses: seed 1, 4 warm-up frames, the default
    /// (1024×768) workload, all cores hashing, the guest on its own clock at the profile's
    /// rate ([`gmig_vgpu::scenario::default_fps`]), the result checked.
    pub fn new(profile: Profile, ty: VgpuType, policy: Policy, link_gbps: Option<f64>) -> Self {
        Self {
            profile,
            ty,
            policy,
            link_gbps,
            seed: 1,
            warmup_steps: 4,
            workload: WorkloadConfig {
                resident_bytes: ty.total_size() * RESIDENT_PERCENT / 100,
                ..WorkloadConfig::default()
            },
            hash_threads: 0,
            pinning: None,
            clock: GuestClock::for_profile(profile),
            step_phase: 0,
            ram_bytes: None,
            switchover_ack: true,
            verify_before_stop: true,
            verify_rounds: None,
            max_drain: None,
            touch_memory: true,
            gpu_ahead: 0,
            check: true,
        }
    }

    /// Guest RAM of this case in bytes.
    pub fn guest_bytes(&self) -> u64 {
        self.ram_bytes
            .unwrap_or(self.ty.aperture_size() + self.ty.hidden_size())
    }
}

/// What one repetition of a case measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BenchSample {
    /// The engine's own report.
    pub report: MigrationReport,
    /// Plain read bandwidth of the guest memory, GB/s (10^9 bytes), with the hashing threads.
    pub read_gbps: f64,
    /// Unpaced loopback TCP throughput, Gbit/s, probed before the migration when the link is
    /// unlimited (the rate of the bound's link term then); 0 on a paced link.
    pub loopback_gbps: f64,
    /// Link term of the bound: stop-copy bytes at the link rate (the probed loopback rate when
    /// unlimited), ms.
    pub bound_link_ms: f64,
    /// Memory term of the bound: the pages re-hashed (or, where more, sent) in downtime at the
    /// read bandwidth, ms.
    pub bound_hash_ms: f64,
    /// The lower bound, ms.
    pub bound_ms: f64,
    /// Booting, warming up and probing before the migration, ms (not part of the migration).
    pub setup_ms: f64,
    /// The destination's own phases.
    pub dest: DestPhases,
    /// Guest frames the vGPU's GTTs map when the migration starts (counted before it, not in
    /// downtime): the GPU's working set, against which zero pages and stop-copy pages can be read.
    pub gtt_backed_pages: u64,
    /// With a pinning: the CPUs the source's and the destination's threads were bound to, read
    /// back from the kernel in each.
    pub affinity: Option<Affinity>,
    /// Frames the guest ran during pre-copy (on its own clock, or stepped by the engine).
    pub precopy_frames: u64,
    /// With [`BenchCase::check`]: the destination, run on to the end of the guest's frames,
    /// equals an unmigrated run of as many frames.
    pub identical: Option<bool>,
}

/// The lower bound on downtime for `stop_copy_bytes` over a link of `link_gbps` (unlimited when
/// `None`) and `read_pages` that must be read in downtime at `read_gbps`. Returns
/// `(link_ms, hash_ms)`.
pub fn lower_bound_ms(
    stop_copy_bytes: u64,
    link_gbps: Option<f64>,
    read_pages: u64,
    read_gbps: f64,
) -> (f64, f64) {
    let link_ms = match link_gbps {
        Some(g) if g > 0.0 => stop_copy_bytes as f64 * 8.0 / (g * 1e9) * 1e3,
        _ => 0.0,
    };
    let hash_ms = if read_gbps > 0.0 {
        (read_pages * PAGE_SIZE) as f64 / (read_gbps * 1e9) * 1e3
    } else {
        0.0
    };
    (link_ms, hash_ms)
}

/// Source and destination slices on two default hosts; the destination's slices are at other
/// offsets (a smaller vGPU sits first there), so remapping has real work.
pub fn host_slices(ty: VgpuType) -> Result<(VgpuSlices, VgpuSlices)> {
    let place_err = |e: &dyn std::fmt::Display| BenchError::Placement {
        ty: ty.name(),
        reason: e.to_string(),
    };
    let mut src = PartitionManager::new(HostConfig::default()).map_err(|e| place_err(&e))?;
    let (_, s) = src.place(ty).map_err(|e| place_err(&e))?;
    let mut dst = PartitionManager::new(HostConfig::default()).map_err(|e| place_err(&e))?;
    dst.place(VgpuType::V5_8).map_err(|e| place_err(&e))?;
    let (_, d) = dst
        .place_avoiding(ty, Some(&s))
        .map_err(|e| place_err(&e))?;
    Ok((s, d))
}

/// Fault in every page of `mem` with its own memory, keeping the contents (the first byte of
/// each page is read and written back).
pub fn touch_every_page(mem: &vm_memory::GuestMemoryMmap) -> Result<()> {
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
    let probe = |e: &dyn std::fmt::Display| BenchError::Probe(e.to_string());
    for region in mem.iter() {
        let start = region.start_addr().0;
        let mut off = 0u64;
        while off < region.len() {
            let addr = GuestAddress(start + off);
            let b: u8 = mem.read_obj(addr).map_err(|e| probe(&e))?;
            mem.write_obj(b, addr).map_err(|e| probe(&e))?;
            off += PAGE_SIZE;
        }
    }
    Ok(())
}

/// Best-of-`passes` plain read bandwidth of all of `vm`'s guest memory, GB/s.
pub fn read_bandwidth_gbps(vm: &VgpuVm, threads: usize, passes: usize) -> Result<f64> {
    let probe = |e: &dyn std::fmt::Display| BenchError::Probe(e.to_string());
    let hasher = Hasher::new(threads).map_err(|e| probe(&e))?;
    let pages = GuestPages::new(vm.memory()).map_err(|e| probe(&e))?;
    let frames = pages.frames().map_err(|e| probe(&e))?;
    let bytes = frames.count() * PAGE_SIZE;
    let mut best = Duration::MAX;
    let mut sink = 0u64;
    for _ in 0..passes.max(1) {
        let t = Instant::now();
        sink ^= hasher
            .read_probe(&pages, &frames, true)
            .map_err(|e| probe(&e))?;
        best = best.min(t.elapsed());
    }
    std::hint::black_box(sink);
    Ok(bytes as f64 / best.as_secs_f64().max(1e-9) / 1e9)
}

/// Best-of-`passes` throughput of unpaced loopback TCP, Gbit/s: `bytes` written in 1 MiB
/// pieces on a fresh connection, timed from the first write until the reader has them all. The
/// reader runs on `reader_cpus` when given (the destination's cores of a pinned run).
pub fn loopback_gbps(bytes: usize, passes: usize, reader_cpus: Option<CpuList>) -> Result<f64> {
    use std::io::{Read, Write};
    let probe = |e: &dyn std::fmt::Display| BenchError::Probe(e.to_string());
    let (mut a, mut b) = loopback_pair()?;
    let piece = 1 << 20;
    let total = bytes.max(piece);
    let mut best = Duration::MAX;
    for _ in 0..passes.max(1) {
        let reader = thread::spawn(move || -> std::io::Result<_> {
            if let Some(cpus) = reader_cpus {
                cpus.pin_current_thread()?;
            }
            let mut buf = vec![0u8; piece];
            let mut got = 0;
            while got < total {
                match b.read(&mut buf)? {
                    0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                    n => got += n,
                }
            }
            Ok((b, Instant::now()))
        });
        let data = vec![0x5au8; piece];
        let t = Instant::now();
        let mut sent = 0;
        while sent < total {
            let n = piece.min(total - sent);
            a.write_all(&data[..n]).map_err(|e| probe(&e))?;
            sent += n;
        }
        a.flush().map_err(|e| probe(&e))?;
        let (back, done) = reader
            .join()
            .map_err(|_| BenchError::Probe("loopback reader panicked".into()))?
            .map_err(|e| probe(&e))?;
        b = back;
        best = best.min(done.saturating_duration_since(t));
    }
    Ok(total as f64 * 8.0 / best.as_secs_f64().max(1e-9) / 1e9)
}

fn loopback_pair() -> Result<(Box<dyn Connection>, Box<dyn Connection>)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let listener = Endpoint::Tcp(addr).listen()?;
    let ep = listener.endpoint()?;
    let accept = thread::spawn(move || listener.accept());
    let a = ep.connect()?;
    let b = accept
        .join()
        .map_err(|_| BenchError::DestinationPanicked)??;
    Ok((a, b))
}

/// The frame phase of repetition `rep` of `reps` when the guest runs a frame every `every`
/// pre-copy batches: the repetitions spread evenly over the phases. The guest's frames follow
/// pre-copy batches, whose number grows with the guest, so with one fixed phase whether a frame
/// lands between the last verification and the stop would depend on the guest's size alone.
pub fn frame_phase(rep: usize, reps: usize, every: u64) -> u64 {
    match (u64::try_from(rep), u64::try_from(reps)) {
        (Ok(r), Ok(n)) if n > 0 => r.saturating_mul(every) / n,
        _ => 0,
    }
}

/// The engine configuration a case runs with.
pub fn migration_config(case: &BenchCase) -> MigrationConfig {
    let mut cfg = MigrationConfig::new(case.policy);
    cfg.hash_threads = match (case.hash_threads, case.pinning) {
        (0, Some(p)) => p.hash_threads(),
        (0, None) => gmig_core::migration::hash_threads_leaving(2),
        (n, _) => n,
    };
    cfg.step_every_batches = case.clock.step_every_batches();
    cfg.step_phase = case.step_phase;
    cfg.timeout = Duration::from_secs(120);
    cfg.switchover_ack = case.switchover_ack;
    cfg.verify_before_stop = case.verify_before_stop;
    if let Some(n) = case.verify_rounds {
        cfg.verify_rounds = n;
    }
    if let Some(d) = case.max_drain {
        cfg.max_drain = d;
    }
    cfg
}

/// Gives the calling thread its affinity back when dropped.
struct RestoreAffinity(CpuList);

impl Drop for RestoreAffinity {
    fn drop(&mut self) {
        // Best effort: the set was this thread's own a moment ago.
        let _ = self.0.pin_current_thread();
    }
}

fn pin_err(side: &str, cpus: CpuList, e: nix::Error) -> BenchError {
    BenchError::Config(format!("pinning the {side} to CPUs {cpus}: {e}"))
}

/// Binds the calling thread to `cpus` and reads its affinity back.
fn pin_here(side: &str, cpus: CpuList) -> Result<CpuList> {
    cpus.pin_current_thread()
        .and_then(|()| CpuList::of_current_thread())
        .map_err(|e| pin_err(side, cpus, e))
}

/// Run one repetition of `case`: boot, warm up, probe the read bandwidth, migrate over loopback
/// TCP (paced on the source's side when a link speed is set), and compute the bound. With a
/// pinning, the calling thread runs the source on the source's CPUs (its own affinity comes back
/// when the repetition ends) and the destination's thread runs on the destination's.
pub fn run_case(case: &BenchCase) -> Result<BenchSample> {
    if let Some(g) = case.link_gbps {
        if !(g.is_finite() && g > 0.0) {
            return Err(BenchError::Config(format!("link speed {g} Gbit/s")));
        }
    }
    let mut _restore = None;
    let mut source_affinity = None;
    if let Some(p) = case.pinning {
        let before = CpuList::of_current_thread().map_err(|e| pin_err("source", p.source, e))?;
        _restore = Some(RestoreAffinity(before));
        source_affinity = Some(pin_here("source", p.source)?);
    }
    let t_setup = Instant::now();
    let (s, d) = host_slices(case.ty)?;
    let ram = case.guest_bytes();
    let mut vm = VgpuVm::boot(case.ty, s, ram, case.profile, case.workload, case.seed)?
        .with_gpu_ahead(case.gpu_ahead);
    vm.run_steps(case.warmup_steps)?;
    if case.touch_memory {
        touch_every_page(vm.memory())?;
    }
    let cfg = migration_config(case);
    let read_gbps = read_bandwidth_gbps(&vm, cfg.hash_threads, 2)?;
    let loopback_gbps = match case.link_gbps {
        Some(_) => 0.0,
        None => loopback_gbps(32 << 20, 2, case.pinning.map(|p| p.dest))?,
    };
    let gtt_backed_pages = vm.vgpu().gtt_backed_pages().len() as u64;
    let setup_ms = t_setup.elapsed().as_secs_f64() * 1e3;

    let (a, b) = loopback_pair()?;
    let factory = VgpuFactory::new(Gen::Gen9, case.ty, d, ram);
    let dcfg = cfg.clone();
    // The destination thread hands the migrated VM back instead of dropping it: unmapping its
    // guest memory while the source still waits for RESUMED would hold this process's address
    // space lock (both ends share it here, not on two hosts) and land in the measured downtime.
    let pinning = case.pinning;
    let dest = thread::spawn(move || {
        let affinity = match pinning {
            Some(p) => Some(pin_here("destination", p.dest)?),
            None => None,
        };
        Ok::<_, BenchError>((migrate_destination(factory, b, &dcfg), affinity))
    });
    let conn: Box<dyn Connection> = match case.link_gbps {
        Some(g) => Box::new(Throttled::new(a, g)?),
        None => a,
    };
    let (report, src) = match case.clock {
        GuestClock::Batches(_) => migrate_vm(vm, conn, &cfg)?,
        GuestClock::Clocked { .. } => {
            let clocked = ClockedVm::start(vm, case.clock.interval())?;
            let (mut report, clocked) = migrate_vm(clocked, conn, &cfg)?;
            if let Ok(r) = report.as_mut() {
                r.steps_during_precopy = clocked.frames();
            }
            (report, clocked.stop()?)
        }
    };
    let (dest, dest_affinity) = dest.join().map_err(|_| BenchError::DestinationPanicked)??;
    let report = report?;
    let (moved, dest) = dest?;
    let identical = if case.check {
        Some(check_against_unmigrated(case, s, src, moved)?)
    } else {
        drop(moved);
        None
    };
    let (bound_link_ms, bound_hash_ms) = lower_bound_ms(
        report.bytes_stop_copy,
        case.link_gbps.or(Some(loopback_gbps)),
        report.pages_rehashed.max(report.pages_stop_copy),
        read_gbps,
    );
    Ok(BenchSample {
        read_gbps,
        loopback_gbps,
        bound_link_ms,
        bound_hash_ms,
        bound_ms: bound_link_ms + bound_hash_ms,
        setup_ms,
        dest: dest.phases,
        gtt_backed_pages,
        affinity: source_affinity
            .zip(dest_affinity)
            .map(|(source, dest)| Affinity { source, dest }),
        precopy_frames: report.steps_during_precopy,
        report,
        identical,
    })
}

/// Migrates `vm` over `conn` and gives back the source's copy (stopped) with the result.
fn migrate_vm<V: MigratableVm + 'static>(
    vm: V,
    conn: Box<dyn Connection>,
    cfg: &MigrationConfig,
) -> Result<(std::result::Result<MigrationReport, MigrationError>, V)> {
    let mut handle = source_handle(vm, cfg)?;
    let r = migrate_source(&mut handle, conn, cfg, &mut |_| {});
    Ok((r, handle.into_device().into_vm()))
}

/// The destination, given the source's guest driver, finishes the frames the guest had
/// submitted; then an unmigrated guest booted like the source runs as many frames, and the two
/// must be identical to the guest. (The workload is deterministic per frame, so however many
/// frames a clocked guest ran before the stop, the unmigrated run of that many frames is the
/// reference.)
fn check_against_unmigrated(
    case: &BenchCase,
    slices: VgpuSlices,
    mut src: VgpuVm,
    mut moved: VgpuVm,
) -> Result<bool> {
    let driver = src
        .take_driver()
        .ok_or_else(|| VmError("the source lost its guest driver".into()))?;
    drop(src);
    moved.attach_driver(driver);
    moved.finish()?;
    let mut reference = VgpuVm::boot(
        case.ty,
        slices,
        case.guest_bytes(),
        case.profile,
        case.workload,
        case.seed,
    )?;
    reference.run_steps(moved.frames())?;
    reference.finish()?;
    Ok(reference.frames() == moved.frames()
        && compare_guest_visible(reference.vgpu(), moved.vgpu()).is_identical())
}

/// Percentiles of a set of times.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// Median (nearest rank).
    pub p50: f64,
    /// 95th percentile (nearest rank).
    pub p95: f64,
    /// Largest.
    pub max: f64,
    /// Smallest.
    pub min: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl Summary {
    /// Summarise `values` (NaNs are ignored); `None` when nothing is left.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            // Nearest rank: the smallest value with at least p of the samples at or below it.
            let r = (p * v.len() as f64).ceil() as usize;
            v[r.clamp(1, v.len()) - 1]
        };
        Some(Summary {
            p50: rank(0.50),
            p95: rank(0.95),
            max: v[v.len() - 1],
            min: v[0],
            mean: v.iter().sum::<f64>() / v.len() as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetitions_spread_evenly_over_the_frame_phases() {
        let phases = |reps| {
            (0..reps)
                .map(|r| frame_phase(r, reps, 8))
                .collect::<Vec<_>>()
        };
        assert_eq!(phases(1), [0]);
        assert_eq!(phases(2), [0, 4]);
        assert_eq!(phases(5), [0, 1, 3, 4, 6]);
        assert_eq!(phases(8), [0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(phases(20).iter().all(|p| *p < 8));
        assert_eq!(frame_phase(3, 0, 8), 0, "no repetitions, no phase");
    }

    #[test]
    fn summary_uses_nearest_rank() {
        let s = Summary::of(&[5.0, 1.0, 3.0, 2.0, 4.0]).unwrap();
        assert_eq!(s.p50, 3.0);
        assert_eq!(s.p95, 5.0);
        assert_eq!(s.max, 5.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.mean, 3.0);
        let one = Summary::of(&[7.5]).unwrap();
        assert_eq!((one.p50, one.p95, one.max), (7.5, 7.5, 7.5));
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[f64::NAN]).is_none());
        let twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        let s = Summary::of(&twenty).unwrap();
        assert_eq!((s.p50, s.p95), (10.0, 19.0));
    }

    #[test]
    fn bound_terms() {
        // 125 MB at 1 Gbit/s is one second; 1000 pages at 4.096 GB/s is one millisecond.
        let (l, h) = lower_bound_ms(125_000_000, Some(1.0), 1000, 4.096);
        assert!((l - 1000.0).abs() < 1e-6, "{l}");
        assert!((h - 1.0).abs() < 1e-9, "{h}");
        assert_eq!(lower_bound_ms(1 << 30, None, 0, 10.0), (0.0, 0.0));
    }

    #[test]
    fn small_case_runs_and_is_consistent() {
        let mut case = BenchCase::new(
            Profile::Desktop,
            VgpuType::V5_8,
            Policy::OneShotNarrow,
            Some(25.0),
        );
        case.workload = WorkloadConfig::small();
        case.ram_bytes = Some(32 << 20);
        case.hash_threads = 2;
        case.warmup_steps = 2;
        let s = run_case(&case).unwrap();
        let r = &s.report;
        assert!(r.downtime_ms > 0.0 && r.downtime_ms <= r.total_ms);
        assert_eq!(r.pages_total, r.pages_precopy + r.pages_stop_copy);
        assert!(r.pages_stop_copy < r.pages_precopy);
        assert!(s.read_gbps > 0.0);
        assert!(s.bound_link_ms > 0.0 && s.bound_ms >= s.bound_link_ms);
        assert!(r.bytes_stop_copy > 0);
        assert_eq!(s.loopback_gbps, 0.0, "a paced link is not probed");
        assert_eq!(case.clock, GuestClock::Clocked { fps: Some(60.0) });
        assert_eq!(s.identical, Some(true), "the migrated guest differs: {s:?}");
    }

    #[test]
    fn an_unlimited_link_is_bounded_by_the_probed_loopback_rate() {
        let mut case = BenchCase::new(Profile::Desktop, VgpuType::V5_8, Policy::OneShot, None);
        case.workload = WorkloadConfig::small();
        case.ram_bytes = Some(32 << 20);
        case.hash_threads = 2;
        case.warmup_steps = 2;
        let s = run_case(&case).unwrap();
        assert!(s.loopback_gbps > 0.0);
        let want = s.report.bytes_stop_copy as f64 * 8.0 / (s.loopback_gbps * 1e9) * 1e3;
        assert!(s.report.bytes_stop_copy > 0);
        assert!((s.bound_link_ms - want).abs() <= want * 1e-9, "{s:?}");
    }

    #[test]
    fn a_pinned_case_runs_each_side_on_its_own_cpus() {
        let all = CpuList::of_current_thread().unwrap().cpus();
        assert!(all.len() >= 2, "this test needs two CPUs, has {all:?}");
        let (s, d) = all.split_at(all.len() / 2);
        let p = Pinning::new(
            CpuList::of(s.iter().copied()).unwrap(),
            CpuList::of(d.iter().copied()).unwrap(),
        )
        .unwrap();
        // Unlimited: the loopback probe's reader is pinned too.
        let mut case = BenchCase::new(Profile::Desktop, VgpuType::V5_8, Policy::OneShot, None);
        case.workload = WorkloadConfig::small();
        case.ram_bytes = Some(32 << 20);
        case.warmup_steps = 2;
        case.pinning = Some(p);
        assert_eq!(migration_config(&case).hash_threads, p.hash_threads());
        let before = CpuList::of_current_thread().unwrap();
        let sample = run_case(&case).unwrap();
        assert_eq!(
            sample.affinity,
            Some(Affinity {
                source: p.source,
                dest: p.dest
            })
        );
        assert!(sample.report.downtime_ms > 0.0);
        assert_eq!(
            CpuList::of_current_thread().unwrap(),
            before,
            "the caller's affinity comes back"
        );
        case.pinning = None;
        assert_eq!(run_case(&case).unwrap().affinity, None);
    }

    #[test]
    fn the_loopback_probe_measures_a_rate() {
        let g = loopback_gbps(4 << 20, 2, None).unwrap();
        assert!(g.is_finite() && g > 0.0, "{g}");
    }

    #[test]
    fn bad_link_is_refused() {
        let case = BenchCase::new(Profile::Idle, VgpuType::V5_8, Policy::OneShot, Some(0.0));
        assert!(matches!(run_case(&case), Err(BenchError::Config(_))));
    }
}
