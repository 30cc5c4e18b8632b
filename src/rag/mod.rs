//! The RAG backend Levee protects, as explicit stages:
//! router → retriever → synthesizer, with conversation memory per thread.
//!
//! `metadata.agents_used` lists the stages that actually ran; when memory is
//! unavailable the answer is still given, without history, and marked
//! `degraded`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::field::Empty;
use tracing::Instrument;

pub mod config;
mod memory;
mod router;

pub use memory::{ConversationStore, InProcessMemory, RedisMemory, ThreadKey};
pub use router::{retrieval_query, IntentRouter};

use crate::health::DependencyHealth;
use crate::telemetry::client::int;
use crate::upstream::{
    Answer, Completion, Dependency, Llm, Passage, Role, Turn, UpstreamError, Usage, VectorStore,
};
use crate::upstream::{TokenKind, UpstreamMetrics};
use config::{RetrievalFallback, Route};

/// Tenant used when a request names none.
pub const DEFAULT_TENANT: &str = "default";

/// The fair-queue tenant of a request nobody authenticated (tests and
/// callers of the pipeline that set none).
pub const ANONYMOUS_QUEUE: &str = "anon";

/// `POST /v1/chat` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// The user's message.
    pub message: String,
    /// The user's id.
    pub user_id: String,
    /// The conversation's id.
    pub thread_id: String,
    /// Optional tenant.
    #[serde(default)]
    pub tenant_id: Option<String>,
    /// Whose fair-queue share the LLM call is charged to: set by the
    /// handler from the authenticated identity (the key's tenant, or the
    /// anonymous tier), never from the body, which a caller controls.
    #[serde(skip)]
    pub queue_tenant: Option<String>,
}

/// `POST /v1/chat` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The answer.
    pub response: String,
    /// Echo of the request's thread.
    pub thread_id: String,
    /// How the answer was made.
    pub metadata: ChatMetadata,
}

/// How an answer was made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatMetadata {
    /// Stages that ran, in order: `router`, `retriever`, `synthesizer`.
    pub agents_used: Vec<String>,
    /// Echo of the request's user.
    pub user_id: String,
    /// Passages the answer drew on.
    pub sources: Vec<Source>,
    /// True when part of the pipeline was skipped because a dependency was
    /// unavailable.
    pub degraded: bool,
    /// Route the router chose.
    pub route: Route,
    /// Earlier messages of the thread that the synthesizer saw.
    pub history_turns: usize,
    /// Token usage of the synthesizer.
    pub usage: TokenUsage,
}

/// One cited passage.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Source {
    /// Document id.
    pub id: String,
    /// Document title.
    pub title: String,
    /// Where it lives.
    pub source: String,
    /// Relevance score.
    pub score: f32,
}

/// Token usage as reported in metadata.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
}

impl From<Usage> for TokenUsage {
    fn from(u: Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
        }
    }
}

impl From<&Passage> for Source {
    fn from(p: &Passage) -> Self {
        Self {
            id: p.id.clone(),
            title: p.title.clone(),
            source: p.source.clone(),
            score: p.score,
        }
    }
}

/// The assembled pipeline.
#[derive(Clone)]
pub struct Pipeline {
    router: IntentRouter,
    retriever: Arc<dyn VectorStore>,
    synthesizer: Arc<dyn Llm>,
    memory: Arc<dyn ConversationStore>,
    top_k: usize,
    health: Arc<DependencyHealth>,
    metrics: Option<UpstreamMetrics>,
    retrieval_fallback: RetrievalFallback,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("retriever", &self.retriever.kind())
            .field("synthesizer", &self.synthesizer.kind())
            .field("memory", &self.memory.kind())
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// Assembles the stages.
    pub fn new(
        router: IntentRouter,
        retriever: Arc<dyn VectorStore>,
        synthesizer: Arc<dyn Llm>,
        memory: Arc<dyn ConversationStore>,
        top_k: usize,
        health: Arc<DependencyHealth>,
    ) -> Self {
        Self {
            router,
            retriever,
            synthesizer,
            memory,
            top_k,
            health,
            metrics: None,
            retrieval_fallback: RetrievalFallback::Fail,
        }
    }

    /// What to do when retrieval fails (`vector_store.on_failure`).
    #[must_use]
    pub fn with_retrieval_fallback(mut self, fallback: RetrievalFallback) -> Self {
        self.retrieval_fallback = fallback;
        self
    }

    /// Counts LLM tokens per tenant into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: UpstreamMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// An INTERNAL span for one pipeline stage.
    fn stage_span(stage: &'static str) -> tracing::Span {
        tracing::info_span!(
            target: "levee::rag",
            "stage",
            otel.name = stage,
            otel.kind = "internal",
            otel.status_code = Empty,
            levee.rag.stage = stage,
            levee.rag.route = Empty,
            levee.rag.rule = Empty,
            levee.rag.passages = Empty,
            levee.rag.history_turns = Empty,
            gen_ai.usage.input_tokens = Empty,
            gen_ai.usage.output_tokens = Empty,
        )
    }

    fn mark_failed<T, E>(span: &tracing::Span, result: &Result<T, E>) {
        if result.is_err() {
            span.record("otel.status_code", "error");
        }
    }

    /// Records a remote call's outcome for `/ready`.
    fn observe<T>(
        &self,
        dep: Dependency,
        result: Result<T, UpstreamError>,
    ) -> Result<T, UpstreamError> {
        match &result {
            Ok(_) => self.health.record(dep, true),
            // The failing dependency may differ from the stage's (an
            // embedding call inside retrieval is the LLM's).
            Err(e) => self.health.record(e.dependency, false),
        }
        result
    }

    /// The retriever (for `/ready`).
    pub fn retriever(&self) -> &Arc<dyn VectorStore> {
        &self.retriever
    }

    /// The synthesizer (for `/ready`).
    pub fn synthesizer(&self) -> &Arc<dyn Llm> {
        &self.synthesizer
    }

    /// The conversation store (for `/ready`).
    pub fn memory(&self) -> &Arc<dyn ConversationStore> {
        &self.memory
    }

    /// Answers one validated request.
    pub async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, UpstreamError> {
        let key = Self::thread_key(req);
        // Fail fast: if the LLM's breaker is open, spend nothing on memory
        // or retrieval for an answer that cannot be synthesized.
        self.synthesizer.available()?;
        let history = self.load_history(&key).await;
        let mut degraded = history.is_none();
        let history = history.unwrap_or_default();
        let mut agents_used = vec!["router".to_owned()];
        let route = self.route(&req.message);
        let passages = match route {
            Route::Retrieve => match self
                .retrieve(
                    &req.message,
                    &history,
                    req.queue_tenant.as_deref().unwrap_or(ANONYMOUS_QUEUE),
                )
                .await?
            {
                Some(p) => {
                    agents_used.push("retriever".to_owned());
                    p
                }
                None => {
                    degraded = true;
                    Vec::new()
                }
            },
            Route::Direct => Vec::new(),
        };
        agents_used.push("synthesizer".to_owned());
        let answer = self
            .synthesize(&key.tenant, req, &passages, &history)
            .await?;
        if !self.remember(&key, &req.message, &answer.text).await {
            degraded = true;
        }
        let metadata = ChatMetadata {
            agents_used,
            user_id: req.user_id.clone(),
            sources: passages.iter().map(Source::from).collect(),
            degraded,
            route,
            history_turns: history.len(),
            usage: answer.usage.into(),
        };
        Ok(Self::respond(req, answer, metadata))
    }

    /// Names the conversation memory slot, defaulting the tenant.
    fn thread_key(req: &ChatRequest) -> ThreadKey {
        ThreadKey {
            tenant: req
                .tenant_id
                .clone()
                .unwrap_or_else(|| DEFAULT_TENANT.to_owned()),
            user: req.user_id.clone(),
            thread: req.thread_id.clone(),
        }
    }

    /// Loads the thread's history; `None` when memory is unavailable.
    async fn load_history(&self, key: &ThreadKey) -> Option<Vec<Turn>> {
        // Memory is a convenience: without it the question is still answered.
        match self.observe(Dependency::Redis, self.memory.load(key).await) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "conversation memory unavailable; answering without history");
                None
            }
        }
    }

    /// Runs the router stage inside its span and logs the decision.
    fn route(&self, message: &str) -> Route {
        let (route, rule) = Self::stage_span("router").in_scope(|| {
            let (route, rule) = self.router.route(message);
            let span = tracing::Span::current();
            span.record("levee.rag.route", format!("{route:?}").to_lowercase());
            span.record("levee.rag.rule", rule);
            (route, rule)
        });
        tracing::debug!(?route, rule, "routed");
        route
    }

    /// Retrieves passages for the question; `Ok(None)` when retrieval failed
    /// and `vector_store.on_failure = degrade` says to answer without it.
    async fn retrieve(
        &self,
        message: &str,
        history: &[Turn],
        tenant: &str,
    ) -> Result<Option<Vec<Passage>>, UpstreamError> {
        let previous = history
            .iter()
            .rev()
            .find(|t| t.role == Role::User)
            .map(|t| t.content.as_str());
        let query = retrieval_query(message, previous);
        match self.observe(Dependency::VectorStore, self.search(&query, tenant).await) {
            Ok(p) => Ok(Some(p)),
            // Degrade: answer without retrieval, and say so.
            Err(e) if self.retrieval_fallback == RetrievalFallback::Degrade => {
                tracing::warn!(error = %e, "retrieval failed; answering without it");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Calls the vector store inside the retrieval span.
    async fn search(&self, query: &str, tenant: &str) -> Result<Vec<Passage>, UpstreamError> {
        let span = Self::stage_span("retrieval");
        let found = self
            .retriever
            .search(query, self.top_k, tenant)
            .instrument(span.clone())
            .await;
        Self::mark_failed(&span, &found);
        if let Ok(p) = &found {
            span.record("levee.rag.passages", int(p.len()));
        }
        found
    }

    /// Runs the synthesizer inside its span, counting tokens for the tenant.
    async fn synthesize(
        &self,
        tenant: &str,
        req: &ChatRequest,
        passages: &[Passage],
        history: &[Turn],
    ) -> Result<Answer, UpstreamError> {
        let answer = self.synthesizer.complete(Completion {
            question: &req.message,
            passages,
            history,
            tenant: req.queue_tenant.as_deref().unwrap_or(ANONYMOUS_QUEUE),
        });
        let span = Self::stage_span("synthesis");
        span.record("levee.rag.passages", int(passages.len()));
        span.record("levee.rag.history_turns", int(history.len()));
        let answer = answer.instrument(span.clone()).await;
        Self::mark_failed(&span, &answer);
        if let Ok(a) = &answer {
            span.record("gen_ai.usage.input_tokens", int(a.usage.prompt_tokens));
            span.record("gen_ai.usage.output_tokens", int(a.usage.completion_tokens));
            self.count_tokens(tenant, a.usage);
        }
        self.observe(Dependency::Llm, answer)
    }

    /// Adds the synthesizer's token usage to the per-tenant metrics, if any.
    fn count_tokens(&self, tenant: &str, usage: Usage) {
        if let Some(m) = &self.metrics {
            m.add_tokens(tenant, TokenKind::Prompt, usage.prompt_tokens);
            m.add_tokens(tenant, TokenKind::Completion, usage.completion_tokens);
        }
    }

    /// Appends the question and answer to the thread; `false` when memory is
    /// unavailable and the turn was not remembered.
    async fn remember(&self, key: &ThreadKey, question: &str, answer: &str) -> bool {
        let turns = [
            Turn {
                role: Role::User,
                content: question.to_owned(),
            },
            Turn {
                role: Role::Assistant,
                content: answer.to_owned(),
            },
        ];
        if let Err(e) = self.observe(Dependency::Redis, self.memory.append(key, &turns).await) {
            tracing::warn!(error = %e, "conversation memory unavailable; turn not remembered");
            return false;
        }
        true
    }

    /// Assembles the wire response from the answer and how it was made.
    fn respond(req: &ChatRequest, answer: Answer, metadata: ChatMetadata) -> ChatResponse {
        ChatResponse {
            response: answer.text,
            thread_id: req.thread_id.clone(),
            metadata,
        }
    }
}

/// A deliberately generous estimate: the question's words plus the
/// retrieved context's typical size plus the whole completion allowance.
/// Settlement refunds the difference.
pub fn estimate_tokens(message: &str, max_tokens: u64) -> u64 {
    const CONTEXT_ALLOWANCE: u64 = 600;
    let words = message.split_whitespace().count() as u64;
    words * 2 + CONTEXT_ALLOWANCE + max_tokens
}
