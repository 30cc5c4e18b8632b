//! [`Breaker`]: the gate. A cheap shared state (closed / open-until /
//! half-open with N probe permits) read under a short mutex on every call;
//! the [`TripPolicy`] decides when a closed breaker opens, the
//! [`Backoff`] how long it stays open. Admitted calls hold a
//! [`CallPermit`], an RAII guard: a probe dropped before it finished
//! (cancelled) gives its permit back and counts as nothing.

use std::error::Error;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use super::backoff::Backoff;
use super::classify::{Classify, DefaultClassifier, Verdict};
use super::error::CircuitOpen;
use super::policy::{Observed, SlowCallRule, TripPolicy, TripRule};
use crate::resilience::observer::{CallOutcome, ResilienceObserver};

/// What a breaker is built from (see `BreakerConfig::settings`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerSettings {
    /// When failures trip the closed breaker.
    pub trip: TripRule,
    /// When slow successes trip it; `None` never counts slowness.
    pub slow_calls: Option<SlowCallRule>,
    /// How long it stays open after consecutive trips.
    pub open: Backoff,
    /// Concurrent probes admitted while half-open; that many successful
    /// probes close it.
    pub half_open_probes: u32,
}

/// A shared handle to one dependency's breaker: the services built by
/// [`super::CircuitBreakerLayer`] and `/ready` or an admin API read and
/// steer the same state.
#[derive(Clone)]
pub struct Breaker {
    shared: Arc<Shared>,
}

/// The breaker's state, as seen now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls pass; outcomes feed the trip policy.
    Closed,
    /// Calls are refused until `until`.
    Open {
        /// When the next probe will be admitted.
        until: Instant,
        /// Time left until then.
        retry_after: Duration,
    },
    /// Up to N probes pass; the rest are refused.
    HalfOpen {
        /// Probes currently in flight.
        probes_in_flight: u32,
    },
    /// Forced open by an operator: every call is refused until a reset.
    ForcedOpen,
    /// Forced closed by an operator: every call passes and nothing trips
    /// it until a reset.
    ForcedClosed,
}

/// The name of a [`BreakerState`], for metrics labels and JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    /// See [`BreakerState::Closed`].
    Closed,
    /// See [`BreakerState::Open`].
    Open,
    /// See [`BreakerState::HalfOpen`].
    HalfOpen,
    /// See [`BreakerState::ForcedOpen`].
    ForcedOpen,
    /// See [`BreakerState::ForcedClosed`].
    ForcedClosed,
}

/// A point-in-time view of a breaker for `/ready` and the admin API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BreakerSnapshot {
    /// The dependency behind the breaker.
    pub dependency: &'static str,
    /// Current state.
    pub state: StateKind,
    /// Milliseconds since the last transition.
    pub in_state_ms: u64,
    /// While open: milliseconds until the next probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Trips since the breaker was last closed by a successful probe.
    pub consecutive_trips: u32,
    /// Half-open probes in flight.
    pub probes_in_flight: u32,
    /// Lifetime outcome counts.
    pub counts: BreakerCounts,
}

/// Lifetime outcome counts of a breaker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BreakerCounts {
    /// Successes within the slow-call threshold.
    pub successes: u64,
    /// Successes slower than the threshold.
    pub slow: u64,
    /// Failures.
    pub failures: u64,
    /// Calls that were neither (e.g. a full bulkhead).
    pub ignored: u64,
    /// Calls refused by the breaker itself.
    pub rejected: u64,
}

/// Permission to make one call, handed out by [`Breaker::permit`]. Report
/// how the call went with [`CallPermit::success`] or
/// [`CallPermit::error`]; dropping it unreported (a cancelled call)
/// releases a half-open probe slot and counts as nothing.
#[must_use = "dropping a permit unreported counts the call as nothing"]
pub struct CallPermit {
    shared: Arc<Shared>,
    generation: u64,
    probe: bool,
    started: Instant,
    done: bool,
}

struct Shared {
    dependency: &'static str,
    settings: BreakerSettings,
    classifier: Box<dyn Classify>,
    observer: Arc<dyn ResilienceObserver>,
    core: Mutex<Core>,
}

#[derive(Debug)]
struct Core {
    mode: Mode,
    /// Bumped on every transition, so outcomes of calls admitted in an
    /// earlier state cannot steer the current one.
    generation: u64,
    since: Instant,
    trips: u32,
    policy: TripPolicy,
    counts: BreakerCounts,
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    Closed,
    Open { until: Instant },
    HalfOpen { in_flight: u32, successes: u32 },
    ForcedOpen,
    ForcedClosed,
}

type Transition = Option<(StateKind, StateKind)>;

impl Breaker {
    /// A closed breaker for `dependency` with the default classifier.
    pub fn new(
        dependency: &'static str,
        settings: BreakerSettings,
        observer: Arc<dyn ResilienceObserver>,
    ) -> Self {
        Self::with_classifier(dependency, settings, observer, DefaultClassifier)
    }

    /// A closed breaker that classifies errors with `classifier`.
    pub fn with_classifier(
        dependency: &'static str,
        settings: BreakerSettings,
        observer: Arc<dyn ResilienceObserver>,
        classifier: impl Classify,
    ) -> Self {
        let core = Core {
            mode: Mode::Closed,
            generation: 0,
            since: Instant::now(),
            trips: 0,
            policy: TripPolicy::new(settings.trip, settings.slow_calls),
            counts: BreakerCounts::default(),
        };
        Self {
            shared: Arc::new(Shared {
                dependency,
                settings,
                classifier: Box::new(classifier),
                observer,
                core: Mutex::new(core),
            }),
        }
    }

    /// The dependency behind this breaker.
    pub fn dependency(&self) -> &'static str {
        self.shared.dependency
    }

    /// Admits a call, or refuses it at once with [`CircuitOpen`].
    pub fn permit(&self) -> Result<CallPermit, CircuitOpen> {
        let now = Instant::now();
        let settings = &self.shared.settings;
        let mut core = self.shared.lock();
        let transition = core.refresh(now);
        let admitted = match &mut core.mode {
            Mode::Closed | Mode::ForcedClosed => Ok(false),
            Mode::HalfOpen { in_flight, .. } if *in_flight < settings.half_open_probes => {
                *in_flight += 1;
                Ok(true)
            }
            // Probes are in flight; they will decide within an attempt
            // timeout, so suggest the shortest open time as a retry hint.
            Mode::HalfOpen { .. } => Err(settings.open.min()),
            Mode::Open { until } => Err(until.saturating_duration_since(now)),
            Mode::ForcedOpen => Err(settings.open.max()),
        };
        let generation = core.generation;
        if admitted.is_err() {
            core.counts.rejected += 1;
        }
        drop(core);
        self.shared.notify(transition);
        match admitted {
            Ok(probe) => Ok(CallPermit {
                shared: self.shared.clone(),
                generation,
                probe,
                started: now,
                done: false,
            }),
            Err(retry_after) => {
                self.shared
                    .observer
                    .breaker_outcome(self.shared.dependency, CallOutcome::Rejected);
                Err(CircuitOpen {
                    dependency: self.shared.dependency,
                    retry_after,
                })
            }
        }
    }

    /// The state now (an expired open state reads as half-open).
    pub fn state(&self) -> BreakerState {
        let now = Instant::now();
        let mut core = self.shared.lock();
        let transition = core.refresh(now);
        let state = core.state(now);
        drop(core);
        self.shared.notify(transition);
        state
    }

    /// A serializable view for `/ready` and the admin API.
    pub fn snapshot(&self) -> BreakerSnapshot {
        let now = Instant::now();
        let mut core = self.shared.lock();
        let transition = core.refresh(now);
        let state = core.state(now);
        let snapshot = BreakerSnapshot {
            dependency: self.shared.dependency,
            state: state.kind(),
            in_state_ms: millis(now.saturating_duration_since(core.since)),
            retry_after_ms: match state {
                BreakerState::Open { retry_after, .. } => Some(millis(retry_after)),
                _ => None,
            },
            consecutive_trips: core.trips,
            probes_in_flight: match state {
                BreakerState::HalfOpen { probes_in_flight } => probes_in_flight,
                _ => 0,
            },
            counts: core.counts,
        };
        drop(core);
        self.shared.notify(transition);
        snapshot
    }

    /// Opens the breaker until [`Breaker::reset`]: every call is refused.
    pub fn force_open(&self) {
        self.shared.transition(|_| Mode::ForcedOpen);
    }

    /// Closes the breaker until [`Breaker::reset`]: every call passes and
    /// no failure trips it.
    pub fn force_closed(&self) {
        self.shared.transition(|_| Mode::ForcedClosed);
    }

    /// Closes the breaker and forgets its history and trip count.
    pub fn reset(&self) {
        self.shared.transition(|core| {
            core.trips = 0;
            core.policy.revived();
            Mode::Closed
        });
    }
}

impl fmt::Debug for Breaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("dependency", &self.shared.dependency)
            .field("state", &self.state())
            .finish()
    }
}

impl BreakerState {
    /// The state's name.
    pub fn kind(&self) -> StateKind {
        match self {
            Self::Closed => StateKind::Closed,
            Self::Open { .. } => StateKind::Open,
            Self::HalfOpen { .. } => StateKind::HalfOpen,
            Self::ForcedOpen => StateKind::ForcedOpen,
            Self::ForcedClosed => StateKind::ForcedClosed,
        }
    }
}

impl StateKind {
    /// The stable lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
            Self::ForcedOpen => "forced_open",
            Self::ForcedClosed => "forced_closed",
        }
    }
}

impl fmt::Display for StateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl CallPermit {
    /// Whether this call is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The call succeeded (slow if it took longer than the threshold).
    pub fn success(mut self) {
        let elapsed = self.started.elapsed();
        let slow = self
            .shared
            .settings
            .slow_calls
            .is_some_and(|rule| elapsed > rule.threshold);
        self.finish(if slow {
            Some(Observed::Slow)
        } else {
            Some(Observed::Success)
        });
    }

    /// The call failed with `error`; the breaker's classifier decides what
    /// that means.
    pub fn error(self, error: &(dyn Error + 'static)) {
        let verdict = self.shared.classifier.classify(error);
        self.verdict(verdict);
    }

    /// Records an explicit verdict.
    pub fn verdict(mut self, verdict: Verdict) {
        match verdict {
            Verdict::Success => self.success(),
            Verdict::Failure => self.finish(Some(Observed::Failure)),
            Verdict::Ignore => self.finish(None),
        }
    }

    fn finish(&mut self, observed: Option<Observed>) {
        self.done = true;
        let shared = &self.shared;
        let now = Instant::now();
        let mut core = shared.lock();
        let outcome = core.count(observed);
        let transition = if core.generation == self.generation {
            core.apply(&shared.settings, self.probe, observed, now)
        } else {
            None
        };
        drop(core);
        shared.observer.breaker_outcome(shared.dependency, outcome);
        shared.notify(transition);
    }
}

impl Drop for CallPermit {
    fn drop(&mut self) {
        if self.done || !self.probe {
            return;
        }
        let mut core = self.shared.lock();
        if core.generation == self.generation {
            if let Mode::HalfOpen { in_flight, .. } = &mut core.mode {
                *in_flight = in_flight.saturating_sub(1);
            }
        }
    }
}

impl fmt::Debug for CallPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallPermit")
            .field("dependency", &self.shared.dependency)
            .field("probe", &self.probe)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        // The core holds counters and a state enum; a panic elsewhere
        // cannot leave it half-updated in a way worse than refusing calls.
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn transition(&self, to: impl FnOnce(&mut Core) -> Mode) {
        let now = Instant::now();
        let mut core = self.lock();
        let mode = to(&mut core);
        let transition = core.enter(mode, now);
        drop(core);
        self.notify(transition);
    }

    fn notify(&self, transition: Transition) {
        if let Some((from, to)) = transition {
            tracing::info!(dependency = self.dependency, %from, %to, "circuit breaker transition");
            self.observer.breaker_transition(self.dependency, from, to);
        }
    }
}

impl Core {
    fn state(&self, now: Instant) -> BreakerState {
        match self.mode {
            Mode::Closed => BreakerState::Closed,
            Mode::Open { until } => BreakerState::Open {
                until,
                retry_after: until.saturating_duration_since(now),
            },
            Mode::HalfOpen { in_flight, .. } => BreakerState::HalfOpen {
                probes_in_flight: in_flight,
            },
            Mode::ForcedOpen => BreakerState::ForcedOpen,
            Mode::ForcedClosed => BreakerState::ForcedClosed,
        }
    }

    fn kind(&self) -> StateKind {
        match self.mode {
            Mode::Closed => StateKind::Closed,
            Mode::Open { .. } => StateKind::Open,
            Mode::HalfOpen { .. } => StateKind::HalfOpen,
            Mode::ForcedOpen => StateKind::ForcedOpen,
            Mode::ForcedClosed => StateKind::ForcedClosed,
        }
    }

    fn enter(&mut self, mode: Mode, now: Instant) -> Transition {
        let from = self.kind();
        self.mode = mode;
        self.generation += 1;
        self.since = now;
        let to = self.kind();
        (from != to).then_some((from, to))
    }

    /// An open breaker whose time is up becomes half-open.
    fn refresh(&mut self, now: Instant) -> Transition {
        match self.mode {
            Mode::Open { until } if now >= until => self.enter(
                Mode::HalfOpen {
                    in_flight: 0,
                    successes: 0,
                },
                now,
            ),
            _ => None,
        }
    }

    fn trip(&mut self, settings: &BreakerSettings, now: Instant) -> Transition {
        self.trips = self.trips.saturating_add(1);
        let until = now + settings.open.duration(self.trips);
        self.enter(Mode::Open { until }, now)
    }

    fn count(&mut self, observed: Option<Observed>) -> CallOutcome {
        let (counter, outcome) = match observed {
            Some(Observed::Success) => (&mut self.counts.successes, CallOutcome::Success),
            Some(Observed::Slow) => (&mut self.counts.slow, CallOutcome::Slow),
            Some(Observed::Failure) => (&mut self.counts.failures, CallOutcome::Failure),
            None => (&mut self.counts.ignored, CallOutcome::Ignored),
        };
        *counter += 1;
        outcome
    }

    /// Feeds a finished call admitted in the current generation.
    fn apply(
        &mut self,
        settings: &BreakerSettings,
        probe: bool,
        observed: Option<Observed>,
        now: Instant,
    ) -> Transition {
        match (&mut self.mode, observed) {
            (Mode::Closed, Some(observed)) => {
                if self.policy.record(observed) {
                    self.trip(settings, now)
                } else {
                    None
                }
            }
            (
                Mode::HalfOpen {
                    in_flight,
                    successes,
                },
                observed,
            ) if probe => {
                *in_flight = in_flight.saturating_sub(1);
                match observed {
                    Some(Observed::Failure) => self.trip(settings, now),
                    Some(Observed::Success | Observed::Slow) => {
                        *successes += 1;
                        if *successes >= settings.half_open_probes {
                            self.trips = 0;
                            self.policy.revived();
                            self.enter(Mode::Closed, now)
                        } else {
                            None
                        }
                    }
                    None => None,
                }
            }
            _ => None,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
