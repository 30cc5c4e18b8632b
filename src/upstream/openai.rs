//! An OpenAI-compatible HTTP client: `/chat/completions` for answers and
//! `/embeddings` for query vectors. It reads token usage from responses.

use std::fmt::Write as _;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::time::Instant;
use tracing::Instrument;

use super::config::LlmConfig;
use super::metrics::UpstreamMetrics;
use super::{
    Answer, Completion, Dependency, Embedder, Llm, Role, UpstreamError, UpstreamErrorKind, Usage,
};
use crate::telemetry::client::{self, ServerAddr};
use crate::telemetry::propagation;

const SYSTEM_PROMPT: &str = "You are Acme Corp's internal assistant. Answer the user's question \
using only the context passages below and the conversation so far. If the context does not \
contain the answer, say that you don't know.";

/// Whole-call cap of the HTTP client itself; real bounds come from the
/// dependency's resilience policy.
const CLIENT_BACKSTOP_TIMEOUT: Duration = Duration::from_secs(300);

/// Client for one OpenAI-compatible base URL (e.g. `http://host/v1`).
#[derive(Clone)]
pub struct OpenAiClient {
    http: reqwest::Client,
    base: String,
    model: String,
    embedding_model: String,
    max_tokens: u32,
    api_key: Option<String>,
    /// Host and port for span attributes (never the key or userinfo).
    server: ServerAddr,
    metrics: Option<UpstreamMetrics>,
}

impl std::fmt::Debug for OpenAiClient {
    // Hand-written so the API key can never be printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiClient")
            .field("base", &self.base)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Deserialize)]
struct ChatResponse {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: ChoiceMessage,
}

#[derive(Deserialize)]
struct ChoiceMessage {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Deserialize)]
struct EmbeddingResponse {
    data: Vec<EmbeddingData>,
}

#[derive(Deserialize)]
struct EmbeddingData {
    embedding: Vec<f32>,
}

impl OpenAiClient {
    /// Builds a client for `base_url`; the API key is read from the variable
    /// named by `config.api_key_env` through `vars`.
    pub fn new(
        base_url: &str,
        config: &LlmConfig,
        vars: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            // A backstop only: the resilience stack's attempt timeout and
            // deadline bound each call (see `with_timeout`).
            .timeout(CLIENT_BACKSTOP_TIMEOUT)
            .build()?;
        Ok(Self {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            model: config.model.clone(),
            embedding_model: config.embedding_model.clone(),
            max_tokens: config.max_tokens,
            api_key: vars(&config.api_key_env).filter(|k| !k.is_empty()),
            server: ServerAddr::from_url(base_url),
            metrics: None,
        })
    }

    /// Records each call's latency into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: UpstreamMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Overrides the whole-call timeout (the vector store's embedding calls
    /// use the vector store's shorter budget).
    pub fn with_timeout(
        mut self,
        timeout: Duration,
        connect: Duration,
    ) -> Result<Self, reqwest::Error> {
        self.http = reqwest::Client::builder()
            .connect_timeout(connect)
            .timeout(timeout)
            .build()?;
        Ok(self)
    }

    /// One call inside its CLIENT `span`: timed, traced, and carrying the
    /// trace context to the upstream.
    async fn post<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        body: &serde_json::Value,
        span: &tracing::Span,
    ) -> Result<T, UpstreamError> {
        let start = Instant::now();
        let result = self.send(path, body).instrument(span.clone()).await;
        span.in_scope(|| {
            super::trace::finish(
                self.metrics.as_ref(),
                Dependency::Llm,
                start.elapsed(),
                &result,
            );
        });
        result
    }

    async fn send<T: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<T, UpstreamError> {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(body);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let mut trace_headers = reqwest::header::HeaderMap::new();
        propagation::inject_current(&mut trace_headers);
        let resp = req
            .headers(trace_headers)
            .send()
            .await
            .map_err(|e| UpstreamError::from_reqwest(Dependency::Llm, &e))?;
        let status = resp.status();
        tracing::Span::current().record("http.response.status_code", client::int(status.as_u16()));
        if !status.is_success() {
            return Err(UpstreamError::new(
                Dependency::Llm,
                UpstreamErrorKind::Status {
                    status: status.as_u16(),
                    retry_after: retry_after(resp.headers()),
                },
            ));
        }
        resp.json::<T>()
            .await
            .map_err(|e| UpstreamError::from_reqwest(Dependency::Llm, &e))
    }
}

/// Reads a `Retry-After` given in seconds.
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

fn context_block(request: &Completion<'_>) -> String {
    let mut system = SYSTEM_PROMPT.to_owned();
    if !request.passages.is_empty() {
        system.push_str("\n\nContext:");
        for (i, p) in request.passages.iter().enumerate() {
            let _ = write!(system, "\n[{}] {}: {}", i + 1, p.title, p.text);
        }
    }
    system
}

#[async_trait]
impl Llm for OpenAiClient {
    fn kind(&self) -> &'static str {
        "openai"
    }

    async fn complete(&self, request: Completion<'_>) -> Result<Answer, UpstreamError> {
        let system = context_block(&request);
        let mut messages = vec![ChatMessage {
            role: "system",
            content: &system,
        }];
        messages.extend(request.history.iter().map(|t| ChatMessage {
            role: match t.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            },
            content: &t.content,
        }));
        messages.push(ChatMessage {
            role: "user",
            content: request.question,
        });
        let body = json!({
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "stream": false,
        });
        let span = client::llm_span("chat", &self.model, &self.server);
        let resp: ChatResponse = self.post("/chat/completions", &body, &span).await?;
        let text = resp
            .choices
            .into_iter()
            .next()
            .and_then(|c| c.message.content)
            .ok_or_else(|| {
                UpstreamError::new(
                    Dependency::Llm,
                    UpstreamErrorKind::Protocol("no choices[0].message.content".to_owned()),
                )
            })?;
        let usage = resp
            .usage
            .map(|u| Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            })
            .unwrap_or_default();
        span.record(
            "gen_ai.usage.input_tokens",
            client::int(usage.prompt_tokens),
        );
        span.record(
            "gen_ai.usage.output_tokens",
            client::int(usage.completion_tokens),
        );
        Ok(Answer { text, usage })
    }
}

#[async_trait]
impl Embedder for OpenAiClient {
    async fn embed(&self, text: &str) -> Result<Vec<f32>, UpstreamError> {
        let body = json!({ "model": self.embedding_model, "input": text });
        let span = client::llm_span("embeddings", &self.embedding_model, &self.server);
        let resp: EmbeddingResponse = self.post("/embeddings", &body, &span).await?;
        resp.data
            .into_iter()
            .next()
            .map(|d| d.embedding)
            .ok_or_else(|| {
                UpstreamError::new(
                    Dependency::Llm,
                    UpstreamErrorKind::Protocol("no data[0].embedding".to_owned()),
                )
            })
    }
}
