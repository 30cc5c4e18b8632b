//! The one place API errors get their body: OpenAI's
//! `{"error":{message,type,param,code}}` for the LLM endpoints and Qdrant's
//! `{"status":{"error":..},"time":..}` for the vector store, so clients parse
//! simulated failures exactly as they would parse real ones.

use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;

/// Which upstream API a request belongs to; decides error shapes, fault
/// targets and stats counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// `POST /v1/chat/completions` and `GET /v1/models`, the LLM's API.
    Chat,
    /// `POST /v1/embeddings`.
    Embeddings,
    /// Everything under `/collections/`.
    Vector,
}

impl Api {
    /// All APIs, in the order of their fault slots.
    pub(crate) const ALL: [Api; 3] = [Api::Chat, Api::Embeddings, Api::Vector];

    /// The API serving `path`, if it is an API path at all.
    pub(crate) fn classify(path: &str) -> Option<Self> {
        // The model listing is the LLM's API surface: its faults, its counter.
        if path.starts_with("/v1/chat/") || path == "/v1/models" {
            Some(Api::Chat)
        } else if path.starts_with("/v1/embeddings") {
            Some(Api::Embeddings)
        } else if path.starts_with("/collections") {
            Some(Api::Vector)
        } else {
            None
        }
    }

    /// Index of this API's fault slot and counter.
    pub(crate) fn index(self) -> usize {
        match self {
            Api::Chat => 0,
            Api::Embeddings => 1,
            Api::Vector => 2,
        }
    }

    /// The lower-case name used in `/_faults` and `/_stats`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Embeddings => "embeddings",
            Api::Vector => "vector",
        }
    }
}

/// An error answer from one of the simulated APIs.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    api: Api,
    status: StatusCode,
    message: String,
    retry_after_s: Option<u64>,
}

impl ApiError {
    /// An error with `status` and `message`, shaped for `api`.
    pub(crate) fn new(api: Api, status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            api,
            status,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// A 400 for a request the real API would reject.
    pub(crate) fn bad_request(api: Api, message: impl Into<String>) -> Self {
        Self::new(api, StatusCode::BAD_REQUEST, message)
    }

    /// Adds a `Retry-After: seconds` header.
    pub(crate) fn retry_after(mut self, seconds: Option<u64>) -> Self {
        self.retry_after_s = seconds;
        self
    }

    fn body(&self) -> serde_json::Value {
        match self.api {
            Api::Chat | Api::Embeddings => {
                let (kind, code) = match self.status.as_u16() {
                    429 => ("requests", Some("rate_limit_exceeded")),
                    500..=599 => ("server_error", None),
                    _ => ("invalid_request_error", None),
                };
                json!({"error": {
                    "message": self.message,
                    "type": kind,
                    "param": null,
                    "code": code,
                }})
            }
            Api::Vector => json!({"status": {"error": self.message}, "time": 0.0}),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
