//! [`UpstreamMetrics`]: the upstream families, registered into the one
//! registry passed in: attempt latency by dependency and outcome, and LLM
//! tokens by tenant. Handles are resolved at registration.

use std::collections::HashMap;
use std::time::Duration;

use prometheus::{Histogram, IntCounter};

use super::{Dependency, UpstreamError, UpstreamErrorKind};
use crate::telemetry::labels::OTHER;
use crate::telemetry::metrics::{counter, histogram};
use crate::telemetry::{Labels, Metrics};

/// Upstream call latency buckets (seconds).
const UPSTREAM_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Every dependency, in index order.
const DEPENDENCIES: [Dependency; 3] = [Dependency::Llm, Dependency::VectorStore, Dependency::Redis];

/// How an upstream call ended, for `levee_upstream_duration_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpstreamOutcome {
    /// An answer was received and understood.
    Success,
    /// The dependency failed (connection, error status, bad answer).
    Error,
    /// No answer in time.
    Timeout,
}

const OUTCOMES: [UpstreamOutcome; 3] = [
    UpstreamOutcome::Success,
    UpstreamOutcome::Error,
    UpstreamOutcome::Timeout,
];

impl UpstreamOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Error => "error",
            Self::Timeout => "timeout",
        }
    }

    /// Classifies a call's result.
    pub fn of<T>(result: &Result<T, UpstreamError>) -> Self {
        match result {
            Ok(_) => Self::Success,
            Err(e) if matches!(e.kind, UpstreamErrorKind::Timeout) => Self::Timeout,
            Err(_) => Self::Error,
        }
    }
}

/// Which side of an LLM call tokens were spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// Input tokens.
    Prompt,
    /// Output tokens.
    Completion,
}

impl TokenKind {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prompt => "prompt",
            Self::Completion => "completion",
        }
    }
}

/// The upstream metric handles; cheap to clone.
#[derive(Clone, Debug)]
pub struct UpstreamMetrics {
    labels: Labels,
    /// By dependency, then outcome.
    durations: [[Histogram; 3]; 3],
    /// By tenant label: prompt, completion.
    tokens: HashMap<String, [IntCounter; 2]>,
}

impl UpstreamMetrics {
    /// Registers the families into `metrics`' registry.
    pub fn register(metrics: &Metrics) -> Self {
        let r = metrics.registry();
        let labels = metrics.labels().clone();
        let duration = histogram(
            r,
            "levee_upstream_duration_seconds",
            "Latency of one upstream attempt, by dependency and outcome (success, error, timeout).",
            &["dependency", "outcome"],
            UPSTREAM_BUCKETS,
        );
        let tokens = counter(
            r,
            "levee_llm_tokens_total",
            "LLM tokens reported by the model, by tenant and kind (prompt, completion).",
            &["tenant", "kind"],
        );
        let durations = DEPENDENCIES
            .map(|d| OUTCOMES.map(|o| duration.with_label_values(&[d.as_str(), o.as_str()])));
        let tokens = labels
            .tenants()
            .chain([OTHER])
            .map(|t| {
                let per_kind = [TokenKind::Prompt, TokenKind::Completion]
                    .map(|k| tokens.with_label_values(&[t, k.as_str()]));
                (t.to_owned(), per_kind)
            })
            .collect();
        Self {
            labels,
            durations,
            tokens,
        }
    }

    /// Records one upstream attempt.
    pub fn observe(&self, dependency: Dependency, outcome: UpstreamOutcome, elapsed: Duration) {
        let d = DEPENDENCIES
            .iter()
            .position(|x| *x == dependency)
            .unwrap_or(0);
        let o = OUTCOMES.iter().position(|x| *x == outcome).unwrap_or(0);
        self.durations[d][o].observe(elapsed.as_secs_f64());
    }

    /// Counts LLM tokens for a tenant (bounded to configured tenants).
    pub fn add_tokens(&self, tenant: &str, kind: TokenKind, tokens: u64) {
        let tenant = self.labels.tenant(tenant);
        if let Some(c) = self.tokens.get(tenant) {
            c[kind as usize].inc_by(tokens);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::telemetry::metrics::tests::value;

    #[test]
    fn unknown_tenants_share_one_label_value() {
        let metrics = Metrics::new(Labels::new(
            ["acme".to_owned(), "globex".to_owned()],
            Vec::new(),
        ));
        let m = UpstreamMetrics::register(&metrics);
        m.add_tokens("acme", TokenKind::Prompt, 10);
        m.add_tokens("globex", TokenKind::Prompt, 5);
        m.add_tokens("attacker-chosen-1", TokenKind::Completion, 3);
        m.add_tokens("attacker-chosen-2", TokenKind::Completion, 4);
        let text = metrics.encode();
        let series = |kind: &str, tenant: &str| {
            format!(r#"levee_llm_tokens_total{{kind="{kind}",tenant="{tenant}"}}"#)
        };
        assert_eq!(value(&text, &series("prompt", "acme")), Some(10.0));
        assert_eq!(value(&text, &series("prompt", "globex")), Some(5.0));
        assert_eq!(value(&text, &series("completion", "other")), Some(7.0));
        assert!(!text.contains("attacker-chosen"));
    }
}
