//! The `levee_gen_ai_*` families: requests, tokens, time to first token
//! and time per output token, per model and deployment. Both labels are
//! bounded by the config: a configured model's name, or `passthrough` for
//! whatever names clients send when `llm.url` serves them all, and the
//! deployment's name.

use std::time::Duration;

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};

use crate::telemetry::metrics::{counter, histogram};
use crate::telemetry::Metrics;

/// Buckets for time to first token, in seconds.
const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Buckets for time per output token, in seconds.
const TPOT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
];

/// The families, registered once into the process's registry.
#[derive(Clone)]
pub struct GenAiMetrics {
    requests: IntCounterVec,
    tokens: IntCounterVec,
    ttft: HistogramVec,
    tpot: HistogramVec,
    drains: IntCounterVec,
}

impl std::fmt::Debug for GenAiMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GenAiMetrics")
    }
}

/// How a call to a deployment ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallOutcome {
    /// Answered (a stream: to its end).
    Ok,
    /// The deployment answered the request as bad (a 4xx passed on).
    Rejected,
    /// It failed before the first byte (the next deployment was tried).
    Failed,
    /// Not called: its breaker was open or it was busy.
    Refused,
    /// A stream it broke off.
    StreamFailed,
    /// A stream whose client went away.
    Disconnected,
}

impl CallOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Rejected => "rejected",
            Self::Failed => "failed",
            Self::Refused => "refused",
            Self::StreamFailed => "stream_failed",
            Self::Disconnected => "disconnected",
        }
    }
}

impl GenAiMetrics {
    /// Registers the families into `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        let r = metrics.registry();
        Self {
            requests: counter(
                r,
                "levee_gen_ai_requests_total",
                "Calls to LLM deployments by the OpenAI-compatible API, by outcome.",
                &["operation", "model", "deployment", "outcome"],
            ),
            tokens: counter(
                r,
                "levee_gen_ai_tokens_total",
                "Tokens the deployments reported (type: input or output).",
                &["model", "deployment", "type"],
            ),
            ttft: histogram(
                r,
                "levee_gen_ai_time_to_first_token_seconds",
                "From the request's arrival to the first streamed content.",
                &["model", "deployment"],
                TTFT_BUCKETS,
            ),
            tpot: histogram(
                r,
                "levee_gen_ai_time_per_output_token_seconds",
                "Streamed generation time after the first token, per further output token.",
                &["model", "deployment"],
                TPOT_BUCKETS,
            ),
            drains: counter(
                r,
                "levee_gen_ai_stream_drains_total",
                "Streams read on after their client disconnected: settled with the real usage, or charged in full past the drain bound.",
                &["outcome"],
            ),
        }
    }

    /// The handles of one deployment of one model.
    pub(crate) fn deployment(&self, model: &str, deployment: &str) -> DeploymentMetrics {
        DeploymentMetrics {
            families: self.clone(),
            model: model.into(),
            deployment: deployment.into(),
            input: self.tokens.with_label_values(&[model, deployment, "input"]),
            output: self
                .tokens
                .with_label_values(&[model, deployment, "output"]),
            ttft: self.ttft.with_label_values(&[model, deployment]),
            tpot: self.tpot.with_label_values(&[model, deployment]),
        }
    }
}

/// One deployment's handles (resolved once, at build).
#[derive(Clone)]
pub(crate) struct DeploymentMetrics {
    families: GenAiMetrics,
    model: Box<str>,
    deployment: Box<str>,
    input: IntCounter,
    output: IntCounter,
    ttft: Histogram,
    tpot: Histogram,
}

impl DeploymentMetrics {
    pub(crate) fn call(&self, operation: &str, outcome: CallOutcome) {
        self.families
            .requests
            .with_label_values(&[operation, &self.model, &self.deployment, outcome.as_str()])
            .inc();
    }

    pub(crate) fn usage(&self, usage: crate::upstream::Usage) {
        self.input.inc_by(usage.prompt_tokens);
        self.output.inc_by(usage.completion_tokens);
    }

    pub(crate) fn first_token(&self, after: Duration) {
        self.ttft.observe(after.as_secs_f64());
    }

    /// Generation time after the first token over the tokens that
    /// followed it.
    pub(crate) fn per_output_token(&self, generating: Duration, output_tokens: u64) {
        if output_tokens > 1 {
            self.tpot
                .observe(generating.as_secs_f64() / (output_tokens - 1) as f64);
        }
    }

    pub(crate) fn drained(&self, settled: bool) {
        let outcome = if settled {
            "settled"
        } else {
            "charged_in_full"
        };
        self.families.drains.with_label_values(&[outcome]).inc();
    }
}
