//! The HTTP surface (axum): routes, shared state, and the middleware that
//! turns every bare error status into the JSON error contract.

use std::sync::Arc;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tower::ServiceBuilder;

mod admin;
mod chat;
mod error;
mod head;
mod jobs;
mod openai;
mod openapi;

pub use chat::{parse as parse_chat_request, MAX_ID_LEN};
pub use error::{
    rescue, respond, respond_as, ApiError, BareStatus, Dialect, Failure, OpenAiFailure,
};
pub use head::BodyTimeout;

use crate::config::Config;
use crate::health::{DependencyHealth, DependencyState};
use crate::identity::{IdentityLayer, OnRefusal, Resolver};
use crate::jobs::{QueueLimits, Workers};
use crate::proxy::Proxy;
use crate::rag::Pipeline;
use crate::ratelimit::{Limiter, RateLimitLayer};
use crate::telemetry::{Metrics, TraceLayer};
use crate::upstream::Dependency;
use crate::wiring::{Breakers, Gateway, Reloader};

/// What handlers share: one `Arc`, so the per-request clone axum makes of
/// the state is a reference count, not a copy.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

/// The shared state behind [`AppState`].
#[derive(Debug)]
pub struct Shared {
    /// The RAG pipeline.
    pub pipeline: Pipeline,
    /// The OpenAI-compatible API's models and deployments.
    pub proxy: Arc<Proxy>,
    /// Resolves who is calling (the identity layer).
    pub resolver: Arc<Resolver>,
    /// The rate limiter (`None` when `ratelimit.enabled = false`).
    pub limiter: Option<Arc<Limiter>>,
    /// `llm.max_tokens`, for token-budget estimates.
    pub llm_max_tokens: u64,
    /// Dependency states and the draining flag.
    pub health: Arc<DependencyHealth>,
    /// `server.max_body_bytes`, for the 413 message.
    pub max_body_bytes: usize,
    /// `server.max_message_bytes`.
    pub max_message_bytes: usize,
    /// `server.max_header_bytes` (a larger request head is a 431) and
    /// `server.body_read_timeout` (a slower body is a 408).
    client_limits: head::ClientLimits,
    /// The metrics registry, served at `/metrics`.
    pub metrics: Metrics,
    /// Every circuit breaker, for `/ready` and the admin API.
    pub breakers: Arc<Breakers>,
    /// The admin API's bearer token (`None`: admin API off).
    pub admin_token: Option<String>,
    /// The job queues and this replica's workers (`None`: jobs off).
    pub jobs: Option<Arc<Workers>>,
    /// `max_queued_jobs` per tenant, and for everyone else (live).
    pub job_limits: Arc<QueueLimits>,
    /// Re-reads the config file and applies what can change live
    /// (`POST /admin/reload`, SIGHUP).
    pub reloader: Arc<Reloader>,
}

impl AppState {
    /// The state for what `gateway` built, with the HTTP settings of
    /// `config` and the admin token (`None`: admin API off).
    pub fn new(gateway: Gateway, config: &Config, admin_token: Option<String>) -> Self {
        Self(Arc::new(Shared {
            pipeline: gateway.pipeline,
            proxy: gateway.proxy,
            resolver: gateway.resolver,
            limiter: gateway.limiter,
            llm_max_tokens: u64::from(config.llm.max_tokens),
            health: gateway.health,
            max_body_bytes: config.server.max_body_bytes,
            max_message_bytes: config.server.max_message_bytes,
            client_limits: head::ClientLimits {
                max_header_bytes: config.server.max_header_bytes,
                body_read_timeout: config.server.body_read_timeout,
            },
            metrics: gateway.metrics,
            breakers: gateway.breakers,
            admin_token,
            jobs: gateway.jobs,
            job_limits: gateway.job_limits,
            reloader: gateway.reloader,
        }))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// Builds the application router.
pub fn router(state: AppState) -> Router {
    let limit = state.max_body_bytes;
    let app = Router::new()
        .route("/v1/chat", post(chat::chat_or_job))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/models", get(openai::models))
        .route("/v1/jobs", post(jobs::submit))
        .route("/v1/jobs/{id}", get(jobs::show))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi::serve))
        .route("/admin/breakers", get(admin::list))
        .route("/admin/breakers/{dependency}/{action}", post(admin::act))
        .route("/admin/reload", post(admin::reload))
        .route("/admin/config", get(admin::config))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit));
    // Identity first, then limits, both before anything expensive (body
    // parsing, retrieval, the LLM): authentication never depends on whether
    // a limit is configured, and the limiter reads the identity the layer
    // resolved. Both refuse with typed errors, which leave through the one
    // error path (`error::rescue`).
    let mut identity = IdentityLayer::new(state.resolver.clone());
    if let Some(limiter) = &state.limiter {
        let hook: Arc<dyn OnRefusal> = limiter.clone();
        identity = identity.with_refusal_hook(hook);
    }
    let guard = ServiceBuilder::new()
        .layer(HandleErrorLayer::new(error::rescue))
        .layer(identity);
    // Two arms, not `option_layer`: tower's `Either` wants one error type,
    // and the router erases the difference anyway.
    let app = match state.limiter.clone() {
        Some(limiter) => app.layer(guard.layer(RateLimitLayer::new(limiter))),
        None => app.layer(guard),
    };
    // Next: whatever produced a bare error status (axum's 405, a
    // body-limit 413 …) leaves as the JSON error contract.
    let app = app.layer(middleware::from_fn(json_errors));
    // An oversize head is refused before anything reads it, but inside the
    // trace layer, so the 431 is counted like every refusal.
    let app = app.layer(middleware::from_fn_with_state(
        state.client_limits,
        head::limit,
    ));
    // Outside everything that can answer early (429, 503, 401, 413), so
    // every request gets its SERVER span and is counted with the status the
    // client saw.
    app.layer(TraceLayer::new(state.metrics.clone()))
        .with_state(state)
}

/// `GET /metrics`: every `levee_*` family in the Prometheus text format.
async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            crate::telemetry::metrics::CONTENT_TYPE,
        )],
        state.metrics.encode(),
    )
        .into_response()
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness reports each dependency's last-known state. A dependency being
/// down does not make the gateway unready (it answers fast for it); only
/// shutdown does, so load balancers drain this replica first.
async fn ready(State(state): State<AppState>) -> Response {
    let p = &state.pipeline;
    let dep = |kind: &'static str, d: Dependency| {
        let s = if kind == "builtin" || kind == "memory" {
            DependencyState::Embedded
        } else {
            state.health.state(d)
        };
        json!({ "kind": kind, "state": s })
    };
    let draining = state.health.is_draining();
    let mut deps = json!({
        "llm": dep(p.synthesizer().kind(), Dependency::Llm),
        "vector_store": dep(p.retriever().kind(), Dependency::VectorStore),
        "memory": dep(p.memory().kind(), Dependency::Redis),
    });
    // A breaker's state is the freshest word on a remote dependency.
    for snapshot in state.breakers.snapshots() {
        let name = snapshot.dependency;
        let entry = deps
            .as_object_mut()
            .map(|d| d.entry(name).or_insert_with(|| json!({ "kind": name })));
        if let Some(entry) = entry {
            entry["breaker"] = json!(snapshot);
        }
    }
    // The job queues say whether an accepted job survives this process.
    let jobs = state
        .jobs
        .as_ref()
        .map(|w| json!({ "kind": w.store().kind(), "durable": w.store().durable() }));
    let body = json!({
        "status": if draining { "draining" } else { "ready" },
        "dependencies": deps,
        "jobs": jobs,
    });
    let status = if draining {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (status, Json(body)).into_response()
}

async fn not_found(req: Request) -> ApiError {
    // Through the one path like every error: an `ApiError` is its own
    // mapping.
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
}

async fn json_errors(req: Request, next: Next) -> Response {
    // The method and URI are cheap to keep (the path shares the request's
    // bytes); the path is only copied out when a bare error needs it.
    let method = req.method().clone();
    let uri = req.uri().clone();
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (mut parts, _) = resp.into_parts();
    let bare = error::BareStatus {
        status,
        method,
        path: uri.path().to_owned(),
    };
    let mut out = error::respond_as(error::Dialect::for_path(uri.path()), &bare);
    // Keep headers such as `Allow` on a 405.
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_TYPE);
    for (name, value) in out.headers() {
        parts.headers.insert(name.clone(), value.clone());
    }
    *out.headers_mut() = parts.headers;
    out
}
