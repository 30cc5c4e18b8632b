//! [`InProcessJobStore`]: the embedded default. The same queue semantics
//! as Redis (per-tenant FIFO, take-over after the visibility timeout,
//! first result wins) in one process's memory: not durable, which `/ready`
//! and the README say.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{
    Delivery, JobStatus, JobStore, JobStoreError, JobView, NewJob, Outcome, Started, Submitted,
};

struct Record {
    job: NewJob,
    status: JobStatus,
    attempts: u32,
    started_at: Option<u64>,
    finished_at: Option<u64>,
    result: Option<String>,
    error: Option<String>,
    expires: Option<Instant>,
}

#[derive(Default)]
struct Tenant {
    queue: VecDeque<String>,
    /// Taken, not finished: handle → (job id, taken at, consumer).
    pending: HashMap<String, (String, Instant)>,
    jobs: HashMap<String, Record>,
    idempotency: HashMap<String, String>,
    /// When finished jobs past their TTL were last dropped.
    swept: Option<Instant>,
}

/// Jobs in this process's memory.
#[derive(Default)]
pub struct InProcessJobStore {
    tenants: Mutex<HashMap<String, Tenant>>,
    seq: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for InProcessJobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcessJobStore")
    }
}

impl InProcessJobStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tenant>> {
        self.tenants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn handle(&self) -> String {
        let n = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{n}")
    }
}

/// Drops finished jobs past their TTL, at most once a second: a sweep
/// walks every record, and a submission or a poll must not.
fn expire(t: &mut Tenant) {
    let now = Instant::now();
    if t.swept
        .is_some_and(|s| now.duration_since(s) < Duration::from_secs(1))
    {
        return;
    }
    t.swept = Some(now);
    t.jobs.retain(|_, r| r.expires.is_none_or(|e| e > now));
    let jobs = &t.jobs;
    t.idempotency.retain(|_, id| jobs.contains_key(id));
}

/// Whether a record is past its TTL (for reads between sweeps).
fn live(r: &Record) -> bool {
    r.expires.is_none_or(|e| e > Instant::now())
}

#[async_trait]
impl JobStore for InProcessJobStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn durable(&self) -> bool {
        false
    }

    async fn submit(&self, job: NewJob, max_queued: u64) -> Result<Submitted, JobStoreError> {
        let mut all = self.lock();
        let t = all.entry(job.submitter.tenant.clone()).or_default();
        expire(t);
        if let Some(key) = &job.idempotency_key {
            if let Some(id) = t.idempotency.get(key) {
                if t.jobs.get(id).is_some_and(live) {
                    return Ok(Submitted::Existing(id.clone()));
                }
            }
        }
        if (t.queue.len() + t.pending.len()) as u64 >= max_queued {
            return Ok(Submitted::Full);
        }
        let id = job.id.clone();
        if let Some(key) = &job.idempotency_key {
            t.idempotency.insert(key.clone(), id.clone());
        }
        t.queue.push_back(id.clone());
        t.jobs.insert(
            id.clone(),
            Record {
                job,
                status: JobStatus::Queued,
                attempts: 0,
                started_at: None,
                finished_at: None,
                result: None,
                error: None,
                expires: None,
            },
        );
        Ok(Submitted::Queued(id))
    }

    async fn get(&self, tenant: &str, id: &str) -> Result<Option<JobView>, JobStoreError> {
        let mut all = self.lock();
        let Some(t) = all.get_mut(tenant) else {
            return Ok(None);
        };
        expire(t);
        Ok(t.jobs.get(id).filter(|r| live(r)).map(|r| JobView {
            job_id: id.to_owned(),
            status: r.status,
            result: r
                .result
                .as_deref()
                .and_then(|s| serde_json::from_str(s).ok()),
            error: r.error.clone(),
            attempts: r.attempts,
            enqueued_at: super::rfc3339(r.job.enqueued_at),
            started_at: r.started_at.map(super::rfc3339),
            finished_at: r.finished_at.map(super::rfc3339),
        }))
    }

    async fn tenants(&self) -> Result<Vec<String>, JobStoreError> {
        Ok(self.lock().keys().cloned().collect())
    }

    async fn next(&self, tenant: &str, _consumer: &str) -> Result<Option<Delivery>, JobStoreError> {
        let handle = self.handle();
        let mut all = self.lock();
        let Some(t) = all.get_mut(tenant) else {
            return Ok(None);
        };
        let Some(id) = t.queue.pop_front() else {
            return Ok(None);
        };
        t.pending
            .insert(handle.clone(), (id.clone(), Instant::now()));
        let submitter = t.jobs.get(&id).map(|r| r.job.submitter.clone());
        Ok(Some(Delivery {
            tenant: tenant.to_owned(),
            id,
            handle,
            submitter,
        }))
    }

    async fn reclaim(
        &self,
        tenant: &str,
        _consumer: &str,
        idle: Duration,
    ) -> Result<Vec<Delivery>, JobStoreError> {
        let mut all = self.lock();
        let Some(t) = all.get_mut(tenant) else {
            return Ok(Vec::new());
        };
        let now = Instant::now();
        let mut out = Vec::new();
        for (handle, (id, taken)) in &mut t.pending {
            if now.duration_since(*taken) >= idle {
                *taken = now;
                out.push(Delivery {
                    tenant: tenant.to_owned(),
                    id: id.clone(),
                    handle: handle.clone(),
                    submitter: t.jobs.get(id.as_str()).map(|r| r.job.submitter.clone()),
                });
            }
        }
        Ok(out)
    }

    async fn touch(&self, d: &Delivery, _consumer: &str) -> Result<(), JobStoreError> {
        let mut all = self.lock();
        if let Some((_, taken)) = all
            .get_mut(&d.tenant)
            .and_then(|t| t.pending.get_mut(&d.handle))
        {
            *taken = Instant::now();
        }
        Ok(())
    }

    async fn start(&self, d: &Delivery, now: u64) -> Result<Option<Started>, JobStoreError> {
        let mut all = self.lock();
        let Some(t) = all.get_mut(&d.tenant) else {
            return Ok(None);
        };
        let Some(r) = t.jobs.get_mut(&d.id) else {
            t.pending.remove(&d.handle);
            return Ok(None);
        };
        if r.status.is_terminal() {
            t.pending.remove(&d.handle);
            return Ok(None);
        }
        r.attempts += 1;
        r.status = JobStatus::Running;
        r.started_at = Some(now);
        Ok(Some(Started {
            attempts: r.attempts,
            body: r.job.body.clone(),
            submitter: r.job.submitter.clone(),
            callback: r.job.callback.clone(),
            traceparent: r.job.traceparent.clone(),
            enqueued_at: r.job.enqueued_at,
        }))
    }

    async fn finish(
        &self,
        d: &Delivery,
        outcome: &Outcome,
        now: u64,
        ttl: Duration,
    ) -> Result<(), JobStoreError> {
        let mut all = self.lock();
        let Some(t) = all.get_mut(&d.tenant) else {
            return Ok(());
        };
        t.pending.remove(&d.handle);
        if let Some(r) = t.jobs.get_mut(&d.id) {
            if !r.status.is_terminal() {
                let (status, result, error) = match outcome {
                    Outcome::Succeeded(v) => (JobStatus::Succeeded, Some(v.clone()), None),
                    Outcome::Failed(e) => (JobStatus::Failed, None, Some(e.clone())),
                    Outcome::Dead(e) => (JobStatus::Dead, None, Some(e.clone())),
                };
                r.status = status;
                r.result = result;
                r.error = error;
                r.finished_at = Some(now);
                r.expires = Some(Instant::now() + ttl);
            }
        }
        Ok(())
    }

    async fn requeue(&self, d: &Delivery, error: Option<&str>) -> Result<(), JobStoreError> {
        let mut all = self.lock();
        let Some(t) = all.get_mut(&d.tenant) else {
            return Ok(());
        };
        if t.pending.remove(&d.handle).is_none() {
            return Ok(());
        }
        if let Some(r) = t.jobs.get_mut(&d.id) {
            if r.status.is_terminal() {
                return Ok(());
            }
            r.status = JobStatus::Queued;
            if let Some(e) = error {
                r.error = Some(e.to_owned());
            }
            t.queue.push_back(d.id.clone());
        }
        Ok(())
    }

    async fn depth(&self, tenant: &str) -> Result<(u64, Duration), JobStoreError> {
        let all = self.lock();
        let Some(t) = all.get(tenant) else {
            return Ok((0, Duration::ZERO));
        };
        let depth = (t.queue.len() + t.pending.len()) as u64;
        let now = super::now_ms();
        let oldest = t
            .queue
            .iter()
            .chain(t.pending.values().map(|(id, _)| id))
            .filter_map(|id| t.jobs.get(id))
            .map(|r| r.job.enqueued_at)
            .min()
            .map_or(Duration::ZERO, |at| {
                Duration::from_millis(now.saturating_sub(at))
            });
        Ok((depth, oldest))
    }
}
