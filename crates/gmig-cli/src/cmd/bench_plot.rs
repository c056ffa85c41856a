//! SVG plots of a `gmig bench migrate` run.

use std::path::Path;

use anyhow::anyhow;
use gmig_core::migration::Policy;

use super::bench_matrix::{link_name, Row};

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
pub(crate) fn plot_by_policy(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
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
pub(crate) fn plot_by_size(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
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
