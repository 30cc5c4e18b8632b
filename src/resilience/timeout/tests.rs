use std::time::Duration;

use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceExt};

use super::*;
use crate::resilience::BoxError;

fn slow(
    delay: Duration,
) -> impl tower::Service<(), Response = &'static str, Error = BoxError> + Clone {
    service_fn(move |()| async move {
        tokio::time::sleep(delay).await;
        Ok::<_, BoxError>("answer")
    })
}

#[tokio::test(start_paused = true)]
async fn an_attempt_slower_than_its_timeout_fails_with_elapsed_naming_the_dependency() {
    let svc = TimeoutLayer::attempt("vector_store", Duration::from_secs(1))
        .layer(slow(Duration::from_secs(5)));
    let started = Instant::now();
    let err = svc.oneshot(()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    let elapsed = err.downcast_ref::<Elapsed>().expect("Elapsed");
    assert_eq!(elapsed.dependency, "vector_store");
    assert_eq!(
        err.to_string(),
        "vector_store attempt timed out after 1000ms"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_fails_with_deadline_exceeded_and_a_fast_call_passes() {
    let svc = TimeoutLayer::deadline("llm", Duration::from_secs(3));
    let err = svc
        .layer(slow(Duration::from_secs(5)))
        .oneshot(())
        .await
        .unwrap_err();
    assert!(err.is::<DeadlineExceeded>());
    let ok = svc
        .layer(slow(Duration::from_secs(2)))
        .oneshot(())
        .await
        .unwrap();
    assert_eq!(ok, "answer");
}
