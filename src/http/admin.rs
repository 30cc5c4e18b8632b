//! The admin API: `GET /admin/breakers` and
//! `POST /admin/breakers/{dependency}/{force_open|force_closed|reset}`,
//! behind a bearer token read from the environment (`admin.token_env`).
//! With no token configured the admin API does not exist (404).

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{ApiError, AppState};

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
