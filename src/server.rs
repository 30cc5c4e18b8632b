//! Turns a validated [`Config`] into a running gateway: builds the
//! upstream clients and the pipeline (`build`), then serves with graceful
//! shutdown (`serve`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::net::TcpListener;

use crate::config::{Config, ConfigError};
use crate::health::DependencyHealth;
use crate::http::{self, AppState, Breakers};
use crate::identity::Resolver;
use crate::rag::{ConversationStore, InProcessMemory, IntentRouter, Pipeline, RedisMemory};
use crate::ratelimit::policy::Policy;
use crate::ratelimit::store::{LimitStore, MemoryStore, RedisStore};
use crate::ratelimit::{Limiter, StoreKind};
use crate::resilience::{DependencyStack, ResilienceObserver};
use crate::telemetry::Metrics;
use crate::upstream::{
    Embedder, ExtractiveAnswerer, FallbackLlm, GuardedLimitStore, GuardedLlm, GuardedMemory,
    GuardedVectorStore, Llm, LocalIndex, OpenAiClient, QdrantClient, VectorStore,
};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An HTTP client could not be built.
    #[error("cannot build HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("server error: {0}")]
    Serve(std::io::Error),
}

/// Builds the application state from configuration. `vars` reads secrets
/// such as the LLM API key from the environment.
pub async fn build(
    config: &Config,
    vars: impl Fn(&str) -> Option<String>,
) -> Result<AppState, StartError> {
    let health = Arc::new(DependencyHealth::default());
    // The one metrics registry of this process, passed to everything that
    // records (and served at /metrics); it also observes every breaker,
    // retry and bulkhead.
    let metrics = Metrics::new(config);
    let observer: Arc<dyn ResilienceObserver> = Arc::new(metrics.clone());
    let res = &config.resilience;
    let mut breakers = Breakers::default();

    let llm = build_llm(config, &vars, &metrics, &observer, &mut breakers)?;
    let retriever = build_retriever(config, &vars, &metrics, &observer, &mut breakers)?;

    let redis = redis_connection(config)?;
    // One stack for Redis, shared by the limiter store and memory: when its
    // breaker opens, both skip Redis at once.
    let redis_stack = match &redis {
        Some(_) => {
            let stack = DependencyStack::new("redis", res.redis.clone(), observer.clone())?;
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
            .with_metrics(metrics.clone());
            Arc::new(GuardedMemory::new(Arc::new(inner), stack))
        }
        _ => Arc::new(InProcessMemory::new(config.memory.clone())),
    };
    let limiter = build_limiter(config, redis.as_ref(), redis_stack.as_ref(), &metrics);
    let pipeline = Pipeline::new(
        IntentRouter::new(&config.router),
        retriever,
        llm,
        memory,
        config.vector_store.top_k,
        health.clone(),
    )
    .with_retrieval_fallback(config.vector_store.on_failure)
    .with_metrics(metrics.clone());
    Ok(AppState {
        pipeline,
        limiter,
        llm_max_tokens: u64::from(config.llm.max_tokens),
        health,
        max_body_bytes: config.server.max_body_bytes,
        max_message_bytes: config.server.max_message_bytes,
        metrics,
        breakers: Arc::new(breakers),
        admin_token: vars(&config.admin.token_env).filter(|t| !t.is_empty()),
    })
}

/// The LLM: the built-in answerer, or the OpenAI-compatible client behind
/// its resilience stack (and a secondary endpoint behind its own).
fn build_llm(
    config: &Config,
    vars: &impl Fn(&str) -> Option<String>,
    metrics: &Metrics,
    observer: &Arc<dyn ResilienceObserver>,
    breakers: &mut Breakers,
) -> Result<Arc<dyn Llm>, StartError> {
    if config.llm.url.is_empty() {
        return Ok(Arc::new(ExtractiveAnswerer));
    }
    let policy = &config.resilience.llm;
    let client = |url: &str| -> Result<Arc<dyn Llm>, StartError> {
        Ok(Arc::new(
            OpenAiClient::new(url, &config.llm, vars)?
                .with_timeout(policy.attempt_timeout, config.llm.connect_timeout)?
                .with_metrics(metrics.clone()),
        ))
    };
    let stack = DependencyStack::new("llm", policy.clone(), observer.clone())?;
    breakers.add(&stack);
    let primary: Arc<dyn Llm> = Arc::new(GuardedLlm::new(client(&config.llm.url)?, &stack));
    if config.llm.secondary_url.is_empty() {
        return Ok(primary);
    }
    let secondary_stack = DependencyStack::new("llm_secondary", policy.clone(), observer.clone())?;
    metrics.register_dependency("llm_secondary");
    breakers.add(&secondary_stack);
    let secondary = Arc::new(GuardedLlm::new(
        client(&config.llm.secondary_url)?,
        &secondary_stack,
    ));
    Ok(Arc::new(FallbackLlm::new(primary, secondary)))
}

/// The vector store: the built-in index, or Qdrant (with query embeddings
/// from the OpenAI-compatible endpoint) behind its resilience stack.
fn build_retriever(
    config: &Config,
    vars: &impl Fn(&str) -> Option<String>,
    metrics: &Metrics,
    observer: &Arc<dyn ResilienceObserver>,
    breakers: &mut Breakers,
) -> Result<Arc<dyn VectorStore>, StartError> {
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
            .with_metrics(metrics.clone()),
    );
    let client = QdrantClient::new(
        &vs.url,
        &vs.collection,
        &vs.text_field,
        policy.attempt_timeout,
        config.llm.connect_timeout,
        embedder,
    )?
    .with_metrics(metrics.clone());
    let stack = DependencyStack::new("vector_store", policy.clone(), observer.clone())?;
    breakers.add(&stack);
    Ok(Arc::new(GuardedVectorStore::new(Arc::new(client), &stack)))
}

/// One lazily connected Redis connection shared by memory and the limiter,
/// or `None` when no Redis is configured.
fn redis_connection(config: &Config) -> Result<Option<ConnectionManager>, StartError> {
    if config.redis.url.is_empty() {
        return Ok(None);
    }
    let invalid = |e: redis::RedisError| {
        ConfigError::invalid(
            "redis.url",
            crate::config::redact_url(&config.redis.url),
            e.to_string(),
        )
    };
    let client = redis::Client::open(config.redis.url.as_str()).map_err(invalid)?;
    let timeout = config.resilience.redis.attempt_timeout;
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
    let conn = ConnectionManager::new_lazy_with_config(client, manager_config).map_err(invalid)?;
    Ok(Some(conn))
}

fn build_limiter(
    config: &Config,
    redis: Option<&ConnectionManager>,
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
        Limiter::new(
            Policy::new(rl.clone()),
            Resolver::new(&config.identity),
            store,
        )
        .with_metrics(metrics.clone()),
    ))
}

/// Binds the configured address.
pub async fn bind(config: &Config) -> Result<TcpListener, StartError> {
    let addr = config.server.listen_addr()?;
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

/// Serves until `shutdown` completes, then stops accepting, marks the
/// replica as draining and lets in-flight requests finish within
/// `server.shutdown_grace`.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let health = state.health.clone();
    let app = http::router(state).into_make_service_with_connect_info::<SocketAddr>();
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = rx.changed().await;
    });
    let mut server = tokio::spawn(std::future::IntoFuture::into_future(server));
    tokio::select! {
        res = &mut server => return finished(res),
        () = shutdown => {}
    }
    tracing::info!(grace = ?config.server.shutdown_grace, "shutting down: draining in-flight requests");
    health.set_draining();
    let _ = tx.send(true);
    match tokio::time::timeout(config.server.shutdown_grace, &mut server).await {
        Ok(res) => finished(res),
        Err(_) => {
            tracing::warn!("drain bound reached; abandoning remaining requests");
            server.abort();
            Ok(())
        }
    }
}

fn finished(res: Result<std::io::Result<()>, tokio::task::JoinError>) -> Result<(), StartError> {
    match res {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(StartError::Serve(e)),
        Err(e) => Err(StartError::Serve(std::io::Error::other(e))),
    }
}

/// Resolves on SIGTERM or ctrl-c.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
