//! What the simulator serves: the built-in collection's name and the
//! embedding dimension.

use thiserror::Error;

/// Name of the built-in Qdrant collection holding the Acme knowledge base.
pub const DEFAULT_COLLECTION: &str = "acme_kb";

/// Dimension of the embeddings and of the built-in collection's vectors.
pub const DEFAULT_DIM: usize = 64;

/// Largest embedding dimension accepted; keeps a typo from allocating gigabytes.
const MAX_DIM: usize = 65_536;

/// Configuration of one simulator instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Name of the built-in collection loaded with the Acme knowledge base.
    pub collection: String,
    /// Dimension of `/v1/embeddings` vectors and of the built-in collection.
    pub dim: usize,
}

/// A [`SimConfig`] value that cannot be served.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `dim` is zero or absurdly large.
    #[error("dim must be between 1 and {MAX_DIM}, got {0}")]
    Dim(usize),
    /// `collection` is empty or contains a `/`.
    #[error("collection must be a non-empty name without '/', got {0:?}")]
    Collection(String),
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            collection: DEFAULT_COLLECTION.to_owned(),
            dim: DEFAULT_DIM,
        }
    }
}

impl SimConfig {
    /// Checks the configuration, naming the bad key and value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.dim == 0 || self.dim > MAX_DIM {
            return Err(ConfigError::Dim(self.dim));
        }
        if self.collection.is_empty() || self.collection.contains('/') {
            return Err(ConfigError::Collection(self.collection.clone()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert_eq!(SimConfig::default().validate(), Ok(()));
    }

    #[test]
    fn zero_dim_is_rejected() {
        let config = SimConfig {
            dim: 0,
            ..SimConfig::default()
        };
        assert_eq!(config.validate(), Err(ConfigError::Dim(0)));
    }
}
