//! Tenant isolation in front of a capacity-limited dependency: per-tenant
//! bounded FIFO queues, dispatched weighted-fair by cost, work-conserving.
//!
//! Rate limits bound each tenant's rate; they cannot stop the sum of
//! admitted rates from exceeding what the backend serves. [`FairQueue`]
//! holds the backend's capacity (concurrent calls) and hands free slots to
//! the waiting tenant that has received the least service so far, counted
//! in estimated tokens divided by the tenant's weight: the virtual token
//! counter of "Fairness in Serving Large Language Models" (OSDI 2024). A
//! tenant's counter is charged its estimate at dispatch and settled with
//! the real usage afterwards, so a tenant sending 10× larger prompts gets
//! its share of tokens, not 10× the share.
//!
//! - Work-conserving: a free slot never waits while anyone is queued, and
//!   an uncontended call takes its slot at once.
//! - A request waits only while it can still be served within its tenant's
//!   `max_wait` (and the deadline): a full queue, or a wait that would go
//!   past it, is refused at once with [`TenantQueueFull`] (429, the
//!   tenant's own doing) or, when the tenant is under its fair share and
//!   still cannot be served, [`Overloaded`] (503, saturated for everyone).
//! - A cancelled wait (the client went away) leaves its queue at once.

mod config;
mod error;
mod metrics;
mod policies;
mod queue;

pub use config::{
    FairnessConfig, QueuePolicy, DEFAULT_MAX_QUEUE, DEFAULT_MAX_WAIT, DEFAULT_WEIGHT,
};
pub use error::{Overloaded, TenantQueueFull};
pub use metrics::{FairnessFamilies, FairnessMetrics};
pub use policies::QueuePolicies;
pub use queue::{FairQueue, Permit};

/// The fair-queue tenant of anonymous callers on an internal network.
pub const ANONYMOUS_INTERNAL: &str = "anon:internal";
/// The fair-queue tenant of anonymous callers on a public network.
pub const ANONYMOUS_PUBLIC: &str = "anon:public";

#[cfg(test)]
mod tests;
