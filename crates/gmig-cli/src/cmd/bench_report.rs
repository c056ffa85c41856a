//! Judging a run against the issue targets, and writing its tables (markdown, JSON).

use super::bench_matrix::{link_name, Row};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

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

pub(crate) fn find<'a>(
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

/// One policy against one-shot-narrow on the same profile, vGPU type and link, in the same run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    /// Workload profile.
    pub profile: String,
    /// vGPU type.
    pub vgpu_type: String,
    /// Link speed in Gbit/s (`null`: unlimited).
    pub link_gbps: Option<f64>,
    /// The other policy (`iterative` is QEMU-like pre-copy rounds, `one-shot` the gMig paper's).
    pub policy: String,
    /// Its median downtime over one-shot-narrow's.
    pub downtime_ratio: f64,
    /// Its median whole-migration time over one-shot-narrow's.
    pub total_ratio: f64,
    /// Its stop-copy pages over one-shot-narrow's.
    pub stop_copy_pages_ratio: f64,
}

/// Every other policy of the run against one-shot-narrow, where both ran on the same profile,
/// type and link.
pub(crate) fn compare_policies(rows: &[Row]) -> Vec<Comparison> {
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    rows.iter()
        .filter(|r| r.policy != "one-shot-narrow")
        .filter_map(|r| {
            let base = find(
                rows,
                &r.profile,
                &r.vgpu_type,
                "one-shot-narrow",
                r.link_gbps,
            )?;
            Some(Comparison {
                profile: r.profile.clone(),
                vgpu_type: r.vgpu_type.clone(),
                link_gbps: r.link_gbps,
                policy: r.policy.clone(),
                downtime_ratio: ratio(r.downtime_ms.p50, base.downtime_ms.p50),
                total_ratio: ratio(r.total_ms.p50, base.total_ms.p50),
                stop_copy_pages_ratio: ratio(r.pages_stop_copy as f64, base.pages_stop_copy as f64),
            })
        })
        .collect()
}

/// The comparison as a markdown table (empty when the run had no pair to compare).
pub(crate) fn markdown_comparison(c: &[Comparison]) -> String {
    if c.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\nPolicies against one-shot-narrow, same run (ratios of medians; > 1: one-shot-narrow is better):\n\n\
         | profile | vGPU | link | policy | downtime | total | stop-copy pages |\n|---|---|---|---|---|---|---|\n",
    );
    for x in c {
        let name = match x.policy.as_str() {
            "iterative" => "iterative (QEMU-like)",
            "one-shot" => "one-shot (gMig paper)",
            other => other,
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2}× | {:.2}× | {:.2}× |",
            x.profile,
            x.vgpu_type,
            link_name(x.link_gbps),
            name,
            x.downtime_ratio,
            x.total_ratio,
            x.stop_copy_pages_ratio
        );
    }
    s
}

pub(crate) fn judge(rows: &[Row]) -> Vec<Target> {
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
        target: "one-shot-narrow, desktop: 512+2048 downtime within 1.5x of 64+384".into(),
        met: (!pairs.is_empty()).then(|| pairs.iter().all(|p| p.1 <= 1.5)),
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

    // The realistic desktop: 1080p, 64+384, 10 Gbit/s.
    let at_1080p = |policy: &str| {
        rows.iter().find(|r| {
            r.profile == "desktop"
                && r.vgpu_type == "64+384"
                && r.policy == policy
                && r.link_gbps == Some(10.0)
                && r.resolution == "1920x1080"
        })
    };
    let (narrow, stop) = (at_1080p("one-shot-narrow"), at_1080p("stop-and-copy"));
    out.push(Target {
        target: "one-shot-narrow, 1080p desktop, 64+384, 10 Gbit/s: downtime <= 15 ms and >= 90% \
                 fewer stop-copy pages than stop-and-copy"
            .into(),
        met: match (narrow, stop) {
            (Some(n), Some(s)) => Some(
                n.downtime_ms.p50 <= 15.0
                    && (n.pages_stop_copy as f64) <= 0.1 * s.pages_stop_copy as f64,
            ),
            _ => None,
        },
        detail: match (narrow, stop) {
            (Some(n), Some(s)) => format!(
                "{:.2} ms; {} vs {} stop-copy pages ({:.1}% fewer)",
                n.downtime_ms.p50,
                n.pages_stop_copy,
                s.pages_stop_copy,
                100.0 * (1.0 - n.pages_stop_copy as f64 / (s.pages_stop_copy.max(1)) as f64)
            ),
            _ => "needs desktop at --resolution 1080p, 64+384, 10 Gbit/s, one-shot-narrow and \
                  stop-and-copy"
                .into(),
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

pub(crate) fn markdown_table(rows: &[Row]) -> String {
    let mut s = String::new();
    s.push_str(
        "| profile | vGPU | policy | link | guest (pre-copy frames) | downtime p50 / p95 / max (ms) | split: quiesce + transfer + dest (catch-up + tail) + commit (ms) | switch-over wait (ms) | total (ms) | pages pre / stop | MiB pre / stop | re-hashed | verifications | hash (ms) | remap (ms) | read GB/s | bound (ms) | downtime / bound | identical |\n",
    );
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} ({}) | {:.2} / {:.2} / {:.2} | {:.2} + {:.2} + {:.2} ({:.2} + {:.2}) + {:.2} | {:.1} | {:.0} | {} / {} | {:.1} / {:.2} | {}{} | {} | {:.2} | {:.2} | {:.1} | {:.2} | {} | {} |",
            r.profile,
            r.vgpu_type,
            r.policy,
            link_name(r.link_gbps),
            r.guest_clock,
            r.precopy_frames,
            r.downtime_ms.p50,
            r.downtime_ms.p95,
            r.downtime_ms.max,
            r.quiesce_ms,
            r.transfer_ms,
            r.dest_finish_ms,
            r.dest_catch_up_ms,
            r.dest_tail_ms,
            r.commit_ms,
            r.switchover_wait_ms,
            r.total_ms.p50,
            r.pages_precopy,
            r.pages_stop_copy,
            mib(r.bytes_precopy),
            mib(r.bytes_stop_copy),
            r.pages_rehashed,
            if r.widened { " (widened)" } else { "" },
            r.verify_rounds,
            r.hash_ms,
            r.remap_ms,
            r.read_gbps,
            r.bound_ms,
            if r.downtime_over_bound.is_finite() {
                format!("{:.2}", r.downtime_over_bound)
            } else {
                "-".into()
            },
            match r.identical {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "-",
            },
        );
    }
    s
}

pub(crate) fn markdown_targets(targets: &[Target]) -> String {
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

pub(crate) fn machine() -> serde_json::Value {
    serde_json::json!({
        "cpus": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "gmig_version": env!("CARGO_PKG_VERSION"),
    })
}

pub(crate) fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

pub(crate) fn write_out(
    dir: &Path,
    stem: &str,
    doc: &serde_json::Value,
    md: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let j = dir.join(format!("{stem}.json"));
    std::fs::write(&j, serde_json::to_string_pretty(doc)? + "\n")
        .with_context(|| format!("writing {}", j.display()))?;
    let p = dir.join(format!("{stem}.md"));
    let text = format!("<!-- {} -->\n{md}", command_line());
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    Ok(())
}
