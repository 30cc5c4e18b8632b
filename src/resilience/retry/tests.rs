use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tower::retry::budget::TpsBudget;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};

use super::*;
use crate::resilience::breaker::CircuitOpen;
use crate::resilience::bulkhead::BulkheadFull;
use crate::resilience::testing::Recorder;
use crate::resilience::testing::{connect as connect_error, status as status_error, TestFailure};
use crate::resilience::timeout::{DeadlineExceeded, Elapsed};

const MS: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Default)]
struct Req {
    non_idempotent: bool,
    stream: StreamFlag,
}

impl Retryable for Req {
    fn retry_safe(&self) -> bool {
        !self.non_idempotent && !self.stream.has_started()
    }
}

type Reply = Result<&'static str, BoxError>;

fn status(status: u16, retry_after: Option<Duration>) -> BoxError {
    status_error(status, retry_after)
}

fn connect() -> BoxError {
    connect_error()
}

/// A client answering from a script (the last answer repeats), counting
/// calls.
fn scripted(
    script: Vec<fn() -> Reply>,
) -> (
    impl Service<Req, Response = &'static str, Error = BoxError, Future: Send> + Clone + Send,
    Arc<AtomicUsize>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let script = Arc::new(Mutex::new(VecDeque::from(script)));
    let svc = {
        let calls = calls.clone();
        service_fn(move |_req: Req| {
            calls.fetch_add(1, Ordering::SeqCst);
            let mut script = script.lock().unwrap();
            let next = if script.len() > 1 {
                script.pop_front().unwrap()
            } else {
                script[0]
            };
            std::future::ready(next())
        })
    };
    (svc, calls)
}

fn settings() -> RetrySettings {
    RetrySettings {
        max_attempts: 3,
        min_backoff: 100 * MS,
        max_backoff: Duration::from_secs(1),
        jitter: false,
        deadline: Some(Duration::from_secs(5)),
    }
}

fn retry_layer(settings: RetrySettings) -> (RetryLayer, Arc<Recorder>) {
    let rec = Arc::new(Recorder::default());
    let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 100, 1.0));
    (RetryLayer::new("llm", settings, budget, rec.clone()), rec)
}

#[tokio::test(start_paused = true)]
async fn retryable_failures_are_retried_with_exponential_backoff() {
    let (client, calls) = scripted(vec![|| Err(status(503, None)), || Err(connect()), || {
        Ok("answer")
    }]);
    let (layer, rec) = retry_layer(settings());
    let started = Instant::now();
    let answer = layer.layer(client).oneshot(Req::default()).await.unwrap();
    assert_eq!(answer, "answer");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // 100ms then 200ms (tokio's timer may round a deadline up by 1ms).
    let waited = started.elapsed();
    assert!(waited >= 300 * MS && waited <= 302 * MS, "{waited:?}");
    assert_eq!(rec.retries(), [(2, 100 * MS), (3, 200 * MS)]);
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_max_attempts_with_the_last_error() {
    let (client, calls) = scripted(vec![|| Err(status(502, None))]);
    let (layer, _) = retry_layer(settings());
    let err = layer
        .layer(client)
        .oneshot(Req::default())
        .await
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(err.to_string(), "llm: answered 502");
}

#[tokio::test(start_paused = true)]
async fn non_retryable_failures_are_returned_after_one_attempt() {
    let cases: Vec<fn() -> Reply> = vec![
        || Err(status(400, None)),
        || Err(status(500, None)),
        || {
            Err(Box::new(crate::resilience::failure::Classified::new(
                TestFailure::Protocol,
            )))
        },
        || {
            Err(Box::new(CircuitOpen {
                dependency: "llm",
                retry_after: Duration::from_secs(1),
            }))
        },
        || Err(Box::new(BulkheadFull { dependency: "llm" })),
        || {
            Err(Box::new(DeadlineExceeded {
                dependency: "llm",
                after: Duration::from_secs(1),
            }))
        },
    ];
    for case in cases {
        let (client, calls) = scripted(vec![case, || Ok("answer")]);
        let (layer, _) = retry_layer(settings());
        let err = layer
            .layer(client)
            .oneshot(Req::default())
            .await
            .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{err} must not be retried");
    }
}

#[tokio::test(start_paused = true)]
async fn attempt_timeouts_are_retried() {
    let (client, calls) = scripted(vec![
        || {
            Err(Box::new(Elapsed {
                dependency: "llm",
                after: Duration::from_secs(1),
            }))
        },
        || Ok("answer"),
    ]);
    let (layer, _) = retry_layer(settings());
    assert_eq!(
        layer.layer(client).oneshot(Req::default()).await.unwrap(),
        "answer"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_429_is_retried_after_the_upstream_retry_after_when_it_fits() {
    let (client, calls) = scripted(vec![|| Err(status(429, Some(700 * MS))), || Ok("answer")]);
    let (layer, _) = retry_layer(settings());
    let started = Instant::now();
    assert_eq!(
        layer.layer(client).oneshot(Req::default()).await.unwrap(),
        "answer"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(started.elapsed(), 700 * MS);

    // 5s is more than the 1s maximum backoff: not worth waiting for.
    let (client, calls) = scripted(vec![
        || Err(status(429, Some(Duration::from_secs(5)))),
        || Ok("answer"),
    ]);
    let (layer, _) = retry_layer(settings());
    let err = layer
        .layer(client)
        .oneshot(Req::default())
        .await
        .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(err.to_string(), "llm: answered 429");
}

#[tokio::test(start_paused = true)]
async fn a_non_idempotent_request_is_never_retried() {
    let (client, calls) = scripted(vec![|| Err(status(503, None)), || Ok("answer")]);
    let (layer, _) = retry_layer(settings());
    let req = Req {
        non_idempotent: true,
        ..Req::default()
    };
    assert!(layer.layer(client).oneshot(req).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_stream_started_is_never_retried() {
    let calls = Arc::new(AtomicUsize::new(0));
    let client = {
        let calls = calls.clone();
        service_fn(move |req: Req| {
            calls.fetch_add(1, Ordering::SeqCst);
            // The first bytes went to the client, then the stream broke.
            req.stream.mark_started();
            std::future::ready(Err::<&str, _>(connect()))
        })
    };
    let (layer, _) = retry_layer(settings());
    assert!(layer.layer(client).oneshot(Req::default()).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn no_retry_starts_when_its_backoff_would_not_fit_the_deadline() {
    let (client, calls) = scripted(vec![|| Err(status(503, None))]);
    let (layer, _) = retry_layer(RetrySettings {
        deadline: Some(250 * MS),
        ..settings()
    });
    let started = Instant::now();
    let err = layer
        .layer(client)
        .oneshot(Req::default())
        .await
        .unwrap_err();
    // Attempt 1 at 0ms, attempt 2 at 100ms; 100 + 200ms passes 250ms.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(started.elapsed(), 100 * MS);
    assert_eq!(
        err.to_string(),
        "llm: answered 503",
        "the real cause, not a timeout"
    );
}

#[tokio::test(start_paused = true)]
async fn retries_stop_when_the_budget_is_spent() {
    let (client, calls) = scripted(vec![|| Err(status(503, None))]);
    let rec = Arc::new(Recorder::default());
    // 20% of requests plus 1/s over a 10s TTL (a reserve of 10 retries).
    let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 1, 0.2));
    let instant = RetrySettings {
        min_backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
        ..settings()
    };
    let svc = RetryLayer::new("llm", instant, budget, rec.clone()).layer(client);
    for _ in 0..100 {
        assert!(svc.clone().oneshot(Req::default()).await.is_err());
    }
    let retries = calls.load(Ordering::SeqCst) - 100;
    assert!(
        (25..=30).contains(&retries),
        "retries {retries} ≤ 20% of 100 + 10"
    );
    assert_eq!(rec.retries().len(), retries);
    assert!(*rec.budget_exhausted.lock().unwrap() >= 70);
}

#[test]
fn retry_decisions_follow_the_error_kind() {
    assert_eq!(retry_decision(connect().as_ref()), RetryDecision::Retry);
    assert_eq!(
        retry_decision(status(504, None).as_ref()),
        RetryDecision::Retry
    );
    assert_eq!(
        retry_decision(status(503, Some(2 * MS)).as_ref()),
        RetryDecision::After(2 * MS)
    );
    assert_eq!(
        retry_decision(status(501, None).as_ref()),
        RetryDecision::Never
    );
    assert_eq!(
        retry_decision(status(404, None).as_ref()),
        RetryDecision::Never
    );
    let unknown: BoxError = "something else".into();
    assert_eq!(retry_decision(unknown.as_ref()), RetryDecision::Never);
}
