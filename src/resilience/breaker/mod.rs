//! The circuit breaker: a gate plus a policy.
//!
//! - The gate ([`Breaker`]) is a short-mutex state shared by every service
//!   of a dependency: closed, open until an instant, or half-open with N
//!   probe permits ([`CallPermit`], released on drop). An open breaker
//!   fails a call at once with [`CircuitOpen`], whose `retry_after` says
//!   when the next probe is admitted; `poll_ready` never waits.
//! - The policy decides transitions: failures through failsafe's
//!   `FailurePolicy` (consecutive failures, or a failure rate over a
//!   window with a minimum number of calls), slow successes through a
//!   slow-call rate ([`policy`]). Open time grows per consecutive trip
//!   ([`Backoff`]) and resets once probes succeed.
//! - [`Classify`] decides what an error means: dependency faults fail,
//!   client faults succeed, our own rejections are ignored.
//!
//! Time is tokio's clock, so the whole state machine runs on paused time in
//! tests.

mod backoff;
mod classify;
mod error;
mod future;
mod gate;
mod layer;
pub mod policy;
mod service;

pub use backoff::{Backoff, InvalidBackoff};
pub use classify::{classify_error, Classify, DefaultClassifier, Verdict};
pub use error::CircuitOpen;
pub use future::ResponseFuture;
pub use gate::{
    Breaker, BreakerCounts, BreakerSettings, BreakerSnapshot, BreakerState, CallPermit, StateKind,
};
pub use layer::CircuitBreakerLayer;
pub use policy::{SlowCallRule, TripRule};
pub use service::CircuitBreaker;

#[cfg(test)]
mod tests;
