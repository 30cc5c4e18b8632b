//! [`Timeout`]: races the inner future against a tokio sleep.

use std::task::{Context, Poll};
use std::time::Duration;

use tower::Service;

use super::future::ResponseFuture;
use crate::resilience::BoxError;

/// Which bound a [`Timeout`] enforces, and so which error it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutKind {
    /// One attempt: [`super::Elapsed`].
    Attempt,
    /// The whole retry group: [`super::DeadlineExceeded`].
    Deadline,
}

/// A service whose calls fail once `after` has passed.
#[derive(Debug, Clone)]
pub struct Timeout<S> {
    inner: S,
    dependency: &'static str,
    after: Duration,
    kind: TimeoutKind,
}

impl<S> Timeout<S> {
    /// Bounds `inner`'s calls by `after`.
    pub fn new(inner: S, dependency: &'static str, after: Duration, kind: TimeoutKind) -> Self {
        Self {
            inner,
            dependency,
            after,
            kind,
        }
    }
}

impl<S, Req> Service<Req> for Timeout<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture::new(
            self.inner.call(req),
            tokio::time::sleep(self.after),
            self.dependency,
            self.after,
            self.kind,
        )
    }
}
