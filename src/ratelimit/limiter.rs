//! The limiter: resolves the caller, gathers every applicable limit, and
//! asks the store once. Used by the tower layer ([`super::RateLimit`]) and,
//! for token budgets, by the chat handler.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderMap;
use tokio::time::Instant;
use tracing::field::Empty;
use tracing::Instrument;

use super::config::FailureMode;
use super::error::{LimiterUnavailable, RateLimited};
use super::headers;
use super::metrics::{RateLimitDecision, RateLimitMetrics};
use super::policy::Layer;
use super::policy::{Applied, Policy};
use super::store::{Decision, LimitSpec, LimitStore, MemoryStore};
use crate::identity::{Identity, IdentityError, OnRefusal};
use crate::telemetry::Metrics;

/// A refused request: why, and the headers to send with the refusal. Its
/// [`source`](std::error::Error::source) is the reason, so the one error
/// path finds the status by walking the causes and takes the headers from
/// here.
#[derive(Debug)]
pub struct Rejection {
    /// The reason (mapped to HTTP in `http::error`).
    pub error: Box<dyn std::error::Error + Send + Sync>,
    /// Rate-limit headers (empty when no limit was checked).
    pub headers: HeaderMap,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused by the rate limiter: {}", self.error)
    }
}

impl std::error::Error for Rejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.error.as_ref())
    }
}

/// A token reservation to settle after the LLM call.
#[derive(Debug)]
pub struct TokenReservation {
    spec: LimitSpec,
    reserved: u64,
    tenant: Arc<str>,
}

impl TokenReservation {
    /// The tokens reserved (what settling "in full" charges).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }
}

/// `Retry-After` while the store is down under fail-closed.
const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `X-RateLimit-Degraded: true` marks answers given under the local
/// safety limit while the store is down.
pub const X_DEGRADED: http::HeaderName = http::HeaderName::from_static("x-ratelimit-degraded");

/// A store decision, and whether it came from the local fallback.
struct Checked {
    decision: Decision,
    degraded: bool,
}

impl Checked {
    fn headers(&self, applied: &[Applied]) -> HeaderMap {
        let mut h = headers::build(applied, &self.decision);
        if self.degraded {
            h.insert(X_DEGRADED, http::HeaderValue::from_static("true"));
        }
        h
    }
}

/// The limiter.
pub struct Limiter {
    /// Swapped whole by a live reload: each request reads one snapshot.
    /// The store's counters carry on, since a limit's key names its
    /// subject and window, not its value.
    policy: ArcSwap<Policy>,
    store: Arc<dyn LimitStore>,
    /// Local safety limits for fail-open tiers while `store` is down.
    fallback: MemoryStore,
    instance: u64,
    seq: AtomicU64,
    /// Decision and store metrics (none in unit tests and benches).
    metrics: Option<RateLimitMetrics>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.store.kind())
            .finish_non_exhaustive()
    }
}

impl Rejection {
    fn new(error: impl std::error::Error + Send + Sync + 'static, headers: HeaderMap) -> Self {
        Self {
            error: Box::new(error),
            headers,
        }
    }
}

impl Limiter {
    /// A limiter over `store`.
    pub fn new(policy: Policy, store: Arc<dyn LimitStore>) -> Self {
        Self {
            policy: ArcSwap::from_pointee(policy),
            store,
            fallback: MemoryStore::new(),
            instance: rand::random(),
            seq: AtomicU64::new(0),
            metrics: None,
        }
    }

    /// Records decisions and store latency into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        self.metrics = Some(RateLimitMetrics::register(metrics, self.store.kind()));
        self
    }

    /// The policy in force (a snapshot: a reload does not change it).
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Puts `policy` in force for the next request on (a live reload).
    pub fn replace_policy(&self, policy: Policy) {
        self.policy.store(Arc::new(policy));
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn LimitStore> {
        &self.store
    }

    /// Unique across replicas (random instance) and requests (sequence), so
    /// sliding-log members never collide.
    fn request_id(&self) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}-{n:x}", self.instance)
    }

    /// One store call for all limits. If the store is down, a fail-closed
    /// tier refuses (503) and fail-open tiers are checked against the local
    /// safety store with each limit divided among the replicas.
    async fn check(&self, applied: &[Applied]) -> Result<Checked, Rejection> {
        let specs: Vec<LimitSpec> = applied.iter().map(|a| a.spec.clone()).collect();
        let request_id = self.request_id();
        let start = Instant::now();
        let result = self.store.check(&specs, &request_id).await;
        self.observe_store(start, result.is_ok());
        let err = match result {
            Ok(decision) => {
                let checked = Checked {
                    decision,
                    degraded: false,
                };
                self.record(applied, Some(&checked));
                return Ok(checked);
            }
            Err(e) => e,
        };
        // A refusal by the store's open breaker is the steady state of an
        // outage: logging each one would flood the log on every request.
        if err.refused {
            tracing::debug!(error = %err, "rate-limit store unavailable");
        } else {
            tracing::warn!(error = %err, "rate-limit store unavailable");
        }
        if applied
            .iter()
            .any(|a| a.on_store_failure == FailureMode::FailClosed)
        {
            self.record(applied, None);
            return Err(Rejection::new(
                LimiterUnavailable {
                    retry_after: STORE_RETRY_AFTER,
                },
                HeaderMap::new(),
            ));
        }
        let replicas = u64::from(self.policy.load().config().replicas.max(1));
        let local: Vec<LimitSpec> = specs
            .into_iter()
            .map(|mut s| {
                s.limit = s.limit.div_ceil(replicas).max(1);
                s.burst = s.burst.div_ceil(replicas).max(1);
                s
            })
            .collect();
        let decision = self
            .fallback
            .check(&local, &request_id)
            .await
            .map_err(|e| Rejection::new(e, HeaderMap::new()))?;
        let checked = Checked {
            decision,
            degraded: true,
        };
        self.record(applied, Some(&checked));
        Ok(checked)
    }

    fn observe_store(&self, start: Instant, ok: bool) {
        let elapsed = start.elapsed();
        let span = tracing::Span::current();
        span.record("levee.ratelimit.store", self.store.kind());
        span.record(
            "levee.ratelimit.store.latency_ms",
            elapsed.as_secs_f64() * 1000.0,
        );
        if let Some(m) = &self.metrics {
            m.observe_store(elapsed, ok);
        }
    }

    /// Counts one decision per (layer, tier) — the worst of the layer's
    /// limits — and records the deciding limit on the current span.
    /// `None` means the store was down and a tier fails closed.
    fn record(&self, applied: &[Applied], checked: Option<&Checked>) {
        let mut per_layer: Vec<(Layer, &str, RateLimitDecision)> = Vec::new();
        for (i, a) in applied.iter().enumerate() {
            let d = match checked.map(|c| (c.decision.states.get(i), c.degraded)) {
                None => RateLimitDecision::FailClosed,
                Some((Some(s), _)) if !s.allowed && a.spec.shadow => {
                    RateLimitDecision::ShadowLimited
                }
                Some((Some(s), _)) if !s.allowed => RateLimitDecision::Limited,
                Some((_, true)) => RateLimitDecision::FailOpen,
                Some((_, false)) => RateLimitDecision::Allowed,
            };
            let layer = a.layer;
            match per_layer
                .iter_mut()
                .find(|(l, t, _)| *l == layer && *t == a.tier)
            {
                Some(entry) => entry.2 = entry.2.max(d),
                None => per_layer.push((layer, &a.tier, d)),
            }
        }
        if let Some(m) = &self.metrics {
            for (layer, tier, d) in &per_layer {
                m.record_decision(*layer, tier, *d);
            }
        }
        let span = tracing::Span::current();
        let deciding = match checked {
            Some(c) => {
                headers::most_constraining(applied, &c.decision).and_then(|i| applied.get(i))
            }
            None => applied.first(),
        };
        let overall = per_layer
            .iter()
            .map(|(_, _, d)| *d)
            .max()
            .unwrap_or(RateLimitDecision::Allowed);
        span.record("levee.ratelimit.decision", overall.as_str());
        if let Some(a) = deciding {
            span.record("levee.ratelimit.layer", a.layer.as_str());
            span.record("levee.ratelimit.tier", a.tier.as_str());
            span.record("levee.ratelimit.scope", a.scope);
        }
    }

    /// The child span of one limiter call; the store, its latency and the
    /// decision are recorded on it.
    fn span(name: &'static str) -> tracing::Span {
        tracing::info_span!(
            target: "levee::ratelimit",
            "ratelimit",
            otel.name = name,
            otel.kind = "internal",
            levee.ratelimit.decision = Empty,
            levee.ratelimit.layer = Empty,
            levee.ratelimit.tier = Empty,
            levee.ratelimit.scope = Empty,
            levee.ratelimit.store = Empty,
            levee.ratelimit.store.latency_ms = Empty,
        )
    }

    /// Records a refusal on the request's own span (the SERVER span when
    /// called from the HTTP stack), so a 429 or 503 says why.
    fn record_refusal(request_span: &tracing::Span, error: &(dyn std::error::Error + 'static)) {
        if let Some(rl) = error.downcast_ref::<RateLimited>() {
            request_span.record(
                "levee.ratelimit.decision",
                RateLimitDecision::Limited.as_str(),
            );
            request_span.record("levee.ratelimit.layer", rl.layer.as_str());
            request_span.record("levee.ratelimit.tier", rl.tier.as_str());
            request_span.record("levee.ratelimit.scope", rl.scope);
        } else if error.downcast_ref::<LimiterUnavailable>().is_some() {
            request_span.record(
                "levee.ratelimit.decision",
                RateLimitDecision::FailClosed.as_str(),
            );
        } else {
            request_span.record("levee.ratelimit.decision", "refused");
        }
    }

    /// Records an admission on the request's span.
    fn record_admission(request_span: &tracing::Span, headers: &HeaderMap) {
        let degraded = headers.contains_key(X_DEGRADED);
        request_span.record(
            "levee.ratelimit.decision",
            if degraded {
                RateLimitDecision::FailOpen.as_str()
            } else {
                RateLimitDecision::Allowed.as_str()
            },
        );
        if let Some(tier) = headers
            .get("x-ratelimit-tier")
            .and_then(|v| v.to_str().ok())
        {
            request_span.record("levee.ratelimit.tier", tier);
        }
    }

    fn record_tenant(&self, identity: &Identity, decision: RateLimitDecision) {
        if let (Some(m), Some(key)) = (&self.metrics, &identity.key) {
            m.record_tenant_decision(&key.tenant, decision);
        }
    }

    fn rejected(applied: &[Applied], decision: &Decision) -> RateLimited {
        let i = headers::most_constraining(applied, decision).unwrap_or(0);
        let a = &applied[i];
        RateLimited {
            layer: a.layer,
            scope: a.scope,
            tier: a.tier.clone(),
            retry_after: decision.states[i].retry_after,
        }
    }

    /// Admits or refuses one request of `identity` to `path`; consumes
    /// quota only when admitted, and answers the rate-limit headers to add
    /// to the response. Runs in a `ratelimit` span and records the outcome
    /// on the caller's span too.
    pub async fn admit(&self, identity: &Identity, path: &str) -> Result<HeaderMap, Rejection> {
        let request_span = tracing::Span::current();
        let result = self
            .admit_inner(identity, path)
            .instrument(Self::span("ratelimit.check"))
            .await;
        match &result {
            Ok(headers) => Self::record_admission(&request_span, headers),
            Err(rejection) => Self::record_refusal(&request_span, rejection.error.as_ref()),
        }
        result
    }

    async fn admit_inner(&self, identity: &Identity, path: &str) -> Result<HeaderMap, Rejection> {
        let applied = self
            .policy
            .load()
            .limits(identity, path, identity.user.as_deref());
        if applied.is_empty() {
            return Ok(HeaderMap::new());
        }
        let checked = match self.check(&applied).await {
            Ok(c) => c,
            Err(rejection) => {
                self.record_tenant(identity, RateLimitDecision::FailClosed);
                return Err(rejection);
            }
        };
        let headers = checked.headers(&applied);
        self.record_tenant(
            identity,
            match (checked.decision.allowed, checked.degraded) {
                (false, _) => RateLimitDecision::Limited,
                (true, true) => RateLimitDecision::FailOpen,
                (true, false) => RateLimitDecision::Allowed,
            },
        );
        if checked.decision.allowed {
            Ok(headers)
        } else {
            Err(Rejection::new(
                Self::rejected(&applied, &checked.decision),
                headers,
            ))
        }
    }

    /// An unknown or malformed key is 401, but the attempt still counts
    /// against the client's IP, so guessing keys is throttled like any
    /// anonymous traffic (429 once the IP limit is spent).
    pub async fn refuse_key(&self, identity: &Identity, error: IdentityError) -> Rejection {
        let mut applied = Vec::new();
        self.policy.load().network_limits(identity, &mut applied);
        if applied.is_empty() {
            return Rejection::new(error, HeaderMap::new());
        }
        match self.check(&applied).await {
            Ok(checked) => {
                let headers = checked.headers(&applied);
                if checked.decision.allowed {
                    Rejection::new(error, headers)
                } else {
                    Rejection::new(Self::rejected(&applied, &checked.decision), headers)
                }
            }
            Err(rejection) => rejection,
        }
    }

    /// Reserves an estimate of LLM tokens from the caller's tenant budget;
    /// `Ok(None)` when no budget applies.
    pub async fn reserve_tokens(
        &self,
        identity: &Identity,
        estimate: u64,
    ) -> Result<Option<TokenReservation>, Rejection> {
        let request_span = tracing::Span::current();
        let result = self
            .reserve_tokens_inner(identity, estimate)
            .instrument(Self::span("ratelimit.tokens"))
            .await;
        if let Err(rejection) = &result {
            Self::record_refusal(&request_span, rejection.error.as_ref());
        }
        result
    }

    async fn reserve_tokens_inner(
        &self,
        identity: &Identity,
        estimate: u64,
    ) -> Result<Option<TokenReservation>, Rejection> {
        let Some(mut budget) = self.policy.load().token_budget(identity) else {
            return Ok(None);
        };
        // A single request larger than the whole budget could never pass;
        // charge it the whole budget instead of refusing it forever.
        budget.spec.cost = estimate.clamp(1, budget.spec.limit);
        let applied = [budget];
        let checked = self.check(&applied).await?;
        if checked.decision.allowed {
            let [budget] = applied;
            let tenant = identity
                .key
                .as_ref()
                .map_or_else(|| Arc::from(""), |k| Arc::from(k.tenant.as_str()));
            Ok(Some(TokenReservation {
                reserved: budget.spec.cost,
                spec: budget.spec,
                tenant,
            }))
        } else {
            let headers = checked.headers(&applied);
            Err(Rejection::new(
                Self::rejected(&applied, &checked.decision),
                headers,
            ))
        }
    }

    /// Settles a reservation with the real usage: refunds or charges the
    /// difference. A store failure here is logged, not surfaced: the answer
    /// has already been produced.
    pub async fn settle_tokens(&self, reservation: TokenReservation, used: u64) {
        if let Some(m) = &self.metrics {
            m.record_tokens(&reservation.tenant, used);
        }
        let delta = i64::try_from(used).unwrap_or(i64::MAX)
            - i64::try_from(reservation.reserved).unwrap_or(i64::MAX);
        if delta == 0 {
            return;
        }
        let start = Instant::now();
        let result = self.store.adjust(&reservation.spec, delta).await;
        if let Some(m) = &self.metrics {
            m.observe_store(start.elapsed(), result.is_ok());
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, delta, "could not settle token reservation");
        }
    }
}

/// The identity layer asks the limiter before refusing a key, so the
/// attempt is counted against the client's network limits.
#[async_trait::async_trait]
impl OnRefusal for Limiter {
    async fn refused(&self, identity: Identity, error: IdentityError) -> tower::BoxError {
        let request_span = tracing::Span::current();
        let rejection = self
            .refuse_key(&identity, error)
            .instrument(Self::span("ratelimit.check"))
            .await;
        Self::record_refusal(&request_span, rejection.error.as_ref());
        Box::new(rejection)
    }
}
