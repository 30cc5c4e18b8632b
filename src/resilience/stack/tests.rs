use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower::{service_fn, ServiceExt};

use super::*;
use crate::resilience::testing::{Recorder, TestFailure};
use crate::resilience::{
    BreakerConfig, BreakerPolicyKind, BreakerState, BulkheadConfig, CircuitOpen, DeadlineExceeded,
    Elapsed, RetryConfig, StateKind,
};

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
struct Req;

impl Retryable for Req {
    fn retry_safe(&self) -> bool {
        true
    }
}

fn policy(deadline: Duration, max_attempts: u32) -> DependencyPolicy {
    DependencyPolicy {
        deadline,
        attempt_timeout: SEC,
        retry: RetryConfig {
            enabled: true,
            max_attempts,
            min_backoff: 100 * MS,
            max_backoff: SEC,
            jitter: false,
            budget_ratio: 0.2,
            budget_min_per_sec: 10,
        },
        breaker: BreakerConfig {
            enabled: true,
            policy: BreakerPolicyKind::Consecutive,
            consecutive_failures: 3,
            min_open: 5 * SEC,
            max_open: 60 * SEC,
            open_jitter: 0.0,
            half_open_probes: 1,
            ..BreakerConfig::default()
        },
        bulkhead: BulkheadConfig {
            enabled: true,
            max_concurrent: 4,
        },
    }
}

/// A client that never answers, counting calls.
fn hanging() -> (
    impl tower::Service<Req, Response = (), Error = TestFailure, Future: Send> + Clone + Send + Sync,
    Arc<AtomicUsize>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = {
        let calls = calls.clone();
        service_fn(move |Req| {
            calls.fetch_add(1, Ordering::SeqCst);
            async {
                std::future::pending::<()>().await;
                Ok::<(), TestFailure>(())
            }
        })
    };
    (svc, calls)
}

#[tokio::test(start_paused = true)]
async fn every_timed_out_attempt_of_a_retried_call_counts_in_the_breaker() {
    let rec = Arc::new(Recorder::default());
    let stack = DependencyStack::new("llm", policy(10 * SEC, 3), rec.clone()).unwrap();
    let (client, calls) = hanging();
    let started = Instant::now();
    let err = stack.wrap(client).oneshot(Req).await.unwrap_err();

    assert!(err.is::<Elapsed>(), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // 3 attempts of 1s with 100ms and 200ms backoff between them.
    // (tokio's timer may round a deadline up by 1ms)
    let waited = started.elapsed();
    assert!(waited >= 3300 * MS && waited <= 3303 * MS, "{waited:?}");
    let breaker = stack.breaker().unwrap();
    assert_eq!(breaker.snapshot().counts.failures, 3);
    assert_eq!(
        breaker.state().kind(),
        StateKind::Open,
        "3 consecutive failures"
    );
    assert_eq!(rec.retries().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_whole_retry_group() {
    let stack =
        DependencyStack::new("llm", policy(2500 * MS, 5), Arc::new(Recorder::default())).unwrap();
    let (client, calls) = hanging();
    let started = Instant::now();
    let err = stack.wrap(client).oneshot(Req).await.unwrap_err();

    let exceeded = err
        .downcast_ref::<DeadlineExceeded>()
        .expect("DeadlineExceeded");
    assert_eq!(exceeded.after, 2500 * MS);
    assert_eq!(started.elapsed(), 2500 * MS);
    // Attempts at 0s, 1.1s and 2.3s; the third is cut by the deadline.
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let counts = stack.breaker().unwrap().snapshot().counts;
    assert_eq!(
        (counts.failures, counts.ignored),
        (2, 0),
        "the cancelled attempt counts as nothing"
    );
    assert_eq!(stack.breaker().unwrap().state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_answers_at_once_and_is_not_retried() {
    let rec = Arc::new(Recorder::default());
    let stack = DependencyStack::new("vector_store", policy(10 * SEC, 3), rec.clone()).unwrap();
    stack.breaker().unwrap().force_open();
    let (client, calls) = hanging();
    let started = Instant::now();
    let err = stack.wrap(client).oneshot(Req).await.unwrap_err();

    let open = err.downcast_ref::<CircuitOpen>().expect("CircuitOpen");
    assert_eq!(open.dependency, "vector_store");
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(rec.retries().is_empty());
}

#[tokio::test(start_paused = true)]
async fn services_wrapped_by_one_stack_share_its_breaker() {
    let mut p = policy(10 * SEC, 1);
    p.breaker.consecutive_failures = 1;
    let stack = DependencyStack::new("llm", p, Arc::new(Recorder::default())).unwrap();
    let (hang, _) = hanging();
    let (other, other_calls) = hanging();
    assert!(stack.wrap(hang).oneshot(Req).await.is_err());
    let err = stack.wrap(other).oneshot(Req).await.unwrap_err();
    assert!(err.is::<CircuitOpen>());
    assert_eq!(other_calls.load(Ordering::SeqCst), 0);
}

#[test]
fn an_invalid_policy_is_refused_naming_the_key() {
    let mut p = policy(SEC, 3);
    p.breaker.failure_rate = 1.5;
    let err = DependencyStack::new("llm", p, Arc::new(Recorder::default())).unwrap_err();
    assert_eq!(err.key(), "resilience.llm.breaker.failure_rate");
}

#[tokio::test(start_paused = true)]
async fn client_errors_are_judged_by_their_class_through_the_stack() {
    let mut p = policy(10 * SEC, 3);
    p.breaker.consecutive_failures = 2;
    let rec = Arc::new(Recorder::default());
    let stack = DependencyStack::new("llm", p, rec.clone()).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let not_found = {
        let calls = calls.clone();
        service_fn(move |Req| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(TestFailure::Status(404, None)) }
        })
    };
    for _ in 0..5 {
        let err = stack
            .wrap(not_found.clone())
            .oneshot(Req)
            .await
            .unwrap_err();
        // The caller gets the client's own error back, under its tag.
        let source = Classified::into_source(err);
        assert!(source.is::<TestFailure>(), "{source}");
    }
    // A 404 is the caller's fault: never retried, never a breaker failure.
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(stack.breaker().unwrap().state(), BreakerState::Closed);
    assert_eq!(stack.breaker().unwrap().snapshot().counts.failures, 0);

    let busy = {
        let calls = calls.clone();
        service_fn(move |Req| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(TestFailure::Status(503, None)) }
        })
    };
    calls.store(0, Ordering::SeqCst);
    assert!(stack.wrap(busy).oneshot(Req).await.is_err());
    // A 503 is retried (3 attempts allowed) and trips the breaker at 2.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(stack.breaker().unwrap().state().kind(), StateKind::Open);
}
