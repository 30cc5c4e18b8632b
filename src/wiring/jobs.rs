//! The job workers' view of the rest of the gateway: [`LimiterAdmission`]
//! asks the tenant's limiter before a job runs (the same limits as a
//! synchronous request of the same key), and [`PipelineProcessor`] runs it
//! through the same pipeline, token budget and tenant fair queue.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::identity::{Identity, KeyInfo, NetworkClass};
use crate::jobs::{Admission, Processed, Processor, Submitter};
use crate::rag::{ChatRequest, Pipeline};
use crate::ratelimit::{Limiter, LimiterUnavailable, RateLimited};
use crate::resilience::FailureClass;
use crate::upstream::UpstreamErrorKind;

/// The path a job's limits are checked for (route policies match it).
pub const JOBS_PATH: &str = "/v1/jobs";

/// Longest a job waits for its tenant's token budget inside a worker.
const BUDGET_WAIT: Duration = Duration::from_secs(5);

fn identity(s: &Submitter) -> Identity {
    Identity {
        client_ip: s.client_ip,
        network: if s.internal {
            NetworkClass::Internal
        } else {
            NetworkClass::Public
        },
        key: Some(Arc::new(KeyInfo {
            id: s.key_id.clone(),
            tenant: s.tenant.clone(),
            tier: s.tier.clone(),
        })),
        user: s.user.as_deref().map(Arc::from),
    }
}

/// The wait a limiter refusal asks for.
fn wait_of(rejection: &crate::ratelimit::Rejection) -> Duration {
    let e = rejection.error.as_ref();
    if let Some(rl) = e.downcast_ref::<RateLimited>() {
        return rl.retry_after.max(Duration::from_millis(1));
    }
    if let Some(u) = e.downcast_ref::<LimiterUnavailable>() {
        return u.retry_after;
    }
    Duration::from_secs(1)
}

/// Admission by the tenant's limiter (everything admitted without one).
pub struct LimiterAdmission {
    limiter: Option<Arc<Limiter>>,
}

impl LimiterAdmission {
    /// Asks `limiter`.
    pub fn new(limiter: Option<Arc<Limiter>>) -> Self {
        Self { limiter }
    }
}

#[async_trait]
impl Admission for LimiterAdmission {
    async fn admit(&self, submitter: &Submitter) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        match limiter.admit(&identity(submitter), JOBS_PATH).await {
            Ok(_) => Ok(()),
            Err(rejection) => Err(wait_of(&rejection)),
        }
    }
}

/// Runs a job's `/v1/chat` body through the pipeline.
pub struct PipelineProcessor {
    pipeline: Pipeline,
    limiter: Option<Arc<Limiter>>,
    max_tokens: u64,
}

impl PipelineProcessor {
    /// Runs jobs on `pipeline`, with token budgets from `limiter`.
    pub fn new(pipeline: Pipeline, limiter: Option<Arc<Limiter>>, max_tokens: u64) -> Self {
        Self {
            pipeline,
            limiter,
            max_tokens,
        }
    }
}

#[async_trait]
impl Processor for PipelineProcessor {
    async fn process(&self, body: &str, submitter: &Submitter) -> Processed {
        let mut request: ChatRequest = match serde_json::from_str(body) {
            Ok(r) => r,
            Err(e) => return Processed::Fail(format!("unreadable job body: {e}")),
        };
        request.tenant_id = Some(submitter.tenant.clone());
        request.queue_tenant = Some(submitter.tenant.clone());
        let identity = identity(submitter);
        let reservation = match &self.limiter {
            Some(limiter) => {
                let estimate = crate::rag::estimate_tokens(&request.message, self.max_tokens);
                let mut reserved = limiter.reserve_tokens(&identity, estimate).await;
                if let Err(rejection) = &reserved {
                    // The budget refills: wait for it once, within bounds.
                    tokio::time::sleep(wait_of(rejection).min(BUDGET_WAIT)).await;
                    reserved = limiter.reserve_tokens(&identity, estimate).await;
                }
                match reserved {
                    Ok(r) => r.map(|r| (limiter, r)),
                    Err(r) => return Processed::Retry(format!("token budget: {}", r.error)),
                }
            }
            None => None,
        };
        let answer = self.pipeline.chat(&request).await;
        if let Some((limiter, reservation)) = reservation {
            let used = answer.as_ref().map_or(0, |a| {
                a.metadata.usage.prompt_tokens + a.metadata.usage.completion_tokens
            });
            limiter.settle_tokens(reservation, used).await;
        }
        match answer {
            Ok(a) => match serde_json::to_string(&a) {
                Ok(text) => Processed::Answer(text),
                Err(e) => Processed::Fail(format!("unserialisable answer: {e}")),
            },
            Err(e) => {
                use crate::resilience::ClassifyFailure;
                // A request the dependency refused as bad will never work;
                // anything else may on another delivery.
                let retry = !matches!(e.failure_class(), FailureClass::Rejected)
                    || matches!(e.kind, UpstreamErrorKind::NotAdmitted);
                if retry {
                    Processed::Retry(e.to_string())
                } else {
                    Processed::Fail(e.to_string())
                }
            }
        }
    }
}
