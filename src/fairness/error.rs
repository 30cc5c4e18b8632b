//! The queue's refusals, named for the event and mapped to HTTP in
//! `http::error` like every other error.

use std::time::Duration;

/// The tenant's queue is full, or its wait would pass `max_wait`: the
/// tenant's own doing (429).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the tenant's queue for {dependency} is full")]
pub struct TenantQueueFull {
    /// The dependency the queue is in front of.
    pub dependency: &'static str,
    /// When the tenant's queue will have drained enough.
    pub retry_after: Duration,
}

/// The dependency is saturated for everyone: even a tenant under its fair
/// share cannot be served in time (503).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{dependency} is saturated")]
pub struct Overloaded {
    /// The dependency the queue is in front of.
    pub dependency: &'static str,
    /// When capacity should be free.
    pub retry_after: Duration,
}
