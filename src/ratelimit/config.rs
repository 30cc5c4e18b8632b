//! `[ratelimit]`: tiers, tenants, route policies and the store.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::store::Algorithm;
use crate::error::ConfigError;
use crate::identity::IdentityConfig;

/// Tier of requests with a registered API key (unless the key names another).
pub const TIER_API_KEY: &str = "API_KEY";
/// Tier of anonymous requests from internal networks.
pub const TIER_INTERNAL_IP: &str = "INTERNAL_IP";
/// Tier of anonymous requests from everywhere else.
pub const TIER_PUBLIC_IP: &str = "PUBLIC_IP";
/// Tenant entry that applies to every tenant not listed.
pub const DEFAULT_TENANT_POLICY: &str = "default";
/// Default Redis key prefix.
pub const DEFAULT_KEY_PREFIX: &str = "levee:rl";
/// Default algorithm: exact, and cheap at the limits gateways use per key.
pub const DEFAULT_ALGORITHM: Algorithm = Algorithm::SlidingLog;

/// Which store holds the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// Redis when `redis.url` is set, else in process.
    Auto,
    /// In process (per replica).
    Memory,
    /// Redis (shared by replicas); requires `redis.url`.
    Redis,
}

/// `[ratelimit]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Turn limiting off entirely. Default `true`.
    pub enabled: bool,
    /// Counter store. Default `auto`.
    pub store: StoreKind,
    /// Algorithm for limits that do not name one. Default `sliding_log`.
    pub algorithm: Algorithm,
    /// Prefix of every store key. Default `levee:rl`.
    pub key_prefix: String,
    /// Paths never limited. Default `/health`, `/ready`, `/metrics`,
    /// `/openapi.json`, `/admin/*` (the admin API is behind its own token),
    /// `/v1/jobs/*`.
    pub exempt_paths: Vec<String>,
    /// Named tiers and their limits. Defaults: `API_KEY` 60/min,
    /// `INTERNAL_IP` 120/min, `PUBLIC_IP` 20/min; a file that names some
    /// tiers keeps the defaults of the others.
    pub tiers: BTreeMap<String, TierConfig>,
    /// Which tiers the network layer uses.
    pub network: NetworkPolicy,
    /// Per-tenant limits; the `default` entry covers unlisted tenants.
    /// Default: none.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// Route-scoped policies; the most specific match applies.
    pub routes: Vec<RoutePolicy>,
    /// Replicas sharing the store: while it is down, each replica enforces
    /// `limit / replicas` locally for fail-open tiers. Default 1.
    pub replicas: u32,
}

/// The network layer's tiers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkPolicy {
    /// Tier of anonymous internal clients. Default `INTERNAL_IP`.
    pub internal_tier: String,
    /// Tier of anonymous public clients. Default `PUBLIC_IP`.
    pub public_tier: String,
    /// Optional per-IP ceiling also applied to keyed traffic. Default none.
    pub keyed_tier: Option<String>,
}

/// What a tier does while the limit store is unavailable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// Keep serving under an in-process safety limit per replica
    /// (the tier's limit / `ratelimit.replicas`), marked
    /// `X-RateLimit-Degraded: true`.
    #[default]
    FailOpen,
    /// Answer 503 `limiter_unavailable` with `Retry-After`.
    FailClosed,
}

/// One tier.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierConfig {
    /// Limits, all enforced.
    pub limits: Vec<LimitConfig>,
    /// Behaviour while the store is down. Default `fail_open`.
    pub on_store_failure: FailureMode,
}

/// One limit.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitConfig {
    /// Units per window.
    pub limit: u64,
    /// Window length, e.g. `1s`, `1m`.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Algorithm; default `ratelimit.algorithm`.
    #[serde(default)]
    pub algorithm: Option<Algorithm>,
    /// GCRA burst; default `limit`.
    #[serde(default)]
    pub burst: Option<u64>,
    /// Count and report, never reject. Default false.
    #[serde(default)]
    pub shadow: bool,
}

/// One tenant's limits.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantConfig {
    /// Request limits shared by all of the tenant's keys.
    pub limits: Vec<LimitConfig>,
    /// Sub-limits per user (`X-User-Id`) within the tenant.
    pub per_user: Vec<LimitConfig>,
    /// LLM tokens per minute: reserved before the call, settled after.
    pub tokens_per_minute: Option<u64>,
    /// The tenant's share of the LLM's capacity in the fair queue,
    /// relative to other tenants' weights (1–1000). Default 1.
    pub weight: Option<u32>,
    /// Requests of the tenant that may wait for the LLM at once (beyond:
    /// 429 `tenant_queue_full`). Default 64.
    pub max_queue: Option<usize>,
    /// Longest wait for an LLM slot; a request that cannot be served
    /// within it is refused at once. Default 2 s.
    #[serde(default, with = "humantime_serde::option")]
    pub max_wait: Option<Duration>,
    /// Jobs the tenant may have queued or running (beyond: 429
    /// `queue_full`). Default `jobs.max_queued_jobs`.
    pub max_queued_jobs: Option<u64>,
}

impl TenantConfig {
    /// The tenant's fair-queue policy (defaults for unset fields),
    /// validated; `at` is the key prefix for errors.
    pub fn queue_policy(&self, at: &str) -> Result<crate::fairness::QueuePolicy, ConfigError> {
        use crate::fairness::{DEFAULT_MAX_QUEUE, DEFAULT_MAX_WAIT, DEFAULT_WEIGHT};
        crate::fairness::QueuePolicy::try_new(
            at,
            self.weight.unwrap_or(DEFAULT_WEIGHT),
            self.max_queue.unwrap_or(DEFAULT_MAX_QUEUE),
            self.max_wait.unwrap_or(DEFAULT_MAX_WAIT),
        )
    }
}

/// Limits for one route, optionally narrowed to a tenant and a user.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutePolicy {
    /// Exact path, or a prefix ending in `*`.
    pub route: String,
    /// Only this tenant's keyed requests.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Only this user (`X-User-Id`) within the tenant.
    #[serde(default)]
    pub user: Option<String>,
    /// Limits.
    pub limits: Vec<LimitConfig>,
}

impl LimitConfig {
    /// `limit` per `window` with the default algorithm.
    pub fn per(limit: u64, window: Duration) -> Self {
        Self {
            limit,
            window,
            algorithm: None,
            burst: None,
            shadow: false,
        }
    }
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        let minute = Duration::from_secs(60);
        let tier = |n| TierConfig {
            limits: vec![LimitConfig::per(n, minute)],
            on_store_failure: FailureMode::FailOpen,
        };
        let tiers = [
            (TIER_API_KEY, 60),
            (TIER_INTERNAL_IP, 120),
            (TIER_PUBLIC_IP, 20),
        ]
        .into_iter()
        .map(|(name, n)| (name.to_owned(), tier(n)))
        .collect();
        Self {
            enabled: true,
            store: StoreKind::Auto,
            algorithm: DEFAULT_ALGORITHM,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            exempt_paths: [
                "/health",
                "/ready",
                "/metrics",
                "/openapi.json",
                "/admin/*",
                "/v1/jobs/*",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
            tiers,
            network: NetworkPolicy::default(),
            tenants: BTreeMap::new(),
            routes: Vec::new(),
            replicas: 1,
        }
    }
}

impl Default for NetworkPolicy {
    fn default() -> Self {
        Self {
            internal_tier: TIER_INTERNAL_IP.to_owned(),
            public_tier: TIER_PUBLIC_IP.to_owned(),
            keyed_tier: None,
        }
    }
}

fn validate_limits(
    at: &str,
    limits: &[LimitConfig],
    default: Algorithm,
) -> Result<(), ConfigError> {
    for (i, l) in limits.iter().enumerate() {
        // A limit's store key names its algorithm, window and shadow flag
        // (not its value, so a reload that tunes the value keeps the
        // counters): two limits alike in all three would share counters.
        let same = |o: &LimitConfig| {
            o.algorithm.unwrap_or(default) == l.algorithm.unwrap_or(default)
                && o.window == l.window
                && o.shadow == l.shadow
        };
        if let Some(j) = limits[..i].iter().position(same) {
            return Err(ConfigError::invalid(
                format!("{at}[{i}].window"),
                humantime::format_duration(l.window).to_string(),
                format!(
                    "{at}[{j}] has the same window, algorithm and shadow flag; \
                     keep the one that binds (the smaller limit)"
                ),
            ));
        }
        if l.limit == 0 {
            return Err(ConfigError::invalid(
                format!("{at}[{i}].limit"),
                "0",
                "must be positive",
            ));
        }
        if l.window < Duration::from_millis(1) {
            return Err(ConfigError::invalid(
                format!("{at}[{i}].window"),
                humantime::format_duration(l.window).to_string(),
                "must be at least 1ms",
            ));
        }
        if l.burst == Some(0) {
            return Err(ConfigError::invalid(
                format!("{at}[{i}].burst"),
                "0",
                "must be positive",
            ));
        }
    }
    Ok(())
}

impl RateLimitConfig {
    /// Puts back every default tier the file did not name: a file that
    /// tunes `PUBLIC_IP` keeps `API_KEY` and `INTERNAL_IP`.
    pub fn fill_default_tiers(&mut self) {
        for (name, tier) in Self::default().tiers {
            self.tiers.entry(name).or_insert(tier);
        }
    }

    /// Checks that every named tier exists and every limit is sane.
    pub fn validate(&self, identity: &IdentityConfig, has_redis: bool) -> Result<(), ConfigError> {
        if self.store == StoreKind::Redis && !has_redis {
            return Err(ConfigError::invalid(
                "ratelimit.store",
                "\"redis\"",
                "needs redis.url (or LEVEE_REDIS_URL)",
            ));
        }
        if self.replicas == 0 {
            return Err(ConfigError::invalid(
                "ratelimit.replicas",
                "0",
                "must be at least 1",
            ));
        }
        if self.key_prefix.is_empty() || self.key_prefix.contains(char::is_whitespace) {
            return Err(ConfigError::invalid(
                "ratelimit.key_prefix",
                format!("{:?}", self.key_prefix),
                "must be non-empty without spaces",
            ));
        }
        for (name, tier) in &self.tiers {
            if !crate::identity::is_plain_id(name) {
                return Err(ConfigError::invalid(
                    format!("ratelimit.tiers.{name}"),
                    format!("{name:?}"),
                    "tier names use letters, digits, '_', '-' or '.'",
                ));
            }
            validate_limits(
                &format!("ratelimit.tiers.{name}.limits"),
                &tier.limits,
                self.algorithm,
            )?;
        }
        let tier_exists = |key: &str, tier: &str| {
            if self.tiers.contains_key(tier) {
                Ok(())
            } else {
                Err(ConfigError::invalid(
                    key.to_owned(),
                    format!("{tier:?}"),
                    "no such tier under ratelimit.tiers",
                ))
            }
        };
        tier_exists(
            "ratelimit.network.internal_tier",
            &self.network.internal_tier,
        )?;
        tier_exists("ratelimit.network.public_tier", &self.network.public_tier)?;
        if let Some(t) = &self.network.keyed_tier {
            tier_exists("ratelimit.network.keyed_tier", t)?;
        }
        for (i, k) in identity.api_keys.iter().enumerate() {
            tier_exists(&format!("identity.api_keys[{i}].tier"), &k.tier)?;
        }
        for (name, t) in &self.tenants {
            let at = format!("ratelimit.tenants.{name}");
            validate_limits(&format!("{at}.limits"), &t.limits, self.algorithm)?;
            validate_limits(&format!("{at}.per_user"), &t.per_user, self.algorithm)?;
            t.queue_policy(&at)?;
            if t.tokens_per_minute == Some(0) {
                return Err(ConfigError::invalid(
                    format!("{at}.tokens_per_minute"),
                    "0",
                    "must be positive",
                ));
            }
        }
        for (i, r) in self.routes.iter().enumerate() {
            if !r.route.starts_with('/') {
                return Err(ConfigError::invalid(
                    format!("ratelimit.routes[{i}].route"),
                    format!("{:?}", r.route),
                    "must start with '/'",
                ));
            }
            if r.user.is_some() && r.tenant.is_none() {
                return Err(ConfigError::invalid(
                    format!("ratelimit.routes[{i}].user"),
                    format!("{:?}", r.user),
                    "a user policy also names its tenant",
                ));
            }
            validate_limits(
                &format!("ratelimit.routes[{i}].limits"),
                &r.limits,
                self.algorithm,
            )?;
        }
        Ok(())
    }
}
