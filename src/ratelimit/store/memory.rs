//! The in-process limit store: the embedded default for a single replica.
//!
//! The algorithms live in [`MemoryCore`], a pure state machine driven by an
//! explicit `now` in microseconds, so property tests can replay arbitrary
//! arrival times; [`MemoryStore`] only adds a lock and tokio's clock.
//! Expired entries (whose state is logically empty) are swept every
//! [`SWEEP_EVERY`] operations, or sooner when the map doubles, so memory is
//! bounded by the keys active within one window (two for sliding windows).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Algorithm, Decision, LimitSpec, LimitState, LimitStore, Params, StoreUnavailable};

/// Expired entries are swept after this many operations.
const SWEEP_EVERY: u64 = 1024;
/// ...or as soon as the map holds this many entries (then twice what
/// survived the last sweep).
const MIN_SWEEP_LEN: usize = 1024;

/// The in-process [`LimitStore`]: exact and atomic within one process.
#[derive(Debug)]
pub struct MemoryStore {
    core: Mutex<MemoryCore>,
    base: Instant,
}

/// The clock-free algorithm core of [`MemoryStore`].
#[derive(Debug, Default, Clone)]
pub(crate) struct MemoryCore {
    slots: HashMap<String, Slot>,
    ops_since_sweep: u64,
    sweep_at_len: usize,
}

/// One key's state and the instant (µs) after which it is logically empty.
#[derive(Debug, Clone)]
struct Slot {
    state: State,
    expires_at: u64,
}

/// Per-algorithm state, always "rolled" to the current instant before use.
#[derive(Debug, Clone)]
enum State {
    /// Runs of `(timestamp µs, units)`, oldest first.
    /// Runs of `(timestamp µs, units)`, oldest first, and their total
    /// (kept so a check is O(1), not O(runs)).
    Log(VecDeque<(u64, u64)>, u64),
    /// Sliding window: the current window's start and both counts.
    Window { start: u64, prev: u64, cur: u64 },
    /// GCRA theoretical arrival time (µs).
    Gcra { tat: u64 },
    /// Fixed window: the current window's start and count.
    Fixed { start: u64, cur: u64 },
}

impl MemoryStore {
    /// An empty store whose clock starts now.
    pub fn new() -> Self {
        Self {
            core: Mutex::new(MemoryCore::default()),
            base: Instant::now(),
        }
    }

    /// [`LimitStore::check`] at an explicit instant (µs on the store's
    /// clock). For tests; instants must not go backwards.
    #[doc(hidden)]
    pub fn check_at(&self, now_us: u64, limits: &[LimitSpec]) -> Decision {
        self.lock().check_at(now_us, limits)
    }

    /// [`LimitStore::adjust`] at an explicit instant (µs). For tests.
    #[doc(hidden)]
    pub fn adjust_at(&self, now_us: u64, limit: &LimitSpec, delta: i64) {
        self.lock().adjust_at(now_us, limit, delta);
    }

    /// How many keys are held (expired ones linger until the next sweep).
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryCore> {
        // The core never panics half-way through a mutation that matters
        // more than a rate-limit count, so a poisoned lock is still usable.
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl LimitStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn check(
        &self,
        limits: &[LimitSpec],
        _request_id: &str,
    ) -> Result<Decision, StoreUnavailable> {
        // Units are counted, not named, so request ids are not needed here.
        Ok(self.check_at(self.now_us(), limits))
    }

    async fn adjust(&self, limit: &LimitSpec, delta: i64) -> Result<(), StoreUnavailable> {
        self.adjust_at(self.now_us(), limit, delta);
        Ok(())
    }
}

impl MemoryCore {
    /// Evaluates every limit at `now`, then consumes only if every enforced
    /// limit admits (see the module docs of `store`).
    pub(crate) fn check_at(&mut self, now: u64, limits: &[LimitSpec]) -> Decision {
        self.maybe_sweep(now);
        let mut taken: Vec<(String, State)> = Vec::with_capacity(limits.len());
        let mut verdicts = Vec::with_capacity(limits.len());
        for spec in limits {
            let (key, state) = self.take(spec, now);
            verdicts.push(state.evaluate(&Params::of(spec), now));
            taken.push((key, state));
        }
        let allowed = limits
            .iter()
            .zip(&verdicts)
            .all(|(spec, (admits, _))| spec.shadow || *admits);
        let mut states = Vec::with_capacity(limits.len());
        for ((spec, (key, mut state)), (admits, retry)) in limits.iter().zip(taken).zip(verdicts) {
            let p = Params::of(spec);
            if allowed && admits {
                state.consume(&p, now, p.cost);
            }
            let (remaining, reset) = state.report(&p, now);
            states.push(LimitState {
                allowed: admits,
                limit: p.reported_limit(spec.algorithm),
                remaining,
                reset_after: Duration::from_micros(reset),
                retry_after: Duration::from_micros(retry),
            });
            self.put(key, state, &p, now);
        }
        Decision { allowed, states }
    }

    /// Charges (`delta > 0`) or refunds (`delta < 0`) without rejecting.
    pub(crate) fn adjust_at(&mut self, now: u64, spec: &LimitSpec, delta: i64) {
        self.maybe_sweep(now);
        let p = Params::of(spec);
        let (key, mut state) = self.take(spec, now);
        match delta.cmp(&0) {
            std::cmp::Ordering::Greater => state.consume(&p, now, delta.unsigned_abs()),
            std::cmp::Ordering::Less => state.refund(&p, now, delta.unsigned_abs()),
            std::cmp::Ordering::Equal => {}
        }
        self.put(key, state, &p, now);
    }

    /// Removes the key's state, rolled to `now` (fresh if missing, expired
    /// or of another algorithm).
    fn take(&mut self, spec: &LimitSpec, now: u64) -> (String, State) {
        let p = Params::of(spec);
        let (key, state) = match self.slots.remove_entry(&spec.key) {
            Some((key, slot)) if slot.expires_at > now => (key, Some(slot.state)),
            _ => (spec.key.clone(), None),
        };
        let state = state
            .filter(|s| s.algorithm() == spec.algorithm)
            .unwrap_or_else(|| State::fresh(spec.algorithm));
        (key, state.rolled(&p, now))
    }

    /// Stores the state back unless it is empty.
    fn put(&mut self, key: String, state: State, p: &Params, now: u64) {
        if let Some(expires_at) = state.expires_at(p, now) {
            self.slots.insert(key, Slot { state, expires_at });
        }
    }

    fn maybe_sweep(&mut self, now: u64) {
        self.ops_since_sweep += 1;
        if self.ops_since_sweep >= SWEEP_EVERY
            || self.slots.len() >= self.sweep_at_len.max(MIN_SWEEP_LEN)
        {
            self.slots.retain(|_, slot| slot.expires_at > now);
            self.ops_since_sweep = 0;
            self.sweep_at_len = MIN_SWEEP_LEN.max(self.slots.len().saturating_mul(2));
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}

impl State {
    fn fresh(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::SlidingLog => Self::Log(VecDeque::new(), 0),
            Algorithm::SlidingWindow => Self::Window {
                start: 0,
                prev: 0,
                cur: 0,
            },
            Algorithm::Gcra => Self::Gcra { tat: 0 },
            Algorithm::FixedWindow => Self::Fixed { start: 0, cur: 0 },
        }
    }

    fn algorithm(&self) -> Algorithm {
        match self {
            Self::Log(..) => Algorithm::SlidingLog,
            Self::Window { .. } => Algorithm::SlidingWindow,
            Self::Gcra { .. } => Algorithm::Gcra,
            Self::Fixed { .. } => Algorithm::FixedWindow,
        }
    }

    /// The same logical state, expressed at `now`: expired log runs
    /// dropped, windows advanced. Never changes a decision.
    fn rolled(self, p: &Params, now: u64) -> Self {
        let start_now = now - now % p.window;
        match self {
            Self::Log(mut runs, mut total) => {
                while let Some(&(ts, units)) = runs.front() {
                    if ts.saturating_add(p.window) > now {
                        break;
                    }
                    total -= units;
                    runs.pop_front();
                }
                Self::Log(runs, total)
            }
            Self::Window { start, cur, .. }
                if start != start_now && start.saturating_add(p.window) == start_now =>
            {
                Self::Window {
                    start: start_now,
                    prev: cur,
                    cur: 0,
                }
            }
            Self::Window { start, .. } if start != start_now => Self::Window {
                start: start_now,
                prev: 0,
                cur: 0,
            },
            Self::Fixed { start, .. } if start != start_now => Self::Fixed {
                start: start_now,
                cur: 0,
            },
            other => other,
        }
    }

    /// Phase one: does this limit alone admit `p.cost` now, and if not,
    /// how long until it would (µs)?
    fn evaluate(&self, p: &Params, now: u64) -> (bool, u64) {
        if p.cost > p.capacity {
            return (false, p.window);
        }
        match *self {
            Self::Log(ref runs, n) => {
                if n + p.cost <= p.limit {
                    return (true, 0);
                }
                // The k oldest units must leave the window for `cost` to fit.
                let mut k = n + p.cost - p.limit;
                for &(ts, units) in runs {
                    if units >= k {
                        return (false, ts + p.window - now);
                    }
                    k -= units;
                }
                (false, p.window) // unreachable: k <= n
            }
            Self::Window { start, prev, cur } => window_evaluate(p, now - start, prev, cur),
            Self::Gcra { tat } => {
                let tolerance = p.capacity.saturating_mul(p.interval);
                let new_tat = tat
                    .max(now)
                    .saturating_add(p.cost.saturating_mul(p.interval));
                if new_tat - now <= tolerance {
                    (true, 0)
                } else {
                    (false, new_tat - tolerance - now)
                }
            }
            Self::Fixed { start, cur } => {
                if cur.saturating_add(p.cost) <= p.limit {
                    (true, 0)
                } else {
                    (false, start + p.window - now)
                }
            }
        }
    }

    /// Phase two (or a forced charge): takes `units`.
    fn consume(&mut self, p: &Params, now: u64, units: u64) {
        match self {
            Self::Log(runs, total) => {
                *total = total.saturating_add(units);
                match runs.back_mut() {
                    Some((ts, n)) if *ts == now => *n = n.saturating_add(units),
                    _ => runs.push_back((now, units)),
                }
            }
            Self::Window { cur, .. } | Self::Fixed { cur, .. } => *cur = cur.saturating_add(units),
            Self::Gcra { tat } => {
                *tat = (*tat)
                    .max(now)
                    .saturating_add(units.saturating_mul(p.interval));
            }
        }
    }

    /// Gives back `units` (newest first for the log), never below empty.
    fn refund(&mut self, p: &Params, now: u64, mut units: u64) {
        match self {
            Self::Log(runs, total) => {
                while units > 0 {
                    let Some((_, n)) = runs.back_mut() else { break };
                    let taken = units.min(*n);
                    *n -= taken;
                    *total -= taken;
                    units -= taken;
                    if *n == 0 {
                        runs.pop_back();
                    }
                }
            }
            Self::Window { cur, .. } | Self::Fixed { cur, .. } => *cur = cur.saturating_sub(units),
            Self::Gcra { tat } => {
                *tat = tat
                    .saturating_sub(units.saturating_mul(p.interval))
                    .max(now);
            }
        }
    }

    /// `(remaining, reset_after µs)` of the state as it is now.
    fn report(&self, p: &Params, now: u64) -> (u64, u64) {
        match *self {
            Self::Log(ref runs, n) => {
                let reset = runs.front().map_or(0, |&(ts, _)| ts + p.window - now);
                (p.limit.saturating_sub(n), reset)
            }
            Self::Window { start, prev, cur } => {
                let w = u128::from(p.window);
                let avail = u128::from(p.limit.saturating_sub(cur)) * w;
                let used = u128::from(prev) * (w - u128::from(now - start));
                let remaining = u64::try_from(avail.saturating_sub(used) / w).unwrap_or(u64::MAX);
                let reset = if prev > 0 || cur > 0 {
                    start + p.window - now
                } else {
                    0
                };
                (remaining, reset)
            }
            Self::Gcra { tat } => {
                let level = tat.max(now) - now;
                let tolerance = p.capacity.saturating_mul(p.interval);
                (tolerance.saturating_sub(level) / p.interval, level)
            }
            Self::Fixed { start, cur } => {
                let reset = if cur > 0 { start + p.window - now } else { 0 };
                (p.limit.saturating_sub(cur), reset)
            }
        }
    }

    /// When the state becomes logically empty; `None` if it already is.
    fn expires_at(&self, p: &Params, now: u64) -> Option<u64> {
        match *self {
            Self::Log(ref runs, _) => runs.back().map(|&(ts, _)| ts.saturating_add(p.window)),
            Self::Window { start, prev, cur } => {
                (prev > 0 || cur > 0).then(|| start.saturating_add(p.window.saturating_mul(2)))
            }
            Self::Gcra { tat } => (tat > now).then_some(tat),
            Self::Fixed { start, cur } => (cur > 0).then(|| start.saturating_add(p.window)),
        }
    }
}

/// Sliding-window admission and exact retry time. The estimate is
/// `prev × (W − e) / W + cur`; the request fits iff
/// `prev × (W − e) ≤ (L − cur − cost) × W`, compared in exact integers.
fn window_evaluate(p: &Params, elapsed: u64, prev: u64, cur: u64) -> (bool, u64) {
    let w = u128::from(p.window);
    let (prev, cur, limit, cost) = (
        u128::from(prev),
        u128::from(cur),
        u128::from(p.limit),
        u128::from(p.cost),
    );
    let e = u128::from(elapsed);
    if cur + cost <= limit {
        let room = (limit - cur - cost) * w;
        if prev * (w - e) <= room {
            return (true, 0);
        }
        // Rejected with room left: prev > 0, and the previous window's
        // weight must decay until prev × (W − e − r) ≤ room.
        return (false, to_u64(w - e - room / prev));
    }
    // The current count alone is too high: wait for the roll (cur becomes
    // prev, cost ≤ limit < cur + cost so cur > 0), then for its decay.
    let after_roll = w - (limit - cost) * w / cur;
    (false, to_u64(w - e + after_roll))
}

fn to_u64(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
