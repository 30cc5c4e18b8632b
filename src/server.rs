//! Turns a validated [`Config`] into a running gateway: has [`wiring`]
//! build the clients, stacks and pipeline and the HTTP state around them
//! (`build`), then serves with graceful shutdown (`serve`): our own accept
//! loop under a connection cap, each connection served by hyper's HTTP/1.1
//! with header-read and idle timeouts (`conn`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::config::{Config, ConfigError, ServerConfig, DEFAULT_MAX_CONNECTIONS};
use crate::http::{self, AppState};
use crate::wiring::{self, BuildError};

mod conn;

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
///
/// Connections are HTTP/1.1, each under `server.header_read_timeout` and
/// `server.idle_timeout`, at most `server.max_connections` at once (README,
/// "Connection hardening").
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
    let (tx, rx) = tokio::sync::watch::channel(false);
    let acceptor = Acceptor::new(http::router(state), &config.server, rx);
    let slots = acceptor.slots.clone();
    let cap = acceptor.cap;
    let mut server = tokio::spawn(acceptor.run(listener));
    tokio::select! {
        res = &mut server => return finished(res),
        () = shutdown => {}
    }
    tracing::info!(grace = ?config.server.shutdown_grace, "shutting down: draining in-flight requests");
    health.set_draining();
    // The accept loop stops (closing the listener) and every connection
    // drains: idle ones close now, busy ones after their response.
    let _ = tx.send(true);
    // Workers stop taking jobs and finish or release theirs within the
    // same bound as requests.
    let _ = stop_jobs.send(true);
    if let Some(w) = workers {
        let _ = tokio::time::timeout(config.server.shutdown_grace, w).await;
    }
    let drained = async {
        let res = (&mut server).await;
        // Every slot back: every connection has closed.
        let _ = slots.acquire_many(cap).await;
        res
    };
    match tokio::time::timeout(config.server.shutdown_grace, drained).await {
        Ok(res) => finished(res),
        Err(_) => {
            tracing::warn!("drain bound reached; abandoning remaining requests");
            server.abort();
            Ok(())
        }
    }
}

/// The first wait after an accept error that is not the peer's (such as
/// EMFILE, out of file descriptors); it doubles up to [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// The longest wait between accept attempts after errors.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// File descriptors assumed needed besides client connections (upstream
/// and Redis sockets, the runtime's own), for the start-up check of
/// `server.max_connections` against the open-files limit.
const FD_HEADROOM: u64 = 256;

/// The accept loop: one slot per connection under `server.max_connections`.
struct Acceptor {
    router: axum::Router,
    http: Arc<http1::Builder>,
    limits: conn::Limits,
    slots: Arc<Semaphore>,
    /// How many slots there are.
    cap: u32,
    stop: watch::Receiver<bool>,
}

impl Acceptor {
    fn new(router: axum::Router, server: &ServerConfig, stop: watch::Receiver<bool>) -> Self {
        let mut http = http1::Builder::new();
        http.keep_alive(true)
            // The connection's watchdog keeps the header-read timeout
            // (hyper's would also cut idle keep-alive connections short).
            .header_read_timeout(None)
            .max_header_size(server.max_header_bytes * conn::HARD_HEADER_FACTOR);
        let cap = connection_cap(server.max_connections, open_files_limit());
        Self {
            router,
            http: Arc::new(http),
            limits: conn::Limits {
                header_read_timeout: server.header_read_timeout,
                idle_timeout: server.idle_timeout,
            },
            slots: Arc::new(Semaphore::new(cap as usize)),
            cap,
            stop,
        }
    }

    /// Accepts until `stop`. At the cap it waits for a slot before calling
    /// `accept`, so the kernel's backlog holds new clients instead of
    /// Levee accepting and closing them.
    async fn run(mut self, listener: TcpListener) -> std::io::Result<()> {
        let mut backoff = ACCEPT_BACKOFF_MIN;
        loop {
            let slot = tokio::select! {
                slot = self.slots.clone().acquire_owned() => slot,
                _ = self.stop.changed() => return Ok(()),
            };
            // The semaphore is never closed.
            let Ok(slot) = slot else { return Ok(()) };
            let (stream, peer) = loop {
                let accepted = tokio::select! {
                    res = listener.accept() => res,
                    _ = self.stop.changed() => return Ok(()),
                };
                match accepted {
                    Ok(conn) => break conn,
                    // The peer gave up before we took it: nothing to wait for.
                    Err(e) if is_peer_error(&e) => continue,
                    Err(e) => {
                        // EMFILE / ENFILE and the like: the pending
                        // connection stays in the backlog; try again soon.
                        tracing::warn!(error = %e, retry_in = ?backoff, "cannot accept a connection");
                        tokio::select! {
                            () = tokio::time::sleep(backoff) => {}
                            _ = self.stop.changed() => return Ok(()),
                        }
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    }
                }
            };
            backoff = ACCEPT_BACKOFF_MIN;
            // Streamed answers are many small writes: without TCP_NODELAY,
            // Nagle holds each one for the client's delayed ACK (~40 ms a
            // frame).
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
            tokio::spawn(conn::serve(
                stream,
                peer,
                self.router.clone(),
                self.http.clone(),
                self.limits,
                self.stop.clone(),
                slot,
            ));
        }
    }
}

/// An accept error that concerns one connection, not the listener.
fn is_peer_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset, Interrupted};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset | Interrupted
    )
}

/// The connection cap. Unset `server.max_connections`: the default, or
/// what the open-files limit leaves after [`FD_HEADROOM`] when that is
/// lower, so the cap, not EMFILE, pushes back on clients. A configured
/// value is used as is, with a warning when the limit cannot hold it
/// (accept then meets EMFILE first, and backs off).
fn connection_cap(configured: Option<usize>, open_files: Option<u64>) -> u32 {
    // Validation caps `max_connections` at one million.
    let as_u32 = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    let room = open_files.map(|limit| as_u32(limit.saturating_sub(FD_HEADROOM).max(1)));
    match (configured, room) {
        (Some(n), Some(room)) => {
            let n = as_u32(n as u64);
            if n > room {
                tracing::warn!(
                    max_connections = n,
                    open_files_limit = open_files,
                    "server.max_connections is over what the open-files limit leaves; raise it (ulimit -n, systemd LimitNOFILE) or lower server.max_connections"
                );
            }
            n
        }
        (Some(n), None) => as_u32(n as u64),
        (None, Some(room)) if room < as_u32(DEFAULT_MAX_CONNECTIONS as u64) => {
            tracing::info!(
                cap = room,
                open_files_limit = open_files,
                "connection cap lowered to fit the open-files limit (set server.max_connections to choose)"
            );
            room
        }
        (None, _) => as_u32(DEFAULT_MAX_CONNECTIONS as u64),
    }
}

/// The soft limit on open files (Linux: `/proc/self/limits`); `None` when
/// unknown or unlimited.
fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.trim_start_matches("Max open files")
        .split_whitespace()
        .next()?
        .parse()
        .ok()
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

#[cfg(test)]
mod tests {
    use super::connection_cap;

    #[test]
    fn the_cap_leaves_room_under_the_open_files_limit() {
        assert_eq!(connection_cap(None, Some(20_000)), 10_000);
        assert_eq!(connection_cap(None, Some(1024)), 1024 - 256);
        assert_eq!(connection_cap(None, Some(100)), 1);
        assert_eq!(connection_cap(None, None), 10_000);
        // Configured: as is, even over the limit (accept backs off on EMFILE).
        assert_eq!(connection_cap(Some(1000), Some(64)), 1000);
        assert_eq!(connection_cap(Some(50), None), 50);
    }
}
