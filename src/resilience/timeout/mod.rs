//! Time bounds, one service for two jobs:
//!
//! - the **attempt timeout**, innermost, bounds one call to the client and
//!   fails with [`Elapsed`], which the breaker counts as a failure and
//!   retry may retry;
//! - the **deadline**, outermost, bounds the whole retry group (attempts
//!   and backoff sleeps) and fails with [`DeadlineExceeded`], which nothing
//!   retries and the breaker never sees (the attempt it cancels is dropped,
//!   which counts as nothing).
//!
//! Like `tower::timeout`, but the errors name the dependency so the HTTP
//! layer can answer 504 saying which one.

mod error;
mod future;
mod layer;
mod service;

pub use error::{DeadlineExceeded, Elapsed};
pub use future::ResponseFuture;
pub use layer::TimeoutLayer;
pub use service::{Timeout, TimeoutKind};

#[cfg(test)]
mod tests;
