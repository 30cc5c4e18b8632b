//! One deployment: an OpenAI-compatible endpoint behind its own
//! resilience stack. A call through the stack ends when the answer's head
//! has arrived (for a stream) or its whole body (otherwise), so the
//! attempt timeout, retries and the breaker act before the first byte
//! reaches the client and never after.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;

use super::metrics::DeploymentMetrics;
use crate::resilience::{BoxError, Breaker, BreakerState, DependencyStack, Retryable};
use crate::telemetry::client::ServerAddr;
use crate::upstream::{Dependency, UpstreamError, UpstreamErrorKind};

/// One call to a deployment, owned so that a retry can resend it.
#[derive(Debug, Clone)]
pub(crate) struct Forward {
    pub(crate) method: Method,
    pub(crate) path: &'static str,
    pub(crate) body: Bytes,
    pub(crate) stream: bool,
    /// The trace context to carry upstream.
    pub(crate) headers: HeaderMap,
}

impl Retryable for Forward {
    // Nothing has reached the client before the stack's call ends (a
    // stream's call ends with its head), and completions have no side
    // effects to repeat.
    fn retry_safe(&self) -> bool {
        true
    }
}

/// What a deployment answered.
pub(crate) enum Forwarded {
    /// A whole answer: a success, or a 4xx other than 429, which is the
    /// client's to read (the deployment did its job).
    Full {
        status: StatusCode,
        content_type: Option<HeaderValue>,
        body: Bytes,
    },
    /// A stream whose head has arrived.
    Stream {
        content_type: Option<HeaderValue>,
        response: reqwest::Response,
    },
}

/// An endpoint serving a model.
pub(crate) struct Deployment {
    /// The breaker's and the metrics' name (`llm` for `llm.url`,
    /// `llm:<model>:<n>` for a configured deployment).
    pub(crate) name: &'static str,
    /// The model name sent upstream (`None`: the client's).
    pub(crate) upstream_model: Option<String>,
    pub(crate) weight: u32,
    pub(crate) server: ServerAddr,
    pub(crate) metrics: DeploymentMetrics,
    svc: BoxCloneSyncService<Forward, Forwarded, BoxError>,
    breaker: Option<Breaker>,
}

impl std::fmt::Debug for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployment")
            .field("name", &self.name)
            .field("weight", &self.weight)
            .finish_non_exhaustive()
    }
}

/// Where and how to reach a deployment.
pub struct Endpoint {
    /// Base URL, e.g. `http://127.0.0.1:9000/v1`.
    pub url: String,
    /// Its bearer token (never logged).
    pub api_key: Option<String>,
    /// The model name sent upstream (`None`: the client's).
    pub upstream_model: Option<String>,
    /// Its share of the traffic.
    pub weight: u32,
}

impl Deployment {
    pub(crate) fn new(
        endpoint: Endpoint,
        http: reqwest::Client,
        stack: &DependencyStack,
        metrics: DeploymentMetrics,
    ) -> Self {
        let base: Arc<str> = endpoint.url.trim_end_matches('/').into();
        let key: Option<Arc<str>> = endpoint.api_key.filter(|k| !k.is_empty()).map(Into::into);
        let server = ServerAddr::from_url(&endpoint.url);
        let client = tower::service_fn(move |call: Forward| {
            let http = http.clone();
            let base = base.clone();
            let key = key.clone();
            async move { send(&http, &base, key.as_deref(), call).await }
        });
        Self {
            name: stack.name(),
            upstream_model: endpoint.upstream_model,
            weight: endpoint.weight.max(1),
            server,
            metrics,
            svc: stack.wrap(client),
            breaker: stack.breaker().cloned(),
        }
    }

    /// Whether its breaker is open (a call would be refused unsent).
    pub(crate) fn is_open(&self) -> bool {
        self.breaker.as_ref().is_some_and(|b| {
            matches!(
                b.state(),
                BreakerState::Open { .. } | BreakerState::ForcedOpen
            )
        })
    }

    /// The breaker, for recording a stream that broke off after its head.
    pub(crate) fn breaker(&self) -> Option<&Breaker> {
        self.breaker.as_ref()
    }

    /// One call through the stack.
    pub(crate) async fn call(&self, call: Forward) -> Result<Forwarded, UpstreamError> {
        self.svc
            .clone()
            .oneshot(call)
            .await
            .map_err(|e| UpstreamError::from_stack(Dependency::Llm, e))
    }
}

async fn send(
    http: &reqwest::Client,
    base: &str,
    key: Option<&str>,
    call: Forward,
) -> Result<Forwarded, UpstreamError> {
    let mut req = http
        .request(call.method, format!("{base}{}", call.path))
        .headers(call.headers);
    if !call.body.is_empty() {
        req = req
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(call.body);
    }
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| UpstreamError::from_reqwest(Dependency::Llm, &e))?;
    let status = resp.status();
    tracing::Span::current().record(
        "http.response.status_code",
        crate::telemetry::client::int(status.as_u16()),
    );
    let content_type = resp.headers().get(http::header::CONTENT_TYPE).cloned();
    // 429 and 5xx are the deployment's trouble: the stack retries them,
    // the breaker counts them, and the next deployment is tried.
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        return Err(UpstreamError::new(
            Dependency::Llm,
            UpstreamErrorKind::Status {
                status: status.as_u16(),
                retry_after: crate::upstream::retry_after(resp.headers()),
            },
        ));
    }
    if call.stream && status.is_success() {
        return Ok(Forwarded::Stream {
            content_type,
            response: resp,
        });
    }
    let body = resp
        .bytes()
        .await
        .map_err(|e| UpstreamError::from_reqwest(Dependency::Llm, &e))?;
    Ok(Forwarded::Full {
        status,
        content_type,
        body,
    })
}
