//! W3C trace context (`traceparent` / `tracestate`): accepted from clients
//! on the server span, injected into every upstream HTTP call. The
//! propagator is stateless, so it is built where it is used rather than
//! registered globally.
//!
//! With no exporter no spans are built (they would cost every request for
//! nothing), yet upstreams that do export must still join the client's
//! trace. [`scope`] keeps the request's trace id in a task-local for that
//! case, and [`inject_current`] falls back to it: the upstream sees the
//! client's trace id (or a fresh one) and a fresh parent span id.

use std::cell::Cell;
use std::future::Future;

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

/// The trace of a request that has no span: its trace id (`None` until
/// the first upstream call makes one up) and the client's flags.
#[derive(Debug)]
pub struct Unspanned {
    trace_id: Cell<Option<u128>>,
    flags: u8,
}

tokio::task_local! {
    static UNSPANNED: Unspanned;
}

impl Unspanned {
    /// The client's trace id and flags, if `headers` carry a valid
    /// `traceparent`.
    pub fn from_headers(headers: &http::HeaderMap) -> Self {
        let (trace_id, flags) = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_traceparent)
            .map_or((None, 1), |(t, f)| (Some(t), f));
        Self {
            trace_id: Cell::new(trace_id),
            flags,
        }
    }
}

/// Runs `fut` (a request with no span) with `trace` available to
/// [`inject_current`].
pub fn scope<F: Future>(trace: Unspanned, fut: F) -> impl Future<Output = F::Output> {
    UNSPANNED.scope(trace, fut)
}

/// Trace id and flags of a valid W3C `traceparent` (version 00 layout).
fn parse_traceparent(v: &str) -> Option<(u128, u8)> {
    let mut parts = v.trim().split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let ok = version.len() == 2
        && version != "ff"
        && trace.len() == 32
        && parent.len() == 16
        && flags.len() == 2;
    let trace_id = u128::from_str_radix(trace, 16).ok()?;
    let parent_id = u64::from_str_radix(parent, 16).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    (ok && trace_id != 0 && parent_id != 0).then_some((trace_id, flags))
}

/// Adds the current span's `traceparent` (and `tracestate`) to outgoing
/// request headers, so the upstream joins the same trace. Without a span,
/// the request's [`scope`] supplies the trace id.
pub fn inject_current(headers: &mut http::HeaderMap) {
    let cx = tracing::Span::current().context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
        return;
    }
    let value = UNSPANNED.try_with(|u| {
        let trace_id = u.trace_id.get().unwrap_or_else(|| {
            let id = rand::random::<u128>().max(1);
            u.trace_id.set(Some(id));
            id
        });
        let span_id = rand::random::<u64>().max(1);
        format!("00-{trace_id:032x}-{span_id:016x}-{:02x}", u.flags)
    });
    if let Some(v) = value
        .ok()
        .and_then(|v| http::HeaderValue::from_str(&v).ok())
    {
        headers.insert("traceparent", v);
    }
}

/// The current span's trace id as 32 hex digits, when it has one (for logs
/// and tests).
pub fn current_trace_id() -> Option<String> {
    let cx = tracing::Span::current().context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// Links `span` to the span a `traceparent` names (a job's processing to
/// the request that submitted it, which ended long ago).
pub fn add_link(span: &tracing::Span, traceparent: &str) {
    let mut headers = http::HeaderMap::new();
    let Ok(value) = http::HeaderValue::from_str(traceparent) else {
        return;
    };
    headers.insert("traceparent", value);
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(&headers));
    let linked = cx.span().span_context().clone();
    if linked.is_valid() {
        span.add_link(linked);
    }
}
