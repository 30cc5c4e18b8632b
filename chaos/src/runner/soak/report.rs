//! The soak report: `soak.json` (verdict, request counts by kind and
//! outcome, each series' slope and bound, the fault windows, the reloads,
//! every sample), `samples.csv` (one row a second) and `soak.svg` (each
//! judged series over time, the warm-up shaded, its fitted line drawn).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use serde::Serialize;

use super::faults::Window;
use super::reload::Reload;
use super::sampler::Sample;
use super::traffic::{Kind, Record};
use super::verdict::{self, Series};
use crate::runner::report::Assertion;

/// A whole soak.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    /// Every assertion held.
    pub passed: bool,
    /// Seconds of traffic.
    pub duration_s: f64,
    /// Seconds at the start the slopes leave out.
    pub warm_up_s: f64,
    /// Seconds from the start until the last job was drained.
    pub wall_time_s: f64,
    /// Whether reloads ran, and why not if they did not.
    pub reloads_enabled: bool,
    /// What `GET /admin/config` answered when asked.
    pub reload_probe: String,
    /// Requests sent per kind and outcome.
    pub counts: BTreeMap<Kind, BTreeMap<String, u64>>,
    /// The first requests that ended as they should not, with their times.
    pub unexpected: Vec<Record>,
    /// The sampled series, judged and not.
    pub series: Vec<Series>,
    /// The assertions.
    pub assertions: Vec<Assertion>,
    /// The faults as applied.
    pub faults: Vec<Window>,
    /// The reloads as done.
    pub reloads: Vec<Reload>,
    /// The limited tenant's admitted requests per second under each limit.
    pub limited_admitted_per_s: BTreeMap<u32, f64>,
    /// One sample a second.
    pub samples: Vec<Sample>,
}

/// Writes `soak.json`, `samples.csv` and `soak.svg` into `dir`.
pub fn write(report: &SoakReport, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("soak.json"), serde_json::to_string_pretty(report)?)?;
    std::fs::write(dir.join("samples.csv"), csv(&report.samples))?;
    chart(report, &dir.join("soak.svg")).context("drawing soak.svg")
}

/// The samples as CSV; an unread value is an empty cell.
pub fn csv(samples: &[Sample]) -> String {
    let cell = |v: Option<u64>| v.map_or_else(String::new, |v| v.to_string());
    let mut out = String::from(
        "t_s,levee_rss_kib,levee_fds,redis_used_memory,redis_keys,sim_rss_kib,sim_fds,requests\n",
    );
    for s in samples {
        let _ = writeln!(
            out,
            "{:.2},{},{},{},{},{},{},{}",
            s.t_s,
            cell(s.levee_rss_kib),
            cell(s.levee_fds),
            cell(s.redis_used_memory),
            cell(s.redis_keys),
            cell(s.sim_rss_kib),
            cell(s.sim_fds),
            s.requests
        );
    }
    out
}

/// One panel per judged series, stacked.
fn chart(report: &SoakReport, path: &Path) -> anyhow::Result<()> {
    let judged: Vec<&Series> = report
        .series
        .iter()
        .filter(|s| s.bound_per_min.is_some())
        .collect();
    let rows = judged.len().max(1);
    let root = SVGBackend::new(path, (960, 220 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    for (area, series) in root.split_evenly((rows, 1)).iter().zip(judged) {
        panel(area, report, series)?;
    }
    root.present().map_err(draw_error)?;
    Ok(())
}

/// One series: its samples, the warm-up shaded, the fitted line after it.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    report: &SoakReport,
    series: &Series,
) -> anyhow::Result<()> {
    let points: Vec<(f64, f64)> = report
        .samples
        .iter()
        .filter_map(|s| Some((s.t_s, verdict::value(s, &series.name)?)))
        .collect();
    let end = report.duration_s.max(1.0);
    let top = points.iter().map(|p| p.1).fold(1e-9, f64::max) * 1.15;
    let verdict = if series.passed { "ok" } else { "FAIL" };
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "{} ({}): slope {:+.3} {u}/min, bound {:.3} {u}/min, {verdict}",
                series.name,
                series.unit,
                series.slope_per_min,
                series.bound_per_min.unwrap_or(0.0),
                u = series.unit
            ),
            ("sans-serif", 15),
        )
        .margin(8)
        .x_label_area_size(25)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, 0.0..top)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .draw()
        .map_err(draw_error)?;
    let shade = RGBColor(220, 220, 220).mix(0.6);
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(0.0, 0.0), (report.warm_up_s, top)],
            shade.filled(),
        )))
        .map_err(draw_error)?;
    chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            BLUE.stroke_width(1),
        ))
        .map_err(draw_error)?;
    let fit = fitted(&points, report.warm_up_s, end);
    chart
        .draw_series(LineSeries::new(fit, RED.stroke_width(2)))
        .map_err(draw_error)?;
    Ok(())
}

/// The least-squares line through the points after `from`, from `from`
/// to `end`.
fn fitted(points: &[(f64, f64)], from: f64, end: f64) -> Vec<(f64, f64)> {
    let after: Vec<(f64, f64)> = points.iter().copied().filter(|p| p.0 >= from).collect();
    if after.is_empty() {
        return Vec::new();
    }
    let k = verdict::slope(&after);
    let n = after.len() as f64;
    let mx = after.iter().map(|p| p.0).sum::<f64>() / n;
    let my = after.iter().map(|p| p.1).sum::<f64>() / n;
    vec![(from, my + k * (from - mx)), (end, my + k * (end - mx))]
}

/// Plotters' errors carry the backend's type; the report only shows them.
fn draw_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_has_a_header_and_a_row_per_sample_with_empty_cells_for_gaps() {
        let s = Sample {
            t_s: 1.0,
            levee_rss_kib: Some(2048),
            levee_fds: None,
            redis_used_memory: Some(10),
            redis_keys: Some(3),
            sim_rss_kib: None,
            sim_fds: None,
            requests: 7,
            breakers_not_closed: Vec::new(),
        };
        let text = csv(&[s]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1], "1.00,2048,,10,3,,,7");
    }
}
