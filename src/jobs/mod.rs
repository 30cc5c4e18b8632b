//! Durable per-tenant job queues: a burst is accepted now and processed
//! at the tenant's rate, and nothing accepted is lost.
//!
//! - [`JobStore`] keeps the queues and the job records: [`RedisJobStore`]
//!   (one Redis stream per tenant, one consumer group for the fleet;
//!   durable as far as Redis persistence is) or [`InProcessJobStore`]
//!   (the embedded default, lost with the process).
//! - A submission is answered 202 only after the store has written it (a
//!   Redis reply to the script that `XADD`s it).
//! - [`Workers`] (every replica runs them) read the tenants' queues in
//!   weighted round-robin, take a job only once its tenant's limiter
//!   admits it ([`Admission`]), run it ([`Processor`]) and store the result
//!   before acknowledging it. A job a crashed worker held is taken over
//!   after `visibility_timeout`; one that keeps failing ends `dead`.
//!   Result writes are first-wins, so a job taken over never ends with
//!   two results.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub mod config;
mod memory;
mod metrics;
mod redis;
mod worker;

pub use config::{JobsConfig, QueueLimits};
pub use memory::InProcessJobStore;
pub use metrics::JobMetrics;
pub use redis::RedisJobStore;
pub use worker::{Admission, Processed, Processor, Workers};

/// A job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Waiting for its tenant's turn.
    Queued,
    /// Taken by a worker.
    Running,
    /// Done; `result` holds the answer.
    Succeeded,
    /// Failed for good (a request the pipeline refuses); `error` says why.
    Failed,
    /// Failed on every one of `max_deliveries` deliveries; `error` is the
    /// last error.
    Dead,
}

impl JobStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Dead => "dead",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => Self::Queued,
            "running" => Self::Running,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            "dead" => Self::Dead,
            _ => return None,
        })
    }

    /// Whether the job is finished.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Dead)
    }
}

/// Who submitted a job, kept with it so its limits apply when it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitter {
    /// The tenant (the queue it waits in).
    pub tenant: String,
    /// The API key's id (never the key).
    pub key_id: String,
    /// The key's tier.
    pub tier: String,
    /// The client address.
    pub client_ip: std::net::IpAddr,
    /// Whether it is on an internal network.
    #[serde(default)]
    pub internal: bool,
    /// `X-User-Id`, if any.
    pub user: Option<String>,
}

/// A job to queue.
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Its id.
    pub id: String,
    /// Who submitted it.
    pub submitter: Submitter,
    /// The request body (a `/v1/chat` body), as validated.
    pub body: String,
    /// Where to deliver the result, if anywhere.
    pub callback: Option<String>,
    /// The submitting request's `traceparent`, for a span link.
    pub traceparent: Option<String>,
    /// The `Idempotency-Key`, if any (stored hashed).
    pub idempotency_key: Option<String>,
    /// When it was submitted (unix ms).
    pub enqueued_at: u64,
}

/// What a submission did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// Queued under this id.
    Queued(String),
    /// The `Idempotency-Key` named an earlier job: its id.
    Existing(String),
    /// The tenant's queue is at `max_queued_jobs`.
    Full,
}

/// A job as `GET /v1/jobs/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    /// Its id.
    pub job_id: String,
    /// Its state.
    pub status: JobStatus,
    /// The answer, once succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// Why it failed (the last error for `dead`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Deliveries so far.
    pub attempts: u32,
    /// RFC 3339 times.
    pub enqueued_at: String,
    /// When a worker last took it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// A job a worker took: what the store needs to finish it, and what the
/// worker needs to run it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The tenant.
    pub tenant: String,
    /// The job id.
    pub id: String,
    /// The store's handle on this delivery (a stream entry id).
    pub handle: String,
    /// Who submitted it (for its limits, before it is started).
    pub submitter: Option<Submitter>,
}

/// A started job: its record at the start of this delivery.
#[derive(Debug, Clone)]
pub struct Started {
    /// Deliveries including this one.
    pub attempts: u32,
    /// The request body.
    pub body: String,
    /// Who submitted it.
    pub submitter: Submitter,
    /// Where to deliver the result.
    pub callback: Option<String>,
    /// The submitting request's `traceparent`.
    pub traceparent: Option<String>,
    /// When it was submitted (unix ms).
    pub enqueued_at: u64,
}

/// How a job ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The answer, as JSON text.
    Succeeded(String),
    /// Failed for good.
    Failed(String),
    /// Failed on its last allowed delivery.
    Dead(String),
}

/// The store is unreachable or answered nonsense.
#[derive(Debug, Clone, thiserror::Error)]
#[error("job store unavailable: {reason}")]
pub struct JobStoreError {
    /// What went wrong (no secrets, no keys).
    pub reason: String,
}

/// The queues and records.
#[async_trait]
pub trait JobStore: Send + Sync + 'static {
    /// `redis` or `memory`.
    fn kind(&self) -> &'static str;
    /// Whether an accepted job survives this process (and, for Redis,
    /// whether it survives Redis depends on its persistence settings).
    fn durable(&self) -> bool;
    /// Queues a job, at most `max_queued` per tenant.
    async fn submit(&self, job: NewJob, max_queued: u64) -> Result<Submitted, JobStoreError>;
    /// A job of `tenant`, if it exists (any other tenant's is `None`).
    async fn get(&self, tenant: &str, id: &str) -> Result<Option<JobView>, JobStoreError>;
    /// Tenants that have ever queued a job.
    async fn tenants(&self) -> Result<Vec<String>, JobStoreError>;
    /// Takes the next queued job of `tenant` for `consumer`.
    async fn next(&self, tenant: &str, consumer: &str) -> Result<Option<Delivery>, JobStoreError>;
    /// Takes over jobs of `tenant` a worker took more than `idle` ago and
    /// did not finish.
    async fn reclaim(
        &self,
        tenant: &str,
        consumer: &str,
        idle: Duration,
    ) -> Result<Vec<Delivery>, JobStoreError>;
    /// Restarts a taken job's visibility clock (a job this worker holds
    /// for its tenant's turn is not taken over meanwhile).
    async fn touch(&self, delivery: &Delivery, consumer: &str) -> Result<(), JobStoreError>;
    /// Marks a delivery running; `None` when the job is already finished
    /// or gone (the delivery is then acknowledged).
    async fn start(&self, delivery: &Delivery, now: u64) -> Result<Option<Started>, JobStoreError>;
    /// Stores how the job ended (the first result stored wins) and
    /// acknowledges the delivery.
    async fn finish(
        &self,
        delivery: &Delivery,
        outcome: &Outcome,
        now: u64,
        ttl: Duration,
    ) -> Result<(), JobStoreError>;
    /// Puts the job back at the end of its queue (a failure to retry, or a
    /// delivery released at shutdown).
    async fn requeue(&self, delivery: &Delivery, error: Option<&str>) -> Result<(), JobStoreError>;
    /// Jobs queued or running for `tenant`, and the age of the oldest.
    async fn depth(&self, tenant: &str) -> Result<(u64, Duration), JobStoreError>;
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// RFC 3339 with milliseconds.
pub fn rfc3339(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// A fresh job id: 128 random bits.
pub fn new_id() -> String {
    format!("job_{:032x}", rand::random::<u128>())
}

/// Whether `id` could be one of ours (checked before it reaches a key).
pub fn valid_id(id: &str) -> bool {
    id.len() == 36 && id.starts_with("job_") && id[4..].bytes().all(|b| b.is_ascii_hexdigit())
}
#[cfg(test)]
mod tests;
