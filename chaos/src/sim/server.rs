//! The accept loop. The simulator runs its own hyper connections instead of
//! `axum::serve` because the `reset` fault must drop one particular socket
//! with `SO_LINGER = 0` (an RST, no HTTP response): each connection task
//! hands its requests a [`ConnectionControl`] and drops the connection when
//! a handler pulls it.

use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{extract::Request, Router};
use hyper::body::Incoming;
use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{oneshot, watch, Notify},
    task::{JoinHandle, JoinSet},
};
use tower::ServiceExt;

use super::{
    app::{app, AppState},
    config::SimConfig,
};

/// What the binary prints, followed by the bound address, once listening.
pub const LISTENING_PREFIX: &str = "levee-upstream-sim listening on ";

/// How long shutdown waits for in-flight requests before aborting them.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop
/// does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A running in-process simulator. Dropping it shuts the server down in the
/// background; [`SimHandle::shutdown`] waits for it.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

/// Lets a request ask its connection task to reset the socket.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionControl {
    inner: Arc<ControlInner>,
}

#[derive(Debug, Default)]
struct ControlInner {
    reset: AtomicBool,
    notify: Notify,
}

/// A `TcpStream` that, if its connection was reset, closes with an RST.
#[derive(Debug)]
struct ResettableStream {
    stream: TcpStream,
    control: ConnectionControl,
}

impl SimHandle {
    /// The bound address, e.g. `127.0.0.1:41234`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://` plus [`addr`](Self::addr), without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, drains in-flight requests (bounded by
    /// [`DRAIN_TIMEOUT`]) and waits for the server to finish.
    pub async fn shutdown(mut self) -> io::Result<()> {
        if let Some(stop) = self.stop.take() {
            // The server may already be gone; then there is nothing to stop.
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.map_err(io::Error::other)?,
            None => Ok(()),
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        // Dropping `stop` resolves the server's shutdown future.
        self.stop.take();
    }
}

impl ConnectionControl {
    /// Asks the connection task to drop the socket with an RST.
    pub(crate) fn reset(&self) {
        self.inner.reset.store(true, Ordering::SeqCst);
        // notify_one keeps a permit if the task is not waiting right now.
        self.inner.notify.notify_one();
    }

    async fn reset_requested(&self) {
        self.inner.notify.notified().await;
    }

    fn is_reset(&self) -> bool {
        self.inner.reset.load(Ordering::SeqCst)
    }
}

impl Drop for ResettableStream {
    fn drop(&mut self) {
        if self.control.is_reset() {
            // Linger 0 turns the close into an RST and discards unsent data.
            let _ = socket2::SockRef::from(&self.stream).set_linger(Some(Duration::ZERO));
        }
    }
}

impl AsyncRead for ResettableStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResettableStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Binds `127.0.0.1:0` and serves `config` in a background task.
pub async fn spawn(config: SimConfig) -> io::Result<SimHandle> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    spawn_on(listener, config)
}

/// Serves `config` on an already bound `listener` in a background task.
pub fn spawn_on(listener: TcpListener, config: SimConfig) -> io::Result<SimHandle> {
    config
        .validate()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(listener, config, async {
        // A send and a dropped sender both mean "stop".
        let _ = stopped.await;
    }));
    Ok(SimHandle {
        addr,
        stop: Some(stop),
        task: Some(task),
    })
}

/// Serves the simulator on `listener` until `shutdown` resolves, then stops
/// accepting, releases hung requests and drains connections for at most
/// [`DRAIN_TIMEOUT`].
pub async fn serve(
    listener: TcpListener,
    config: SimConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    config
        .validate()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let state = Arc::new(AppState::new(config));
    let router = app(state.clone());
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);

    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    // Each SSE frame is a small write: without this, Nagle
                    // holds it for the peer's delayed ACK (~40 ms).
                    let _ = stream.set_nodelay(true);
                    connections.spawn(connection(stream, router.clone(), stop_rx.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            // Reap finished connections so the set does not grow forever.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }

    drop(listener);
    state.faults.release_hangs();
    // Receivers only fail if every connection is gone, which is fine.
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            remaining = connections.len(),
            "drain timed out, aborting connections"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// Serves one connection until it closes, a handler resets it, or shutdown.
async fn connection(stream: TcpStream, router: Router, mut stop: watch::Receiver<bool>) {
    let control = ConnectionControl::default();
    let io = TokioIo::new(ResettableStream {
        stream,
        control: control.clone(),
    });
    let per_request = control.clone();
    let service = router.map_request(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(per_request.clone());
        request
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, TowerToHyperService::new(service));
    tokio::pin!(conn);

    let mut draining = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            // Returning drops `conn`, its socket, and with it the RST.
            () = control.reset_requested() => return,
            changed = stop.changed(), if !draining => {
                draining = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
