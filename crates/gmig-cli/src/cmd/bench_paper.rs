//! `gmig bench paper`: gmig's policies against the gMig paper's figures.

use super::bench_matrix::{
    link_name, run_matrix, Matrix, Row, PAPER_LINUX_MS, PAPER_SPARED_PCT, PAPER_WINDOWS_MS,
};
use super::bench_report::{command_line, find, machine, write_out};
use crate::cli::BenchPaperArgs;
use crate::exit::Failure;
use anyhow::anyhow;
use gmig_core::migration::Policy;
use gmig_vgpu::gm::VgpuType;
use gmig_vgpu::workload::Profile;
use serde::Serialize;
use std::fmt::Write as _;

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
    super::bench_matrix::check_rows(&rows)
}
