//! The checks: [`Check`], an assertion over the samples (and polls, and
//! jobs read back) of a run stated as numbers, and [`evaluate`], which dispatches each kind to
//! one function that measures it and returns an [`Assertion`] with the
//! bound and the measurement side by side. Kept apart from the catalogue
//! (which chooses the numbers) and the runner (which collects the samples).

use std::time::Duration;

use std::collections::BTreeMap;

use super::super::load::{Outcome, Sample};
use super::super::report::{Assertion, ScenarioReport};
use super::execute::{Poll, POLL_EVERY};
use super::jobs::{JobRecord, JobsObserved};

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
    /// Every answer with `status` carries `Retry-After`.
    RetryAfterOn {
        /// The status, e.g. 503 (come back later) or 429 (slow down).
        status: u16,
    },
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
    /// `check` over the samples of one tenant's stream only; fails when
    /// that tenant sent nothing (a check over no samples proves nothing).
    Tenant {
        /// The stream's tenant label.
        tenant: &'static str,
        /// The check on its samples.
        check: Box<Check>,
    },
    /// The `quantile` latency of answers sent in `loaded` is at most the
    /// same quantile of answers sent in `unloaded` plus `slack`: load
    /// elsewhere costs this traffic at most `slack`. Timeouts count with
    /// the latency they waited.
    LatencyVsUnloaded {
        /// 0.5 for p50, 0.99 for p99 (nearest rank).
        quantile: f64,
        /// The reference window `[from, to)`, before the load.
        unloaded: (Duration, Duration),
        /// The window under load `[from, to)`.
        loaded: (Duration, Duration),
        /// How much worse the loaded quantile may be.
        slack: Duration,
    },
    /// 200s among requests sent in `[from, to)`, per second of the window,
    /// are at least `min_per_s`.
    AdmittedRate {
        /// Window start.
        from: Duration,
        /// Window end.
        to: Duration,
        /// Bound, in 200s per second.
        min_per_s: f64,
        /// Where the bound comes from, for the report.
        basis: String,
    },
    /// Every job submission was answered 202 with a `job_id` or 429
    /// `queue_full`, nothing else (no client timeout, no transport error),
    /// and both happened: the burst filled the queue and met its bound.
    JobSubmissions,
    /// Every job answered 202 was read back `succeeded` (none lost,
    /// failed, dead or unfinished), and there were some.
    NoJobLost,
    /// Jobs started (by their `started_at`) in any window of `w`, for
    /// each `w` of `windows`, are at most `rate x w + burst`: the backlog
    /// drains no faster than the tenant's limit allows.
    JobStartRate {
        /// The tenant's rate, jobs per second.
        rate: f64,
        /// Its burst allowance (a sliding log's `limit`).
        burst: u64,
        /// The window lengths.
        windows: Vec<Duration>,
    },
    /// Every accepted job finished by `burst_end + backlog / rate + margin
    /// + reclaim`, where the backlog is the accepted jobs unfinished at
    /// `burst_end`.
    DrainWithin {
        /// When the submissions stopped, from the start of the load.
        burst_end: Duration,
        /// The tenant's rate, jobs per second.
        rate: f64,
        /// Slack on the drain.
        margin: Duration,
        /// Time for a killed replica's jobs to be taken over (the
        /// visibility timeout).
        reclaim: Duration,
    },
    /// The replicas alive at the end took over at least `min` jobs a
    /// killed one held (`levee_jobs_total{outcome="reclaimed"}`), and at
    /// least `min_rerun` accepted jobs were started twice (running when
    /// it died, run again elsewhere): the kill did catch jobs in flight.
    JobsReclaimed {
        /// Bound on jobs taken over.
        min: u64,
        /// Bound on jobs started more than once.
        min_rerun: usize,
    },
}

/// Evaluates one check; `end` is the end of the load.
pub(super) fn evaluate(
    check: &Check,
    samples: &[Sample],
    polls: &[Poll],
    jobs: &JobsObserved,
    end: Duration,
) -> Assertion {
    match check {
        Check::Statuses {
            allowed,
            max_timeouts,
            max_errors,
        } => check_statuses(samples, allowed, *max_timeouts, *max_errors),
        Check::RetryAfterOn { status } => check_retry_after_on(samples, *status),
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
        Check::Tenant { tenant, check } => check_tenant(samples, tenant, check, polls, jobs, end),
        Check::LatencyVsUnloaded {
            quantile,
            unloaded,
            loaded,
            slack,
        } => check_latency_vs_unloaded(samples, *quantile, *unloaded, *loaded, *slack),
        Check::AdmittedRate {
            from,
            to,
            min_per_s,
            basis,
        } => check_admitted_rate(samples, *from, *to, *min_per_s, basis),
        Check::JobSubmissions => check_job_submissions(samples),
        Check::NoJobLost => check_no_job_lost(&jobs.jobs),
        Check::JobStartRate {
            rate,
            burst,
            windows,
        } => check_job_start_rate(&jobs.jobs, *rate, *burst, windows),
        Check::DrainWithin {
            burst_end,
            rate,
            margin,
            reclaim,
        } => check_drain_within(&jobs.jobs, *burst_end, *rate, *margin, *reclaim),
        Check::JobsReclaimed { min, min_rerun } => check_jobs_reclaimed(jobs, *min, *min_rerun),
    }
}

/// The main run's verdict on its contrast: the contrast ran and failed at
/// least one of its checks, so the checks can tell the two apart.
pub(super) fn contrast_fails(contrast: &ScenarioReport) -> Assertion {
    let label = contrast.variant.as_deref().unwrap_or("contrast");
    let failed: Vec<&str> = contrast
        .assertions
        .iter()
        .filter(|a| !a.passed)
        .map(|a| a.name.as_str())
        .collect();
    let measured = match &contrast.error {
        Some(e) => format!("the {label} run did not run: {e}"),
        None => format!(
            "{} of {} failed: {failed:?}",
            failed.len(),
            contrast.assertions.len()
        ),
    };
    Assertion::new(
        "contrast_fails",
        format!("the {label} run fails at least one of the same checks (the scenario can fail)"),
        measured,
        contrast.error.is_none() && !failed.is_empty(),
    )
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

/// [`Check::RetryAfterOn`]: no `code` answer without `Retry-After`.
fn check_retry_after_on(samples: &[Sample], code: u16) -> Assertion {
    let all = samples.iter().filter(|s| status(s) == Some(code)).count();
    let missing = samples
        .iter()
        .filter(|s| status(s) == Some(code) && !s.retry_after)
        .count();
    Assertion::new(
        &format!("retry_after_on_{code}"),
        format!("every {code} has Retry-After"),
        format!("{missing} of {all} {code}s without"),
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
    let measured = quantile(&mut latencies, 0.99);
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

/// [`Check::Tenant`]: `check` over `tenant`'s samples, named after it.
fn check_tenant(
    samples: &[Sample],
    tenant: &str,
    check: &Check,
    polls: &[Poll],
    jobs: &JobsObserved,
    end: Duration,
) -> Assertion {
    let theirs: Vec<Sample> = samples
        .iter()
        .filter(|s| s.tenant.as_deref() == Some(tenant))
        .cloned()
        .collect();
    let mut assertion = evaluate(check, &theirs, polls, jobs, end);
    assertion.name = format!("{tenant}.{}", assertion.name);
    assertion.expected = format!("{tenant} tenant: {}", assertion.expected);
    if theirs.is_empty() {
        assertion.measured = format!("no samples from tenant {tenant:?}");
        assertion.passed = false;
    }
    assertion
}

/// [`Check::LatencyVsUnloaded`]: the loaded window's quantile within
/// `slack` of the unloaded window's.
fn check_latency_vs_unloaded(
    samples: &[Sample],
    q: f64,
    unloaded: (Duration, Duration),
    loaded: (Duration, Duration),
    slack: Duration,
) -> Assertion {
    let latencies = |(from, to): (Duration, Duration)| -> Vec<Duration> {
        samples
            .iter()
            .filter(|s| in_window(s, from, to))
            .map(|s| s.latency)
            .collect()
    };
    let (mut before, mut during) = (latencies(unloaded), latencies(loaded));
    let (n_before, n_during) = (before.len(), during.len());
    let name = format!("p{}", (q * 100.0).round());
    let (base, now) = (quantile(&mut before, q), quantile(&mut during, q));
    let measured = match (base, now) {
        (Some(base), Some(now)) => format!(
            "{} vs {} unloaded ({:+.2} ms); {n_during} and {n_before} answers",
            fmt_ms(now),
            fmt_ms(base),
            (now.as_secs_f64() - base.as_secs_f64()) * 1000.0
        ),
        _ => format!("no samples ({n_during} loaded, {n_before} unloaded)"),
    };
    Assertion::new(
        &format!("{name}_vs_unloaded"),
        format!(
            "{name} of answers sent in [{}, {}) <= {name} unloaded (sent in [{}, {})) + {}",
            secs(loaded.0),
            secs(loaded.1),
            secs(unloaded.0),
            secs(unloaded.1),
            fmt_ms(slack)
        ),
        measured,
        matches!((base, now), (Some(base), Some(now)) if now <= base + slack),
    )
}

/// [`Check::AdmittedRate`]: 200s per second of the window, at least
/// `min_per_s`.
fn check_admitted_rate(
    samples: &[Sample],
    from: Duration,
    to: Duration,
    min_per_s: f64,
    basis: &str,
) -> Assertion {
    let admitted = samples
        .iter()
        .filter(|s| in_window(s, from, to) && status(s) == Some(200))
        .count();
    let window = to.saturating_sub(from).as_secs_f64();
    let rate = if window > 0.0 {
        admitted as f64 / window
    } else {
        0.0
    };
    Assertion::new(
        "admitted_rate",
        format!(
            ">= {min_per_s:.1} 200s/s among requests sent in [{}, {}) ({basis})",
            secs(from),
            secs(to)
        ),
        format!("{rate:.1}/s ({admitted} 200s in {window:.2}s)"),
        rate >= min_per_s,
    )
}

/// [`Check::JobSubmissions`]: 202s with a job id and 429 `queue_full`s,
/// both, and nothing else.
fn check_job_submissions(samples: &[Sample]) -> Assertion {
    let accepted = samples
        .iter()
        .filter(|s| status(s) == Some(202) && s.job_id.is_some())
        .count();
    let queue_full = samples
        .iter()
        .filter(|s| status(s) == Some(429) && s.error_code.as_deref() == Some("queue_full"))
        .count();
    let mut others = BTreeMap::<String, usize>::new();
    for s in samples {
        let key = match (s.outcome, s.error_code.as_deref()) {
            (Outcome::Status(202), _) if s.job_id.is_some() => continue,
            (Outcome::Status(429), Some("queue_full")) => continue,
            (Outcome::Status(code), Some(err)) => format!("{code} {err}"),
            (Outcome::Status(code), None) => code.to_string(),
            (Outcome::Timeout, _) => "timeout".to_owned(),
            (Outcome::Error, _) => "transport error".to_owned(),
        };
        *others.entry(key).or_default() += 1;
    }
    let other: usize = others.values().sum();
    Assertion::new(
        "job_submissions",
        "every submission 202 with a job_id or 429 queue_full (no other status, timeout or transport error); some of each".to_owned(),
        format!(
            "{accepted} accepted (202), {queue_full} queue_full (429), {other} other {others:?}; {} submitted",
            samples.len()
        ),
        other == 0 && accepted > 0 && queue_full > 0,
    )
}

/// [`Check::NoJobLost`]: every accepted job read back `succeeded`.
fn check_no_job_lost(jobs: &[JobRecord]) -> Assertion {
    let mut by_status = BTreeMap::<String, usize>::new();
    for job in jobs {
        let key = match (&job.status, &job.read_error) {
            (_, Some(e)) => format!("unreadable ({e})"),
            (Some(s), None) if job.is_terminal() => s.clone(),
            (Some(s), None) => format!("unfinished ({s})"),
            (None, None) => "never read".to_owned(),
        };
        *by_status.entry(key).or_default() += 1;
    }
    let succeeded = by_status.get("succeeded").copied().unwrap_or(0);
    let restarted = jobs.iter().filter(|j| j.attempts > 1).count();
    Assertion::new(
        "no_job_lost",
        "every accepted job ends succeeded (0 lost, failed, dead or unfinished)".to_owned(),
        format!(
            "{} lost of {} accepted; {by_status:?}; {restarted} started more than once",
            jobs.len() - succeeded,
            jobs.len()
        ),
        succeeded == jobs.len() && !jobs.is_empty(),
    )
}

/// [`Check::JobStartRate`]: the most starts in any window of each length,
/// against `rate x w + burst`.
fn check_job_start_rate(
    jobs: &[JobRecord],
    rate: f64,
    burst: u64,
    windows: &[Duration],
) -> Assertion {
    let mut starts: Vec<Duration> = jobs.iter().filter_map(|j| j.started).collect();
    starts.sort();
    let mut held = !starts.is_empty();
    let mut parts = Vec::new();
    for &w in windows {
        let bound = rate * w.as_secs_f64() + burst as f64;
        let most = most_in_window(&starts, w);
        held &= most as f64 <= bound;
        parts.push(format!(
            "{most} in {} (<= {bound:.0}, {:.1}/s)",
            secs(w),
            most as f64 / w.as_secs_f64()
        ));
    }
    let sustained = match (starts.first(), starts.last()) {
        (Some(a), Some(b)) if b > a => format!(
            "{:.2}/s over {}",
            (starts.len() - 1) as f64 / (*b - *a).as_secs_f64(),
            secs(*b - *a)
        ),
        _ => "n/a".to_owned(),
    };
    Assertion::new(
        "job_start_rate",
        format!(
            "jobs started in any window of w <= {rate} x w + {burst} (limit {rate}/s, burst {burst}), for w in {:?}",
            windows.iter().map(|w| secs(*w)).collect::<Vec<_>>()
        ),
        format!(
            "most started: {}; sustained {sustained}; {} starts",
            parts.join(", "),
            starts.len()
        ),
        held,
    )
}

/// The most of the sorted `times` in any window `[t, t + w)`.
fn most_in_window(times: &[Duration], w: Duration) -> usize {
    let mut most = 0;
    let mut first = 0;
    for (last, t) in times.iter().enumerate() {
        while times[first] + w <= *t {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

/// [`Check::DrainWithin`]: the last finish against `burst_end + backlog /
/// rate + margin + reclaim`.
fn check_drain_within(
    jobs: &[JobRecord],
    burst_end: Duration,
    rate: f64,
    margin: Duration,
    reclaim: Duration,
) -> Assertion {
    let backlog = jobs
        .iter()
        .filter(|j| j.finished.is_none_or(|f| f > burst_end))
        .count();
    let unfinished = jobs.iter().filter(|j| j.finished.is_none()).count();
    let allowed = Duration::from_secs_f64(backlog as f64 / rate) + margin + reclaim;
    let last = jobs.iter().filter_map(|j| j.finished).max();
    let took = last.map(|l| l.saturating_sub(burst_end));
    Assertion::new(
        "drain_within",
        format!(
            "every accepted job finished within backlog / {rate}/s + {} + {} (visibility timeout, for the killed replica's jobs) of the burst's end ({})",
            secs(margin),
            secs(reclaim),
            secs(burst_end)
        ),
        format!(
            "backlog {backlog} at the burst's end; drained in {} (bound {}); {unfinished} unfinished",
            took.map_or("never".to_owned(), secs),
            secs(allowed)
        ),
        unfinished == 0 && !jobs.is_empty() && took.is_some_and(|t| t <= allowed),
    )
}

/// [`Check::JobsReclaimed`]: the survivors' `reclaimed` count, and the
/// accepted jobs with more than one delivery.
fn check_jobs_reclaimed(jobs: &JobsObserved, min: u64, min_rerun: usize) -> Assertion {
    let count = |outcome: &str| jobs.counters.get(outcome).copied().unwrap_or(0);
    let rerun = jobs.jobs.iter().filter(|j| j.attempts > 1).count();
    Assertion::new(
        "jobs_reclaimed",
        format!("the survivors took over >= {min} jobs the killed replica held (levee_jobs_total{{outcome=\"reclaimed\"}}), >= {min_rerun} of them caught running (started twice)"),
        format!(
            "{} reclaimed; {rerun} started twice ({} retried); survivors' counters {:?}",
            count("reclaimed"),
            count("retried"),
            jobs.counters
        ),
        count("reclaimed") >= min && rerun >= min_rerun,
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

/// The `q` quantile (nearest rank) of `latencies`, which it sorts; `None`
/// when empty.
fn quantile(latencies: &mut [Duration], q: f64) -> Option<Duration> {
    latencies.sort();
    let n = latencies.len();
    (n > 0).then(|| latencies[((n as f64 * q).ceil() as usize).clamp(1, n) - 1])
}

/// `d` in milliseconds, two decimals, for assertion texts.
fn fmt_ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// `d` in seconds, two decimals, for assertion texts.
fn secs(d: Duration) -> String {
    format!("{:.2}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::super::{noisy_neighbour, Profile};
    use super::*;

    /// The loaded window of `noisy-neighbour` under the CI profile.
    const FLOOD_MS: u64 = 6_000;
    const END_MS: u64 = 18_000;

    fn sample(tenant: &str, sent_ms: u64, latency_ms: u64, outcome: Outcome) -> Sample {
        Sample {
            sent: Duration::from_millis(sent_ms),
            latency: Duration::from_millis(latency_ms),
            outcome,
            replica: 0,
            ratelimit_degraded: false,
            // Levee puts Retry-After on every 429 and 503 it answers.
            retry_after: matches!(outcome, Outcome::Status(429 | 503)),
            body_degraded: false,
            error_code: None,
            tenant: Some(tenant.to_owned()),
            job_id: None,
        }
    }

    /// The quiet tenant at 5/s for the whole run; `loaded` decides each
    /// request's latency and outcome during the flood (by its index).
    fn quiet(loaded: impl Fn(u64) -> (u64, Outcome)) -> Vec<Sample> {
        (0..END_MS / 200)
            .map(|n| {
                let sent = n * 200;
                // Unloaded: 100 ms of service plus 3-8 ms of gateway.
                let (latency, outcome) = match sent < FLOOD_MS {
                    true => (103 + n % 6, Outcome::Status(200)),
                    false => loaded(n),
                };
                sample("quiet", sent, latency, outcome)
            })
            .collect()
    }

    /// The noisy tenant at 160/s during the flood; `ok_per_160` of every
    /// 160 answered 200 (after 100-400 ms), the rest `refused` at once.
    fn noisy(ok_per_160: u64, refused: Outcome) -> Vec<Sample> {
        (0..(END_MS - FLOOD_MS) * 160 / 1000)
            .map(|n| {
                let sent = FLOOD_MS + n * 1000 / 160;
                match n % 160 < ok_per_160 {
                    true => sample("noisy", sent, 100 + n % 300, Outcome::Status(200)),
                    false => sample("noisy", sent, 2, refused),
                }
            })
            .collect()
    }

    /// Evaluates every check of `noisy-neighbour`; `(name, passed)`.
    fn verdicts(samples: &[Sample]) -> Vec<(String, bool)> {
        let scenario = noisy_neighbour(&Profile::CI);
        assert_eq!(scenario.load.duration(), Duration::from_millis(END_MS));
        assert_eq!(scenario.fault_window.0, Duration::from_millis(FLOOD_MS));
        scenario
            .checks
            .iter()
            .map(|c| {
                let jobs = JobsObserved::default();
                evaluate(c, samples, &[], &jobs, scenario.load.duration())
            })
            .map(|a| (a.name, a.passed))
            .collect()
    }

    fn failed(verdicts: &[(String, bool)]) -> Vec<&str> {
        verdicts
            .iter()
            .filter(|(_, passed)| !passed)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    fn merged(mut a: Vec<Sample>, b: Vec<Sample>) -> Vec<Sample> {
        a.extend(b);
        a.sort_by_key(|s| s.sent);
        a
    }

    #[test]
    fn noisy_neighbour_checks_pass_when_the_quiet_tenant_is_isolated() {
        // Quiet waits at most one slot (12.5 ms) for its LLM call; noisy
        // gets 73 of its 160/s through (C = 80/s minus quiet's 5/s, less
        // a little), the rest 429 with Retry-After.
        let quiet = quiet(|n| (110 + n % 8, Outcome::Status(200)));
        let verdicts = verdicts(&merged(quiet, noisy(73, Outcome::Status(429))));
        assert_eq!(verdicts.len(), 6);
        assert_eq!(failed(&verdicts), Vec::<&str>::new(), "{verdicts:?}");
    }

    #[test]
    fn noisy_neighbour_checks_fail_when_the_bulkhead_alone_sheds_the_quiet_tenant() {
        // Isolation off: the bulkhead is full of noisy calls, so 3 of 5
        // quiet requests get a fast 503 dependency_busy, and so do the
        // noisy ones beyond 75/s.
        let quiet = quiet(|n| match n % 5 < 3 {
            true => (2, Outcome::Status(503)),
            false => (105, Outcome::Status(200)),
        });
        let verdicts = verdicts(&merged(quiet, noisy(75, Outcome::Status(503))));
        // Fast 503s even flatter the quiet tenant's latency: the status
        // checks are what catch it.
        assert_eq!(
            failed(&verdicts),
            ["quiet.statuses", "noisy.statuses"],
            "{verdicts:?}"
        );
    }

    #[test]
    fn noisy_neighbour_checks_fail_when_the_quiet_tenant_waits_behind_the_flood() {
        // Every quiet answer a 200, but after a FIFO queue of noisy calls:
        // 300-420 ms instead of ~105.
        let quiet = quiet(|n| (300 + (n % 7) * 20, Outcome::Status(200)));
        let verdicts = verdicts(&merged(quiet, noisy(73, Outcome::Status(429))));
        assert_eq!(
            failed(&verdicts),
            ["quiet.p50_vs_unloaded", "quiet.p99_vs_unloaded"],
            "{verdicts:?}"
        );
    }

    #[test]
    fn p99_bound_is_the_unloaded_p99_plus_exactly_two_slots() {
        // Unloaded p99 is 108 ms (the slowest of 103..=108); the bound is
        // 108 + 2 x 100 ms / 8 = 133 ms, inclusive.
        for (worst, passes) in [(133, true), (134, false)] {
            let quiet = quiet(|n| match n % 30 == 0 {
                true => (worst, Outcome::Status(200)),
                false => (110, Outcome::Status(200)),
            });
            let verdicts = verdicts(&merged(quiet, noisy(73, Outcome::Status(429))));
            let p99 = verdicts.iter().find(|(n, _)| n == "quiet.p99_vs_unloaded");
            assert_eq!(p99.map(|(_, p)| *p), Some(passes), "worst {worst} ms");
        }
    }

    #[test]
    fn noisy_neighbour_checks_fail_when_the_noisy_tenant_is_starved_or_left_hanging() {
        let calm = || quiet(|n| (110 + n % 8, Outcome::Status(200)));
        // 67 of 160/s is 67/s, under 0.9 x (80 - 5) = 67.5/s.
        let v = verdicts(&merged(calm(), noisy(67, Outcome::Status(429))));
        assert_eq!(failed(&v), ["noisy.admitted_rate"], "{v:?}");
        // Refused requests that time out instead of getting a 429.
        let v = verdicts(&merged(calm(), noisy(73, Outcome::Timeout)));
        assert_eq!(failed(&v), ["noisy.statuses"], "{v:?}");
        // 429s without Retry-After.
        let mut bare = noisy(73, Outcome::Status(429));
        bare.iter_mut().for_each(|s| s.retry_after = false);
        let v = verdicts(&merged(calm(), bare));
        assert_eq!(failed(&v), ["noisy.retry_after_on_429"], "{v:?}");
    }

    #[test]
    fn a_tenant_check_over_no_samples_fails() {
        // Samples that lost their tenant label prove nothing either way.
        let mut unlabelled = merged(
            quiet(|_| (110, Outcome::Status(200))),
            noisy(73, Outcome::Status(429)),
        );
        unlabelled.iter_mut().for_each(|s| s.tenant = None);
        let verdicts = verdicts(&unlabelled);
        assert_eq!(failed(&verdicts).len(), 6, "{verdicts:?}");
    }

    #[test]
    fn contrast_fails_holds_only_when_the_contrast_failed_a_check() {
        let scenario = noisy_neighbour(&Profile::CI);
        let report = |passed: bool| {
            let mut r = ScenarioReport::new(
                &scenario,
                &[],
                vec![Assertion::new(
                    "quiet.statuses",
                    String::new(),
                    String::new(),
                    passed,
                )],
            );
            r.variant = Some("isolation off".to_owned());
            r
        };
        let failing = contrast_fails(&report(false));
        assert!(failing.passed, "{}", failing.measured);
        assert_eq!(failing.measured, r#"1 of 1 failed: ["quiet.statuses"]"#);
        assert!(!contrast_fails(&report(true)).passed);
        let not_run = ScenarioReport::failed_to_run(&scenario, &anyhow::anyhow!("no levee"));
        assert!(!contrast_fails(&not_run).passed);
    }

    /// `burst-absorbed` under the CI profile: the burst is [6 s, 11 s),
    /// the quiet tenant runs to 22 s.
    mod burst_absorbed {
        use super::super::super::{burst_absorbed, JobRecord, JobsObserved, Profile};
        use super::*;

        const BURST_MS: u64 = 6_000;
        const BURST_END_MS: u64 = 11_000;
        const QUIET_END_MS: u64 = 22_000;
        /// 50 queued when the burst ends, plus 5 a second during it.
        const ACCEPTED: u64 = 75;

        /// The quiet tenant at 5/s throughout, each answer after `ms`.
        fn quiet(ms: impl Fn(u64) -> u64) -> Vec<Sample> {
            (0..QUIET_END_MS / 200)
                .map(|n| sample("quiet", n * 200, ms(n), Outcome::Status(200)))
                .collect()
        }

        /// 200 submissions a second during the burst: the first
        /// [`ACCEPTED`] 202 with a job id, the rest 429 `queue_full`.
        fn submissions() -> Vec<Sample> {
            (0..1000)
                .map(|n| {
                    let mut s = sample("noisy", BURST_MS + n * 5, 2, Outcome::Status(202));
                    if n < ACCEPTED {
                        s.job_id = Some(format!("job_{n:032x}"));
                    } else {
                        s.outcome = Outcome::Status(429);
                        s.error_code = Some("queue_full".to_owned());
                    }
                    s
                })
                .collect()
        }

        /// The jobs as the gateway ran them: `per_s` start together at
        /// the top of each second from 6.03 s, each done 220 ms later; two
        /// taken over from the killed replica.
        fn jobs(per_s: u64) -> JobsObserved {
            let jobs = (0..ACCEPTED)
                .map(|n| {
                    let started =
                        Duration::from_millis(BURST_MS + 30 + (n / per_s) * 1000 + n % per_s);
                    JobRecord {
                        id: format!("job_{n:032x}"),
                        sent: Duration::from_millis(BURST_MS + n * 5),
                        replica: (n % 3) as usize,
                        status: Some("succeeded".to_owned()),
                        read_error: None,
                        attempts: 1 + u64::from(n == 20),
                        started: Some(started),
                        finished: Some(started + Duration::from_millis(220)),
                    }
                })
                .collect();
            JobsObserved {
                jobs,
                counters: [("reclaimed".to_owned(), 2), ("succeeded".to_owned(), 70)].into(),
                polled_until: Duration::from_millis(QUIET_END_MS + 500),
            }
        }

        fn verdicts(samples: &[Sample], jobs: &JobsObserved) -> Vec<(String, bool)> {
            let scenario = burst_absorbed(&Profile::CI);
            assert_eq!(
                scenario.load.duration(),
                Duration::from_millis(QUIET_END_MS)
            );
            assert_eq!(
                scenario.fault_window,
                (
                    Duration::from_millis(BURST_MS),
                    Duration::from_millis(BURST_END_MS)
                )
            );
            scenario
                .checks
                .iter()
                .map(|c| evaluate(c, samples, &[], jobs, scenario.load.duration()))
                .map(|a| (a.name, a.passed))
                .collect()
        }

        fn calm() -> Vec<Sample> {
            merged(quiet(|n| 210 + n % 9), submissions())
        }

        #[test]
        fn burst_absorbed_checks_pass_when_the_backlog_drains_at_the_tenants_rate() {
            // 5 a second: the 50 left at 11 s are done by 21.3 s, inside
            // 50 / 5 + 2 + 3 = 15 s of the burst's end.
            let verdicts = verdicts(&calm(), &jobs(5));
            assert_eq!(verdicts.len(), 8);
            assert_eq!(failed(&verdicts), Vec::<&str>::new(), "{verdicts:?}");
        }

        #[test]
        fn job_start_rate_fails_when_jobs_start_faster_than_the_limit_allows() {
            // 11 a second is one more than 5 x 1 s + 5 in some second.
            let v = verdicts(&calm(), &jobs(11));
            assert_eq!(failed(&v), ["job_start_rate"], "{v:?}");
        }

        #[test]
        fn drain_within_fails_when_the_backlog_drains_slower_than_the_rate() {
            // 3 a second: 50 / 3 = 16.7 s, past the 15 s bound.
            let v = verdicts(&calm(), &jobs(3));
            assert_eq!(failed(&v), ["drain_within"], "{v:?}");
        }

        #[test]
        fn no_job_lost_fails_when_an_accepted_job_is_dead_unfinished_or_gone() {
            for (status, error) in [
                (Some("dead"), None),
                (Some("queued"), None),
                (None, Some("404")),
            ] {
                let mut jobs = jobs(5);
                jobs.jobs[40].status = status.map(str::to_owned);
                jobs.jobs[40].read_error = error.map(str::to_owned);
                if status != Some("dead") {
                    jobs.jobs[40].finished = None;
                }
                let v = verdicts(&calm(), &jobs);
                let expected: &[&str] = match status {
                    Some("dead") => &["no_job_lost"],
                    _ => &["no_job_lost", "drain_within"],
                };
                assert_eq!(failed(&v), expected, "{status:?} {error:?}: {v:?}");
            }
        }

        #[test]
        fn job_submissions_fail_on_any_answer_but_202_or_queue_full() {
            for (outcome, code) in [
                (Outcome::Status(503), Some("dependency_unavailable")),
                (Outcome::Status(429), Some("rate_limited")),
                (Outcome::Timeout, None),
                (Outcome::Error, None),
            ] {
                let mut samples = calm();
                let late = samples
                    .iter_mut()
                    .rfind(|s| s.tenant.as_deref() == Some("noisy"))
                    .expect("noisy submissions");
                late.outcome = outcome;
                late.error_code = code.map(str::to_owned);
                let v = verdicts(&samples, &jobs(5));
                assert_eq!(failed(&v), ["noisy.job_submissions"], "{outcome:?}: {v:?}");
            }
        }

        #[test]
        fn jobs_reclaimed_fails_when_the_kill_caught_no_job_running() {
            // Nothing taken over at all.
            let mut none_left = jobs(5);
            none_left.counters.remove("reclaimed");
            let v = verdicts(&calm(), &none_left);
            assert_eq!(failed(&v), ["jobs_reclaimed"], "{v:?}");
            // Only a job it held, not one it was running.
            let mut held_only = jobs(5);
            held_only.jobs.iter_mut().for_each(|j| j.attempts = 1);
            let v = verdicts(&calm(), &held_only);
            assert_eq!(failed(&v), ["jobs_reclaimed"], "{v:?}");
        }

        #[test]
        fn quiet_tenant_checks_fail_when_the_drain_slows_its_chat() {
            // Every quiet answer from the burst on 60 ms slower: p50 is
            // past +15 ms, p99 past 2 slots (2 x 200 ms / 8 = 50 ms).
            let slow = quiet(|n| {
                if n * 200 >= BURST_MS {
                    270
                } else {
                    210 + n % 9
                }
            });
            let v = verdicts(&merged(slow, submissions()), &jobs(5));
            assert_eq!(
                failed(&v),
                ["quiet.p50_vs_unloaded", "quiet.p99_vs_unloaded"],
                "{v:?}"
            );
        }

        #[test]
        fn most_in_window_counts_a_half_open_window() {
            let t = |ms: &[u64]| {
                ms.iter()
                    .map(|&m| Duration::from_millis(m))
                    .collect::<Vec<_>>()
            };
            let w = Duration::from_secs(1);
            assert_eq!(most_in_window(&t(&[]), w), 0);
            // 0 and 1000 are not in one [t, t + 1 s).
            assert_eq!(most_in_window(&t(&[0, 500, 999, 1000]), w), 3);
            assert_eq!(most_in_window(&t(&[0, 1000, 1001, 1999, 2500]), w), 3);
        }
    }
}
