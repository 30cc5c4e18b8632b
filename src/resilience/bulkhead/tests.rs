use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tower::{service_fn, Layer, Service, ServiceExt};

use super::*;
use crate::resilience::{BoxError, NoopObserver};

#[tokio::test(start_paused = true)]
async fn a_full_bulkhead_rejects_at_once_instead_of_queueing() {
    let release = Arc::new(Notify::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let svc = {
        let (release, calls) = (release.clone(), calls.clone());
        service_fn(move |()| {
            let (release, calls) = (release.clone(), calls.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                release.notified().await;
                Ok::<_, BoxError>("done")
            }
        })
    };
    let mut svc = BulkheadLayer::new("llm", 2, Arc::new(NoopObserver)).layer(svc);

    let first = tokio::spawn(svc.ready().await.unwrap().call(()));
    let second = tokio::spawn(svc.ready().await.unwrap().call(()));
    tokio::task::yield_now().await;
    assert_eq!(svc.available(), 0);

    let started = tokio::time::Instant::now();
    let err = svc.ready().await.unwrap().call(()).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO, "rejection must not wait");
    let full = err.downcast_ref::<BulkheadFull>().expect("BulkheadFull");
    assert_eq!(full.dependency, "llm");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the third call never reached the client"
    );

    release.notify_waiters();
    assert_eq!(first.await.unwrap().unwrap(), "done");
    assert_eq!(second.await.unwrap().unwrap(), "done");
    assert_eq!(svc.available(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_call_frees_its_slot() {
    let svc = service_fn(|()| async {
        std::future::pending::<()>().await;
        Ok::<_, BoxError>(())
    });
    let mut svc = BulkheadLayer::new("redis", 1, Arc::new(NoopObserver)).layer(svc);
    let pending = svc.ready().await.unwrap().call(());
    assert_eq!(svc.available(), 0);
    drop(pending);
    assert_eq!(svc.available(), 1);
}
