//! [`Trace`]: opens the request's SERVER span (HTTP semantic conventions),
//! runs the inner service inside it, then records the status on the span
//! and the request in `levee_http_requests_total` /
//! `levee_http_request_duration_seconds`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{ConnectInfo, MatchedPath};
use axum::response::Response;
use http::Request;
use tokio::time::Instant;
use tower::Service;
use tracing::field::Empty;
use tracing::Instrument;

use crate::telemetry::metrics::{method_label, UNMATCHED_ROUTE};
use crate::telemetry::{propagation, Metrics};

/// Response header naming the rate-limit tier that applied.
const TIER_HEADER: &str = "x-ratelimit-tier";

/// The tracing and metrics service.
#[derive(Debug, Clone)]
pub struct Trace<S> {
    inner: S,
    metrics: Metrics,
}

impl<S> Trace<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, metrics: Metrics) -> Self {
        Self { inner, metrics }
    }
}

/// The service's future.
pub type ResponseFuture<E> = Pin<Box<dyn Future<Output = Result<Response, E>> + Send>>;

/// The SERVER span of one request. Fields the inner layers fill in are
/// declared empty here (a span only records fields it declared).
fn request_span(req: &Request<Body>, route: Option<&str>) -> tracing::Span {
    let method = method_label(req.method());
    let span = tracing::info_span!(
        target: "levee::http",
        "request",
        otel.name = Empty,
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = method,
        http.route = Empty,
        url.path = %req.uri().path(),
        url.scheme = "http",
        client.address = Empty,
        user_agent.original = Empty,
        http.response.status_code = Empty,
        levee.ratelimit.decision = Empty,
        levee.ratelimit.layer = Empty,
        levee.ratelimit.tier = Empty,
        levee.ratelimit.scope = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    match route {
        Some(r) => {
            span.record("otel.name", format!("{method} {r}"));
            span.record("http.route", r);
        }
        None => {
            span.record("otel.name", method);
        }
    }
    if let Some(peer) = req.extensions().get::<ConnectInfo<SocketAddr>>() {
        span.record("client.address", peer.0.ip().to_string());
    }
    if let Some(ua) = req
        .headers()
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
    {
        span.record("user_agent.original", ua);
    }
    propagation::set_remote_parent(&span, req.headers());
    span
}

impl<S> Service<Request<Body>> for Trace<S>
where
    S: Service<Request<Body>, Response = Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // The ready inner service is the one to call; leave a clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let metrics = self.metrics.clone();
        // A matched path is shared (`Arc<str>`): cloning it copies nothing.
        let route = req.extensions().get::<MatchedPath>().cloned();
        let method = req.method().clone();
        let span = request_span(&req, route.as_ref().map(MatchedPath::as_str));
        let start = Instant::now();
        let record_span = span.clone();
        let unspanned = span
            .is_disabled()
            .then(|| propagation::Unspanned::from_headers(req.headers()));
        let fut = async move {
            let result = inner.call(req).await;
            // An inner error never happens with axum (Infallible), but
            // would be a 500 to the client.
            let (status, tier) = match &result {
                Ok(resp) => (
                    resp.status().as_u16(),
                    resp.headers().get(TIER_HEADER).cloned(),
                ),
                Err(_) => (500, None),
            };
            record_span.record("http.response.status_code", i64::from(status));
            if status >= 500 {
                record_span.record("otel.status_code", "error");
            }
            metrics.observe_request(
                route.as_ref().map_or(UNMATCHED_ROUTE, MatchedPath::as_str),
                &method,
                status,
                tier.as_ref().and_then(|v| v.to_str().ok()),
                start.elapsed(),
            );
            result
        };
        match unspanned {
            // No exporter, so no span: upstream calls still carry the
            // client's trace id.
            Some(trace) => Box::pin(propagation::scope(trace, fut)),
            None => Box::pin(fut.instrument(span)),
        }
    }
}
