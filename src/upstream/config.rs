//! `[llm]`: the OpenAI-compatible upstream's settings (validated with the
//! rest of the file in `config`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default LLM model name sent to an OpenAI-compatible endpoint.
pub const DEFAULT_LLM_MODEL: &str = "gpt-4o-mini";
/// Default embedding model sent to `/v1/embeddings`.
pub const DEFAULT_EMBEDDING_MODEL: &str = "text-embedding-3-small";
/// Default name of the environment variable holding the LLM API key.
pub const DEFAULT_LLM_API_KEY_ENV: &str = "LEVEE_LLM_API_KEY";
/// Default TCP connect timeout for upstream clients.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default `max_tokens` asked of the LLM.
pub const DEFAULT_LLM_MAX_TOKENS: u32 = 512;
/// Default bound on reading a stream on after its client went away.
pub const DEFAULT_STREAM_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Default byte bound on the same.
pub const DEFAULT_STREAM_DRAIN_BYTES: usize = 1 << 20;

/// The LLM upstream.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    /// OpenAI-compatible base URL, e.g. `http://127.0.0.1:9000/v1`. Empty
    /// (the default) selects the built-in extractive answerer.
    pub url: String,
    /// Model name sent with each completion. Default `gpt-4o-mini`.
    pub model: String,
    /// Model name sent to `/embeddings`. Default `text-embedding-3-small`.
    pub embedding_model: String,
    /// Name of the environment variable that holds the API key (the key
    /// itself never lives in the config file). Default `LEVEE_LLM_API_KEY`.
    pub api_key_env: String,
    /// TCP connect timeout. Default 2 s. (Call timeouts, retries and the
    /// breaker are under `[resilience.llm]`.)
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// `max_tokens` asked of the model. Default 512.
    pub max_tokens: u32,
    /// A second OpenAI-compatible base URL, used when the primary fails or
    /// its breaker is open (same model, key and policy). Default: none.
    pub secondary_url: String,
    /// The models of the OpenAI-compatible API (`/v1/chat/completions`,
    /// `/v1/embeddings`, `/v1/models`), each with its deployments. Empty
    /// (the default): `llm.url` (and `llm.secondary_url`) serve every model
    /// name as it is.
    pub models: Vec<ModelConfig>,
    /// After a streaming client disconnects, the upstream is read on for
    /// at most this long so the real usage is still settled; past it the
    /// reservation is charged in full. Default 5 s.
    #[serde(with = "humantime_serde")]
    pub stream_drain_timeout: Duration,
    /// The same bound in bytes. Default 1 MiB.
    pub stream_drain_bytes: usize,
}

/// One model name clients ask for, and where it is served.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The name clients send as `model` and `GET /v1/models` lists.
    pub name: String,
    /// Where it is served; tried by weight, the next one when a
    /// deployment's breaker is open, it is busy or it fails before the
    /// first byte reached the client.
    pub deployments: Vec<DeploymentConfig>,
}

/// One OpenAI-compatible endpoint serving a model, behind its own
/// resilience stack and breaker (`[resilience.llm]`'s policy).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeploymentConfig {
    /// Base URL, e.g. `https://api.openai.com/v1`.
    pub url: String,
    /// The environment variable holding this deployment's API key.
    /// Default: `llm.api_key_env`.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The model name sent upstream. Default: the model's `name`.
    #[serde(default)]
    pub model: Option<String>,
    /// Share of the traffic, relative to the other deployments. Default 1.
    #[serde(default = "default_weight")]
    pub weight: u32,
}

fn default_weight() -> u32 {
    1
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            model: DEFAULT_LLM_MODEL.to_owned(),
            embedding_model: DEFAULT_EMBEDDING_MODEL.to_owned(),
            api_key_env: DEFAULT_LLM_API_KEY_ENV.to_owned(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_tokens: DEFAULT_LLM_MAX_TOKENS,
            secondary_url: String::new(),
            models: Vec::new(),
            stream_drain_timeout: DEFAULT_STREAM_DRAIN_TIMEOUT,
            stream_drain_bytes: DEFAULT_STREAM_DRAIN_BYTES,
        }
    }
}
