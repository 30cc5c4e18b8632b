//! The limiter's errors, named for the event. They are mapped to HTTP in
//! `http::error` like every other error.

use std::time::Duration;

use super::policy::Layer;

/// A limit rejected the request (429).
#[derive(Debug, Clone, thiserror::Error)]
#[error("rate limited by the {} layer ({tier})", layer.as_str())]
pub struct RateLimited {
    /// The rejecting limit's layer.
    pub layer: Layer,
    /// What it counts (`key`, `tenant`, `user`, `route`, `ip`).
    pub scope: &'static str,
    /// Its tier.
    pub tier: String,
    /// Real time until the request would be admitted.
    pub retry_after: Duration,
}

/// The limiter store is down and the tier fails closed (503).
#[derive(Debug, Clone, thiserror::Error)]
#[error("the rate-limit store is unavailable")]
pub struct LimiterUnavailable {
    /// When to try again.
    pub retry_after: Duration,
}

/// The limiter ran without the identity layer in front of it: a wiring
/// bug, answered 500 rather than served unlimited.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("no identity on the request (the identity layer is missing)")]
pub struct MissingIdentity;
