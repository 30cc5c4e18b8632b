//! The error every upstream client returns, tagged with its dependency so
//! that only dependency faults feed a breaker and the HTTP mapping can name
//! the dependency.

use std::time::Duration;

use super::Dependency;

/// A failed call to a dependency.
#[derive(Debug, thiserror::Error)]
#[error("{dependency}: {kind}")]
pub struct UpstreamError {
    /// Which dependency failed.
    pub dependency: Dependency,
    /// How it failed.
    pub kind: UpstreamErrorKind,
}

/// How an upstream call failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamErrorKind {
    /// The connection could not be made or was reset.
    #[error("connection failed")]
    Connect,
    /// No complete answer within the timeout.
    #[error("timed out")]
    Timeout,
    /// The dependency answered with an error status.
    #[error("answered {status}")]
    Status {
        /// HTTP status code.
        status: u16,
        /// The dependency's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// The answer could not be understood.
    #[error("bad response: {0}")]
    Protocol(String),
    /// Not called: the dependency's circuit breaker is open.
    #[error("circuit open")]
    Unavailable {
        /// Time until the breaker admits its next probe.
        retry_after: Duration,
    },
    /// Not called: the dependency's bulkhead is full.
    #[error("too many calls in flight")]
    Busy,
}

impl UpstreamError {
    /// Builds an error for `dependency`.
    pub fn new(dependency: Dependency, kind: UpstreamErrorKind) -> Self {
        Self { dependency, kind }
    }

    /// Classifies a reqwest error without keeping its text, which can
    /// contain the request URL.
    pub fn from_reqwest(dependency: Dependency, err: &reqwest::Error) -> Self {
        let kind = if err.is_timeout() {
            UpstreamErrorKind::Timeout
        } else if err.is_connect() || err.is_request() {
            UpstreamErrorKind::Connect
        } else if err.is_decode() || err.is_body() {
            UpstreamErrorKind::Protocol("undecodable body".to_owned())
        } else {
            UpstreamErrorKind::Connect
        };
        Self::new(dependency, kind)
    }

    /// Turns whatever a resilience stack returned back into an upstream
    /// error: the client's own error as it was, breaker and bulkhead
    /// refusals as `Unavailable` / `Busy`, attempt timeouts and deadlines
    /// as `Timeout`.
    pub fn from_stack(dependency: Dependency, err: crate::resilience::BoxError) -> Self {
        use crate::resilience::{BulkheadFull, CircuitOpen, DeadlineExceeded, Elapsed};
        let err = match err.downcast::<Self>() {
            Ok(e) => return *e,
            Err(e) => e,
        };
        let kind = if let Some(open) = err.downcast_ref::<CircuitOpen>() {
            UpstreamErrorKind::Unavailable {
                retry_after: open.retry_after,
            }
        } else if err.is::<BulkheadFull>() {
            UpstreamErrorKind::Busy
        } else if err.is::<Elapsed>() || err.is::<DeadlineExceeded>() {
            UpstreamErrorKind::Timeout
        } else {
            UpstreamErrorKind::Protocol(err.to_string())
        };
        Self::new(dependency, kind)
    }

    /// Whether the call was refused without reaching the dependency.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self.kind,
            UpstreamErrorKind::Unavailable { .. } | UpstreamErrorKind::Busy
        )
    }

    /// Whether this was a timeout (mapped to 504 rather than 502).
    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, UpstreamErrorKind::Timeout)
    }
}
