//! The error contract: every error is JSON with a stable code and a human
//! message, `{"error":"…","message":"…"}`, plus `field` or `retry_after_s`
//! where they apply. [`respond`] is the one place where errors become
//! responses: it walks the error's causes ([`ApiError::from_error`]) and
//! adds the headers that travel with the error.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use tower::BoxError;

use crate::fairness::{Overloaded, TenantQueueFull};
use crate::identity::IdentityError;
use crate::proxy::{InvalidRequest, ModelNotFound};
use crate::ratelimit::{LimiterUnavailable, RateLimited, Rejection};
use crate::resilience::{BulkheadFull, CircuitOpen, DeadlineExceeded, Elapsed};
use crate::upstream::{UpstreamError, UpstreamErrorKind};

/// An error on its way to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// Human-readable explanation.
    pub message: String,
    /// The request field at fault, for 400 / 422.
    pub field: Option<String>,
    /// Seconds to wait before retrying (also sent as `Retry-After`).
    pub retry_after: Option<u64>,
    /// Extra fields for the body (e.g. `layer` and `tier` on a 429).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Levee's error body (the schema in `/openapi.json` is derived from it).
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = LeveeError)]
pub(super) struct Body<'a> {
    /// Stable machine-readable code (`rate_limited`, `invalid_request` …).
    error: &'a str,
    /// Human-readable explanation.
    message: &'a str,
    /// The request field at fault, on 400 / 422.
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    /// Seconds to wait before retrying (also sent as `Retry-After`).
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_s: Option<u64>,
    #[serde(flatten)]
    #[schema(value_type = super::openapi::ErrorDetails)]
    extra: &'a serde_json::Map<String, serde_json::Value>,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field: None,
            retry_after: None,
            extra: serde_json::Map::new(),
        }
    }

    /// Adds a field to the body.
    #[must_use]
    pub fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.extra.insert(key.to_owned(), value.into());
        self
    }

    /// Names the request field at fault.
    #[must_use]
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// Adds a retry hint, rounded up to whole seconds and never 0.
    #[must_use]
    pub fn with_retry_after(mut self, wait: Duration) -> Self {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        self.retry_after = Some(secs.max(1));
        self
    }

    /// The body could not be read: 413 over `limit` bytes, else the
    /// extractor's own status.
    pub fn body_rejected(
        rejection: &axum::extract::rejection::BytesRejection,
        limit: usize,
    ) -> Self {
        if let Some(timeout) = body_timeout(rejection) {
            return Self::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                timeout.to_string(),
            );
        }
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("request body is larger than the {limit} byte limit"),
            )
        } else {
            Self::new(rejection.status(), "bad_request", rejection.body_text())
        }
    }

    /// 400: the body is not JSON.
    pub fn malformed_json(detail: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("request body is not valid JSON: {detail}"),
        )
    }

    /// 422: a field is missing or invalid.
    pub fn invalid_field(field: impl Into<String>, message: impl Into<String>) -> Self {
        let field = field.into();
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message).with_field(field)
    }

    /// The default JSON error for a bare status produced outside our
    /// handlers (axum's 404 / 405 / 413 …).
    pub fn for_status(status: StatusCode) -> Self {
        let code = match status {
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            StatusCode::REQUEST_TIMEOUT => "request_timeout",
            s if s.is_client_error() => "bad_request",
            _ => "internal_error",
        };
        let message = status.canonical_reason().unwrap_or("error").to_lowercase();
        Self::new(status, code, message)
    }

    /// Maps an error to its HTTP form by walking its causes (see
    /// [`respond`], which also collects headers); the first cause it
    /// recognises decides. Anything unrecognised is a 500 whose causes go to
    /// the log, never the client, and never blamed on a dependency.
    pub fn from_error(err: &(dyn std::error::Error + 'static)) -> Self {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = cause {
            if let Some(api) = Self::recognise(e) {
                return api;
            }
            cause = e.source();
        }
        tracing::error!(error = %Chain(err), "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "internal error",
        )
    }

    /// The HTTP form of one error in a cause chain, if it has one of its
    /// own; `None` to look at its source.
    fn recognise(e: &(dyn std::error::Error + 'static)) -> Option<Self> {
        if let Some(api) = e.downcast_ref::<ApiError>() {
            return Some(api.clone());
        }
        if let Some(bare) = e.downcast_ref::<BareStatus>() {
            return Some(Self::from_bare(bare));
        }
        if let Some(up) = e.downcast_ref::<UpstreamError>() {
            return Self::from_upstream(up);
        }
        if let Some(bad) = e.downcast_ref::<InvalidRequest>() {
            let err = Self::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                bad.message.clone(),
            );
            return Some(match &bad.param {
                Some(param) => err.with_field(param.clone()),
                None => err,
            });
        }
        if e.is::<crate::jobs::JobStoreError>() {
            return Some(
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "job_store_unavailable",
                    "the job store is unavailable; nothing was queued, try again shortly",
                )
                .with_retry_after(Duration::from_secs(1)),
            );
        }
        if let Some(missing) = e.downcast_ref::<ModelNotFound>() {
            return Some(
                Self::new(
                    StatusCode::NOT_FOUND,
                    "model_not_found",
                    format!(
                        "The model `{}` does not exist or you do not have access to it.",
                        missing.model
                    ),
                )
                .with_field("model"),
            );
        }
        if let Some(rl) = e.downcast_ref::<RateLimited>() {
            return Some(Self::rate_limited(rl));
        }
        if let Some(u) = e.downcast_ref::<LimiterUnavailable>() {
            return Some(
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "limiter_unavailable",
                    "the rate-limit store is unavailable; try again shortly",
                )
                .with_retry_after(u.retry_after),
            );
        }
        if let Some(id) = e.downcast_ref::<IdentityError>() {
            return Some(match id {
                IdentityError::Unidentified(_) => Self::new(
                    StatusCode::BAD_REQUEST,
                    "unidentified_client",
                    id.to_string(),
                ),
                _ => Self::new(StatusCode::UNAUTHORIZED, "unauthorized", id.to_string()),
            });
        }
        if let Some(full) = e.downcast_ref::<TenantQueueFull>() {
            return Some(
                Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "tenant_queue_full",
                    format!(
                        "your queue for {} is full; requests beyond your share wait only up to max_wait",
                        full.dependency
                    ),
                )
                .with("dependency", full.dependency)
                .with_retry_after(full.retry_after),
            );
        }
        if let Some(o) = e.downcast_ref::<Overloaded>() {
            return Some(
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "overloaded",
                    format!(
                        "{} is saturated for every tenant; try again shortly",
                        o.dependency
                    ),
                )
                .with("dependency", o.dependency)
                .with_retry_after(o.retry_after),
            );
        }
        // The resilience layers' own errors, when they reach us without a
        // client wrapper around them.
        if let Some(open) = e.downcast_ref::<CircuitOpen>() {
            return Some(Self::unavailable(open.dependency, open.retry_after));
        }
        if let Some(full) = e.downcast_ref::<BulkheadFull>() {
            return Some(Self::busy(full.dependency));
        }
        if let Some(t) = e.downcast_ref::<Elapsed>() {
            return Some(Self::timeout(t.dependency));
        }
        if let Some(t) = e.downcast_ref::<DeadlineExceeded>() {
            return Some(Self::timeout(t.dependency));
        }
        None
    }

    fn rate_limited(rl: &RateLimited) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "rate limit exceeded ({} {} limit of tier {})",
                rl.layer.as_str(),
                rl.scope,
                rl.tier
            ),
        )
        .with("layer", rl.layer.as_str())
        .with("scope", rl.scope)
        .with("tier", rl.tier.clone())
        .with_retry_after(rl.retry_after)
    }

    fn from_bare(bare: &BareStatus) -> Self {
        let mut err = Self::for_status(bare.status);
        if bare.status == StatusCode::METHOD_NOT_ALLOWED {
            err.message = format!("{} is not allowed on {}", bare.method, bare.path);
        }
        err
    }

    fn unavailable(dep: impl std::fmt::Display, retry_after: Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "dependency_unavailable",
            format!("{dep} is unavailable (circuit open); not called"),
        )
        .with("dependency", dep.to_string())
        .with_retry_after(retry_after)
    }

    fn busy(dep: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "dependency_busy",
            format!("too many calls to {dep} in flight; not called"),
        )
        .with("dependency", dep.to_string())
        .with_retry_after(Duration::from_secs(1))
    }

    fn timeout(dep: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "dependency_timeout",
            format!("{dep} did not answer in time"),
        )
    }

    /// `None` for an internal error: its source decides (and, unknown,
    /// makes it a 500, not the dependency's fault).
    fn from_upstream(err: &UpstreamError) -> Option<Self> {
        let dep = err.dependency;
        Some(match &err.kind {
            UpstreamErrorKind::Internal | UpstreamErrorKind::NotAdmitted => return None,
            UpstreamErrorKind::Timeout => Self::timeout(dep),
            UpstreamErrorKind::Status {
                status,
                retry_after,
            } => {
                let e = Self::new(
                    StatusCode::BAD_GATEWAY,
                    "dependency_failed",
                    format!("{dep} answered {status}"),
                );
                match retry_after {
                    Some(wait) => e.with_retry_after(*wait),
                    None => e,
                }
            }
            UpstreamErrorKind::Unavailable { retry_after } => Self::unavailable(dep, *retry_after),
            UpstreamErrorKind::Busy => Self::busy(dep),
            kind @ (UpstreamErrorKind::Connect | UpstreamErrorKind::Protocol(_)) => Self::new(
                StatusCode::BAD_GATEWAY,
                "dependency_failed",
                format!("{dep}: {kind}"),
            ),
        })
    }
}

/// A bare error status produced outside our handlers (axum's 405, a
/// body-limit 413 …), on its way through the one error path.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status} for {method} {path}")]
pub struct BareStatus {
    /// The status axum answered.
    pub status: StatusCode,
    /// The request's method.
    pub method: http::Method,
    /// The request's path.
    pub path: String,
}

/// An error and its causes on one line, for the log.
struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

/// The shape errors take on a route: Levee's own, or OpenAI's on the
/// OpenAI-compatible routes, where the SDKs read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `{"error": code, "message": …}`.
    Levee,
    /// `{"error": {"message", "type", "param", "code"}}`, with 400 for
    /// every invalid body (OpenAI has no 422).
    OpenAi,
}

impl Dialect {
    /// The dialect of the routes under `path`.
    pub fn for_path(path: &str) -> Self {
        let openai = ["/v1/chat/completions", "/v1/embeddings", "/v1/models"]
            .iter()
            .any(|p| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')));
        if openai {
            Self::OpenAi
        } else {
            Self::Levee
        }
    }
}

/// The one error path: every error a layer or a handler produces becomes
/// its response here. The status, code and body come from the first cause
/// [`ApiError::from_error`] recognises; headers that travel with the error
/// (the rate-limit fields of a [`Rejection`]) are added.
pub fn respond(err: &(dyn std::error::Error + 'static)) -> Response {
    respond_as(Dialect::Levee, err)
}

/// [`respond`] in `dialect`.
pub fn respond_as(dialect: Dialect, err: &(dyn std::error::Error + 'static)) -> Response {
    let api = ApiError::from_error(err);
    let mut resp = match dialect {
        Dialect::Levee => api.into_response(),
        Dialect::OpenAi => api.into_openai_response(),
    };
    let mut cause = Some(err);
    while let Some(e) = cause {
        if let Some(r) = e.downcast_ref::<Rejection>() {
            resp.headers_mut().extend(r.headers.clone());
        }
        cause = e.source();
    }
    resp
}

/// [`respond`] for the errors the middleware stack returns (the identity
/// and rate-limit layers), as axum's `HandleErrorLayer` wants it, in the
/// dialect of the request's route.
pub async fn rescue(uri: http::Uri, err: BoxError) -> Response {
    respond_as(Dialect::for_path(uri.path()), err.as_ref())
}

/// A handler's error on an OpenAI-compatible route.
#[derive(Debug)]
pub struct OpenAiFailure(pub BoxError);

impl<E: Into<BoxError>> From<E> for OpenAiFailure {
    fn from(err: E) -> Self {
        Self(err.into())
    }
}

impl IntoResponse for OpenAiFailure {
    fn into_response(self) -> Response {
        respond_as(Dialect::OpenAi, self.0.as_ref())
    }
}

/// A handler's error: anything, answered through [`respond`].
#[derive(Debug)]
pub struct Failure(pub BoxError);

impl<E: Into<BoxError>> From<E> for Failure {
    fn from(err: E) -> Self {
        Self(err.into())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        respond(self.0.as_ref())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: self.code,
            message: &self.message,
            field: self.field.as_deref(),
            retry_after_s: self.retry_after,
            extra: &self.extra,
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// OpenAI's error body, on the OpenAI-compatible routes (the schema in
/// `/openapi.json` is derived from it).
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = OpenAiError)]
pub(super) struct OpenAiBody<'a> {
    /// The error.
    #[schema(inline)]
    error: OpenAiInner<'a>,
}

/// The inside of OpenAI's error body.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct OpenAiInner<'a> {
    /// Human-readable explanation.
    message: &'a str,
    /// `invalid_request_error`, `requests`, `tokens` or `server_error`.
    #[serde(rename = "type")]
    kind: &'static str,
    /// The body parameter at fault, if one is.
    param: Option<&'a str>,
    /// Stable code (`invalid_api_key`, `rate_limit_exceeded`,
    /// `model_not_found` …); `null` in a deployment's own error passed
    /// through.
    #[schema(value_type = Option<String>, required = true)]
    code: &'a str,
}

impl ApiError {
    /// OpenAI's `type` for this error: what the SDKs and their users
    /// match on besides the status.
    fn openai_type(&self) -> &'static str {
        match (self.status.as_u16(), self.code) {
            (429, _) if self.extra.get("layer").and_then(|l| l.as_str()) == Some("tokens") => {
                "tokens"
            }
            (429, _) => "requests",
            (s, _) if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// OpenAI's `code`, where it has one for the case; else Levee's.
    fn openai_code(&self) -> &'static str {
        match self.code {
            "unauthorized" => "invalid_api_key",
            "rate_limited" => "rate_limit_exceeded",
            other => other,
        }
    }

    /// The error in OpenAI's shape.
    pub fn into_openai_response(self) -> Response {
        // OpenAI answers every invalid body with 400.
        let status = if self.status == StatusCode::UNPROCESSABLE_ENTITY {
            StatusCode::BAD_REQUEST
        } else {
            self.status
        };
        let body = OpenAiBody {
            error: OpenAiInner {
                message: &self.message,
                kind: self.openai_type(),
                param: self.field.as_deref(),
                code: self.openai_code(),
            },
        };
        let mut resp = (status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// A limiter refusal leaves through the one path like every error.
impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        respond(&self)
    }
}

/// The [`BodyTimeout`](super::BodyTimeout) behind a failed body read, if
/// that is why it failed.
pub(super) fn body_timeout(err: &(dyn std::error::Error + 'static)) -> Option<super::BodyTimeout> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cause {
        if let Some(t) = e.downcast_ref::<super::BodyTimeout>() {
            return Some(*t);
        }
        cause = e.source();
    }
    None
}
