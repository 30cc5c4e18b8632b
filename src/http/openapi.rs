//! The OpenAPI 3.1 document of every route, served at `GET /openapi.json`
//! (no API key, never rate limited). It is generated with utoipa from the
//! wire types: the error bodies are the types [`super::error`] serialises;
//! the RAG and job bodies are described by the schema types below, whose
//! tests check them against the types the handlers really parse and
//! serialise, and schemathesis (`tests/schemathesis.rs`) checks every
//! documented status, content type and body against a running gateway.
//!
//! The operations are documentation-only functions in [`paths`]: the
//! handlers live in other files, and the document stays in one place.
//! Headers that travel with many answers (the rate-limit fields, and
//! `Retry-After` on 429 / 503) are added by [`SharedHeaders`].

use std::sync::OnceLock;

use axum::body::Bytes;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ObjectBuilder, RefOr, Type};
use utoipa::{Modify, OpenApi};

use super::ApiError;
pub(super) use schemas::*;

/// Levee's error body, as [`super::error`] serialises it.
type LeveeErrorBody = super::error::Body<'static>;
/// OpenAI's error body, as [`super::error`] serialises it.
type OpenAiErrorBody = super::error::OpenAiBody<'static>;

/// The document: paths, schemas, security schemes and shared headers.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Levee",
        description = "A resilience gateway for RAG / LLM backends: identity, rate limits, \
            tenant fair queues, circuit breakers and durable jobs in front of a RAG pipeline \
            and OpenAI-compatible deployments. Errors on `/v1/chat`, `/v1/jobs` and the probes \
            use Levee's shape (`LeveeError`); the OpenAI-compatible routes answer in OpenAI's \
            (`OpenAiError`), so the SDKs read them."
    ),
    paths(
        paths::chat,
        paths::chat_completions,
        paths::embeddings,
        paths::models,
        paths::submit_job,
        paths::show_job,
        paths::health,
        paths::ready,
        paths::metrics,
        paths::openapi_json,
        paths::list_breakers,
        paths::act_on_breaker,
        paths::reload,
        paths::show_config,
    ),
    components(schemas(
        ChatRequest,
        ChatResponse,
        ChatMetadata,
        Source,
        TokenUsage,
        Route,
        JobAccepted,
        JobView,
        JobStatus,
        ChatCompletionRequest,
        ChatMessage,
        StreamOptions,
        ChatCompletion,
        CompletionChunkEvent,
        EmbeddingsRequest,
        Embeddings,
        ModelList,
        Model,
        Health,
        Ready,
        Breakers,
        BreakerState,
        Reloaded,
        LeveeErrorBody,
        OpenAiErrorBody,
    )),
    modifiers(&Security, &SharedHeaders),
    tags(
        (name = "rag", description = "The RAG pipeline Levee protects"),
        (name = "jobs", description = "Durable per-tenant job queues"),
        (name = "openai", description = "OpenAI-compatible API to the configured deployments"),
        (name = "operations", description = "Probes, metrics and this document (no API key, never limited)"),
        (name = "admin", description = "Admin API, behind its own bearer token (404 when none is configured)"),
    )
)]
pub(super) struct ApiDoc;

/// `GET /openapi.json`: the document, rendered once.
pub(super) async fn serve() -> Response {
    static DOC: OnceLock<Option<Bytes>> = OnceLock::new();
    let doc = DOC.get_or_init(|| serde_json::to_vec(&ApiDoc::openapi()).ok().map(Bytes::from));
    match doc {
        Some(bytes) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            bytes.clone(),
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "the OpenAPI document could not be rendered",
        )
        .into_response(),
    }
}

/// The security schemes: an API key in `X-API-Key` or as a bearer token
/// (the same keys), and the admin API's own bearer token.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-API-Key",
                "A registered API key; its tenant and tier decide the limits.",
            ))),
        );
        let mut bearer = Http::new(HttpAuthScheme::Bearer);
        bearer.description = Some("The same API key, as `Authorization: Bearer <key>`.".into());
        components.add_security_scheme("api_key_bearer", SecurityScheme::Http(bearer));
        let mut admin = Http::new(HttpAuthScheme::Bearer);
        admin.description = Some("The admin token (`admin.token_env`); not an API key.".into());
        components.add_security_scheme("admin_token", SecurityScheme::Http(admin));
    }
}

/// Paths whose answers carry the rate-limit headers (the limited routes).
const LIMITED: &[&str] = &[
    "/v1/chat",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/models",
    "/v1/jobs",
];

/// Adds the headers that travel with many answers: `Retry-After` on every
/// 429 and 503, and the rate-limit fields on every answer of a limited
/// route (present whenever a limit applied).
struct SharedHeaders;

impl Modify for SharedHeaders {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let integer = || {
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0))
        };
        let string = || ObjectBuilder::new().schema_type(Type::String);
        let limit_headers = [
            (
                "X-RateLimit-Limit",
                true,
                "Requests allowed in the most constraining window.",
            ),
            (
                "X-RateLimit-Remaining",
                true,
                "Requests left in that window.",
            ),
            (
                "X-RateLimit-Reset",
                true,
                "Seconds until that window has room again.",
            ),
            ("X-RateLimit-Tier", false, "The tier whose limits applied."),
            (
                "RateLimit-Policy",
                false,
                "IETF RateLimit-Policy field: every limit that applied.",
            ),
            (
                "RateLimit",
                false,
                "IETF RateLimit field: the most constraining limit's state.",
            ),
        ];
        for (path, item) in openapi.paths.paths.iter_mut() {
            let limited = LIMITED.contains(&path.as_str());
            let operations = [
                item.get.as_mut(),
                item.post.as_mut(),
                item.put.as_mut(),
                item.delete.as_mut(),
            ];
            for op in operations.into_iter().flatten() {
                for (status, response) in op.responses.responses.iter_mut() {
                    let RefOr::T(response) = response else {
                        continue;
                    };
                    if status == "429" || status == "503" {
                        response.headers.insert(
                            "Retry-After".into(),
                            HeaderBuilder::new()
                                .schema(integer())
                                .description(Some("Seconds to wait before trying again."))
                                .build(),
                        );
                    }
                    if limited {
                        for (name, numeric, about) in limit_headers {
                            let schema = if numeric { integer() } else { string() };
                            response.headers.insert(
                                name.into(),
                                HeaderBuilder::new()
                                    .schema(schema)
                                    .description(Some(about))
                                    .build(),
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The schemas of the bodies: read by utoipa's derive (and, in the tests,
/// checked against the real types), never constructed.
#[allow(dead_code)]
mod schemas {
    use serde::{Deserialize, Serialize};
    use utoipa::ToSchema;

    /// Fields some Levee errors add: `layer`, `scope` and `tier` on a rate
    /// limit's 429, `dependency` on a dependency's 429 / 503.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct ErrorDetails {
        /// The limit layer that refused (`network`, `key`, `tenant`, `route`,
        /// `tokens`).
        #[schema(required = false)]
        layer: Option<String>,
        /// What the limit counts per (`ip`, `key`, `tenant` …).
        #[schema(required = false)]
        scope: Option<String>,
        /// The tier whose limit refused.
        #[schema(required = false)]
        tier: Option<String>,
        /// The dependency that is saturated or unavailable.
        #[schema(required = false)]
        dependency: Option<String>,
    }

    /// `POST /v1/chat` body: the wire form of [`crate::rag::ChatRequest`].
    #[derive(Debug, Serialize, ToSchema)]
    #[schema(example = json!({"message": "How many PTO days do I get?", "user_id": "u-1", "thread_id": "t-1"}))]
    #[serde(deny_unknown_fields)]
    pub(in crate::http) struct ChatRequest {
        /// The user's message: not blank (some character that is not Unicode
        /// white space), at most `server.max_message_bytes` bytes of UTF-8
        /// (default 8192).
        #[schema(
            min_length = 1,
            max_length = 8192,
            pattern = r"[^\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
        )]
        message: String,
        /// The user's id.
        #[schema(pattern = "^[A-Za-z0-9_.:@-]{1,128}$")]
        user_id: String,
        /// The conversation's id; memory is kept per thread.
        #[schema(pattern = "^[A-Za-z0-9_.:@-]{1,128}$")]
        thread_id: String,
        /// Optional tenant; a keyed caller's tenant is always the key's.
        #[serde(skip_serializing_if = "Option::is_none")]
        #[schema(pattern = "^[A-Za-z0-9_.:@-]{1,128}$")]
        tenant_id: Option<String>,
    }

    /// `POST /v1/chat` answer: the wire form of [`crate::rag::ChatResponse`].
    #[derive(Debug, Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub(in crate::http) struct ChatResponse {
        /// The answer.
        response: String,
        /// Echo of the request's thread.
        thread_id: String,
        /// How the answer was made.
        metadata: ChatMetadata,
    }

    /// How an answer was made.
    #[derive(Debug, Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub(in crate::http) struct ChatMetadata {
        /// Stages that ran, in order: `router`, `retriever`, `synthesizer`.
        agents_used: Vec<String>,
        /// Echo of the request's user.
        user_id: String,
        /// Passages the answer drew on.
        sources: Vec<Source>,
        /// True when part of the pipeline was skipped because a dependency was
        /// unavailable.
        degraded: bool,
        /// Route the router chose.
        route: Route,
        /// Earlier messages of the thread that the synthesizer saw.
        #[schema(minimum = 0)]
        history_turns: u64,
        /// Token usage of the synthesizer.
        usage: TokenUsage,
    }

    /// One cited passage.
    #[derive(Debug, Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub(in crate::http) struct Source {
        /// Document id.
        id: String,
        /// Document title.
        title: String,
        /// Where it lives.
        source: String,
        /// Relevance score.
        score: f64,
    }

    /// Token usage of an answer.
    #[derive(Debug, Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub(in crate::http) struct TokenUsage {
        /// Prompt tokens.
        #[schema(minimum = 0)]
        prompt_tokens: u64,
        /// Completion tokens.
        #[schema(minimum = 0)]
        completion_tokens: u64,
    }

    /// Where a question went after the router stage.
    #[derive(Debug, Deserialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub(in crate::http) enum Route {
        /// Retrieved passages, then synthesized an answer from them.
        Retrieve,
        /// Answered directly, without retrieval.
        Direct,
    }

    /// 202: the job is stored (the store acknowledged it) and will run at the
    /// tenant's rate. `Location` names it.
    #[derive(Debug, Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub(in crate::http) struct JobAccepted {
        /// Its id, for `GET /v1/jobs/{id}`.
        pub(in crate::http) job_id: String,
        /// Its state now (an idempotent resubmission may find it further on).
        status: JobStatus,
    }

    /// A job: the wire form of [`crate::jobs::JobView`].
    #[derive(Debug, Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub(in crate::http) struct JobView {
        /// Its id.
        job_id: String,
        /// Its state.
        status: JobStatus,
        /// The answer (a `ChatResponse`), once succeeded.
        #[serde(default)]
        #[schema(required = false)]
        result: Option<serde_json::Value>,
        /// Why it failed (the last error for `dead`).
        #[serde(default)]
        #[schema(required = false)]
        error: Option<String>,
        /// Deliveries so far.
        #[schema(minimum = 0)]
        attempts: u32,
        /// When it was accepted (RFC 3339).
        enqueued_at: String,
        /// When a worker last took it (RFC 3339).
        #[serde(default)]
        #[schema(required = false)]
        started_at: Option<String>,
        /// When it finished (RFC 3339).
        #[serde(default)]
        #[schema(required = false)]
        finished_at: Option<String>,
    }

    /// A job's state.
    #[derive(Debug, Deserialize, ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub(in crate::http) enum JobStatus {
        /// Waiting for its tenant's turn.
        Queued,
        /// Taken by a worker.
        Running,
        /// Done; `result` holds the answer.
        Succeeded,
        /// Failed for good; `error` says why.
        Failed,
        /// Failed on every delivery; `error` is the last error.
        Dead,
    }

    /// `POST /v1/chat/completions` body: what the gateway reads and checks.
    /// Every other OpenAI parameter passes through to the deployment as sent.
    #[derive(Debug, ToSchema)]
    #[schema(example = json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "How many PTO days do I get?"}],
        "stream": true,
        "stream_options": {"include_usage": true}
    }))]
    pub(in crate::http) struct ChatCompletionRequest {
        /// A configured model name (`GET /v1/models`); 404 `model_not_found`
        /// otherwise.
        #[schema(min_length = 1, example = "gpt-4o-mini")]
        model: String,
        /// The conversation; at least one message, each with a string `role`.
        #[schema(min_items = 1)]
        messages: Vec<ChatMessage>,
        /// Answer as a `text/event-stream` of chunks.
        #[schema(required = false)]
        stream: Option<bool>,
        /// Stream options; the gateway always asks the deployment for the usage
        /// chunk (to settle token budgets) and hides it unless asked for.
        #[schema(required = false)]
        stream_options: Option<StreamOptions>,
        /// Completion allowance; bounds the token-budget reservation.
        #[schema(required = false, minimum = 0, format = "uint64")]
        max_tokens: Option<u64>,
        /// Newer name of `max_tokens`; takes precedence.
        #[schema(required = false, minimum = 0, format = "uint64")]
        max_completion_tokens: Option<u64>,
        /// Choices to generate; the reservation covers each.
        #[schema(required = false, minimum = 0, format = "uint64")]
        n: Option<u64>,
    }

    /// One chat message; passes through as sent.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct ChatMessage {
        /// `system`, `user`, `assistant`, `tool` …
        role: String,
        /// A string, or an array of content parts.
        #[schema(required = false, value_type = Value)]
        content: Option<serde_json::Value>,
    }

    /// `stream_options`.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct StreamOptions {
        /// End the stream with a chunk carrying the usage.
        #[schema(required = false)]
        include_usage: Option<bool>,
    }

    /// A chat completion, as the deployment answered it (passed through).
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct ChatCompletion {
        /// Completion id.
        id: String,
        /// `chat.completion`.
        object: String,
        /// Unix time.
        created: u64,
        /// The model that answered.
        model: String,
        /// The choices.
        #[schema(value_type = Vec<Object>)]
        choices: Vec<serde_json::Value>,
        /// Token usage, when the deployment reports it.
        #[schema(required = false, value_type = Object)]
        usage: Option<serde_json::Value>,
    }

    /// One server-sent event of a streamed completion.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct CompletionChunkEvent {
        /// A `chat.completion.chunk` as JSON, or `[DONE]` at the end.
        data: String,
        /// The event type, when the deployment names one.
        #[schema(required = false)]
        event: Option<String>,
        /// The event id, when the deployment sets one.
        #[schema(required = false)]
        id: Option<String>,
    }

    /// `POST /v1/embeddings` body: what the gateway reads and checks. Every
    /// other OpenAI parameter passes through as sent.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct EmbeddingsRequest {
        /// A configured model name.
        #[schema(min_length = 1)]
        model: String,
        /// A string, or a non-empty array (of strings or token arrays).
        #[schema(value_type = Value)]
        input: serde_json::Value,
    }

    /// Embeddings, as the deployment answered them (passed through).
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct Embeddings {
        /// `list`.
        object: String,
        /// One embedding per input.
        #[schema(value_type = Vec<Object>)]
        data: Vec<serde_json::Value>,
        /// The model that answered.
        model: String,
    }

    /// `GET /v1/models`.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct ModelList {
        /// `list`.
        object: String,
        /// The models.
        data: Vec<Model>,
    }

    /// One model.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct Model {
        /// Its name, as clients send it.
        id: String,
        /// `model`.
        object: String,
        /// Unix time.
        created: u64,
        /// Owner.
        owned_by: String,
    }

    /// `GET /health`: the process is up.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct Health {
        /// `ok`.
        status: String,
    }

    /// `GET /ready`: each dependency's last-known state; 503 only while
    /// draining for shutdown.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct Ready {
        /// `ready`, or `draining` (with 503).
        status: String,
        /// Per dependency: `kind`, `state` (`embedded`, `unknown`, `up`,
        /// `down`) and, behind a breaker, its `breaker` snapshot.
        #[schema(value_type = Object)]
        dependencies: serde_json::Value,
        /// The job store's `kind` and whether an accepted job survives a
        /// restart (`durable`); `null` with jobs disabled.
        #[schema(value_type = Option<Object>)]
        jobs: Option<serde_json::Value>,
    }

    /// `GET /admin/breakers`.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct Breakers {
        /// Every breaker's snapshot.
        #[schema(value_type = Vec<Object>)]
        breakers: Vec<serde_json::Value>,
    }

    /// `POST /admin/reload`: what the reload changed.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct Reloaded {
        /// `reloaded`.
        status: String,
        /// What changed (keys, limits …).
        #[schema(value_type = Object)]
        reload: serde_json::Value,
    }

    /// `POST /admin/breakers/{dependency}/{action}`: the breaker after it.
    #[derive(Debug, ToSchema)]
    pub(in crate::http) struct BreakerState {
        /// Its snapshot (`dependency`, `state`, `in_state_ms`, `counts` …).
        #[schema(value_type = Object)]
        breaker: serde_json::Value,
    }
}

/// The operations, as documentation-only functions (the handlers are
/// elsewhere; utoipa needs an item to hang each operation on).
#[allow(dead_code)]
mod paths {
    use super::*;

    /// Ask the RAG pipeline, or queue the question as a job.
    ///
    /// Answered now (200), or, with `Prefer: respond-async` (RFC 7240) and
    /// an API key, stored as a job (202, like `POST /v1/jobs`). Keyless
    /// callers are served under their network tier unless
    /// `identity.require_api_key`.
    #[utoipa::path(
        post, path = "/v1/chat", tag = "rag", operation_id = "chat",
        params(
            ("Prefer" = Option<String>, Header, description = "`respond-async` to queue the question as a job (needs an API key)"),
            ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 256, description = "Read only with `respond-async`: a resubmission with the same key returns the same job"),
            ("Callback-Url" = Option<String>, Header, format = "uri", pattern = "^https?://", description = "Read only with `respond-async`: an absolute http(s) URL the result is POSTed to"),
        ),
        request_body(content = ChatRequest, content_type = "application/json"),
        responses(
            (status = 200, description = "The answer", body = ChatResponse),
            (status = 202, description = "Queued as a job (`Prefer: respond-async`); `Location` names it", body = JobAccepted,
                headers(("Location" = String, description = "`/v1/jobs/{id}`"),
                        ("Preference-Applied" = String, description = "`respond-async`"))),
            (status = 400, description = "The body is not JSON (`malformed_json`), or the client could not be identified", body = LeveeErrorBody),
            (status = 401, description = "Unknown or malformed API key, or a job without one", body = LeveeErrorBody),
            (status = 404, description = "`respond-async` while jobs are disabled", body = LeveeErrorBody),
            (status = 413, description = "Body over `server.max_body_bytes`", body = LeveeErrorBody),
            (status = 408, description = "Body not received within `server.body_read_timeout`", body = LeveeErrorBody),
            (status = 415, description = "`Content-Type` is not JSON", body = LeveeErrorBody),
            (status = 422, description = "A field is missing or invalid; `field` names it", body = LeveeErrorBody),
            (status = 429, description = "A rate limit, token budget, tenant queue or job queue is full", body = LeveeErrorBody),
            (status = 431, description = "Request header section too large (answered by the HTTP server)"),
            (status = 500, description = "Internal error", body = LeveeErrorBody),
            (status = 502, description = "A dependency failed", body = LeveeErrorBody),
            (status = 503, description = "A breaker is open, a dependency is saturated, or a store is down", body = LeveeErrorBody),
            (status = 504, description = "A dependency timed out", body = LeveeErrorBody),
        ),
        security((), ("api_key" = []), ("api_key_bearer" = [])),
    )]
    fn chat() {}

    /// An OpenAI chat completion, whole or streamed.
    ///
    /// Forwarded to the model's deployments (fallback by breaker state)
    /// after the tenant's token budget is reserved; settled with the
    /// deployment's usage. A deployment's own 4xx answer passes through.
    #[utoipa::path(
        post, path = "/v1/chat/completions", tag = "openai", operation_id = "chat_completions",
        request_body(content = ChatCompletionRequest, content_type = "application/json"),
        responses(
            (status = 200, description = "The completion (JSON), or with `stream: true` a stream of `chat.completion.chunk` events ending in `data: [DONE]`",
                content((ChatCompletion = "application/json"), (CompletionChunkEvent = "text/event-stream")),
                headers(("X-Levee-Deployment" = String, description = "The configured deployment that answered"))),
            (status = 400, description = "Invalid body (`param` names the field), or a deployment's own 400", body = OpenAiErrorBody),
            (status = 401, description = "Unknown or malformed API key (`invalid_api_key`)", body = OpenAiErrorBody),
            (status = 404, description = "No such model (`model_not_found`)", body = OpenAiErrorBody),
            (status = 413, description = "Body over `server.max_body_bytes`", body = OpenAiErrorBody),
            (status = 408, description = "Body not received within `server.body_read_timeout`", body = OpenAiErrorBody),
            (status = 415, description = "`Content-Type` is not JSON", body = OpenAiErrorBody),
            (status = 422, description = "A deployment's own 422, passed through", body = OpenAiErrorBody),
            (status = 429, description = "A rate limit or token budget (`rate_limit_exceeded`), or the tenant queue", body = OpenAiErrorBody),
            (status = 431, description = "Request header section too large (answered by the HTTP server)"),
            (status = 500, description = "Internal error", body = OpenAiErrorBody),
            (status = 502, description = "Every deployment failed", body = OpenAiErrorBody),
            (status = 503, description = "Every deployment's breaker is open, or they are saturated", body = OpenAiErrorBody),
            (status = 504, description = "The deployments did not answer in time", body = OpenAiErrorBody),
        ),
        security((), ("api_key" = []), ("api_key_bearer" = [])),
    )]
    fn chat_completions() {}

    /// OpenAI embeddings.
    #[utoipa::path(
        post, path = "/v1/embeddings", tag = "openai", operation_id = "embeddings",
        request_body(content = EmbeddingsRequest, content_type = "application/json"),
        responses(
            (status = 200, description = "The embeddings", body = Embeddings,
                headers(("X-Levee-Deployment" = String, description = "The configured deployment that answered"))),
            (status = 400, description = "Invalid body, or a deployment's own 400", body = OpenAiErrorBody),
            (status = 401, description = "Unknown or malformed API key", body = OpenAiErrorBody),
            (status = 404, description = "No such model", body = OpenAiErrorBody),
            (status = 413, description = "Body over `server.max_body_bytes`", body = OpenAiErrorBody),
            (status = 408, description = "Body not received within `server.body_read_timeout`", body = OpenAiErrorBody),
            (status = 415, description = "`Content-Type` is not JSON", body = OpenAiErrorBody),
            (status = 422, description = "A deployment's own 422, passed through", body = OpenAiErrorBody),
            (status = 429, description = "A rate limit, token budget or tenant queue", body = OpenAiErrorBody),
            (status = 431, description = "Request header section too large (answered by the HTTP server)"),
            (status = 500, description = "Internal error", body = OpenAiErrorBody),
            (status = 502, description = "Every deployment failed", body = OpenAiErrorBody),
            (status = 503, description = "Every deployment's breaker is open, or they are saturated", body = OpenAiErrorBody),
            (status = 504, description = "The deployments did not answer in time", body = OpenAiErrorBody),
        ),
        security((), ("api_key" = []), ("api_key_bearer" = [])),
    )]
    fn embeddings() {}

    /// The models clients can name.
    #[utoipa::path(
        get, path = "/v1/models", tag = "openai", operation_id = "models",
        responses(
            (status = 200, description = "The configured model names (or, with `llm.url` alone, the deployment's list)", body = ModelList),
            (status = 401, description = "Unknown or malformed API key", body = OpenAiErrorBody),
            (status = 429, description = "A rate limit", body = OpenAiErrorBody),
            (status = 431, description = "Request header section too large (answered by the HTTP server)"),
            (status = 500, description = "Internal error", body = OpenAiErrorBody),
            (status = 502, description = "The deployment failed", body = OpenAiErrorBody),
            (status = 503, description = "The deployment's breaker is open", body = OpenAiErrorBody),
            (status = 504, description = "The deployment did not answer in time", body = OpenAiErrorBody),
        ),
        security((), ("api_key" = []), ("api_key_bearer" = [])),
    )]
    fn models() {}

    /// Queue a chat as a durable job.
    ///
    /// Checked exactly as `POST /v1/chat` (a bad body is never queued),
    /// then stored; 202 only after the store acknowledged it. Needs an API
    /// key: the job belongs to the key's tenant.
    #[utoipa::path(
        post, path = "/v1/jobs", tag = "jobs", operation_id = "submit_job",
        params(
            ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 256, description = "A resubmission with the same key returns the same job"),
            ("Callback-Url" = Option<String>, Header, format = "uri", pattern = "^https?://", description = "An absolute http(s) URL the result is POSTed to"),
        ),
        request_body(content = ChatRequest, content_type = "application/json"),
        responses(
            (status = 202, description = "Stored; `Location` names it", body = JobAccepted,
                headers(("Location" = String, description = "`/v1/jobs/{id}`"))),
            (status = 400, description = "The body is not JSON", body = LeveeErrorBody),
            (status = 401, description = "No API key, or an unknown one", body = LeveeErrorBody),
            (status = 404, description = "Jobs are disabled", body = LeveeErrorBody),
            (status = 413, description = "Body over `server.max_body_bytes`", body = LeveeErrorBody),
            (status = 408, description = "Body not received within `server.body_read_timeout`", body = LeveeErrorBody),
            (status = 415, description = "`Content-Type` is not JSON", body = LeveeErrorBody),
            (status = 422, description = "A field or header is missing or invalid; `field` names it", body = LeveeErrorBody),
            (status = 429, description = "A rate limit, or the tenant's `max_queued_jobs` (`queue_full`)", body = LeveeErrorBody),
            (status = 431, description = "Request header section too large (answered by the HTTP server)"),
            (status = 500, description = "Internal error", body = LeveeErrorBody),
            (status = 503, description = "The job store is down (nothing was queued)", body = LeveeErrorBody),
        ),
        security(("api_key" = []), ("api_key_bearer" = [])),
    )]
    fn submit_job() {}

    /// A job of the caller's tenant.
    #[utoipa::path(
        get, path = "/v1/jobs/{id}", tag = "jobs", operation_id = "show_job",
        params(("id" = String, Path, description = "The job id from the 202")),
        responses(
            (status = 200, description = "The job", body = JobView),
            (status = 401, description = "No API key, or an unknown one", body = LeveeErrorBody),
            (status = 404, description = "No such job for this key's tenant (also for another tenant's job)", body = LeveeErrorBody),
            (status = 431, description = "Request header section too large (answered by the HTTP server)"),
            (status = 500, description = "Internal error", body = LeveeErrorBody),
            (status = 503, description = "The job store is down", body = LeveeErrorBody),
        ),
        security(("api_key" = []), ("api_key_bearer" = [])),
    )]
    fn show_job() {}

    /// Liveness.
    #[utoipa::path(
        get, path = "/health", tag = "operations", operation_id = "health",
        responses(
            (status = 200, description = "Up", body = Health),
            (status = 431, description = "Request header section too large (answered by the HTTP server)"),
        ),
    )]
    fn health() {}

    /// Readiness: 503 only while draining for shutdown (a dependency being
    /// down does not make the gateway unready; it answers fast for it).
    #[utoipa::path(
        get, path = "/ready", tag = "operations", operation_id = "ready",
        responses(
            (status = 200, description = "Ready", body = Ready),
            (status = 431, description = "Request header section too large (answered by the HTTP server)"),
            (status = 503, description = "Draining for shutdown", body = Ready),
        ),
    )]
    fn ready() {}

    /// Every `levee_*` metric family.
    #[utoipa::path(
        get, path = "/metrics", tag = "operations", operation_id = "metrics",
        responses(
            (status = 200, description = "Prometheus text format", body = String,
                content_type = "text/plain; version=0.0.4; charset=utf-8"),
            (status = 431, description = "Request header section too large (answered by the HTTP server)"),
        ),
    )]
    fn metrics() {}

    /// This document.
    #[utoipa::path(
        get, path = "/openapi.json", tag = "operations", operation_id = "openapi",
        responses(
            (status = 200, description = "The OpenAPI 3.1 document", body = Object, content_type = "application/json"),
            (status = 431, description = "Request header section too large (answered by the HTTP server)"),
        ),
    )]
    fn openapi_json() {}

    /// Every circuit breaker's state.
    #[utoipa::path(
        get, path = "/admin/breakers", tag = "admin", operation_id = "list_breakers",
        responses(
            (status = 200, description = "The breakers", body = Breakers),
            (status = 401, description = "Missing or wrong admin token", body = LeveeErrorBody),
            (status = 404, description = "The admin API is disabled", body = LeveeErrorBody),
        ),
        security(("admin_token" = [])),
    )]
    fn list_breakers() {}

    /// Force a breaker open or closed, or reset it.
    #[utoipa::path(
        post, path = "/admin/breakers/{dependency}/{action}", tag = "admin", operation_id = "act_on_breaker",
        params(
            ("dependency" = String, Path, description = "A dependency with a breaker (`llm`, `vector_store`, `redis`, a deployment …)"),
            ("action" = String, Path, description = "`force_open`, `force_closed` or `reset`"),
        ),
        responses(
            (status = 200, description = "The breaker after the action", body = BreakerState),
            (status = 401, description = "Missing or wrong admin token", body = LeveeErrorBody),
            (status = 404, description = "The admin API is disabled, or no such breaker or action", body = LeveeErrorBody),
        ),
        security(("admin_token" = [])),
    )]
    fn act_on_breaker() {}

    /// Re-read the config file and apply what can change live (keys,
    /// limits); nothing changes when the file is refused.
    #[utoipa::path(
        post, path = "/admin/reload", tag = "admin", operation_id = "reload",
        responses(
            (status = 200, description = "Reloaded: what changed", body = Reloaded),
            (status = 401, description = "Missing or wrong admin token", body = LeveeErrorBody),
            (status = 404, description = "The admin API is disabled", body = LeveeErrorBody),
            (status = 409, description = "Running on embedded defaults: no config file to read (`no_config_file`)", body = LeveeErrorBody),
            (status = 422, description = "The file is refused (`config_invalid`, naming the key and value)", body = LeveeErrorBody),
            (status = 500, description = "The reload task failed", body = LeveeErrorBody),
        ),
        security(("admin_token" = [])),
    )]
    fn reload() {}

    /// The configuration in force.
    #[utoipa::path(
        get, path = "/admin/config", tag = "admin", operation_id = "show_config",
        responses(
            (status = 200, description = "The live configuration", body = Object),
            (status = 401, description = "Missing or wrong admin token", body = LeveeErrorBody),
            (status = 404, description = "The admin API is disabled", body = LeveeErrorBody),
        ),
        security(("admin_token" = [])),
    )]
    fn show_config() {}
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::SocketAddr;

    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::http::{header, Request, StatusCode};
    use serde_json::{json, Value};
    use tower::ServiceExt;

    use super::schemas;
    use crate::config::Config;
    use crate::identity::ApiKeyConfig;

    /// Routes deliberately left out of the document: none. A route added
    /// to the router without documentation fails
    /// `the_document_is_openapi_3_1_and_lists_every_route`.
    const UNDOCUMENTED: &[&str] = &[];
    const KEY: &str = "openapi_test_key";

    /// A gateway on embedded defaults that requires an API key.
    async fn app() -> axum::Router {
        let mut config = Config::default();
        config.identity.require_api_key = true;
        config.identity.api_keys.push(ApiKeyConfig {
            id: "doc".into(),
            sha256: crate::identity::hash_key(KEY),
            tenant: "acme".into(),
            tier: "API_KEY".into(),
        });
        // Built like `server::build` does, without importing the layer above.
        let gateway = crate::wiring::build(&config, &|_| None).expect("build");
        let state = super::super::AppState::new(gateway, &config, None);
        super::super::router(state).layer(axum::middleware::map_request(with_peer))
    }

    async fn with_peer(mut req: Request<Body>) -> Request<Body> {
        req.extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([10, 0, 0, 7], 40000))));
        req
    }

    async fn send(app: &axum::Router, req: Request<Body>) -> (StatusCode, Value) {
        let resp = app.clone().oneshot(req).await.expect("infallible");
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    fn request(method: &str, path: &str, body: &Value) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri(path)
            .header("x-api-key", KEY)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .expect("request")
    }

    /// Every `(METHOD, path)` the router declares, read from the
    /// `.route(...)` calls of `router` in `mod.rs`: the one list of routes.
    fn routed() -> BTreeSet<(String, String)> {
        let src = include_str!("mod.rs");
        let mut out = BTreeSet::new();
        for (at, _) in src.match_indices(".route(") {
            let call = &src[at + ".route(".len()..];
            let mut depth = 1;
            let end = call
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(call.len(), |(i, _)| i);
            let call = &call[..end];
            let path = call.split('"').nth(1).expect("a quoted route path");
            for method in ["get", "post", "put", "patch", "delete"] {
                let called = call.match_indices(&format!("{method}(")).any(|(i, _)| {
                    !call[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
                });
                if called {
                    out.insert((method.to_uppercase(), path.to_owned()));
                }
            }
        }
        out
    }

    /// Every `(METHOD, path)` the document describes.
    fn documented(doc: &Value) -> BTreeSet<(String, String)> {
        let paths = doc["paths"].as_object().expect("paths");
        paths
            .iter()
            .flat_map(|(path, item)| {
                let item = item.as_object().expect("path item");
                item.keys()
                    .filter(|k| ["get", "post", "put", "patch", "delete"].contains(&k.as_str()))
                    .map(|m| (m.to_uppercase(), path.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[tokio::test]
    async fn the_document_is_openapi_3_1_and_lists_every_route() {
        let app = app().await;
        // No key, though the gateway requires one: the document is keyless.
        let req = Request::get("/openapi.json")
            .body(Body::empty())
            .expect("request");
        let resp = app.clone().oneshot(req).await.expect("infallible");
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers()[header::CONTENT_TYPE],
            "application/json",
            "served as JSON"
        );
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("body");
        let doc: Value = serde_json::from_slice(&bytes).expect("the document is JSON");
        let version = doc["openapi"].as_str().expect("an openapi version");
        assert!(version.starts_with("3.1."), "OpenAPI 3.1, got {version}");

        let routes = routed();
        assert!(
            routes.len() >= 12,
            "the router's routes were read: {routes:?}"
        );
        let expected: BTreeSet<_> = routes
            .into_iter()
            .filter(|(_, path)| !UNDOCUMENTED.contains(&path.as_str()))
            .collect();
        let documented = documented(&doc);
        let missing: Vec<_> = expected.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&expected).collect();
        assert!(
            missing.is_empty(),
            "routes without documentation: {missing:?}"
        );
        assert!(
            extra.is_empty(),
            "documented operations with no route: {extra:?}"
        );

        // Neither identity nor the limiter stands in front of it by default.
        let identity = crate::identity::IdentityConfig::default();
        assert!(identity.keyless_paths.iter().any(|p| p == "/openapi.json"));
        let limits = crate::ratelimit::RateLimitConfig::default();
        assert!(limits.exempt_paths.iter().any(|p| p == "/openapi.json"));
    }

    #[tokio::test]
    async fn every_documented_operation_reaches_its_handler() {
        let app = app().await;
        let doc =
            serde_json::to_value(<super::ApiDoc as utoipa::OpenApi>::openapi()).expect("document");
        for (method, path) in documented(&doc) {
            let concrete = path
                .replace("{id}", "job_0")
                .replace("{dependency}", "llm")
                .replace("{action}", "reset");
            let (status, body) = send(&app, request(&method, &concrete, &json!({}))).await;
            let fallback = status == StatusCode::NOT_FOUND
                && body["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("no route"));
            assert!(!fallback, "{method} {path} is documented but not routed");
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        }
    }

    #[tokio::test]
    async fn the_body_schemas_match_what_the_handlers_parse_and_answer() {
        let doc =
            serde_json::to_value(<super::ApiDoc as utoipa::OpenApi>::openapi()).expect("document");
        // The request schema names exactly the fields the parser takes:
        // every one accepted, each required one needed, nothing else.
        let schema = &doc["components"]["schemas"]["ChatRequest"];
        let full = json!({"message": "hi", "user_id": "u", "thread_id": "t", "tenant_id": "acme"});
        let properties: BTreeSet<_> = schema["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .cloned()
            .collect();
        let sent: BTreeSet<_> = full.as_object().expect("object").keys().cloned().collect();
        assert_eq!(properties, sent);
        assert!(crate::http::parse_chat_request(full.to_string().as_bytes()).is_ok());
        for name in &properties {
            let mut body = full.clone();
            body.as_object_mut().expect("object").remove(name);
            let required = schema["required"]
                .as_array()
                .expect("required")
                .contains(&json!(name));
            let parsed = crate::http::parse_chat_request(body.to_string().as_bytes());
            assert_eq!(parsed.is_err(), required, "without {name}");
        }
        assert_eq!(schema["additionalProperties"], json!(false));

        // The answers deserialise into the schema types, which refuse
        // unknown fields and need every required one.
        let app = app().await;
        let chat =
            json!({"message": "How many PTO days do I get?", "user_id": "u", "thread_id": "t"});
        let (status, body) = send(&app, request("POST", "/v1/chat", &chat)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_value::<schemas::ChatResponse>(body.clone())
            .unwrap_or_else(|e| panic!("ChatResponse schema: {e}: {body}"));
        let (status, body) = send(&app, request("POST", "/v1/jobs", &chat)).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let accepted: schemas::JobAccepted = serde_json::from_value(body.clone())
            .unwrap_or_else(|e| panic!("JobAccepted schema: {e}: {body}"));
        let path = format!("/v1/jobs/{}", accepted.job_id);
        let (status, body) = send(&app, request("GET", &path, &json!({}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_value::<schemas::JobView>(body.clone())
            .unwrap_or_else(|e| panic!("JobView schema: {e}: {body}"));
    }
}
