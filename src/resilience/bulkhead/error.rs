//! [`BulkheadFull`].

/// Every slot of the dependency's bulkhead is taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dependency} bulkhead full")]
pub struct BulkheadFull {
    /// The dependency whose bulkhead is full.
    pub dependency: &'static str,
}
