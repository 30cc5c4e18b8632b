//! [`QueuePolicies`]: which [`QueuePolicy`] each tenant queues under.

use std::collections::HashMap;

use super::QueuePolicy;

/// Each tenant's queue policy; the `default` tenant entry (else the
/// built-in defaults) covers the rest, the anonymous tiers included.
#[derive(Debug, Clone, Default)]
pub struct QueuePolicies {
    by_tenant: HashMap<String, QueuePolicy>,
    fallback: QueuePolicy,
}

impl QueuePolicies {
    /// Policies for these tenants, and `fallback` for everyone else.
    pub fn new(by_tenant: HashMap<String, QueuePolicy>, fallback: QueuePolicy) -> Self {
        Self {
            by_tenant,
            fallback,
        }
    }

    /// The policy of `tenant`.
    pub fn get(&self, tenant: &str) -> QueuePolicy {
        self.by_tenant.get(tenant).copied().unwrap_or(self.fallback)
    }
}
