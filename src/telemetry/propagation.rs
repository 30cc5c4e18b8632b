//! W3C trace context (`traceparent` / `tracestate`): accepted from clients
//! on the server span, injected into every upstream HTTP call. The
//! propagator is stateless, so it is built where it is used rather than
//! registered globally.

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Makes `span` a child of the client's trace when the request carries a
/// valid `traceparent`; otherwise it stays a root. Call before the span is
/// first entered.
pub fn set_remote_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if cx.span().span_context().is_valid() {
        // Fails only when no OpenTelemetry layer is installed (e.g. in
        // unit tests), where there is no trace to join.
        let _ = span.set_parent(cx);
    }
}

/// Adds the current span's `traceparent` (and `tracestate`) to outgoing
/// request headers, so the upstream joins the same trace.
pub fn inject_current(headers: &mut http::HeaderMap) {
    let cx = tracing::Span::current().context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
    }
}

/// The current span's trace id as 32 hex digits, when it has one (for logs
/// and tests).
pub fn current_trace_id() -> Option<String> {
    let cx = tracing::Span::current().context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}
