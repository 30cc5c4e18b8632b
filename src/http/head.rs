//! Limits on what a client sends, applied inside the trace layer so every
//! refusal is counted and traced:
//!
//! - the request head's size (`server.max_header_bytes`): an oversize head
//!   is a 431 in the error contract. hyper's own, larger head limit (see
//!   `server::conn`) bounds what a connection may buffer;
//! - the time to send the whole body (`server.body_read_timeout`): the
//!   body is wrapped in a deadline that does not reset per frame, so a
//!   client trickling one byte at a time cannot hold a handler and a
//!   connection slot. The handler's body read fails with [`BodyTimeout`],
//!   which the error path answers 408 `body_timeout`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::{respond_as, ApiError, Dialect};

/// The client limits, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClientLimits {
    /// `server.max_header_bytes`.
    pub(super) max_header_bytes: usize,
    /// `server.body_read_timeout`.
    pub(super) body_read_timeout: Duration,
}

/// The client did not send its whole body within `server.body_read_timeout`.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request body was not received within {0:?} (server.body_read_timeout)")]
pub struct BodyTimeout(pub Duration);

/// Answers 431 when the request line and header fields exceed the limit,
/// and bounds the time the body may take.
pub(super) async fn limit(
    State(limits): State<ClientLimits>,
    req: Request,
    next: Next,
) -> Response {
    let limit = limits.max_header_bytes;
    let size = head_size(&req);
    if size > limit {
        let err = ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "header_too_large",
            format!("request headers are {size} bytes, over the {limit} byte limit"),
        );
        return respond_as(Dialect::for_path(req.uri().path()), &err);
    }
    // A request without a body (GET, HEAD …) has nothing to wait for.
    if hyper::body::Body::is_end_stream(req.body()) {
        return next.run(req).await;
    }
    let timeout = limits.body_read_timeout;
    let req = req.map(|body| {
        Body::new(Deadline {
            body,
            sleep: tokio::time::sleep(timeout),
            timeout,
        })
    });
    next.run(req).await
}

pin_project! {
    /// A request body that fails with [`BodyTimeout`] once its deadline
    /// passes, however the bytes were spread over that time.
    struct Deadline {
        #[pin]
        body: Body,
        #[pin]
        sleep: Sleep,
        timeout: Duration,
    }
}

impl hyper::body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.body.poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match this.sleep.poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyTimeout(*this.timeout))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The request line and header fields in bytes, as written on the wire in
/// canonical form (`Name: value\r\n`).
fn head_size<B>(req: &axum::http::Request<B>) -> usize {
    let uri = req.uri();
    let target = uri.scheme_str().map_or(0, |s| s.len() + 3)
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path_and_query().map_or(1, |p| p.as_str().len());
    // METHOD SP target SP HTTP/1.1 CRLF, then the fields, then CRLF.
    let line = req.method().as_str().len() + 1 + target + 1 + 8 + 2;
    req.headers().iter().fold(line + 2, |n, (name, value)| {
        n + name.as_str().len() + 2 + value.len() + 2
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test(start_paused = true)]
    async fn a_trickled_body_fails_at_the_deadline_whatever_its_pace() {
        // One byte every 400 ms: a per-frame timeout of 1 s never fires.
        let trickle = futures::stream::unfold(0u32, |n| async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            Some((Ok::<_, std::io::Error>(Bytes::from_static(b"x")), n + 1))
        });
        let timeout = Duration::from_secs(1);
        let body = Body::new(Deadline {
            body: Body::from_stream(trickle),
            sleep: tokio::time::sleep(timeout),
            timeout,
        });
        let started = tokio::time::Instant::now();
        let mut stream = body.into_data_stream();
        let mut got = 0;
        let err = loop {
            match stream.next().await {
                Some(Ok(_)) => got += 1,
                Some(Err(e)) => break e,
                None => panic!("the trickle never ends"),
            }
        };
        assert_eq!(got, 2, "bytes before the deadline pass through");
        assert_eq!(started.elapsed(), timeout);
        assert!(super::super::error::body_timeout(&err).is_some(), "{err}");
    }

    #[test]
    fn head_size_counts_the_request_line_and_every_field() {
        let req = axum::http::Request::get("/health")
            .header("host", "x")
            .header("a", "bc")
            .body(())
            .unwrap();
        // "GET /health HTTP/1.1\r\n" + "host: x\r\n" + "a: bc\r\n" + "\r\n"
        assert_eq!(head_size(&req), 22 + 9 + 7 + 2);
    }
}
