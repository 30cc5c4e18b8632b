//! [`Bulkhead`]: takes a slot without waiting or fails with
//! [`BulkheadFull`]; the slot is held until the inner future ends or is
//! dropped.

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::Semaphore;
use tower::Service;

use super::error::BulkheadFull;
use super::future::ResponseFuture;
use crate::resilience::{BoxError, ResilienceObserver};

/// A service with a concurrency cap that rejects instead of queueing.
#[derive(Clone)]
pub struct Bulkhead<S> {
    inner: S,
    dependency: &'static str,
    semaphore: Arc<Semaphore>,
    observer: Arc<dyn ResilienceObserver>,
}

impl<S> Bulkhead<S> {
    /// Wraps `inner`, sharing `semaphore`'s slots with other clones.
    pub fn new(
        inner: S,
        dependency: &'static str,
        semaphore: Arc<Semaphore>,
        observer: Arc<dyn ResilienceObserver>,
    ) -> Self {
        Self {
            inner,
            dependency,
            semaphore,
            observer,
        }
    }

    /// Free slots right now.
    pub fn available(&self) -> usize {
        self.semaphore.available_permits()
    }
}

impl<S, Req> Service<Req> for Bulkhead<S>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Unlike tower's ConcurrencyLimit, readiness does not wait for a
        // slot: a full bulkhead fails in `call` (the inner services are
        // always ready, so no reserved readiness is wasted).
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.semaphore.clone().try_acquire_owned() {
            Ok(permit) => ResponseFuture::called(self.inner.call(req), permit),
            Err(_) => {
                self.observer.bulkhead_rejected(self.dependency);
                ResponseFuture::rejected(BulkheadFull {
                    dependency: self.dependency,
                })
            }
        }
    }
}

impl<S> std::fmt::Debug for Bulkhead<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bulkhead")
            .field("dependency", &self.dependency)
            .field("available", &self.semaphore.available_permits())
            .finish_non_exhaustive()
    }
}
