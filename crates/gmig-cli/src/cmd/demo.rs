//! `gmig demo`: migrate a vGPU running the desktop workload over loopback TCP, both ends in this
//! process, and report the downtime and whether the destination equals an unmigrated run.

use anyhow::Context;
use gmig_core::migration::Policy;
use gmig_vgpu::scenario::{run_loopback, Scenario, ScenarioReport};

use crate::cli::DemoArgs;
use crate::cmd::migrate::{policy_of, print_human, progress_bar};
use crate::exit::Failure;

/// Run `gmig demo`.
pub fn run(args: &DemoArgs, json: bool) -> Result<(), Failure> {
    let policies: Vec<Policy> = if args.compare {
        Policy::ALL.to_vec()
    } else {
        vec![policy_of(args.policy)]
    };
    let mut reports: Vec<ScenarioReport> = Vec::new();
    for policy in policies {
        let mut scenario = Scenario::demo(policy, args.seed);
        scenario.link_gbps = args.link_gbps;
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
        }
        println!("{obj}");
    } else {
        for r in &reports {
            print_human(r);
            println!();
        }
        if let Some(r) = reduction {
            println!(
                "{} sends {r:.1}% fewer pages in downtime than stop-and-copy",
                main.report.policy.name()
            );
        }
    }
    if reports.iter().all(|r| r.identical) {
        Ok(())
    } else {
        Err(Failure::Check(
            "the migrated vGPU's guest-visible state differs from the unmigrated run".into(),
        ))
    }
}
