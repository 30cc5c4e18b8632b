//! `POST /v1/jobs` (and `POST /v1/chat` with `Prefer: respond-async`,
//! RFC 7240) and `GET /v1/jobs/{id}`. A submission is checked exactly as
//! a synchronous chat is (a bad body is 422 and never queued), then
//! written to the job store; 202 comes only after the store has it. Jobs
//! need an API key: a job belongs to its key's tenant, and only that
//! tenant can read it (another key gets 404, no key 401).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::json;

use super::{ApiError, AppState, Failure};
use crate::identity::{Identity, NetworkClass};
use crate::jobs::{new_id, now_ms, valid_id, NewJob, Submitted, Submitter};

/// The header naming where to deliver a job's result.
pub(super) const CALLBACK_HEADER: &str = "callback-url";
/// Longest accepted `Idempotency-Key`.
const MAX_IDEMPOTENCY_KEY: usize = 256;

/// `POST /v1/jobs`.
pub(super) async fn submit(
    State(state): State<AppState>,
    identity: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let identity = identity.map(|Extension(i)| i);
    enqueue(&state, identity.as_ref(), &headers, body, false)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/chat` with `Prefer: respond-async` as a job.
pub(super) async fn submit_preferred(
    state: &AppState,
    identity: Option<&Identity>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    enqueue(state, identity, headers, body, true)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/jobs/{id}`.
pub(super) async fn show(
    State(state): State<AppState>,
    identity: Option<Extension<Identity>>,
    Path(id): Path<String>,
) -> Response {
    let tenant = identity.as_ref().and_then(|Extension(i)| i.tenant());
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no job {id:?} for this API key"),
        )
        .into_response()
    };
    let Some(workers) = &state.jobs else {
        return not_found();
    };
    // Like a submission: without a key there is no tenant to look in.
    let Some(tenant) = tenant else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "reading a job needs the API key it was submitted with",
        )
        .into_response();
    };
    if !valid_id(&id) {
        return not_found();
    }
    match workers.store().get(tenant, &id).await {
        Ok(Some(view)) => Json(view).into_response(),
        Ok(None) => not_found(),
        Err(e) => Failure::from(e).into_response(),
    }
}

async fn enqueue(
    state: &AppState,
    identity: Option<&Identity>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    preferred: bool,
) -> Result<Response, Failure> {
    let Some(workers) = &state.jobs else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "asynchronous jobs are disabled (jobs.enabled = false)",
        )
        .into());
    };
    let key = identity.and_then(|i| i.key.clone()).ok_or_else(|| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "asynchronous jobs need an API key: a job belongs to the key's tenant",
        )
    })?;
    super::chat::check_content_type(headers)?;
    let body = body.map_err(|r| ApiError::body_rejected(&r, state.max_body_bytes))?;
    // The same checks as a synchronous chat: a bad body is refused now,
    // never queued.
    let request = super::chat::parse(&body)?;
    super::chat::validate(&request, state.max_message_bytes)?;
    let callback = callback(headers)?;
    let idempotency_key = idempotency_key(headers)?;
    let identity = identity
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "no identity"))?;
    let submitter = Submitter {
        tenant: key.tenant.clone(),
        key_id: key.id.clone(),
        tier: key.tier.clone(),
        client_ip: identity.client_ip,
        internal: identity.network == NetworkClass::Internal,
        user: identity.user.as_deref().map(str::to_owned),
    };
    let mut trace = HeaderMap::new();
    crate::telemetry::propagation::inject_current(&mut trace);
    let job = NewJob {
        id: new_id(),
        submitter,
        body: String::from_utf8_lossy(&body).into_owned(),
        callback,
        traceparent: trace
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        idempotency_key,
        enqueued_at: now_ms(),
    };
    let tenant = key.tenant.as_str();
    let max = state.job_limits.get(tenant);
    let submitted = match workers.store().submit(job, max).await {
        Ok(s) => s,
        // RFC 7240 lets a server ignore a preference: under a fail-open
        // tier, a `Prefer: respond-async` chat is answered now, as if no
        // preference had been given, rather than refused. Nothing was
        // accepted, so nothing can be lost. Otherwise: 503, fast.
        Err(e) if preferred && fails_open(state, &key.tier) => {
            tracing::warn!(error = %e, "job store down: answering a respond-async chat now");
            return answer_now(state, identity, headers, body).await;
        }
        Err(e) => return Err(e.into()),
    };
    let id = match submitted {
        Submitted::Queued(id) => {
            workers.submitted(tenant);
            id
        }
        Submitted::Existing(id) => id,
        Submitted::Full => {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "queue_full",
                format!("tenant {tenant} already has {max} jobs queued (max_queued_jobs)"),
            )
            .with_retry_after(std::time::Duration::from_secs(1))
            .into())
        }
    };
    let status = match workers.store().get(tenant, &id).await {
        Ok(Some(view)) => view.status.as_str(),
        _ => "queued",
    };
    let mut resp = (
        StatusCode::ACCEPTED,
        Json(json!({ "job_id": id, "status": status })),
    )
        .into_response();
    let h = resp.headers_mut();
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/jobs/{id}")) {
        h.insert(header::LOCATION, location);
    }
    if preferred {
        h.insert(
            "preference-applied",
            HeaderValue::from_static("respond-async"),
        );
    }
    Ok(resp)
}

fn fails_open(state: &AppState, tier: &str) -> bool {
    state
        .limiter
        .as_ref()
        .is_some_and(|l| l.policy().failure_mode(tier) == crate::ratelimit::FailureMode::FailOpen)
}

/// The chat answered synchronously, with the limits the rate-limit layer
/// left to the job (it skips asynchronous submissions).
async fn answer_now(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, Failure> {
    let limits = match &state.limiter {
        Some(limiter) => limiter.admit(identity, "/v1/chat").await?,
        None => HeaderMap::new(),
    };
    let mut resp = super::chat::handle(state, Some(identity), headers, Ok(body)).await?;
    resp.headers_mut().extend(limits);
    Ok(resp)
}

fn callback(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(CALLBACK_HEADER) else {
        return Ok(None);
    };
    let url = value
        .to_str()
        .ok()
        .and_then(|v| reqwest::Url::parse(v.trim()).ok())
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
    match url {
        Some(u) => Ok(Some(u.to_string())),
        None => Err(ApiError::invalid_field(
            CALLBACK_HEADER,
            "`Callback-Url` must be an absolute http(s) URL",
        )),
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(v) if !v.is_empty() && v.len() <= MAX_IDEMPOTENCY_KEY => Ok(Some(v.to_owned())),
        _ => Err(ApiError::invalid_field(
            "Idempotency-Key",
            format!(
                "`Idempotency-Key` must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters"
            ),
        )),
    }
}
