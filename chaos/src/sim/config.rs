//! What the simulator serves: the built-in collection's name, the
//! embedding dimension, the model ids `GET /v1/models` lists, and the chat
//! model's capacity.

use thiserror::Error;

/// Name of the built-in Qdrant collection holding the Acme knowledge base.
pub const DEFAULT_COLLECTION: &str = "acme_kb";

/// Dimension of the embeddings and of the built-in collection's vectors.
pub const DEFAULT_DIM: usize = 64;

/// The one model listed by default, and the model name chat echoes when a
/// request names none.
pub const DEFAULT_MODEL: &str = "levee-sim";

/// Most model ids accepted; a listing is a handful, not a catalogue.
const MAX_MODELS: usize = 1_000;

/// Largest embedding dimension accepted; keeps a typo from allocating gigabytes.
const MAX_DIM: usize = 65_536;

/// Largest chat capacity accepted (far above any real model server; a
/// typo must not size a semaphore near `Semaphore::MAX_PERMITS`).
pub(crate) const MAX_CAPACITY: usize = 100_000;

/// Longest base service time accepted, in ms: [`HANG_MAX`](super::HANG_MAX),
/// the longest the simulator holds any request.
pub(crate) const MAX_SERVICE_MS: u64 = 600_000;

/// Largest per-token service time accepted, in ms.
pub(crate) const MAX_PER_TOKEN_MS: u64 = 60_000;

/// Configuration of one simulator instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Name of the built-in collection loaded with the Acme knowledge base.
    pub collection: String,
    /// Dimension of `/v1/embeddings` vectors and of the built-in collection.
    pub dim: usize,
    /// The chat model's capacity; the default is unlimited.
    pub llm: LlmCapacity,
    /// Model ids `GET /v1/models` lists, in this order; default just
    /// [`DEFAULT_MODEL`]. Chat accepts any model name regardless, so this
    /// only shapes what a gateway discovers (e.g. its model routing table).
    pub models: Vec<String>,
}

/// How much the simulated LLM serves at once, and for how long each call
/// keeps it busy: `capacity` concurrent chat completions (streaming or
/// not), each holding its slot for `service_ms` plus `per_token_ms` per
/// completion token it returns; calls beyond `capacity` wait in arrival
/// order. The default (0, no service time) is the unlimited, instant model
/// the simulator always was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LlmCapacity {
    /// Concurrent chat completions in service; 0 = unlimited. Default 0.
    pub capacity: usize,
    /// Base service time of one call, in ms. Default `None`: the chat
    /// fault set's `latency_ms` is the base service time (spent holding
    /// the slot instead of before it), so `{"latency_ms": 100}` alone
    /// already makes every call occupy a slot for 100 ms. When set, the
    /// fault's `latency_ms` is network time spent before queueing.
    pub service_ms: Option<u64>,
    /// Service time per completion token returned, in ms. Default 0.
    pub per_token_ms: u64,
}

/// A [`SimConfig`] value that cannot be served.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `dim` is zero or absurdly large.
    #[error("dim must be between 1 and {MAX_DIM}, got {0}")]
    Dim(usize),
    /// `collection` is empty or contains a `/`.
    #[error("collection must be a non-empty name without '/', got {0:?}")]
    Collection(String),
    /// `llm.capacity` is absurdly large.
    #[error("capacity must be at most {MAX_CAPACITY} (0 = unlimited), got {0}")]
    Capacity(usize),
    /// `llm.service_ms` is longer than the simulator holds any request.
    #[error("service_ms must be at most {MAX_SERVICE_MS}, got {0}")]
    ServiceMs(u64),
    /// `llm.per_token_ms` is absurdly large.
    #[error("per_token_ms must be at most {MAX_PER_TOKEN_MS}, got {0}")]
    PerTokenMs(u64),
    /// `models` is empty or absurdly long, or an id is empty, contains
    /// whitespace or a comma, or repeats.
    #[error(
        "models must be 1 to {MAX_MODELS} distinct non-empty ids without whitespace or ',', {0}"
    )]
    Models(String),
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            collection: DEFAULT_COLLECTION.to_owned(),
            dim: DEFAULT_DIM,
            llm: LlmCapacity::default(),
            models: vec![DEFAULT_MODEL.to_owned()],
        }
    }
}

impl SimConfig {
    /// Checks the configuration, naming the bad key and value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.dim == 0 || self.dim > MAX_DIM {
            return Err(ConfigError::Dim(self.dim));
        }
        if self.collection.is_empty() || self.collection.contains('/') {
            return Err(ConfigError::Collection(self.collection.clone()));
        }
        validate_models(&self.models)?;
        self.llm.validate()
    }
}

/// A listing a client can use as is: ids are what a request's `model`
/// field carries, so a blank, spaced or repeated id is a typo, not a model;
/// a comma can only come from a list that was never split.
fn validate_models(models: &[String]) -> Result<(), ConfigError> {
    if models.is_empty() || models.len() > MAX_MODELS {
        return Err(ConfigError::Models(format!("got {} ids", models.len())));
    }
    for (i, id) in models.iter().enumerate() {
        if id.is_empty() || id.contains(|c: char| c.is_whitespace() || c == ',') {
            return Err(ConfigError::Models(format!("got {id:?}")));
        }
        if models[..i].contains(id) {
            return Err(ConfigError::Models(format!("got {id:?} twice")));
        }
    }
    Ok(())
}

impl LlmCapacity {
    /// Checks the three values against their bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity > MAX_CAPACITY {
            return Err(ConfigError::Capacity(self.capacity));
        }
        if let Some(ms) = self.service_ms.filter(|&ms| ms > MAX_SERVICE_MS) {
            return Err(ConfigError::ServiceMs(ms));
        }
        if self.per_token_ms > MAX_PER_TOKEN_MS {
            return Err(ConfigError::PerTokenMs(self.per_token_ms));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert_eq!(SimConfig::default().validate(), Ok(()));
    }

    #[test]
    fn zero_dim_is_rejected() {
        let config = SimConfig {
            dim: 0,
            ..SimConfig::default()
        };
        assert_eq!(config.validate(), Err(ConfigError::Dim(0)));
    }

    #[test]
    fn capacity_above_the_bound_is_rejected_and_named() {
        let config = SimConfig {
            llm: LlmCapacity {
                capacity: MAX_CAPACITY + 1,
                ..LlmCapacity::default()
            },
            ..SimConfig::default()
        };
        let err = config.validate().expect_err("too large");
        assert_eq!(err, ConfigError::Capacity(100_001));
        assert!(err.to_string().starts_with("capacity must be"), "{err}");
    }

    #[test]
    fn blank_spaced_or_repeated_model_ids_are_rejected() {
        let with = |models: &[&str]| SimConfig {
            models: models.iter().map(|&m| m.to_owned()).collect(),
            ..SimConfig::default()
        };
        assert_eq!(with(&["gpt-4o", "gpt-4o-mini"]).validate(), Ok(()));
        // What `--models a,,b`, `--models "a, b"` or a repeat would give.
        for bad in [
            &[][..],
            &["a", "", "b"],
            &["a", " b"],
            &["a", "b", "a"],
            &["a,b"],
        ] {
            let err = with(bad).validate().expect_err("invalid models");
            assert!(
                err.to_string().starts_with("models must be"),
                "{bad:?}: {err}"
            );
        }
        assert_eq!(
            with(&[]).validate(),
            Err(ConfigError::Models("got 0 ids".to_owned()))
        );
    }
}
