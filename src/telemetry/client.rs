//! CLIENT spans for upstream calls (LLM, vector store, Redis), named and
//! attributed per the OpenTelemetry semantic conventions (how a call ended
//! is recorded by `upstream::trace`). No attribute ever holds a secret:
//! URLs are reduced to host and port, never the API key or userinfo.

use tracing::field::Empty;
use tracing::Span;

/// Host and port of an upstream, for `server.address` / `server.port`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerAddr {
    /// Host name or IP.
    pub host: String,
    /// Port (the scheme's default when the URL names none).
    pub port: u16,
}

impl ServerAddr {
    /// Parses a base URL; unknown parts stay empty / 0.
    pub fn from_url(url: &str) -> Self {
        match reqwest::Url::parse(url) {
            Ok(u) => Self {
                host: u.host_str().unwrap_or_default().to_owned(),
                port: u.port_or_known_default().unwrap_or(0),
            },
            Err(_) => Self::default(),
        }
    }
}

/// A span attribute as an integer. `tracing-opentelemetry` exports
/// unsigned values as strings, and semantic conventions want integers
/// (`http.response.status_code`, token counts).
pub fn int<T: TryInto<i64>>(value: T) -> i64 {
    value.try_into().unwrap_or(i64::MAX)
}

/// A CLIENT span for an OpenAI-compatible call (`chat` or `embeddings`).
pub fn llm_span(operation: &'static str, model: &str, server: &ServerAddr) -> Span {
    tracing::info_span!(
        target: "levee::upstream",
        "llm",
        otel.name = %format!("{operation} {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.system = "openai",
        gen_ai.operation.name = operation,
        gen_ai.request.model = %model,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        server.address = %server.host,
        server.port = int(server.port),
        http.request.method = "POST",
        http.response.status_code = Empty,
        error.type = Empty,
        levee.dependency = "llm",
    )
}

/// A CLIENT span for a vector search in `collection`.
pub fn vector_span(collection: &str, server: &ServerAddr) -> Span {
    tracing::info_span!(
        target: "levee::upstream",
        "vector_store",
        otel.name = %format!("search {collection}"),
        otel.kind = "client",
        otel.status_code = Empty,
        db.system.name = "qdrant",
        db.operation.name = "search",
        db.collection.name = %collection,
        server.address = %server.host,
        server.port = int(server.port),
        http.request.method = "POST",
        http.response.status_code = Empty,
        error.type = Empty,
        levee.dependency = "vector_store",
        levee.vector.results = Empty,
    )
}

/// A CLIENT span for a Redis command (`operation` such as `LRANGE`).
pub fn redis_span(operation: &'static str) -> Span {
    tracing::info_span!(
        target: "levee::upstream",
        "redis",
        otel.name = operation,
        otel.kind = "client",
        otel.status_code = Empty,
        db.system.name = "redis",
        db.operation.name = operation,
        error.type = Empty,
        levee.dependency = "redis",
    )
}
