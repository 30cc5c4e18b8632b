//! Per-dependency resilience: the layers every call to the LLM, the vector
//! store and Redis goes through, outermost first:
//!
//! ```text
//! deadline ─▶ retry (budgeted, jittered backoff) ─▶ circuit breaker
//!          ─▶ bulkhead (reject, don't queue) ─▶ attempt timeout ─▶ client
//! ```
//!
//! Why this order:
//!
//! - **Retry outside the breaker**, so the breaker sees every attempt. With
//!   retries inside it, one logical call that failed three times would count
//!   once and the breaker would trip late while the dependency takes three
//!   times the load. An open breaker answers [`CircuitOpen`], which retry
//!   never retries.
//! - **Attempt timeout inside the breaker** (and the bulkhead), so a hung
//!   attempt is a failure the breaker counts and its bulkhead slot is freed
//!   when the attempt, not the whole retry group, gives up.
//! - **Bulkhead inside the breaker**, so its rejections ([`BulkheadFull`])
//!   are seen and ignored by the breaker: a full bulkhead is our own
//!   back-pressure, not a sign that the dependency is failing.
//! - **Deadline outermost**, so it bounds the whole retry group including
//!   backoff sleeps; retry also stops early when the next backoff would not
//!   fit in what is left of the deadline.
//!
//! Every layer returns [`BoxError`], so layers can be reordered or disabled
//! without changing types, and errors are small structs named for the event
//! that the HTTP layer maps by downcasting.
//!
//! [`DependencyStack`] builds the whole stack for one dependency from a
//! [`DependencyPolicy`]; the pieces are usable alone.

pub mod breaker;
pub mod bulkhead;
pub mod config;
pub mod failure;
mod metrics;
mod observer;
pub mod retry;
mod stack;
pub mod timeout;

pub use breaker::{Breaker, BreakerSnapshot, BreakerState, CircuitOpen, StateKind};
pub use bulkhead::BulkheadFull;
pub use config::{
    BreakerConfig, BreakerPolicyKind, BulkheadConfig, DependencyPolicy, ResilienceConfig,
    RetryConfig,
};
pub use failure::{Classified, ClassifyFailure, FailureClass};
pub use metrics::{DependencyMetrics, ResilienceMetrics};
pub use observer::{CallOutcome, NoopObserver, ResilienceObserver};
pub use retry::{Retryable, StreamFlag};
pub use stack::DependencyStack;
pub use timeout::{DeadlineExceeded, Elapsed};

/// The error type of every resilience layer.
pub type BoxError = tower::BoxError;

#[cfg(test)]
pub(crate) mod testing;
