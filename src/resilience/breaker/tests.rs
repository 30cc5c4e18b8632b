use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::time::{advance, Instant};
use tower::{service_fn, Layer, Service, ServiceExt};

use super::*;
use crate::resilience::bulkhead::{BulkheadFull, BulkheadLayer};
use crate::resilience::testing::status;
use crate::resilience::testing::Recorder;
use crate::resilience::{BoxError, CallOutcome};

const SEC: Duration = Duration::from_secs(1);

fn backoff() -> Backoff {
    Backoff::try_new(SEC, 8 * SEC, 0.0).unwrap()
}

fn consecutive(n: u32, probes: u32) -> BreakerSettings {
    BreakerSettings {
        trip: TripRule::ConsecutiveFailures(n),
        slow_calls: None,
        open: backoff(),
        half_open_probes: probes,
    }
}

fn breaker(settings: BreakerSettings) -> (Breaker, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    (Breaker::new("llm", settings, recorder.clone()), recorder)
}

fn fail(b: &Breaker) {
    b.permit().expect("admitted").verdict(Verdict::Failure);
}

fn succeed(b: &Breaker) {
    b.permit().expect("admitted").success();
}

fn retry_after(b: &Breaker) -> Duration {
    b.permit().expect_err("refused").retry_after
}

/// Trips the breaker and waits until it is half-open.
async fn trip_and_wait(b: &Breaker) {
    while b.state() == BreakerState::Closed {
        fail(b);
    }
    let BreakerState::Open { retry_after, .. } = b.state() else {
        panic!("expected open, got {:?}", b.state());
    };
    advance(retry_after).await;
}

fn upstream_503() -> BoxError {
    status(503, None)
}

#[tokio::test(start_paused = true)]
async fn breaker_goes_closed_open_half_open_closed() {
    let (b, rec) = breaker(consecutive(3, 1));
    fail(&b);
    fail(&b);
    assert_eq!(b.state(), BreakerState::Closed);
    fail(&b);
    assert_eq!(b.state().kind(), StateKind::Open);
    assert_eq!(retry_after(&b), SEC);

    advance(Duration::from_millis(400)).await;
    assert_eq!(retry_after(&b), Duration::from_millis(600));
    advance(Duration::from_millis(600)).await;
    assert_eq!(
        b.state(),
        BreakerState::HalfOpen {
            probes_in_flight: 0
        }
    );

    let probe = b.permit().expect("one probe");
    assert!(probe.is_probe());
    assert!(b.permit().is_err(), "only one probe at a time");
    probe.success();
    assert_eq!(b.state(), BreakerState::Closed);
    assert_eq!(
        rec.transitions(),
        [
            (StateKind::Closed, StateKind::Open),
            (StateKind::Open, StateKind::HalfOpen),
            (StateKind::HalfOpen, StateKind::Closed),
        ]
    );
    assert_eq!(rec.count(CallOutcome::Rejected), 3);
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_reopens_for_longer_up_to_the_cap_and_recovery_resets_it() {
    let (b, rec) = breaker(consecutive(1, 1));
    fail(&b);
    let mut open_times = vec![retry_after(&b)];
    for _ in 0..4 {
        advance(*open_times.last().unwrap()).await;
        fail(&b); // the probe fails
        open_times.push(retry_after(&b));
    }
    assert_eq!(open_times, [SEC, 2 * SEC, 4 * SEC, 8 * SEC, 8 * SEC]);
    assert!(rec
        .transitions()
        .contains(&(StateKind::HalfOpen, StateKind::Open)));
    assert_eq!(b.snapshot().consecutive_trips, 5);

    advance(8 * SEC).await;
    succeed(&b);
    assert_eq!(b.state(), BreakerState::Closed);
    assert_eq!(b.snapshot().consecutive_trips, 0);
    fail(&b);
    assert_eq!(retry_after(&b), SEC, "open time starts over after recovery");
}

#[tokio::test(start_paused = true)]
async fn a_success_resets_the_consecutive_failure_count() {
    let (b, _) = breaker(consecutive(3, 1));
    fail(&b);
    fail(&b);
    succeed(&b);
    fail(&b);
    fail(&b);
    assert_eq!(b.state(), BreakerState::Closed);
    fail(&b);
    assert_eq!(b.state().kind(), StateKind::Open);
}

fn rate(rate: f64, min_calls: u32, window: Duration) -> BreakerSettings {
    BreakerSettings {
        trip: TripRule::FailureRate {
            rate,
            min_calls,
            window,
        },
        ..consecutive(1, 1)
    }
}

#[tokio::test(start_paused = true)]
async fn failure_rate_does_not_trip_below_the_minimum_number_of_calls() {
    let (b, _) = breaker(rate(0.5, 10, 10 * SEC));
    for _ in 0..9 {
        fail(&b);
    }
    assert_eq!(b.state(), BreakerState::Closed, "9 failures < 10 calls");
    fail(&b);
    assert_eq!(b.state().kind(), StateKind::Open, "10 of 10 failed");
}

#[tokio::test(start_paused = true)]
async fn failure_rate_trips_at_the_rate_and_old_failures_age_out() {
    let (b, _) = breaker(rate(0.5, 10, 10 * SEC));
    for _ in 0..9 {
        fail(&b);
    }
    advance(11 * SEC).await;
    // The 9 old failures left the window: 1 call in it now.
    fail(&b);
    for _ in 0..8 {
        succeed(&b);
    }
    fail(&b);
    assert_eq!(b.state(), BreakerState::Closed, "2 of 10 failed");
    for _ in 0..5 {
        fail(&b);
    }
    assert_eq!(b.state(), BreakerState::Closed, "7 of 15 failed");
    fail(&b);
    assert_eq!(b.state().kind(), StateKind::Open, "8 of 16 failed = 50%");
}

#[tokio::test(start_paused = true)]
async fn slow_successes_trip_the_slow_call_rate() {
    let settings = BreakerSettings {
        slow_calls: Some(SlowCallRule {
            threshold: SEC,
            rate: 0.5,
            min_calls: 4,
            window: 10 * SEC,
        }),
        ..consecutive(100, 1)
    };
    let (b, rec) = breaker(settings);
    let slow_call = |b: &Breaker| {
        let permit = b.permit().expect("admitted");
        async move {
            advance(2 * SEC).await;
            permit.success();
        }
    };
    succeed(&b);
    succeed(&b);
    slow_call(&b).await;
    assert_eq!(
        b.state(),
        BreakerState::Closed,
        "1 slow of 3 calls, below min"
    );
    slow_call(&b).await;
    assert_eq!(b.state().kind(), StateKind::Open, "2 slow of 4 calls = 50%");
    assert_eq!(rec.count(CallOutcome::Slow), 2);
    assert_eq!(b.snapshot().counts.slow, 2);
}

#[tokio::test(start_paused = true)]
async fn exactly_n_of_m_concurrent_callers_reach_the_dependency_when_half_open() {
    let (b, _) = breaker(consecutive(1, 2));
    let calls = Arc::new(AtomicUsize::new(0));
    let client = {
        let calls = calls.clone();
        service_fn(move |()| {
            calls.fetch_add(1, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, BoxError>("ok")
            }
        })
    };
    let svc = CircuitBreakerLayer::new(b.clone()).layer(client);
    trip_and_wait(&b).await;

    let results = join_all((0..10).map(|_| svc.clone().oneshot(()))).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2, "2 probes of 10 callers");
    let rejected: Vec<_> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(|e| {
            e.downcast_ref::<CircuitOpen>()
                .expect("CircuitOpen")
                .clone()
        })
        .collect();
    assert_eq!(rejected.len(), 8);
    assert!(rejected
        .iter()
        .all(|e| e.retry_after == SEC && e.dependency == "llm"));
    assert_eq!(b.state(), BreakerState::Closed, "both probes succeeded");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_releases_its_permit_and_counts_as_nothing() {
    let (b, _) = breaker(consecutive(1, 1));
    let hang = Arc::new(AtomicBool::new(true));
    let client = {
        let hang = hang.clone();
        service_fn(move |()| {
            let hang = hang.load(Ordering::SeqCst);
            async move {
                if hang {
                    std::future::pending::<()>().await;
                }
                Ok::<_, BoxError>(())
            }
        })
    };
    let mut svc = CircuitBreakerLayer::new(b.clone()).layer(client);
    trip_and_wait(&b).await;
    let counts = b.snapshot().counts;

    let probe = svc.ready().await.unwrap().call(());
    assert_eq!(
        b.state(),
        BreakerState::HalfOpen {
            probes_in_flight: 1
        }
    );
    assert!(svc.ready().await.unwrap().call(()).await.is_err());
    drop(probe); // cancelled, e.g. by the deadline

    assert_eq!(
        b.state(),
        BreakerState::HalfOpen {
            probes_in_flight: 0
        }
    );
    let after = b.snapshot().counts;
    assert_eq!(
        (after.successes, after.failures, after.ignored),
        (counts.successes, counts.failures, counts.ignored)
    );
    hang.store(false, Ordering::SeqCst);
    svc.ready().await.unwrap().call(()).await.unwrap();
    assert_eq!(b.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_fails_at_once_without_calling_the_dependency() {
    let (b, _) = breaker(consecutive(1, 1));
    let calls = Arc::new(AtomicUsize::new(0));
    let client = {
        let calls = calls.clone();
        service_fn(move |()| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(upstream_503()) }
        })
    };
    let svc = CircuitBreakerLayer::new(b.clone()).layer(client);
    assert!(svc.clone().oneshot(()).await.is_err());
    assert_eq!(b.state().kind(), StateKind::Open);

    let started = Instant::now();
    for _ in 0..100 {
        let err = svc.clone().oneshot(()).await.unwrap_err();
        assert!(err.is::<CircuitOpen>());
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(b.snapshot().counts.rejected, 100);
}

#[tokio::test(start_paused = true)]
async fn force_open_force_closed_and_reset_steer_the_breaker() {
    let (b, rec) = breaker(consecutive(2, 1));
    b.force_open();
    assert_eq!(b.state(), BreakerState::ForcedOpen);
    assert_eq!(
        retry_after(&b),
        8 * SEC,
        "forced open hints the longest open time"
    );
    advance(60 * SEC).await;
    assert_eq!(
        b.state(),
        BreakerState::ForcedOpen,
        "stays open until reset"
    );

    b.force_closed();
    for _ in 0..10 {
        fail(&b);
    }
    assert_eq!(
        b.state(),
        BreakerState::ForcedClosed,
        "failures do not trip it"
    );

    b.reset();
    assert_eq!(b.state(), BreakerState::Closed);
    fail(&b);
    fail(&b);
    assert_eq!(b.state().kind(), StateKind::Open);
    assert_eq!(
        rec.transitions(),
        [
            (StateKind::Closed, StateKind::ForcedOpen),
            (StateKind::ForcedOpen, StateKind::ForcedClosed),
            (StateKind::ForcedClosed, StateKind::Closed),
            (StateKind::Closed, StateKind::Open),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_bulkhead_does_not_trip_the_breaker() {
    let (b, rec) = breaker(consecutive(1, 1));
    let client = service_fn(|()| async {
        std::future::pending::<()>().await;
        Ok::<_, BoxError>(())
    });
    let bulkhead = BulkheadLayer::new("llm", 1, rec.clone()).layer(client);
    let mut svc = CircuitBreakerLayer::new(b.clone()).layer(bulkhead);
    let _holds_the_slot = svc.ready().await.unwrap().call(());
    for _ in 0..5 {
        let err = svc.ready().await.unwrap().call(()).await.unwrap_err();
        assert!(err.is::<BulkheadFull>());
    }
    assert_eq!(b.state(), BreakerState::Closed);
    assert_eq!(b.snapshot().counts.ignored, 5);
    assert_eq!(rec.count(CallOutcome::Ignored), 5);
    assert_eq!(*rec.bulkhead_rejected.lock().unwrap(), 5);
}

#[tokio::test(start_paused = true)]
async fn client_errors_count_as_successes_and_circuit_open_as_nothing() {
    let (b, _) = breaker(consecutive(1, 1));
    let not_found = status(404, None);
    b.permit().unwrap().error(not_found.as_ref());
    let open = CircuitOpen {
        dependency: "inner",
        retry_after: SEC,
    };
    b.permit().unwrap().error(&open);
    assert_eq!(b.state(), BreakerState::Closed);
    let counts = b.snapshot().counts;
    assert_eq!(
        (counts.successes, counts.ignored, counts.failures),
        (1, 1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_admitted_before_a_trip_cannot_close_the_breaker() {
    let (b, _) = breaker(consecutive(1, 1));
    let early = b.permit().unwrap();
    trip_and_wait(&b).await;
    early.success();
    assert_eq!(
        b.state(),
        BreakerState::HalfOpen {
            probes_in_flight: 0
        }
    );
    succeed(&b);
    assert_eq!(b.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn the_snapshot_serializes_state_and_retry_hint() {
    let (b, _) = breaker(consecutive(1, 1));
    fail(&b);
    advance(Duration::from_millis(250)).await;
    let json = serde_json::to_value(b.snapshot()).unwrap();
    assert_eq!(json["dependency"], "llm");
    assert_eq!(json["state"], "open");
    assert_eq!(json["retry_after_ms"], 750);
    assert_eq!(json["in_state_ms"], 250);
    assert_eq!(json["consecutive_trips"], 1);
    assert_eq!(json["counts"]["failures"], 1);
}
