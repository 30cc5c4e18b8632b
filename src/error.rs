//! Errors every module shares, at the bottom of the layering so that each
//! section's owner can validate its own config: [`ConfigError`] names the
//! key and the value at fault.

use std::fmt;

/// A configuration problem, naming the key and the value at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    key: String,
    value: Option<String>,
    reason: String,
}

impl ConfigError {
    /// A value that parsed but is not acceptable.
    pub fn invalid(
        key: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            key: key.into(),
            value: Some(value.into()),
            reason: reason.into(),
        }
    }

    /// A file that does not parse; `key` is the path to the bad entry.
    pub fn parse(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: None,
            reason: reason.into(),
        }
    }

    /// A file that cannot be read.
    pub fn io(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            key: path.into(),
            value: None,
            reason: reason.into(),
        }
    }

    /// The key (dotted path) at fault.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = if self.key.is_empty() || self.key == "." {
            "(top level)"
        } else {
            &self.key
        };
        match &self.value {
            Some(value) => write!(f, "invalid config `{key}` = {value}: {}", self.reason),
            None => write!(f, "invalid config `{key}`: {}", self.reason),
        }
    }
}

impl std::error::Error for ConfigError {}
