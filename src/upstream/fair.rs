//! A dependency call in its tenant fair queue: wait for the tenant's turn
//! at a capacity slot (a refusal becomes the dependency's `NotAdmitted`),
//! then run the call within what is left of the request's deadline. The
//! RAG pipeline's fair LLM and vector store (`wiring::fair`) and the
//! OpenAI-compatible proxy share these.

use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::{Dependency, UpstreamError, UpstreamErrorKind};
use crate::fairness::{FairQueue, Permit, QueuePolicy};
use crate::resilience::DeadlineExceeded;

/// Waits for `tenant`'s turn at a slot of `queue`, inside a
/// `fair_queue.wait` span; a refusal leaves as the dependency's
/// `NotAdmitted`, with the queue's error as its source.
pub async fn admit(
    queue: &FairQueue,
    policy: QueuePolicy,
    tenant: &str,
    cost: u64,
    deadline: Instant,
    dependency: Dependency,
) -> Result<Permit, UpstreamError> {
    let span = tracing::info_span!(
        target: "levee::fairness",
        "fair_queue",
        otel.name = "fair_queue.wait",
        otel.kind = "internal",
        levee.dependency = dependency.as_str(),
        levee.fair_queue.cost = cost,
    );
    queue
        .acquire(tenant, policy, cost, Some(deadline))
        .instrument(span)
        .await
        .map_err(|source| UpstreamError {
            dependency,
            kind: UpstreamErrorKind::NotAdmitted,
            source: Some(source),
        })
}

/// Runs `call` within what is left of the request's `deadline` (whose
/// whole length is `total`), which covered the wait too.
pub async fn within<T>(
    deadline: Instant,
    total: Duration,
    dependency: Dependency,
    call: impl std::future::Future<Output = Result<T, UpstreamError>>,
) -> Result<T, UpstreamError> {
    match tokio::time::timeout_at(deadline, call).await {
        Ok(result) => result,
        Err(_) => Err(UpstreamError {
            dependency,
            kind: UpstreamErrorKind::Timeout,
            source: Some(Box::new(DeadlineExceeded {
                dependency: dependency.as_str(),
                after: total,
            })),
        }),
    }
}
