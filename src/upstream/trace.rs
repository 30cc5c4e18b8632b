//! The one place that records how an upstream call ended: on its CLIENT
//! span (status, a short secret-free `error.type`, the HTTP status when
//! there was one) and in `levee_upstream_duration_seconds`. The span
//! constructors themselves are generic and live in `telemetry::client`.

use std::time::Duration;

use tracing::Span;

use super::metrics::{UpstreamMetrics, UpstreamOutcome};
use super::{Dependency, UpstreamError, UpstreamErrorKind};
use crate::telemetry::client::int;

/// The `error.type` of a failed call: a short, stable, secret-free code.
pub fn error_type(err: &UpstreamError) -> String {
    match &err.kind {
        UpstreamErrorKind::Connect => "connect".to_owned(),
        UpstreamErrorKind::Timeout => "timeout".to_owned(),
        UpstreamErrorKind::Status { status, .. } => status.to_string(),
        UpstreamErrorKind::Protocol(_) => "protocol".to_owned(),
        UpstreamErrorKind::Unavailable { .. } => "circuit_open".to_owned(),
        UpstreamErrorKind::Busy => "bulkhead_full".to_owned(),
        UpstreamErrorKind::Internal => "internal".to_owned(),
        UpstreamErrorKind::NotAdmitted => "not_admitted".to_owned(),
    }
}

/// Records how a call ended: on the current span and, with `metrics`, in
/// the upstream latency histogram.
pub fn finish<T>(
    metrics: Option<&UpstreamMetrics>,
    dependency: Dependency,
    elapsed: Duration,
    result: &Result<T, UpstreamError>,
) {
    let span = Span::current();
    if let Err(e) = result {
        span.record("otel.status_code", "error");
        span.record("error.type", error_type(e));
        if let UpstreamErrorKind::Status { status, .. } = e.kind {
            span.record("http.response.status_code", int(status));
        }
    }
    if let Some(m) = metrics {
        m.observe(dependency, UpstreamOutcome::of(result), elapsed);
    }
}
