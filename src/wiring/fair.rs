//! [`FairLlm`]: the LLM behind the tenant fair queue. The breaker check
//! comes first, so an open breaker answers without queueing; then the
//! call waits for its tenant's turn at a capacity slot; then it runs
//! through the LLM's resilience stack (the bulkhead there stays as a
//! safety net). The request deadline covers the wait and the call.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::fairness::{FairQueue, QueuePolicies};
use crate::upstream::fair::{admit, within};
use crate::upstream::{Answer, Completion, Dependency, Llm, Passage, UpstreamError, VectorStore};

/// The LLM behind per-tenant fair queues.
pub struct FairLlm {
    inner: Arc<dyn Llm>,
    queue: FairQueue,
    policies: QueuePolicies,
    max_tokens: u64,
    deadline: Duration,
}

impl FairLlm {
    /// Puts `inner` behind `queue`; `deadline` bounds the wait plus the
    /// call, `max_tokens` is the completion allowance of the estimate.
    pub fn new(
        inner: Arc<dyn Llm>,
        queue: FairQueue,
        policies: QueuePolicies,
        max_tokens: u64,
        deadline: Duration,
    ) -> Self {
        Self {
            inner,
            queue,
            policies,
            max_tokens,
            deadline,
        }
    }
}

#[async_trait]
impl Llm for FairLlm {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn available(&self) -> Result<(), UpstreamError> {
        self.inner.available()
    }

    async fn complete(&self, request: Completion<'_>) -> Result<Answer, UpstreamError> {
        // An open breaker answers at once, without a place in the queue.
        self.inner.available()?;
        let deadline = Instant::now() + self.deadline;
        let estimate = request.estimated_tokens(self.max_tokens);
        let policy = self.policies.get(request.tenant);
        let mut permit = admit(
            &self.queue,
            policy,
            request.tenant,
            estimate,
            deadline,
            Dependency::Llm,
        )
        .await?;
        let call = self.inner.complete(request);
        let result = within(deadline, self.deadline, Dependency::Llm, call).await;
        // Settle with what the call used: a failed call used nothing.
        permit.settle(
            result
                .as_ref()
                .map_or(0, |a| a.usage.prompt_tokens + a.usage.completion_tokens),
        );
        result
    }
}

/// A remote vector store behind per-tenant fair queues, like [`FairLlm`]:
/// breaker first, then the tenant's turn, then the stack. A search costs
/// one unit (searches are alike; tokens are the LLM's measure).
pub struct FairVectorStore {
    inner: Arc<dyn VectorStore>,
    queue: FairQueue,
    policies: QueuePolicies,
    deadline: Duration,
}

impl FairVectorStore {
    /// Puts `inner` behind `queue`; `deadline` bounds the wait plus the
    /// search.
    pub fn new(
        inner: Arc<dyn VectorStore>,
        queue: FairQueue,
        policies: QueuePolicies,
        deadline: Duration,
    ) -> Self {
        Self {
            inner,
            queue,
            policies,
            deadline,
        }
    }
}

#[async_trait]
impl VectorStore for FairVectorStore {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn available(&self) -> Result<(), UpstreamError> {
        self.inner.available()
    }

    async fn search(
        &self,
        query: &str,
        top_k: usize,
        tenant: &str,
    ) -> Result<Vec<Passage>, UpstreamError> {
        self.inner.available()?;
        let deadline = Instant::now() + self.deadline;
        let policy = self.policies.get(tenant);
        let dependency = Dependency::VectorStore;
        let _permit = admit(&self.queue, policy, tenant, 1, deadline, dependency).await?;
        let call = self.inner.search(query, top_k, tenant);
        within(deadline, self.deadline, dependency, call).await
    }
}
