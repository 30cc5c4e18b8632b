//! Turns a validated [`Config`] into a running gateway: has [`wiring`]
//! build the clients, stacks and pipeline and the HTTP state around them
//! (`build`), then serves with graceful shutdown (`serve`).

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::config::{Config, ConfigError};
use crate::http::{self, AppState};
use crate::wiring::{self, BuildError};

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
/// such as the LLM API key and the admin token from the environment.
pub async fn build(
    config: &Config,
    vars: impl Fn(&str) -> Option<String>,
) -> Result<AppState, StartError> {
    let gateway = wiring::build(config, &vars)?;
    Ok(AppState::new(
        gateway,
        config,
        vars(&config.admin.token_env).filter(|t| !t.is_empty()),
    ))
}

/// Pending connections the kernel may hold for `accept`.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds the configured address.
pub async fn bind(config: &Config) -> Result<TcpListener, StartError> {
    let addr = config.server.listen_addr()?;
    let bind = || -> std::io::Result<TcpListener> {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        // The std default backlog (128) drops SYNs when a few hundred
        // clients reconnect at once; each dropped SYN costs its client a
        // 1 s retransmit. The kernel caps this at `net.core.somaxconn`.
        socket.listen(LISTEN_BACKLOG)
    };
    bind().map_err(|source| StartError::Bind { addr, source })
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
    let (stop_jobs, jobs_stop) = tokio::sync::watch::channel(false);
    let workers = state
        .jobs
        .clone()
        .map(|w| tokio::spawn(w.run(jobs_stop, config.server.shutdown_grace)));
    let app = http::router(state).into_make_service_with_connect_info::<SocketAddr>();
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    // Streamed answers are many small writes: without TCP_NODELAY, Nagle
    // holds each one for the client's delayed ACK (~40 ms a frame).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
    });
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
    // Workers stop taking jobs and finish or release theirs within the
    // same bound as requests.
    let _ = stop_jobs.send(true);
    if let Some(w) = workers {
        let _ = tokio::time::timeout(config.server.shutdown_grace, w).await;
    }
    match tokio::time::timeout(config.server.shutdown_grace, &mut server).await {
        Ok(res) => finished(res),
        Err(_) => {
            tracing::warn!("drain bound reached; abandoning remaining requests");
            server.abort();
            Ok(())
        }
    }
}

impl From<BuildError> for StartError {
    fn from(err: BuildError) -> Self {
        match err {
            BuildError::Config(e) => Self::Config(e),
            BuildError::Client(e) => Self::Client(e),
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
