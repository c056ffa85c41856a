//! `gmig bench migrate` (the downtime matrix) and `gmig bench paper` (gMig's evaluation, our
//! profiles): run the cases, condense repetitions into rows, judge the targets, and write
//! Markdown, JSON and SVG plots.

use gmig_core::migration::Policy;
use gmig_vgpu::gm::VgpuType;
use gmig_vgpu::workload::Profile;

use super::bench_matrix::{check_rows, run_matrix, Matrix};
use super::bench_plot::{plot_by_policy, plot_by_size};
use super::bench_report::{
    command_line, compare_policies, judge, machine, markdown_comparison, markdown_table,
    markdown_targets, write_out,
};
use crate::cli::BenchMigrateArgs;
use crate::cmd::migrate::policy_of;
use crate::exit::Failure;

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
    let comparison = compare_policies(&rows);
    let doc = serde_json::json!({
        "command": command_line(),
        "machine": machine(),
        "matrix": m,
        "rows": rows,
        "comparison": comparison,
        "targets": targets,
    });
    let md = format!(
        "{}{}\n{}",
        markdown_table(&rows),
        markdown_comparison(&comparison),
        markdown_targets(&targets)
    );
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
    check_rows(&rows)
}
