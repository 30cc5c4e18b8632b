//! Budgeted retries: `tower::retry::Retry` with our [`RetryPolicy`].
//!
//! A failed attempt is retried only when
//!
//! - the request says it is safe ([`Retryable`]: idempotent, and for a
//!   streamed LLM answer, no byte streamed yet — see [`StreamFlag`]);
//! - the failure is retryable ([`retry_decision`]): connect errors,
//!   upstream timeouts, 502 / 503 / 504, our attempt timeout, and 429 when
//!   its `Retry-After` fits; never [`crate::resilience::CircuitOpen`],
//!   [`crate::resilience::BulkheadFull`], the deadline, or other 4xx;
//! - attempts remain, the next backoff (backon's jittered exponential
//!   backoff, slept on tokio's clock) fits in what is left of the
//!   deadline, and the shared [`TpsBudget`] allows it: retries are capped
//!   at a fraction of traffic (20% by default) plus a small reserve, so a
//!   failing dependency does not get its load multiplied.
//!
//! When retry gives up, the last error is returned as it was, so the HTTP
//! mapping reports the real cause; a spent budget is reported to the
//! observer.
//!
//! [`TpsBudget`]: tower::retry::budget::TpsBudget

mod layer;
mod policy;

pub use layer::RetryLayer;
pub use policy::{
    retry_decision, RetryDecision, RetryPolicy, RetrySettings, Retryable, StreamFlag,
};

#[cfg(test)]
mod tests;
