//! [`TraceLayer`]: holds the metrics handle; `layer()` only builds the
//! service.

use tower::Layer;

use super::service::Trace;
use crate::telemetry::Metrics;

/// Traces and counts every request that passes through.
#[derive(Debug, Clone)]
pub struct TraceLayer {
    metrics: Metrics,
}

impl TraceLayer {
    /// A layer recording into `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for TraceLayer {
    type Service = Trace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Trace::new(inner, self.metrics.clone())
    }
}
