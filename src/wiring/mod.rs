//! The wiring: the one place that knows every module. It builds the
//! upstream clients, puts each behind its dependency's resilience stack
//! (deadline → retry → breaker → bulkhead → attempt timeout), records every
//! breaker in the [`Breakers`] registry, and assembles the pipeline, the
//! identity resolver and the limiter. Nothing below imports it; `http` reads
//! its registry and `server` serves what it built.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::upstream::redis_conn::{LazyCluster, RedisConn};

use crate::config::{Config, ConfigError};
use crate::fairness::{FairQueue, FairnessFamilies, ANONYMOUS_INTERNAL, ANONYMOUS_PUBLIC};
use crate::health::DependencyHealth;
use crate::identity::Resolver;
use crate::jobs::{InProcessJobStore, JobMetrics, JobStore, QueueLimits, RedisJobStore, Workers};
use crate::proxy::{Bounds, DrainBound, Endpoint, GenAiMetrics, Model, Proxy, PASSTHROUGH_MODEL};
use crate::rag::{ConversationStore, InProcessMemory, IntentRouter, Pipeline, RedisMemory};
use crate::ratelimit::policy::Policy;
use crate::ratelimit::store::{LimitStore, MemoryStore, RedisStore};
use crate::ratelimit::{Limiter, StoreKind, DEFAULT_TENANT_POLICY};
use crate::resilience::{DependencyStack, ResilienceMetrics, ResilienceObserver};
use crate::telemetry::{Labels, Metrics};
use crate::upstream::{
    Embedder, ExtractiveAnswerer, Llm, LocalIndex, OpenAiClient, QdrantClient, UpstreamMetrics,
    VectorStore,
};

mod breakers;
mod fair;
mod guarded;
mod jobs;
mod reload;

pub use crate::fairness::QueuePolicies;
pub use breakers::Breakers;
pub use fair::{FairLlm, FairVectorStore};
pub use guarded::{
    CompletionCall, FallbackLlm, GuardedLimitStore, GuardedLlm, GuardedMemory, GuardedVectorStore,
    LimitCall, MemoryCall, SearchCall,
};
pub use jobs::{LimiterAdmission, PipelineProcessor, JOBS_PATH};
pub use reload::{LiveParts, LoadedView, ReloadError, Reloaded, Reloader};

/// Why the gateway could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An HTTP client could not be built.
    #[error("cannot build HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// Everything the HTTP surface serves, built from one config.
#[derive(Debug)]
pub struct Gateway {
    /// The RAG pipeline.
    pub pipeline: Pipeline,
    /// The OpenAI-compatible API's models.
    pub proxy: Arc<Proxy>,
    /// Resolves who is calling (the identity layer).
    pub resolver: Arc<Resolver>,
    /// The rate limiter (`None` when `ratelimit.enabled = false`).
    pub limiter: Option<Arc<Limiter>>,
    /// Dependency states and the draining flag.
    pub health: Arc<DependencyHealth>,
    /// The metrics registry.
    pub metrics: Metrics,
    /// Every circuit breaker.
    pub breakers: Arc<Breakers>,
    /// The job queues' workers (`None` with `jobs.enabled = false`).
    pub jobs: Option<Arc<Workers>>,
    /// `max_queued_jobs` per tenant (live).
    pub job_limits: Arc<QueueLimits>,
    /// Applies a new config file to the parts that can change live.
    pub reloader: Arc<Reloader>,
}

/// Builds the gateway from configuration. `vars` reads secrets such as the
/// LLM API key from the environment.
pub fn build(
    config: &Config,
    vars: &impl Fn(&str) -> Option<String>,
) -> Result<Gateway, BuildError> {
    let health = Arc::new(DependencyHealth::default());
    let obs = Instruments::new(config);
    let metrics = &obs.metrics;
    let res = &config.resilience;
    let mut breakers = Breakers::default();

    // One table of tenant queue policies for every fair queue and the job
    // workers, so a reload reaches them all at once.
    let queues = queue_policies(config)?;
    let (llm, llm_stacks) = build_llm(config, vars, &obs, &mut breakers)?;
    let llm_queue = llm_queue(config, &obs);
    let llm = fair_llm(config, llm, llm_queue.clone(), &queues);
    let proxy = build_proxy(
        config,
        vars,
        &obs,
        &mut breakers,
        &llm_stacks,
        llm_queue,
        &queues,
    )?;
    let retriever = build_retriever(config, vars, &obs, &mut breakers)?;
    let retriever = fair_retriever(config, retriever, &obs, &queues);

    let redis = redis_connection(config, res.redis.attempt_timeout)?;
    // One stack for Redis, shared by the limiter store and memory: when its
    // breaker opens, both skip Redis at once.
    let redis_stack = match &redis {
        Some(_) => {
            let stack = DependencyStack::new("redis", res.redis.clone(), obs.observer("redis"))?;
            breakers.add(&stack);
            Some(stack)
        }
        None => None,
    };
    let memory: Arc<dyn ConversationStore> = match (&redis, &redis_stack) {
        (Some(conn), Some(stack)) => {
            let inner = RedisMemory::new(
                conn.clone(),
                config.memory.clone(),
                res.redis.attempt_timeout,
            )
            .with_metrics(obs.upstream.clone());
            Arc::new(GuardedMemory::new(Arc::new(inner), stack))
        }
        _ => Arc::new(InProcessMemory::new(config.memory.clone())),
    };
    let limiter = build_limiter(config, redis.as_ref(), redis_stack.as_ref(), metrics);
    let pipeline = Pipeline::new(
        IntentRouter::new(&config.router),
        retriever,
        llm,
        memory,
        config.vector_store.top_k,
        health.clone(),
    )
    .with_retrieval_fallback(config.vector_store.on_failure)
    .with_metrics(obs.upstream.clone());
    // The job store has a connection of its own: a submission waits for
    // Redis to have written the job (an fsync with `appendfsync always`),
    // longer than a limit check may.
    let jobs_redis = match config.jobs.enabled {
        true => redis_connection(config, config.jobs.store_timeout)?,
        false => None,
    };
    let redis_breaker = redis_stack.as_ref().and_then(|s| s.breaker().cloned());
    let jobs = build_jobs(
        config,
        jobs_redis.as_ref().map(|c| (c, redis_breaker)),
        &pipeline,
        limiter.as_ref(),
        &obs,
        &queues,
    );
    let resolver = Arc::new(Resolver::new(&config.identity));
    let job_limits = Arc::new(reload::job_limits(config));
    let reloader = Reloader::new(
        config,
        LiveParts {
            resolver: resolver.clone(),
            limiter: limiter.clone(),
            queues,
            job_limits: job_limits.clone(),
        },
        &obs.metrics,
    );
    Ok(Gateway {
        pipeline,
        proxy: Arc::new(proxy),
        resolver,
        limiter,
        health,
        metrics: obs.metrics,
        breakers: Arc::new(breakers),
        jobs,
        job_limits,
        reloader: Arc::new(reloader),
    })
}

/// The job queues: on Redis Streams when Redis is configured, else in
/// process (not durable), with this replica's workers over them.
fn build_jobs(
    config: &Config,
    redis: Option<(&RedisConn, Option<crate::resilience::Breaker>)>,
    pipeline: &Pipeline,
    limiter: Option<&Arc<Limiter>>,
    obs: &Instruments,
    queues: &QueuePolicies,
) -> Option<Arc<Workers>> {
    if !config.jobs.enabled {
        return None;
    }
    let store: Arc<dyn JobStore> = match redis {
        Some((conn, breaker)) => Arc::new(
            RedisJobStore::new(conn.clone(), config.jobs.store_timeout).with_breaker(breaker),
        ),
        None => Arc::new(InProcessJobStore::new()),
    };
    let workers = Workers::new(
        store,
        Arc::new(LimiterAdmission::new(limiter.cloned())),
        Arc::new(PipelineProcessor::new(
            pipeline.clone(),
            limiter.cloned(),
            u64::from(config.llm.max_tokens),
        )),
        queues.clone(),
        config.jobs.clone(),
    )
    .with_metrics(obs.jobs.clone());
    Some(Arc::new(workers))
}

/// The fair queue in front of `llm.url` (`[fairness]`), when it is a
/// remote LLM: the built-in answerer has no capacity to share. The RAG
/// pipeline and the OpenAI-compatible API share it, as they share the
/// LLM's capacity.
fn llm_queue(config: &Config, obs: &Instruments) -> Option<FairQueue> {
    if !config.fairness.enabled || config.llm.url.is_empty() {
        return None;
    }
    let capacity = config
        .fairness
        .capacity
        .unwrap_or(config.resilience.llm.bulkhead.max_concurrent);
    let metrics = obs.fairness.dependency("llm", &ANONYMOUS_QUEUES);
    Some(FairQueue::new("llm", capacity).with_metrics(metrics))
}

/// The LLM behind its fair queue, if it has one.
fn fair_llm(
    config: &Config,
    llm: Arc<dyn Llm>,
    queue: Option<FairQueue>,
    queues: &QueuePolicies,
) -> Arc<dyn Llm> {
    let Some(queue) = queue else {
        return llm;
    };
    let policy = &config.resilience.llm;
    Arc::new(FairLlm::new(
        llm,
        queue,
        queues.clone(),
        u64::from(config.llm.max_tokens),
        policy.deadline,
    ))
}

/// A remote vector store behind its own fair queues, with the capacity of
/// its bulkhead (`fairness.vector_store_capacity` overrides it).
fn fair_retriever(
    config: &Config,
    retriever: Arc<dyn VectorStore>,
    obs: &Instruments,
    queues: &QueuePolicies,
) -> Arc<dyn VectorStore> {
    if !config.fairness.enabled || config.vector_store.url.is_empty() {
        return retriever;
    }
    let policy = &config.resilience.vector_store;
    let capacity = config
        .fairness
        .vector_store_capacity
        .unwrap_or(policy.bulkhead.max_concurrent);
    let metrics = obs.fairness.dependency("vector_store", &ANONYMOUS_QUEUES);
    let queue = FairQueue::new("vector_store", capacity).with_metrics(metrics);
    Arc::new(FairVectorStore::new(
        retriever,
        queue,
        queues.clone(),
        policy.deadline,
    ))
}

/// Each tenant's queue policy from `ratelimit.tenants`; the `default`
/// entry (else the built-in defaults) covers everyone else.
pub(crate) fn queue_policies(config: &Config) -> Result<QueuePolicies, BuildError> {
    let mut by_tenant = HashMap::new();
    for (name, t) in &config.ratelimit.tenants {
        by_tenant.insert(
            name.clone(),
            t.queue_policy(&format!("ratelimit.tenants.{name}"))?,
        );
    }
    let fallback = by_tenant
        .get(DEFAULT_TENANT_POLICY)
        .copied()
        .unwrap_or_default();
    Ok(QueuePolicies::new(by_tenant, fallback))
}

/// The fair-queue tenants of anonymous callers, one per network tier (see
/// `http::chat`), plus the pipeline's own default.
pub const ANONYMOUS_QUEUES: [&str; 3] = [
    ANONYMOUS_INTERNAL,
    ANONYMOUS_PUBLIC,
    crate::rag::ANONYMOUS_QUEUE,
];

/// The one metrics registry of this process (served at /metrics) and the
/// families each subsystem registered into it.
struct Instruments {
    metrics: Metrics,
    upstream: UpstreamMetrics,
    resilience: ResilienceMetrics,
    fairness: FairnessFamilies,
    gen_ai: GenAiMetrics,
    jobs: JobMetrics,
}

impl Instruments {
    /// Tenant and tier label values are bounded by `config`:
    /// `ratelimit.tenants` keys and the tenants of `identity.api_keys`;
    /// `ratelimit.tiers` keys (and `route`, the tier route policies of
    /// anonymous callers report).
    fn new(config: &Config) -> Self {
        let tenants = config
            .ratelimit
            .tenants
            .keys()
            .cloned()
            .chain(config.identity.api_keys.iter().map(|k| k.tenant.clone()));
        let tiers = config
            .ratelimit
            .tiers
            .keys()
            .cloned()
            .chain(["route".to_owned()]);
        let metrics = Metrics::new(Labels::new(tenants, tiers));
        let resilience = ResilienceMetrics::register(metrics.registry());
        // Dashboards show every dependency from the start, configured or
        // not, with its breaker closed.
        for dependency in ["llm", "vector_store", "redis"] {
            resilience.dependency(dependency);
        }
        Self {
            upstream: UpstreamMetrics::register(&metrics),
            fairness: FairnessFamilies::register(&metrics),
            gen_ai: GenAiMetrics::register(&metrics),
            jobs: JobMetrics::register(&metrics),
            resilience,
            metrics,
        }
    }

    /// The observer of one dependency's stack.
    fn observer(&self, dependency: &str) -> Arc<dyn ResilienceObserver> {
        self.resilience.dependency(dependency)
    }
}

/// The LLM: the built-in answerer, or the OpenAI-compatible client behind
/// its resilience stack (and a secondary endpoint behind its own).
fn build_llm(
    config: &Config,
    vars: &impl Fn(&str) -> Option<String>,
    obs: &Instruments,
    breakers: &mut Breakers,
) -> Result<(Arc<dyn Llm>, Vec<DependencyStack>), BuildError> {
    if config.llm.url.is_empty() {
        return Ok((Arc::new(ExtractiveAnswerer), Vec::new()));
    }
    let policy = &config.resilience.llm;
    let client = |url: &str| -> Result<Arc<dyn Llm>, BuildError> {
        Ok(Arc::new(
            OpenAiClient::new(url, &config.llm, vars)?
                .with_timeout(policy.attempt_timeout, config.llm.connect_timeout)?
                .with_metrics(obs.upstream.clone()),
        ))
    };
    let stack = DependencyStack::new("llm", policy.clone(), obs.observer("llm"))?;
    breakers.add(&stack);
    let primary: Arc<dyn Llm> = Arc::new(GuardedLlm::new(client(&config.llm.url)?, &stack));
    if config.llm.secondary_url.is_empty() {
        return Ok((primary, vec![stack]));
    }
    let secondary_stack = DependencyStack::new(
        "llm_secondary",
        policy.clone(),
        obs.observer("llm_secondary"),
    )?;
    breakers.add(&secondary_stack);
    let secondary = Arc::new(GuardedLlm::new(
        client(&config.llm.secondary_url)?,
        &secondary_stack,
    ));
    Ok((
        Arc::new(FallbackLlm::new(primary, secondary)),
        vec![stack, secondary_stack],
    ))
}

/// The OpenAI-compatible API: each `[[llm.models]]` entry with its
/// deployments, each behind a stack of its own (`llm:<model>:<n>`, the
/// `[resilience.llm]` policy) and the model's fair queue; or, with none
/// configured, `llm.url` (and `llm.secondary_url`) serving every model
/// name, through the stacks and fair queue the RAG pipeline uses.
fn build_proxy(
    config: &Config,
    vars: &impl Fn(&str) -> Option<String>,
    obs: &Instruments,
    breakers: &mut Breakers,
    llm_stacks: &[DependencyStack],
    llm_queue: Option<FairQueue>,
    queues: &QueuePolicies,
) -> Result<Proxy, BuildError> {
    let llm = &config.llm;
    let policy = &config.resilience.llm;
    // One connection pool for every deployment; the stacks bound calls.
    let http = reqwest::Client::builder()
        .connect_timeout(llm.connect_timeout)
        .build()?;
    let key = |env: Option<&str>| vars(env.unwrap_or(&llm.api_key_env)).filter(|k| !k.is_empty());
    let bounds = Bounds {
        deadline: policy.deadline,
        // A stream silent for a whole attempt is taken as broken off.
        idle: policy.attempt_timeout,
        drain: DrainBound {
            timeout: llm.stream_drain_timeout,
            bytes: llm.stream_drain_bytes,
        },
    };
    let policies = queues.clone();
    let mut models = Vec::new();
    for model in &llm.models {
        let label: &'static str = Box::leak(model.name.clone().into_boxed_str());
        let mut builder = Model::builder(label, &obs.gen_ai);
        let mut capacity = 0;
        for (i, d) in model.deployments.iter().enumerate() {
            // Named once per build; the names are bounded by the config.
            let name: &'static str = Box::leak(format!("llm:{}:{i}", model.name).into_boxed_str());
            // With somewhere to fall over to, a failed attempt goes to the
            // next deployment at once rather than being retried here with
            // backoff (the client would wait on a dead deployment).
            let mut own = policy.clone();
            if model.deployments.len() > 1 {
                own.retry.enabled = false;
            }
            let stack = DependencyStack::new(name, own, obs.observer(name))?;
            breakers.add(&stack);
            capacity += policy.bulkhead.max_concurrent;
            let endpoint = Endpoint {
                url: d.url.clone(),
                api_key: key(d.api_key_env.as_deref()),
                upstream_model: d.model.clone(),
                weight: d.weight,
            };
            builder = builder.deployment(endpoint, http.clone(), &stack);
        }
        if config.fairness.enabled {
            let dependency: &'static str =
                Box::leak(format!("llm:{}", model.name).into_boxed_str());
            let capacity = config.fairness.capacity.unwrap_or(capacity);
            let metrics = obs.fairness.dependency(dependency, &ANONYMOUS_QUEUES);
            builder =
                builder.fair_queue(FairQueue::new(dependency, capacity).with_metrics(metrics));
        }
        models.push((model.name.clone(), builder.build()));
    }
    let passthrough = (models.is_empty() && !llm_stacks.is_empty()).then(|| {
        let urls = [&llm.url, &llm.secondary_url];
        let mut builder = Model::builder(PASSTHROUGH_MODEL, &obs.gen_ai);
        for (url, stack) in urls.into_iter().zip(llm_stacks) {
            let endpoint = Endpoint {
                url: url.clone(),
                api_key: key(None),
                upstream_model: None,
                weight: 1,
            };
            builder = builder.deployment(endpoint, http.clone(), stack);
        }
        if let Some(queue) = llm_queue {
            builder = builder.fair_queue(queue);
        }
        builder.build()
    });
    Ok(Proxy::new(models, passthrough, policies, bounds))
}

/// The vector store: the built-in index, or Qdrant (with query embeddings
/// from the OpenAI-compatible endpoint) behind its resilience stack.
fn build_retriever(
    config: &Config,
    vars: &impl Fn(&str) -> Option<String>,
    obs: &Instruments,
    breakers: &mut Breakers,
) -> Result<Arc<dyn VectorStore>, BuildError> {
    let vs = &config.vector_store;
    if vs.url.is_empty() {
        return Ok(Arc::new(LocalIndex::acme()));
    }
    let policy = &config.resilience.vector_store;
    // Query embedding is part of retrieval, so it shares retrieval's
    // attempt budget and breaker.
    let embedder: Arc<dyn Embedder> = Arc::new(
        OpenAiClient::new(config.embeddings_url(), &config.llm, vars)?
            .with_timeout(policy.attempt_timeout, config.llm.connect_timeout)?
            .with_metrics(obs.upstream.clone()),
    );
    let client = QdrantClient::new(
        &vs.url,
        &vs.collection,
        &vs.text_field,
        policy.attempt_timeout,
        config.llm.connect_timeout,
        embedder,
    )?
    .with_metrics(obs.upstream.clone());
    let stack = DependencyStack::new("vector_store", policy.clone(), obs.observer("vector_store"))?;
    breakers.add(&stack);
    Ok(Arc::new(GuardedVectorStore::new(Arc::new(client), &stack)))
}

/// One lazily connected Redis connection (a server, or a cluster) shared
/// by memory and the limiter, or `None` when no Redis is configured.
fn redis_connection(config: &Config, timeout: Duration) -> Result<Option<RedisConn>, BuildError> {
    if !config.redis.is_configured() {
        return Ok(None);
    }
    if config.redis.mode == crate::config::RedisMode::Cluster {
        let cluster = LazyCluster::new(&config.redis.cluster_nodes, timeout).map_err(|e| {
            ConfigError::invalid(
                "redis.cluster_nodes",
                format!("{} nodes", config.redis.cluster_nodes.len()),
                e.to_string(),
            )
        })?;
        return Ok(Some(RedisConn::Cluster(cluster)));
    }
    let invalid = |e: redis::RedisError| {
        ConfigError::invalid(
            "redis.url",
            crate::config::redact_url(&config.redis.url),
            e.to_string(),
        )
    };
    let client = redis::Client::open(config.redis.url.as_str()).map_err(invalid)?;
    // The manager connects lazily and reconnects by itself, so a Redis that
    // is down at start does not stop the gateway from serving.
    // Reconnect attempts are capped at 250 ms apart (the library's default
    // backoff grows to seconds), so exact limits resume soon after a Redis
    // restart; the breaker, not the reconnect loop, protects requests.
    let manager_config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout.max(Duration::from_millis(200))))
        .set_response_timeout(Some(timeout))
        .set_min_delay(Duration::from_millis(25))
        .set_max_delay(Duration::from_millis(250));
    let conn = redis::aio::ConnectionManager::new_lazy_with_config(client, manager_config)
        .map_err(invalid)?;
    Ok(Some(RedisConn::Single(conn)))
}

fn build_limiter(
    config: &Config,
    redis: Option<&RedisConn>,
    redis_stack: Option<&DependencyStack>,
    metrics: &Metrics,
) -> Option<Arc<Limiter>> {
    let rl = &config.ratelimit;
    if !rl.enabled {
        return None;
    }
    let store: Arc<dyn LimitStore> = match (rl.store, redis, redis_stack) {
        (StoreKind::Redis | StoreKind::Auto, Some(conn), Some(stack)) => {
            let inner = RedisStore::new(conn.clone(), config.resilience.redis.attempt_timeout);
            Arc::new(GuardedLimitStore::new(Arc::new(inner), stack))
        }
        // validate() requires redis.url for `store = "redis"`.
        _ => Arc::new(MemoryStore::new()),
    };
    Some(Arc::new(
        Limiter::new(Policy::new(rl.clone()), store).with_metrics(metrics),
    ))
}
