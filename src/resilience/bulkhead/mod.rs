//! The bulkhead: at most N concurrent calls to a dependency. When full it
//! rejects at once with [`BulkheadFull`] instead of queueing (a queue in
//! front of a slow dependency only converts its latency into ours), and the
//! breaker ignores that rejection: it is our back-pressure, not the
//! dependency's fault.

mod error;
mod future;
mod layer;
mod service;

pub use error::BulkheadFull;
pub use future::ResponseFuture;
pub use layer::BulkheadLayer;
pub use service::Bulkhead;

#[cfg(test)]
mod tests;
