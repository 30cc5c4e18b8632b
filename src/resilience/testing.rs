//! Test helpers: an observer that records every event.

use std::sync::Mutex;
use std::time::Duration;

use super::breaker::StateKind;
use super::failure::{Classified, ClassifyFailure, FailureClass};
use super::{BoxError, CallOutcome, ResilienceObserver};

/// Records every event it is told about.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    pub(crate) transitions: Mutex<Vec<(StateKind, StateKind)>>,
    pub(crate) outcomes: Mutex<Vec<CallOutcome>>,
    pub(crate) retries: Mutex<Vec<(u32, Duration)>>,
    pub(crate) budget_exhausted: Mutex<u32>,
    pub(crate) bulkhead_rejected: Mutex<u32>,
}

impl Recorder {
    pub(crate) fn transitions(&self) -> Vec<(StateKind, StateKind)> {
        self.transitions.lock().unwrap().clone()
    }

    pub(crate) fn count(&self, outcome: CallOutcome) -> usize {
        self.outcomes
            .lock()
            .unwrap()
            .iter()
            .filter(|o| **o == outcome)
            .count()
    }

    pub(crate) fn retries(&self) -> Vec<(u32, Duration)> {
        self.retries.lock().unwrap().clone()
    }
}

impl ResilienceObserver for Recorder {
    fn breaker_transition(&self, _: &'static str, from: StateKind, to: StateKind) {
        self.transitions.lock().unwrap().push((from, to));
    }

    fn breaker_outcome(&self, _: &'static str, outcome: CallOutcome) {
        self.outcomes.lock().unwrap().push(outcome);
    }

    fn retry(&self, _: &'static str, attempt: u32, delay: Duration) {
        self.retries.lock().unwrap().push((attempt, delay));
    }

    fn retry_budget_exhausted(&self, _: &'static str) {
        *self.budget_exhausted.lock().unwrap() += 1;
    }

    fn bulkhead_rejected(&self, _: &'static str) {
        *self.bulkhead_rejected.lock().unwrap() += 1;
    }
}

/// A client error for tests, classified like an HTTP client's would be.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TestFailure {
    #[error("connection failed")]
    Connect,
    #[error("timed out")]
    Timeout,
    #[error("bad response")]
    Protocol,
    #[error("llm: answered {0}")]
    Status(u16, Option<Duration>),
}

impl ClassifyFailure for TestFailure {
    fn failure_class(&self) -> FailureClass {
        match *self {
            Self::Connect => FailureClass::Unreachable,
            Self::Timeout => FailureClass::Timeout,
            Self::Protocol => FailureClass::Failed,
            Self::Status(429, retry_after) => FailureClass::Throttled { retry_after },
            Self::Status(502..=504, retry_after) => FailureClass::Overloaded { retry_after },
            Self::Status(s, _) if (400..500).contains(&s) => FailureClass::Rejected,
            Self::Status(..) => FailureClass::Failed,
        }
    }
}

/// A tagged error status, as a wrapped client would return it.
pub(crate) fn status(status: u16, retry_after: Option<Duration>) -> BoxError {
    Box::new(Classified::new(TestFailure::Status(status, retry_after)))
}

/// A tagged connection failure.
pub(crate) fn connect() -> BoxError {
    Box::new(Classified::new(TestFailure::Connect))
}
