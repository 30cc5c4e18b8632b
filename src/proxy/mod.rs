//! The OpenAI-compatible gateway: `/v1/chat/completions` (streamed or
//! not), `/v1/embeddings` and `/v1/models`, forwarded to the deployments
//! of the model a request names.
//!
//! - A model's deployments are tried in a weighted random order per
//!   request. One whose breaker is open is skipped unsent; one that is
//!   busy or fails before the first byte reached the client hands the
//!   request to the next. With every breaker open the answer is 503 with
//!   `Retry-After`.
//! - Each deployment sits behind its own resilience stack (the
//!   `[resilience.llm]` policy); a call through it ends with the answer's
//!   head for a stream, so nothing is retried after the first byte.
//! - A model's calls queue in its tenant fair queue (`fairness`) first,
//!   holding the slot to the end of a stream.
//! - Streams pass through [`Relay`], which settles usage however the
//!   stream ends.
//!
//! Token budgets and rate limits are the HTTP layer's: it reserves before
//! calling [`Proxy::forward`] and settles with the usage it returns (or
//! the stream's [`Settlement`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use rand::Rng;
use tokio::time::Instant;
use tracing::field::Empty;
use tracing::Instrument;

mod deployment;
mod metrics;
mod relay;
mod request;
pub mod sse;

pub use deployment::Endpoint;
pub use metrics::GenAiMetrics;
pub use relay::{DrainBound, OnEnd, Relay, Settlement, StreamEnd};
pub use request::{ApiRequest, InvalidRequest, Operation};

use deployment::{Deployment, Forward, Forwarded};
use metrics::CallOutcome;
use relay::Origin;

use crate::fairness::{FairQueue, QueuePolicies};
use crate::resilience::DependencyStack;
use crate::telemetry::propagation;
use crate::upstream::fair::{admit, within};
use crate::upstream::{Dependency, UpstreamError, UpstreamErrorKind, Usage};

/// The metrics label of the model when `llm.url` serves every name.
pub const PASSTHROUGH_MODEL: &str = "passthrough";

/// No configured model has this name.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the model `{model}` does not exist")]
pub struct ModelNotFound {
    /// The name asked for.
    pub model: String,
}

/// A model and where it is served.
#[derive(Debug)]
pub struct Model {
    /// The configured name (the metrics label).
    label: &'static str,
    deployments: Vec<Deployment>,
    queue: Option<FairQueue>,
}

/// A model being built: its deployments are added one by one.
pub struct ModelBuilder {
    label: &'static str,
    deployments: Vec<Deployment>,
    queue: Option<FairQueue>,
    metrics: GenAiMetrics,
}

impl ModelBuilder {
    /// Adds a deployment behind `stack` (its name is the deployment's).
    pub fn deployment(
        mut self,
        endpoint: Endpoint,
        http: reqwest::Client,
        stack: &DependencyStack,
    ) -> Self {
        let metrics = self.metrics.deployment(self.label, stack.name());
        self.deployments
            .push(Deployment::new(endpoint, http, stack, metrics));
        self
    }

    /// Queues calls to this model in `queue` first.
    #[must_use]
    pub fn fair_queue(mut self, queue: FairQueue) -> Self {
        self.queue = Some(queue);
        self
    }

    /// The model.
    pub fn build(self) -> Model {
        Model {
            label: self.label,
            deployments: self.deployments,
            queue: self.queue,
        }
    }
}

impl Model {
    /// A model labelled `label` (a configured name, or
    /// [`PASSTHROUGH_MODEL`]).
    pub fn builder(label: &'static str, metrics: &GenAiMetrics) -> ModelBuilder {
        ModelBuilder {
            label,
            deployments: Vec::new(),
            queue: None,
            metrics: metrics.clone(),
        }
    }

    /// `Ok` unless every deployment's breaker is open; then the refusal,
    /// with the soonest `Retry-After` (checked before anything is
    /// reserved).
    pub fn available(&self) -> Result<(), UpstreamError> {
        if self.deployments.iter().any(|d| !d.is_open()) {
            return Ok(());
        }
        Err(self.all_open())
    }

    fn all_open(&self) -> UpstreamError {
        let retry_after = self
            .deployments
            .iter()
            .filter_map(|d| d.breaker())
            .filter_map(|b| b.permit().err())
            .map(|open| open.retry_after)
            .min()
            .unwrap_or(Duration::from_secs(1));
        UpstreamError::new(
            Dependency::Llm,
            UpstreamErrorKind::Unavailable { retry_after },
        )
    }

    /// The deployments in the order this request tries them: a weighted
    /// random draw without replacement, so traffic splits by weight and a
    /// fallback goes to the next by weight.
    fn order(&self) -> Vec<&Deployment> {
        let mut left: Vec<&Deployment> = self.deployments.iter().collect();
        if left.len() < 2 {
            return left;
        }
        let mut rng = rand::rng();
        let mut order = Vec::with_capacity(left.len());
        while !left.is_empty() {
            let total: u64 = left.iter().map(|d| u64::from(d.weight)).sum();
            let mut pick = rng.random_range(0..total);
            let mut at = 0;
            for (i, d) in left.iter().enumerate() {
                let w = u64::from(d.weight);
                if pick < w {
                    at = i;
                    break;
                }
                pick -= w;
            }
            order.push(left.swap_remove(at));
        }
        order
    }
}

/// What a deployment answered, on its way to the client.
#[derive(Debug)]
pub struct Reply {
    /// The status to answer.
    pub status: StatusCode,
    /// The deployment's `Content-Type`.
    pub content_type: Option<HeaderValue>,
    /// The deployment that answered.
    pub deployment: &'static str,
    /// The body.
    pub body: ReplyBody,
}

/// A whole body, or a stream.
#[derive(Debug)]
pub enum ReplyBody {
    /// A whole answer and the usage it reported.
    Full {
        /// The bytes, as the deployment sent them.
        bytes: Bytes,
        /// Its usage (`None`: an error body, or none reported).
        usage: Option<Usage>,
    },
    /// A stream, settled through the `OnEnd` given to
    /// [`Proxy::forward`].
    Stream(Box<Relay>),
}

/// The models, and how calls to them are bounded.
#[derive(Debug)]
pub struct Proxy {
    models: HashMap<String, Arc<Model>>,
    /// Configured names in config order, for `GET /v1/models`.
    names: Vec<String>,
    /// `llm.url` alone: serves every model name as it is.
    passthrough: Option<Arc<Model>>,
    policies: QueuePolicies,
    /// Bounds the fair-queue wait plus the calls.
    deadline: Duration,
    /// The longest silence of a stream before it counts as broken off.
    idle: Duration,
    drain: DrainBound,
    created: u64,
}

/// How calls are bounded.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// The fair-queue wait plus the whole call.
    pub deadline: Duration,
    /// A stream's longest silence.
    pub idle: Duration,
    /// Reading a stream on after its client went away.
    pub drain: DrainBound,
}

impl Proxy {
    /// The configured `models` (in order), or a passthrough model.
    pub fn new(
        models: Vec<(String, Model)>,
        passthrough: Option<Model>,
        policies: QueuePolicies,
        bounds: Bounds,
    ) -> Self {
        let names = models.iter().map(|(n, _)| n.clone()).collect();
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self {
            models: models.into_iter().map(|(n, m)| (n, Arc::new(m))).collect(),
            names,
            passthrough: passthrough.map(Arc::new),
            policies,
            deadline: bounds.deadline,
            idle: bounds.idle,
            drain: bounds.drain,
            created,
        }
    }

    /// Whether any model is served (else the routes answer 404).
    pub fn is_empty(&self) -> bool {
        self.models.is_empty() && self.passthrough.is_none()
    }

    /// The model a request names.
    pub fn model(&self, name: &str) -> Result<Arc<Model>, ModelNotFound> {
        if let Some(m) = self.models.get(name) {
            return Ok(m.clone());
        }
        self.passthrough.clone().ok_or_else(|| ModelNotFound {
            model: name.to_owned(),
        })
    }

    /// `GET /v1/models` of the configured models; `None` in passthrough
    /// mode, where the deployment's own list is forwarded.
    pub fn listed(&self) -> Option<serde_json::Value> {
        if self.passthrough.is_some() && self.names.is_empty() {
            return None;
        }
        let data: Vec<_> = self
            .names
            .iter()
            .map(|n| {
                serde_json::json!({
                    "id": n, "object": "model", "created": self.created, "owned_by": "levee",
                })
            })
            .collect();
        Some(serde_json::json!({ "object": "list", "data": data }))
    }

    /// Forwards `GET /models` to the passthrough deployment.
    pub async fn list_upstream(&self) -> Result<Reply, UpstreamError> {
        let model = self
            .passthrough
            .clone()
            .ok_or_else(|| UpstreamError::new(Dependency::Llm, UpstreamErrorKind::Internal))?;
        let call = Forward {
            method: Method::GET,
            path: "/models",
            body: Bytes::new(),
            stream: false,
            headers: trace_headers(),
        };
        let mut last = None;
        for d in model.order() {
            if d.is_open() {
                continue;
            }
            match d.call(call.clone()).await {
                Ok(Forwarded::Full {
                    status,
                    content_type,
                    body,
                }) => {
                    return Ok(Reply {
                        status,
                        content_type,
                        deployment: d.name,
                        body: ReplyBody::Full {
                            bytes: body,
                            usage: None,
                        },
                    })
                }
                Ok(Forwarded::Stream { .. }) => {}
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| model.all_open()))
    }

    /// Forwards `request` to `model`'s deployments in their order for
    /// this request, after `tenant`'s turn in the fair queue; `estimate`
    /// is the call's token estimate, `arrived` when the request came in.
    /// A stream is settled through `on_end` when it ends; a whole answer
    /// returns its usage.
    pub async fn forward(
        &self,
        model: &Model,
        request: &ApiRequest,
        tenant: &str,
        estimate: u64,
        arrived: Instant,
        on_end: OnEnd,
    ) -> Result<Reply, UpstreamError> {
        // Every breaker open: refuse without a place in the queue.
        model.available()?;
        let deadline = arrived + self.deadline;
        let mut permit = match &model.queue {
            Some(queue) => {
                let policy = self.policies.get(tenant);
                let dependency = Dependency::Llm;
                Some(admit(queue, policy, tenant, estimate, deadline, dependency).await?)
            }
            None => None,
        };
        let operation = request.operation();
        let mut last: Option<UpstreamError> = None;
        for d in model.order() {
            if d.is_open() {
                d.metrics.call(operation.as_str(), CallOutcome::Refused);
                continue;
            }
            let span = gen_ai_span(operation, request, d, model.label);
            let call = Forward {
                method: Method::POST,
                path: operation.path(),
                body: request.upstream_body(d.upstream_model.as_deref()),
                stream: request.stream(),
                headers: span.in_scope(trace_headers),
            };
            let attempt = d.call(call).instrument(span.clone());
            let result = within(deadline, self.deadline, Dependency::Llm, attempt).await;
            match result {
                Ok(Forwarded::Full {
                    status,
                    content_type,
                    body,
                }) => {
                    let usage = status.is_success().then(|| usage_of(&body)).flatten();
                    let outcome = if status.is_success() {
                        CallOutcome::Ok
                    } else {
                        CallOutcome::Rejected
                    };
                    d.metrics.call(operation.as_str(), outcome);
                    if let Some(u) = usage {
                        d.metrics.usage(u);
                        span.record("gen_ai.usage.input_tokens", u.prompt_tokens);
                        span.record("gen_ai.usage.output_tokens", u.completion_tokens);
                    }
                    if let Some(p) = permit.as_mut() {
                        p.settle(usage.map_or(0, |u| u.prompt_tokens + u.completion_tokens));
                    }
                    return Ok(Reply {
                        status,
                        content_type,
                        deployment: d.name,
                        body: ReplyBody::Full { bytes: body, usage },
                    });
                }
                Ok(Forwarded::Stream {
                    content_type,
                    response,
                }) => {
                    let mut origin = Origin::new(d, operation.as_str(), arrived);
                    origin.span = span;
                    let relay = Relay::new(
                        response,
                        !request.include_usage(),
                        self.idle,
                        self.drain,
                        permit.take(),
                        on_end,
                        origin,
                    );
                    return Ok(Reply {
                        status: StatusCode::OK,
                        content_type,
                        deployment: d.name,
                        body: ReplyBody::Stream(Box::new(relay)),
                    });
                }
                Err(e) => {
                    let outcome = if e.is_refusal() {
                        CallOutcome::Refused
                    } else {
                        CallOutcome::Failed
                    };
                    d.metrics.call(operation.as_str(), outcome);
                    span.record("error.type", error_type(&e));
                    tracing::warn!(deployment = d.name, error = %e, "deployment failed; trying the next");
                    let out_of_time = Instant::now() >= deadline;
                    last = Some(e);
                    if out_of_time {
                        break;
                    }
                }
            }
        }
        if let Some(p) = permit.as_mut() {
            p.settle(0);
        }
        Err(match last {
            // Every deployment refused unsent: 503 with the soonest
            // Retry-After, as if their breakers had been open up front.
            Some(e) if e.is_refusal() => match model.available() {
                Ok(()) => e,
                Err(open) => open,
            },
            Some(e) => e,
            None => model.all_open(),
        })
    }
}

fn error_type(e: &UpstreamError) -> &'static str {
    match e.kind {
        UpstreamErrorKind::Connect => "connect",
        UpstreamErrorKind::Timeout => "timeout",
        UpstreamErrorKind::Status { .. } => "status",
        UpstreamErrorKind::Protocol(_) => "protocol",
        UpstreamErrorKind::Unavailable { .. } => "circuit_open",
        UpstreamErrorKind::Busy => "busy",
        UpstreamErrorKind::Internal => "internal",
        UpstreamErrorKind::NotAdmitted => "not_admitted",
    }
}

/// The current trace context as headers for the upstream.
fn trace_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    propagation::inject_current(&mut headers);
    headers
}

/// The usage of a whole answer.
fn usage_of(body: &[u8]) -> Option<Usage> {
    #[derive(serde::Deserialize)]
    struct Body {
        usage: Option<sse::WireUsage>,
    }
    serde_json::from_slice::<Body>(body)
        .ok()?
        .usage
        .map(Usage::from)
}

/// A CLIENT span for one call to a deployment (`chat {model}`), which a
/// stream keeps open to its end.
fn gen_ai_span(
    operation: Operation,
    request: &ApiRequest,
    d: &Deployment,
    label: &str,
) -> tracing::Span {
    let upstream_model = d.upstream_model.as_deref().unwrap_or(request.model());
    tracing::info_span!(
        target: "levee::upstream",
        "llm",
        otel.name = %format!("{} {}", operation.as_str(), request.model()),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.system = "openai",
        gen_ai.operation.name = operation.as_str(),
        gen_ai.request.model = %upstream_model,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        levee.model = label,
        levee.deployment = d.name,
        levee.stream = request.stream(),
        server.address = %d.server.host,
        server.port = crate::telemetry::client::int(d.server.port),
        http.response.status_code = Empty,
        error.type = Empty,
        levee.dependency = "llm",
    )
}
