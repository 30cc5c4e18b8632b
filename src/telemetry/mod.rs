//! Observability: Prometheus metrics, OpenTelemetry traces, W3C trace
//! context.
//!
//! - [`Metrics`]: every `levee_*` family in one registry created at startup
//!   and passed in (no global statics), served at `GET /metrics`; it is
//!   also the [`ResilienceObserver`](crate::resilience::ResilienceObserver)
//!   the breaker, retry and bulkhead layers report through.
//! - [`Tracing`]: the `tracing` subscriber (stderr logs by `LEVEE_LOG`,
//!   spans to OTLP per the standard `OTEL_*` variables) and its flush on
//!   shutdown.
//! - [`TraceLayer`]: the outermost HTTP layer: one SERVER span and the
//!   request metrics per request, rejected requests included.
//! - [`client`]: CLIENT spans for the LLM, the vector store and Redis, and
//!   the upstream latency histogram.
//! - [`propagation`]: `traceparent` in from clients, out to upstreams.

pub mod client;
mod http;
pub mod metrics;
mod otlp_http;
pub mod propagation;
mod trace;

pub use self::http::{ResponseFuture, Trace, TraceLayer};
pub use metrics::{Metrics, RateLimitDecision, TokenKind, UpstreamOutcome};
pub use trace::{
    Exporter, OtlpProtocol, Tracing, TracingConfig, TracingError, DEFAULT_LOG_FILTER,
    DEFAULT_SERVICE_NAME,
};
