//! The dependencies Levee protects, each behind a small trait with a real
//! client and an embedded default:
//!
//! - [`Llm`]: [`OpenAiClient`] (OpenAI-compatible `/chat/completions`) or the
//!   built-in [`ExtractiveAnswerer`];
//! - [`VectorStore`]: [`QdrantClient`] (REST points search, query vectors from
//!   an [`Embedder`]) or the built-in [`LocalIndex`];
//! - [`Embedder`]: [`OpenAiClient`] (`/embeddings`).
//!
//! The pipeline only sees the traits, so resilience layers and tests can wrap
//! or replace any of them.

use std::fmt;

use async_trait::async_trait;
use serde::Serialize;

pub mod config;
mod error;
mod extractive;
pub mod fair;
mod local;
mod metrics;
mod openai;
mod qdrant;
pub mod redis_conn;
pub mod trace;

pub use error::{UpstreamError, UpstreamErrorKind};
pub use extractive::ExtractiveAnswerer;
pub use local::LocalIndex;
pub use metrics::{TokenKind, UpstreamMetrics, UpstreamOutcome};
pub use openai::{retry_after, OpenAiClient};
pub use qdrant::QdrantClient;

/// A dependency, as named in errors, metrics and `/ready`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dependency {
    /// The LLM (completions and embeddings).
    Llm,
    /// The vector store.
    VectorStore,
    /// Redis (conversation memory and the limiter store).
    Redis,
}

impl Dependency {
    /// The stable lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Llm => "llm",
            Self::VectorStore => "vector_store",
            Self::Redis => "redis",
        }
    }
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One retrieved passage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Passage {
    /// Document id.
    pub id: String,
    /// Document title.
    pub title: String,
    /// Where the document lives (a path or URL).
    pub source: String,
    /// The passage text.
    #[serde(skip)]
    pub text: String,
    /// Relevance score from the store (higher is better).
    pub score: f32,
}

/// Who said a remembered message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The client.
    User,
    /// Levee's answer.
    Assistant,
}

/// One remembered message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Turn {
    /// Who said it.
    pub role: Role,
    /// What was said.
    pub content: String,
}

/// Everything the synthesizer hands to the LLM.
#[derive(Debug, Clone, Copy)]
pub struct Completion<'a> {
    /// The user's current message.
    pub question: &'a str,
    /// Retrieved passages (empty on the direct route).
    pub passages: &'a [Passage],
    /// Earlier turns of this thread, oldest first.
    pub history: &'a [Turn],
    /// Whose fair-queue share the call is charged to.
    pub tenant: &'a str,
}

impl Completion<'_> {
    /// A generous estimate of the call's tokens (about four characters a
    /// token, plus the whole completion allowance), settled with the real
    /// usage after the call.
    pub fn estimated_tokens(&self, max_tokens: u64) -> u64 {
        let chars = self.question.len()
            + self.passages.iter().map(|p| p.text.len()).sum::<usize>()
            + self.history.iter().map(|t| t.content.len()).sum::<usize>();
        (chars as u64).div_ceil(4) + max_tokens
    }
}

/// Token usage reported by the LLM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: u64,
    /// Tokens in the answer.
    pub completion_tokens: u64,
}

/// The LLM's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// Answer text.
    pub text: String,
    /// Token usage.
    pub usage: Usage,
}

/// Answers a question from passages and history.
#[async_trait]
pub trait Llm: Send + Sync + 'static {
    /// `builtin` or `openai`, for `/ready` and logs.
    fn kind(&self) -> &'static str;
    /// Produces an answer.
    async fn complete(&self, request: Completion<'_>) -> Result<Answer, UpstreamError>;

    /// Whether a call would be refused outright (an open breaker), checked
    /// before any other work so a request the LLM cannot answer costs no
    /// retrieval. Default: always available.
    fn available(&self) -> Result<(), UpstreamError> {
        Ok(())
    }
}

/// Turns text into a query vector.
#[async_trait]
pub trait Embedder: Send + Sync + 'static {
    /// Embeds one text.
    async fn embed(&self, text: &str) -> Result<Vec<f32>, UpstreamError>;
}

/// Finds passages relevant to a query.
#[async_trait]
pub trait VectorStore: Send + Sync + 'static {
    /// `builtin` or `qdrant`, for `/ready` and logs.
    fn kind(&self) -> &'static str;
    /// The `top_k` best passages, best first; `tenant` is whose fair-queue
    /// share a remote search is charged to.
    async fn search(
        &self,
        query: &str,
        top_k: usize,
        tenant: &str,
    ) -> Result<Vec<Passage>, UpstreamError>;

    /// Whether a call would be refused outright (an open breaker), checked
    /// before queueing. Default: always available.
    fn available(&self) -> Result<(), UpstreamError> {
        Ok(())
    }
}
