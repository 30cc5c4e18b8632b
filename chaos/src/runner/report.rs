//! The run report: per scenario a timeline (per 250 ms slice: counts by
//! status, p50 / p99 / max from an HDR histogram), the fault window, the
//! assertions with their measured values; written as JSON plus one SVG
//! chart per scenario.
//!
//! A scenario whose load has tenants also gets a timeline and a summary
//! (before / during the fault window) per tenant, and a contrast run (see
//! `scenario::Contrast`) nests its own report under `contrast`; its chart
//! puts the two runs side by side, per tenant.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use serde::Serialize;

use super::load::{Outcome, Sample};
use super::scenario::{JobsObserved, Scenario};

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
    /// Which run this is when the scenario has a contrast, e.g.
    /// `isolation on`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Per tenant: before and during the fault window.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantSummary>,
    /// Per tenant: the timeline of its requests alone.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tenant_timelines: BTreeMap<String, Vec<Slice>>,
    /// The contrast run, reported beside this one; its verdict is not
    /// this one's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contrast: Option<Box<ScenarioReport>>,
    /// The jobs the load submitted, when the scenario reads them back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jobs: Option<JobsSummary>,
    /// When each step of the fault schedule was done.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
}

/// One step of the fault schedule, as done.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// When it was done (after any wait it includes), seconds from the
    /// start of the load.
    pub t_s: f64,
    /// The action.
    pub action: String,
}

/// The jobs of a run: submissions, final states, takeovers, and when
/// they ran.
#[derive(Debug, Clone, Serialize)]
pub struct JobsSummary {
    /// The submitting tenant.
    pub tenant: String,
    /// Submissions sent.
    pub submitted: u64,
    /// Answered 202.
    pub accepted: u64,
    /// Answered 429 `queue_full`.
    pub queue_full: u64,
    /// Anything else (statuses, timeouts, transport errors).
    pub other: u64,
    /// Accepted jobs by the status last read (`unread` if never read).
    pub final_status: BTreeMap<String, u64>,
    /// Accepted jobs that did not end `succeeded`.
    pub lost: u64,
    /// Accepted jobs with more than one delivery.
    pub started_more_than_once: u64,
    /// `levee_jobs_total` by outcome over the replicas alive at the end.
    pub counters: BTreeMap<String, u64>,
    /// Jobs started in each second of the run (by `started_at`).
    pub started_per_s: Vec<u64>,
    /// The last `finished_at`, seconds from the start of the load.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_finished_s: Option<f64>,
    /// When reading them back ended, seconds from the start of the load.
    pub polled_until_s: f64,
    /// Every accepted job, by submission time.
    pub jobs: Vec<JobRow>,
}

/// One accepted job in the report; times in seconds from the start of
/// the load.
#[derive(Debug, Clone, Serialize)]
pub struct JobRow {
    /// Its id.
    pub id: String,
    /// The replica that accepted it.
    pub replica: usize,
    /// When its submission was sent.
    pub sent_s: f64,
    /// The status last read (`None`: never read).
    pub status: Option<String>,
    /// Deliveries.
    pub attempts: u64,
    /// Its last start.
    pub started_s: Option<f64>,
    /// When it finished.
    pub finished_s: Option<f64>,
}

/// One tenant's requests before and during the fault window.
#[derive(Debug, Clone, Serialize)]
pub struct TenantSummary {
    /// The tenant label.
    pub tenant: String,
    /// Sent before the fault window.
    pub before: Phase,
    /// Sent during the fault window.
    pub during: Phase,
}

/// Counts, latencies and admitted rate of the requests sent in a window.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// `[from, to)` seconds.
    pub window_s: [f64; 2],
    /// Requests by outcome.
    pub counts: BTreeMap<String, u64>,
    /// Latency percentiles in milliseconds (0 without requests).
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub max_ms: f64,
    /// 200s per second of the window.
    pub ok_per_s: f64,
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
        let duration = scenario.load.duration();
        let (slices, totals) = timeline(samples, duration);
        let mut by_tenant = BTreeMap::<String, Vec<Sample>>::new();
        for s in samples {
            if let Some(tenant) = &s.tenant {
                by_tenant.entry(tenant.clone()).or_default().push(s.clone());
            }
        }
        let (from, to) = scenario.fault_window;
        let tenants = by_tenant
            .iter()
            .map(|(tenant, samples)| TenantSummary {
                tenant: tenant.clone(),
                before: phase(samples, Duration::ZERO, from),
                during: phase(samples, from, to),
            })
            .collect();
        let tenant_timelines = by_tenant
            .into_iter()
            .map(|(tenant, samples)| (tenant, timeline(&samples, duration).0))
            .collect();
        Self {
            name: scenario.name.to_owned(),
            summary: scenario.summary.to_owned(),
            passed: assertions.iter().all(|a| a.passed),
            rate: scenario.load.rate(),
            duration_s: duration.as_secs_f64(),
            replicas: scenario.replicas,
            fault_window_s: [from.as_secs_f64(), to.as_secs_f64()],
            totals,
            assertions,
            timeline: slices,
            error: None,
            variant: None,
            tenants,
            tenant_timelines,
            contrast: None,
            jobs: None,
            events: Vec::new(),
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

impl JobsSummary {
    /// The summary of `tenant`'s submissions among `samples` and of the
    /// jobs read back.
    pub fn new(tenant: &str, samples: &[Sample], observed: &JobsObserved) -> Self {
        let theirs: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.tenant.as_deref() == Some(tenant))
            .collect();
        let count = |f: &dyn Fn(&Sample) -> bool| theirs.iter().filter(|s| f(s)).count() as u64;
        let accepted = count(&|s| s.outcome == Outcome::Status(202) && s.job_id.is_some());
        let queue_full = count(&|s| {
            s.outcome == Outcome::Status(429) && s.error_code.as_deref() == Some("queue_full")
        });
        let mut final_status = BTreeMap::new();
        let mut started_per_s = Vec::new();
        for job in &observed.jobs {
            let status = job.status.clone().unwrap_or_else(|| "unread".to_owned());
            *final_status.entry(status).or_default() += 1;
            if let Some(t) = job.started {
                let i = t.as_secs() as usize;
                if started_per_s.len() <= i {
                    started_per_s.resize(i + 1, 0);
                }
                started_per_s[i] += 1;
            }
        }
        let succeeded = final_status.get("succeeded").copied().unwrap_or(0);
        Self {
            tenant: tenant.to_owned(),
            submitted: theirs.len() as u64,
            accepted,
            queue_full,
            other: theirs.len() as u64 - accepted - queue_full,
            lost: observed.jobs.len() as u64 - succeeded,
            final_status,
            started_more_than_once: observed.jobs.iter().filter(|j| j.attempts > 1).count() as u64,
            counters: observed.counters.clone(),
            started_per_s,
            last_finished_s: observed
                .jobs
                .iter()
                .filter_map(|j| j.finished)
                .max()
                .map(|d| d.as_secs_f64()),
            polled_until_s: observed.polled_until.as_secs_f64(),
            jobs: observed
                .jobs
                .iter()
                .map(|j| JobRow {
                    id: j.id.clone(),
                    replica: j.replica,
                    sent_s: j.sent.as_secs_f64(),
                    status: j.status.clone(),
                    attempts: j.attempts,
                    started_s: j.started.map(|d| d.as_secs_f64()),
                    finished_s: j.finished.map(|d| d.as_secs_f64()),
                })
                .collect(),
        }
    }
}

/// A fresh histogram: 1 µs .. 60 s, 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant bounds are valid")
}

fn record(hist: &mut Histogram<u64>, s: &Sample) {
    hist.saturating_record((s.latency.as_micros() as u64).max(1));
}

/// `q` of `hist` in milliseconds.
fn quantile_ms(hist: &Histogram<u64>, q: f64) -> f64 {
    hist.value_at_quantile(q) as f64 / 1000.0
}

/// The slices of `samples` over a load of `duration`, and the totals by
/// outcome.
fn timeline(samples: &[Sample], duration: Duration) -> (Vec<Slice>, BTreeMap<String, u64>) {
    let slices = (duration.as_secs_f64() / SLICE.as_secs_f64()).ceil() as usize;
    let mut counts = vec![BTreeMap::<String, u64>::new(); slices.max(1)];
    let mut hists: Vec<Option<Histogram<u64>>> = vec![None; slices.max(1)];
    let mut totals = BTreeMap::new();
    for s in samples {
        let i = ((s.sent.as_secs_f64() / SLICE.as_secs_f64()) as usize).min(counts.len() - 1);
        let key = outcome_key(s.outcome);
        *counts[i].entry(key.clone()).or_default() += 1;
        *totals.entry(key).or_default() += 1;
        record(hists[i].get_or_insert_with(histogram), s);
    }
    let timeline = counts
        .into_iter()
        .zip(hists)
        .enumerate()
        .map(|(i, (counts, hist))| Slice {
            t_s: i as f64 * SLICE.as_secs_f64(),
            counts,
            p50_ms: hist.as_ref().map_or(0.0, |h| quantile_ms(h, 0.5)),
            p99_ms: hist.as_ref().map_or(0.0, |h| quantile_ms(h, 0.99)),
            max_ms: hist.as_ref().map_or(0.0, |h| h.max() as f64 / 1000.0),
        })
        .collect();
    (timeline, totals)
}

/// The requests of `samples` sent in `[from, to)`.
fn phase(samples: &[Sample], from: Duration, to: Duration) -> Phase {
    let mut counts = BTreeMap::<String, u64>::new();
    let mut hist = histogram();
    let mut ok = 0_u64;
    for s in samples.iter().filter(|s| s.sent >= from && s.sent < to) {
        *counts.entry(outcome_key(s.outcome)).or_default() += 1;
        record(&mut hist, s);
        ok += u64::from(s.outcome == Outcome::Status(200));
    }
    let (some, window) = (!hist.is_empty(), to.saturating_sub(from).as_secs_f64());
    Phase {
        window_s: [from.as_secs_f64(), to.as_secs_f64()],
        counts,
        p50_ms: if some { quantile_ms(&hist, 0.5) } else { 0.0 },
        p99_ms: if some { quantile_ms(&hist, 0.99) } else { 0.0 },
        max_ms: if some {
            hist.max() as f64 / 1000.0
        } else {
            0.0
        },
        ok_per_s: if window > 0.0 {
            ok as f64 / window
        } else {
            0.0
        },
    }
}

/// Writes `report.json` and `<scenario>.svg` into `dir`.
pub fn write(report: &RunReport, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = serde_json::to_string_pretty(report)?;
    std::fs::write(dir.join("report.json"), json)?;
    for scenario in &report.scenarios {
        let path = dir.join(format!("{}.svg", scenario.name));
        let drawn = if scenario.tenant_timelines.is_empty() {
            chart(scenario, &path)
        } else {
            tenant_chart(scenario, &path)
        };
        drawn.with_context(|| format!("drawing {}", path.display()))?;
    }
    Ok(())
}

/// Colour of an outcome's line.
fn colour(key: &str) -> RGBColor {
    match key {
        "200" => RGBColor(46, 139, 87),
        "202" => RGBColor(70, 130, 180),
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

/// Colour of the `i`-th tenant's latency lines.
fn tenant_colour(i: usize) -> RGBColor {
    const PALETTE: [RGBColor; 4] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(23, 190, 207),
        RGBColor(148, 103, 189),
    ];
    PALETTE[i % PALETTE.len()]
}

/// Plotters' errors carry the backend's type; the report only shows them.
fn draw_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Per tenant, latency (top) and requests per slice by status (bottom),
/// one column per run: the contrast on the left, the main run on the
/// right, on shared axes so that the columns compare at a glance.
pub fn tenant_chart(report: &ScenarioReport, path: &Path) -> anyhow::Result<()> {
    let runs: Vec<&ScenarioReport> = report
        .contrast
        .as_deref()
        .into_iter()
        .chain([report])
        .collect();
    let width = 720 * u32::try_from(runs.len()).unwrap_or(1);
    let root = SVGBackend::new(path, (width, 680)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let slices = || {
        runs.iter()
            .flat_map(|r| r.tenant_timelines.values().flatten())
    };
    let max_ms = slices().map(|s| s.p99_ms).fold(1.0_f64, f64::max) * 1.1;
    let max_count = slices()
        .flat_map(|s| s.counts.values().copied())
        .max()
        .unwrap_or(1) as f64
        * 1.1;
    for (run, column) in runs.iter().zip(root.split_evenly((1, runs.len()))) {
        let (top, bottom) = column.split_vertically(360);
        tenant_latency(run, &top, max_ms)?;
        tenant_counts(run, &bottom, max_count)?;
    }
    root.present().map_err(draw_error)?;
    Ok(())
}

/// One run's p50 (dashed) and p99 (solid) per tenant over time.
fn tenant_latency(
    run: &ScenarioReport,
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    max_ms: f64,
) -> anyhow::Result<()> {
    let verdict = if run.passed { "PASS" } else { "FAIL" };
    let variant = run.variant.as_deref().unwrap_or("run");
    let mut lat = ChartBuilder::on(area)
        .caption(
            format!("{}, {variant} ({verdict}): latency by tenant", run.name),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..run.duration_s.max(0.25), 0.0..max_ms)
        .map_err(draw_error)?;
    lat.configure_mesh()
        .x_desc("seconds")
        .y_desc("ms")
        .draw()
        .map_err(draw_error)?;
    shade_fault_window(&mut lat, run, max_ms)?;
    for (i, (tenant, timeline)) in run.tenant_timelines.iter().enumerate() {
        let c = tenant_colour(i);
        let points = |pick: fn(&Slice) -> f64| -> Vec<(f64, f64)> {
            timeline
                .iter()
                .filter(|s| !s.counts.is_empty())
                .map(|s| (s.t_s + 0.125, pick(s)))
                .collect()
        };
        lat.draw_series(LineSeries::new(points(|s| s.p99_ms), c.stroke_width(2)))
            .map_err(draw_error)?
            .label(format!("{tenant} p99"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], c.stroke_width(2)));
        lat.draw_series(DashedLineSeries::new(
            points(|s| s.p50_ms),
            4,
            3,
            c.stroke_width(2),
        ))
        .map_err(draw_error)?
        .label(format!("{tenant} p50"))
        .legend(move |(x, y)| {
            DashedPathElement::new(vec![(x, y), (x + 15, y)], 4, 3, c.stroke_width(2))
        });
    }
    lat.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error)?;
    Ok(())
}

/// One run's requests per slice by tenant and status: coloured by status,
/// the first tenant solid and the others dashed.
fn tenant_counts(
    run: &ScenarioReport,
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    max_count: f64,
) -> anyhow::Result<()> {
    let mut cnt = ChartBuilder::on(area)
        .caption(
            "requests per 250 ms by tenant and status",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..run.duration_s.max(0.25), 0.0..max_count)
        .map_err(draw_error)?;
    cnt.configure_mesh()
        .x_desc("seconds")
        .y_desc("requests")
        .draw()
        .map_err(draw_error)?;
    shade_fault_window(&mut cnt, run, max_count)?;
    for (i, (tenant, timeline)) in run.tenant_timelines.iter().enumerate() {
        let mut keys: Vec<&String> = timeline.iter().flat_map(|s| s.counts.keys()).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let c = colour(key).stroke_width(2);
            let points: Vec<(f64, f64)> = timeline
                .iter()
                .map(|s| {
                    (
                        s.t_s + 0.125,
                        s.counts.get(key).copied().unwrap_or(0) as f64,
                    )
                })
                .collect();
            let label = format!("{tenant} {key}");
            if i == 0 {
                cnt.draw_series(LineSeries::new(points, c))
                    .map_err(draw_error)?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], c));
            } else {
                cnt.draw_series(DashedLineSeries::new(points, 4, 3, c))
                    .map_err(draw_error)?
                    .label(label)
                    .legend(move |(x, y)| {
                        DashedPathElement::new(vec![(x, y), (x + 15, y)], 4, 3, c)
                    });
            }
        }
    }
    cnt.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_error)?;
    Ok(())
}

/// Shades the fault window of `run` up to `top`.
fn shade_fault_window(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    run: &ScenarioReport,
    top: f64,
) -> anyhow::Result<()> {
    let [from, to] = run.fault_window_s;
    let shade = RGBColor(255, 200, 200).mix(0.45);
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(from, 0.0), (to, top)],
            shade.filled(),
        )))
        .map_err(draw_error)?
        .label("fault window")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], shade.filled()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::load::{Outcome, Sample};
    use super::super::scenario::{noisy_neighbour, Profile};
    use super::*;

    fn sample(tenant: &str, sent_ms: u64, latency_ms: u64, code: u16) -> Sample {
        Sample {
            sent: Duration::from_millis(sent_ms),
            latency: Duration::from_millis(latency_ms),
            outcome: Outcome::Status(code),
            replica: 0,
            ratelimit_degraded: false,
            retry_after: code != 200,
            body_degraded: false,
            error_code: None,
            tenant: Some(tenant.to_owned()),
            job_id: None,
        }
    }

    #[test]
    fn tenants_are_summarised_before_and_during_the_fault_window() {
        let scenario = noisy_neighbour(&Profile::CI);
        // Quiet: 30 requests before the flood (at 6 s), 60 during; noisy:
        // 120 during, a third of them 429s.
        let mut samples: Vec<Sample> = (0..90)
            .map(|n| sample("quiet", n * 200, 100 + n % 10, 200))
            .collect();
        samples.extend((0..120).map(|n| {
            let code = if n % 3 == 0 { 429 } else { 200 };
            sample("noisy", 6_000 + n * 100, 150, code)
        }));
        let report = ScenarioReport::new(&scenario, &samples, Vec::new());
        assert_eq!(report.rate, 165);
        assert_eq!(report.duration_s, 18.0);
        let [noisy, quiet] = &report.tenants[..] else {
            panic!("two tenants: {:?}", report.tenants);
        };
        assert_eq!(
            (quiet.tenant.as_str(), noisy.tenant.as_str()),
            ("quiet", "noisy")
        );
        assert_eq!(quiet.before.counts["200"], 30);
        assert_eq!(quiet.during.counts["200"], 60);
        assert_eq!(quiet.before.ok_per_s, 5.0);
        // HDR keeps 3 significant digits: 109 ms reads back as 109.055.
        assert!(
            (quiet.before.max_ms - 109.0).abs() < 0.1,
            "{}",
            quiet.before.max_ms
        );
        assert!(noisy.before.counts.is_empty());
        assert_eq!(noisy.during.counts["429"], 40);
        assert_eq!(noisy.during.ok_per_s, 80.0 / 12.0);
        // One timeline per tenant, one slice per 250 ms of load.
        assert_eq!(report.tenant_timelines["quiet"].len(), 72);
        assert_eq!(report.tenant_timelines["noisy"].len(), 72);
    }

    #[test]
    fn tenant_chart_draws_the_contrast_beside_the_main_run() {
        let scenario = noisy_neighbour(&Profile::CI);
        let samples = |code| -> Vec<Sample> {
            (0..90)
                .map(|n| sample("quiet", n * 200, 105, if n < 30 { 200 } else { code }))
                .chain((0..120).map(|n| sample("noisy", 6_000 + n * 100, 150, 200)))
                .collect()
        };
        let mut contrast = ScenarioReport::new(&scenario, &samples(503), Vec::new());
        contrast.variant = Some("isolation off".to_owned());
        let mut report = ScenarioReport::new(&scenario, &samples(200), Vec::new());
        report.variant = Some("isolation on".to_owned());
        report.contrast = Some(Box::new(contrast));

        let path = std::env::temp_dir().join(format!("levee-chaos-nn-{}.svg", std::process::id()));
        tenant_chart(&report, &path).expect("chart draws");
        let svg = std::fs::read_to_string(&path).expect("svg written");
        let _ = std::fs::remove_file(&path);
        assert!(svg.contains(r#"width="1440""#), "two 720 px columns");
        let off = svg.find("isolation off").expect("contrast column");
        let on = svg.find("isolation on").expect("main column");
        assert!(off < on, "the contrast is drawn first, on the left");
        for label in ["quiet p99", "noisy p50", "quiet 503", "noisy 200"] {
            assert!(svg.contains(label), "legend has {label}");
        }
    }
}
