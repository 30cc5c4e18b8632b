//! [`CircuitBreakerLayer`]: holds the shared [`Breaker`]; `layer()` only
//! builds the service.

use tower::Layer;

use super::gate::Breaker;
use super::service::CircuitBreaker;

/// Puts a dependency call behind a shared [`Breaker`].
#[derive(Debug, Clone)]
pub struct CircuitBreakerLayer {
    breaker: Breaker,
}

impl CircuitBreakerLayer {
    /// A layer whose services all share `breaker`.
    pub fn new(breaker: Breaker) -> Self {
        Self { breaker }
    }
}

impl<S> Layer<S> for CircuitBreakerLayer {
    type Service = CircuitBreaker<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CircuitBreaker::new(inner, self.breaker.clone())
    }
}
