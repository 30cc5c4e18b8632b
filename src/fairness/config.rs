//! `[fairness]` and the per-tenant queue policy ([`QueuePolicy`]), whose
//! fields sit next to each tenant's limits (`ratelimit.tenants.<t>`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// Default tenant weight.
pub const DEFAULT_WEIGHT: u32 = 1;
/// Default bound on one tenant's queue.
pub const DEFAULT_MAX_QUEUE: usize = 64;
/// Default longest wait in a tenant's queue.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(2);

/// Largest accepted weight: weights are ratios, and a huge one would make
/// every other tenant's share round to nothing.
const MAX_WEIGHT: u32 = 1000;
/// Largest accepted queue bound per tenant.
const MAX_QUEUE: usize = 100_000;
/// Longest accepted `max_wait`: past this a client has long given up.
const MAX_WAIT: Duration = Duration::from_secs(300);

/// `[fairness]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FairnessConfig {
    /// Put the LLM behind per-tenant fair queues. Default `true`; `false`
    /// leaves only the bulkhead, which refuses whoever arrives while it is
    /// full.
    pub enabled: bool,
    /// Concurrent LLM calls the queues dispatch into. Default: the LLM's
    /// `resilience.llm.bulkhead.max_concurrent` (the bulkhead stays behind
    /// the queues as a safety net).
    pub capacity: Option<usize>,
    /// Concurrent searches a remote vector store's queues dispatch into.
    /// Default: `resilience.vector_store.bulkhead.max_concurrent`.
    pub vector_store_capacity: Option<usize>,
}

impl Default for FairnessConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            capacity: None,
            vector_store_capacity: None,
        }
    }
}

impl FairnessConfig {
    /// Checks the capacity.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("fairness.capacity", self.capacity),
            ("fairness.vector_store_capacity", self.vector_store_capacity),
        ] {
            if let Some(c) = value {
                if c == 0 || c > 100_000 {
                    return Err(ConfigError::invalid(
                        key,
                        c.to_string(),
                        "must be between 1 and 100000",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// One tenant's queue: validated, so a bad value cannot exist after load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePolicy {
    weight: u32,
    max_queue: usize,
    max_wait: Duration,
}

impl Default for QueuePolicy {
    fn default() -> Self {
        Self {
            weight: DEFAULT_WEIGHT,
            max_queue: DEFAULT_MAX_QUEUE,
            max_wait: DEFAULT_MAX_WAIT,
        }
    }
}

impl QueuePolicy {
    /// A policy, or the error naming the key under `prefix` (e.g.
    /// `ratelimit.tenants.acme`) and the value at fault.
    pub fn try_new(
        prefix: &str,
        weight: u32,
        max_queue: usize,
        max_wait: Duration,
    ) -> Result<Self, ConfigError> {
        if weight == 0 || weight > MAX_WEIGHT {
            return Err(ConfigError::invalid(
                format!("{prefix}.weight"),
                weight.to_string(),
                format!("must be between 1 and {MAX_WEIGHT}"),
            ));
        }
        if max_queue == 0 || max_queue > MAX_QUEUE {
            return Err(ConfigError::invalid(
                format!("{prefix}.max_queue"),
                max_queue.to_string(),
                format!("must be between 1 and {MAX_QUEUE}"),
            ));
        }
        if max_wait.is_zero() || max_wait > MAX_WAIT {
            return Err(ConfigError::invalid(
                format!("{prefix}.max_wait"),
                humantime::format_duration(max_wait).to_string(),
                "must be more than 0 and at most 5m",
            ));
        }
        Ok(Self {
            weight,
            max_queue,
            max_wait,
        })
    }

    /// The tenant's share of capacity relative to others.
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// Requests that may wait at once.
    pub fn max_queue(&self) -> usize {
        self.max_queue
    }

    /// Longest wait before a slot.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }
}
