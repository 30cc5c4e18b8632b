//! The OpenAI-compatible routes: `POST /v1/chat/completions` (streamed or
//! not), `POST /v1/embeddings` and `GET /v1/models`. The identity and
//! rate-limit layers have run; here the body is checked, the tenant's
//! token budget reserved (the prompt estimate plus the completion
//! allowance), the call forwarded through `proxy`, and the budget settled
//! with the usage the deployment reported, when the answer is whole or
//! when the stream ends. Every error leaves in OpenAI's shape.

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::FutureExt;
use tokio::time::Instant;

use super::chat::{check_content_type, queue_tenant};
use super::{ApiError, AppState, OpenAiFailure};
use crate::identity::Identity;
use crate::proxy::{ApiRequest, OnEnd, Operation, Reply, ReplyBody};
use crate::ratelimit::{Limiter, TokenReservation};

/// Which deployment answered (a configured name, never a URL).
const X_DEPLOYMENT: header::HeaderName = header::HeaderName::from_static("x-levee-deployment");

/// `POST /v1/chat/completions`.
pub(super) async fn chat_completions(
    State(state): State<AppState>,
    identity: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let identity = identity.map(|Extension(i)| i);
    forward(&state, identity.as_ref(), &headers, body, Operation::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/embeddings`.
pub(super) async fn embeddings(
    State(state): State<AppState>,
    identity: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let identity = identity.map(|Extension(i)| i);
    forward(
        &state,
        identity.as_ref(),
        &headers,
        body,
        Operation::Embeddings,
    )
    .await
    .unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/models`: the configured names, or (with `llm.url` alone) the
/// deployment's own list.
pub(super) async fn models(State(state): State<AppState>) -> Response {
    if let Some(list) = state.proxy.listed() {
        return Json(list).into_response();
    }
    match state.proxy.list_upstream().await {
        Ok(reply) => whole(reply),
        Err(e) => OpenAiFailure::from(e).into_response(),
    }
}

/// The reservation, settled once: by the handler for a whole answer or a
/// failure, by the stream's end for a stream.
type Reserved = Arc<Mutex<Option<(Arc<Limiter>, TokenReservation)>>>;

async fn settle(reserved: &Reserved, used: Option<u64>) {
    let taken = reserved.lock().ok().and_then(|mut r| r.take());
    if let Some((limiter, reservation)) = taken {
        // Usage unknown: the reservation is charged in full.
        let used = used.unwrap_or_else(|| reservation.reserved());
        limiter.settle_tokens(reservation, used).await;
    }
}

async fn forward(
    state: &AppState,
    identity: Option<&Identity>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    operation: Operation,
) -> Result<Response, OpenAiFailure> {
    let arrived = Instant::now();
    check_content_type(headers)?;
    let body = body.map_err(|r| ApiError::body_rejected(&r, state.max_body_bytes))?;
    let request = match operation {
        Operation::Chat => ApiRequest::chat(body)?,
        Operation::Embeddings => ApiRequest::embeddings(body)?,
    };
    let model = state.proxy.model(request.model())?;
    // Fail fast before reserving tokens no deployment will use.
    model.available()?;
    let estimate = request.estimated_tokens(state.llm_max_tokens);
    let reserved: Reserved = Arc::new(Mutex::new(None));
    if let (Some(limiter), Some(identity)) = (&state.limiter, identity) {
        if let Some(r) = limiter.reserve_tokens(identity, estimate).await? {
            if let Ok(mut slot) = reserved.lock() {
                *slot = Some((limiter.clone(), r));
            }
        }
    }
    let tenant = queue_tenant(identity);
    let on_end: OnEnd = {
        let reserved = reserved.clone();
        Box::new(move |s: crate::proxy::Settlement| {
            async move {
                let used = s.usage.map(|u| u.prompt_tokens + u.completion_tokens);
                settle(&reserved, used).await;
            }
            .boxed()
        })
    };
    let reply = state
        .proxy
        .forward(&model, &request, &tenant, estimate, arrived, on_end)
        .await;
    let reply = match reply {
        Ok(reply) => reply,
        Err(e) => {
            // Not answered: nothing was used.
            settle(&reserved, Some(0)).await;
            return Err(e.into());
        }
    };
    if let ReplyBody::Full { usage, .. } = &reply.body {
        // A whole answer's usage; an error body used nothing.
        let used = usage.map_or(0, |u| u.prompt_tokens + u.completion_tokens);
        settle(&reserved, Some(used)).await;
    }
    Ok(respond(reply))
}

fn respond(reply: Reply) -> Response {
    match reply.body {
        ReplyBody::Full { .. } => whole(reply),
        ReplyBody::Stream(relay) => {
            let mut resp = Response::new(Body::from_stream(*relay));
            let h = resp.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                reply
                    .content_type
                    .unwrap_or_else(|| HeaderValue::from_static("text/event-stream")),
            );
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            // Proxies in front must not buffer the stream either.
            h.insert("x-accel-buffering", HeaderValue::from_static("no"));
            if let Ok(v) = HeaderValue::from_str(reply.deployment) {
                h.insert(X_DEPLOYMENT, v);
            }
            resp
        }
    }
}

fn whole(reply: Reply) -> Response {
    let ReplyBody::Full { bytes, .. } = reply.body else {
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "internal error",
        )
        .into_openai_response();
    };
    let mut resp = (reply.status, bytes).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        reply
            .content_type
            .unwrap_or_else(|| HeaderValue::from_static("application/json")),
    );
    if let Ok(v) = HeaderValue::from_str(reply.deployment) {
        h.insert(X_DEPLOYMENT, v);
    }
    resp
}
