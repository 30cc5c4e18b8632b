//! `LEVEE_*` environment overrides, applied after the file and before
//! validation so that a bad override is reported like a bad file entry.

use super::{Config, ConfigError};

/// Every override Levee reads, with the key it replaces (documented in the
/// README's configuration reference).
pub const OVERRIDES: &[(&str, &str)] = &[
    ("LEVEE_LISTEN", "server.listen"),
    ("LEVEE_LLM_URL", "llm.url"),
    ("LEVEE_LLM_MODEL", "llm.model"),
    ("LEVEE_VECTOR_STORE_URL", "vector_store.url"),
    ("LEVEE_VECTOR_STORE_COLLECTION", "vector_store.collection"),
    ("LEVEE_EMBEDDINGS_URL", "vector_store.embeddings_url"),
    ("LEVEE_REDIS_URL", "redis.url"),
    ("LEVEE_REDIS_CLUSTER_NODES", "redis.cluster_nodes"),
    ("LEVEE_MAX_BODY_BYTES", "server.max_body_bytes"),
];

/// Applies the overrides found by `vars` (normally `std::env::var`).
pub fn apply_env(
    config: &mut Config,
    vars: impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    for (var, key) in OVERRIDES {
        let Some(value) = vars(var) else { continue };
        let value = value.trim().to_owned();
        match *key {
            "server.listen" => config.server.listen = value,
            "llm.url" => config.llm.url = value,
            "llm.model" => config.llm.model = value,
            "vector_store.url" => config.vector_store.url = value,
            "vector_store.collection" => config.vector_store.collection = value,
            "vector_store.embeddings_url" => config.vector_store.embeddings_url = value,
            "redis.url" => config.redis.url = value,
            "redis.cluster_nodes" => {
                config.redis.cluster_nodes = value
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(str::to_owned)
                    .collect();
                config.redis.mode = super::RedisMode::Cluster;
            }
            "server.max_body_bytes" => {
                config.server.max_body_bytes = value.parse().map_err(|_| {
                    ConfigError::invalid(*var, format!("{value:?}"), "not a whole number of bytes")
                })?;
            }
            other => unreachable!("override table names unknown key {other}"),
        }
    }
    Ok(())
}
