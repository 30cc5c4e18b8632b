//! Identity configuration.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// Default IPv6 grouping prefix.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// `[identity]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdentityConfig {
    /// Proxies whose `X-Forwarded-For` / `Forwarded` headers are honoured
    /// (CIDRs). Default: none — forwarding headers are ignored.
    pub trusted_proxies: Vec<IpNet>,
    /// Networks whose clients get the internal tier. Default: the RFC 1918
    /// ranges 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16.
    pub internal_networks: Vec<IpNet>,
    /// IPv6 clients are grouped by this prefix length. Default 64.
    pub ipv6_prefix: u8,
    /// Registered API keys (by hash). Default: none.
    pub api_keys: Vec<ApiKeyConfig>,
    /// Refuse requests that present no API key (401 `unauthorized`).
    /// Default `false`: anonymous traffic is served under the network
    /// tiers. Unknown or malformed keys are refused whatever this says.
    pub require_api_key: bool,
    /// Paths that need an API key even while `require_api_key` is `false`:
    /// exact, or a prefix ending in `*` (e.g. `["/v1/*"]`). Default: none.
    pub require_api_key_paths: Vec<String>,
    /// Paths where the key headers are not read at all, because their
    /// credentials are not API keys: the probes, the scrape endpoint (a
    /// Prometheus bearer token is not a key) and the admin API (its own
    /// token). Same syntax. Default `/health`, `/ready`, `/metrics`,
    /// `/openapi.json`, `/admin/*`.
    pub keyless_paths: Vec<String>,
}

/// One registered API key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// Id used in logs, metrics and Redis key names.
    pub id: String,
    /// Hex SHA-256 of the key (`printf %s KEY | sha256sum`).
    pub sha256: String,
    /// Tenant the key belongs to.
    pub tenant: String,
    /// Tier whose limits apply (a name under `ratelimit.tiers`).
    pub tier: String,
}

impl Default for IdentityConfig {
    fn default() -> Self {
        let internal = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
            .iter()
            .map(|s| s.parse().expect("static CIDR"))
            .collect();
        Self {
            trusted_proxies: Vec::new(),
            internal_networks: internal,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            api_keys: Vec::new(),
            require_api_key: false,
            require_api_key_paths: Vec::new(),
            keyless_paths: ["/health", "/ready", "/metrics", "/openapi.json", "/admin/*"]
                .map(String::from)
                .to_vec(),
        }
    }
}

/// Whether `s` is a plain id: ids become parts of Redis keys and metric
/// labels, so they stay short and plain.
pub fn is_plain_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl IdentityConfig {
    /// Checks prefixes, hashes and ids.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.ipv6_prefix == 0 || self.ipv6_prefix > 128 {
            return Err(ConfigError::invalid(
                "identity.ipv6_prefix",
                self.ipv6_prefix.to_string(),
                "must be between 1 and 128",
            ));
        }
        for (name, paths) in [
            ("require_api_key_paths", &self.require_api_key_paths),
            ("keyless_paths", &self.keyless_paths),
        ] {
            for (i, p) in paths.iter().enumerate() {
                if !p.starts_with('/') {
                    return Err(ConfigError::invalid(
                        format!("identity.{name}[{i}]"),
                        format!("{p:?}"),
                        "must be a path starting with '/' (a trailing '*' makes it a prefix)",
                    ));
                }
            }
        }
        let mut seen_ids = std::collections::HashSet::new();
        let mut seen_hashes = std::collections::HashSet::new();
        for (i, k) in self.api_keys.iter().enumerate() {
            let at = |f: &str| format!("identity.api_keys[{i}].{f}");
            if !is_plain_id(&k.id) {
                return Err(ConfigError::invalid(
                    at("id"),
                    format!("{:?}", k.id),
                    "must be 1-64 characters of letters, digits, '_', '-' or '.'",
                ));
            }
            if !seen_ids.insert(k.id.as_str()) {
                return Err(ConfigError::invalid(
                    at("id"),
                    format!("{:?}", k.id),
                    "duplicate key id",
                ));
            }
            let hex_ok = k.sha256.len() == 64 && k.sha256.chars().all(|c| c.is_ascii_hexdigit());
            if !hex_ok {
                // Never echo the value: a key pasted here by mistake is a secret.
                return Err(ConfigError::invalid(
                    at("sha256"),
                    "(hidden)",
                    "must be the 64-hex-digit SHA-256 of the key, not the key itself",
                ));
            }
            if !seen_hashes.insert(k.sha256.to_ascii_lowercase()) {
                return Err(ConfigError::invalid(
                    at("sha256"),
                    "(hidden)",
                    "the same key is registered twice",
                ));
            }
            if !is_plain_id(&k.tenant) {
                return Err(ConfigError::invalid(
                    at("tenant"),
                    format!("{:?}", k.tenant),
                    "must be 1-64 characters of letters, digits, '_', '-' or '.'",
                ));
            }
        }
        Ok(())
    }
}
