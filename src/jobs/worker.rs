//! [`Workers`]: every replica's job runner. One dispatcher walks the
//! tenants in weighted round-robin (a tenant of weight w gets w turns a
//! cycle), takes a tenant's next job, and starts it only once the tenant's
//! limiter admits it; a refused job is held until the limiter's
//! `Retry-After` (its visibility clock kept fresh meanwhile), so a backlog
//! drains at exactly the tenant's rate. Jobs taken over from a crashed
//! worker wait for the limiter too. At most `jobs.workers` jobs run at
//! once.
//!
//! A job's result is stored before its delivery is acknowledged. A failure
//! worth retrying puts the job back at the end of its queue, up to
//! `max_deliveries`; then it is `dead`, with its last error. Jobs another
//! worker took and did not finish within `visibility_timeout` are taken
//! over. At shutdown the dispatcher stops taking jobs, puts back the ones
//! it held, and waits for running ones up to the drain bound (any left
//! are taken over by another replica).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use tracing::Instrument;

use super::{now_ms, Delivery, JobMetrics, JobStore, JobsConfig, Outcome, Started, Submitter};
use crate::fairness::QueuePolicies;

/// Whether a tenant's limiter lets its next job run now.
#[async_trait]
pub trait Admission: Send + Sync + 'static {
    /// `Ok` to run it; `Err(wait)` to try again after `wait`.
    async fn admit(&self, submitter: &Submitter) -> Result<(), Duration>;
}

/// How one run of a job went.
#[derive(Debug, Clone)]
pub enum Processed {
    /// The answer, as JSON text.
    Answer(String),
    /// Worth another delivery (a dependency failed).
    Retry(String),
    /// Never going to work (the request is refused as it is).
    Fail(String),
}

/// Runs a job's request (the same pipeline as a synchronous one).
#[async_trait]
pub trait Processor: Send + Sync + 'static {
    /// Runs `body` as `submitter`.
    async fn process(&self, body: &str, submitter: &Submitter) -> Processed;
}

/// The job runner of one replica.
pub struct Workers {
    store: Arc<dyn JobStore>,
    admission: Arc<dyn Admission>,
    processor: Arc<dyn Processor>,
    policies: QueuePolicies,
    config: JobsConfig,
    metrics: Option<JobMetrics>,
    consumer: String,
    http: reqwest::Client,
    /// Tenants this replica queued a job for since the dispatcher last
    /// looked, and the signal that wakes it: an idle queue answers a new
    /// job at once instead of after the poll interval (other replicas
    /// still find it by polling).
    fresh: std::sync::Mutex<Vec<String>>,
    wake: tokio::sync::Notify,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

/// A tenant as the dispatcher sees it.
struct Turn {
    tenant: String,
    /// No turn before this (limited, or empty a moment ago).
    not_before: Instant,
    /// Jobs taken (or taken over) but not yet admitted, oldest first.
    held: std::collections::VecDeque<Delivery>,
    /// When the held jobs' visibility clocks were last restarted.
    touched: Instant,
}

impl Turn {
    fn new(tenant: String) -> Self {
        Self {
            tenant,
            not_before: Instant::now(),
            held: std::collections::VecDeque::new(),
            touched: Instant::now(),
        }
    }
}

impl Workers {
    /// Workers over `store`; `consumer` names this replica in the group.
    pub fn new(
        store: Arc<dyn JobStore>,
        admission: Arc<dyn Admission>,
        processor: Arc<dyn Processor>,
        policies: QueuePolicies,
        config: JobsConfig,
    ) -> Self {
        let http = reqwest::Client::builder()
            .timeout(config.callback_timeout)
            .build()
            .unwrap_or_default();
        Self {
            store,
            admission,
            processor,
            policies,
            config,
            metrics: None,
            consumer: format!("levee-{:016x}", rand::random::<u64>()),
            http,
            fresh: std::sync::Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Records into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: JobMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn JobStore> {
        &self.store
    }

    /// Tells the dispatcher `tenant` has a new job.
    pub fn submitted(&self, tenant: &str) {
        if let Ok(mut fresh) = self.fresh.lock() {
            if !fresh.iter().any(|t| t == tenant) {
                fresh.push(tenant.to_owned());
            }
        }
        self.wake.notify_one();
    }

    /// Gives the tenants with new jobs their turn now (adding ones this
    /// replica has not seen yet).
    fn take_fresh(&self, turns: &mut Vec<Turn>, schedule: &mut Vec<usize>) {
        let fresh = match self.fresh.lock() {
            Ok(mut f) => std::mem::take(&mut *f),
            Err(_) => return,
        };
        let mut added = false;
        for tenant in fresh {
            match turns.iter_mut().find(|t| t.tenant == tenant) {
                // Not one waiting for its limiter: that wait stands.
                Some(t) if t.held.is_empty() => t.not_before = t.not_before.min(Instant::now()),
                Some(_) => {}
                None => {
                    turns.push(Turn::new(tenant));
                    added = true;
                }
            }
        }
        if added {
            self.rebuild(turns, schedule);
        }
    }

    fn rebuild(&self, turns: &[Turn], schedule: &mut Vec<usize>) {
        schedule.clear();
        for (i, t) in turns.iter().enumerate() {
            let weight = self.policies.get(&t.tenant).weight().clamp(1, 100);
            schedule.extend(std::iter::repeat_n(i, weight as usize));
        }
    }

    /// Runs until `stop` turns true, then drains within `grace`.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>, grace: Duration) {
        let slots = Arc::new(Semaphore::new(self.config.workers));
        let mut turns: Vec<Turn> = Vec::new();
        let mut schedule: Vec<usize> = Vec::new();
        let mut cursor = 0usize;
        let mut refreshed: Option<Instant> = None;
        let mut reclaimed = Instant::now();
        let poll = self.config.poll_interval;
        loop {
            if *stop.borrow() {
                break;
            }
            self.take_fresh(&mut turns, &mut schedule);
            let now = Instant::now();
            if refreshed.is_none_or(|r| now.duration_since(r) >= Duration::from_secs(1)) {
                refreshed = Some(now);
                self.refresh(&mut turns, &mut schedule).await;
            }
            if now.duration_since(reclaimed) >= self.config.visibility_timeout / 2 {
                reclaimed = now;
                for t in &mut turns {
                    self.reclaim(t).await;
                }
            }
            self.touch_held(&mut turns, now).await;
            let Some(i) = next_turn(&schedule, &turns, &mut cursor, now) else {
                let wake = turns
                    .iter()
                    .map(|t| t.not_before)
                    .min()
                    .map_or(now + poll, |w| w.max(now + Duration::from_millis(1)))
                    .min(now + poll.max(Duration::from_millis(200)));
                tokio::select! {
                    () = tokio::time::sleep_until(wake) => {}
                    () = self.wake.notified() => {}
                    _ = stop.changed() => {}
                }
                continue;
            };
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                _ = stop.changed() => continue,
            };
            let turn = &mut turns[i];
            let delivery = match turn.held.pop_front() {
                Some(d) => d,
                None => match self.store.next(&turn.tenant, &self.consumer).await {
                    Ok(Some(d)) => d,
                    Ok(None) => {
                        // A job queued here meanwhile (`submitted`) gives the
                        // tenant its turn back at once.
                        turn.not_before = Instant::now() + poll;
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the job queue");
                        turn.not_before = Instant::now() + Duration::from_secs(1);
                        continue;
                    }
                },
            };
            if let Some(submitter) = &delivery.submitter {
                if let Err(wait) = self.admission.admit(submitter).await {
                    turn.not_before = Instant::now() + wait;
                    turn.held.push_front(delivery);
                    continue;
                }
            }
            let this = self.clone();
            tokio::spawn(async move {
                this.process(delivery).await;
                drop(permit);
            });
        }
        // Put back what this replica held but never started.
        for t in &mut turns {
            while let Some(d) = t.held.pop_front() {
                if let Err(e) = self.store.requeue(&d, None).await {
                    tracing::warn!(error = %e, job = %d.id, "could not release a held job");
                }
            }
        }
        let all = u32::try_from(self.config.workers).unwrap_or(u32::MAX);
        if tokio::time::timeout(grace, slots.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!(
                "drain bound reached with jobs still running; other replicas take them over"
            );
        }
    }

    async fn refresh(&self, turns: &mut Vec<Turn>, schedule: &mut Vec<usize>) {
        let tenants = match self.store.tenants().await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list job tenants");
                return;
            }
        };
        for tenant in tenants {
            if !turns.iter().any(|t| t.tenant == tenant) {
                turns.push(Turn::new(tenant));
            }
        }
        self.rebuild(turns, schedule);
        if let Some(m) = &self.metrics {
            for t in turns.iter() {
                if let Ok((depth, oldest)) = self.store.depth(&t.tenant).await {
                    m.sample(&t.tenant, depth, oldest);
                }
            }
        }
    }

    /// Takes over the jobs of `turn`'s tenant another worker left
    /// unfinished. They wait for the tenant's limiter like any other job:
    /// a take-over must not run a tenant faster than its rate.
    async fn reclaim(&self, turn: &mut Turn) {
        let idle = self.config.visibility_timeout;
        let deliveries = match self.store.reclaim(&turn.tenant, &self.consumer, idle).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reclaim jobs");
                return;
            }
        };
        for d in deliveries {
            self.count(&d.tenant, "reclaimed");
            if turn.held.iter().any(|h| h.handle == d.handle) {
                continue;
            }
            turn.held.push_back(d);
        }
    }

    /// Keeps the jobs this replica holds for their tenant's turn from
    /// being taken over while they wait (their visibility clock restarts
    /// every third of the timeout).
    async fn touch_held(&self, turns: &mut [Turn], now: Instant) {
        let every = self.config.visibility_timeout / 3;
        for t in turns.iter_mut() {
            if t.held.is_empty() || now.duration_since(t.touched) < every {
                continue;
            }
            t.touched = now;
            for d in &t.held {
                if let Err(e) = self.store.touch(d, &self.consumer).await {
                    tracing::warn!(error = %e, job = %d.id, "cannot keep a held job");
                }
            }
        }
    }

    fn count(&self, tenant: &str, outcome: &str) {
        if let Some(m) = &self.metrics {
            m.count(tenant, outcome);
        }
    }

    async fn process(&self, d: Delivery) {
        let started = match self.store.start(&d, now_ms()).await {
            Ok(Some(s)) => s,
            Ok(None) => return,
            Err(e) => {
                // Left pending: taken over after the visibility timeout.
                tracing::warn!(error = %e, job = %d.id, "cannot start a job");
                return;
            }
        };
        let span = tracing::info_span!(
            target: "levee::jobs",
            "job",
            otel.name = "job.process",
            otel.kind = "consumer",
            levee.job.id = %d.id,
            levee.job.attempt = started.attempts,
            levee.tenant = %d.tenant,
        );
        if let Some(tp) = &started.traceparent {
            crate::telemetry::propagation::add_link(&span, tp);
        }
        let outcome = if started.attempts > self.config.max_deliveries {
            // Taken over more often than allowed: it keeps killing workers.
            Outcome::Dead(format!(
                "delivered {} times without finishing",
                started.attempts - 1
            ))
        } else {
            match self
                .processor
                .process(&started.body, &started.submitter)
                .instrument(span.clone())
                .await
            {
                Processed::Answer(v) => Outcome::Succeeded(v),
                Processed::Fail(e) => Outcome::Failed(e),
                Processed::Retry(e) if started.attempts >= self.config.max_deliveries => {
                    Outcome::Dead(e)
                }
                Processed::Retry(e) => {
                    self.count(&d.tenant, "retried");
                    if let Err(err) = self.store.requeue(&d, Some(&e)).await {
                        tracing::warn!(error = %err, job = %d.id, "cannot requeue a job");
                    }
                    return;
                }
            }
        };
        self.finish(&d, &started, &outcome).await;
    }

    async fn finish(&self, d: &Delivery, started: &Started, outcome: &Outcome) {
        let mut stored = false;
        for attempt in 0..3u32 {
            match self
                .store
                .finish(d, outcome, now_ms(), self.config.result_ttl)
                .await
            {
                Ok(()) => {
                    stored = true;
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, job = %d.id, attempt, "cannot store a job's result");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
            }
        }
        if !stored {
            // Still pending: another worker runs it again after the
            // visibility timeout (at least once).
            return;
        }
        let label = match outcome {
            Outcome::Succeeded(_) => "succeeded",
            Outcome::Failed(_) => "failed",
            Outcome::Dead(_) => "dead",
        };
        self.count(&d.tenant, label);
        if let Some(m) = &self.metrics {
            let took = now_ms().saturating_sub(started.enqueued_at);
            m.finished(&d.tenant, Duration::from_millis(took));
        }
        if let Some(url) = &started.callback {
            self.callback(url, d).await;
        }
    }

    /// Delivers the stored job to its callback, with retries; the result
    /// stays fetchable whatever happens here.
    async fn callback(&self, url: &str, d: &Delivery) {
        let Ok(Some(view)) = self.store.get(&d.tenant, &d.id).await else {
            return;
        };
        for attempt in 0..self.config.callback_attempts {
            match self.http.post(url).json(&view).send().await {
                Ok(r) if r.status().is_success() => return,
                Ok(r) => {
                    tracing::warn!(job = %d.id, status = r.status().as_u16(), attempt, "callback refused");
                }
                Err(e) => {
                    tracing::warn!(job = %d.id, error = %e.without_url(), attempt, "callback failed");
                }
            }
            tokio::time::sleep(Duration::from_millis(500 << attempt.min(5))).await;
        }
        self.count(&d.tenant, "callback_failed");
    }
}

/// The next tenant in the schedule whose turn it is, from `cursor`.
fn next_turn(
    schedule: &[usize],
    turns: &[Turn],
    cursor: &mut usize,
    now: Instant,
) -> Option<usize> {
    for _ in 0..schedule.len() {
        let i = schedule[*cursor % schedule.len()];
        *cursor = (*cursor + 1) % schedule.len();
        if turns[i].not_before <= now {
            return Some(i);
        }
    }
    None
}
