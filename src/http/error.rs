//! The error contract: every error is JSON with a stable code and a human
//! message, `{"error":"…","message":"…"}`, plus `field` or `retry_after_s`
//! where they apply. [`ApiError::from_error`] is the one place where
//! internal errors become HTTP statuses.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::identity::IdentityError;
use crate::ratelimit::{LimiterUnavailable, RateLimited, Rejection};
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

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_s: Option<u64>,
    #[serde(flatten)]
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

    /// Maps an internal error to its HTTP form by walking its causes. Only
    /// known error types get specific statuses; anything else is a 500
    /// whose details stay in the log.
    pub fn from_error(err: &(dyn std::error::Error + 'static)) -> Self {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = cause {
            if let Some(api) = e.downcast_ref::<ApiError>() {
                return api.clone();
            }
            if let Some(up) = e.downcast_ref::<UpstreamError>() {
                return Self::from_upstream(up);
            }
            if let Some(rl) = e.downcast_ref::<RateLimited>() {
                return Self::new(
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
                .with_retry_after(rl.retry_after);
            }
            if let Some(u) = e.downcast_ref::<LimiterUnavailable>() {
                return Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "limiter_unavailable",
                    "the rate-limit store is unavailable; try again shortly",
                )
                .with_retry_after(u.retry_after);
            }
            if let Some(id) = e.downcast_ref::<IdentityError>() {
                return match id {
                    IdentityError::Unidentified(_) => Self::new(
                        StatusCode::BAD_REQUEST,
                        "unidentified_client",
                        id.to_string(),
                    ),
                    _ => Self::new(StatusCode::UNAUTHORIZED, "unauthorized", id.to_string()),
                };
            }
            cause = e.source();
        }
        tracing::error!(error = %err, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "internal error",
        )
    }

    fn from_upstream(err: &UpstreamError) -> Self {
        let dep = err.dependency;
        match &err.kind {
            UpstreamErrorKind::Timeout => Self::new(
                StatusCode::GATEWAY_TIMEOUT,
                "dependency_timeout",
                format!("{dep} did not answer in time"),
            ),
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
            UpstreamErrorKind::Unavailable { retry_after } => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "dependency_unavailable",
                format!("{dep} is unavailable (circuit open); not called"),
            )
            .with("dependency", dep.as_str())
            .with_retry_after(*retry_after),
            UpstreamErrorKind::Busy => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "dependency_busy",
                format!("too many calls to {dep} in flight; not called"),
            )
            .with("dependency", dep.as_str())
            .with_retry_after(Duration::from_secs(1)),
            kind => Self::new(
                StatusCode::BAD_GATEWAY,
                "dependency_failed",
                format!("{dep}: {kind}"),
            ),
        }
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

/// A limiter refusal leaves as its mapped error plus the rate-limit
/// headers of the decision behind it.
impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let mut resp = ApiError::from_error(self.error.as_ref()).into_response();
        resp.headers_mut().extend(self.headers);
        resp
    }
}

impl From<UpstreamError> for ApiError {
    fn from(err: UpstreamError) -> Self {
        Self::from_error(&err)
    }
}
