//! The `gmig bench` matrix: cases from the command line, rows condensed from their samples.

use anyhow::{anyhow, bail, Context};
use gmig_core::migration::Policy;
use gmig_vgpu::gm::VgpuType;
use gmig_vgpu::migratable::{parse_vgpu_type, type_id};
use gmig_vgpu::workload::{Profile, WorkloadConfig};
use serde::{Deserialize, Serialize};

use crate::bench::{
    frame_phase, migration_config, run_case, BenchCase, BenchSample, CpuList, GuestClock, Pinning,
    Summary,
};
use crate::cli::BenchCommonArgs;
use crate::cmd::migrate::profile_of;

/// gMig's published average downtimes (VEE'18), ms.
pub const PAPER_WINDOWS_MS: f64 = 302.0;
/// gMig, Linux guests.
pub const PAPER_LINUX_MS: f64 = 119.0;
/// gMig: share of pages spared in downtime by software dirty pages, percent.
pub const PAPER_SPARED_PCT: f64 = 80.0;

fn type_name(ty: VgpuType) -> String {
    let id = type_id(ty);
    format!("{}+{}", id.aperture_mib, id.hidden_mib)
}

pub(crate) fn link_name(l: Option<f64>) -> String {
    l.map_or_else(|| "unlimited".to_owned(), |g| format!("{g} Gbit/s"))
}

pub(crate) fn parse_link(s: &str) -> anyhow::Result<Option<f64>> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("inf") {
        return Ok(None);
    }
    let g: f64 = t
        .trim_end_matches("gbit/s")
        .trim_end_matches('G')
        .parse()
        .with_context(|| format!("link speed `{s}`: expected `unlimited` or Gbit/s"))?;
    if !(g.is_finite() && g > 0.0) {
        bail!("link speed `{s}` must be a positive number of Gbit/s");
    }
    Ok(Some(g))
}

/// `--guest-fps`: a positive number of frames per second, or `max` (`None`: as fast as the
/// vGPU goes).
pub(crate) fn parse_fps(s: &str) -> anyhow::Result<Option<f64>> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("max") {
        return Ok(None);
    }
    let f: f64 = t
        .parse()
        .with_context(|| format!("--guest-fps `{s}`: expected frames per second or `max`"))?;
    if !(f.is_finite() && f > 0.0 && f <= 100_000.0) {
        bail!("--guest-fps `{s}` must be more than 0 and at most 100000 frames per second");
    }
    Ok(Some(f))
}

/// `1080p`, `1440p`, `4k` or `WIDTHxHEIGHT`.
fn parse_resolution(s: &str) -> anyhow::Result<(u32, u32)> {
    let (w, h) = match s.to_ascii_lowercase().as_str() {
        "1080p" => (1920, 1080),
        "1440p" => (2560, 1440),
        "4k" | "2160p" => (3840, 2160),
        other => {
            let (w, h) = other
                .split_once('x')
                .with_context(|| format!("resolution `{s}`: use 1080p, 1440p, 4k or WxH"))?;
            (
                w.parse().with_context(|| format!("width in `{s}`"))?,
                h.parse().with_context(|| format!("height in `{s}`"))?,
            )
        }
    };
    // The desktop's 64×64 cursor must fit, and a frame must fit a u16 blit rectangle.
    if !(72..=8192).contains(&w) || !(72..=8192).contains(&h) {
        bail!("resolution `{s}`: width and height must be 72 to 8192 pixels");
    }
    Ok((w, h))
}

/// The pinning `--source-cpus` and `--dest-cpus` ask for.
fn pinning_of(c: &BenchCommonArgs) -> anyhow::Result<Option<Pinning>> {
    match (&c.source_cpus, &c.dest_cpus) {
        (Some(s), Some(d)) => {
            let source = CpuList::parse(s).map_err(|e| anyhow!("--source-cpus: {e}"))?;
            let dest = CpuList::parse(d).map_err(|e| anyhow!("--dest-cpus: {e}"))?;
            Ok(Some(Pinning::new(source, dest).map_err(|e| anyhow!(e))?))
        }
        (None, None) => Ok(None),
        _ => bail!("--source-cpus and --dest-cpus go together"),
    }
}

/// The matrix a run covers.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Matrix {
    pub(crate) profiles: Vec<Profile>,
    pub(crate) types: Vec<String>,
    #[serde(skip)]
    pub(crate) vgpu_types: Vec<VgpuType>,
    pub(crate) policies: Vec<Policy>,
    pub(crate) links: Vec<Option<f64>>,
    pub(crate) reps: usize,
    pub(crate) threads: usize,
    pub(crate) seed: u64,
    pub(crate) ram_mib: Option<u64>,
    pub(crate) small_workload: bool,
    /// The workload's screen size, when not the default.
    pub(crate) resolution: Option<(u32, u32)>,
    pub(crate) switchover_ack: bool,
    pub(crate) verify_before_stop: bool,
    pub(crate) verify_rounds: Option<u32>,
    /// Queued workloads the stop lets finish (`None`: the engine's default).
    pub(crate) max_drain: Option<gmig_core::migration::Drain>,
    pub(crate) touch_memory: bool,
    pub(crate) gpu_ahead: u64,
    /// Source and destination on disjoint CPUs (`--source-cpus`, `--dest-cpus`).
    pub(crate) pinning: Option<Pinning>,
    /// The guest stepped by the engine, a frame every 8 pre-copy batches (`--batch-stepped`).
    pub(crate) batch_stepped: bool,
    /// The clocked guest's rate for every profile (`--guest-fps`; `Some(None)`: `max`); `None`:
    /// each profile's default.
    pub(crate) guest_fps: Option<Option<f64>>,
    /// Each migrated guest checked against an unmigrated run (not `--no-check`).
    pub(crate) check: bool,
    /// Extra (profile, type, policy, link) cases beyond the cross product.
    #[serde(skip)]
    pub(crate) extra: Vec<(Profile, VgpuType, Policy, Option<f64>)>,
}

impl Matrix {
    pub(crate) fn from_common(
        c: &BenchCommonArgs,
        policies: Vec<Policy>,
        profiles: Vec<Profile>,
        types: Vec<VgpuType>,
        links: Vec<Option<f64>>,
        reps: usize,
    ) -> anyhow::Result<Matrix> {
        let profiles = if c.profiles.is_empty() {
            profiles
        } else {
            c.profiles.iter().map(|p| profile_of(*p)).collect()
        };
        let vgpu_types = if c.types.is_empty() {
            types
        } else {
            c.types
                .iter()
                .map(|t| {
                    parse_vgpu_type(t.trim()).ok_or_else(|| {
                        anyhow!("unknown vGPU type `{t}` (64+384, 128+512, 256+1024, 512+2048)")
                    })
                })
                .collect::<anyhow::Result<_>>()?
        };
        let links = if c.links.is_empty() {
            links
        } else {
            c.links
                .iter()
                .map(|l| parse_link(l))
                .collect::<anyhow::Result<_>>()?
        };
        let reps = c.reps.unwrap_or(reps);
        if reps == 0 {
            bail!("--reps must be at least 1");
        }
        if profiles.is_empty() || vgpu_types.is_empty() || policies.is_empty() || links.is_empty() {
            bail!("the matrix is empty");
        }
        if c.ram_mib == Some(0) {
            bail!("--ram-mib must be at least 1");
        }
        let pinning = pinning_of(c)?;
        // Source and destination share this machine: the default leaves a core to each one's
        // stop-copy thread (the sender and the applier); pinned, the source's cores less its
        // sender's.
        let threads = c.threads.unwrap_or_else(|| match pinning {
            Some(p) => p.hash_threads(),
            None => gmig_core::migration::hash_threads_leaving(2),
        });
        Ok(Matrix {
            profiles,
            types: vgpu_types.iter().map(|t| type_name(*t)).collect(),
            vgpu_types,
            policies,
            links,
            reps,
            threads,
            seed: c.seed,
            ram_mib: c.ram_mib,
            small_workload: c.small_workload,
            resolution: c.resolution.as_deref().map(parse_resolution).transpose()?,
            switchover_ack: !c.no_switchover_ack,
            verify_before_stop: !c.no_verify_before_stop,
            verify_rounds: c.verify_rounds,
            max_drain: match (c.max_drain, c.max_drain_ms) {
                (None, None) => None,
                (n, ms) => Some(crate::cli::drain(
                    n,
                    ms,
                    gmig_core::migration::MigrationConfig::new(
                        gmig_core::migration::Policy::OneShotNarrow,
                    )
                    .max_drain,
                )?),
            },
            touch_memory: !c.untouched_memory,
            gpu_ahead: c.gpu_ahead,
            pinning,
            batch_stepped: c.batch_stepped,
            guest_fps: c.guest_fps.as_deref().map(parse_fps).transpose()?,
            check: !c.no_check,
            extra: Vec::new(),
        })
    }

    pub(crate) fn cases(&self) -> Vec<(Profile, VgpuType, Policy, Option<f64>)> {
        let mut out = Vec::new();
        for &profile in &self.profiles {
            for &ty in &self.vgpu_types {
                for &policy in &self.policies {
                    for &link in &self.links {
                        out.push((profile, ty, policy, link));
                    }
                }
            }
        }
        for e in &self.extra {
            if !out.contains(e) {
                out.push(*e);
            }
        }
        out
    }

    pub(crate) fn case(
        &self,
        profile: Profile,
        ty: VgpuType,
        policy: Policy,
        link: Option<f64>,
    ) -> BenchCase {
        let mut c = BenchCase::new(profile, ty, policy, link);
        c.seed = self.seed;
        c.hash_threads = self.threads;
        c.ram_bytes = self.ram_mib.map(|m| m << 20);
        c.switchover_ack = self.switchover_ack;
        c.verify_before_stop = self.verify_before_stop;
        c.verify_rounds = self.verify_rounds;
        c.max_drain = self.max_drain;
        c.touch_memory = self.touch_memory;
        c.gpu_ahead = self.gpu_ahead;
        c.pinning = self.pinning;
        c.check = self.check;
        c.clock = match (self.batch_stepped, self.guest_fps) {
            (true, _) => GuestClock::Batches(8),
            (false, Some(fps)) => GuestClock::Clocked { fps },
            (false, None) => GuestClock::for_profile(profile),
        };
        if self.small_workload {
            c.workload = WorkloadConfig::small();
        }
        if let Some((w, h)) = self.resolution {
            c.workload.width = w;
            c.workload.height = h;
        }
        c
    }
}

/// One row of the matrix: a case condensed over its repetitions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// Workload profile.
    pub profile: String,
    /// vGPU type, aperture+hidden MiB.
    pub vgpu_type: String,
    /// Graphics memory of the type, MiB.
    pub vgpu_mib: u64,
    /// Guest RAM, MiB.
    pub guest_mib: u64,
    /// Policy.
    pub policy: String,
    /// Link speed in Gbit/s (`null`: unlimited).
    pub link_gbps: Option<f64>,
    /// Repetitions.
    pub reps: usize,
    /// Whether the switch-over waited for the destination to apply the pre-copy stream (the
    /// engine's switch-over acknowledgement; rows measured before it existed call this
    /// `sync_precopy`, the bench-side emulation that preceded it).
    #[serde(alias = "sync_precopy")]
    pub switchover_ack: bool,
    /// Whether one-shot-narrow verified its candidate set before the stop.
    #[serde(default)]
    pub verify_before_stop: bool,
    /// Overlapped verifications before the stop (median over the repetitions).
    #[serde(default)]
    pub verify_rounds: u64,
    /// Queued workloads the stop may let finish on the source.
    #[serde(default)]
    pub max_drain: usize,
    /// The drain's time bound (`--max-drain-ms`), if it had one.
    #[serde(default)]
    pub max_drain_ms: Option<f64>,
    /// Commands of each frame the engines ran on submission (`--gpu-ahead`).
    #[serde(default)]
    pub gpu_ahead: u64,
    /// Batch-stepped guests: the frame phase in each repetition (`bench::frame_phase`), where
    /// its frames fall among the pre-copy batches (empty for a clocked guest).
    #[serde(default)]
    pub frame_phases: Vec<u64>,
    /// How the guest's frames were timed: `60 fps`, `max fps` (its own clock), or `1 frame / 8
    /// batches` (stepped by the engine; rows from before the clocked guest have none).
    #[serde(default)]
    pub guest_clock: String,
    /// Frames the guest ran during pre-copy (median).
    #[serde(default)]
    pub precopy_frames: u64,
    /// Whether every repetition's destination equalled an unmigrated run of as many frames
    /// (`null`: not checked).
    #[serde(default)]
    pub identical: Option<bool>,
    /// Workloads the stop did let finish (median).
    #[serde(default)]
    pub drained_workloads: u64,
    /// The guest's screen size, WIDTHxHEIGHT.
    #[serde(default)]
    pub resolution: String,
    /// Downtime percentiles, ms.
    pub downtime_ms: Summary,
    /// Every repetition's downtime, ms.
    pub downtime_samples_ms: Vec<f64>,
    /// Whole migration, ms.
    pub total_ms: Summary,
    /// Pre-copy phase, ms (median).
    pub precopy_ms: f64,
    /// Downtime phases (medians, ms): quiesce and state capture.
    pub quiesce_ms: f64,
    /// Busy time of the downtime hash pipeline.
    pub hash_ms: f64,
    /// End of quiesce to the last stop-copy byte.
    pub transfer_ms: f64,
    /// Last stop-copy byte to the destination's Restored (median, ms).
    pub dest_finish_ms: f64,
    /// Of `dest_finish_ms`: the destination's own tail once the last byte arrived — validation,
    /// building the VM, restore and remap (median, ms).
    #[serde(default)]
    pub dest_tail_ms: f64,
    /// Of `dest_finish_ms`: the rest, the destination catching up with bytes already sent
    /// (median of `dest_finish_ms - dest_tail_ms`, ms).
    #[serde(default)]
    pub dest_catch_up_ms: f64,
    /// Destination: decoding and applying the whole stream, ms (median; mostly during pre-copy).
    #[serde(default)]
    pub dest_apply_ms: f64,
    /// Pre-copy's end to the destination's switch-over acknowledgement: the destination catching
    /// up while the guest still runs (median, ms; 0 without the acknowledgement).
    #[serde(default)]
    pub switchover_wait_ms: f64,
    /// Destination, after its switch-over acknowledgement: applying stop-copy pages and decoding
    /// the device-state sections (median, ms; in downtime).
    #[serde(default)]
    pub dest_stop_apply_ms: f64,
    /// Destination: COMMIT received to the VM running (median, ms).
    #[serde(default)]
    pub dest_resume_ms: f64,
    /// Restored to Resumed: commit round trip and resume (median, ms).
    pub commit_ms: f64,
    /// Destination: applying device state.
    pub restore_ms: f64,
    /// Destination: GGTT remapping.
    pub remap_ms: f64,
    /// Page records sent while running (median).
    pub pages_precopy: u64,
    /// Page records sent in downtime (median).
    pub pages_stop_copy: u64,
    /// All page records (median).
    pub pages_total: u64,
    /// Pages re-hashed in downtime (median).
    pub pages_rehashed: u64,
    /// Pages re-hashed before the stop by one-shot-narrow's overlapped verification (median).
    #[serde(default)]
    pub pages_verified: u64,
    /// Of those, pages that had changed and went again before the stop (median).
    #[serde(default)]
    pub pages_verify_resent: u64,
    /// Zero-page markers among the page records (median).
    pub zero_pages: u64,
    /// Guest frames the vGPU's GTTs mapped when the migration started (median).
    #[serde(default)]
    pub gtt_backed_pages: u64,
    /// Bytes on the wire while running (median).
    pub bytes_precopy: u64,
    /// Bytes on the wire in downtime (median).
    pub bytes_stop_copy: u64,
    /// Whether narrowing widened to every page in any repetition.
    pub widened: bool,
    /// Plain read bandwidth of the guest memory, GB/s (median).
    pub read_gbps: f64,
    /// Unpaced loopback TCP throughput, Gbit/s (median): the link rate of an unlimited link's
    /// bound; 0 on a paced link.
    #[serde(default)]
    pub loopback_gbps: f64,
    /// Link term of the lower bound, ms (median).
    pub bound_link_ms: f64,
    /// Memory term of the lower bound, ms (median).
    pub bound_hash_ms: f64,
    /// Lower bound on downtime, ms (median).
    pub bound_ms: f64,
    /// Downtime over its lower bound (median of the per-repetition ratios).
    pub downtime_over_bound: f64,
}

pub(crate) fn median(v: &[f64]) -> f64 {
    Summary::of(v).map_or(0.0, |s| s.p50)
}

pub(crate) fn median_u(v: impl Iterator<Item = u64>) -> u64 {
    let mut v: Vec<u64> = v.collect();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

fn row_of(case: &BenchCase, samples: &[BenchSample]) -> anyhow::Result<Row> {
    let f = |g: fn(&BenchSample) -> f64| samples.iter().map(g).collect::<Vec<f64>>();
    let u = |g: fn(&BenchSample) -> u64| median_u(samples.iter().map(g));
    let drain = migration_config(case).max_drain;
    let downtimes = f(|s| s.report.downtime_ms);
    let downtime_ms = Summary::of(&downtimes).context("no downtime measured")?;
    let total_ms = Summary::of(&f(|s| s.report.total_ms)).context("no total measured")?;
    let ratios = f(|s| {
        if s.bound_ms > 0.0 {
            s.report.downtime_ms / s.bound_ms
        } else {
            f64::NAN
        }
    });
    Ok(Row {
        profile: case.profile.name().to_owned(),
        vgpu_type: type_name(case.ty),
        vgpu_mib: (case.ty.aperture_size() + case.ty.hidden_size()) >> 20,
        guest_mib: case.guest_bytes() >> 20,
        policy: case.policy.name().to_owned(),
        link_gbps: case.link_gbps,
        reps: samples.len(),
        switchover_ack: case.switchover_ack,
        verify_before_stop: case.verify_before_stop,
        verify_rounds: u(|s| u64::from(s.report.verify_rounds)),
        max_drain: drain.workloads,
        max_drain_ms: drain.time.map(|t| t.as_secs_f64() * 1e3),
        gpu_ahead: case.gpu_ahead,
        frame_phases: match case.clock {
            GuestClock::Batches(every) => (0..samples.len())
                .map(|r| frame_phase(r, samples.len(), every))
                .collect(),
            GuestClock::Clocked { .. } => Vec::new(),
        },
        guest_clock: case.clock.name(),
        precopy_frames: u(|s| s.precopy_frames),
        identical: samples
            .iter()
            .map(|s| s.identical)
            .try_fold(true, |all, one| one.map(|i| all && i)),
        drained_workloads: u(|s| s.report.drained_workloads),
        resolution: format!("{}x{}", case.workload.width, case.workload.height),
        downtime_ms,
        downtime_samples_ms: downtimes,
        total_ms,
        precopy_ms: median(&f(|s| s.report.precopy_ms)),
        quiesce_ms: median(&f(|s| s.report.quiesce_ms)),
        hash_ms: median(&f(|s| s.report.hash_ms)),
        transfer_ms: median(&f(|s| s.report.transfer_ms)),
        dest_finish_ms: median(&f(|s| s.report.dest_finish_ms)),
        dest_tail_ms: median(&f(|s| s.dest.tail_ns as f64 / 1e6)),
        dest_catch_up_ms: median(&f(|s| {
            (s.report.dest_finish_ms - s.dest.tail_ns as f64 / 1e6).max(0.0)
        })),
        dest_apply_ms: median(&f(|s| s.dest.apply_ns as f64 / 1e6)),
        switchover_wait_ms: median(&f(|s| s.report.switchover_wait_ms)),
        dest_stop_apply_ms: median(&f(|s| s.dest.stop_apply_ns as f64 / 1e6)),
        dest_resume_ms: median(&f(|s| s.dest.resume_ns as f64 / 1e6)),
        commit_ms: median(&f(|s| s.report.commit_ms)),
        restore_ms: median(&f(|s| s.report.restore_ms)),
        remap_ms: median(&f(|s| s.report.remap_ms)),
        pages_precopy: u(|s| s.report.pages_precopy),
        pages_stop_copy: u(|s| s.report.pages_stop_copy),
        pages_total: u(|s| s.report.pages_total),
        pages_rehashed: u(|s| s.report.pages_rehashed),
        pages_verified: u(|s| s.report.pages_verified),
        pages_verify_resent: u(|s| s.report.pages_verify_resent),
        zero_pages: u(|s| s.report.zero_pages),
        gtt_backed_pages: u(|s| s.gtt_backed_pages),
        bytes_precopy: u(|s| s.report.bytes_precopy),
        bytes_stop_copy: u(|s| s.report.bytes_stop_copy),
        widened: samples.iter().any(|s| s.report.widened),
        read_gbps: median(&f(|s| s.read_gbps)),
        loopback_gbps: median(&f(|s| s.loopback_gbps)),
        bound_link_ms: median(&f(|s| s.bound_link_ms)),
        bound_hash_ms: median(&f(|s| s.bound_hash_ms)),
        bound_ms: median(&f(|s| s.bound_ms)),
        downtime_over_bound: median(&ratios),
    })
}

/// A check failure when a row's migrated guest differed from its unmigrated run.
pub(crate) fn check_rows(rows: &[Row]) -> Result<(), crate::exit::Failure> {
    match rows.iter().find(|r| r.identical == Some(false)) {
        Some(r) => Err(crate::exit::Failure::Check(format!(
            "{} {} {} {}: a migrated guest differs from its unmigrated run of as many frames",
            r.profile,
            r.vgpu_type,
            r.policy,
            link_name(r.link_gbps)
        ))),
        None => Ok(()),
    }
}

pub(crate) fn run_matrix(m: &Matrix) -> anyhow::Result<Vec<Row>> {
    let cases = m.cases();
    let mut rows = Vec::with_capacity(cases.len());
    for (i, (profile, ty, policy, link)) in cases.iter().copied().enumerate() {
        let case = m.case(profile, ty, policy, link);
        let mut samples = Vec::with_capacity(m.reps);
        for rep in 0..m.reps {
            let mut case = case;
            case.step_phase = frame_phase(rep, m.reps, case.clock.step_every_batches());
            let s = run_case(&case).with_context(|| {
                format!(
                    "{} {} {} {} (repetition {})",
                    profile.name(),
                    type_name(ty),
                    policy.name(),
                    link_name(link),
                    rep + 1
                )
            })?;
            samples.push(s);
        }
        let row = row_of(&case, &samples)?;
        eprintln!(
            "[{}/{}] {:<8} {:<9} {:<16} {:<10} downtime p50 {:>9.2} ms  ({} pages in downtime; guest {}, {} frames in pre-copy{})",
            i + 1,
            cases.len(),
            row.profile,
            row.vgpu_type,
            row.policy,
            link_name(link),
            row.downtime_ms.p50,
            row.pages_stop_copy,
            row.guest_clock,
            row.precopy_frames,
            match row.identical {
                Some(true) => ", identical to the unmigrated run",
                Some(false) => ", DIFFERS from the unmigrated run",
                None => "",
            }
        );
        rows.push(row);
    }
    Ok(rows)
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn links_parse() {
        assert_eq!(parse_link("unlimited").unwrap(), None);
        assert_eq!(parse_link("10").unwrap(), Some(10.0));
        assert_eq!(parse_link("2.5").unwrap(), Some(2.5));
        assert!(parse_link("0").is_err());
        assert!(parse_link("fast").is_err());
        assert!(parse_link("-1").is_err());
    }

    fn migrate_matrix(args: &[&str]) -> anyhow::Result<Matrix> {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from(
            ["gmig", "bench", "migrate"].iter().chain(args).copied(),
        )?;
        let crate::cli::Command::Bench(b) = cli.command else {
            bail!("not a bench command");
        };
        let crate::cli::BenchWhat::Migrate(m) = b.what else {
            bail!("not bench migrate");
        };
        Matrix::from_common(
            &m.common,
            vec![Policy::OneShot],
            vec![Profile::Desktop],
            vec![VgpuType::V5_8],
            vec![None],
            1,
        )
    }

    #[test]
    fn source_and_destination_cpus_parse_into_the_cases() {
        let m = migrate_matrix(&["--source-cpus", "0-7", "--dest-cpus", "8-15"]).unwrap();
        let p = m.pinning.unwrap();
        assert_eq!(p.source.cpus(), (0..8).collect::<Vec<_>>());
        assert_eq!(p.dest.cpus(), (8..16).collect::<Vec<_>>());
        assert_eq!(m.threads, 7, "the source's CPUs less its sender's");
        let case = m.case(Profile::Desktop, VgpuType::V5_8, Policy::OneShot, None);
        assert_eq!(case.pinning, Some(p));
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["pinning"]["source"], "0-7");
        assert_eq!(json["pinning"]["dest"], "8-15");
        let m = migrate_matrix(&["--source-cpus", "0,1", "--dest-cpus", "2", "--threads", "3"]);
        assert_eq!(m.unwrap().threads, 3, "--threads still wins");
        assert!(migrate_matrix(&[]).unwrap().pinning.is_none());
        for bad in [
            &["--source-cpus", "0-3"][..],
            &["--dest-cpus", "4-7"],
            &["--source-cpus", "0-4", "--dest-cpus", "4-7"],
            &["--source-cpus", "x", "--dest-cpus", "4-7"],
        ] {
            assert!(migrate_matrix(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn resolutions_parse() {
        assert_eq!(parse_resolution("1080p").unwrap(), (1920, 1080));
        assert_eq!(parse_resolution("4K").unwrap(), (3840, 2160));
        assert_eq!(parse_resolution("800x600").unwrap(), (800, 600));
        for bad in [
            "",
            "hd",
            "800",
            "800x",
            "x600",
            "64x64",
            "10000x100",
            "-1x5",
        ] {
            assert!(parse_resolution(bad).is_err(), "{bad}");
        }
    }
}
