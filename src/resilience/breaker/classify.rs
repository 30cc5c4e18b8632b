//! [`Classify`]: what a failed call means for the breaker. Only dependency
//! faults feed it; client faults count as successes (the dependency
//! answered), and rejections by the resilience layers themselves are
//! ignored.

use std::error::Error;

use crate::resilience::bulkhead::BulkheadFull;
use crate::resilience::failure::{Classified, FailureClass};
use crate::resilience::timeout::{DeadlineExceeded, Elapsed};

use super::CircuitOpen;

/// How the breaker counts a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The dependency did its job (possibly answering "your fault").
    Success,
    /// The dependency failed; counts toward tripping.
    Failure,
    /// Neither: the call says nothing about the dependency's health.
    Ignore,
}

/// Classifies the error of a failed call. Successful responses are always
/// [`Verdict::Success`] (or slow).
pub trait Classify: Send + Sync + 'static {
    /// The verdict for `error`.
    fn classify(&self, error: &(dyn Error + 'static)) -> Verdict;
}

impl<F> Classify for F
where
    F: Fn(&(dyn Error + 'static)) -> Verdict + Send + Sync + 'static,
{
    fn classify(&self, error: &(dyn Error + 'static)) -> Verdict {
        self(error)
    }
}

/// The default classification, [`classify_error`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {
    fn classify(&self, error: &(dyn Error + 'static)) -> Verdict {
        classify_error(error)
    }
}

/// Walks `error`'s causes and decides:
///
/// - [`CircuitOpen`], [`BulkheadFull`], [`DeadlineExceeded`] → ignore: our
///   own rejections say nothing about the dependency;
/// - [`Elapsed`] (attempt timeout) → failure;
/// - a client error tagged with its [`FailureClass`] (see
///   [`crate::resilience::failure`]): unreachable, timeout, overloaded and
///   failed → failure; throttled (429) → ignore (the dependency is up and
///   pushing back on our rate; retry honours its `Retry-After`, and opening
///   on quota would hide that); rejected (other 4xx) → success (the
///   dependency answered; the request was bad); refused → ignore;
/// - anything else → failure (an unknown error from the client stack is
///   more likely a dependency fault than not).
pub fn classify_error(error: &(dyn Error + 'static)) -> Verdict {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<CircuitOpen>() || e.is::<BulkheadFull>() || e.is::<DeadlineExceeded>() {
            return Verdict::Ignore;
        }
        if e.is::<Elapsed>() {
            return Verdict::Failure;
        }
        if let Some(c) = e.downcast_ref::<Classified>() {
            return match c.class {
                FailureClass::Throttled { .. } | FailureClass::Refused => Verdict::Ignore,
                FailureClass::Rejected => Verdict::Success,
                FailureClass::Unreachable
                | FailureClass::Timeout
                | FailureClass::Overloaded { .. }
                | FailureClass::Failed => Verdict::Failure,
            };
        }
        cause = e.source();
    }
    Verdict::Failure
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::resilience::testing::{status as status_error, TestFailure};

    fn upstream(kind: TestFailure) -> Classified {
        Classified::new(kind)
    }

    fn status(status: u16) -> crate::resilience::BoxError {
        status_error(status, None)
    }

    #[test]
    fn dependency_faults_are_failures_and_client_faults_successes() {
        assert_eq!(
            classify_error(&upstream(TestFailure::Connect)),
            Verdict::Failure
        );
        assert_eq!(
            classify_error(&upstream(TestFailure::Timeout)),
            Verdict::Failure
        );
        assert_eq!(
            classify_error(&upstream(TestFailure::Protocol)),
            Verdict::Failure
        );
        assert_eq!(classify_error(status(503).as_ref()), Verdict::Failure);
        assert_eq!(classify_error(status(500).as_ref()), Verdict::Failure);
        assert_eq!(classify_error(status(400).as_ref()), Verdict::Success);
        assert_eq!(classify_error(status(404).as_ref()), Verdict::Success);
        assert_eq!(classify_error(status(429).as_ref()), Verdict::Ignore);
    }

    #[test]
    fn own_rejections_are_ignored_and_attempt_timeouts_fail() {
        let open = CircuitOpen {
            dependency: "llm",
            retry_after: Duration::from_secs(1),
        };
        assert_eq!(classify_error(&open), Verdict::Ignore);
        assert_eq!(
            classify_error(&BulkheadFull { dependency: "llm" }),
            Verdict::Ignore
        );
        let elapsed = Elapsed {
            dependency: "llm",
            after: Duration::from_secs(1),
        };
        assert_eq!(classify_error(&elapsed), Verdict::Failure);
    }

    #[test]
    fn causes_are_walked_through_boxes() {
        let boxed: crate::resilience::BoxError = Box::new(BulkheadFull {
            dependency: "redis",
        });
        assert_eq!(classify_error(boxed.as_ref()), Verdict::Ignore);
    }
}
