//! [`Elapsed`] and [`DeadlineExceeded`].

use std::time::Duration;

/// One attempt at a dependency call took longer than its timeout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dependency} attempt timed out after {}ms", after.as_millis())]
pub struct Elapsed {
    /// The dependency that did not answer.
    pub dependency: &'static str,
    /// The attempt timeout.
    pub after: Duration,
}

/// A dependency call, retries included, did not finish within its deadline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dependency} deadline of {}ms exceeded", after.as_millis())]
pub struct DeadlineExceeded {
    /// The dependency that did not answer in time.
    pub dependency: &'static str,
    /// The deadline.
    pub after: Duration,
}
