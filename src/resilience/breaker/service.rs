//! [`CircuitBreaker`]: asks the [`Breaker`] for a permit on every call; an
//! open breaker answers [`super::CircuitOpen`] at once without touching the
//! inner service.

use std::task::{Context, Poll};

use tower::Service;

use super::future::ResponseFuture;
use super::gate::Breaker;
use crate::resilience::BoxError;

/// A service behind a circuit breaker.
#[derive(Debug, Clone)]
pub struct CircuitBreaker<S> {
    inner: S,
    breaker: Breaker,
}

impl<S> CircuitBreaker<S> {
    /// Wraps `inner` behind `breaker`.
    pub fn new(inner: S, breaker: Breaker) -> Self {
        Self { inner, breaker }
    }

    /// The shared breaker.
    pub fn breaker(&self) -> &Breaker {
        &self.breaker
    }
}

impl<S, Req> Service<Req> for CircuitBreaker<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is the inner service's (always ready for our clients):
        // an open breaker does not make callers wait, it fails in `call`.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.breaker.permit() {
            Ok(permit) => ResponseFuture::called(self.inner.call(req), permit),
            Err(open) => ResponseFuture::rejected(open),
        }
    }
}
