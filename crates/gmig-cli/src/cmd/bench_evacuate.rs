//! `gmig bench evacuate`: host evacuations of 1 to 7 whole KVM guests at once over one shared
//! link ([`crate::bench::evacuate`]), one per VM count and link, as a table and JSON.

use std::fmt::Write as _;

use anyhow::anyhow;
use gmig_vmm::migrate::Options;
use gmig_vmm::GuestProfile;
use serde::Serialize;

use super::bench_matrix::{link_name, median, parse_link};
use super::bench_report::{command_line, machine, write_out};
use crate::bench::evacuate::{evacuate as run_one, Baselines, Evacuation, EvacuationCase, MAX_VMS};
use crate::bench::{CpuList, Pinning};
use crate::cli::{BenchEvacuateArgs, DirtyLogArg, OnOff};
use crate::exit::Failure;

/// One VM count on one link, over its repetitions (medians unless said).
#[derive(Debug, Clone, Serialize)]
pub struct EvacuationRow {
    /// VMs moved at once.
    pub vms: usize,
    /// The shared link, Gbit/s (`null`: unlimited).
    pub link_gbps: Option<f64>,
    /// Repetitions.
    pub reps: usize,
    /// Every VM's downtime in every repetition, ms (source vCPU paused → destination
    /// acknowledged).
    pub downtime_samples_ms: Vec<f64>,
    /// The largest of them in each repetition, median, ms.
    pub max_downtime_ms: f64,
    /// The median VM's downtime, ms.
    pub downtime_p50_ms: f64,
    /// `max_downtime_ms` over the one-VM evacuation's downtime on the same link (`null` when
    /// the run had no one-VM row).
    pub max_downtime_over_solo: Option<f64>,
    /// The largest gap any guest saw over its whole run, ms, and the largest in the unmigrated
    /// runs.
    pub guest_max_gap_ms: f64,
    /// See `guest_max_gap_ms`.
    pub unmigrated_max_gap_ms: f64,
    /// First migration started → last VM running on its destination, ms.
    pub total_ms: f64,
    /// Bytes on the link, all VMs.
    pub link_bytes: u64,
    /// What the link carried over the evacuation, Gbit/s, and its share of the link's rate.
    pub link_used_gbps: f64,
    /// See `link_used_gbps` (`null` when unlimited).
    pub link_share: Option<f64>,
    /// `link_bytes` at the link's rate, ms (`null` when unlimited).
    pub link_bound_ms: Option<f64>,
    /// The budget for `total_ms`: 1.25 × `link_bound_ms` plus the one-VM evacuation's
    /// total time on the same link (the slowest VM's own convergence); `null` without both.
    pub total_budget_ms: Option<f64>,
    /// VMs (over all repetitions) whose guest finished during pre-copy, leaving its destination
    /// nothing to run (more `--frames` avoids it).
    pub finished_in_precopy: usize,
    /// Every VM of every repetition identical to its unmigrated run.
    pub identical: bool,
}

fn pinning(a: &BenchEvacuateArgs) -> anyhow::Result<Option<Pinning>> {
    match (&a.source_cpus, &a.dest_cpus) {
        (Some(s), Some(d)) => {
            let source = CpuList::parse(s).map_err(|e| anyhow!("--source-cpus: {e}"))?;
            let dest = CpuList::parse(d).map_err(|e| anyhow!("--dest-cpus: {e}"))?;
            Ok(Some(Pinning::new(source, dest).map_err(|e| anyhow!(e))?))
        }
        _ => Ok(None),
    }
}

fn row_of(vms: usize, link: Option<f64>, runs: &[Evacuation]) -> EvacuationRow {
    let per = |g: &dyn Fn(&Evacuation) -> f64| median(&runs.iter().map(g).collect::<Vec<_>>());
    let samples: Vec<f64> = runs
        .iter()
        .flat_map(|e| e.each.iter().map(|v| v.migration.downtime_ms))
        .collect();
    let max_of = |e: &Evacuation, g: fn(&crate::bench::evacuate::EvacuatedVm) -> f64| {
        e.each.iter().map(g).fold(0.0, f64::max)
    };
    EvacuationRow {
        vms,
        link_gbps: link,
        reps: runs.len(),
        max_downtime_ms: per(&|e| max_of(e, |v| v.migration.downtime_ms)),
        downtime_p50_ms: median(&samples),
        downtime_samples_ms: samples,
        max_downtime_over_solo: None,
        guest_max_gap_ms: per(&|e| max_of(e, |v| v.guest_max_gap_ms)),
        unmigrated_max_gap_ms: per(&|e| max_of(e, |v| v.unmigrated_max_gap_ms)),
        total_ms: per(&|e| e.total_ms),
        link_bytes: runs.first().map_or(0, |e| e.link_bytes),
        link_used_gbps: per(&|e| e.link_used_gbps),
        link_share: link.map(|_| per(&|e| e.link_share.unwrap_or(0.0))),
        link_bound_ms: link.map(|_| per(&|e| e.link_bound_ms.unwrap_or(0.0))),
        total_budget_ms: None,
        finished_in_precopy: runs
            .iter()
            .flat_map(|e| &e.each)
            .filter(|v| v.finished_in_precopy)
            .count(),
        identical: runs.iter().all(|e| e.identical),
    }
}

/// Run `gmig bench evacuate`.
pub fn evacuate(a: &BenchEvacuateArgs, json: bool) -> Result<(), Failure> {
    if a.reps == 0 {
        return Err(anyhow!("--reps must be at least 1").into());
    }
    let counts = if a.vms.is_empty() {
        vec![1, 2, 4, MAX_VMS]
    } else {
        a.vms.clone()
    };
    if let Some(bad) = counts.iter().find(|&&n| n == 0 || n > MAX_VMS) {
        return Err(anyhow!(
            "--vms {bad}: an evacuation moves 1 to {MAX_VMS} VMs (a 4 GiB GGTT holds {MAX_VMS} \
             vGPUs of the smallest type, 64+384 MiB)"
        )
        .into());
    }
    let links = if a.links.is_empty() {
        vec![Some(10.0), None]
    } else {
        a.links
            .iter()
            .map(|l| parse_link(l))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    if a.ram_mib == 0 || a.ram_mib.checked_mul(1 << 20).is_none() {
        return Err(anyhow!("--ram-mib must be at least 1 and fit in 64 bits of bytes").into());
    }
    super::bench_vm::check_guest(&a.guest)?;
    if !std::path::Path::new("/dev/kvm").exists() {
        return Err(
            anyhow!("/dev/kvm is absent: `gmig bench evacuate` runs real KVM guests").into(),
        );
    }
    let pinning = pinning(a)?;
    let base = EvacuationCase {
        vms: 1,
        link_gbps: None,
        guest: super::bench_vm::guest_config(&a.guest, GuestProfile::Desktop),
        ram_bytes: a.ram_mib << 20,
        at_frame: a.guest.at_frame,
        opts: Options {
            round_exits: a.round_exits,
            gpu_dirty: !a.x_no_gpu_dirty,
            ..Options::default()
        },
        vm: super::vm::vm_options(DirtyLogArg::Auto, OnOff::On),
        pinning,
    };
    let mut bases = Baselines::default();
    let mut rows: Vec<EvacuationRow> = Vec::new();
    let mut raw: Vec<Evacuation> = Vec::new();
    let total = links.len() * counts.len();
    for &link in &links {
        for &vms in &counts {
            let case = EvacuationCase {
                vms,
                link_gbps: link,
                ..base
            };
            let mut runs = Vec::with_capacity(a.reps);
            for rep in 0..a.reps {
                let e = run_one(&case, &mut bases).map_err(|e| {
                    anyhow!(
                        "{vms} VMs, {} (repetition {}): {e:#}",
                        link_name(link),
                        rep + 1
                    )
                })?;
                runs.push(e);
            }
            let row = row_of(vms, link, &runs);
            eprintln!(
                "[{}/{total}] {} VMs {:<11} downtime p50 {:.2} ms, max {:.2} ms; guest's largest gap {:.1} ms (unmigrated {:.1}); total {:.1} ms; link {:.2} Gbit/s{}; identical: {}",
                rows.len() + 1,
                vms,
                link_name(link),
                row.downtime_p50_ms,
                row.max_downtime_ms,
                row.guest_max_gap_ms,
                row.unmigrated_max_gap_ms,
                row.total_ms,
                row.link_used_gbps,
                row.link_share.map_or(String::new(), |s| format!(" ({:.0}% of it)", s * 100.0)),
                row.identical
            );
            if row.finished_in_precopy > 0 {
                eprintln!(
                    "  warning: {} guest(s) finished during pre-copy, leaving their destinations nothing to run (more --frames)",
                    row.finished_in_precopy
                );
            }
            rows.push(row);
            raw.extend(runs);
        }
    }
    // Against the one-VM evacuation on the same link.
    let solo: Vec<(Option<f64>, f64, f64)> = rows
        .iter()
        .filter(|r| r.vms == 1)
        .map(|r| (r.link_gbps, r.max_downtime_ms, r.total_ms))
        .collect();
    for r in &mut rows {
        if let Some((_, down, total)) = solo.iter().find(|s| s.0 == r.link_gbps) {
            r.max_downtime_over_solo = (*down > 0.0).then(|| r.max_downtime_ms / down);
            r.total_budget_ms = r.link_bound_ms.map(|b| 1.25 * b + total);
        }
    }
    let doc = serde_json::json!({
        "command": command_line(),
        "machine": machine(),
        "pinning": pinning,
        "guest": base.guest,
        "ram_mib": a.ram_mib,
        "at_frame": a.guest.at_frame,
        "rows": rows,
        "evacuations": raw,
    });
    let md = markdown(&rows);
    if let Some(dir) = &a.out {
        write_out(dir, "evacuate", &doc, &md)?;
    }
    if json {
        println!("{doc}");
    } else {
        print!("{md}");
    }
    if rows.iter().any(|r| !r.identical) {
        return Err(Failure::Check(
            "an evacuated guest differs from its unmigrated run".into(),
        ));
    }
    Ok(())
}

/// The rows as a Markdown table.
pub fn markdown(rows: &[EvacuationRow]) -> String {
    let mut s = String::new();
    s.push_str("| VMs | link | downtime p50 / max (ms) | max / solo | guest's largest gap, migrated / unmigrated (ms) | total (ms) | budget: 1.25 × link + solo total (ms) | link MiB | link used (Gbit/s, share) | identical |\n");
    s.push_str("|---:|---|---|---:|---|---:|---:|---:|---|---|\n");
    let opt = |x: Option<f64>, d: usize| x.map_or("-".to_owned(), |v| format!("{v:.d$}"));
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} / {:.2} | {} | {:.1} / {:.1} | {:.1} | {} | {:.1} | {:.2}{} | {} |",
            r.vms,
            link_name(r.link_gbps),
            r.downtime_p50_ms,
            r.max_downtime_ms,
            opt(r.max_downtime_over_solo, 2),
            r.guest_max_gap_ms,
            r.unmigrated_max_gap_ms,
            r.total_ms,
            opt(r.total_budget_ms, 1),
            r.link_bytes as f64 / f64::from(1u32 << 20),
            r.link_used_gbps,
            r.link_share
                .map_or(String::new(), |x| format!(" ({:.0}%)", x * 100.0)),
            if r.finished_in_precopy > 0 {
                format!(
                    "{} ({} finished in pre-copy)",
                    r.identical, r.finished_in_precopy
                )
            } else {
                r.identical.to_string()
            }
        );
    }
    s
}
