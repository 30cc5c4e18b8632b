//! The `levee_jobs_*` families. `tenant` is bounded like everywhere else
//! (configured tenants, else `other`).

use std::time::Duration;

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec};

use crate::telemetry::metrics::{counter, gauge, histogram};
use crate::telemetry::{Labels, Metrics};

const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
];

/// The job families.
#[derive(Clone)]
pub struct JobMetrics {
    labels: Labels,
    jobs: IntCounterVec,
    depth: IntGaugeVec,
    oldest: prometheus::GaugeVec,
    duration: HistogramVec,
}

impl std::fmt::Debug for JobMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobMetrics")
    }
}

impl JobMetrics {
    /// Registers the families into `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        let r = metrics.registry();
        let oldest = prometheus::GaugeVec::new(
            prometheus::Opts::new(
                "levee_jobs_oldest_age_seconds",
                "Age of the oldest queued or running job, per tenant.",
            ),
            &["tenant"],
        )
        .expect("static metric definition");
        r.register(Box::new(oldest.clone()))
            .expect("each family is registered once");
        Self {
            labels: metrics.labels().clone(),
            jobs: counter(
                r,
                "levee_jobs_total",
                "Jobs by outcome: accepted, queue_full (429), succeeded, failed, dead, retried, reclaimed.",
                &["tenant", "outcome"],
            ),
            depth: gauge(
                r,
                "levee_jobs_queue_depth",
                "Jobs queued or running, per tenant (sampled by the workers).",
                &["tenant"],
            ),
            oldest,
            duration: histogram(
                r,
                "levee_jobs_duration_seconds",
                "From submission to the stored result.",
                &["tenant"],
                DURATION_BUCKETS,
            ),
        }
    }

    /// Counts one event of `tenant`'s jobs.
    pub fn count(&self, tenant: &str, outcome: &str) {
        let t = self.labels.tenant(tenant);
        self.jobs.with_label_values(&[t, outcome]).inc();
    }

    /// Records a sample of `tenant`'s queue.
    pub fn sample(&self, tenant: &str, depth: u64, oldest: Duration) {
        let t = self.labels.tenant(tenant);
        self.depth
            .with_label_values(&[t])
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
        self.oldest
            .with_label_values(&[t])
            .set(oldest.as_secs_f64());
    }

    /// Records a finished job's time from submission.
    pub fn finished(&self, tenant: &str, took: Duration) {
        let t = self.labels.tenant(tenant);
        self.duration
            .with_label_values(&[t])
            .observe(took.as_secs_f64());
    }
}
