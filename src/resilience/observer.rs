//! [`ResilienceObserver`]: the hook through which metrics count breaker
//! transitions and outcomes, retries and rejections. Every method has a
//! no-op default, so an implementation overrides only what it counts; the
//! handle is passed in, never a global.

use std::fmt;
use std::time::Duration;

use super::breaker::StateKind;

/// What the breaker made of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    /// The call succeeded within the slow-call threshold.
    Success,
    /// The call succeeded, but slower than the slow-call threshold.
    Slow,
    /// The call failed in a way that counts against the dependency.
    Failure,
    /// The call ended in a way that is neither (e.g. a full bulkhead).
    Ignored,
    /// The breaker refused the call without calling the dependency.
    Rejected,
}

impl CallOutcome {
    /// The stable lower-case name, for metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Slow => "slow",
            Self::Failure => "failure",
            Self::Ignored => "ignored",
            Self::Rejected => "rejected",
        }
    }
}

impl fmt::Display for CallOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Receives resilience events of one or more dependencies. Called outside
/// any lock, on the request path: implementations must be cheap (a counter
/// increment), and must not block.
pub trait ResilienceObserver: Send + Sync + 'static {
    /// The breaker of `dependency` moved from `from` to `to`.
    fn breaker_transition(&self, _dependency: &'static str, _from: StateKind, _to: StateKind) {}

    /// The breaker of `dependency` classified a call.
    fn breaker_outcome(&self, _dependency: &'static str, _outcome: CallOutcome) {}

    /// A call to `dependency` will be retried after `delay`; `attempt` is the
    /// number of the attempt about to start (2 for the first retry).
    fn retry(&self, _dependency: &'static str, _attempt: u32, _delay: Duration) {}

    /// A retryable failure of `dependency` was not retried because the
    /// retry budget is spent.
    fn retry_budget_exhausted(&self, _dependency: &'static str) {}

    /// The bulkhead of `dependency` rejected a call.
    fn bulkhead_rejected(&self, _dependency: &'static str) {}
}

/// An observer that ignores every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopObserver;

impl ResilienceObserver for NoopObserver {}
