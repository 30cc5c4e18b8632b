//! [`DependencyStack`]: builds the whole per-dependency stack from a
//! [`DependencyPolicy`] and keeps the state its services share (breaker,
//! bulkhead slots, retry budget), so every operation on a dependency
//! (e.g. LLM completions and embeddings) is gated together.

use std::sync::Arc;

use tower::retry::budget::TpsBudget;
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder};

use super::breaker::{Breaker, CircuitBreakerLayer, Classify, DefaultClassifier};
use super::bulkhead::BulkheadLayer;
use super::config::DependencyPolicy;
use super::retry::{RetryLayer, Retryable};
use super::timeout::TimeoutLayer;
use super::{BoxError, Classified, ClassifyFailure, ResilienceObserver};
use crate::error::ConfigError;

/// The resilience layers of one dependency and their shared state.
#[derive(Clone)]
pub struct DependencyStack {
    name: &'static str,
    policy: DependencyPolicy,
    observer: Arc<dyn ResilienceObserver>,
    breaker: Option<Breaker>,
    bulkhead: Option<BulkheadLayer>,
    budget: Arc<TpsBudget>,
}

impl DependencyStack {
    /// The stack for dependency `name` (also the config key under
    /// `resilience.`), with the default error classifier. Fails on an
    /// invalid policy, naming the key.
    pub fn new(
        name: &'static str,
        policy: DependencyPolicy,
        observer: Arc<dyn ResilienceObserver>,
    ) -> Result<Self, ConfigError> {
        Self::with_classifier(name, policy, observer, DefaultClassifier)
    }

    /// Like [`DependencyStack::new`], with the breaker classifying errors by
    /// `classifier`.
    pub fn with_classifier(
        name: &'static str,
        policy: DependencyPolicy,
        observer: Arc<dyn ResilienceObserver>,
        classifier: impl Classify,
    ) -> Result<Self, ConfigError> {
        let prefix = format!("resilience.{name}");
        policy.validate(&prefix)?;
        let breaker = if policy.breaker.enabled {
            let settings = policy.breaker.settings(&format!("{prefix}.breaker"))?;
            Some(Breaker::with_classifier(
                name,
                settings,
                observer.clone(),
                classifier,
            ))
        } else {
            None
        };
        let bulkhead = policy
            .bulkhead
            .enabled
            .then(|| BulkheadLayer::new(name, policy.bulkhead.max_concurrent, observer.clone()));
        let budget = policy.retry.budget();
        Ok(Self {
            name,
            policy,
            observer,
            breaker,
            bulkhead,
            budget,
        })
    }

    /// The dependency's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The breaker handle for `/ready` and the admin API (`None` when the
    /// breaker is disabled).
    pub fn breaker(&self) -> Option<&Breaker> {
        self.breaker.as_ref()
    }

    /// Wraps `client` in deadline → retry → breaker → bulkhead → attempt
    /// timeout (outermost first; see the module docs for why). Disabled
    /// layers are left out. Every service wrapped by one stack shares its
    /// breaker, bulkhead and retry budget.
    ///
    /// The client's errors leave it tagged with their [`FailureClass`]
    /// ([`Classified`]), which is how the breaker and retry judge them
    /// without knowing the client's error type.
    ///
    /// [`FailureClass`]: super::FailureClass
    pub fn wrap<S, Req>(&self, client: S) -> BoxCloneSyncService<Req, S::Response, BoxError>
    where
        S: Service<Req> + Clone + Send + Sync + 'static,
        S::Error: ClassifyFailure + std::error::Error + Send + Sync + 'static,
        S::Future: Send + 'static,
        S::Response: Send + 'static,
        Req: Retryable + Clone + Send + 'static,
    {
        let policy = &self.policy;
        let retry = (policy.retry.enabled && policy.retry.max_attempts > 1).then(|| {
            RetryLayer::new(
                self.name,
                policy.retry.settings(policy.deadline),
                self.budget.clone(),
                self.observer.clone(),
            )
        });
        let service = ServiceBuilder::new()
            .layer(TimeoutLayer::deadline(self.name, policy.deadline))
            .option_layer(retry)
            .option_layer(self.breaker.clone().map(CircuitBreakerLayer::new))
            .option_layer(self.bulkhead.clone())
            .layer(TimeoutLayer::attempt(self.name, policy.attempt_timeout))
            .map_err(Classified::new)
            .service(client);
        BoxCloneSyncService::new(service)
    }
}

impl std::fmt::Debug for DependencyStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DependencyStack")
            .field("name", &self.name)
            .field("policy", &self.policy)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
