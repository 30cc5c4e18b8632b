//! [`RateLimitLayer`]: holds the shared [`Limiter`]; `layer()` only builds
//! the service.

use std::sync::Arc;

use tower::Layer;

use super::limiter::Limiter;
use super::service::RateLimit;

/// Applies rate limits before the inner service runs.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    limiter: Arc<Limiter>,
}

impl RateLimitLayer {
    /// A layer sharing `limiter`.
    pub fn new(limiter: Arc<Limiter>) -> Self {
        Self { limiter }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self.limiter.clone())
    }
}
