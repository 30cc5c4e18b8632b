//! The soak's verdict: the least-squares slope of each sampled series
//! after the warm-up, held to a bound, and every request's outcome held
//! to what its kind may answer (with a fault's failures allowed only
//! while it lasts, plus the breaker's longest open time).
//!
//! A bound is `per_min + allowance / window`: a steady growth of more
//! than `per_min` fails however long the run, and `allowance` is the
//! one-off step (an allocator arena, a pool filling up) that a short run
//! must not mistake for a trend. Over the 30-minute run the allowance adds
//! a few percent to `per_min`; over CI's 60 s it dominates, which makes
//! CI's soak a smoke test (it fails on a fast leak only) and the long run
//! the measurement.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::config::BREAKER_MAX_OPEN_S;
use super::faults::{Fault, Window};
use super::reload::Reload;
use super::sampler::Sample;
use super::traffic::{Kind, Record};
use crate::runner::report::Assertion;

/// Failures of the LLM are the fault's until this long after it healed:
/// the breaker's longest open time plus a probe.
pub const FAULT_GRACE: Duration = Duration::from_secs(BREAKER_MAX_OPEN_S + 2);
/// The gateway's open descriptors may end at most this many above where
/// they were after the warm-up (connections in flight come and go).
pub const FD_END_SLACK: f64 = 16.0;
/// Samples (seconds) whose median is a series' start (after the
/// warm-up) or end: long enough to step over a transient (a burst of
/// connections, an arena held for a few seconds), at most a quarter of
/// the measured window.
const EDGE_SAMPLES: usize = 30;

/// How much growth a series may show.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Bound {
    /// Steady growth per minute.
    pub per_min: f64,
    /// A one-off step over the measured window, spread over it.
    pub allowance: f64,
}

/// One sampled series, its slope and its bound.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    /// Its name, e.g. `levee_rss`.
    pub name: String,
    /// Unit of the values (`MiB`, `fds`, `keys`).
    pub unit: String,
    /// First sample of the run.
    pub first: f64,
    /// Median of the first samples after the warm-up.
    pub start: f64,
    /// Median of the last samples.
    pub end: f64,
    /// Largest sample.
    pub max: f64,
    /// Least-squares slope after the warm-up, unit per minute.
    pub slope_per_min: f64,
    /// The bound, unit per minute; `None`: reported, not judged.
    pub bound_per_min: Option<f64>,
    /// Whether it held (true when not judged).
    pub passed: bool,
}

/// The bounds of the judged series.
pub fn bounds() -> [(&'static str, &'static str, Bound); 4] {
    [
        (
            "levee_rss",
            "MiB",
            Bound {
                per_min: 1.0,
                allowance: 4.0,
            },
        ),
        (
            "levee_fds",
            "fds",
            Bound {
                per_min: 0.5,
                allowance: 16.0,
            },
        ),
        (
            "redis_used_memory",
            "MiB",
            Bound {
                per_min: 64.0 / 1024.0,
                allowance: 0.5,
            },
        ),
        (
            "redis_keys",
            "keys",
            Bound {
                per_min: 10.0,
                allowance: 60.0,
            },
        ),
    ]
}

/// The warm-up of a run of `duration`: a fifth of it, at least 15 s (two
/// job result lifetimes, so Redis's retained jobs have levelled off), at
/// most half.
pub fn warm_up(duration: Duration) -> Duration {
    (duration / 5)
        .max(Duration::from_secs(15))
        .min(duration / 2)
}

/// Least-squares slope of `(x, y)`; 0 with fewer than two distinct x.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The value of series `name` in a sample, in its unit.
pub(super) fn value(s: &Sample, name: &str) -> Option<f64> {
    let mib = |kib: u64| kib as f64 / 1024.0;
    match name {
        "levee_rss" => s.levee_rss_kib.map(mib),
        "levee_fds" => s.levee_fds.map(|n| n as f64),
        "redis_used_memory" => s.redis_used_memory.map(|b| b as f64 / 1024.0 / 1024.0),
        "redis_keys" => s.redis_keys.map(|n| n as f64),
        "sim_rss" => s.sim_rss_kib.map(mib),
        "sim_fds" => s.sim_fds.map(|n| n as f64),
        _ => None,
    }
}

/// Series `name` of `samples`, judged against `bound` after `warm_up`.
pub fn series(
    samples: &[Sample],
    name: &str,
    unit: &str,
    bound: Option<Bound>,
    warm_up: Duration,
) -> Series {
    let all: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| Some((s.t_s, value(s, name)?)))
        .collect();
    let after: Vec<(f64, f64)> = all
        .iter()
        .copied()
        .filter(|p| p.0 >= warm_up.as_secs_f64())
        .collect();
    let minutes: Vec<(f64, f64)> = after.iter().map(|p| (p.0 / 60.0, p.1)).collect();
    let slope_per_min = slope(&minutes);
    let window_min = match (after.first(), after.last()) {
        (Some(a), Some(b)) => ((b.0 - a.0) / 60.0).max(1.0 / 60.0),
        _ => 1.0,
    };
    let ys: Vec<f64> = after.iter().map(|p| p.1).collect();
    let edge = EDGE_SAMPLES.min(ys.len() / 4).max(1);
    let bound_per_min = bound.map(|b| b.per_min + b.allowance / window_min);
    Series {
        name: name.to_owned(),
        unit: unit.to_owned(),
        first: all.first().map_or(0.0, |p| p.1),
        start: median(&ys[..ys.len().min(edge)]),
        end: median(&ys[ys.len().saturating_sub(edge)..]),
        max: ys.iter().copied().fold(0.0, f64::max),
        slope_per_min,
        passed: after.len() >= 2 && bound_per_min.is_none_or(|b| slope_per_min <= b),
        bound_per_min,
    }
}

/// Whether `record` ended as its kind may, given the fault `windows`.
pub fn expected(record: &Record, windows: &[Window]) -> bool {
    let during = |fault: Option<Fault>| {
        windows.iter().any(|w| {
            fault.is_none_or(|f| f == w.fault)
                && record.sent_s <= w.to_s + FAULT_GRACE.as_secs_f64()
                && record.done_s >= w.from_s
        })
    };
    let label = record.label.as_str();
    let dependency_error = ["502", "503", "504"]
        .iter()
        .any(|s| label.split(' ').next() == Some(s));
    match record.kind {
        Kind::Chat | Kind::Completion => label == "200" || (dependency_error && during(None)),
        Kind::Stream | Kind::StreamAbort => {
            matches!(label, "stream_done" | "aborted")
                || (dependency_error && during(None))
                || (label == "stream_error" && during(Some(Fault::StreamFail)))
        }
        Kind::Limited => {
            label == "200" || label == "429 rate_limited" || (dependency_error && during(None))
        }
        Kind::Unauthorized => label == "401 unauthorized",
        Kind::JobSubmit => label == "202",
        Kind::JobResult => {
            label == "succeeded" || (matches!(label, "failed" | "dead") && during(None))
        }
    }
}

/// The assertions of a run: no unexpected outcome, every accepted job
/// terminal, every reload as specified, each kind answered at all, each
/// judged series within its bound, the descriptors back near their start.
pub fn assertions(
    records: &[Record],
    windows: &[Window],
    reloads: &[Reload],
    series: &[Series],
) -> Vec<Assertion> {
    let mut out = vec![unexpected(records, windows), jobs(records)];
    out.push(Assertion::new(
        "reloads as specified",
        "every good file served (sha256, spare key), every broken one refused, old config kept"
            .to_owned(),
        format!(
            "{} of {} reloads ok{}",
            reloads.iter().filter(|r| r.ok).count(),
            reloads.len(),
            reloads
                .iter()
                .find(|r| !r.ok)
                .map_or_else(String::new, |r| format!(
                    "; first bad at {:.1}s: {}",
                    r.t_s, r.detail
                ))
        ),
        reloads.iter().all(|r| r.ok),
    ));
    out.push(every_kind_served(records));
    for s in series.iter().filter(|s| s.bound_per_min.is_some()) {
        out.push(Assertion::new(
            &format!("{} slope", s.name),
            format!(
                "<= {:.3} {}/min after the warm-up",
                s.bound_per_min.unwrap_or(0.0),
                s.unit
            ),
            format!(
                "{:+.3} {}/min ({:.2} -> {:.2} {})",
                s.slope_per_min, s.unit, s.start, s.end, s.unit
            ),
            s.passed,
        ));
    }
    if let Some(fds) = series.iter().find(|s| s.name == "levee_fds") {
        out.push(Assertion::new(
            "levee_fds end",
            format!("<= start + {FD_END_SLACK}"),
            format!("start {:.0}, end {:.0}", fds.start, fds.end),
            fds.end <= fds.start + FD_END_SLACK,
        ));
    }
    out
}

/// No request ended in a way its kind may not.
fn unexpected(records: &[Record], windows: &[Window]) -> Assertion {
    let bad: Vec<&Record> = records.iter().filter(|r| !expected(r, windows)).collect();
    let mut by_label: BTreeMap<String, u64> = BTreeMap::new();
    for r in &bad {
        *by_label
            .entry(format!("{:?} {}", r.kind, r.label))
            .or_default() += 1;
    }
    let first = bad.first().map_or_else(String::new, |r| {
        format!("; first at {:.1}s: {:?} {}", r.sent_s, r.kind, r.label)
    });
    Assertion::new(
        "no unexpected outcome",
        format!(
            "only the kind's answers; 502/503/504 (and stream errors, failed/dead jobs) only during a fault + {} s",
            FAULT_GRACE.as_secs()
        ),
        format!("{} unexpected {by_label:?}{first}", bad.len()),
        bad.is_empty(),
    )
}

/// Every 202 reached a terminal state.
fn jobs(records: &[Record]) -> Assertion {
    let accepted = records
        .iter()
        .filter(|r| r.kind == Kind::JobSubmit && r.label == "202")
        .count();
    let results: Vec<&Record> = records
        .iter()
        .filter(|r| r.kind == Kind::JobResult)
        .collect();
    let lost = results
        .iter()
        .filter(|r| r.label.starts_with("lost"))
        .count();
    Assertion::new(
        "no lost job",
        "every 202 polled to succeeded / failed / dead by the drain deadline".to_owned(),
        format!(
            "{accepted} accepted, {} terminal, {lost} lost",
            results.len() - lost
        ),
        accepted > 0 && results.len() == accepted && lost == 0,
    )
}

/// Each kind got its normal answer at least once (a soak that only ever
/// saw 401s would pass every other check).
fn every_kind_served(records: &[Record]) -> Assertion {
    let normal = |kind: Kind, label: &str| {
        records
            .iter()
            .any(|r| r.kind == kind && r.label.as_str() == label)
    };
    let wanted = [
        (Kind::Chat, "200"),
        (Kind::Stream, "stream_done"),
        (Kind::StreamAbort, "aborted"),
        (Kind::Completion, "200"),
        (Kind::JobSubmit, "202"),
        (Kind::JobResult, "succeeded"),
        (Kind::Limited, "200"),
        (Kind::Limited, "429 rate_limited"),
        (Kind::Unauthorized, "401 unauthorized"),
    ];
    let missing: Vec<String> = wanted
        .iter()
        .filter(|(k, l)| !normal(*k, l))
        .map(|(k, l)| format!("{k:?} {l}"))
        .collect();
    Assertion::new(
        "every kind served",
        "each kind's normal answer at least once".to_owned(),
        if missing.is_empty() {
            "all seen".to_owned()
        } else {
            format!("never: {}", missing.join(", "))
        },
        missing.is_empty(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: Kind, sent_s: f64, label: &str) -> Record {
        Record {
            kind,
            sent_s,
            done_s: sent_s + 0.05,
            label: label.to_owned(),
        }
    }

    #[test]
    fn slope_is_exact_on_a_line_and_zero_on_a_constant() {
        let line: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), 3.0 * f64::from(i) + 1.0))
            .collect();
        assert!((slope(&line) - 3.0).abs() < 1e-9);
        let flat: Vec<(f64, f64)> = (0..10).map(|i| (f64::from(i), 5.0)).collect();
        assert_eq!(slope(&flat), 0.0);
        assert_eq!(slope(&[(1.0, 2.0)]), 0.0);
    }

    #[test]
    fn dependency_errors_are_expected_only_during_a_fault_and_its_grace() {
        let windows = [Window {
            fault: Fault::ErrorBurst,
            from_s: 10.0,
            to_s: 14.0,
        }];
        assert!(expected(
            &rec(Kind::Chat, 12.0, "502 dependency_failed"),
            &windows
        ));
        assert!(expected(
            &rec(Kind::Chat, 19.0, "503 dependency_unavailable"),
            &windows
        ));
        assert!(!expected(
            &rec(Kind::Chat, 21.0, "503 dependency_unavailable"),
            &windows
        ));
        assert!(!expected(
            &rec(Kind::Chat, 12.0, "500 internal_error"),
            &windows
        ));
        assert!(!expected(
            &rec(Kind::Stream, 12.0, "stream_error"),
            &windows
        ));
        assert!(!expected(
            &rec(Kind::JobSubmit, 12.0, "503 job_store_unavailable"),
            &windows
        ));
        assert!(expected(&rec(Kind::JobResult, 12.0, "dead"), &windows));
        assert!(!expected(&rec(Kind::JobResult, 40.0, "dead"), &windows));
        assert!(!expected(
            &rec(Kind::JobResult, 12.0, "lost: queued"),
            &windows
        ));
    }

    #[test]
    fn a_growing_series_fails_and_a_flat_noisy_one_passes() {
        let samples = |f: &dyn Fn(f64) -> u64| -> Vec<Sample> {
            (0..600)
                .map(|i| Sample {
                    t_s: f64::from(i),
                    levee_rss_kib: Some(f(f64::from(i))),
                    levee_fds: Some(40),
                    redis_used_memory: None,
                    redis_keys: None,
                    sim_rss_kib: None,
                    sim_fds: None,
                    requests: 0,
                    breakers_not_closed: Vec::new(),
                })
                .collect()
        };
        let bound = Some(bounds()[0].2);
        let warm = warm_up(Duration::from_secs(600));
        // 2 MiB/min: a leak.
        let leak = series(
            &samples(&|t| 20_480 + (t * 2048.0 / 60.0) as u64),
            "levee_rss",
            "MiB",
            bound,
            warm,
        );
        assert!(!leak.passed, "{leak:?}");
        assert!((leak.slope_per_min - 2.0).abs() < 0.01);
        // +-1 MiB of noise around a constant.
        let noisy = series(
            &samples(&|t| 20_480 + if (t as u64) % 2 == 0 { 1024 } else { 0 }),
            "levee_rss",
            "MiB",
            bound,
            warm,
        );
        assert!(noisy.passed, "{noisy:?}");
    }
}
