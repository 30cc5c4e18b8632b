//! Reference models of the rate-limit algorithms, written from their
//! definitions and independently of the stores, for property tests. Shared
//! by the unit tests and `tests/ratelimit_store.rs` (included by path), so
//! it uses no crate types. Times are µs.

use std::collections::HashMap;

/// A reference model of one limit.
pub(crate) trait Model {
    /// Whether `cost` units at `t` fit.
    fn admits(&self, t: u64, cost: u64) -> bool;
    /// Records `cost` admitted units at `t`.
    fn consume(&mut self, t: u64, cost: u64);
}

/// The model for an algorithm named as in config (`sliding_log`, ...).
pub(crate) fn model(algorithm: &str, limit: u64, window: u64, burst: u64) -> Box<dyn Model> {
    match algorithm {
        "sliding_log" => Box::new(LogModel {
            limit,
            window,
            admitted: Vec::new(),
        }),
        "sliding_window" => Box::new(WindowModel {
            limit,
            window,
            counts: HashMap::new(),
            sliding: true,
        }),
        "fixed_window" => Box::new(WindowModel {
            limit,
            window,
            counts: HashMap::new(),
            sliding: false,
        }),
        "gcra" => {
            // Leaky bucket ("continuous state") form of GCRA: a level of
            // debt in µs that drains one per µs; each unit adds T.
            let interval = window.div_ceil(limit.max(1));
            let burst = if burst == 0 { limit } else { burst };
            Box::new(BucketModel {
                interval,
                capacity: burst,
                level: 0,
                last: 0,
            })
        }
        other => panic!("no model for {other}"),
    }
}

/// Admitted iff the units admitted in `(t - W, t]` plus `cost` fit.
struct LogModel {
    limit: u64,
    window: u64,
    admitted: Vec<(u64, u64)>,
}

impl Model for LogModel {
    fn admits(&self, t: u64, cost: u64) -> bool {
        let in_window: u64 = self
            .admitted
            .iter()
            .filter(|&&(ts, _)| ts + self.window > t)
            .map(|&(_, c)| c)
            .sum();
        in_window + cost <= self.limit
    }

    fn consume(&mut self, t: u64, cost: u64) {
        self.admitted.push((t, cost));
    }
}

/// Counts per window index `t / W`; fixed: `cur + cost <= L`; sliding:
/// `prev * (W - e) / W + cur + cost <= L`.
struct WindowModel {
    limit: u64,
    window: u64,
    counts: HashMap<u64, u64>,
    sliding: bool,
}

impl Model for WindowModel {
    fn admits(&self, t: u64, cost: u64) -> bool {
        let index = t / self.window;
        let cur = self.counts.get(&index).copied().unwrap_or(0);
        if cur + cost > self.limit {
            return false;
        }
        if !self.sliding {
            return true;
        }
        let prev = index
            .checked_sub(1)
            .and_then(|i| self.counts.get(&i))
            .copied()
            .unwrap_or(0);
        let elapsed = t % self.window;
        // Scaled by W to stay in integers.
        u128::from(prev) * u128::from(self.window - elapsed)
            <= u128::from(self.limit - cur - cost) * u128::from(self.window)
    }

    fn consume(&mut self, t: u64, cost: u64) {
        *self.counts.entry(t / self.window).or_insert(0) += cost;
    }
}

/// GCRA as a leaky bucket of capacity `burst * T`.
struct BucketModel {
    interval: u64,
    capacity: u64,
    level: u64,
    last: u64,
}

impl BucketModel {
    fn level_at(&self, t: u64) -> u64 {
        self.level.saturating_sub(t - self.last)
    }
}

impl Model for BucketModel {
    fn admits(&self, t: u64, cost: u64) -> bool {
        self.level_at(t) + cost * self.interval <= self.capacity * self.interval
    }

    fn consume(&mut self, t: u64, cost: u64) {
        self.level = self.level_at(t) + cost * self.interval;
        self.last = t;
    }
}
