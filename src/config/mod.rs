//! Configuration: plain serde structs with documented defaults, one
//! `validate()` at load that names the bad key and value, and `LEVEE_*`
//! environment overrides applied before validation.
//!
//! Every field has a default, so an empty file (or no file at all) is a valid
//! configuration: the gateway then runs on its embedded defaults.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::fairness::FairnessConfig;
use crate::identity::IdentityConfig;
use crate::ratelimit::RateLimitConfig;
use crate::resilience::ResilienceConfig;

mod env;

pub use crate::error::ConfigError;
pub use crate::rag::config::{
    MemoryConfig, RetrievalFallback, Route, RouterConfig, RouterRule, DEFAULT_MEMORY_MAX_BYTES,
    DEFAULT_MEMORY_MAX_THREADS, DEFAULT_MEMORY_MAX_TURNS, DEFAULT_MEMORY_TTL,
};
pub use crate::upstream::config::{
    DeploymentConfig, LlmConfig, ModelConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_EMBEDDING_MODEL,
    DEFAULT_LLM_API_KEY_ENV, DEFAULT_LLM_MAX_TOKENS, DEFAULT_LLM_MODEL, DEFAULT_STREAM_DRAIN_BYTES,
    DEFAULT_STREAM_DRAIN_TIMEOUT,
};
pub use env::{apply_env, OVERRIDES};

/// Default listen address (`server.listen`, `LEVEE_LISTEN`).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default request body limit (`server.max_body_bytes`): 64 KiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024;
/// Default bound on draining in-flight requests at shutdown.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Default bound on receiving a request's headers
/// (`server.header_read_timeout`): 10 s.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default bound on receiving a whole request body
/// (`server.body_read_timeout`): 30 s.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default bound on a keep-alive connection with no request in flight
/// (`server.idle_timeout`): 75 s (nginx's `keepalive_timeout`), longer than
/// the 60 s default of AWS's load balancer, so that the balancer closes
/// first.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(75);
/// Default cap on concurrent client connections (`server.max_connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default cap on a request's line and header fields
/// (`server.max_header_bytes`): 32 KiB.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 32 * 1024;
/// Default Qdrant collection.
pub const DEFAULT_COLLECTION: &str = "acme_kb";
/// Default number of passages retrieved per question.
pub const DEFAULT_TOP_K: usize = 3;
/// Default payload field holding a passage's text.
pub const DEFAULT_TEXT_FIELD: &str = "text";
/// Default longest accepted chat message, in bytes.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 8 * 1024;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// HTTP listener and request handling.
    pub server: ServerConfig,
    /// The LLM: empty `url` selects the built-in extractive answerer.
    pub llm: LlmConfig,
    /// The vector store: empty `url` selects the built-in index.
    pub vector_store: VectorStoreConfig,
    /// Conversation memory per thread.
    pub memory: MemoryConfig,
    /// The router stage's rules.
    pub router: RouterConfig,
    /// Redis, shared by conversation memory and the limiter store.
    pub redis: RedisConfig,
    /// Who is calling: trusted proxies, internal networks, API keys.
    pub identity: IdentityConfig,
    /// Rate limits: tiers, tenants, routes, store.
    pub ratelimit: RateLimitConfig,
    /// Per-dependency deadline, retry, breaker, bulkhead, attempt timeout.
    pub resilience: ResilienceConfig,
    /// The admin API.
    pub admin: AdminConfig,
    /// Per-tenant fair queues in front of the LLM's capacity.
    pub fairness: FairnessConfig,
    /// `[jobs]`: durable per-tenant job queues.
    pub jobs: crate::jobs::JobsConfig,
    /// The file this config was read from (`None`: embedded defaults):
    /// what a live reload re-reads. Not a setting.
    #[serde(skip)]
    pub source: Option<std::path::PathBuf>,
}

/// HTTP listener and request handling.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on. Default `127.0.0.1:8080`.
    pub listen: String,
    /// Largest accepted request body in bytes. Default 64 KiB.
    pub max_body_bytes: usize,
    /// Longest accepted chat `message` in bytes. Default 8 KiB.
    pub max_message_bytes: usize,
    /// Bound on draining in-flight requests at shutdown. Default 10 s.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// Longest a client may take to send a request's headers, counted from
    /// the connection's accept or, on a keep-alive connection, from the
    /// first byte of the request; the connection is closed past it.
    /// Default 10 s.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Longest a client may take to send a request's whole body, from the
    /// end of its headers; past it the answer is 408 `body_timeout` and the
    /// connection is closed (a trickled body cannot hold a handler and a
    /// connection slot for ever). Default 30 s.
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// How long a keep-alive connection may sit with no request in flight
    /// before it is closed. Default 75 s.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Most client connections open at once; at the cap Levee stops
    /// accepting and the kernel's listen backlog holds the rest. Default
    /// (unset): 10 000, or the open-files limit less 256 when that is lower,
    /// so the cap, not EMFILE, pushes back. A value set here is used as is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    /// Largest request line plus header fields, in bytes; larger is a 431.
    /// Default 32 KiB.
    pub max_header_bytes: usize,
}

/// The vector store upstream.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VectorStoreConfig {
    /// Qdrant base URL, e.g. `http://127.0.0.1:6333`. Empty (the default)
    /// selects the built-in in-process index over the Acme knowledge base.
    pub url: String,
    /// Collection searched. Default `acme_kb`.
    pub collection: String,
    /// Passages retrieved per question. Default 3.
    pub top_k: usize,
    /// Payload field holding a passage's text. Default `text`.
    pub text_field: String,
    /// OpenAI-compatible base URL used to embed queries for Qdrant. Empty
    /// (the default) means `llm.url`.
    pub embeddings_url: String,
    /// When retrieval fails or its breaker is open: `fail` (503 / 502 /
    /// 504) or `degrade` (answer without retrieval, `metadata.degraded`).
    /// Default `fail`.
    pub on_failure: RetrievalFallback,
}

/// Redis connection.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://host:port/db`. Empty (the default) keeps all state in
    /// process. Override with `LEVEE_REDIS_URL`. (The bound on one command,
    /// the breaker and the rest are under `[resilience.redis]`.)
    pub url: String,
    /// `standalone` (the default: `url`) or `cluster` (`cluster_nodes`).
    pub mode: RedisMode,
    /// Seed nodes of a Redis Cluster, e.g. `["redis://127.0.0.1:7000"]`;
    /// the client discovers the rest. Override with
    /// `LEVEE_REDIS_CLUSTER_NODES=redis://…,redis://…` (which also selects
    /// `mode = "cluster"`).
    pub cluster_nodes: Vec<String>,
}

/// How Redis is deployed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RedisMode {
    /// One server (`redis.url`).
    #[default]
    Standalone,
    /// A Redis Cluster (`redis.cluster_nodes`).
    Cluster,
}

impl RedisConfig {
    /// Whether any Redis is configured.
    pub fn is_configured(&self) -> bool {
        match self.mode {
            RedisMode::Standalone => !self.url.is_empty(),
            RedisMode::Cluster => !self.cluster_nodes.is_empty(),
        }
    }
}

/// The admin API (`/admin/breakers`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Environment variable holding the admin bearer token; while it is
    /// unset or empty the admin API is off (404). Default
    /// `LEVEE_ADMIN_TOKEN`.
    pub token_env: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            token_env: "LEVEE_ADMIN_TOKEN".to_owned(),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.to_owned(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: None,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
        }
    }
}

impl Default for VectorStoreConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            collection: DEFAULT_COLLECTION.to_owned(),
            top_k: DEFAULT_TOP_K,
            text_field: DEFAULT_TEXT_FIELD.to_owned(),
            embeddings_url: String::new(),
            on_failure: RetrievalFallback::Fail,
        }
    }
}

impl Config {
    /// Parses TOML text; the error names the offending key.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let de = toml::Deserializer::new(text);
        let mut config: Self = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::parse(key, e.into_inner().message().trim().to_owned())
        })?;
        config.ratelimit.fill_default_tiers();
        Ok(config)
    }

    /// Reads and parses a file, without env overrides or validation.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::io(path.display().to_string(), e.to_string()))?;
        Self::from_toml(&text)
    }

    /// Loads the configuration the way `levee serve` does: the file (if
    /// any), then `LEVEE_*` overrides from `vars`, then validation.
    pub fn load(
        path: Option<&Path>,
        vars: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let Some(path) = path else {
            let mut config = Self::default();
            apply_env(&mut config, vars)?;
            config.validate()?;
            return Ok(config);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::io(path.display().to_string(), e.to_string()))?;
        Self::load_text(&text, path, vars)
    }

    /// [`Config::load`] for the text of the file at `path` (already read:
    /// a live reload hashes the same bytes it parses).
    pub fn load_text(
        text: &str,
        path: &Path,
        vars: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut config = Self::from_toml(text)?;
        apply_env(&mut config, vars)?;
        config.validate()?;
        config.source = Some(path.to_path_buf());
        Ok(config)
    }

    /// Checks every field; the error names the key and the bad value.
    ///
    /// Sections are checked in a fixed order and the first error wins, so
    /// the order below is part of the behaviour.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.server.validate()?;
        self.llm.validate()?;
        self.vector_store.validate()?;
        self.validate_qdrant_embeddings()?;
        self.memory.validate()?;
        self.router.validate()?;
        self.redis.validate()?;
        self.llm.validate_secondary()?;
        self.resilience.llm.validate("resilience.llm")?;
        self.resilience
            .vector_store
            .validate("resilience.vector_store")?;
        self.resilience.redis.validate("resilience.redis")?;
        self.identity.validate()?;
        self.ratelimit
            .validate(&self.identity, self.redis.is_configured())?;
        self.fairness.validate()?;
        self.jobs.validate()?;
        Ok(())
    }

    /// Cross-section: a Qdrant store needs somewhere to embed queries, which
    /// may come from `llm.url`.
    fn validate_qdrant_embeddings(&self) -> Result<(), ConfigError> {
        if !self.vector_store.url.is_empty() && self.embeddings_url().is_empty() {
            return Err(ConfigError::invalid(
                "vector_store.embeddings_url",
                "\"\"",
                "a Qdrant vector store needs an embeddings endpoint: set llm.url or vector_store.embeddings_url",
            ));
        }
        Ok(())
    }

    /// The OpenAI-compatible base URL used to embed queries.
    pub fn embeddings_url(&self) -> &str {
        if self.vector_store.embeddings_url.is_empty() {
            &self.llm.url
        } else {
            &self.vector_store.embeddings_url
        }
    }
}

impl ServerConfig {
    /// Checks `server.*`: a parseable listen address and sane size limits.
    fn validate(&self) -> Result<(), ConfigError> {
        self.listen_addr()?;
        check(
            self.max_body_bytes >= 1024,
            "server.max_body_bytes",
            self.max_body_bytes,
            "must be at least 1024",
        )?;
        check(
            self.max_message_bytes >= 1 && self.max_message_bytes <= self.max_body_bytes,
            "server.max_message_bytes",
            self.max_message_bytes,
            "must be between 1 and server.max_body_bytes",
        )?;
        self.validate_connection_limits()
    }

    /// Checks the connection-hardening keys: each bounded on both sides, so
    /// that no value turns a protection off by being huge.
    fn validate_connection_limits(&self) -> Result<(), ConfigError> {
        check_between(
            "server.header_read_timeout",
            self.header_read_timeout,
            Duration::from_millis(100),
            Duration::from_secs(300),
        )?;
        check_between(
            "server.body_read_timeout",
            self.body_read_timeout,
            Duration::from_millis(100),
            Duration::from_secs(300),
        )?;
        check_between(
            "server.idle_timeout",
            self.idle_timeout,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        check(
            self.max_connections
                .is_none_or(|n| (1..=1_000_000).contains(&n)),
            "server.max_connections",
            self.max_connections.unwrap_or_default(),
            "must be between 1 and 1000000",
        )?;
        check(
            (1024..=1024 * 1024).contains(&self.max_header_bytes),
            "server.max_header_bytes",
            self.max_header_bytes,
            "must be between 1024 and 1048576",
        )
    }

    /// The parsed listen address.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.listen.parse().map_err(|_| {
            ConfigError::invalid(
                "server.listen",
                format!("{:?}", self.listen),
                "not a socket address (expected e.g. 127.0.0.1:8080)",
            )
        })
    }
}

impl LlmConfig {
    /// Checks the primary `llm.*` keys (the secondary is checked later, by
    /// [`LlmConfig::validate_secondary`], to keep the first-error order).
    fn validate(&self) -> Result<(), ConfigError> {
        check_url("llm.url", &self.url)?;
        check(
            !self.model.trim().is_empty(),
            "llm.model",
            &self.model,
            "must not be empty",
        )?;
        check_positive("llm.connect_timeout", self.connect_timeout)?;
        check(
            self.max_tokens > 0,
            "llm.max_tokens",
            self.max_tokens,
            "must be positive",
        )
    }

    /// Checks `llm.secondary_url`: a valid URL, and only alongside a primary.
    fn validate_secondary(&self) -> Result<(), ConfigError> {
        check_url("llm.secondary_url", &self.secondary_url)?;
        if !self.secondary_url.is_empty() && self.url.is_empty() {
            return Err(ConfigError::invalid(
                "llm.secondary_url",
                redact_url(&self.secondary_url),
                "a secondary LLM needs a primary: set llm.url",
            ));
        }
        self.validate_models()
    }

    /// Checks `llm.models` and the stream drain bounds: unique, non-empty
    /// names, each with at least one deployment of a valid URL and a
    /// positive weight.
    fn validate_models(&self) -> Result<(), ConfigError> {
        check_positive("llm.stream_drain_timeout", self.stream_drain_timeout)?;
        check(
            self.stream_drain_bytes > 0,
            "llm.stream_drain_bytes",
            self.stream_drain_bytes,
            "must be positive",
        )?;
        let mut seen = std::collections::HashSet::new();
        for (i, model) in self.models.iter().enumerate() {
            let at = format!("llm.models[{i}]");
            // Visible ASCII: the name goes into metric labels, breaker
            // names in admin URLs and the `x-levee-deployment` header.
            let name_ok = !model.name.is_empty()
                && model.name.len() <= 256
                && model
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'/');
            check(
                name_ok,
                &format!("{at}.name"),
                &model.name,
                "must be 1 to 256 visible ASCII characters, without spaces or '/'",
            )?;
            check(
                seen.insert(model.name.as_str()),
                &format!("{at}.name"),
                &model.name,
                "names a model already listed",
            )?;
            check(
                !model.deployments.is_empty(),
                &format!("{at}.deployments"),
                "[]",
                "a model needs at least one deployment",
            )?;
            for (j, d) in model.deployments.iter().enumerate() {
                let key = format!("{at}.deployments[{j}]");
                check(
                    !d.url.is_empty(),
                    &format!("{key}.url"),
                    &d.url,
                    "must be set",
                )?;
                check_url(&format!("{key}.url"), &d.url)?;
                check(
                    d.weight > 0,
                    &format!("{key}.weight"),
                    d.weight,
                    "must be positive",
                )?;
                if let Some(m) = &d.model {
                    check(
                        !m.trim().is_empty(),
                        &format!("{key}.model"),
                        m,
                        "must not be empty (leave it out to send the model's name)",
                    )?;
                }
            }
        }
        Ok(())
    }
}

impl VectorStoreConfig {
    /// Checks `vector_store.*` on its own (the embeddings endpoint, which may
    /// come from `llm.url`, is checked by `Config`).
    fn validate(&self) -> Result<(), ConfigError> {
        check_url("vector_store.url", &self.url)?;
        check_url("vector_store.embeddings_url", &self.embeddings_url)?;
        check(
            (1..=50).contains(&self.top_k),
            "vector_store.top_k",
            self.top_k,
            "must be between 1 and 50",
        )?;
        check(
            !self.collection.is_empty()
                && self
                    .collection
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "vector_store.collection",
            &self.collection,
            "must be non-empty and use only letters, digits, '_' and '-'",
        )
    }
}

impl MemoryConfig {
    /// Checks `memory.*`: bounds large enough to hold one exchange.
    fn validate(&self) -> Result<(), ConfigError> {
        check(
            self.max_turns >= 2,
            "memory.max_turns",
            self.max_turns,
            "must be at least 2 (one question and its answer)",
        )?;
        check(
            self.max_bytes >= 256,
            "memory.max_bytes",
            self.max_bytes,
            "must be at least 256",
        )?;
        check(
            self.ttl >= Duration::from_secs(1),
            "memory.ttl",
            humantime::format_duration(self.ttl),
            "must be at least 1s (Redis expiry has second resolution)",
        )?;
        check(
            self.max_threads > 0,
            "memory.max_threads",
            self.max_threads,
            "must be positive",
        )
    }
}

impl RouterConfig {
    /// Checks `router.rules[*]`: every rule has at least one real keyword.
    fn validate(&self) -> Result<(), ConfigError> {
        for (i, rule) in self.rules.iter().enumerate() {
            let ok =
                !rule.keywords.is_empty() && rule.keywords.iter().all(|k| !k.trim().is_empty());
            check(
                ok,
                &format!("router.rules[{i}].keywords"),
                format!("{:?}", rule.keywords),
                "must be a non-empty list of non-empty words",
            )?;
        }
        Ok(())
    }
}

impl RedisConfig {
    /// Checks `redis.url`, when set, is one the Redis client accepts, and
    /// that cluster mode has seed nodes (and no `url` to be confused with).
    fn validate(&self) -> Result<(), ConfigError> {
        if !self.url.is_empty() {
            redis::Client::open(self.url.as_str()).map_err(|e| {
                ConfigError::invalid("redis.url", redact_url(&self.url), e.to_string())
            })?;
        }
        match self.mode {
            RedisMode::Standalone if !self.cluster_nodes.is_empty() => Err(ConfigError::invalid(
                "redis.cluster_nodes",
                format!("{} nodes", self.cluster_nodes.len()),
                "seed nodes need redis.mode = \"cluster\"",
            )),
            RedisMode::Standalone => Ok(()),
            RedisMode::Cluster => {
                if self.cluster_nodes.is_empty() {
                    return Err(ConfigError::invalid(
                        "redis.cluster_nodes",
                        "[]",
                        "cluster mode needs at least one seed node",
                    ));
                }
                if !self.url.is_empty() {
                    return Err(ConfigError::invalid(
                        "redis.url",
                        redact_url(&self.url),
                        "cluster mode reads redis.cluster_nodes; leave redis.url empty",
                    ));
                }
                for (i, node) in self.cluster_nodes.iter().enumerate() {
                    redis::Client::open(node.as_str()).map_err(|e| {
                        ConfigError::invalid(
                            format!("redis.cluster_nodes[{i}]"),
                            redact_url(node),
                            e.to_string(),
                        )
                    })?;
                }
                Ok(())
            }
        }
    }
}

fn check(
    ok: bool,
    key: &str,
    value: impl std::fmt::Debug,
    reason: &str,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(key, format!("{value:?}"), reason))
    }
}

fn check_positive(key: &str, value: Duration) -> Result<(), ConfigError> {
    check(
        !value.is_zero(),
        key,
        humantime::format_duration(value).to_string(),
        "must be greater than zero",
    )
}

fn check_between(
    key: &str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    check(
        (min..=max).contains(&value),
        key,
        humantime::format_duration(value).to_string(),
        &format!(
            "must be between {} and {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ),
    )
}

fn check_url(key: &str, url: &str) -> Result<(), ConfigError> {
    if url.is_empty() {
        return Ok(());
    }
    let parsed = reqwest::Url::parse(url);
    let ok =
        matches!(&parsed, Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some());
    check(
        ok,
        key,
        redact_url(url),
        "must be an absolute http:// or https:// URL",
    )
}

/// Hides a password in a URL before it is shown in an error or a log.
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            // set_password only fails for cannot-be-a-base URLs, which have no password.
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests;
