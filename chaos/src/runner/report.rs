//! The run report: per scenario a timeline (per 250 ms slice: counts by
//! status, p50 / p99 / max from an HDR histogram), the fault window, the
//! assertions with their measured values; written as JSON plus one SVG
//! chart per scenario.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use plotters::prelude::*;
use serde::Serialize;

use super::load::{Outcome, Sample};
use super::scenario::Scenario;

/// Width of one timeline slice.
pub const SLICE: Duration = Duration::from_millis(250);

/// One assertion with the number it was held to and the number measured.
#[derive(Debug, Clone, Serialize)]
pub struct Assertion {
    /// Short name.
    pub name: String,
    /// The expectation, with its numbers.
    pub expected: String,
    /// What was measured.
    pub measured: String,
    /// Whether it held.
    pub passed: bool,
}

/// One 250 ms slice of the timeline (by send time).
#[derive(Debug, Clone, Serialize)]
pub struct Slice {
    /// Start of the slice, seconds from the start of the load.
    pub t_s: f64,
    /// Requests by outcome: `"200"`, `"503"`, `"timeout"`, `"error"`...
    pub counts: BTreeMap<String, u64>,
    /// Latency percentiles in milliseconds (0 when the slice is empty).
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub max_ms: f64,
}

/// The outcome of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    /// Scenario name.
    pub name: String,
    /// What it does.
    pub summary: String,
    /// All assertions held.
    pub passed: bool,
    /// Requests per second.
    pub rate: u32,
    /// Seconds of load.
    pub duration_s: f64,
    /// Levee replicas at the start.
    pub replicas: usize,
    /// `[from, to]` seconds.
    pub fault_window_s: [f64; 2],
    /// Requests by outcome over the whole run.
    pub totals: BTreeMap<String, u64>,
    /// The assertions.
    pub assertions: Vec<Assertion>,
    /// Per-slice counts and latencies.
    pub timeline: Vec<Slice>,
    /// A scenario that could not run (a process failed to start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Profile name.
    pub profile: String,
    /// Every scenario passed.
    pub passed: bool,
    /// Wall time of the run.
    pub wall_time_s: f64,
    /// Scenarios in run order.
    pub scenarios: Vec<ScenarioReport>,
}

impl Assertion {
    /// An assertion result.
    pub fn new(name: &str, expected: String, measured: String, passed: bool) -> Self {
        Self {
            name: name.to_owned(),
            expected,
            measured,
            passed,
        }
    }
}

fn outcome_key(o: Outcome) -> String {
    match o {
        Outcome::Status(code) => code.to_string(),
        Outcome::Timeout => "timeout".to_owned(),
        Outcome::Error => "error".to_owned(),
    }
}

impl ScenarioReport {
    /// The report of a scenario that ran.
    pub fn new(scenario: &Scenario, samples: &[Sample], assertions: Vec<Assertion>) -> Self {
        let slices = (scenario.load.duration.as_secs_f64() / SLICE.as_secs_f64()).ceil() as usize;
        let mut counts = vec![BTreeMap::<String, u64>::new(); slices.max(1)];
        let mut hists: Vec<Option<Histogram<u64>>> = vec![None; slices.max(1)];
        let mut totals = BTreeMap::new();
        for s in samples {
            let i = ((s.sent.as_secs_f64() / SLICE.as_secs_f64()) as usize).min(counts.len() - 1);
            let key = outcome_key(s.outcome);
            *counts[i].entry(key.clone()).or_default() += 1;
            *totals.entry(key).or_default() += 1;
            let hist = hists[i].get_or_insert_with(|| {
                // 1 µs .. 60 s, 3 significant digits.
                Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant bounds are valid")
            });
            hist.saturating_record((s.latency.as_micros() as u64).max(1));
        }
        let timeline = counts
            .into_iter()
            .zip(hists)
            .enumerate()
            .map(|(i, (counts, hist))| {
                let q = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                Slice {
                    t_s: i as f64 * SLICE.as_secs_f64(),
                    counts,
                    p50_ms: hist.as_ref().map_or(0.0, |h| q(h, 0.5)),
                    p99_ms: hist.as_ref().map_or(0.0, |h| q(h, 0.99)),
                    max_ms: hist.as_ref().map_or(0.0, |h| h.max() as f64 / 1000.0),
                }
            })
            .collect();
        Self {
            name: scenario.name.to_owned(),
            summary: scenario.summary.to_owned(),
            passed: assertions.iter().all(|a| a.passed),
            rate: scenario.load.rate,
            duration_s: scenario.load.duration.as_secs_f64(),
            replicas: scenario.replicas,
            fault_window_s: [
                scenario.fault_window.0.as_secs_f64(),
                scenario.fault_window.1.as_secs_f64(),
            ],
            totals,
            assertions,
            timeline,
            error: None,
        }
    }

    /// The report of a scenario that could not run.
    pub fn failed_to_run(scenario: &Scenario, error: &anyhow::Error) -> Self {
        let mut report = Self::new(scenario, &[], Vec::new());
        report.passed = false;
        report.error = Some(format!("{error:#}"));
        report
    }
}

/// Writes `report.json` and `<scenario>.svg` into `dir`.
pub fn write(report: &RunReport, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(dir.join("report.json"), json)?;
    for scenario in &report.scenarios {
        let path = dir.join(format!("{}.svg", scenario.name));
        chart(scenario, &path).with_context(|| format!("drawing {}", path.display()))?;
    }
    Ok(())
}

/// Colour of an outcome's line.
fn colour(key: &str) -> RGBColor {
    match key {
        "200" => RGBColor(46, 139, 87),
        "429" => RGBColor(218, 165, 32),
        "502" => RGBColor(205, 92, 92),
        "503" => RGBColor(178, 34, 34),
        "504" => RGBColor(128, 0, 128),
        "timeout" => RGBColor(0, 0, 0),
        _ => RGBColor(105, 105, 105),
    }
}

/// Latency percentiles (top) and requests per slice by status (bottom)
/// over time, the fault window shaded. Text is emitted as SVG `<text>`,
/// so no system font is needed.
pub fn chart(report: &ScenarioReport, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (top, bottom) = root.split_vertically(340);
    let end = report.duration_s.max(0.25);
    let [from, to] = report.fault_window_s;
    let shade = RGBColor(255, 200, 200).mix(0.45);
    let verdict = if report.passed { "PASS" } else { "FAIL" };

    let max_ms = report
        .timeline
        .iter()
        .map(|s| s.p99_ms)
        .fold(1.0_f64, f64::max)
        * 1.1;
    let mut lat = ChartBuilder::on(&top)
        .caption(
            format!("{} ({verdict}): latency", report.name),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, 0.0..max_ms)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    lat.configure_mesh()
        .x_desc("seconds")
        .y_desc("ms")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    lat.draw_series(std::iter::once(Rectangle::new(
        [(from, 0.0), (to, max_ms)],
        shade.filled(),
    )))
    .map_err(|e| anyhow::anyhow!("{e}"))?
    .label("fault")
    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], shade.filled()));
    for (name, pick, colour) in [
        ("p50", (|s: &Slice| s.p50_ms) as fn(&Slice) -> f64, BLUE),
        ("p99", |s: &Slice| s.p99_ms, RED),
    ] {
        lat.draw_series(LineSeries::new(
            report
                .timeline
                .iter()
                .filter(|s| !s.counts.is_empty())
                .map(|s| (s.t_s + 0.125, pick(s))),
            colour.stroke_width(2),
        ))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], colour.stroke_width(2)));
    }
    lat.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    let keys: Vec<String> = report.totals.keys().cloned().collect();
    let max_count = report
        .timeline
        .iter()
        .flat_map(|s| s.counts.values().copied())
        .max()
        .unwrap_or(1) as f64
        * 1.1;
    let mut cnt = ChartBuilder::on(&bottom)
        .caption("requests per 250 ms by status", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, 0.0..max_count)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    cnt.configure_mesh()
        .x_desc("seconds")
        .y_desc("requests")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    cnt.draw_series(std::iter::once(Rectangle::new(
        [(from, 0.0), (to, max_count)],
        shade.filled(),
    )))
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    for key in keys {
        let c = colour(&key);
        let points: Vec<(f64, f64)> = report
            .timeline
            .iter()
            .map(|s| {
                (
                    s.t_s + 0.125,
                    s.counts.get(&key).copied().unwrap_or(0) as f64,
                )
            })
            .collect();
        cnt.draw_series(LineSeries::new(points, c.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(key)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], c.stroke_width(2)));
    }
    cnt.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}
