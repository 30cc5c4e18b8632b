//! Limit stores: the algorithms behind one small trait, each with an
//! in-process implementation (the embedded default) and a Redis one.
//!
//! Every limit that applies to a request is checked and consumed in ONE
//! call ([`LimitStore::check`]): if any enforced limit rejects, none is
//! consumed. For Redis that call is one Lua script run via EVALSHA, which
//! reads the clock from Redis `TIME` so replicas with skewed clocks agree.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// A rate-limit algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Exact: at most `limit` admitted in ANY interval of length `window`.
    /// One sorted-set member per admitted unit; O(limit) memory.
    SlidingLog,
    /// Two-counter approximation of a sliding window; O(1) memory.
    SlidingWindow,
    /// Generic cell rate algorithm (a token bucket): `limit` per `window`
    /// sustained, `burst` at once; supports `cost > 1`.
    Gcra,
    /// The classic INCR + EXPIRE window; admits up to twice the limit
    /// across a window boundary.
    FixedWindow,
}

/// One limit to check for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitSpec {
    /// Store key: namespaced, and never containing a secret (callers pass a
    /// key id or a hash, not an API key).
    pub key: String,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Units admitted per `window`.
    pub limit: u64,
    /// The window.
    pub window: Duration,
    /// GCRA only: units that may be taken at once (usually `limit`).
    pub burst: u64,
    /// Units this request takes (1 for a request; tokens for a budget).
    pub cost: u64,
    /// Shadow limits are counted and reported but never reject.
    pub shadow: bool,
}

/// One limit's state after a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitState {
    /// Whether this limit alone admits the request.
    pub allowed: bool,
    /// The limit (units per window; GCRA reports `burst`).
    pub limit: u64,
    /// Units left after this request (if admitted).
    pub remaining: u64,
    /// Time until the limit is fully replenished / the window resets.
    pub reset_after: Duration,
    /// When rejected: time until this request would be admitted. Zero when
    /// allowed.
    pub retry_after: Duration,
}

/// The outcome of one [`LimitStore::check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// True when every enforced (non-shadow) limit admits.
    pub allowed: bool,
    /// Per-limit states, in the order of the specs passed in.
    pub states: Vec<LimitState>,
}

/// The store could not answer (Redis down, timed out, script error).
#[derive(Debug, thiserror::Error)]
#[error("limit store unavailable: {reason}")]
pub struct StoreUnavailable {
    /// What went wrong (never contains key names or secrets).
    pub reason: String,
    /// Whether it was a timeout.
    pub timeout: bool,
}

/// Checks and consumes limits atomically.
#[async_trait]
pub trait LimitStore: Send + Sync + 'static {
    /// `memory` or `redis`.
    fn kind(&self) -> &'static str;

    /// Checks every limit; consumes from all of them only if every enforced
    /// limit admits (then shadow limits that admit are consumed too; a
    /// shadow limit that would reject is reported, not consumed). On
    /// rejection nothing is consumed. `request_id` makes sliding-log
    /// members unique per request.
    async fn check(&self, limits: &[LimitSpec], request_id: &str) -> Result<Decision, StoreUnavailable>;

    /// Charges (`delta > 0`) or refunds (`delta < 0`) units without
    /// rejecting: how a token budget settles an estimate with real usage.
    /// Refunds never take a limit below empty.
    async fn adjust(&self, limit: &LimitSpec, delta: i64) -> Result<(), StoreUnavailable>;
}
