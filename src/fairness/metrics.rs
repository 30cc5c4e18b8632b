//! [`FairnessMetrics`]: the queue's families, registered into the one
//! registry passed in, with handles resolved per tenant label at startup
//! (tenants are bounded: configured ones, the anonymous tiers, `other`).

use std::collections::HashMap;
use std::time::Duration;

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use crate::telemetry::labels::OTHER;
use crate::telemetry::metrics::{counter, gauge, histogram};
use crate::telemetry::{Labels, Metrics};

/// Queue wait buckets (seconds): an uncontended slot to a long wait.
const WAIT_BUCKETS: &[f64] = &[
    0.0001, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// 429 `tenant_queue_full`.
    QueueFull,
    /// 503 `overloaded`.
    Overloaded,
}

/// One tenant's handles.
#[derive(Clone, Debug)]
struct TenantHandles {
    depth: IntGauge,
    wait: Histogram,
    dispatched: IntCounter,
    queue_full: IntCounter,
    overloaded: IntCounter,
}

/// The fair queue's metric handles for one dependency.
#[derive(Clone, Debug)]
pub struct FairnessMetrics {
    labels: Labels,
    tenants: HashMap<String, TenantHandles>,
}

/// The fair-queue families, registered once; each queue takes its
/// dependency's handles from them.
#[derive(Clone, Debug)]
pub struct FairnessFamilies {
    labels: Labels,
    depth: IntGaugeVec,
    wait: HistogramVec,
    dispatched: IntCounterVec,
    rejected: IntCounterVec,
}

impl FairnessFamilies {
    /// Registers the families into `metrics`' registry.
    pub fn register(metrics: &Metrics) -> Self {
        let r = metrics.registry();
        let depth = gauge(
            r,
            "levee_fair_queue_depth",
            "Requests waiting in a tenant's fair queue, by dependency and tenant.",
            &["dependency", "tenant"],
        );
        let wait = histogram(
            r,
            "levee_fair_queue_wait_seconds",
            "Time from arrival to a capacity slot in the fair queue (0 when a slot was free).",
            &["dependency", "tenant"],
            WAIT_BUCKETS,
        );
        let dispatched = counter(
            r,
            "levee_fair_queue_dispatched_total",
            "Requests given a capacity slot by the fair queue.",
            &["dependency", "tenant"],
        );
        let rejected = counter(
            r,
            "levee_fair_queue_rejected_total",
            "Requests the fair queue refused: queue_full (429) or overloaded (503).",
            &["dependency", "tenant", "reason"],
        );
        Self {
            labels: metrics.labels().clone(),
            depth,
            wait,
            dispatched,
            rejected,
        }
    }

    /// The handles of the queue in front of `dependency`; `extra_tenants`
    /// are tenant names that are not configured but bounded (the anonymous
    /// tiers).
    pub fn dependency(&self, dependency: &'static str, extra_tenants: &[&str]) -> FairnessMetrics {
        let Self {
            labels,
            depth,
            wait,
            dispatched,
            rejected,
        } = self;
        let tenants = labels
            .tenants()
            .chain(extra_tenants.iter().copied())
            .chain([OTHER])
            .map(|t| {
                let l = [dependency, t];
                let handles = TenantHandles {
                    depth: depth.with_label_values(&l),
                    wait: wait.with_label_values(&l),
                    dispatched: dispatched.with_label_values(&l),
                    queue_full: rejected.with_label_values(&[dependency, t, "queue_full"]),
                    overloaded: rejected.with_label_values(&[dependency, t, "overloaded"]),
                };
                (t.to_owned(), handles)
            })
            .collect();
        FairnessMetrics {
            labels: labels.clone(),
            tenants,
        }
    }
}

impl FairnessMetrics {
    fn handles(&self, tenant: &str) -> Option<&TenantHandles> {
        self.tenants
            .get(tenant)
            .or_else(|| self.tenants.get(self.labels.tenant(tenant)))
    }

    pub(super) fn dispatched(&self, tenant: &str, waited: Duration) {
        if let Some(h) = self.handles(tenant) {
            h.dispatched.inc();
            h.wait.observe(waited.as_secs_f64());
        }
    }

    pub(super) fn refused(&self, tenant: &str, why: Refusal) {
        if let Some(h) = self.handles(tenant) {
            match why {
                Refusal::QueueFull => h.queue_full.inc(),
                Refusal::Overloaded => h.overloaded.inc(),
            }
        }
    }

    pub(super) fn depth(&self, tenant: &str, depth: usize) {
        // Tenants outside the bounded set share `other`; its gauge then
        // shows the last of them to change, which is still bounded.
        if let Some(h) = self.handles(tenant) {
            h.depth.set(i64::try_from(depth).unwrap_or(i64::MAX));
        }
    }
}
