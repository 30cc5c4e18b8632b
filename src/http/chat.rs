//! `POST /v1/chat`: parses and validates the body (every problem named),
//! then runs the RAG pipeline.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::{ApiError, AppState, Failure};
use crate::fairness::{ANONYMOUS_INTERNAL, ANONYMOUS_PUBLIC};
use crate::identity::{Identity, NetworkClass};
use crate::rag::ChatRequest;

/// Longest accepted id (`user_id`, `thread_id`, `tenant_id`).
pub const MAX_ID_LEN: usize = 128;

/// `POST /v1/chat`: answered now, or queued as a job when the client
/// prefers `respond-async`.
pub(super) async fn chat_or_job(
    state: State<AppState>,
    identity: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if crate::ratelimit::prefers_async(&headers) {
        let identity = identity.as_ref().map(|Extension(i)| i);
        return super::jobs::submit_preferred(&state, identity, &headers, body).await;
    }
    chat(state, identity, headers, body).await
}

/// The handler.
pub(super) async fn chat(
    State(state): State<AppState>,
    identity: Option<Extension<Identity>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let identity = identity.map(|Extension(i)| i);
    match handle(&state, identity.as_ref(), &headers, body).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

pub(super) async fn handle(
    state: &AppState,
    identity: Option<&Identity>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Failure> {
    check_content_type(headers)?;
    let body = body.map_err(|r| ApiError::body_rejected(&r, state.max_body_bytes))?;
    let mut request = parse(&body)?;
    validate(&request, state.max_message_bytes)?;
    // A keyed caller's tenant is the key's, whatever the body claims.
    if let Some(tenant) = identity.and_then(Identity::tenant) {
        request.tenant_id = Some(tenant.to_owned());
    }
    request.queue_tenant = Some(queue_tenant(identity));
    // Fail fast before reserving tokens for an LLM that will not be called.
    state.pipeline.synthesizer().available()?;
    let reservation = match (&state.limiter, identity) {
        (Some(limiter), Some(identity)) => {
            let estimate = crate::rag::estimate_tokens(&request.message, state.llm_max_tokens);
            match limiter.reserve_tokens(identity, estimate).await {
                Ok(r) => r.map(|r| (limiter, r)),
                Err(rejection) => return Err(rejection.into()),
            }
        }
        _ => None,
    };
    let answer = state.pipeline.chat(&request).await;
    if let Some((limiter, reservation)) = reservation {
        // Settle with real usage; a failed call used nothing.
        let used = answer.as_ref().map_or(0, |a| {
            a.metadata.usage.prompt_tokens + a.metadata.usage.completion_tokens
        });
        limiter.settle_tokens(reservation, used).await;
    }
    Ok(Json(answer?).into_response())
}

/// Whose share of the LLM the request uses: the key's tenant, or one
/// anonymous tenant per network tier (never what the body claims).
pub(super) fn queue_tenant(identity: Option<&Identity>) -> String {
    match identity {
        Some(i) => match i.tenant() {
            Some(t) => t.to_owned(),
            None => match i.network {
                NetworkClass::Internal => ANONYMOUS_INTERNAL.to_owned(),
                NetworkClass::Public => ANONYMOUS_PUBLIC.to_owned(),
            },
        },
        None => crate::rag::ANONYMOUS_QUEUE.to_owned(),
    }
}

pub(super) fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        // A missing Content-Type is accepted: the body must still be JSON.
        return Ok(());
    };
    let mime = value
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    let is_json = mime.eq_ignore_ascii_case("application/json")
        || mime.to_ascii_lowercase().ends_with("+json");
    if is_json {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("Content-Type must be application/json, got {mime:?}"),
        ))
    }
}

/// Parses the body, naming the field at fault on a type error.
pub fn parse(body: &[u8]) -> Result<ChatRequest, ApiError> {
    // serde also reads a struct from a JSON array of its fields in order
    // (`["hi","u1","t1"]`): only an object is a chat request (found by
    // fuzz/chat_request).
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Ok(_) => ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request",
                    "the request body must be a JSON object",
                ),
                Err(e) => ApiError::malformed_json(e),
            },
        );
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed: Result<ChatRequest, _> = serde_path_to_error::deserialize(&mut de);
    let request = match parsed {
        Ok(r) => r,
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            return Err(match inner.classify() {
                serde_json::error::Category::Data => {
                    let msg = strip_position(&inner.to_string());
                    if path == "." {
                        match field_in(&msg) {
                            Some(field) => ApiError::invalid_field(field, msg),
                            None => ApiError::new(
                                StatusCode::UNPROCESSABLE_ENTITY,
                                "invalid_request",
                                msg,
                            ),
                        }
                    } else {
                        ApiError::invalid_field(path.clone(), format!("field `{path}`: {msg}"))
                    }
                }
                _ => ApiError::malformed_json(inner),
            });
        }
    };
    de.end().map_err(ApiError::malformed_json)?;
    Ok(request)
}

fn strip_position(msg: &str) -> String {
    match msg.find(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

/// The field named in a serde message such as "missing field `message`"
/// (other messages quote values, not fields).
fn field_in(msg: &str) -> Option<String> {
    if !["missing field", "unknown field", "duplicate field"]
        .iter()
        .any(|p| msg.starts_with(p))
    {
        return None;
    }
    let start = msg.find('`')? + 1;
    let end = start + msg[start..].find('`')?;
    Some(msg[start..end].to_owned())
}

pub(super) fn validate(req: &ChatRequest, max_message_bytes: usize) -> Result<(), ApiError> {
    if req.message.trim().is_empty() {
        return Err(ApiError::invalid_field(
            "message",
            "`message` must not be empty",
        ));
    }
    if req.message.len() > max_message_bytes {
        return Err(ApiError::invalid_field(
            "message",
            format!(
                "`message` is {} bytes; the limit is {max_message_bytes}",
                req.message.len()
            ),
        ));
    }
    check_id("user_id", &req.user_id)?;
    check_id("thread_id", &req.thread_id)?;
    if let Some(tenant) = &req.tenant_id {
        check_id("tenant_id", tenant)?;
    }
    Ok(())
}

fn check_id(field: &str, value: &str) -> Result<(), ApiError> {
    let ok = !value.is_empty()
        && value.len() <= MAX_ID_LEN
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '@'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid_field(
            field,
            format!(
                "`{field}` must be 1 to {MAX_ID_LEN} characters of letters, digits, '_', '-', '.', ':' or '@'"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_json_object_is_a_chat_request() {
        // serde alone would read these as the fields in order.
        for body in [
            r#"["hi","u1","t1"]"#,
            r#" ["hi","u1","t1",null,1]"#,
            "42",
            "true",
            r#""s""#,
        ] {
            let err = parse(body.as_bytes()).expect_err(body);
            assert_eq!(
                err.status,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{body}: {err:?}"
            );
            assert_eq!(err.field, None, "{body}: a value is not a field");
        }
        assert_eq!(
            parse(b"[1,").expect_err("syntax").status,
            StatusCode::BAD_REQUEST
        );
        let ok = parse(br#" {"message":"hi","user_id":"u1","thread_id":"t1"}"#);
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn a_missing_or_unknown_field_is_named() {
        let err = parse(br#"{"message":"hi","user_id":"u1"}"#).expect_err("missing");
        assert_eq!(err.field.as_deref(), Some("thread_id"));
        let err = parse(br#"{"message":"hi","user_id":"u1","thread_id":"t","x":1}"#)
            .expect_err("unknown");
        assert_eq!(err.field.as_deref(), Some("x"), "{err:?}");
    }
}
