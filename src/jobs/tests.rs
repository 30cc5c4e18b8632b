//! The worker loop over the in-process store, with fake admission and
//! processing, on tokio's virtual clock: weighted round-robin between
//! tenants, a refused job held until its wait is over, retries up to
//! `max_deliveries`, take-over of an abandoned delivery, and release of
//! held jobs at shutdown.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::*;
use crate::fairness::{QueuePolicies, QueuePolicy};

fn submitter(tenant: &str) -> Submitter {
    Submitter {
        tenant: tenant.into(),
        key_id: format!("{tenant}-key"),
        tier: "T".into(),
        client_ip: std::net::IpAddr::from([127, 0, 0, 1]),
        internal: true,
        user: None,
    }
}

fn job(tenant: &str, n: usize) -> NewJob {
    NewJob {
        id: format!("job_{n:032x}"),
        submitter: submitter(tenant),
        body: format!("{{\"n\":{n}}}"),
        callback: None,
        traceparent: None,
        idempotency_key: None,
        enqueued_at: now_ms(),
    }
}

/// Records the order jobs ran in; fails bodies listed in `fail`.
#[derive(Default)]
struct Recorder {
    ran: Mutex<Vec<String>>,
    at: Mutex<Vec<tokio::time::Instant>>,
    fail: Vec<String>,
}

#[async_trait]
impl Processor for Recorder {
    async fn process(&self, body: &str, s: &Submitter) -> Processed {
        self.ran
            .lock()
            .expect("lock")
            .push(format!("{}:{body}", s.tenant));
        self.at
            .lock()
            .expect("lock")
            .push(tokio::time::Instant::now());
        if self.fail.iter().any(|f| f == body) {
            Processed::Retry("upstream failed".into())
        } else {
            Processed::Answer("{\"ok\":true}".into())
        }
    }
}

/// Admits everyone, except that each tenant in `every` is admitted once
/// per that interval.
#[derive(Default)]
struct Paced {
    every: HashMap<String, Duration>,
    last: Mutex<HashMap<String, tokio::time::Instant>>,
}

#[async_trait]
impl Admission for Paced {
    async fn admit(&self, s: &Submitter) -> Result<(), Duration> {
        let Some(&every) = self.every.get(&s.tenant) else {
            return Ok(());
        };
        let now = tokio::time::Instant::now();
        let mut last = self.last.lock().expect("lock");
        match last.get(&s.tenant) {
            Some(&t) if now < t + every => Err(t + every - now),
            _ => {
                last.insert(s.tenant.clone(), now);
                Ok(())
            }
        }
    }
}

fn config() -> JobsConfig {
    JobsConfig {
        workers: 1,
        max_deliveries: 2,
        visibility_timeout: Duration::from_secs(10),
        poll_interval: Duration::from_millis(10),
        ..JobsConfig::default()
    }
}

fn policies(weights: &[(&str, u32)]) -> QueuePolicies {
    let by_tenant = weights
        .iter()
        .map(|(t, w)| {
            let p =
                QueuePolicy::try_new("test", *w, 64, Duration::from_secs(2)).expect("valid policy");
            ((*t).to_owned(), p)
        })
        .collect();
    QueuePolicies::new(by_tenant, QueuePolicy::default())
}

async fn run_until_idle(workers: Arc<Workers>, for_: Duration) {
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(workers.run(rx, Duration::from_secs(1)));
    tokio::time::sleep(for_).await;
    let _ = stop.send(true);
    task.await.expect("worker loop");
}

#[tokio::test(start_paused = true)]
async fn tenants_are_served_in_weighted_round_robin() {
    let store = Arc::new(InProcessJobStore::new());
    for n in 0..6 {
        store.submit(job("big", n), 100).await.expect("submit");
        store
            .submit(job("small", 100 + n), 100)
            .await
            .expect("submit");
    }
    let recorder = Arc::new(Recorder::default());
    let workers = Arc::new(Workers::new(
        store.clone(),
        Arc::new(Paced::default()),
        recorder.clone(),
        policies(&[("big", 2), ("small", 1)]),
        config(),
    ));
    run_until_idle(workers, Duration::from_secs(2)).await;
    let ran = recorder.ran.lock().expect("lock").clone();
    assert_eq!(ran.len(), 12, "{ran:?}");
    // While both have work, big gets two turns for each of small's.
    let first_six: Vec<&str> = ran[..6]
        .iter()
        .map(|r| r.split(':').next().unwrap_or_default())
        .collect();
    let big = first_six.iter().filter(|t| **t == "big").count();
    assert_eq!(big, 4, "{first_six:?}");
}

#[tokio::test(start_paused = true)]
async fn a_refused_job_waits_for_its_tenant_without_blocking_others() {
    let store = Arc::new(InProcessJobStore::new());
    for n in 0..3 {
        store.submit(job("slow", n), 100).await.expect("submit");
    }
    store.submit(job("fast", 50), 100).await.expect("submit");
    let recorder = Arc::new(Recorder::default());
    let admission = Paced {
        every: [("slow".to_owned(), Duration::from_secs(1))].into(),
        ..Paced::default()
    };
    let workers = Arc::new(Workers::new(
        store.clone(),
        Arc::new(admission),
        recorder.clone(),
        policies(&[]),
        config(),
    ));
    run_until_idle(workers, Duration::from_millis(2500)).await;
    let ran = recorder.ran.lock().expect("lock").clone();
    let at = recorder.at.lock().expect("lock").clone();
    // One slow job a second (t = 0, 1, 2), and the fast tenant's job is not
    // stuck behind them.
    let slow: Vec<_> = ran
        .iter()
        .zip(&at)
        .filter(|(r, _)| r.starts_with("slow"))
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(slow.len(), 3, "{ran:?}");
    for pair in slow.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_secs(1),
            "{:?}",
            pair[1] - pair[0]
        );
    }
    assert!(
        ran.iter().position(|r| r.starts_with("fast")) < Some(2),
        "{ran:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failing_job_is_retried_then_dead_and_its_error_kept() {
    let store = Arc::new(InProcessJobStore::new());
    store.submit(job("t", 1), 100).await.expect("submit");
    let recorder = Arc::new(Recorder {
        fail: vec!["{\"n\":1}".into()],
        ..Recorder::default()
    });
    let workers = Arc::new(Workers::new(
        store.clone(),
        Arc::new(Paced::default()),
        recorder.clone(),
        policies(&[]),
        config(),
    ));
    run_until_idle(workers, Duration::from_secs(1)).await;
    assert_eq!(
        recorder.ran.lock().expect("lock").len(),
        2,
        "max_deliveries = 2"
    );
    let view = store
        .get("t", &format!("job_{:032x}", 1))
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(view.status, JobStatus::Dead);
    assert_eq!(view.attempts, 2);
    assert_eq!(view.error.as_deref(), Some("upstream failed"));
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_delivery_is_taken_over_and_finished_once() {
    let store = Arc::new(InProcessJobStore::new());
    store.submit(job("t", 7), 100).await.expect("submit");
    // A worker that died after taking it (and starting it).
    let taken = store
        .next("t", "dead-worker")
        .await
        .expect("next")
        .expect("a job");
    store.start(&taken, now_ms()).await.expect("start");
    let recorder = Arc::new(Recorder::default());
    let workers = Arc::new(Workers::new(
        store.clone(),
        Arc::new(Paced::default()),
        recorder.clone(),
        policies(&[]),
        JobsConfig {
            visibility_timeout: Duration::from_secs(2),
            ..config()
        },
    ));
    run_until_idle(workers, Duration::from_secs(4)).await;
    assert_eq!(recorder.ran.lock().expect("lock").len(), 1);
    let id = format!("job_{:032x}", 7);
    let view = store.get("t", &id).await.expect("get").expect("exists");
    assert_eq!(view.status, JobStatus::Succeeded);
    assert_eq!(view.attempts, 2, "the dead worker's delivery, then ours");
    // The dead worker's late finish cannot overwrite the result.
    store
        .finish(
            &taken,
            &Outcome::Failed("late".into()),
            now_ms(),
            Duration::from_secs(60),
        )
        .await
        .expect("finish");
    let view = store.get("t", &id).await.expect("get").expect("exists");
    assert_eq!(view.status, JobStatus::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn held_jobs_go_back_to_the_queue_at_shutdown() {
    let store = Arc::new(InProcessJobStore::new());
    store.submit(job("slow", 1), 100).await.expect("submit");
    store.submit(job("slow", 2), 100).await.expect("submit");
    let admission = Paced {
        every: [("slow".to_owned(), Duration::from_secs(60))].into(),
        ..Paced::default()
    };
    let recorder = Arc::new(Recorder::default());
    let workers = Arc::new(Workers::new(
        store.clone(),
        Arc::new(admission),
        recorder.clone(),
        policies(&[]),
        config(),
    ));
    run_until_idle(workers, Duration::from_secs(1)).await;
    assert_eq!(recorder.ran.lock().expect("lock").len(), 1);
    // The second was held for its tenant's turn; now it is queued again
    // for any replica, not stuck with this one.
    let (depth, _) = store.depth("slow").await.expect("depth");
    assert_eq!(depth, 1);
    let next = store.next("slow", "other").await.expect("next");
    assert!(next.is_some(), "the held job is back in the queue");
}
