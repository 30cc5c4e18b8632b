//! `[memory]` and `[router]`, and what retrieval does on failure: the
//! pipeline's settings (validated with the rest of the file in `config`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default cap on remembered turns per thread (a turn is one message).
pub const DEFAULT_MEMORY_MAX_TURNS: usize = 20;
/// Default cap on remembered bytes per thread.
pub const DEFAULT_MEMORY_MAX_BYTES: usize = 16 * 1024;
/// Default time a thread is remembered after its last message.
pub const DEFAULT_MEMORY_TTL: Duration = Duration::from_secs(3600);
/// Default cap on threads held by the in-process memory.
pub const DEFAULT_MEMORY_MAX_THREADS: usize = 10_000;

/// What the pipeline does when retrieval fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetrievalFallback {
    /// Fail the request with the dependency's error.
    #[default]
    Fail,
    /// Answer without retrieved passages, marked degraded.
    Degrade,
}

/// Conversation memory.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Messages remembered per thread (user and assistant each count one).
    /// Default 20.
    pub max_turns: usize,
    /// Bytes of message text remembered per thread. Default 16 KiB.
    pub max_bytes: usize,
    /// A thread is forgotten this long after its last message. Default 1 h.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// Threads held by the in-process store before the least recently used
    /// is evicted. Default 10 000.
    pub max_threads: usize,
}

/// Where a question goes after the router stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// Retrieve passages, then synthesize an answer from them.
    Retrieve,
    /// Answer directly, without retrieval.
    Direct,
}

/// The router stage: the first matching rule decides, else `default_route`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// Route taken when no rule matches. Default `retrieve`.
    pub default_route: Route,
    /// Keyword rules, tried in order. Default: greetings and thanks go
    /// `direct`.
    pub rules: Vec<RouterRule>,
}

/// One router rule: matches when the message contains any keyword as whole
/// words (case-insensitive).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterRule {
    /// Name reported in logs.
    pub name: String,
    /// Words or phrases; any one matching selects `route`.
    pub keywords: Vec<String>,
    /// Route taken on a match.
    pub route: Route,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            max_turns: DEFAULT_MEMORY_MAX_TURNS,
            max_bytes: DEFAULT_MEMORY_MAX_BYTES,
            ttl: DEFAULT_MEMORY_TTL,
            max_threads: DEFAULT_MEMORY_MAX_THREADS,
        }
    }
}

impl Default for RouterConfig {
    fn default() -> Self {
        let smalltalk = ["hello", "hi", "hey", "thanks", "thank you", "good morning"];
        Self {
            default_route: Route::Retrieve,
            rules: vec![RouterRule {
                name: "smalltalk".to_owned(),
                keywords: smalltalk.iter().map(|s| (*s).to_owned()).collect(),
                route: Route::Direct,
            }],
        }
    }
}
