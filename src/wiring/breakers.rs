//! [`Breakers`]: every circuit breaker of this process, by dependency
//! name, filled in while the stacks are built and read by `/ready` and the
//! admin API.

use crate::resilience::{Breaker, BreakerSnapshot, DependencyStack};

/// Every breaker of this process, by dependency name.
#[derive(Debug, Default)]
pub struct Breakers(Vec<Breaker>);

impl Breakers {
    /// Registers a stack's breaker (no-op when its breaker is disabled).
    pub fn add(&mut self, stack: &DependencyStack) {
        if let Some(b) = stack.breaker() {
            self.0.push(b.clone());
        }
    }

    /// The breaker of `dependency`.
    pub fn get(&self, dependency: &str) -> Option<&Breaker> {
        self.0.iter().find(|b| b.dependency() == dependency)
    }

    /// Snapshots of every breaker.
    pub fn snapshots(&self) -> Vec<BreakerSnapshot> {
        self.0.iter().map(Breaker::snapshot).collect()
    }
}
