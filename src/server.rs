//! Turns a validated [`Config`] into a running gateway: builds the
//! upstream clients and the pipeline (`build`), then serves with graceful
//! shutdown (`serve`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::{Config, ConfigError};
use crate::health::DependencyHealth;
use crate::http::{self, AppState};
use crate::rag::{ConversationStore, InProcessMemory, IntentRouter, Pipeline, RedisMemory};
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
    let memory: Arc<dyn ConversationStore> = if config.redis.url.is_empty() {
        Arc::new(InProcessMemory::new(config.memory.clone()))
    } else {
        let client = redis::Client::open(config.redis.url.as_str()).map_err(|e| {
            ConfigError::invalid(
                "redis.url",
                crate::config::redact_url(&config.redis.url),
                e.to_string(),
            )
        })?;
        // The manager connects lazily and reconnects by itself, so a Redis
        // that is down at start does not stop the gateway from serving.
        let manager_config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(
                config
                    .redis
                    .timeout
                    .max(std::time::Duration::from_millis(200)),
            ))
            .set_response_timeout(Some(config.redis.timeout));
        let conn = redis::aio::ConnectionManager::new_lazy_with_config(client, manager_config)
            .map_err(|e| ConfigError::invalid("redis.url", "(redacted)", e.to_string()))?;
        Arc::new(RedisMemory::new(
            conn,
            config.memory.clone(),
            config.redis.timeout,
        ))
    };
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
        health,
        max_body_bytes: config.server.max_body_bytes,
        max_message_bytes: config.server.max_message_bytes,
    })
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
