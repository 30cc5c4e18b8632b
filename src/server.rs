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
use crate::http::{self, AppState};
use crate::identity::Resolver;
use crate::rag::{ConversationStore, InProcessMemory, IntentRouter, Pipeline, RedisMemory};
use crate::ratelimit::policy::Policy;
use crate::ratelimit::store::{LimitStore, MemoryStore, RedisStore};
use crate::ratelimit::{Limiter, StoreKind};
use crate::upstream::{
    Embedder, ExtractiveAnswerer, Llm, LocalIndex, OpenAiClient, QdrantClient, VectorStore,
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
    let llm: Arc<dyn Llm> = if config.llm.url.is_empty() {
        Arc::new(ExtractiveAnswerer)
    } else {
        Arc::new(OpenAiClient::new(&config.llm.url, &config.llm, &vars)?)
    };
    let vs = &config.vector_store;
    let retriever: Arc<dyn VectorStore> = if vs.url.is_empty() {
        Arc::new(LocalIndex::acme())
    } else {
        // Query embedding is part of retrieval, so it gets retrieval's budget.
        let embedder: Arc<dyn Embedder> = Arc::new(
            OpenAiClient::new(config.embeddings_url(), &config.llm, &vars)?
                .with_timeout(vs.timeout, config.llm.connect_timeout)?,
        );
        Arc::new(QdrantClient::new(
            &vs.url,
            &vs.collection,
            &vs.text_field,
            vs.timeout,
            config.llm.connect_timeout,
            embedder,
        )?)
    };
    let redis = redis_connection(config)?;
    let memory: Arc<dyn ConversationStore> = match &redis {
        None => Arc::new(InProcessMemory::new(config.memory.clone())),
        Some(conn) => Arc::new(RedisMemory::new(
            conn.clone(),
            config.memory.clone(),
            config.redis.timeout,
        )),
    };
    let limiter = build_limiter(config, redis.as_ref());
    let pipeline = Pipeline::new(
        IntentRouter::new(&config.router),
        retriever,
        llm,
        memory,
        vs.top_k,
        health.clone(),
    );
    Ok(AppState {
        pipeline,
        limiter,
        llm_max_tokens: u64::from(config.llm.max_tokens),
        health,
        max_body_bytes: config.server.max_body_bytes,
        max_message_bytes: config.server.max_message_bytes,
    })
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
    // The manager connects lazily and reconnects by itself, so a Redis that
    // is down at start does not stop the gateway from serving.
    let manager_config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.redis.timeout.max(Duration::from_millis(200))))
        .set_response_timeout(Some(config.redis.timeout));
    let conn = ConnectionManager::new_lazy_with_config(client, manager_config).map_err(invalid)?;
    Ok(Some(conn))
}

fn build_limiter(config: &Config, redis: Option<&ConnectionManager>) -> Option<Arc<Limiter>> {
    let rl = &config.ratelimit;
    if !rl.enabled {
        return None;
    }
    let store: Arc<dyn LimitStore> = match (rl.store, redis) {
        (StoreKind::Memory, _) | (StoreKind::Auto, None) => Arc::new(MemoryStore::new()),
        (StoreKind::Redis | StoreKind::Auto, Some(conn)) => {
            Arc::new(RedisStore::new(conn.clone(), config.redis.timeout))
        }
        // validate() requires redis.url for `store = "redis"`.
        (StoreKind::Redis, None) => Arc::new(MemoryStore::new()),
    };
    Some(Arc::new(Limiter::new(
        Policy::new(rl.clone()),
        Resolver::new(&config.identity),
        store,
    )))
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
