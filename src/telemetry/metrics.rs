//! [`Metrics`]: every Prometheus family Levee exports, in ONE registry
//! created at startup and passed in (never a global), with typed methods so
//! callers cannot misspell a label or invent an unbounded label value.
//!
//! Label values are bounded: routes are matched route templates (or
//! `unmatched`), tiers are configured tier names, tenants are configured
//! tenants (or `other`), methods are the standard ones (or `_OTHER`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::config::Config;
use crate::resilience::{CallOutcome, ResilienceObserver, StateKind};
use crate::upstream::{Dependency, UpstreamError, UpstreamErrorKind};

/// `Content-Type` of the text exposition format served at `/metrics`.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Label value for a request that matched no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// Label value for a tenant that is not configured.
pub const OTHER_TENANT: &str = "other";

/// Label value for a response that carries no rate-limit tier (exempt paths,
/// limiting disabled).
pub const NO_TIER: &str = "none";

/// Every dependency name the resilience and upstream families are
/// pre-initialised for.
const DEPENDENCIES: [Dependency; 3] = [Dependency::Llm, Dependency::VectorStore, Dependency::Redis];

/// Every breaker state, so the state gauge has one series per state.
const STATES: [StateKind; 5] = [
    StateKind::Closed,
    StateKind::Open,
    StateKind::HalfOpen,
    StateKind::ForcedOpen,
    StateKind::ForcedClosed,
];

/// Breaker outcomes exported (ignored calls are counted by the bulkhead).
const OUTCOMES: [CallOutcome; 4] = [
    CallOutcome::Success,
    CallOutcome::Failure,
    CallOutcome::Slow,
    CallOutcome::Rejected,
];

/// Request latency buckets (seconds): a cached 429 to a slow LLM answer.
const HTTP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Limiter store latency buckets (seconds): in-process is microseconds,
/// Redis on a LAN is about a millisecond.
const STORE_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];

/// Upstream call latency buckets (seconds).
const UPSTREAM_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// What the limiter decided for one layer of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RateLimitDecision {
    /// Every limit of the layer admitted.
    Allowed,
    /// A shadow limit would have rejected; the request was admitted.
    ShadowLimited,
    /// The store was down and the tier fails open: admitted under the local
    /// safety limit.
    FailOpen,
    /// An enforced limit rejected (429).
    Limited,
    /// The store was down and the tier fails closed (503).
    FailClosed,
}

impl RateLimitDecision {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::ShadowLimited => "shadow_limited",
            Self::FailOpen => "fail_open",
            Self::Limited => "limited",
            Self::FailClosed => "fail_closed",
        }
    }
}

/// How an upstream call ended, for `levee_upstream_duration_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpstreamOutcome {
    /// An answer was received and understood.
    Success,
    /// The dependency failed (connection, error status, bad answer).
    Error,
    /// No answer in time.
    Timeout,
}

impl UpstreamOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Error => "error",
            Self::Timeout => "timeout",
        }
    }

    /// Classifies a call's result.
    pub fn of<T>(result: &Result<T, UpstreamError>) -> Self {
        match result {
            Ok(_) => Self::Success,
            Err(e) if matches!(e.kind, UpstreamErrorKind::Timeout) => Self::Timeout,
            Err(_) => Self::Error,
        }
    }
}

/// Which side of an LLM call tokens were spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// Input tokens.
    Prompt,
    /// Output tokens.
    Completion,
}

impl TokenKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prompt => "prompt",
            Self::Completion => "completion",
        }
    }
}

/// The metrics handle: cheap to clone, shared by the HTTP layer, the
/// limiter, the pipeline, the upstream clients and the resilience stack.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    tenants: BTreeSet<String>,
    tiers: BTreeSet<String>,
    http_requests: IntCounterVec,
    http_duration: HistogramVec,
    rl_decisions: IntCounterVec,
    rl_tenant: IntCounterVec,
    rl_store_duration: HistogramVec,
    rl_store_errors: IntCounterVec,
    breaker_state: IntGaugeVec,
    breaker_transitions: IntCounterVec,
    breaker_calls: IntCounterVec,
    bulkhead_rejections: IntCounterVec,
    retries: IntCounterVec,
    retry_budget_exhausted: IntCounterVec,
    upstream_duration: HistogramVec,
    llm_tokens: IntCounterVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("tenants", &self.inner.tenants)
            .field("tiers", &self.inner.tiers)
            .finish_non_exhaustive()
    }
}

impl Default for Metrics {
    /// Metrics for the default configuration (no tenants).
    fn default() -> Self {
        Self::new(&Config::default())
    }
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("each family is registered once");
    c
}

fn histogram(
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
    /// Builds the registry and every family. Tenant and tier label values
    /// are bounded by `config`: `ratelimit.tenants` keys and the tenants of
    /// `identity.api_keys`; `ratelimit.tiers` keys.
    pub fn new(config: &Config) -> Self {
        let registry = Registry::new();
        let r = &registry;
        let mut tenants: BTreeSet<String> = config.ratelimit.tenants.keys().cloned().collect();
        tenants.extend(config.identity.api_keys.iter().map(|k| k.tenant.clone()));
        let mut tiers: BTreeSet<String> = config.ratelimit.tiers.keys().cloned().collect();
        // Route policies of anonymous callers report the tier `route`.
        tiers.insert("route".to_owned());
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
            rl_decisions: counter(
                r,
                "levee_ratelimit_decisions_total",
                "Rate-limit decisions per request and layer (identity, network, tokens).",
                &["layer", "tier", "decision"],
            ),
            rl_tenant: counter(
                r,
                "levee_ratelimit_tenant_decisions_total",
                "Rate-limit decisions of keyed requests, by tenant (configured tenants, else other).",
                &["tenant", "decision"],
            ),
            rl_store_duration: histogram(
                r,
                "levee_ratelimit_store_duration_seconds",
                "Latency of one limiter store call (check or adjust), failed calls included.",
                &["store"],
                STORE_BUCKETS,
            ),
            rl_store_errors: counter(
                r,
                "levee_ratelimit_store_errors_total",
                "Limiter store calls that failed (down, timed out, script error).",
                &["store"],
            ),
            breaker_state: IntGaugeVec::new(
                Opts::new(
                    "levee_breaker_state",
                    "Circuit breaker state per dependency: 1 for the current state, 0 for the others.",
                ),
                &["dependency", "state"],
            )
            .expect("static metric definition"),
            breaker_transitions: counter(
                r,
                "levee_breaker_transitions_total",
                "Circuit breaker state transitions.",
                &["dependency", "from", "to"],
            ),
            breaker_calls: counter(
                r,
                "levee_breaker_calls_total",
                "Calls classified by a circuit breaker: success, failure, slow, rejected.",
                &["dependency", "outcome"],
            ),
            bulkhead_rejections: counter(
                r,
                "levee_bulkhead_rejections_total",
                "Calls a full bulkhead refused without calling the dependency.",
                &["dependency"],
            ),
            retries: counter(
                r,
                "levee_retries_total",
                "Retried attempts (the first attempt is not a retry).",
                &["dependency"],
            ),
            retry_budget_exhausted: counter(
                r,
                "levee_retry_budget_exhausted_total",
                "Retryable failures not retried because the retry budget was spent.",
                &["dependency"],
            ),
            upstream_duration: histogram(
                r,
                "levee_upstream_duration_seconds",
                "Latency of one upstream attempt, by dependency and outcome (success, error, timeout).",
                &["dependency", "outcome"],
                UPSTREAM_BUCKETS,
            ),
            llm_tokens: counter(
                r,
                "levee_llm_tokens_total",
                "LLM tokens reported by the model, by tenant and kind (prompt, completion).",
                &["tenant", "kind"],
            ),
            registry: registry.clone(),
            tenants,
            tiers,
        };
        registry
            .register(Box::new(inner.breaker_state.clone()))
            .expect("each family is registered once");
        let metrics = Self {
            inner: Arc::new(inner),
        };
        metrics.initialise();
        metrics
    }

    /// Creates the per-dependency series at zero (and every breaker as
    /// closed), so rates work from the first event and dashboards show the
    /// dependencies before anything happened to them.
    fn initialise(&self) {
        for dep in DEPENDENCIES.map(Dependency::as_str) {
            self.register_dependency(dep);
        }
    }

    /// Creates a dependency's resilience series at zero with its breaker
    /// `closed`. Done at startup for `llm`, `vector_store` and `redis`; call
    /// it for any other dependency a breaker protects (before its first
    /// transition).
    pub fn register_dependency(&self, dependency: &str) {
        let m = &self.inner;
        self.set_breaker_state(dependency, StateKind::Closed);
        for outcome in OUTCOMES {
            m.breaker_calls
                .with_label_values(&[dependency, outcome.as_str()]);
        }
        for (from, to) in [
            (StateKind::Closed, StateKind::Open),
            (StateKind::Open, StateKind::HalfOpen),
            (StateKind::HalfOpen, StateKind::Closed),
            (StateKind::HalfOpen, StateKind::Open),
        ] {
            m.breaker_transitions
                .with_label_values(&[dependency, from.as_str(), to.as_str()]);
        }
        m.bulkhead_rejections.with_label_values(&[dependency]);
        m.retries.with_label_values(&[dependency]);
        m.retry_budget_exhausted.with_label_values(&[dependency]);
    }

    /// The registry, for tests and custom exporters.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
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
        if self.inner.tenants.contains(tenant) {
            tenant
        } else {
            OTHER_TENANT
        }
    }

    /// `tier` if it is configured, else `other`; `none` when absent.
    pub fn tier_label<'a>(&self, tier: Option<&'a str>) -> &'a str {
        match tier {
            None => NO_TIER,
            Some(t) if self.inner.tiers.contains(t) => t,
            Some(_) => OTHER_TENANT,
        }
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
        let status = status.to_string();
        let tier = self.tier_label(tier);
        self.inner
            .http_requests
            .with_label_values(&[route, method_label(method), &status, tier])
            .inc();
        self.inner
            .http_duration
            .with_label_values(&[route, &status])
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a rate-limit decision of one layer (`identity`, `network`,
    /// `tokens`) of one tier.
    pub fn record_decision(&self, layer: &str, tier: &str, decision: RateLimitDecision) {
        let tier = self.tier_label(Some(tier));
        self.inner
            .rl_decisions
            .with_label_values(&[layer, tier, decision.as_str()])
            .inc();
    }

    /// Counts a keyed request's overall decision against its tenant.
    pub fn record_tenant_decision(&self, tenant: &str, decision: RateLimitDecision) {
        let tenant = self.tenant_label(tenant);
        self.inner
            .rl_tenant
            .with_label_values(&[tenant, decision.as_str()])
            .inc();
    }

    /// Creates the store's series at zero, so its error counter exists
    /// before the first error.
    pub fn register_store(&self, store: &str) {
        self.inner.rl_store_errors.with_label_values(&[store]);
        self.inner.rl_store_duration.with_label_values(&[store]);
    }

    /// Records one limiter store call (`memory` or `redis`).
    pub fn observe_store(&self, store: &str, elapsed: Duration, ok: bool) {
        self.inner
            .rl_store_duration
            .with_label_values(&[store])
            .observe(elapsed.as_secs_f64());
        if !ok {
            self.inner.rl_store_errors.with_label_values(&[store]).inc();
        }
    }

    /// Records one upstream attempt.
    pub fn observe_upstream(
        &self,
        dependency: Dependency,
        outcome: UpstreamOutcome,
        elapsed: Duration,
    ) {
        self.inner
            .upstream_duration
            .with_label_values(&[dependency.as_str(), outcome.as_str()])
            .observe(elapsed.as_secs_f64());
    }

    /// Counts LLM tokens for a tenant (bounded to configured tenants).
    pub fn add_tokens(&self, tenant: &str, kind: TokenKind, tokens: u64) {
        let tenant = self.tenant_label(tenant);
        self.inner
            .llm_tokens
            .with_label_values(&[tenant, kind.as_str()])
            .inc_by(tokens);
    }

    fn set_breaker_state(&self, dependency: &str, current: StateKind) {
        for state in STATES {
            self.inner
                .breaker_state
                .with_label_values(&[dependency, state.as_str()])
                .set(i64::from(state == current));
        }
    }

    /// Records a breaker transition: the state gauge moves and the
    /// transition is counted.
    pub fn breaker_transition(&self, dependency: &str, from: StateKind, to: StateKind) {
        self.set_breaker_state(dependency, to);
        self.inner
            .breaker_transitions
            .with_label_values(&[dependency, from.as_str(), to.as_str()])
            .inc();
    }

    /// Counts a breaker's classification of a call. `Ignored` calls are not
    /// counted here (a full bulkhead has its own counter).
    pub fn breaker_call(&self, dependency: &str, outcome: CallOutcome) {
        if outcome == CallOutcome::Ignored {
            return;
        }
        self.inner
            .breaker_calls
            .with_label_values(&[dependency, outcome.as_str()])
            .inc();
    }

    /// Counts a bulkhead rejection.
    pub fn bulkhead_rejected(&self, dependency: &str) {
        self.inner
            .bulkhead_rejections
            .with_label_values(&[dependency])
            .inc();
    }

    /// Counts a retry.
    pub fn retried(&self, dependency: &str) {
        self.inner.retries.with_label_values(&[dependency]).inc();
    }

    /// Counts a retry refused by the budget.
    pub fn retry_budget_exhausted(&self, dependency: &str) {
        self.inner
            .retry_budget_exhausted
            .with_label_values(&[dependency])
            .inc();
    }
}

/// The resilience stack reports through the same handle: pass
/// `Arc::new(metrics.clone())` wherever an `Arc<dyn ResilienceObserver>` is
/// expected.
impl ResilienceObserver for Metrics {
    fn breaker_transition(&self, dependency: &'static str, from: StateKind, to: StateKind) {
        Metrics::breaker_transition(self, dependency, from, to);
    }

    fn breaker_outcome(&self, dependency: &'static str, outcome: CallOutcome) {
        self.breaker_call(dependency, outcome);
    }

    fn retry(&self, dependency: &'static str, _attempt: u32, _delay: Duration) {
        self.retried(dependency);
    }

    fn retry_budget_exhausted(&self, dependency: &'static str) {
        Metrics::retry_budget_exhausted(self, dependency);
    }

    fn bulkhead_rejected(&self, dependency: &'static str) {
        Metrics::bulkhead_rejected(self, dependency);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::ApiKeyConfig;
    use crate::ratelimit::TenantConfig;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn unknown_tenants_and_tiers_share_one_label_value() {
        let mut config = Config::default();
        config
            .ratelimit
            .tenants
            .insert("acme".into(), TenantConfig::default());
        config.identity.api_keys.push(ApiKeyConfig {
            id: "k1".into(),
            sha256: "00".repeat(32),
            tenant: "globex".into(),
            tier: "API_KEY".into(),
        });
        let m = Metrics::new(&config);
        m.add_tokens("acme", TokenKind::Prompt, 10);
        m.add_tokens("globex", TokenKind::Prompt, 5);
        m.add_tokens("attacker-chosen-1", TokenKind::Completion, 3);
        m.add_tokens("attacker-chosen-2", TokenKind::Completion, 4);
        m.record_decision("identity", "NOT_A_TIER", RateLimitDecision::Limited);
        let text = m.encode();
        assert_eq!(
            value(
                &text,
                r#"levee_llm_tokens_total{kind="prompt",tenant="acme"}"#
            ),
            Some(10.0)
        );
        assert_eq!(
            value(
                &text,
                r#"levee_llm_tokens_total{kind="prompt",tenant="globex"}"#
            ),
            Some(5.0)
        );
        assert_eq!(
            value(
                &text,
                r#"levee_llm_tokens_total{kind="completion",tenant="other"}"#
            ),
            Some(7.0)
        );
        assert!(!text.contains("attacker-chosen"));
        assert_eq!(
            value(
                &text,
                r#"levee_ratelimit_decisions_total{decision="limited",layer="identity",tier="other"}"#
            ),
            Some(1.0)
        );
    }

    #[test]
    fn breaker_state_gauge_has_exactly_one_current_state() {
        let m = Metrics::default();
        let text = m.encode();
        assert_eq!(
            value(
                &text,
                r#"levee_breaker_state{dependency="llm",state="closed"}"#
            ),
            Some(1.0)
        );
        m.breaker_transition("llm", StateKind::Closed, StateKind::Open);
        let text = m.encode();
        assert_eq!(
            value(
                &text,
                r#"levee_breaker_state{dependency="llm",state="closed"}"#
            ),
            Some(0.0)
        );
        assert_eq!(
            value(
                &text,
                r#"levee_breaker_state{dependency="llm",state="open"}"#
            ),
            Some(1.0)
        );
        let ones = text
            .lines()
            .filter(|l| {
                l.starts_with(r#"levee_breaker_state{dependency="llm""#) && l.ends_with(" 1")
            })
            .count();
        assert_eq!(ones, 1);
        assert_eq!(
            value(
                &text,
                r#"levee_breaker_transitions_total{dependency="llm",from="closed",to="open"}"#
            ),
            Some(1.0)
        );
    }

    #[test]
    fn observer_events_are_counted_and_ignored_calls_are_not() {
        let m = Metrics::default();
        let o: Arc<dyn ResilienceObserver> = Arc::new(m.clone());
        o.breaker_outcome("vector_store", CallOutcome::Failure);
        o.breaker_outcome("vector_store", CallOutcome::Ignored);
        o.retry("vector_store", 2, Duration::from_millis(10));
        o.retry_budget_exhausted("vector_store");
        o.bulkhead_rejected("vector_store");
        let text = m.encode();
        let dep = r#"dependency="vector_store""#;
        assert_eq!(
            value(
                &text,
                &format!("levee_breaker_calls_total{{{dep},outcome=\"failure\"}}")
            ),
            Some(1.0)
        );
        assert!(!text.contains("outcome=\"ignored\""));
        assert_eq!(
            value(&text, &format!("levee_retries_total{{{dep}}}")),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                &format!("levee_retry_budget_exhausted_total{{{dep}}}")
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&text, &format!("levee_bulkhead_rejections_total{{{dep}}}")),
            Some(1.0)
        );
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
}
