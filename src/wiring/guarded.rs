//! Dependencies behind their resilience stacks: each wrapper turns trait
//! calls into owned requests, runs them through the dependency's
//! [`DependencyStack`] (deadline → retry → breaker → bulkhead → attempt
//! timeout) and turns the result back into the trait's error, so the
//! pipeline and the limiter never know a stack is there.

use std::sync::Arc;

use async_trait::async_trait;
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;

use crate::rag::{ConversationStore, ThreadKey};
use crate::ratelimit::store::{Decision, LimitSpec, LimitStore, StoreUnavailable};
use crate::resilience::{
    BoxError, Breaker, BreakerState, BulkheadFull, CircuitOpen, Classified, DependencyStack,
    Elapsed, Retryable,
};
use crate::upstream::{
    Answer, Completion, Dependency, Llm, Passage, Turn, UpstreamError, UpstreamErrorKind,
    VectorStore,
};

/// A boxed service shared by a wrapper's callers; each call clones it (a
/// `Sync` boxed service needs no lock to be shared).
struct Shared<Req, Resp>(BoxCloneSyncService<Req, Resp, BoxError>);

impl<Req, Resp> Shared<Req, Resp> {
    fn new(svc: BoxCloneSyncService<Req, Resp, BoxError>) -> Self {
        Self(svc)
    }

    async fn call(&self, req: Req) -> Result<Resp, BoxError> {
        self.0.clone().oneshot(req).await
    }
}

/// One completion, owned so that retries can resend it.
#[derive(Debug, Clone)]
pub struct CompletionCall {
    question: String,
    passages: Vec<Passage>,
    history: Vec<Turn>,
    tenant: String,
}

impl Retryable for CompletionCall {
    // A non-streamed completion has no side effects and nothing has been
    // passed on to the client before it completes.
    fn retry_safe(&self) -> bool {
        true
    }
}

/// The LLM behind its stack.
pub struct GuardedLlm {
    kind: &'static str,
    svc: Shared<CompletionCall, Answer>,
    breaker: Option<Breaker>,
}

impl GuardedLlm {
    /// Wraps `inner` in `stack`.
    pub fn new(inner: Arc<dyn Llm>, stack: &DependencyStack) -> Self {
        let kind = inner.kind();
        let client = tower::service_fn(move |call: CompletionCall| {
            let inner = inner.clone();
            async move {
                let request = Completion {
                    question: &call.question,
                    passages: &call.passages,
                    history: &call.history,
                    tenant: &call.tenant,
                };
                inner.complete(request).await
            }
        });
        Self {
            kind,
            svc: Shared::new(stack.wrap(client)),
            breaker: stack.breaker().cloned(),
        }
    }
}

#[async_trait]
impl Llm for GuardedLlm {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn available(&self) -> Result<(), UpstreamError> {
        open_breaker(self.breaker.as_ref(), Dependency::Llm)
    }

    async fn complete(&self, request: Completion<'_>) -> Result<Answer, UpstreamError> {
        let call = CompletionCall {
            question: request.question.to_owned(),
            passages: request.passages.to_vec(),
            history: request.history.to_vec(),
            tenant: request.tenant.to_owned(),
        };
        self.svc
            .call(call)
            .await
            .map_err(|e| UpstreamError::from_stack(Dependency::Llm, e))
    }
}

/// The refusal an open breaker would answer, checked before any other
/// work (and before queueing) so a call it would refuse costs nothing.
fn open_breaker(breaker: Option<&Breaker>, dependency: Dependency) -> Result<(), UpstreamError> {
    let Some(breaker) = breaker else {
        return Ok(());
    };
    if !matches!(
        breaker.state(),
        BreakerState::Open { .. } | BreakerState::ForcedOpen
    ) {
        return Ok(());
    }
    // Ask the gate itself for the refusal (and its Retry-After); a permit
    // granted in the meantime is dropped unused, which frees it.
    match breaker.permit() {
        Ok(_unused) => Ok(()),
        Err(open) => Err(UpstreamError {
            dependency,
            kind: UpstreamErrorKind::Unavailable {
                retry_after: open.retry_after,
            },
            source: Some(Box::new(open)),
        }),
    }
}

/// A primary LLM with a secondary endpoint used when the primary fails or
/// its breaker is open.
pub struct FallbackLlm {
    primary: Arc<dyn Llm>,
    secondary: Arc<dyn Llm>,
}

impl FallbackLlm {
    /// Tries `primary`, then `secondary`.
    pub fn new(primary: Arc<dyn Llm>, secondary: Arc<dyn Llm>) -> Self {
        Self { primary, secondary }
    }
}

#[async_trait]
impl Llm for FallbackLlm {
    fn kind(&self) -> &'static str {
        self.primary.kind()
    }

    fn available(&self) -> Result<(), UpstreamError> {
        self.primary
            .available()
            .or_else(|_| self.secondary.available())
    }

    async fn complete(&self, request: Completion<'_>) -> Result<Answer, UpstreamError> {
        match self.primary.complete(request).await {
            Ok(answer) => Ok(answer),
            Err(e) => {
                tracing::warn!(error = %e, "primary LLM failed; using the secondary");
                self.secondary.complete(request).await
            }
        }
    }
}

/// One search, owned.
#[derive(Debug, Clone)]
pub struct SearchCall {
    query: String,
    top_k: usize,
    tenant: String,
}

impl Retryable for SearchCall {
    fn retry_safe(&self) -> bool {
        true
    }
}

/// The vector store behind its stack.
pub struct GuardedVectorStore {
    kind: &'static str,
    svc: Shared<SearchCall, Vec<Passage>>,
    breaker: Option<Breaker>,
}

impl GuardedVectorStore {
    /// Wraps `inner` in `stack`.
    pub fn new(inner: Arc<dyn VectorStore>, stack: &DependencyStack) -> Self {
        let kind = inner.kind();
        let client = tower::service_fn(move |call: SearchCall| {
            let inner = inner.clone();
            async move { inner.search(&call.query, call.top_k, &call.tenant).await }
        });
        Self {
            kind,
            svc: Shared::new(stack.wrap(client)),
            breaker: stack.breaker().cloned(),
        }
    }
}

#[async_trait]
impl VectorStore for GuardedVectorStore {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn available(&self) -> Result<(), UpstreamError> {
        open_breaker(self.breaker.as_ref(), Dependency::VectorStore)
    }

    async fn search(
        &self,
        query: &str,
        top_k: usize,
        tenant: &str,
    ) -> Result<Vec<Passage>, UpstreamError> {
        let call = SearchCall {
            query: query.to_owned(),
            top_k,
            tenant: tenant.to_owned(),
        };
        self.svc
            .call(call)
            .await
            .map_err(|e| UpstreamError::from_stack(Dependency::VectorStore, e))
    }
}

/// A conversation-memory operation.
#[derive(Debug, Clone)]
pub enum MemoryCall {
    /// Read a thread.
    Load(ThreadKey),
    /// Append to a thread (not idempotent: never retried).
    Append(ThreadKey, Vec<Turn>),
}

impl Retryable for MemoryCall {
    fn retry_safe(&self) -> bool {
        matches!(self, Self::Load(_))
    }
}

/// Conversation memory behind the Redis stack (sharing its breaker with
/// the limiter store, so a dead Redis is skipped at once by both).
pub struct GuardedMemory {
    kind: &'static str,
    svc: Shared<MemoryCall, Vec<Turn>>,
}

impl GuardedMemory {
    /// Wraps `inner` in `stack`.
    pub fn new(inner: Arc<dyn ConversationStore>, stack: &DependencyStack) -> Self {
        let kind = inner.kind();
        let client = tower::service_fn(move |call: MemoryCall| {
            let inner = inner.clone();
            async move {
                match call {
                    MemoryCall::Load(key) => inner.load(&key).await,
                    MemoryCall::Append(key, turns) => {
                        inner.append(&key, &turns).await.map(|()| Vec::new())
                    }
                }
            }
        });
        Self {
            kind,
            svc: Shared::new(stack.wrap(client)),
        }
    }
}

#[async_trait]
impl ConversationStore for GuardedMemory {
    fn kind(&self) -> &'static str {
        self.kind
    }

    async fn load(&self, key: &ThreadKey) -> Result<Vec<Turn>, UpstreamError> {
        self.svc
            .call(MemoryCall::Load(key.clone()))
            .await
            .map_err(|e| UpstreamError::from_stack(Dependency::Redis, e))
    }

    async fn append(&self, key: &ThreadKey, turns: &[Turn]) -> Result<(), UpstreamError> {
        self.svc
            .call(MemoryCall::Append(key.clone(), turns.to_vec()))
            .await
            .map(|_| ())
            .map_err(|e| UpstreamError::from_stack(Dependency::Redis, e))
    }
}

/// A limit-store operation. Checks consume quota: never retried.
#[derive(Debug, Clone)]
pub enum LimitCall {
    /// Check and consume.
    Check(Vec<LimitSpec>, String),
    /// Charge or refund.
    Adjust(LimitSpec, i64),
}

impl Retryable for LimitCall {
    fn retry_safe(&self) -> bool {
        false
    }
}

/// The limit store behind the Redis stack: once its breaker is open, a
/// check fails in microseconds instead of waiting out a Redis timeout, and
/// the limiter applies the tier's fail-open / fail-closed policy.
pub struct GuardedLimitStore {
    kind: &'static str,
    svc: Shared<LimitCall, Option<Decision>>,
}

impl GuardedLimitStore {
    /// Wraps `inner` in `stack`.
    pub fn new(inner: Arc<dyn LimitStore>, stack: &DependencyStack) -> Self {
        let kind = inner.kind();
        let client = tower::service_fn(move |call: LimitCall| {
            let inner = inner.clone();
            async move {
                match call {
                    LimitCall::Check(specs, id) => inner.check(&specs, &id).await.map(Some),
                    LimitCall::Adjust(spec, delta) => {
                        inner.adjust(&spec, delta).await.map(|()| None)
                    }
                }
            }
        });
        Self {
            kind,
            svc: Shared::new(stack.wrap(client)),
        }
    }

    fn unavailable(err: BoxError) -> StoreUnavailable {
        let err = Classified::into_source(err);
        if let Some(e) = err.downcast_ref::<StoreUnavailable>() {
            return e.clone();
        }
        let up = err.downcast_ref::<UpstreamError>();
        StoreUnavailable {
            reason: err.to_string(),
            timeout: err.is::<Elapsed>()
                || up.is_some_and(|u| matches!(u.kind, UpstreamErrorKind::Timeout)),
            refused: err.is::<CircuitOpen>() || err.is::<BulkheadFull>(),
        }
    }
}

#[async_trait]
impl LimitStore for GuardedLimitStore {
    fn kind(&self) -> &'static str {
        self.kind
    }

    async fn check(
        &self,
        limits: &[LimitSpec],
        request_id: &str,
    ) -> Result<Decision, StoreUnavailable> {
        match self
            .svc
            .call(LimitCall::Check(limits.to_vec(), request_id.to_owned()))
            .await
        {
            Ok(Some(decision)) => Ok(decision),
            Ok(None) => Err(StoreUnavailable {
                reason: "store answered a check with nothing".to_owned(),
                timeout: false,
                refused: false,
            }),
            Err(e) => Err(Self::unavailable(e)),
        }
    }

    async fn adjust(&self, limit: &LimitSpec, delta: i64) -> Result<(), StoreUnavailable> {
        self.svc
            .call(LimitCall::Adjust(limit.clone(), delta))
            .await
            .map(|_| ())
            .map_err(Self::unavailable)
    }
}
