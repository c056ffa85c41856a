//! `gmig bench migrate` (the downtime matrix) and `gmig bench paper` (gMig's evaluation, our
//! profiles): run the cases, condense repetitions into rows, judge the targets, and write
//! Markdown, JSON and SVG plots.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use crate::bench::{run_case, BenchCase, BenchSample, Summary};
use anyhow::{anyhow, bail, Context};
use gmig_core::migration::Policy;
use gmig_vgpu::gm::VgpuType;
use gmig_vgpu::migratable::{parse_vgpu_type, type_id};
use gmig_vgpu::workload::{Profile, WorkloadConfig};
use serde::{Deserialize, Serialize};

use crate::cli::{BenchCommonArgs, BenchMigrateArgs, BenchPaperArgs, ProfileArg};
use crate::cmd::migrate::policy_of;
use crate::exit::Failure;

/// gMig's published average downtimes (VEE'18), ms.
pub const PAPER_WINDOWS_MS: f64 = 302.0;
/// gMig, Linux guests.
pub const PAPER_LINUX_MS: f64 = 119.0;
/// gMig: share of pages spared in downtime by software dirty pages, percent.
pub const PAPER_SPARED_PCT: f64 = 80.0;

fn profile_of(p: ProfileArg) -> Profile {
    match p {
        ProfileArg::Idle => Profile::Idle,
        ProfileArg::Desktop => Profile::Desktop,
        ProfileArg::ThreeD => Profile::ThreeD,
        ProfileArg::Video => Profile::Video,
        ProfileArg::Compute => Profile::Compute,
    }
}

fn type_name(ty: VgpuType) -> String {
    let id = type_id(ty);
    format!("{}+{}", id.aperture_mib, id.hidden_mib)
}

fn link_name(l: Option<f64>) -> String {
    l.map_or_else(|| "unlimited".to_owned(), |g| format!("{g} Gbit/s"))
}

fn parse_link(s: &str) -> anyhow::Result<Option<f64>> {
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

/// The matrix a run covers.
#[derive(Debug, Clone, Serialize)]
struct Matrix {
    profiles: Vec<Profile>,
    types: Vec<String>,
    #[serde(skip)]
    vgpu_types: Vec<VgpuType>,
    policies: Vec<Policy>,
    links: Vec<Option<f64>>,
    reps: usize,
    threads: usize,
    seed: u64,
    ram_mib: Option<u64>,
    small_workload: bool,
    sync_precopy: bool,
    touch_memory: bool,
    /// Extra (profile, type, policy, link) cases beyond the cross product.
    #[serde(skip)]
    extra: Vec<(Profile, VgpuType, Policy, Option<f64>)>,
}

impl Matrix {
    fn from_common(
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
        let threads = c.threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
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
            sync_precopy: c.sync_precopy,
            touch_memory: !c.untouched_memory,
            extra: Vec::new(),
        })
    }

    fn cases(&self) -> Vec<(Profile, VgpuType, Policy, Option<f64>)> {
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

    fn case(&self, profile: Profile, ty: VgpuType, policy: Policy, link: Option<f64>) -> BenchCase {
        let mut c = BenchCase::new(profile, ty, policy, link);
        c.seed = self.seed;
        c.hash_threads = self.threads;
        c.ram_bytes = self.ram_mib.map(|m| m << 20);
        c.sync_precopy = self.sync_precopy;
        c.touch_memory = self.touch_memory;
        if self.small_workload {
            c.workload = WorkloadConfig::small();
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
    /// Whether the switch-over waited for the destination to apply the pre-copy stream.
    pub sync_precopy: bool,
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
    /// Zero-page markers among the page records (median).
    pub zero_pages: u64,
    /// Bytes on the wire while running (median).
    pub bytes_precopy: u64,
    /// Bytes on the wire in downtime (median).
    pub bytes_stop_copy: u64,
    /// Whether narrowing widened to every page in any repetition.
    pub widened: bool,
    /// Plain read bandwidth of the guest memory, GB/s (median).
    pub read_gbps: f64,
    /// Link term of the lower bound, ms (median).
    pub bound_link_ms: f64,
    /// Memory term of the lower bound, ms (median).
    pub bound_hash_ms: f64,
    /// Lower bound on downtime, ms (median).
    pub bound_ms: f64,
    /// Downtime over its lower bound (median of the per-repetition ratios).
    pub downtime_over_bound: f64,
}

fn median(v: &[f64]) -> f64 {
    Summary::of(v).map_or(0.0, |s| s.p50)
}

fn median_u(v: impl Iterator<Item = u64>) -> u64 {
    let mut v: Vec<u64> = v.collect();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

fn row_of(case: &BenchCase, samples: &[BenchSample]) -> anyhow::Result<Row> {
    let f = |g: fn(&BenchSample) -> f64| samples.iter().map(g).collect::<Vec<f64>>();
    let u = |g: fn(&BenchSample) -> u64| median_u(samples.iter().map(g));
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
        sync_precopy: case.sync_precopy,
        downtime_ms,
        downtime_samples_ms: downtimes,
        total_ms,
        precopy_ms: median(&f(|s| s.report.precopy_ms)),
        quiesce_ms: median(&f(|s| s.report.quiesce_ms)),
        hash_ms: median(&f(|s| s.report.hash_ms)),
        transfer_ms: median(&f(|s| s.report.transfer_ms)),
        restore_ms: median(&f(|s| s.report.restore_ms)),
        remap_ms: median(&f(|s| s.report.remap_ms)),
        pages_precopy: u(|s| s.report.pages_precopy),
        pages_stop_copy: u(|s| s.report.pages_stop_copy),
        pages_total: u(|s| s.report.pages_total),
        pages_rehashed: u(|s| s.report.pages_rehashed),
        zero_pages: u(|s| s.report.zero_pages),
        bytes_precopy: u(|s| s.report.bytes_precopy),
        bytes_stop_copy: u(|s| s.report.bytes_stop_copy),
        widened: samples.iter().any(|s| s.report.widened),
        read_gbps: median(&f(|s| s.read_gbps)),
        bound_link_ms: median(&f(|s| s.bound_link_ms)),
        bound_hash_ms: median(&f(|s| s.bound_hash_ms)),
        bound_ms: median(&f(|s| s.bound_ms)),
        downtime_over_bound: median(&ratios),
    })
}

fn run_matrix(m: &Matrix) -> anyhow::Result<Vec<Row>> {
    let cases = m.cases();
    let mut rows = Vec::with_capacity(cases.len());
    for (i, (profile, ty, policy, link)) in cases.iter().copied().enumerate() {
        let case = m.case(profile, ty, policy, link);
        let mut samples = Vec::with_capacity(m.reps);
        for rep in 0..m.reps {
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
            "[{}/{}] {:<8} {:<9} {:<16} {:<10} downtime p50 {:>9.2} ms  ({} pages in downtime)",
            i + 1,
            cases.len(),
            row.profile,
            row.vgpu_type,
            row.policy,
            link_name(link),
            row.downtime_ms.p50,
            row.pages_stop_copy
        );
        rows.push(row);
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------------
// Targets
// ---------------------------------------------------------------------------------------------

/// One of the targets, judged on this run's rows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    /// What the target asks.
    pub target: String,
    /// `true`/`false` when the rows judge it, `null` when the matrix lacks the rows.
    pub met: Option<bool>,
    /// The figures behind the verdict.
    pub detail: String,
}

fn find<'a>(
    rows: &'a [Row],
    profile: &str,
    ty: &str,
    policy: &str,
    link: Option<f64>,
) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.profile == profile && r.vgpu_type == ty && r.policy == policy && r.link_gbps == link
    })
}

/// Stop-copy page reduction of `policy` against stop-and-copy, per (profile, type, link) where
/// both ran: `(profile, type, link, percent)`.
fn reductions(rows: &[Row], policy: &str) -> Vec<(String, String, Option<f64>, f64)> {
    rows.iter()
        .filter(|r| r.policy == policy)
        .filter_map(|r| {
            let base = find(rows, &r.profile, &r.vgpu_type, "stop-and-copy", r.link_gbps)?;
            (base.pages_stop_copy > 0).then(|| {
                (
                    r.profile.clone(),
                    r.vgpu_type.clone(),
                    r.link_gbps,
                    100.0 * (1.0 - r.pages_stop_copy as f64 / base.pages_stop_copy as f64),
                )
            })
        })
        .collect()
}

fn judge(rows: &[Row]) -> Vec<Target> {
    let mut out = Vec::new();
    let t1 = find(rows, "desktop", "64+384", "one-shot-narrow", Some(10.0));
    out.push(Target {
        target: "one-shot-narrow, desktop, 64+384, 10 Gbit/s: downtime <= 12 ms".into(),
        met: t1.map(|r| r.downtime_ms.p50 <= 12.0),
        detail: t1.map_or_else(
            || "not in this matrix".into(),
            |r| {
                format!(
                    "p50 {:.2} ms, p95 {:.2} ms, max {:.2} ms",
                    r.downtime_ms.p50, r.downtime_ms.p95, r.downtime_ms.max
                )
            },
        ),
    });

    let red = reductions(rows, "one-shot-narrow");
    let mut detail = String::new();
    let mut met = None;
    let mut profiles: Vec<&str> = red.iter().map(|r| r.0.as_str()).collect();
    profiles.dedup();
    for p in BTreeSet::from_iter(profiles) {
        let worst = red
            .iter()
            .filter(|r| r.0 == p)
            .map(|r| r.3)
            .fold(f64::INFINITY, f64::min);
        let need = if p == "desktop" { 95.0 } else { 80.0 };
        met = Some(met.unwrap_or(true) && worst >= need);
        let _ = write!(detail, "{p} {worst:.1}% (need {need}%); ");
    }
    out.push(Target {
        target: "one-shot-narrow: >= 80% fewer stop-copy pages than stop-and-copy for every \
                 profile, >= 95% for desktop"
            .into(),
        met,
        detail: if detail.is_empty() {
            "no profile ran both policies".into()
        } else {
            format!(
                "worst over types and links: {}",
                detail.trim_end_matches("; ")
            )
        },
    });

    let oneshot: Vec<&Row> = rows
        .iter()
        .filter(|r| r.policy == "one-shot" && r.downtime_over_bound.is_finite())
        .collect();
    let worst = oneshot
        .iter()
        .copied()
        .max_by(|a, b| a.downtime_over_bound.total_cmp(&b.downtime_over_bound));
    let best = oneshot
        .iter()
        .copied()
        .min_by(|a, b| a.downtime_over_bound.total_cmp(&b.downtime_over_bound));
    out.push(Target {
        target: "full-hash one-shot: downtime within 1.25x of its lower bound".into(),
        met: worst.map(|r| r.downtime_over_bound <= 1.25),
        detail: match (worst, best) {
            (Some(w), Some(b)) => format!(
                "worst {:.2}x ({} {} {}), best {:.2}x ({} {} {}); {} rows",
                w.downtime_over_bound,
                w.profile,
                w.vgpu_type,
                link_name(w.link_gbps),
                b.downtime_over_bound,
                b.profile,
                b.vgpu_type,
                link_name(b.link_gbps),
                oneshot.len()
            ),
            _ => "no one-shot rows".into(),
        },
    });

    let mut pairs = Vec::new();
    for small in rows.iter().filter(|r| {
        r.profile == "desktop" && r.policy == "one-shot-narrow" && r.vgpu_type == "64+384"
    }) {
        if let Some(big) = find(
            rows,
            "desktop",
            "512+2048",
            "one-shot-narrow",
            small.link_gbps,
        ) {
            pairs.push((small.link_gbps, big.downtime_ms.p50 / small.downtime_ms.p50));
        }
    }
    out.push(Target {
        target: "one-shot-narrow, desktop: 512+2048 downtime within 2x of 64+384".into(),
        met: (!pairs.is_empty()).then(|| pairs.iter().all(|p| p.1 <= 2.0)),
        detail: if pairs.is_empty() {
            "not in this matrix".into()
        } else {
            pairs
                .iter()
                .map(|(l, r)| format!("{}: {r:.2}x", link_name(*l)))
                .collect::<Vec<_>>()
                .join(", ")
        },
    });
    out
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

fn markdown_table(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str(
        "| profile | vGPU | policy | link | downtime p50 / p95 / max (ms) | total (ms) | pages pre / stop | MiB pre / stop | re-hashed | hash (ms) | remap (ms) | read GB/s | bound (ms) | downtime / bound |\n",
    );
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} / {:.2} / {:.2} | {:.0} | {} / {} | {:.1} / {:.2} | {}{} | {:.2} | {:.2} | {:.1} | {:.2} | {} |",
            r.profile,
            r.vgpu_type,
            r.policy,
            link_name(r.link_gbps),
            r.downtime_ms.p50,
            r.downtime_ms.p95,
            r.downtime_ms.max,
            r.total_ms.p50,
            r.pages_precopy,
            r.pages_stop_copy,
            mib(r.bytes_precopy),
            mib(r.bytes_stop_copy),
            r.pages_rehashed,
            if r.widened { " (widened)" } else { "" },
            r.hash_ms,
            r.remap_ms,
            r.read_gbps,
            r.bound_ms,
            if r.downtime_over_bound.is_finite() {
                format!("{:.2}", r.downtime_over_bound)
            } else {
                "-".into()
            },
        );
    }
    s
}

fn markdown_targets(targets: &[Target]) -> String {
    let mut s = String::from("| target | met | figures |\n|---|---|---|\n");
    for t in targets {
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "n/a",
        };
        let _ = writeln!(s, "| {} | {met} | {} |", t.target, t.detail);
    }
    s
}

fn machine() -> serde_json::Value {
    serde_json::json!({
        "cpus": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "gmig_version": env!("CARGO_PKG_VERSION"),
    })
}

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// Run `gmig bench migrate`.
pub fn migrate(args: &BenchMigrateArgs, json: bool) -> Result<(), Failure> {
    let c = &args.common;
    let policies: Vec<Policy> = if args.policies.is_empty() {
        if args.quick {
            vec![Policy::StopAndCopy, Policy::OneShot, Policy::OneShotNarrow]
        } else {
            Policy::ALL.to_vec()
        }
    } else {
        args.policies.iter().map(|p| policy_of(*p)).collect()
    };
    let m = if args.quick {
        let mut m = Matrix::from_common(
            c,
            policies,
            Profile::ALL.to_vec(),
            vec![VgpuType::V5_8],
            vec![Some(10.0)],
            3,
        )?;
        // The size-scaling target's other end, when the filters leave it in.
        if c.types.is_empty()
            && m.profiles.contains(&Profile::Desktop)
            && m.policies.contains(&Policy::OneShotNarrow)
        {
            for &l in &m.links.clone() {
                m.extra
                    .push((Profile::Desktop, VgpuType::V5_1, Policy::OneShotNarrow, l));
            }
        }
        m
    } else {
        Matrix::from_common(
            c,
            policies,
            Profile::ALL.to_vec(),
            VgpuType::ALL.to_vec(),
            vec![None, Some(25.0), Some(10.0), Some(1.0)],
            3,
        )?
    };
    let rows = run_matrix(&m)?;
    let targets = judge(&rows);
    let doc = serde_json::json!({
        "command": command_line(),
        "machine": machine(),
        "matrix": m,
        "rows": rows,
        "targets": targets,
    });
    let md = format!("{}\n{}", markdown_table(&rows), markdown_targets(&targets));
    if let Some(dir) = &c.out {
        write_out(dir, "migrate", &doc, &md)?;
        plot_by_policy(&dir.join("downtime-by-policy.svg"), &rows)?;
        plot_by_size(&dir.join("downtime-by-size.svg"), &rows)?;
    }
    if json {
        println!("{doc}");
    } else {
        print!("{md}");
    }
    Ok(())
}

fn write_out(dir: &Path, stem: &str, doc: &serde_json::Value, md: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let j = dir.join(format!("{stem}.json"));
    std::fs::write(&j, serde_json::to_string_pretty(doc)? + "\n")
        .with_context(|| format!("writing {}", j.display()))?;
    let p = dir.join(format!("{stem}.md"));
    let text = format!("<!-- {} -->\n{md}", command_line());
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// gMig comparison
// ---------------------------------------------------------------------------------------------

/// One profile of the paper comparison.
#[derive(Debug, Clone, Serialize)]
struct PaperRow {
    profile: String,
    /// Without software dirty pages nothing GPU-written can be told clean: every page goes in
    /// downtime (stop-and-copy).
    without_dirty_ms: f64,
    /// gMig: one-shot pre-copy, full re-hash.
    one_shot_ms: f64,
    /// Ours: one-shot pre-copy, narrowed re-hash.
    narrow_ms: f64,
    pages_without: u64,
    pages_one_shot: u64,
    pages_narrow: u64,
    spared_one_shot_pct: f64,
    spared_narrow_pct: f64,
}

/// Run `gmig bench paper`.
pub fn paper(args: &BenchPaperArgs, json: bool) -> Result<(), Failure> {
    let c = &args.common;
    let m = Matrix::from_common(
        c,
        vec![Policy::StopAndCopy, Policy::OneShot, Policy::OneShotNarrow],
        Profile::ALL.to_vec(),
        vec![VgpuType::V5_8],
        vec![Some(10.0)],
        3,
    )?;
    let rows = run_matrix(&m)?;
    let mut table = Vec::new();
    for r in rows.iter().filter(|r| r.policy == "stop-and-copy") {
        let get = |p: &str| find(&rows, &r.profile, &r.vgpu_type, p, r.link_gbps);
        let (Some(os), Some(nw)) = (get("one-shot"), get("one-shot-narrow")) else {
            continue;
        };
        let spared = |x: &Row| {
            if r.pages_stop_copy == 0 {
                0.0
            } else {
                100.0 * (1.0 - x.pages_stop_copy as f64 / r.pages_stop_copy as f64)
            }
        };
        let label = if m.types.len() > 1 || m.links.len() > 1 {
            format!(
                "{} ({}, {})",
                r.profile,
                r.vgpu_type,
                link_name(r.link_gbps)
            )
        } else {
            r.profile.clone()
        };
        table.push(PaperRow {
            profile: label,
            without_dirty_ms: r.downtime_ms.p50,
            one_shot_ms: os.downtime_ms.p50,
            narrow_ms: nw.downtime_ms.p50,
            pages_without: r.pages_stop_copy,
            pages_one_shot: os.pages_stop_copy,
            pages_narrow: nw.pages_stop_copy,
            spared_one_shot_pct: spared(os),
            spared_narrow_pct: spared(nw),
        });
    }
    if table.is_empty() {
        return Err(anyhow!("no profile ran all three policies").into());
    }
    let n = table.len() as f64;
    let avg = |g: fn(&PaperRow) -> f64| table.iter().map(g).sum::<f64>() / n;
    let average = serde_json::json!({
        "without_dirty_ms": avg(|r| r.without_dirty_ms),
        "one_shot_ms": avg(|r| r.one_shot_ms),
        "narrow_ms": avg(|r| r.narrow_ms),
        "spared_one_shot_pct": avg(|r| r.spared_one_shot_pct),
        "spared_narrow_pct": avg(|r| r.spared_narrow_pct),
    });
    let mut md = String::new();
    let _ = writeln!(
        md,
        "vGPU {}, link {}, {} repetitions, downtime p50 per profile.\n",
        m.types.join(", "),
        m.links
            .iter()
            .map(|l| link_name(*l))
            .collect::<Vec<_>>()
            .join(", "),
        m.reps
    );
    md.push_str("| profile | downtime without sw dirty pages (ms) | gMig one-shot (ms) | gmig one-shot-narrow (ms) | pages in downtime: without / one-shot / narrow | spared: one-shot / narrow |\n|---|---|---|---|---|---|\n");
    for r in &table {
        let _ = writeln!(
            md,
            "| {} | {:.2} | {:.2} | {:.2} | {} / {} / {} | {:.1}% / {:.1}% |",
            r.profile,
            r.without_dirty_ms,
            r.one_shot_ms,
            r.narrow_ms,
            r.pages_without,
            r.pages_one_shot,
            r.pages_narrow,
            r.spared_one_shot_pct,
            r.spared_narrow_pct
        );
    }
    let _ = writeln!(
        md,
        "| **average** | {:.2} | {:.2} | {:.2} | | {:.1}% / {:.1}% |",
        avg(|r| r.without_dirty_ms),
        avg(|r| r.one_shot_ms),
        avg(|r| r.narrow_ms),
        avg(|r| r.spared_one_shot_pct),
        avg(|r| r.spared_narrow_pct)
    );
    let _ = writeln!(
        md,
        "| *gMig paper (VEE'18)* | | {PAPER_WINDOWS_MS:.0} (Windows), {PAPER_LINUX_MS:.0} (Linux) | | | {PAPER_SPARED_PCT:.0}% |"
    );
    let _ = writeln!(
        md,
        "\nAverage downtime: gMig-style one-shot {:.2} ms = {:.3} of the paper's Linux figure; \
         one-shot-narrow {:.2} ms = {:.3} of it. Pages spared in downtime: {:.1}% (one-shot), \
         {:.1}% (narrow) against the paper's {PAPER_SPARED_PCT:.0}%.",
        avg(|r| r.one_shot_ms),
        avg(|r| r.one_shot_ms) / PAPER_LINUX_MS,
        avg(|r| r.narrow_ms),
        avg(|r| r.narrow_ms) / PAPER_LINUX_MS,
        avg(|r| r.spared_one_shot_pct),
        avg(|r| r.spared_narrow_pct),
    );
    let doc = serde_json::json!({
        "command": command_line(),
        "machine": machine(),
        "matrix": m,
        "profiles": table,
        "average": average,
        "paper": {
            "windows_downtime_ms": PAPER_WINDOWS_MS,
            "linux_downtime_ms": PAPER_LINUX_MS,
            "spared_pct": PAPER_SPARED_PCT,
        },
        "rows": rows,
    });
    if let Some(dir) = &c.out {
        write_out(dir, "paper", &doc, &md)?;
    }
    if json {
        println!("{doc}");
    } else {
        print!("{md}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Plots
// ---------------------------------------------------------------------------------------------

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

fn policy_order(rows: &[&Row]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in Policy::ALL {
        if rows.iter().any(|r| r.policy == p.name()) {
            out.push(p.name().to_owned());
        }
    }
    out
}

/// The (type, link) slice the plots show: 64+384 and 10 Gbit/s when present, else the first
/// row's.
fn plot_slice(rows: &[Row]) -> Option<(String, Option<f64>)> {
    if rows
        .iter()
        .any(|r| r.vgpu_type == "64+384" && r.link_gbps == Some(10.0))
    {
        return Some(("64+384".into(), Some(10.0)));
    }
    rows.first().map(|r| (r.vgpu_type.clone(), r.link_gbps))
}

fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if hi <= 0.0 {
        return (0.1, 10.0);
    }
    (lo / 2.0, hi * 2.0)
}

/// Grouped bars: downtime p50 per profile, one bar per policy (log scale).
fn plot_by_policy(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let Some((ty, link)) = plot_slice(rows) else {
        return Ok(());
    };
    let sel: Vec<&Row> = rows
        .iter()
        .filter(|r| r.vgpu_type == ty && r.link_gbps == link)
        .collect();
    let mut profiles: Vec<String> = Vec::new();
    for r in &sel {
        if !profiles.contains(&r.profile) {
            profiles.push(r.profile.clone());
        }
    }
    let policies = policy_order(&sel);
    let (lo, hi) = log_range(sel.iter().map(|r| r.downtime_ms.p50));
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Downtime by policy and profile (vGPU {ty}, {})",
                link_name(link)
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..profiles.len() as f64, (lo..hi).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("downtime p50 (ms, log)")
        .draw()
        .map_err(plot_err)?;
    let width = 0.8 / policies.len().max(1) as f64;
    for (k, policy) in policies.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let bars: Vec<_> = profiles
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let r = sel
                    .iter()
                    .find(|r| &r.profile == p && &r.policy == policy)?;
                let x0 = i as f64 + 0.1 + k as f64 * width;
                Some(Rectangle::new(
                    [(x0, lo), (x0 + width * 0.9, r.downtime_ms.p50.max(lo))],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(plot_err)?
            .label(policy.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    for (i, p) in profiles.iter().enumerate() {
        let (x, y) = chart.plotting_area().map_coordinate(&(i as f64 + 0.5, lo));
        root.draw(&Text::new(
            p.clone(),
            (x - 4 * i32::try_from(p.len()).unwrap_or(0), y + 8),
            ("sans-serif", 15),
        ))
        .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// Lines: desktop downtime p50 against vGPU graphics-memory size, one line per policy.
fn plot_by_size(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let link = if rows
        .iter()
        .any(|r| r.profile == "desktop" && r.link_gbps == Some(10.0))
    {
        Some(10.0)
    } else {
        match rows.iter().find(|r| r.profile == "desktop") {
            Some(r) => r.link_gbps,
            None => return Ok(()),
        }
    };
    let sel: Vec<&Row> = rows
        .iter()
        .filter(|r| r.profile == "desktop" && r.link_gbps == link)
        .collect();
    let policies = policy_order(&sel);
    let (lo, hi) = log_range(sel.iter().map(|r| r.downtime_ms.p50));
    let xmax = sel.iter().map(|r| r.vgpu_mib).max().unwrap_or(2560) as f64 * 1.08;
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Downtime against vGPU size (desktop, {})", link_name(link)),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..xmax, (lo..hi).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("vGPU graphics memory (MiB)")
        .y_desc("downtime p50 (ms, log)")
        .draw()
        .map_err(plot_err)?;
    for (k, policy) in policies.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let mut pts: Vec<(f64, f64)> = sel
            .iter()
            .filter(|r| &r.policy == policy)
            .map(|r| (r.vgpu_mib as f64, r.downtime_ms.p50.max(lo)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(plot_err)?
            .label(policy.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            .map_err(plot_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_parse() {
        assert_eq!(parse_link("unlimited").unwrap(), None);
        assert_eq!(parse_link("10").unwrap(), Some(10.0));
        assert_eq!(parse_link("2.5").unwrap(), Some(2.5));
        assert!(parse_link("0").is_err());
        assert!(parse_link("fast").is_err());
        assert!(parse_link("-1").is_err());
    }
}
