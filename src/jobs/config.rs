//! `[jobs]`: the asynchronous job queues (validated with the rest of the
//! file in `config`).

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// Default jobs a tenant may have queued (`max_queued_jobs`).
pub const DEFAULT_MAX_QUEUED_JOBS: u64 = 1000;
/// Default time a finished job's result is kept.
pub const DEFAULT_RESULT_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default time after which a job a worker took and did not finish is
/// taken over by another.
pub const DEFAULT_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default deliveries before a job is dead-lettered.
pub const DEFAULT_MAX_DELIVERIES: u32 = 3;
/// Default concurrent jobs per replica.
pub const DEFAULT_WORKERS: usize = 8;

/// The job queues.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct JobsConfig {
    /// Serve `POST /v1/jobs` and `Prefer: respond-async`, and run workers.
    /// Default `true`.
    pub enabled: bool,
    /// Jobs each replica processes at once. Default 8.
    pub workers: usize,
    /// Jobs a tenant may have queued or running; past it a submission is
    /// 429 `queue_full`. Default 1,000 (`ratelimit.tenants.<t>.max_queued_jobs`
    /// overrides it per tenant).
    pub max_queued_jobs: u64,
    /// How long a finished job (and an `Idempotency-Key`) is kept.
    /// Default 24 h.
    #[serde(with = "humantime_serde")]
    pub result_ttl: Duration,
    /// A job taken by a worker that has not finished it within this is
    /// taken over by another worker (a crashed replica's jobs). Default
    /// 30 s; it must exceed the longest job (`resilience.llm.deadline`).
    #[serde(with = "humantime_serde")]
    pub visibility_timeout: Duration,
    /// Deliveries before a job that keeps failing ends `dead`. Default 3.
    pub max_deliveries: u32,
    /// How long an idle worker waits before looking for work again.
    /// Default 50 ms.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Attempts to deliver a job's callback. Default 3.
    pub callback_attempts: u32,
    /// Timeout of one callback attempt. Default 5 s.
    #[serde(with = "humantime_serde")]
    pub callback_timeout: Duration,
    /// Bound on one job-store call (a submission waits for it; with
    /// `appendfsync always` that includes Redis's fsync). Default 1 s.
    #[serde(with = "humantime_serde")]
    pub store_timeout: Duration,
}

impl Default for JobsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            workers: DEFAULT_WORKERS,
            max_queued_jobs: DEFAULT_MAX_QUEUED_JOBS,
            result_ttl: DEFAULT_RESULT_TTL,
            visibility_timeout: DEFAULT_VISIBILITY_TIMEOUT,
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            poll_interval: Duration::from_millis(50),
            callback_attempts: 3,
            callback_timeout: Duration::from_secs(5),
            store_timeout: Duration::from_secs(1),
        }
    }
}

impl JobsConfig {
    /// Checks `jobs.*`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, value: String, reason: &str| {
            Err(ConfigError::invalid(format!("jobs.{key}"), value, reason))
        };
        if !(1..=1024).contains(&self.workers) {
            return bad(
                "workers",
                self.workers.to_string(),
                "must be between 1 and 1024",
            );
        }
        if self.max_queued_jobs == 0 {
            return bad("max_queued_jobs", "0".into(), "must be positive");
        }
        if self.max_deliveries == 0 {
            return bad("max_deliveries", "0".into(), "must be positive");
        }
        for (key, value) in [
            ("result_ttl", self.result_ttl),
            ("visibility_timeout", self.visibility_timeout),
            ("poll_interval", self.poll_interval),
            ("callback_timeout", self.callback_timeout),
            ("store_timeout", self.store_timeout),
        ] {
            if value.is_zero() {
                return bad(key, "0s".into(), "must be greater than zero");
            }
        }
        Ok(())
    }
}

/// How many jobs each tenant may have queued or running
/// (`ratelimit.tenants.<t>.max_queued_jobs`, else `jobs.max_queued_jobs`).
/// A shared, live-reloadable table: a submission reads one snapshot.
#[derive(Debug, Default)]
pub struct QueueLimits {
    table: arc_swap::ArcSwap<(HashMap<String, u64>, u64)>,
}

impl QueueLimits {
    /// Limits for these tenants, and `fallback` for everyone else.
    pub fn new(by_tenant: HashMap<String, u64>, fallback: u64) -> Self {
        Self {
            table: arc_swap::ArcSwap::from_pointee((by_tenant, fallback)),
        }
    }

    /// The limit of `tenant`.
    pub fn get(&self, tenant: &str) -> u64 {
        let table = self.table.load();
        table.0.get(tenant).copied().unwrap_or(table.1)
    }

    /// Puts `other`'s limits in force for the next submission on.
    pub fn replace(&self, other: &QueueLimits) {
        self.table.store(other.table.load_full());
    }
}
