//! [`TimeoutLayer`]: holds the bound and its kind; `layer()` only builds
//! the service.

use std::time::Duration;

use tower::Layer;

use super::service::{Timeout, TimeoutKind};

/// Bounds every call of the wrapped service.
#[derive(Debug, Clone, Copy)]
pub struct TimeoutLayer {
    dependency: &'static str,
    after: Duration,
    kind: TimeoutKind,
}

impl TimeoutLayer {
    /// A per-attempt timeout failing with [`super::Elapsed`].
    pub fn attempt(dependency: &'static str, after: Duration) -> Self {
        Self {
            dependency,
            after,
            kind: TimeoutKind::Attempt,
        }
    }

    /// A whole-call deadline failing with [`super::DeadlineExceeded`].
    pub fn deadline(dependency: &'static str, after: Duration) -> Self {
        Self {
            dependency,
            after,
            kind: TimeoutKind::Deadline,
        }
    }
}

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Timeout::new(inner, self.dependency, self.after, self.kind)
    }
}
