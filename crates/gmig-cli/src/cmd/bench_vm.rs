//! `gmig bench vm`: whole-VM live migration of a real KVM guest, repeated over a matrix.
//!
//! Here guest RAM is not the vGPU's: the VMM (`gmig-vmm`) migrates it with iterative pre-copy
//! over KVM's dirty log joined with the vGPU's DMA log (the pages the GPU wrote behind KVM's
//! back), and the vGPU's own stream carries its state only. The guest's CPU rewrites
//! `--scratch-pages` of ordinary RAM every frame (its CPU dirty rate). Each repetition also runs
//! the guest unmigrated and checks the migrated run against it.

use std::fmt::Write as _;

use anyhow::anyhow;
use gmig_vmm::loopback::{loopback_with, LoopbackReport};
use gmig_vmm::migrate::Options;
use gmig_vmm::{GuestConfig, GuestProfile};
use serde::Serialize;

use super::bench_matrix::{link_name, median, median_u, parse_link};
use super::bench_report::{command_line, machine};
use crate::bench::Summary;
use crate::cli::{BenchGuestArgs, BenchVmArgs, DirtyLogArg, OnOff};
use crate::exit::Failure;

/// One case of the matrix, condensed over its repetitions (medians unless said).
#[derive(Debug, Clone, Serialize)]
pub struct VmRow {
    /// Guest program.
    pub profile: String,
    /// Guest RAM, MiB.
    pub ram_mib: u64,
    /// Link speed, Gbit/s (`null`: unlimited).
    pub link_gbps: Option<f64>,
    /// Repetitions.
    pub reps: usize,
    /// Guest RAM pages the guest's CPU rewrites per frame.
    pub scratch_pages: u32,
    /// How KVM's dirty log was read (`get`, `manual-protect`, `manual-protect+initially-set`).
    pub dirty_log_mode: String,
    /// Transparent huge pages asked for on guest RAM.
    pub thp: bool,
    /// Of the source's guest RAM, KiB mapped with huge pages when the migration started (median).
    pub ram_huge_kib: u64,
    /// Source vCPU paused → destination acknowledged.
    pub downtime_ms: Summary,
    /// Every repetition's downtime, ms.
    pub downtime_samples_ms: Vec<f64>,
    /// Source vCPU paused → destination vCPU runnable (one clock).
    pub dest_downtime_ms: f64,
    /// Downtime phases: the last dirty-log reads and RAM pages,
    pub ram_ms: f64,
    /// (of which reading and joining the two dirty logs)
    pub dirty_log_ms: f64,
    /// (of which reading KVM's)
    pub kvm_log_ms: f64,
    /// (and reading the vGPU's)
    pub gpu_log_ms: f64,
    /// The vGPU's STOP_COPY transition, beside KVM's log and pages (not a phase of its own).
    pub vgpu_stop_ms: f64,
    /// the vGPU's stop (its drain) and stop-copy data,
    pub vgpu_ms: f64,
    /// the vCPU, COM1 and configuration space,
    pub vcpu_ms: f64,
    /// the flush and the destination's restore up to its acknowledgement.
    pub transfer_ms: f64,
    /// and before all of these: waiting for the pre-copy round in flight at the pause.
    pub drain_ms: f64,
    /// The largest pause the guest saw in its wait loop (TSC), migrated run, ms.
    pub guest_max_gap_ms: f64,
    /// The same in the unmigrated run: the baseline.
    pub unmigrated_max_gap_ms: f64,
    /// Pre-copy rounds, the first full pass included.
    pub rounds: u64,
    /// RAM pages sent while the guest ran.
    pub precopy_pages: u64,
    /// RAM pages sent while it was paused.
    pub final_pages: u64,
    /// Of those, pages only the vGPU's DMA log reported.
    pub final_gpu_only_pages: u64,
    /// vGPU stop-copy bytes.
    pub device_stop_bytes: u64,
    /// Bytes on the wire.
    pub wire_bytes: u64,
    /// Whole migration, ms.
    pub total_ms: f64,
    /// Every migrated run equals its unmigrated run (serial output, RAM, exits).
    pub identical: bool,
}

fn row_of(
    profile: GuestProfile,
    ram_mib: u64,
    link: Option<f64>,
    scratch_pages: u32,
    thp: bool,
    runs: &[LoopbackReport],
) -> anyhow::Result<VmRow> {
    let m: Vec<_> = runs.iter().map(|r| r.migration).collect();
    let f = |g: fn(&gmig_vmm::migrate::Report) -> f64| m.iter().map(g).collect::<Vec<f64>>();
    let u = |g: fn(&gmig_vmm::migrate::Report) -> u64| median_u(m.iter().map(g));
    let samples = f(|r| r.downtime_ms);
    Ok(VmRow {
        profile: profile.name().to_owned(),
        ram_mib,
        link_gbps: link,
        reps: runs.len(),
        scratch_pages,
        dirty_log_mode: m
            .first()
            .map(|r| r.dirty_log_mode.name())
            .unwrap_or_default()
            .to_owned(),
        thp,
        ram_huge_kib: median_u(runs.iter().map(|r| r.ram_huge_kib)),
        downtime_ms: Summary::of(&samples).ok_or_else(|| anyhow!("no repetitions"))?,
        downtime_samples_ms: samples,
        dest_downtime_ms: median(&f(|r| r.dest_downtime_ms)),
        ram_ms: median(&f(|r| r.ram_ms)),
        dirty_log_ms: median(&f(|r| r.dirty_log_ms)),
        kvm_log_ms: median(&f(|r| r.kvm_log_ms)),
        gpu_log_ms: median(&f(|r| r.gpu_log_ms)),
        vgpu_stop_ms: median(&f(|r| r.vgpu_stop_ms)),
        vgpu_ms: median(&f(|r| r.vgpu_ms)),
        vcpu_ms: median(&f(|r| r.vcpu_ms)),
        transfer_ms: median(&f(|r| r.transfer_ms)),
        drain_ms: median(&f(|r| r.drain_ms)),
        guest_max_gap_ms: median(
            &runs
                .iter()
                .map(|r| r.guest_max_gap_us / 1e3)
                .collect::<Vec<_>>(),
        ),
        unmigrated_max_gap_ms: median(
            &runs
                .iter()
                .map(|r| r.unmigrated_max_gap_us / 1e3)
                .collect::<Vec<_>>(),
        ),
        rounds: u(|r| u64::from(r.rounds)),
        precopy_pages: u(|r| r.precopy_pages),
        final_pages: u(|r| r.final_pages),
        final_gpu_only_pages: u(|r| r.final_gpu_only_pages),
        device_stop_bytes: u(|r| r.device_stop_bytes),
        wire_bytes: u(|r| r.wire_bytes),
        total_ms: median(&f(|r| r.total_ms)),
        identical: runs.iter().all(|r| r.identical),
    })
}

/// Refuses guest arguments of `gmig bench vm` and `gmig bench evacuate` that cannot migrate:
/// the migration must start before the guest's last frame.
pub(super) fn check_guest(g: &BenchGuestArgs) -> anyhow::Result<()> {
    if g.at_frame >= u64::from(g.frames) {
        return Err(anyhow!("--at-frame must be below --frames"));
    }
    Ok(())
}

/// The guest `g` describes, running `profile`.
pub(super) fn guest_config(g: &BenchGuestArgs, profile: GuestProfile) -> GuestConfig {
    GuestConfig {
        profile,
        frames: g.frames,
        width: g.width,
        height: g.height,
        scratch_pages: g.scratch_pages,
        seed: g.seed,
    }
}

/// Run `gmig bench vm`.
pub fn vm(a: &BenchVmArgs, json: bool) -> Result<(), Failure> {
    if a.reps == 0 {
        return Err(anyhow!("--reps must be at least 1").into());
    }
    check_guest(&a.guest)?;
    let profiles = if a.profiles.is_empty() {
        GuestProfile::ALL.to_vec()
    } else {
        a.profiles
            .iter()
            .map(|p| {
                GuestProfile::from_name(p)
                    .ok_or_else(|| anyhow!("unknown guest profile `{p}` (desktop, compute)"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    let rams = if a.ram_mib.is_empty() {
        vec![64, 512]
    } else {
        a.ram_mib.clone()
    };
    if rams
        .iter()
        .any(|&m| m == 0 || m.checked_mul(1 << 20).is_none())
    {
        return Err(anyhow!("--ram-mib must be at least 1 and fit in 64 bits of bytes").into());
    }
    let links = if a.links.is_empty() {
        vec![None, Some(10.0)]
    } else {
        a.links
            .iter()
            .map(|l| parse_link(l))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    if !std::path::Path::new("/dev/kvm").exists() {
        return Err(anyhow!("/dev/kvm is absent: `gmig bench vm` runs a real KVM guest").into());
    }
    let modes = if a.dirty_log.is_empty() {
        vec![DirtyLogArg::Auto]
    } else {
        a.dirty_log.clone()
    };
    let thps = if a.thp.is_empty() {
        vec![OnOff::On]
    } else {
        a.thp.clone()
    };
    let mut rows = Vec::new();
    let total = profiles.len() * rams.len() * links.len() * modes.len() * thps.len();
    for &profile in &profiles {
        for &ram_mib in &rams {
            for &link in &links {
                for (&mode, &thp) in modes.iter().flat_map(|m| thps.iter().map(move |t| (m, t))) {
                    let row = vm_row(a, profile, ram_mib, link, mode, thp)?;
                    eprintln!(
                        "[{}/{total}] {:<8} {:>5} MiB  {:<11} {} thp {} downtime p50 {:7.2} ms (dirty log {:.2}: KVM's {:.2}, vGPU's {:.2}; {} RAM pages in downtime, {} only the vGPU's log had); guest's largest gap {:.1} ms (unmigrated {:.1})",
                        rows.len() + 1,
                        row.profile,
                        row.ram_mib,
                        link_name(row.link_gbps),
                        row.dirty_log_mode,
                        if row.thp { "on" } else { "off" },
                        row.downtime_ms.p50,
                        row.dirty_log_ms,
                        row.kvm_log_ms,
                        row.gpu_log_ms,
                        row.final_pages,
                        row.final_gpu_only_pages,
                        row.guest_max_gap_ms,
                        row.unmigrated_max_gap_ms
                    );
                    rows.push(row);
                }
            }
        }
    }
    if json {
        let v = serde_json::json!({
            "command": command_line(),
            "machine": machine(),
            "rows": rows,
        });
        println!("{v}");
    } else {
        print!("{}", markdown(&rows));
    }
    if rows.iter().any(|r| !r.identical) {
        return Err(Failure::Check(
            "a migrated guest differs from its unmigrated run".into(),
        ));
    }
    Ok(())
}

/// One row: `a.reps` loopback migrations of one case.
fn vm_row(
    a: &BenchVmArgs,
    profile: GuestProfile,
    ram_mib: u64,
    link: Option<f64>,
    mode: DirtyLogArg,
    thp: OnOff,
) -> anyhow::Result<VmRow> {
    let cfg = guest_config(&a.guest, profile);
    let opts = Options {
        round_exits: a.round_exits,
        link_gbps: link,
        overlap_stop: !a.x_no_overlap_stop,
        ..Options::default()
    };
    let vm = super::vm::vm_options(mode, thp);
    let mut runs = Vec::with_capacity(a.reps);
    for _ in 0..a.reps {
        let r = loopback_with(&cfg, ram_mib << 20, a.guest.at_frame, &opts, &vm)
            .map_err(|e| anyhow!("{} guest, {ram_mib} MiB: {e}", profile.name()))?;
        runs.push(r);
    }
    row_of(profile, ram_mib, link, a.guest.scratch_pages, vm.thp, &runs)
}

/// The rows as a Markdown table.
pub fn markdown(rows: &[VmRow]) -> String {
    let mut s = String::new();
    s.push_str("| profile | RAM MiB | link | dirty log | THP (huge MiB) | downtime p50 / p95 / max (ms) | dest view (ms) | RAM (dirty log: KVM, vGPU) | vGPU | vCPU | transfer | drain | rounds | pages pre / final (vGPU only) | guest's largest gap, migrated / unmigrated (ms) | identical |\n");
    s.push_str("|---|---:|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} ({}) | {:.2} / {:.2} / {:.2} | {:.2} | {:.2} ({:.2}: {:.2}, {:.2}) | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} / {} ({}) | {:.1} / {:.1} | {} |",
            r.profile,
            r.ram_mib,
            link_name(r.link_gbps),
            r.dirty_log_mode,
            if r.thp { "on" } else { "off" },
            r.ram_huge_kib >> 10,
            r.downtime_ms.p50,
            r.downtime_ms.p95,
            r.downtime_ms.max,
            r.dest_downtime_ms,
            r.ram_ms,
            r.dirty_log_ms,
            r.kvm_log_ms,
            r.gpu_log_ms,
            r.vgpu_ms,
            r.vcpu_ms,
            r.transfer_ms,
            r.drain_ms,
            r.rounds,
            r.precopy_pages,
            r.final_pages,
            r.final_gpu_only_pages,
            r.guest_max_gap_ms,
            r.unmigrated_max_gap_ms,
            r.identical
        );
    }
    s
}
