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
        }
    }
}
