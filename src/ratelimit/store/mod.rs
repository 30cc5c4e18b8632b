//! Limit stores: the algorithms behind one small trait, each with an
//! in-process implementation (the embedded default) and a Redis one.
//!
//! Every limit that applies to a request is checked and consumed in ONE
//! call ([`LimitStore::check`]): if any enforced limit rejects, none is
//! consumed. For Redis that call is one Lua script run via EVALSHA, which
//! reads the clock from Redis `TIME` so replicas with skewed clocks agree.
//!
//! # Semantics shared by both stores
//!
//! Both stores implement the same integer-microsecond arithmetic, so they
//! agree exactly (the tests drive both with the same arrival times).
//!
//! - `remaining` is what is left after the call: `available - cost` when
//!   the request was consumed, the untouched `available` otherwise (0 when
//!   the limit is exhausted).
//! - `retry_after` is the exact time until this request, with its cost,
//!   would be admitted by that limit alone (assuming no other traffic);
//!   zero when the limit admits. A cost above the limit's capacity
//!   (`limit`, or `burst` for GCRA) can never be admitted: such a request
//!   is rejected with `retry_after = window`.
//! - `reset_after` (zero when nothing is counted):
//!   - sliding log: until the oldest counted unit leaves the window;
//!   - sliding window and fixed window: until the current window ends (for
//!     the sliding window, the current window's count still weighs on the
//!     next one, decaying linearly);
//!   - GCRA: until the theoretical arrival time (TAT), when the bucket is
//!     full again.
//! - GCRA's emission interval is `T = ceil(window / limit)` in whole
//!   microseconds (60 s / 7 → 8 571 429 µs), so the sustained rate is at
//!   most 1 µs per unit slower than `limit / window`; the tolerance is
//!   `burst × T` (`burst` defaults to `limit` when 0).
//! - Windows (fixed and sliding) are aligned to multiples of `window`
//!   on the store's clock.
//! - A key must be used with one algorithm only, and the keys of one check
//!   must be distinct.
//! - The sliding window compares `prev × (window − elapsed)` with
//!   `(limit − cur − cost) × window` in exact integers; Redis Lua computes in
//!   doubles, so `limit × window_µs` must stay below 2^53 (a one-hour
//!   window allows limits up to 2.5 million).
//!
//! [`LimitStore::adjust`] settles token budgets: GCRA moves the TAT by
//! `delta × T` (a charge starts from `max(TAT, now)`, a refund never goes
//! below `now`); the window algorithms add `delta` to the current window's
//! count, floored at 0; the sliding log adds `delta` members or removes the
//! `|delta|` newest — O(|delta|), so token budgets should use GCRA.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

mod memory;
#[cfg(test)]
mod models;
mod redis;

pub use self::memory::MemoryStore;
pub use self::redis::RedisStore;

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
#[derive(Debug, Clone, thiserror::Error)]
#[error("limit store unavailable: {reason}")]
pub struct StoreUnavailable {
    /// What went wrong (never contains key names or secrets).
    pub reason: String,
    /// Whether it was a timeout.
    pub timeout: bool,
    /// Whether the store was not even called (its breaker is open): the
    /// steady state of an outage, not a new failure.
    pub refused: bool,
}

/// How the Redis stack's breaker judges a store failure: a timeout is a
/// timeout, anything else means Redis could not be used.
impl crate::resilience::ClassifyFailure for StoreUnavailable {
    fn failure_class(&self) -> crate::resilience::FailureClass {
        use crate::resilience::FailureClass;
        if self.refused {
            FailureClass::Refused
        } else if self.timeout {
            FailureClass::Timeout
        } else {
            FailureClass::Unreachable
        }
    }
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
    async fn check(
        &self,
        limits: &[LimitSpec],
        request_id: &str,
    ) -> Result<Decision, StoreUnavailable>;

    /// Charges (`delta > 0`) or refunds (`delta < 0`) units without
    /// rejecting: how a token budget settles an estimate with real usage.
    /// Refunds never take a limit below empty.
    async fn adjust(&self, limit: &LimitSpec, delta: i64) -> Result<(), StoreUnavailable>;
}

/// A duration in whole microseconds (saturating), at least 1 µs: a zero
/// window would divide by zero.
pub(crate) fn window_us(window: Duration) -> u64 {
    u64::try_from(window.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// The per-limit numbers both stores compute with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    /// The window in µs (≥ 1).
    pub(crate) window: u64,
    /// Units per window.
    pub(crate) limit: u64,
    /// The most units one request may take: `limit`, or `burst` for GCRA.
    pub(crate) capacity: u64,
    /// Units this request takes.
    pub(crate) cost: u64,
    /// GCRA emission interval in µs: `ceil(window / limit)` (0 otherwise).
    pub(crate) interval: u64,
}

impl Params {
    /// Normalises a spec.
    pub(crate) fn of(spec: &LimitSpec) -> Self {
        let window = window_us(spec.window);
        let (capacity, interval) = match spec.algorithm {
            Algorithm::Gcra => {
                let burst = if spec.burst == 0 {
                    spec.limit
                } else {
                    spec.burst
                };
                (burst, window.div_ceil(spec.limit.max(1)))
            }
            _ => (spec.limit, 0),
        };
        Self {
            window,
            limit: spec.limit,
            capacity,
            cost: spec.cost,
            interval,
        }
    }

    /// The limit reported in [`LimitState::limit`] (GCRA reports `burst`).
    pub(crate) fn reported_limit(&self, algorithm: Algorithm) -> u64 {
        match algorithm {
            Algorithm::Gcra => self.capacity,
            _ => self.limit,
        }
    }
}
