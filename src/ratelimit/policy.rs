//! Which limits apply to a request: the identity layer (key tier, tenant,
//! per-user, route policy) and the network layer (IP tier), turned into
//! store [`LimitSpec`]s with safe key names.

use std::time::Duration;

use serde::Serialize;

use super::config::{
    FailureMode, LimitConfig, RateLimitConfig, RoutePolicy, DEFAULT_TENANT_POLICY,
};
use super::store::{Algorithm, LimitSpec};
use crate::identity::{Identity, NetworkClass};

/// The layer a limit belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// API key / tenant / user.
    Identity,
    /// Client IP.
    Network,
    /// LLM token budget.
    Tokens,
}

impl Layer {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Identity => "identity",
            Self::Network => "network",
            Self::Tokens => "tokens",
        }
    }
}

/// A limit with what it means, for headers, errors and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// What the store checks.
    pub spec: LimitSpec,
    /// Its layer.
    pub layer: Layer,
    /// What it counts: `key`, `tenant`, `user`, `route`, `ip`.
    pub scope: &'static str,
    /// Tier reported in `X-RateLimit-Tier`.
    pub tier: String,
    /// Policy name for the IETF `RateLimit-Policy` field.
    pub name: String,
    /// What to do while the store is down (the tier's setting).
    pub on_store_failure: FailureMode,
}

/// Compiled policy.
#[derive(Debug, Clone)]
pub struct Policy {
    config: RateLimitConfig,
}

fn algo_code(a: Algorithm) -> &'static str {
    match a {
        Algorithm::SlidingLog => "sl",
        Algorithm::SlidingWindow => "sw",
        Algorithm::Gcra => "gc",
        Algorithm::FixedWindow => "fw",
    }
}

fn window_label(w: Duration) -> String {
    let ms = w.as_millis();
    if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// User ids are caller-supplied: key names carry a short digest of them,
/// never the id itself.
fn user_digest(user: &str) -> String {
    crate::identity::hash_key(user)[..16].to_owned()
}

/// A route policy's specificity: tenant + user beats tenant beats route only;
/// an exact path beats a prefix.
fn specificity(r: &RoutePolicy) -> (u8, bool) {
    let level = u8::from(r.tenant.is_some()) + u8::from(r.user.is_some());
    (level, !r.route.ends_with('*'))
}

use crate::identity::path_matches as route_matches;

impl Policy {
    /// Compiles validated config.
    pub fn new(config: RateLimitConfig) -> Self {
        Self { config }
    }

    /// The config.
    pub fn config(&self) -> &RateLimitConfig {
        &self.config
    }

    /// What a tier does while the store is down.
    pub fn failure_mode(&self, tier: &str) -> FailureMode {
        self.config
            .tiers
            .get(tier)
            .map(|t| t.on_store_failure)
            .unwrap_or_default()
    }

    /// Whether `path` is exempt.
    pub fn is_exempt(&self, path: &str) -> bool {
        self.config
            .exempt_paths
            .iter()
            .any(|p| route_matches(p, path))
    }

    fn spec(&self, scope: &str, subject: &str, l: &LimitConfig, cost: u64) -> LimitSpec {
        let algorithm = l.algorithm.unwrap_or(self.config.algorithm);
        LimitSpec {
            // The algorithm, window and shadow flag are in the key, so two
            // limits on one subject (say 100/min enforced and 2/min shadow)
            // never share counters; validation refuses two that would. The
            // limit's value is not: a reload that tunes it keeps the
            // subject's counters. `{scope:subject}` is the key's hash tag:
            // on a cluster, every limit of one subject lives in one slot.
            key: format!(
                "{}:{}:{{{scope}:{subject}}}:{}{}",
                self.config.key_prefix,
                algo_code(algorithm),
                window_label(l.window),
                if l.shadow { ":shadow" } else { "" }
            ),
            algorithm,
            limit: l.limit,
            window: l.window,
            burst: l.burst.unwrap_or(l.limit),
            cost,
            shadow: l.shadow,
        }
    }

    fn push_all(
        &self,
        out: &mut Vec<Applied>,
        limits: &[LimitConfig],
        layer: Layer,
        scope: &'static str,
        subject: &str,
        tier: &str,
    ) {
        let on_store_failure = self.failure_mode(tier);
        for l in limits {
            out.push(Applied {
                spec: self.spec(scope, subject, l, 1),
                layer,
                scope,
                tier: tier.to_owned(),
                name: format!(
                    "{tier}.{scope}.{}{}",
                    window_label(l.window),
                    if l.shadow { ".shadow" } else { "" }
                ),
                on_store_failure,
            });
        }
    }

    /// The network layer's limits for a client.
    pub fn network_limits(&self, identity: &Identity, out: &mut Vec<Applied>) {
        let net = &self.config.network;
        let tier = match (&identity.key, identity.network) {
            (Some(_), _) => match &net.keyed_tier {
                Some(t) => t,
                None => return,
            },
            (None, NetworkClass::Internal) => &net.internal_tier,
            (None, NetworkClass::Public) => &net.public_tier,
        };
        if let Some(t) = self.config.tiers.get(tier) {
            let ip = identity.client_ip.to_string();
            self.push_all(out, &t.limits, Layer::Network, "ip", &ip, tier);
        }
    }

    /// Every limit that applies to a request, identity layer first.
    pub fn limits(&self, identity: &Identity, path: &str, user: Option<&str>) -> Vec<Applied> {
        let mut out = Vec::new();
        if let Some(key) = &identity.key {
            if let Some(t) = self.config.tiers.get(&key.tier) {
                self.push_all(
                    &mut out,
                    &t.limits,
                    Layer::Identity,
                    "key",
                    &key.id,
                    &key.tier,
                );
            }
            if let Some(tenant) = self.tenant(&key.tenant) {
                self.push_all(
                    &mut out,
                    &tenant.limits,
                    Layer::Identity,
                    "tenant",
                    &key.tenant,
                    &key.tier,
                );
                if let Some(user) = user {
                    let subject = format!("{}:{}", key.tenant, user_digest(user));
                    self.push_all(
                        &mut out,
                        &tenant.per_user,
                        Layer::Identity,
                        "user",
                        &subject,
                        &key.tier,
                    );
                }
            }
        }
        if let Some(route) = self.route_policy(identity, path, user) {
            let tier = identity
                .key
                .as_ref()
                .map_or("route", |k| k.tier.as_str())
                .to_owned();
            let subject = format!(
                "{}:{}:{}",
                route.route.trim_end_matches('*'),
                route.tenant.as_deref().unwrap_or("*"),
                route
                    .user
                    .as_deref()
                    .map_or_else(|| "*".to_owned(), user_digest)
            );
            self.push_all(
                &mut out,
                &route.limits,
                Layer::Identity,
                "route",
                &subject,
                &tier,
            );
        }
        self.network_limits(identity, &mut out);
        out
    }

    fn tenant(&self, tenant: &str) -> Option<&super::config::TenantConfig> {
        self.config
            .tenants
            .get(tenant)
            .or_else(|| self.config.tenants.get(DEFAULT_TENANT_POLICY))
    }

    fn route_policy(
        &self,
        identity: &Identity,
        path: &str,
        user: Option<&str>,
    ) -> Option<&RoutePolicy> {
        let tenant = identity.key.as_ref().map(|k| k.tenant.as_str());
        self.config
            .routes
            .iter()
            .filter(|r| route_matches(&r.route, path))
            .filter(|r| r.tenant.is_none() || r.tenant.as_deref() == tenant)
            .filter(|r| r.user.is_none() || r.user.as_deref() == user)
            .max_by_key(|r| specificity(r))
    }

    /// The token budget for a keyed request's tenant, as a GCRA limit whose
    /// cost is filled in per reservation.
    pub fn token_budget(&self, identity: &Identity) -> Option<Applied> {
        let key = identity.key.as_ref()?;
        let tpm = self.tenant(&key.tenant)?.tokens_per_minute?;
        let l = LimitConfig {
            limit: tpm,
            window: Duration::from_secs(60),
            algorithm: Some(Algorithm::Gcra),
            burst: None,
            shadow: false,
        };
        Some(Applied {
            spec: self.spec("tokens", &key.tenant, &l, 0),
            layer: Layer::Tokens,
            scope: "tenant",
            tier: key.tier.clone(),
            name: format!("{}.tokens.1m", key.tier),
            on_store_failure: self.failure_mode(&key.tier),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::identity::KeyInfo;
    use crate::ratelimit::config::RoutePolicy;

    fn keyed(tenant: &str) -> Identity {
        Identity {
            client_ip: IpAddr::from([203, 0, 113, 9]),
            network: NetworkClass::Public,
            key: Some(std::sync::Arc::new(KeyInfo {
                id: "k1".into(),
                tenant: tenant.into(),
                tier: "API_KEY".into(),
            })),
            user: None,
        }
    }

    fn route(route: &str, tenant: Option<&str>, user: Option<&str>, limit: u64) -> RoutePolicy {
        RoutePolicy {
            route: route.into(),
            tenant: tenant.map(Into::into),
            user: user.map(Into::into),
            limits: vec![LimitConfig::per(limit, Duration::from_secs(60))],
        }
    }

    fn route_limit(applied: &[Applied]) -> Option<u64> {
        applied
            .iter()
            .find(|a| a.scope == "route")
            .map(|a| a.spec.limit)
    }

    #[test]
    fn the_most_specific_route_policy_applies() {
        let policy = Policy::new(RateLimitConfig {
            routes: vec![
                route("/v1/*", None, None, 100),
                route("/v1/chat", None, None, 50),
                route("/v1/chat", Some("acme"), None, 20),
                route("/v1/chat", Some("acme"), Some("alice"), 5),
            ],
            ..RateLimitConfig::default()
        });
        let acme = keyed("acme");
        assert_eq!(
            route_limit(&policy.limits(&acme, "/v1/chat", Some("alice"))),
            Some(5)
        );
        assert_eq!(
            route_limit(&policy.limits(&acme, "/v1/chat", Some("bob"))),
            Some(20)
        );
        assert_eq!(
            route_limit(&policy.limits(&keyed("other"), "/v1/chat", None)),
            Some(50)
        );
        assert_eq!(
            route_limit(&policy.limits(&acme, "/v1/other", None)),
            Some(100)
        );
        assert_eq!(route_limit(&policy.limits(&acme, "/v2/chat", None)), None);
    }

    #[test]
    fn keyed_requests_get_key_tenant_and_user_limits_and_no_ip_limit_by_default() {
        let mut config = RateLimitConfig::default();
        config.tenants.insert(
            "acme".into(),
            crate::ratelimit::TenantConfig {
                limits: vec![LimitConfig::per(10, Duration::from_secs(1))],
                per_user: vec![LimitConfig::per(3, Duration::from_secs(1))],
                ..Default::default()
            },
        );
        let policy = Policy::new(config);
        let applied = policy.limits(&keyed("acme"), "/v1/chat", Some("alice"));
        let scopes: Vec<&str> = applied.iter().map(|a| a.scope).collect();
        assert_eq!(scopes, vec!["key", "tenant", "user"]);
        // Key names carry ids and hashes, never raw user ids.
        assert!(applied.iter().all(|a| !a.spec.key.contains("alice")));
        assert!(applied[0].spec.key.contains(":{key:k1}:"));
    }

    #[test]
    fn keyed_tier_adds_a_per_ip_ceiling() {
        let mut config = RateLimitConfig::default();
        config.network.keyed_tier = Some("PUBLIC_IP".into());
        let policy = Policy::new(config);
        let applied = policy.limits(&keyed("acme"), "/v1/chat", None);
        assert!(applied
            .iter()
            .any(|a| a.layer == Layer::Network && a.spec.limit == 20));
    }
}
