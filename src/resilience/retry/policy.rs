//! [`RetryPolicy`]: when and after how long a failed attempt is tried
//! again, for `tower::retry`.

use std::error::Error;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use tokio::time::{Instant, Sleep};
use tower::retry::budget::{Budget, TpsBudget};
use tower::retry::Policy;

use crate::resilience::breaker::CircuitOpen;
use crate::resilience::bulkhead::BulkheadFull;
use crate::resilience::failure::{Classified, FailureClass};
use crate::resilience::timeout::{DeadlineExceeded, Elapsed};
use crate::resilience::{BoxError, ResilienceObserver};

/// A request that knows whether sending it again is safe.
pub trait Retryable {
    /// True when a failed attempt may be repeated: the request is
    /// idempotent and nothing of its answer was consumed yet. Asked before
    /// each retry, so it may change while an attempt runs.
    fn retry_safe(&self) -> bool;
}

/// A shared "stream started" latch for streamed answers: clones share it,
/// so the client marks it on the first streamed byte and the retry policy
/// then refuses to retry that request.
#[derive(Debug, Clone, Default)]
pub struct StreamFlag(Arc<AtomicBool>);

/// What the retry policy makes of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Retry after the backoff.
    Retry,
    /// Retry, but not before this long (the upstream's `Retry-After`), and
    /// only if that fits the deadline and the maximum backoff.
    After(Duration),
    /// Never retry.
    Never,
}

/// Tunables of [`RetryPolicy`] (see `RetryConfig::settings`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetrySettings {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// Delay before the first retry.
    pub min_backoff: Duration,
    /// Longest delay between attempts; also the longest upstream
    /// `Retry-After` honoured.
    pub max_backoff: Duration,
    /// Add random jitter (up to 100% of the delay).
    pub jitter: bool,
    /// The whole call's deadline: no retry starts that could not begin
    /// before it.
    pub deadline: Option<Duration>,
}

/// The retry policy; one clone per request carries that request's attempt
/// count and backoff.
pub struct RetryPolicy {
    dependency: &'static str,
    settings: RetrySettings,
    builder: ExponentialBuilder,
    budget: Arc<TpsBudget>,
    observer: Arc<dyn ResilienceObserver>,
    started: Instant,
    retries: u32,
    backoff: Option<ExponentialBackoff>,
}

impl StreamFlag {
    /// A flag not yet set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The answer started streaming: never retry from now on.
    pub fn mark_started(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether the answer started streaming.
    pub fn has_started(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl RetryPolicy {
    /// A policy for calls to `dependency`.
    pub fn new(
        dependency: &'static str,
        settings: RetrySettings,
        budget: Arc<TpsBudget>,
        observer: Arc<dyn ResilienceObserver>,
    ) -> Self {
        let mut builder = ExponentialBuilder::new()
            .with_min_delay(settings.min_backoff)
            .with_max_delay(settings.max_backoff)
            .with_max_times(settings.max_attempts.saturating_sub(1) as usize);
        if settings.jitter {
            builder = builder.with_jitter();
        }
        Self {
            dependency,
            settings,
            builder,
            budget,
            observer,
            started: Instant::now(),
            retries: 0,
            backoff: None,
        }
    }

    /// The delay before the next retry, or `None` to give up.
    fn next_delay(&mut self, decision: RetryDecision) -> Option<Duration> {
        if self.retries.saturating_add(1) >= self.settings.max_attempts {
            return None;
        }
        let builder = self.builder;
        let backoff = self.backoff.get_or_insert_with(|| builder.build()).next()?;
        // backon multiplies in f32; drop the sub-microsecond noise.
        let backoff = Duration::from_micros(u64::try_from(backoff.as_micros()).unwrap_or(u64::MAX));
        let delay = match decision {
            RetryDecision::Never => return None,
            RetryDecision::Retry => backoff,
            RetryDecision::After(wait) if wait <= self.settings.max_backoff => wait.max(backoff),
            RetryDecision::After(_) => return None,
        };
        if let Some(deadline) = self.settings.deadline {
            if self.started.elapsed().saturating_add(delay) >= deadline {
                return None;
            }
        }
        Some(delay)
    }
}

impl<Req, Res> Policy<Req, Res, BoxError> for RetryPolicy
where
    Req: Retryable + Clone,
{
    type Future = Sleep;

    fn retry(&mut self, req: &mut Req, result: &mut Result<Res, BoxError>) -> Option<Sleep> {
        let error = result.as_ref().err()?;
        if !req.retry_safe() {
            return None;
        }
        let delay = self.next_delay(retry_decision(error.as_ref()))?;
        if !self.budget.withdraw() {
            tracing::debug!(dependency = self.dependency, "retry budget exhausted");
            self.observer.retry_budget_exhausted(self.dependency);
            return None;
        }
        self.retries += 1;
        self.observer
            .retry(self.dependency, self.retries + 1, delay);
        Some(tokio::time::sleep(delay))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        // `Retry::call` asks the service's own policy (which never retries)
        // before cloning it into the request's future: a policy with no
        // retries yet is seeing a new request.
        if self.retries == 0 {
            self.started = Instant::now();
            self.budget.deposit();
        }
        req.retry_safe().then(|| req.clone())
    }
}

impl Clone for RetryPolicy {
    fn clone(&self) -> Self {
        Self {
            dependency: self.dependency,
            settings: self.settings,
            builder: self.builder,
            budget: self.budget.clone(),
            observer: self.observer.clone(),
            started: self.started,
            retries: self.retries,
            // A backoff iterator belongs to one request.
            backoff: None,
        }
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("dependency", &self.dependency)
            .field("settings", &self.settings)
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

/// Walks `error`'s causes and decides whether it is worth another attempt:
/// never for our own refusals and deadline, again for attempt timeouts,
/// and for a tagged client error by its [`FailureClass`]. Untagged errors
/// are not retried: nothing says that repeating them is safe or useful.
pub fn retry_decision(error: &(dyn Error + 'static)) -> RetryDecision {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<CircuitOpen>() || e.is::<BulkheadFull>() || e.is::<DeadlineExceeded>() {
            return RetryDecision::Never;
        }
        if e.is::<Elapsed>() {
            return RetryDecision::Retry;
        }
        if let Some(c) = e.downcast_ref::<Classified>() {
            return match c.class {
                FailureClass::Unreachable | FailureClass::Timeout => RetryDecision::Retry,
                FailureClass::Overloaded { retry_after }
                | FailureClass::Throttled { retry_after } => {
                    retry_after.map_or(RetryDecision::Retry, RetryDecision::After)
                }
                FailureClass::Failed | FailureClass::Rejected | FailureClass::Refused => {
                    RetryDecision::Never
                }
            };
        }
        cause = e.source();
    }
    RetryDecision::Never
}
