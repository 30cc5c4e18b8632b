//! The breaker's trip policy: when closed, does this outcome open it?
//!
//! Failure decisions go through failsafe's [`FailurePolicy`] trait:
//! [`TripRule::ConsecutiveFailures`] uses failsafe's own
//! `consecutive_failures` policy, which keeps no time. failsafe's
//! `success_rate_over_time_window` reads `std::time::Instant` (so it cannot
//! run on paused test time), uses an exponentially weighted average rather
//! than a rate, and will not trip before one whole window has passed since
//! creation; [`TripRule::FailureRate`] therefore uses our
//! [`FailureRateOverTimeWindow`], a bucketed window on tokio's clock that
//! implements the same trait. Slow calls have no failsafe equivalent and
//! are counted in a second window ([`SlowCallRule`]).
//!
//! The `Duration` a failsafe policy returns on a trip is not used: open
//! timing belongs to the gate ([`super::Backoff`]), on tokio's clock.

use std::time::Duration;

use failsafe::failure_policy::{consecutive_failures, FailurePolicy};
use tokio::time::Instant;

/// Buckets per window: calls age out in steps of a tenth of the window.
const BUCKETS: usize = 10;

/// When the failure count trips a closed breaker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TripRule {
    /// After this many failures in a row (successes reset the count).
    ConsecutiveFailures(u32),
    /// When failures / calls in the last `window` reach `rate`, once at
    /// least `min_calls` calls were seen in it.
    FailureRate {
        /// Failure fraction that trips, in `(0, 1]`.
        rate: f64,
        /// Calls the window must hold before it can trip.
        min_calls: u32,
        /// How far back calls count.
        window: Duration,
    },
}

/// When slow successes trip a closed breaker: slow / calls in the last
/// `window` reach `rate`, once at least `min_calls` calls were seen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlowCallRule {
    /// A success slower than this is slow.
    pub threshold: Duration,
    /// Slow fraction that trips, in `(0, 1]`.
    pub rate: f64,
    /// Calls the window must hold before it can trip.
    pub min_calls: u32,
    /// How far back calls count.
    pub window: Duration,
}

/// A failure-rate policy over a sliding window on tokio's clock, for
/// failsafe's [`FailurePolicy`] interface.
#[derive(Debug)]
pub struct FailureRateOverTimeWindow {
    rate: f64,
    min_calls: u32,
    window: RollingWindow,
}

impl FailureRateOverTimeWindow {
    /// Trips when failures / calls over `window` reach `rate` with at least
    /// `min_calls` calls.
    pub fn new(rate: f64, min_calls: u32, window: Duration) -> Self {
        Self {
            rate,
            min_calls,
            window: RollingWindow::new(window),
        }
    }
}

impl FailurePolicy for FailureRateOverTimeWindow {
    fn record_success(&mut self) {
        self.window.record(Instant::now(), false);
    }

    fn mark_dead_on_failure(&mut self) -> Option<Duration> {
        let now = Instant::now();
        self.window.record(now, true);
        self.window
            .reached(now, self.rate, self.min_calls)
            .then_some(Duration::ZERO)
    }

    fn revived(&mut self) {
        self.window.reset();
    }
}

/// Counts calls, and among them flagged calls (failures or slow calls), in
/// [`BUCKETS`] slices of a window.
#[derive(Debug, Clone)]
pub(crate) struct RollingWindow {
    origin: Instant,
    slice: Duration,
    buckets: [Bucket; BUCKETS],
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    epoch: u64,
    calls: u32,
    flagged: u32,
}

impl RollingWindow {
    pub(crate) fn new(window: Duration) -> Self {
        let slice = (window / BUCKETS as u32).max(Duration::from_nanos(1));
        Self {
            origin: Instant::now(),
            slice,
            buckets: [Bucket::default(); BUCKETS],
        }
    }

    fn epoch(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(elapsed / self.slice.as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn record(&mut self, now: Instant, flagged: bool) {
        let epoch = self.epoch(now);
        let bucket = &mut self.buckets[(epoch % BUCKETS as u64) as usize];
        if bucket.epoch != epoch {
            *bucket = Bucket {
                epoch,
                ..Bucket::default()
            };
        }
        bucket.calls = bucket.calls.saturating_add(1);
        bucket.flagged = bucket.flagged.saturating_add(u32::from(flagged));
    }

    /// (calls, flagged) in the window ending at `now`.
    pub(crate) fn totals(&self, now: Instant) -> (u32, u32) {
        let epoch = self.epoch(now);
        self.buckets
            .iter()
            .filter(|b| b.epoch <= epoch && epoch - b.epoch < BUCKETS as u64)
            .fold((0, 0), |(c, f), b| {
                (c.saturating_add(b.calls), f.saturating_add(b.flagged))
            })
    }

    fn reached(&self, now: Instant, rate: f64, min_calls: u32) -> bool {
        let (calls, flagged) = self.totals(now);
        calls > 0 && calls >= min_calls && f64::from(flagged) / f64::from(calls) >= rate
    }

    pub(crate) fn reset(&mut self) {
        self.buckets = [Bucket::default(); BUCKETS];
    }
}

/// What the closed breaker learned from one completed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Observed {
    Success,
    Slow,
    Failure,
}

/// The closed breaker's memory: a failsafe failure policy plus the
/// slow-call window.
pub(crate) struct TripPolicy {
    failures: Box<dyn FailurePolicy + Send>,
    slow: Option<(SlowCallRule, RollingWindow)>,
}

impl std::fmt::Debug for TripPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TripPolicy")
            .field("slow", &self.slow)
            .finish_non_exhaustive()
    }
}

impl TripPolicy {
    pub(crate) fn new(rule: TripRule, slow: Option<SlowCallRule>) -> Self {
        let failures: Box<dyn FailurePolicy + Send> = match rule {
            TripRule::ConsecutiveFailures(n) => Box::new(consecutive_failures(
                n.max(1),
                failsafe::backoff::constant(Duration::ZERO),
            )),
            TripRule::FailureRate {
                rate,
                min_calls,
                window,
            } => Box::new(FailureRateOverTimeWindow::new(rate, min_calls, window)),
        };
        Self {
            failures,
            slow: slow.map(|rule| (rule, RollingWindow::new(rule.window))),
        }
    }

    /// Records `observed`; true when the breaker should open.
    pub(crate) fn record(&mut self, observed: Observed) -> bool {
        let now = Instant::now();
        let tripped = match observed {
            Observed::Failure => self.failures.mark_dead_on_failure().is_some(),
            Observed::Success | Observed::Slow => {
                self.failures.record_success();
                false
            }
        };
        let slow_tripped = match &mut self.slow {
            Some((rule, window)) => {
                window.record(now, observed == Observed::Slow);
                observed == Observed::Slow && window.reached(now, rule.rate, rule.min_calls)
            }
            None => false,
        };
        tripped || slow_tripped
    }

    /// Forgets history (after the breaker closes again, or a reset).
    pub(crate) fn revived(&mut self) {
        self.failures.revived();
        if let Some((_, window)) = &mut self.slow {
            window.reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn window_forgets_calls_older_than_the_window() {
        let mut w = RollingWindow::new(Duration::from_secs(10));
        w.record(Instant::now(), true);
        w.record(Instant::now(), false);
        tokio::time::advance(Duration::from_secs(5)).await;
        w.record(Instant::now(), true);
        assert_eq!(w.totals(Instant::now()), (3, 2));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(w.totals(Instant::now()), (1, 1));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(w.totals(Instant::now()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn failure_rate_needs_min_calls_and_the_rate() {
        let mut p = FailureRateOverTimeWindow::new(0.5, 4, Duration::from_secs(10));
        assert!(p.mark_dead_on_failure().is_none());
        assert!(p.mark_dead_on_failure().is_none());
        assert!(p.mark_dead_on_failure().is_none());
        // 4 calls, 4 failures: trips.
        assert!(p.mark_dead_on_failure().is_some());
        p.revived();
        for _ in 0..3 {
            p.record_success();
        }
        // 1 failure in 4 calls: 25% < 50%.
        assert!(p.mark_dead_on_failure().is_none());
        // 2 in 5 = 40%, then 3 in 6 = 50%.
        assert!(p.mark_dead_on_failure().is_none());
        assert!(p.mark_dead_on_failure().is_some());
    }
}
