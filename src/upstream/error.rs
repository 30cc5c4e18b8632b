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
    /// What the resilience stack refused or failed with (a `CircuitOpen`,
    /// an `Elapsed` …), kept typed for the error path rather than turned
    /// into text.
    #[source]
    pub source: Option<crate::resilience::BoxError>,
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
    /// Something that is neither the dependency's fault nor a refusal went
    /// wrong on our side (its cause is the error's source). Mapped to 500,
    /// never reported as the dependency's fault.
    #[error("internal error")]
    Internal,
    /// Not called: the tenant fair queue refused the call (its source says
    /// why: the tenant's queue is full, or the dependency is saturated).
    #[error("not admitted by the fair queue")]
    NotAdmitted,
}

impl UpstreamError {
    /// Builds an error for `dependency`.
    pub fn new(dependency: Dependency, kind: UpstreamErrorKind) -> Self {
        Self {
            dependency,
            kind,
            source: None,
        }
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
    /// error: the client's own error as it was (its failure tag removed),
    /// breaker and bulkhead refusals as `Unavailable` / `Busy`, attempt
    /// timeouts and deadlines as `Timeout`, each keeping the layer's error
    /// as its source; anything else is `Internal`, with its cause kept.
    pub fn from_stack(dependency: Dependency, err: crate::resilience::BoxError) -> Self {
        use crate::resilience::{BulkheadFull, CircuitOpen, Classified, DeadlineExceeded, Elapsed};
        let err = match Classified::into_source(err).downcast::<Self>() {
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
            UpstreamErrorKind::Internal
        };
        Self {
            dependency,
            kind,
            source: Some(err),
        }
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

/// How the breaker and retry judge an upstream failure.
impl crate::resilience::ClassifyFailure for UpstreamError {
    fn failure_class(&self) -> crate::resilience::FailureClass {
        use crate::resilience::FailureClass;
        match self.kind {
            UpstreamErrorKind::Connect => FailureClass::Unreachable,
            UpstreamErrorKind::Timeout => FailureClass::Timeout,
            UpstreamErrorKind::Status {
                status: 429,
                retry_after,
            } => FailureClass::Throttled { retry_after },
            UpstreamErrorKind::Status {
                status: 502..=504,
                retry_after,
            } => FailureClass::Overloaded { retry_after },
            UpstreamErrorKind::Status { status, .. } if (400..500).contains(&status) => {
                FailureClass::Rejected
            }
            UpstreamErrorKind::Status { .. }
            | UpstreamErrorKind::Protocol(_)
            | UpstreamErrorKind::Internal => FailureClass::Failed,
            UpstreamErrorKind::Unavailable { .. }
            | UpstreamErrorKind::Busy
            | UpstreamErrorKind::NotAdmitted => FailureClass::Refused,
        }
    }
}
