//! [`CircuitOpen`]: the breaker's own, immediate rejection.

use std::time::Duration;

/// The breaker refused a call without calling the dependency: it is open,
/// or half-open with every probe permit taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dependency} circuit open; next probe in {}ms", retry_after.as_millis())]
pub struct CircuitOpen {
    /// The dependency behind the breaker.
    pub dependency: &'static str,
    /// Time until the breaker admits its next probe (an estimate while
    /// half-open probes are in flight).
    pub retry_after: Duration,
}
