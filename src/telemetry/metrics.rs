//! [`Metrics`]: the ONE Prometheus registry of the process, created at
//! startup and passed in (never a global), plus the HTTP families this
//! module owns. Every other subsystem owns its families and registers them
//! into this registry (`ratelimit::RateLimitMetrics`,
//! `resilience::ResilienceMetrics`, `upstream::UpstreamMetrics`), so this
//! module knows none of them.
//!
//! Label handles are resolved once and kept, not formatted and hashed on
//! every request: the HTTP families cache one handle per (route, method,
//! status, tier) they have seen, and the subsystems resolve theirs at
//! registration.
//!
//! Label values are bounded: routes are matched route templates (or
//! `unmatched`), tiers are configured tier names ([`Labels`]), methods are
//! the standard ones (or `_OTHER`).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub use super::labels::{Labels, NO_TIER, OTHER as OTHER_TENANT};

/// `Content-Type` of the text exposition format served at `/metrics`.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Label value for a request that matched no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// Request latency buckets (seconds): a cached 429 to a slow LLM answer.
const HTTP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The registry handle: cheap to clone, shared by everything that
/// registers or records.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    labels: Labels,
    http_requests: IntCounterVec,
    http_duration: HistogramVec,
    /// Resolved handles by route, then (method, status, tier).
    http_handles: RwLock<HashMap<Box<str>, Vec<HttpHandles>>>,
}

/// The handles of one (method, status, tier) of one route.
struct HttpHandles {
    method: &'static str,
    status: u16,
    tier: Box<str>,
    requests: IntCounter,
    duration: Histogram,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("labels", &self.inner.labels)
            .finish_non_exhaustive()
    }
}

impl Default for Metrics {
    /// A registry with no configured tenants or tiers.
    fn default() -> Self {
        Self::new(Labels::default())
    }
}

/// Creates and registers a counter family (definitions are static: a bad
/// one is a bug caught by every test).
pub fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("each family is registered once");
    c
}

/// Creates and registers a gauge family.
pub fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("each family is registered once");
    g
}

/// Creates and registers a histogram family.
pub fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("static metric definition");
    registry
        .register(Box::new(h.clone()))
        .expect("each family is registered once");
    h
}

/// The standard HTTP methods keep their name; anything else is `_OTHER`
/// (clients choose methods, so they must not choose label values).
pub fn method_label(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::DELETE => "DELETE",
        http::Method::PATCH => "PATCH",
        http::Method::HEAD => "HEAD",
        http::Method::OPTIONS => "OPTIONS",
        http::Method::CONNECT => "CONNECT",
        http::Method::TRACE => "TRACE",
        _ => "_OTHER",
    }
}

impl Metrics {
    /// A new registry with the HTTP families; tenant and tier label values
    /// are bounded by `labels`.
    pub fn new(labels: Labels) -> Self {
        let registry = Registry::new();
        let r = &registry;
        let inner = Inner {
            http_requests: counter(
                r,
                "levee_http_requests_total",
                "HTTP requests answered, by matched route, method, status and rate-limit tier.",
                &["route", "method", "status", "tier"],
            ),
            http_duration: histogram(
                r,
                "levee_http_request_duration_seconds",
                "Time from request to response headers, by matched route and status.",
                &["route", "status"],
                HTTP_BUCKETS,
            ),
            http_handles: RwLock::default(),
            registry: registry.clone(),
            labels,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The registry, for subsystems to register their families into.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The bounded label sets.
    pub fn labels(&self) -> &Labels {
        &self.inner.labels
    }

    /// Every family in the text exposition format.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.inner.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// `tenant` if it is configured, else `other`.
    pub fn tenant_label<'a>(&self, tenant: &'a str) -> &'a str {
        self.inner.labels.tenant(tenant)
    }

    /// `tier` if it is configured, else `other`; `none` when absent.
    pub fn tier_label<'a>(&self, tier: Option<&'a str>) -> &'a str {
        self.inner.labels.tier(tier)
    }

    /// Counts one answered HTTP request and its latency. `route` is the
    /// matched route template or [`UNMATCHED_ROUTE`].
    pub fn observe_request(
        &self,
        route: &str,
        method: &http::Method,
        status: u16,
        tier: Option<&str>,
        elapsed: Duration,
    ) {
        let method = method_label(method);
        let tier = self.tier_label(tier);
        let secs = elapsed.as_secs_f64();
        let seen = |h: &&HttpHandles| h.method == method && h.status == status && *h.tier == *tier;
        {
            let handles = self
                .inner
                .http_handles
                .read()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(h) = handles.get(route).and_then(|v| v.iter().find(seen)) {
                h.requests.inc();
                h.duration.observe(secs);
                return;
            }
        }
        // First time for this combination: resolve and keep its handles.
        let status_text = status.to_string();
        let h = HttpHandles {
            method,
            status,
            tier: tier.into(),
            requests: self.inner.http_requests.with_label_values(&[
                route,
                method,
                &status_text,
                tier,
            ]),
            duration: self
                .inner
                .http_duration
                .with_label_values(&[route, &status_text]),
        };
        h.requests.inc();
        h.duration.observe(secs);
        let mut handles = self
            .inner
            .http_handles
            .write()
            .unwrap_or_else(|p| p.into_inner());
        let route_handles = handles.entry(route.into()).or_default();
        if !route_handles.iter().any(|x| seen(&x)) {
            route_handles.push(h);
        }
    }
}

/// Test helpers shared by every subsystem's metric tests.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The value of `series` (a full `name{labels}`) in exposition `text`.
    pub(crate) fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn client_chosen_methods_do_not_become_label_values() {
        let m = Metrics::default();
        let weird = http::Method::from_bytes(b"BREW").unwrap();
        m.observe_request("unmatched", &weird, 405, None, Duration::from_millis(1));
        let text = m.encode();
        assert!(text.contains(r#"method="_OTHER""#));
        assert!(!text.contains("BREW"));
    }

    #[test]
    fn cached_handles_count_every_request_of_their_series() {
        let m = Metrics::new(Labels::new([], ["API_KEY".to_owned()]));
        for _ in 0..3 {
            m.observe_request(
                "/v1/chat",
                &http::Method::POST,
                200,
                Some("API_KEY"),
                Duration::ZERO,
            );
        }
        m.observe_request(
            "/v1/chat",
            &http::Method::POST,
            429,
            Some("API_KEY"),
            Duration::ZERO,
        );
        m.observe_request(
            "/v1/chat",
            &http::Method::POST,
            200,
            Some("forged"),
            Duration::ZERO,
        );
        let text = m.encode();
        let series = |status: &str, tier: &str| {
            format!(
                r#"levee_http_requests_total{{method="POST",route="/v1/chat",status="{status}",tier="{tier}"}}"#
            )
        };
        assert_eq!(value(&text, &series("200", "API_KEY")), Some(3.0));
        assert_eq!(value(&text, &series("429", "API_KEY")), Some(1.0));
        assert_eq!(value(&text, &series("200", "other")), Some(1.0));
        assert!(!text.contains("forged"));
    }
}
