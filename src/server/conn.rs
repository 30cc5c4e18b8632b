//! One client connection: HTTP/1.1 by hyper, with the header-read and idle
//! timeouts hyper does not offer together. (The JSON 431 for an oversize
//! head is the router's: `http::head`.)
//!
//! hyper's own `header_read_timeout` (1.12) starts whenever the connection
//! waits for a request head, idle keep-alive included, so it would close
//! every idle connection after the *header* timeout. Here a [`Watchdog`]
//! beside the connection tells the two apart from three counters:
//! requests begun and finished (kept by the service: [`InFlight`]) and reads
//! that returned bytes (kept by the socket wrapper: [`Watched`]). A read
//! costs one relaxed store; the timer is re-armed only when the connection
//! changes phase.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use axum::Router;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::{Instant, Sleep};
use tower::util::Oneshot;
use tower::ServiceExt;

/// The per-connection limits, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// `server.header_read_timeout`.
    pub(super) header_read_timeout: Duration,
    /// `server.idle_timeout`.
    pub(super) idle_timeout: Duration,
}

/// hyper's own head limit is this many times `server.max_header_bytes`:
/// between the two the router answers the JSON 431; past it hyper stops reading
/// and answers a bare 431 (it has no hook for a body), which bounds the
/// memory one connection's head can take.
pub(super) const HARD_HEADER_FACTOR: usize = 4;

/// What a connection was waiting for when its timer ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// A request's headers (a new connection, or bytes of the next request).
    Head,
    /// Anything at all: a keep-alive connection between requests.
    Idle,
}

/// Serves one accepted connection until it closes, times out, or drains
/// after `stop`; `_slot` is its place under `server.max_connections`.
pub(super) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    http: Arc<http1::Builder>,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let activity = Arc::new(Activity::default());
    let io = TokioIo::new(Watched {
        io: stream,
        reads: 0,
        activity: activity.clone(),
    });
    let service = Handler {
        router,
        peer,
        activity: activity.clone(),
    };
    let conn = http.serve_connection(io, service);
    let watchdog = Watchdog::new(activity, limits);
    tokio::pin!(conn, watchdog);
    let mut draining = false;
    loop {
        tokio::select! {
            // The connection first, so the watchdog sees in the same poll
            // every request the connection began or finished.
            biased;
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            phase = watchdog.as_mut() => {
                // Dropping the connection closes the socket.
                tracing::debug!(%peer, ?phase, "closing connection: timed out");
                return;
            }
            _ = stop.changed(), if !draining => {
                // Idle connections close now; one mid-request finishes it
                // and closes (no keep-alive).
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// What the connection's parts tell its watchdog. Written and read only by
/// the connection's own task, so relaxed ordering is enough.
#[derive(Debug, Default)]
struct Activity {
    /// Reads that returned bytes.
    reads: AtomicU64,
    /// Requests handed to the router.
    started: AtomicU64,
    /// Responses fully written (or abandoned).
    finished: AtomicU64,
    /// `reads` when the last response finished.
    reads_at_finish: AtomicU64,
}

/// One request in flight on a connection, from the router's call until
/// hyper drops the response body (written to the end, or abandoned).
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> Self {
        activity.started.fetch_add(1, Relaxed);
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        a.reads_at_finish.store(a.reads.load(Relaxed), Relaxed);
        a.finished.fetch_add(1, Relaxed);
    }
}

pin_project! {
    /// The socket, counting reads that returned bytes.
    struct Watched<T> {
        #[pin]
        io: T,
        reads: u64,
        activity: Arc<Activity>,
    }
}

impl<T: AsyncRead> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let res = this.io.poll_read(cx, buf);
        if buf.filled().len() > before {
            *this.reads += 1;
            this.activity.reads.store(*this.reads, Relaxed);
        }
        res
    }
}

impl<T: AsyncWrite> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().io.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

pin_project! {
    /// Resolves when the connection has waited too long for a request's
    /// headers or, between requests, for anything. While a request is in
    /// flight it never fires: the request's own deadlines govern, and an
    /// answer streamed for minutes is not idle.
    struct Watchdog {
        #[pin]
        sleep: Sleep,
        activity: Arc<Activity>,
        limits: Limits,
        phase: Phase,
        seen_finished: u64,
        armed: bool,
    }
}

impl Watchdog {
    fn new(activity: Arc<Activity>, limits: Limits) -> Self {
        // A new connection owes its first request's headers from accept.
        Self {
            sleep: tokio::time::sleep(limits.header_read_timeout),
            activity,
            limits,
            phase: Phase::Head,
            seen_finished: 0,
            armed: true,
        }
    }
}

impl Future for Watchdog {
    type Output = Phase;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Phase> {
        let mut this = self.project();
        let a = &**this.activity;
        let finished = a.finished.load(Relaxed);
        if a.started.load(Relaxed) != finished {
            return Poll::Pending;
        }
        if finished != *this.seen_finished {
            // A response just finished: the connection is idle.
            *this.seen_finished = finished;
            *this.phase = Phase::Idle;
            *this.armed = false;
        }
        if *this.phase == Phase::Idle && a.reads.load(Relaxed) != a.reads_at_finish.load(Relaxed) {
            // Bytes of the next request, but not yet all its headers.
            *this.phase = Phase::Head;
            *this.armed = false;
        }
        if !*this.armed {
            let wait = match this.phase {
                Phase::Head => this.limits.header_read_timeout,
                Phase::Idle => this.limits.idle_timeout,
            };
            this.sleep.as_mut().reset(Instant::now() + wait);
            *this.armed = true;
        }
        ready!(this.sleep.poll(cx));
        Poll::Ready(*this.phase)
    }
}

/// The router as hyper's per-connection service: adds the peer address
/// (`ConnectInfo`, which the identity layer reads) and tracks the request
/// for the watchdog.
#[derive(Debug, Clone)]
struct Handler {
    router: Router,
    peer: SocketAddr,
    activity: Arc<Activity>,
}

type RouterFuture = Oneshot<Router, Request<Incoming>>;

impl hyper::service::Service<Request<Incoming>> for Handler {
    type Response = Response<Tracked>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        let in_flight = InFlight::begin(&self.activity);
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let inner = self.router.clone().oneshot(req);
        ResponseFuture {
            inner,
            in_flight: Some(in_flight),
        }
    }
}

pin_project! {
    /// The router's answer, with the request's [`InFlight`] moved into the
    /// body so the request ends when hyper is done with the body.
    struct ResponseFuture {
        #[pin]
        inner: RouterFuture,
        in_flight: Option<InFlight>,
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<Tracked>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = ready!(this.inner.poll(cx));
        let in_flight = this.in_flight.take();
        Poll::Ready(res.map(|resp| {
            resp.map(|body| Tracked {
                body,
                _in_flight: in_flight,
            })
        }))
    }
}

pin_project! {
    /// A response body that ends its request when dropped.
    struct Tracked {
        #[pin]
        body: axum::body::Body,
        _in_flight: Option<InFlight>,
    }
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }

    /// Polls the watchdog once, as the connection's task would.
    fn poll(dog: &mut Pin<Box<Watchdog>>) -> Poll<Phase> {
        let waker = futures::task::noop_waker();
        dog.as_mut().poll(&mut Context::from_waker(&waker))
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_owes_its_headers_within_the_header_timeout() {
        let activity = Arc::new(Activity::default());
        let mut dog = Box::pin(Watchdog::new(activity, limits()));
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(poll(&mut dog).is_pending());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(poll(&mut dog), Poll::Ready(Phase::Head));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_never_times_out_and_idle_counts_from_its_end() {
        let activity = Arc::new(Activity::default());
        let mut dog = Box::pin(Watchdog::new(activity.clone(), limits()));
        let req = InFlight::begin(&activity);
        tokio::time::advance(Duration::from_secs(600)).await;
        assert!(
            poll(&mut dog).is_pending(),
            "a 10-minute stream is not idle"
        );
        drop(req);
        assert!(poll(&mut dog).is_pending());
        tokio::time::advance(Duration::from_millis(59_999)).await;
        assert!(poll(&mut dog).is_pending());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(poll(&mut dog), Poll::Ready(Phase::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_byte_of_the_next_request_starts_the_header_timeout() {
        let activity = Arc::new(Activity::default());
        let mut dog = Box::pin(Watchdog::new(activity.clone(), limits()));
        drop(InFlight::begin(&activity));
        assert!(poll(&mut dog).is_pending());
        tokio::time::advance(Duration::from_secs(30)).await;
        // A partial head arrives after 30 s idle: 10 s from now, not 60 s
        // from the last response.
        activity.reads.fetch_add(1, Relaxed);
        assert!(poll(&mut dog).is_pending());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(poll(&mut dog), Poll::Ready(Phase::Head));
    }
}
