//! `gmig demo`: where `/dev/kvm` exists, first live-migrate a whole KVM VM whose guest GPU driver
//! renders on the vGPU (both VMMs in this process, over loopback TCP); then migrate a vGPU running
//! the simulated desktop workload. Each reports its downtime and whether the destination equals an
//! unmigrated run.

use anyhow::Context;
use gmig_core::migration::Policy;
use gmig_vgpu::scenario::{run_loopback, GuestClock, Scenario, ScenarioReport};

use gmig_vmm::loopback::{loopback, LoopbackReport};
use gmig_vmm::migrate::Options;
use gmig_vmm::GuestConfig;

use crate::cli::DemoArgs;
use crate::cmd::migrate::{policy_of, print_human, progress_bar};
use crate::exit::Failure;

/// Run `gmig demo`.
pub fn run(args: &DemoArgs, json: bool) -> Result<(), Failure> {
    let vm = real_vm(args, json)?;
    let policies: Vec<Policy> = if args.compare {
        Policy::ALL.to_vec()
    } else {
        vec![policy_of(args.policy)]
    };
    let mut reports: Vec<ScenarioReport> = Vec::new();
    for policy in policies {
        let mut scenario = Scenario::demo(policy, args.seed);
        scenario.link_gbps = args.link_gbps;
        if args.batch_stepped {
            scenario.clock = GuestClock::Batches(8);
        }
        let (bar, mut progress) = progress_bar(json || args.compare);
        let report = run_loopback(&scenario, &mut progress)
            .with_context(|| format!("demo migration ({})", policy.name()))?;
        bar.finish_and_clear();
        reports.push(report);
    }
    let Some(main) = reports
        .iter()
        .find(|r| r.report.policy == policy_of(args.policy))
        .or(reports.first())
    else {
        return Err(Failure::Error(anyhow::anyhow!("no run")));
    };
    let baseline = reports
        .iter()
        .find(|r| r.report.policy == Policy::StopAndCopy)
        .map(|r| r.report.pages_stop_copy);
    let reduction = baseline
        .filter(|b| *b > 0)
        .map(|b| 100.0 * (1.0 - main.report.pages_stop_copy as f64 / b as f64));
    if json {
        let mut obj = serde_json::to_value(main).context("encoding the report")?;
        if let Some(map) = obj.as_object_mut() {
            if args.compare {
                map.insert(
                    "comparison".into(),
                    serde_json::to_value(&reports).context("encoding the comparison")?,
                );
            }
            if let Some(r) = reduction {
                map.insert("stop_copy_reduction_pct".into(), r.into());
            }
            if let Some(v) = &vm {
                map.insert(
                    "vm".into(),
                    serde_json::to_value(v).context("encoding the VM report")?,
                );
            }
        }
        println!("{obj}");
    } else {
        for r in &reports {
            print_human(r);
            println!(
                "destination ran {} frames / {} GPU workloads after the switch-over",
                r.destination_frames, r.destination_workloads
            );
            println!();
        }
        if let Some(r) = reduction {
            println!(
                "{} sends {r:.1}% fewer pages in downtime than stop-and-copy",
                main.report.policy.name()
            );
        }
    }
    if vm.as_ref().is_some_and(|v| !v.identical) {
        return Err(Failure::Check(
            "the migrated KVM guest finished differently from the unmigrated run".into(),
        ));
    }
    if let Some(r) = reports
        .iter()
        .find(|r| r.destination_frames == 0 || r.destination_workloads == 0)
    {
        return Err(Failure::Check(format!(
            "the simulated guest's destination did no work after the switch-over ({} frames, {} workloads): the comparison proves nothing",
            r.destination_frames, r.destination_workloads
        )));
    }
    if reports.iter().all(|r| r.identical) {
        Ok(())
    } else {
        Err(Failure::Check(
            "the migrated vGPU's guest-visible state differs from the unmigrated run".into(),
        ))
    }
}

/// The real-VM part: a 512 MiB KVM guest, pre-copy from frame 16 of 48, switch-over at frame 32.
fn real_vm(args: &DemoArgs, json: bool) -> Result<Option<LoopbackReport>, Failure> {
    if args.no_vm {
        return Ok(None);
    }
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("gmig demo: /dev/kvm is absent, so no real KVM guest: the simulated guest only");
        return Ok(None);
    }
    let cfg = GuestConfig {
        frames: 48,
        seed: args.seed,
        ..GuestConfig::default()
    };
    let opts = Options {
        round_exits: 64,
        link_gbps: args.link_gbps,
        ..Options::default()
    };
    let r = loopback(&cfg, 512 << 20, 16, &opts).context("the KVM guest's migration")?;
    if !json {
        println!("Real KVM guest: the guest GPU driver renders {} frames on the vGPU; pre-copy from frame {}, switch-over at frame {}", cfg.frames, r.at_frame, r.switch_frame);
        crate::cmd::vm::print_report(&r.migration);
        println!(
            "destination ran {} frames / {} GPU workloads after the switch-over",
            r.destination_frames, r.destination_workloads
        );
        println!(
            "the guest's largest pause: {:.1} ms migrated, {:.1} ms unmigrated (its own TSC, in its wait loop)",
            r.guest_max_gap_us / 1e3,
            r.unmigrated_max_gap_us / 1e3
        );
        println!(
            "destination: {}; identical to the unmigrated run: {}",
            r.checksum_line, r.identical
        );
        println!();
        println!("Simulated guest (the guest-driver model):");
    }
    Ok(Some(r))
}
