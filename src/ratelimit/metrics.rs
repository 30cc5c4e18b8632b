//! [`RateLimitMetrics`]: the limiter's own families, registered into the
//! one registry passed in, with every label handle resolved at startup:
//! decisions per layer and tier, keyed decisions per tenant, and the
//! store's latency and errors.

use std::collections::HashMap;
use std::time::Duration;

use prometheus::{Histogram, IntCounter, IntCounterVec};

use super::policy::Layer;
use crate::telemetry::labels::{NO_TIER, OTHER};
use crate::telemetry::metrics::{counter, histogram};
use crate::telemetry::{Labels, Metrics};

/// Limiter store latency buckets (seconds): in-process is microseconds,
/// Redis on a LAN is about a millisecond.
const STORE_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];

/// What the limiter decided for one layer of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RateLimitDecision {
    /// Every limit of the layer admitted.
    Allowed,
    /// A shadow limit would have rejected; the request was admitted.
    ShadowLimited,
    /// The store was down and the tier fails open: admitted under the local
    /// safety limit.
    FailOpen,
    /// An enforced limit rejected (429).
    Limited,
    /// The store was down and the tier fails closed (503).
    FailClosed,
}

/// Every decision, in label order.
const DECISIONS: [RateLimitDecision; 5] = [
    RateLimitDecision::Allowed,
    RateLimitDecision::ShadowLimited,
    RateLimitDecision::FailOpen,
    RateLimitDecision::Limited,
    RateLimitDecision::FailClosed,
];

/// Every layer, in index order.
const LAYERS: [Layer; 3] = [Layer::Identity, Layer::Network, Layer::Tokens];

impl RateLimitDecision {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::ShadowLimited => "shadow_limited",
            Self::FailOpen => "fail_open",
            Self::Limited => "limited",
            Self::FailClosed => "fail_closed",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One counter per decision.
type PerDecision = [IntCounter; 5];

fn per_decision(family: &IntCounterVec, prefix: &[&str]) -> PerDecision {
    DECISIONS.map(|d| {
        let mut labels = prefix.to_vec();
        labels.push(d.as_str());
        family.with_label_values(&labels)
    })
}

/// The limiter's metric handles.
#[derive(Clone, Debug)]
pub struct RateLimitMetrics {
    labels: Labels,
    /// By tier label, then layer index.
    decisions: HashMap<String, [PerDecision; 3]>,
    /// By tenant label.
    tenants: HashMap<String, PerDecision>,
    store_duration: Histogram,
    store_errors: IntCounter,
    /// Tokens settled against each tenant's budget, by tenant label.
    tokens: HashMap<String, IntCounter>,
}

impl RateLimitMetrics {
    /// Registers the limiter's families into `metrics`' registry, for a
    /// store of kind `store` (`memory` or `redis`). Every series exists at
    /// zero from the start.
    pub fn register(metrics: &Metrics, store: &str) -> Self {
        let r = metrics.registry();
        let labels = metrics.labels().clone();
        let decisions_family = counter(
            r,
            "levee_ratelimit_decisions_total",
            "Rate-limit decisions per request and layer (identity, network, tokens).",
            &["layer", "tier", "decision"],
        );
        let tenant_family = counter(
            r,
            "levee_ratelimit_tenant_decisions_total",
            "Rate-limit decisions of keyed requests, by tenant (configured tenants, else other).",
            &["tenant", "decision"],
        );
        let store_duration = histogram(
            r,
            "levee_ratelimit_store_duration_seconds",
            "Latency of one limiter store call (check or adjust), failed calls included.",
            &["store"],
            STORE_BUCKETS,
        )
        .with_label_values(&[store]);
        let store_errors = counter(
            r,
            "levee_ratelimit_store_errors_total",
            "Limiter store calls that failed (down, timed out, script error).",
            &["store"],
        )
        .with_label_values(&[store]);
        // Route policies of anonymous callers report the tier `route`.
        let tiers = labels.tiers().chain(["route", OTHER, NO_TIER]);
        let decisions = tiers
            .map(|tier| {
                let per_layer =
                    LAYERS.map(|l| per_decision(&decisions_family, &[l.as_str(), tier]));
                (tier.to_owned(), per_layer)
            })
            .collect();
        let tenants = labels
            .tenants()
            .chain([OTHER])
            .map(|t| (t.to_owned(), per_decision(&tenant_family, &[t])))
            .collect();
        let tokens_family = counter(
            r,
            "levee_ratelimit_tenant_tokens_total",
            "Tokens settled against tenant token budgets: the usage the LLM reported, or the whole reservation when it is unknown.",
            &["tenant"],
        );
        let tokens = labels
            .tenants()
            .chain([OTHER])
            .map(|t| (t.to_owned(), tokens_family.with_label_values(&[t])))
            .collect();
        Self {
            labels,
            decisions,
            tenants,
            store_duration,
            store_errors,
            tokens,
        }
    }

    /// Counts a decision of one layer of one tier.
    pub fn record_decision(&self, layer: Layer, tier: &str, decision: RateLimitDecision) {
        let tier = match tier {
            "route" => "route",
            t => self.labels.tier(Some(t)),
        };
        let li = LAYERS.iter().position(|l| *l == layer).unwrap_or(0);
        if let Some(per_layer) = self.decisions.get(tier) {
            per_layer[li][decision.index()].inc();
        }
    }

    /// Counts a keyed request's overall decision against its tenant.
    pub fn record_tenant_decision(&self, tenant: &str, decision: RateLimitDecision) {
        let tenant = self.labels.tenant(tenant);
        if let Some(c) = self.tenants.get(tenant) {
            c[decision.index()].inc();
        }
    }

    /// Counts tokens settled against `tenant`'s budget.
    pub fn record_tokens(&self, tenant: &str, tokens: u64) {
        let tenant = self.labels.tenant(tenant);
        if let Some(c) = self.tokens.get(tenant) {
            c.inc_by(tokens);
        }
    }

    /// Records one store call.
    pub fn observe_store(&self, elapsed: Duration, ok: bool) {
        self.store_duration.observe(elapsed.as_secs_f64());
        if !ok {
            self.store_errors.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::telemetry::metrics::tests::value;

    #[test]
    fn unknown_tenants_and_tiers_share_one_label_value() {
        let metrics = Metrics::new(Labels::new(["acme".to_owned()], ["API_KEY".to_owned()]));
        let m = RateLimitMetrics::register(&metrics, "memory");
        m.record_decision(Layer::Identity, "NOT_A_TIER", RateLimitDecision::Limited);
        m.record_decision(Layer::Identity, "API_KEY", RateLimitDecision::Allowed);
        m.record_tenant_decision("attacker-chosen", RateLimitDecision::Limited);
        m.record_tenant_decision("acme", RateLimitDecision::Limited);
        let text = metrics.encode();
        assert_eq!(
            value(
                &text,
                r#"levee_ratelimit_decisions_total{decision="limited",layer="identity",tier="other"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                r#"levee_ratelimit_decisions_total{decision="allowed",layer="identity",tier="API_KEY"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                r#"levee_ratelimit_tenant_decisions_total{decision="limited",tenant="other"}"#
            ),
            Some(1.0)
        );
        assert!(!text.contains("attacker-chosen"));
        assert!(!text.contains("NOT_A_TIER"));
    }
}
