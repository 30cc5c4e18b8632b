//! [`RetryLayer`]: holds the policy template; `layer()` only builds
//! `tower::retry::Retry`.

use std::sync::Arc;

use tower::retry::budget::TpsBudget;
use tower::retry::Retry;
use tower::Layer;

use super::policy::{RetryPolicy, RetrySettings};
use crate::resilience::ResilienceObserver;

/// Retries failed calls under [`RetryPolicy`].
#[derive(Debug, Clone)]
pub struct RetryLayer {
    policy: RetryPolicy,
}

impl RetryLayer {
    /// Retries calls to `dependency` per `settings`, drawing on `budget`
    /// (shared by every service of the dependency).
    pub fn new(
        dependency: &'static str,
        settings: RetrySettings,
        budget: Arc<TpsBudget>,
        observer: Arc<dyn ResilienceObserver>,
    ) -> Self {
        Self {
            policy: RetryPolicy::new(dependency, settings, budget, observer),
        }
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<RetryPolicy, S>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::new(self.policy.clone(), inner)
    }
}
