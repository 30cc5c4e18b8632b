//! The HTTP surface (axum): routes, shared state, and the middleware that
//! turns every bare error status into the JSON error contract.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

mod admin;
mod chat;
mod error;

pub use admin::Breakers;
pub use chat::{parse as parse_chat_request, MAX_ID_LEN};
pub use error::ApiError;

use crate::health::{DependencyHealth, DependencyState};
use crate::rag::Pipeline;
use crate::ratelimit::{Limiter, RateLimitLayer};
use crate::telemetry::{Metrics, TraceLayer};
use crate::upstream::Dependency;

/// What handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The RAG pipeline.
    pub pipeline: Pipeline,
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
    /// The metrics registry, served at `/metrics`.
    pub metrics: Metrics,
    /// Every circuit breaker, for `/ready` and the admin API.
    pub breakers: Arc<Breakers>,
    /// The admin API's bearer token (`None`: admin API off).
    pub admin_token: Option<String>,
}

/// Builds the application router.
pub fn router(state: AppState) -> Router {
    let limit = state.max_body_bytes;
    let limiter = state.limiter.clone();
    let app = Router::new()
        .route("/v1/chat", post(chat::chat))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/admin/breakers", get(admin::list))
        .route("/admin/breakers/{dependency}/{action}", post(admin::act))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit));
    // Rate limits run before anything expensive (body parsing, retrieval,
    // the LLM); exempt paths pass through inside the layer.
    let app = match limiter {
        Some(limiter) => app.layer(RateLimitLayer::new(limiter)),
        None => app,
    };
    // Next: whatever produced a bare error status (axum's 405, a
    // body-limit 413 …) leaves as the JSON error contract.
    let app = app.layer(middleware::from_fn(json_errors));
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
    let body = json!({
        "status": if draining { "draining" } else { "ready" },
        "dependencies": deps,
    });
    let status = if draining {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (status, Json(body)).into_response()
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
}

async fn json_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
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
    let mut err = ApiError::for_status(status);
    if status == StatusCode::METHOD_NOT_ALLOWED {
        err.message = format!("{method} is not allowed on {path}");
    }
    let mut out = err.into_response();
    // Keep headers such as `Allow` on a 405.
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_TYPE);
    for (name, value) in out.headers() {
        parts.headers.insert(name.clone(), value.clone());
    }
    *out.headers_mut() = parts.headers;
    out
}
