//! [`QueuePolicies`]: which [`QueuePolicy`] each tenant queues under.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::QueuePolicy;

/// Each tenant's queue policy; the `default` tenant entry (else the
/// built-in defaults) covers the rest, the anonymous tiers included.
///
/// A shared handle: clones see the same table, so one
/// [`QueuePolicies::replace`] (a live reload) reaches every queue that
/// was given a clone. A waiter already queued keeps the weight it was
/// queued with; the next one gets the new weight.
#[derive(Debug, Clone, Default)]
pub struct QueuePolicies {
    table: Arc<ArcSwap<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    by_tenant: HashMap<String, QueuePolicy>,
    fallback: QueuePolicy,
}

impl QueuePolicies {
    /// Policies for these tenants, and `fallback` for everyone else.
    pub fn new(by_tenant: HashMap<String, QueuePolicy>, fallback: QueuePolicy) -> Self {
        Self {
            table: Arc::new(ArcSwap::from_pointee(Table {
                by_tenant,
                fallback,
            })),
        }
    }

    /// The policy of `tenant`.
    pub fn get(&self, tenant: &str) -> QueuePolicy {
        let table = self.table.load();
        table
            .by_tenant
            .get(tenant)
            .copied()
            .unwrap_or(table.fallback)
    }

    /// Puts `other`'s table in force for every clone of `self`.
    pub fn replace(&self, other: &QueuePolicies) {
        self.table.store(other.table.load_full());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_reaches_every_clone() {
        let weight = |w| QueuePolicy::try_new("t", w, 10, std::time::Duration::from_secs(1));
        let Ok(one) = weight(1) else {
            panic!("valid policy")
        };
        let Ok(five) = weight(5) else {
            panic!("valid policy")
        };
        let policies = QueuePolicies::new(HashMap::from([("a".to_owned(), one)]), one);
        let clone = policies.clone();
        let next = QueuePolicies::new(HashMap::from([("a".to_owned(), five)]), one);
        policies.replace(&next);
        assert_eq!(clone.get("a").weight(), 5);
        assert_eq!(clone.get("b").weight(), 1);
    }
}
