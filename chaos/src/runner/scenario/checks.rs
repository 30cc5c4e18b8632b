//! The checks: [`Check`], an assertion over the samples (and polls) of a
//! run stated as numbers, and [`evaluate`], which dispatches each kind to
//! one function that measures it and returns an [`Assertion`] with the
//! bound and the measurement side by side. Kept apart from the catalogue
//! (which chooses the numbers) and the runner (which collects the samples).

use std::time::Duration;

use super::super::load::{Outcome, Sample};
use super::super::report::Assertion;
use super::execute::{Poll, POLL_EVERY};

/// An assertion over the samples (and polls) of a run, with its numbers.
#[derive(Debug, Clone)]
pub enum Check {
    /// Every response's status is in `allowed`; client timeouts and
    /// transport errors are counted apart and bounded.
    Statuses {
        /// Statuses allowed.
        allowed: Vec<u16>,
        /// Client timeouts allowed.
        max_timeouts: usize,
        /// Transport errors (refused, reset) allowed.
        max_errors: usize,
    },
    /// Every 503 carries `Retry-After`.
    RetryAfterOn503,
    /// p99 latency of responses sent in `[from, to)` (of `statuses`, or
    /// all), skipping the first `skip` of them, is below `max`.
    P99 {
        /// Window start.
        from: Duration,
        /// Window end.
        to: Duration,
        /// Only these statuses; all when empty.
        statuses: Vec<u16>,
        /// The first K calls excluded (those that trip the breaker).
        skip: usize,
        /// The P slowest excluded: half-open probes, one per open period,
        /// each of which may wait out the attempt timeout.
        probes: usize,
        /// Bound.
        max: Duration,
    },
    /// No response sent in `[from, to)` took longer than `max`.
    MaxLatency {
        /// Window start.
        from: Duration,
        /// Window end.
        to: Duration,
        /// Bound.
        max: Duration,
    },
    /// Degraded admissions (200 with `X-RateLimit-Degraded`) per replica
    /// are at most `per_replica` (the window outlasts the run).
    LocalSafetyLimit {
        /// `limit / ratelimit.replicas`.
        per_replica: usize,
    },
    /// After `heal`: a non-degraded 429 within `within`, no degraded answer
    /// sent after `heal + within`, and at most `limit` non-degraded 200s
    /// (the restarted Redis starts a fresh window).
    ExactLimitResumes {
        /// When Redis came back.
        heal: Duration,
        /// Bound on the return of exact limits.
        within: Duration,
        /// The shared limit.
        limit: usize,
    },
    /// 200s across all replicas for the one key: at most `limit`, and at
    /// least `limit` minus the requests lost with a killed replica.
    SharedLimitExact {
        /// The shared limit (window outlasts the run).
        limit: usize,
    },
    /// LLM failures (502 / 504) among responses sent in `[from, to)` are
    /// at most `max`: the breaker opened within that many.
    FailuresBeforeOpen {
        /// Window start.
        from: Duration,
        /// Window end.
        to: Duration,
        /// K.
        max: usize,
    },
    /// A `dependency_unavailable` 503 is sent within `within` of `from`.
    BreakerOpensWithin {
        /// Fault start.
        from: Duration,
        /// Bound.
        within: Duration,
    },
    /// While the LLM breaker is open or half-open (two polls in a row),
    /// the simulator sees at most `max_probes` calls per poll interval;
    /// and the breaker opened at least `min_opens` times.
    ProbesBounded {
        /// `half_open_probes`.
        max_probes: u64,
        /// Separate openings expected.
        min_opens: usize,
    },
    /// Every response sent in `[from, to)` is a 200 with
    /// `metadata.degraded = true`.
    AllDegraded {
        /// Window start.
        from: Duration,
        /// Window end.
        to: Duration,
    },
    /// Every response sent from `heal + within` to the end has a status in
    /// `ok` and is degraded in no way.
    Recovers {
        /// When the fault was healed.
        heal: Duration,
        /// Bound on recovery.
        within: Duration,
        /// Normal statuses.
        ok: Vec<u16>,
    },
}

/// Evaluates one check; `end` is the end of the load.
pub(super) fn evaluate(
    check: &Check,
    samples: &[Sample],
    polls: &[Poll],
    end: Duration,
) -> Assertion {
    match check {
        Check::Statuses {
            allowed,
            max_timeouts,
            max_errors,
        } => check_statuses(samples, allowed, *max_timeouts, *max_errors),
        Check::RetryAfterOn503 => check_retry_after_on_503(samples),
        Check::P99 {
            from,
            to,
            statuses,
            skip,
            probes,
            max,
        } => check_p99(samples, *from, *to, statuses, *skip, *probes, *max),
        Check::MaxLatency { from, to, max } => check_max_latency(samples, *from, *to, *max),
        Check::LocalSafetyLimit { per_replica } => check_local_safety_limit(samples, *per_replica),
        Check::ExactLimitResumes {
            heal,
            within,
            limit,
        } => check_exact_limit_resumes(samples, *heal, *within, *limit),
        Check::SharedLimitExact { limit } => check_shared_limit_exact(samples, *limit),
        Check::FailuresBeforeOpen { from, to, max } => {
            check_failures_before_open(samples, *from, *to, *max)
        }
        Check::BreakerOpensWithin { from, within } => {
            check_breaker_opens_within(samples, *from, *within)
        }
        Check::ProbesBounded {
            max_probes,
            min_opens,
        } => check_probes_bounded(polls, *max_probes, *min_opens),
        Check::AllDegraded { from, to } => check_all_degraded(samples, *from, *to),
        Check::Recovers { heal, within, ok } => check_recovers(samples, *heal, *within, ok, end),
    }
}

/// [`Check::Statuses`]: every status in `allowed`, timeouts and transport
/// errors counted apart and bounded.
fn check_statuses(
    samples: &[Sample],
    allowed: &[u16],
    max_timeouts: usize,
    max_errors: usize,
) -> Assertion {
    let others: Vec<u16> = samples
        .iter()
        .filter_map(status)
        .filter(|c| !allowed.contains(c))
        .collect();
    let timeouts = samples
        .iter()
        .filter(|s| s.outcome == Outcome::Timeout)
        .count();
    let errors = samples
        .iter()
        .filter(|s| s.outcome == Outcome::Error)
        .count();
    let mut distinct = others.clone();
    distinct.sort_unstable();
    distinct.dedup();
    Assertion::new(
        "statuses",
        format!(
            "only {allowed:?}; client timeouts <= {max_timeouts}; transport errors <= {max_errors}"
        ),
        format!(
            "{} other ({distinct:?}); {timeouts} timeouts; {errors} errors; {} requests",
            others.len(),
            samples.len()
        ),
        others.is_empty() && timeouts <= max_timeouts && errors <= max_errors,
    )
}

/// [`Check::RetryAfterOn503`]: no 503 without `Retry-After`.
fn check_retry_after_on_503(samples: &[Sample]) -> Assertion {
    let all = samples.iter().filter(|s| status(s) == Some(503)).count();
    let missing = samples
        .iter()
        .filter(|s| status(s) == Some(503) && !s.retry_after)
        .count();
    Assertion::new(
        "retry_after_on_503",
        "every 503 has Retry-After".to_owned(),
        format!("{missing} of {all} 503s without"),
        missing == 0,
    )
}

/// [`Check::P99`]: p99 of the window's responses (of `statuses`, or all),
/// the first `skip` and the `probes` slowest excluded, below `max`.
fn check_p99(
    samples: &[Sample],
    from: Duration,
    to: Duration,
    statuses: &[u16],
    skip: usize,
    probes: usize,
    max: Duration,
) -> Assertion {
    let mut latencies: Vec<Duration> = samples
        .iter()
        .filter(|s| in_window(s, from, to))
        .filter(|s| statuses.is_empty() || status(s).is_some_and(|c| statuses.contains(&c)))
        .skip(skip)
        .map(|s| s.latency)
        .collect();
    latencies.sort();
    latencies.truncate(latencies.len().saturating_sub(probes));
    let n = latencies.len();
    let measured = p99(&mut latencies);
    Assertion::new(
        "p99",
        format!(
            "p99 of {} sent in [{}, {}), first {skip} and {probes} slowest (probes) excluded, < {}",
            if statuses.is_empty() {
                "all".to_owned()
            } else {
                format!("{statuses:?}")
            },
            secs(from),
            secs(to),
            fmt_ms(max)
        ),
        measured.map_or("no samples".to_owned(), |p| {
            format!("{} over {n}", fmt_ms(p))
        }),
        measured.is_some_and(|p| p < max),
    )
}

/// [`Check::MaxLatency`]: the slowest response sent in the window, below
/// `max`.
fn check_max_latency(samples: &[Sample], from: Duration, to: Duration, max: Duration) -> Assertion {
    let worst = samples
        .iter()
        .filter(|s| in_window(s, from, to))
        .map(|s| s.latency)
        .max()
        .unwrap_or_default();
    Assertion::new(
        "max_latency",
        format!(
            "every answer sent in [{}, {}) < {}",
            secs(from),
            secs(to),
            fmt_ms(max)
        ),
        fmt_ms(worst),
        worst < max,
    )
}

/// [`Check::LocalSafetyLimit`]: degraded 200s per replica at most
/// `per_replica`, and some (the fault did degrade the limiter).
fn check_local_safety_limit(samples: &[Sample], per_replica: usize) -> Assertion {
    let mut by_replica = std::collections::BTreeMap::<usize, usize>::new();
    for s in samples
        .iter()
        .filter(|s| status(s) == Some(200) && s.ratelimit_degraded)
    {
        *by_replica.entry(s.replica).or_default() += 1;
    }
    let worst = by_replica.values().copied().max().unwrap_or(0);
    Assertion::new(
        "local_safety_limit",
        format!("degraded 200s per replica <= {per_replica} (limit / replicas), and > 0"),
        format!("{by_replica:?}"),
        worst <= per_replica && worst > 0,
    )
}

/// [`Check::ExactLimitResumes`]: after `heal`, an exact 429 within
/// `within`, nothing degraded after that, at most `limit` exact 200s.
fn check_exact_limit_resumes(
    samples: &[Sample],
    heal: Duration,
    within: Duration,
    limit: usize,
) -> Assertion {
    let after: Vec<&Sample> = samples.iter().filter(|s| s.sent >= heal).collect();
    let first_exact_429 = after
        .iter()
        .find(|s| status(s) == Some(429) && !s.ratelimit_degraded)
        .map(|s| s.sent - heal);
    let late_degraded = after
        .iter()
        .filter(|s| s.sent >= heal + within && s.ratelimit_degraded)
        .count();
    let admitted = after
        .iter()
        .filter(|s| status(s) == Some(200) && !s.ratelimit_degraded)
        .count();
    Assertion::new(
        "exact_limit_resumes",
        format!(
            "a non-degraded 429 within {} of the restart; no degraded answer after it; <= {limit} exact 200s",
            secs(within)
        ),
        format!(
            "first exact 429 after {}; {late_degraded} late degraded; {admitted} exact 200s",
            first_exact_429.map_or("never".to_owned(), secs)
        ),
        first_exact_429.is_some_and(|t| t <= within) && late_degraded == 0 && admitted <= limit,
    )
}

/// [`Check::SharedLimitExact`]: 200s across replicas between `limit` minus
/// the requests lost with a killed replica and `limit`, none degraded.
fn check_shared_limit_exact(samples: &[Sample], limit: usize) -> Assertion {
    let admitted = samples.iter().filter(|s| status(s) == Some(200)).count();
    let lost = samples
        .iter()
        .filter(|s| s.outcome == Outcome::Error)
        .count();
    let degraded = samples.iter().filter(|s| s.ratelimit_degraded).count();
    Assertion::new(
        "shared_limit_exact",
        format!("{limit} - lost <= admitted (all replicas) <= {limit}; none degraded"),
        format!("{admitted} admitted; {lost} lost with the killed replica; {degraded} degraded"),
        admitted <= limit && admitted + lost >= limit && degraded == 0,
    )
}

/// [`Check::FailuresBeforeOpen`]: at most `max` LLM failures in the
/// window, and some fast 503s (the breaker did open).
fn check_failures_before_open(
    samples: &[Sample],
    from: Duration,
    to: Duration,
    max: usize,
) -> Assertion {
    let failures = samples
        .iter()
        .filter(|s| in_window(s, from, to))
        .filter(|s| matches!(status(s), Some(502 | 504)))
        .count();
    let rejected = samples
        .iter()
        .filter(|s| in_window(s, from, to) && status(s) == Some(503))
        .count();
    Assertion::new(
        "failures_before_open",
        format!("LLM failures (502/504) during the fault <= K = {max}, and the breaker rejects the rest"),
        format!("{failures} failures; {rejected} fast 503s"),
        failures <= max && rejected > 0,
    )
}

/// [`Check::BreakerOpensWithin`]: the first `dependency_unavailable` 503
/// sent within `within` of `from`.
fn check_breaker_opens_within(samples: &[Sample], from: Duration, within: Duration) -> Assertion {
    let first = samples
        .iter()
        .filter(|s| s.sent >= from)
        .find(|s| {
            status(s) == Some(503) && s.error_code.as_deref() == Some("dependency_unavailable")
        })
        .map(|s| s.sent - from);
    Assertion::new(
        "breaker_opens_within",
        format!("first LLM-breaker 503 within {} of the fault", secs(within)),
        first.map_or("never".to_owned(), secs),
        first.is_some_and(|t| t <= within),
    )
}

/// [`Check::ProbesBounded`]: over pairs of polls both open or half-open,
/// the simulator's chat counter grows by at most `max_probes`; and the
/// breaker went from closed to open at least `min_opens` times.
fn check_probes_bounded(polls: &[Poll], max_probes: u64, min_opens: usize) -> Assertion {
    let open = |p: &Poll| matches!(p.llm_state.as_deref(), Some("open" | "half_open"));
    let mut worst = 0;
    let mut opens = 0;
    for pair in polls.windows(2) {
        if open(&pair[1]) && pair[0].llm_state.as_deref() == Some("closed") {
            opens += 1;
        }
        if let (true, true, Some(a), Some(b)) = (
            open(&pair[0]),
            open(&pair[1]),
            pair[0].sim_chat,
            pair[1].sim_chat,
        ) {
            worst = worst.max(b.saturating_sub(a));
        }
    }
    Assertion::new(
        "half_open_probes",
        format!("LLM calls per {} ms while open/half-open <= {max_probes}; breaker opened >= {min_opens} times", POLL_EVERY.as_millis()),
        format!("max {worst} calls; opened {opens} times; {} polls", polls.len()),
        worst <= max_probes && opens >= min_opens,
    )
}

/// [`Check::AllDegraded`]: every response sent in the window (and there
/// are some) a 200 with `metadata.degraded = true`.
fn check_all_degraded(samples: &[Sample], from: Duration, to: Duration) -> Assertion {
    let window: Vec<&Sample> = samples.iter().filter(|s| in_window(s, from, to)).collect();
    let bad = window
        .iter()
        .filter(|s| !(status(s) == Some(200) && s.body_degraded))
        .count();
    Assertion::new(
        "all_degraded",
        format!(
            "every answer sent in [{}, {}) is 200 with metadata.degraded = true",
            secs(from),
            secs(to)
        ),
        format!("{bad} of {} not", window.len()),
        bad == 0 && !window.is_empty(),
    )
}

/// [`Check::Recovers`]: no abnormal answer sent from `heal + within` to
/// `end` (the end of the load, which must come after it), and some sent.
fn check_recovers(
    samples: &[Sample],
    heal: Duration,
    within: Duration,
    ok: &[u16],
    end: Duration,
) -> Assertion {
    let after: Vec<&Sample> = samples.iter().filter(|s| s.sent >= heal).collect();
    // The last abnormal answer after the heal bounds the recovery.
    let last_bad = after
        .iter()
        .filter(|s| {
            !status(s).is_some_and(|c| ok.contains(&c)) || s.ratelimit_degraded || s.body_degraded
        })
        .map(|s| s.sent - heal)
        .max();
    let tail = after.iter().filter(|s| s.sent >= heal + within).count();
    Assertion::new(
        "recovers",
        format!(
            "every answer sent from {} after the heal to the end is {ok:?} and undegraded",
            secs(within)
        ),
        format!(
            "last abnormal answer {} after the heal; {tail} answers checked",
            last_bad.map_or("none".to_owned(), secs)
        ),
        last_bad.is_none_or(|t| t < within) && tail > 0 && heal + within < end,
    )
}

/// Whether `s` was sent in `[from, to)`.
fn in_window(s: &Sample, from: Duration, to: Duration) -> bool {
    s.sent >= from && s.sent < to
}

/// The HTTP status of `s`; `None` for timeouts and transport errors.
fn status(s: &Sample) -> Option<u16> {
    match s.outcome {
        Outcome::Status(code) => Some(code),
        _ => None,
    }
}

/// The 99th percentile (nearest rank) of `latencies`, which it sorts;
/// `None` when empty.
fn p99(latencies: &mut [Duration]) -> Option<Duration> {
    latencies.sort();
    let n = latencies.len();
    (n > 0).then(|| latencies[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1])
}

/// `d` in milliseconds, two decimals, for assertion texts.
fn fmt_ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// `d` in seconds, two decimals, for assertion texts.
fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}
