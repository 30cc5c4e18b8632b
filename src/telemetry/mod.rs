//! Observability: Prometheus metrics, OpenTelemetry traces, W3C trace
//! context.
//!
//! - [`Metrics`]: the one registry created at startup and passed in (no
//!   global statics), served at `GET /metrics`, with the HTTP families;
//!   every other subsystem registers its own families into it.
//! - [`Labels`]: the bounded tenant and tier label values.
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
pub mod labels;
pub mod metrics;
mod otlp_http;
pub mod propagation;
mod trace;

pub use self::http::{ResponseFuture, Trace, TraceLayer};
pub use labels::Labels;
pub use metrics::Metrics;
pub use trace::{
    Exporter, OtlpProtocol, Tracing, TracingConfig, TracingError, DEFAULT_LOG_FILTER,
    DEFAULT_SERVICE_NAME,
};
