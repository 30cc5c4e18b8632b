//! The admin API: `GET /admin/breakers`,
//! `POST /admin/breakers/{dependency}/{force_open|force_closed|reset}`,
//! `POST /admin/reload` (re-read the config file) and `GET /admin/config`
//! (the loaded file's hash and load time, the running config without
//! secrets), behind a bearer token read from the environment
//! (`admin.token_env`).
//! With no token configured the admin API does not exist (404).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{ApiError, AppState};
use crate::wiring::ReloadError;

/// Compares digests, so the comparison takes the same time whatever the
/// guess.
fn authorized(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(token) = &state.admin_token else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "the admin API is disabled (no admin token configured)",
        ));
    };
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if Sha256::digest(presented.as_bytes()) == Sha256::digest(token.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the admin API needs `Authorization: Bearer <admin token>`",
        ))
    }
}

/// `GET /admin/breakers`.
pub(super) async fn list(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match authorized(&state, &headers) {
        Ok(()) => Json(json!({ "breakers": state.breakers.snapshots() })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /admin/breakers/{dependency}/{action}`.
pub(super) async fn act(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((dependency, action)): Path<(String, String)>,
) -> Response {
    if let Err(e) = authorized(&state, &headers) {
        return e.into_response();
    }
    let Some(breaker) = state.breakers.get(&dependency) else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no breaker for dependency {dependency:?}"),
        )
        .into_response();
    };
    match action.as_str() {
        "force_open" => breaker.force_open(),
        "force_closed" => breaker.force_closed(),
        "reset" => breaker.reset(),
        other => {
            return ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("unknown action {other:?}: use force_open, force_closed or reset"),
            )
            .into_response()
        }
    }
    tracing::warn!(dependency, action, "breaker changed by the admin API");
    Json(json!({ "breaker": breaker.snapshot() })).into_response()
}

/// `POST /admin/reload`: re-reads the config file and applies what can
/// change live. 200 with what changed; 422 `config_invalid` naming the key
/// and value when the file is refused (nothing changed); 409
/// `no_config_file` on embedded defaults.
pub(super) async fn reload(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(e) = authorized(&state, &headers) {
        return e.into_response();
    }
    let reloader = state.reloader.clone();
    match tokio::task::spawn_blocking(move || reloader.reload()).await {
        Ok(Ok(done)) => Json(json!({ "status": "reloaded", "reload": done })).into_response(),
        Ok(Err(e)) => {
            let (status, code) = match &e {
                ReloadError::NoSource => (StatusCode::CONFLICT, "no_config_file"),
                ReloadError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "config_invalid"),
            };
            ApiError::new(status, code, e.to_string()).into_response()
        }
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("reload task failed: {e}"),
        )
        .into_response(),
    }
}

/// `GET /admin/config`.
pub(super) async fn config(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match authorized(&state, &headers) {
        Ok(()) => Json(state.reloader.view()).into_response(),
        Err(e) => e.into_response(),
    }
}
