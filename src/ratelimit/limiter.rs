//! The limiter: resolves the caller, gathers every applicable limit, and
//! asks the store once. Used by the tower layer ([`super::RateLimit`]) and,
//! for token budgets, by the chat handler.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;

use super::config::FailureMode;
use super::error::{LimiterUnavailable, RateLimited};
use super::headers;
use super::policy::{Applied, Policy};
use super::store::{Decision, LimitSpec, LimitStore, MemoryStore};
use crate::identity::{Identity, IdentityError, Resolver};

/// Header carrying the end user for per-user sub-limits.
pub const USER_HEADER: &str = "x-user-id";

/// An admitted request: who it is and the headers to add to the response.
#[derive(Debug)]
pub struct Admission {
    /// The caller.
    pub identity: Identity,
    /// Rate-limit headers.
    pub headers: HeaderMap,
}

/// A refused request: why, and the headers to send with the refusal.
#[derive(Debug)]
pub struct Rejection {
    /// The reason (mapped to HTTP in `http::error`).
    pub error: Box<dyn std::error::Error + Send + Sync>,
    /// Rate-limit headers (empty when no limit was checked).
    pub headers: HeaderMap,
}

/// A token reservation to settle after the LLM call.
#[derive(Debug)]
pub struct TokenReservation {
    spec: LimitSpec,
    reserved: u64,
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
    policy: Policy,
    resolver: Resolver,
    store: Arc<dyn LimitStore>,
    /// Local safety limits for fail-open tiers while `store` is down.
    fallback: MemoryStore,
    instance: u64,
    seq: AtomicU64,
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
    pub fn new(policy: Policy, resolver: Resolver, store: Arc<dyn LimitStore>) -> Self {
        Self {
            policy,
            resolver,
            store,
            fallback: MemoryStore::new(),
            instance: rand::random(),
            seq: AtomicU64::new(0),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
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
        let err = match self.store.check(&specs, &request_id).await {
            Ok(decision) => {
                return Ok(Checked {
                    decision,
                    degraded: false,
                })
            }
            Err(e) => e,
        };
        tracing::warn!(error = %err, "rate-limit store unavailable");
        if applied
            .iter()
            .any(|a| a.on_store_failure == FailureMode::FailClosed)
        {
            return Err(Rejection::new(
                LimiterUnavailable {
                    retry_after: STORE_RETRY_AFTER,
                },
                HeaderMap::new(),
            ));
        }
        let replicas = u64::from(self.policy.config().replicas.max(1));
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
        Ok(Checked {
            decision,
            degraded: true,
        })
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

    /// Admits or refuses one request; consumes quota only when admitted.
    pub async fn admit(
        &self,
        peer: Option<SocketAddr>,
        req_headers: &HeaderMap,
        path: &str,
    ) -> Result<Admission, Rejection> {
        let (client_ip, network) = self
            .resolver
            .network(peer, req_headers)
            .map_err(|e| Rejection::new(e, HeaderMap::new()))?;
        let mut identity = Identity {
            client_ip,
            network,
            key: None,
        };
        let key = match self.resolver.key(req_headers) {
            Ok(key) => key,
            Err(e) => return Err(self.refuse_key(&identity, e).await),
        };
        identity.key = key;
        let user = req_headers
            .get(USER_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|u| !u.is_empty());
        let applied = self.policy.limits(&identity, path, user);
        if applied.is_empty() {
            return Ok(Admission {
                identity,
                headers: HeaderMap::new(),
            });
        }
        let checked = self.check(&applied).await?;
        let headers = checked.headers(&applied);
        if checked.decision.allowed {
            Ok(Admission { identity, headers })
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
    async fn refuse_key(&self, identity: &Identity, error: IdentityError) -> Rejection {
        let mut applied = Vec::new();
        self.policy.network_limits(identity, &mut applied);
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
        let Some(mut budget) = self.policy.token_budget(identity) else {
            return Ok(None);
        };
        // A single request larger than the whole budget could never pass;
        // charge it the whole budget instead of refusing it forever.
        budget.spec.cost = estimate.clamp(1, budget.spec.limit);
        let applied = [budget];
        let checked = self.check(&applied).await?;
        if checked.decision.allowed {
            let [budget] = applied;
            Ok(Some(TokenReservation {
                reserved: budget.spec.cost,
                spec: budget.spec,
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
        let delta = i64::try_from(used).unwrap_or(i64::MAX)
            - i64::try_from(reservation.reserved).unwrap_or(i64::MAX);
        if delta == 0 {
            return;
        }
        if let Err(e) = self.store.adjust(&reservation.spec, delta).await {
            tracing::warn!(error = %e, delta, "could not settle token reservation");
        }
    }
}
