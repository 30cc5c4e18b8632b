//! [`BulkheadLayer`]: holds the shared semaphore; `layer()` only builds the
//! service.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tower::Layer;

use super::service::Bulkhead;
use crate::resilience::ResilienceObserver;

/// Limits concurrent calls; every service built by one layer shares its
/// slots.
#[derive(Clone)]
pub struct BulkheadLayer {
    dependency: &'static str,
    semaphore: Arc<Semaphore>,
    observer: Arc<dyn ResilienceObserver>,
}

impl BulkheadLayer {
    /// At most `max_concurrent` calls to `dependency` at a time.
    pub fn new(
        dependency: &'static str,
        max_concurrent: usize,
        observer: Arc<dyn ResilienceObserver>,
    ) -> Self {
        Self {
            dependency,
            semaphore: Arc::new(Semaphore::new(max_concurrent)),
            observer,
        }
    }
}

impl<S> Layer<S> for BulkheadLayer {
    type Service = Bulkhead<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Bulkhead::new(
            inner,
            self.dependency,
            self.semaphore.clone(),
            self.observer.clone(),
        )
    }
}

impl std::fmt::Debug for BulkheadLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BulkheadLayer")
            .field("dependency", &self.dependency)
            .field("available", &self.semaphore.available_permits())
            .finish_non_exhaustive()
    }
}
