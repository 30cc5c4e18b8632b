//! [`Relay`]: a deployment's SSE stream on its way to the client. Frames
//! pass through byte for byte, each upstream read flushed as soon as it
//! completes a frame; the usage chunk the gateway asked for on the
//! client's behalf is taken out; usage is read from whichever chunk
//! carries it.
//!
//! How a stream ends decides what is settled:
//!
//! - to its end: the real usage;
//! - broken off by the upstream (a read error, or no bytes within the idle
//!   bound): an error event the SDKs raise, a breaker failure for the
//!   deployment, and the reservation in full (tokens were spent, how many
//!   is unknown);
//! - the client went away: the upstream is read on in a task of its own
//!   for up to the drain bounds (time and bytes), so its usage is still
//!   settled; past them the reservation is charged in full. Either way the
//!   upstream connection is closed when the task ends.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tokio::time::{Instant, Sleep};

use super::deployment::Deployment;
use super::metrics::{CallOutcome, DeploymentMetrics};
use super::sse::{self, Splitter};
use crate::fairness::Permit;
use crate::resilience::breaker::Verdict;
use crate::resilience::Breaker;
use crate::upstream::Usage;

/// How a stream ended, for whoever settles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// Read to its end.
    Completed,
    /// The upstream broke it off.
    Failed,
    /// The client went away; the drain read the usage (`true`) or hit its
    /// bound first.
    Disconnected {
        /// Whether the real usage was read.
        settled: bool,
    },
}

/// What the client's side is told when a stream ends: the usage, if it
/// was read, and how it ended. `charge_in_full` says the reservation must
/// stand as it is (usage unknown, but tokens were spent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    /// How the stream ended.
    pub end: StreamEnd,
    /// The usage the deployment reported.
    pub usage: Option<Usage>,
}

/// Called once when a stream ends, however it ends.
pub type OnEnd = Box<dyn FnOnce(Settlement) -> BoxFuture<'static, ()> + Send>;

/// Bounds on reading a stream on after its client went away.
#[derive(Debug, Clone, Copy)]
pub struct DrainBound {
    /// How long.
    pub timeout: Duration,
    /// How many bytes.
    pub bytes: usize,
}

/// The per-stream facts a relay needs from its deployment.
pub(crate) struct Origin {
    pub(crate) operation: &'static str,
    pub(crate) metrics: DeploymentMetrics,
    pub(crate) breaker: Option<Breaker>,
    /// When the request arrived (time to first token counts from here).
    pub(crate) arrived: Instant,
    pub(crate) span: tracing::Span,
}

impl Origin {
    pub(crate) fn new(d: &Deployment, operation: &'static str, arrived: Instant) -> Self {
        Self {
            operation,
            metrics: d.metrics.clone(),
            breaker: d.breaker().cloned(),
            arrived,
            span: tracing::Span::none(),
        }
    }
}

struct State {
    upstream: BoxStream<'static, reqwest::Result<Bytes>>,
    splitter: Splitter,
    strip_usage: bool,
    usage: Option<Usage>,
    first_token: Option<Instant>,
    idle: Duration,
    sleep: Pin<Box<Sleep>>,
    drain: DrainBound,
    permit: Option<Permit>,
    on_end: Option<OnEnd>,
    origin: Origin,
}

/// The client's side of a stream (an axum body stream).
pub struct Relay {
    state: Option<State>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("open", &self.state.is_some())
            .finish_non_exhaustive()
    }
}

impl Relay {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        response: reqwest::Response,
        strip_usage: bool,
        idle: Duration,
        drain: DrainBound,
        permit: Option<Permit>,
        on_end: OnEnd,
        origin: Origin,
    ) -> Self {
        Self {
            state: Some(State {
                upstream: response.bytes_stream().boxed(),
                splitter: Splitter::default(),
                strip_usage,
                usage: None,
                first_token: None,
                sleep: Box::pin(tokio::time::sleep(idle)),
                idle,
                drain,
                permit,
                on_end: Some(on_end),
                origin,
            }),
        }
    }
}

impl State {
    /// Takes in one frame; returns the bytes to pass on.
    fn frame(&mut self, frame: &Bytes, out: &mut BytesMut) {
        let facts = sse::inspect(frame);
        if facts.content && self.first_token.is_none() {
            let now = Instant::now();
            self.first_token = Some(now);
            self.origin
                .metrics
                .first_token(now.duration_since(self.origin.arrived));
        }
        if let Some(usage) = facts.usage {
            self.usage = Some(usage);
        }
        if self.strip_usage && facts.usage.is_some() {
            if facts.usage_only {
                return;
            }
            if let Some(rewritten) = sse::without_usage(frame) {
                out.extend_from_slice(&rewritten);
                return;
            }
        }
        out.extend_from_slice(frame);
    }

    /// Settles the stream (once): records it, and returns the client
    /// side's settlement to run.
    fn finish(&mut self, end: StreamEnd) -> Option<BoxFuture<'static, ()>> {
        let on_end = self.on_end.take()?;
        let m = &self.origin.metrics;
        let outcome = match end {
            StreamEnd::Completed => CallOutcome::Ok,
            StreamEnd::Failed => CallOutcome::StreamFailed,
            StreamEnd::Disconnected { settled } => {
                m.drained(settled);
                CallOutcome::Disconnected
            }
        };
        m.call(self.origin.operation, outcome);
        if let Some(usage) = self.usage {
            m.usage(usage);
            if let Some(first) = self.first_token {
                m.per_output_token(first.elapsed(), usage.completion_tokens);
            }
            record_usage(&self.origin.span, usage);
        }
        if end == StreamEnd::Failed {
            // The head was a success to the breaker; the stream that
            // followed was not.
            if let Some(permit) = self.origin.breaker.as_ref().and_then(|b| b.permit().ok()) {
                permit.verdict(Verdict::Failure);
            }
            self.origin.span.record("error.type", "stream_broken");
        }
        if let Some(mut permit) = self.permit.take() {
            // The fair queue is settled with the usage; with none, the
            // estimate stands.
            if let Some(u) = self.usage {
                permit.settle(u.prompt_tokens + u.completion_tokens);
            }
        }
        let settlement = Settlement {
            end,
            usage: self.usage,
        };
        Some(on_end(settlement))
    }

    /// Reads on after the client went away, within the drain bounds, then
    /// settles and closes the upstream connection.
    async fn drain(mut self) {
        let deadline = Instant::now() + self.drain.timeout;
        let mut read = 0usize;
        let mut sink = BytesMut::new();
        let settled = loop {
            if self.usage.is_some() {
                break true;
            }
            match tokio::time::timeout_at(deadline, self.upstream.next()).await {
                Ok(Some(Ok(bytes))) => {
                    read += bytes.len();
                    self.splitter.push(&bytes);
                    while let Some(frame) = self.splitter.next_frame() {
                        self.frame(&frame, &mut sink);
                    }
                    sink.clear();
                    if read > self.drain.bytes {
                        break self.usage.is_some();
                    }
                }
                Ok(None | Some(Err(_))) | Err(_) => break self.usage.is_some(),
            }
        };
        let settle = self.finish(StreamEnd::Disconnected { settled });
        // Dropping the body closes the upstream connection.
        drop(self.upstream);
        if let Some(settle) = settle {
            settle.await;
        }
    }
}

fn record_usage(span: &tracing::Span, usage: Usage) {
    use crate::telemetry::client::int;
    span.record("gen_ai.usage.input_tokens", int(usage.prompt_tokens));
    span.record("gen_ai.usage.output_tokens", int(usage.completion_tokens));
}

impl Stream for Relay {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let Some(st) = this.state.as_mut() else {
            return Poll::Ready(None);
        };
        let mut out = BytesMut::new();
        loop {
            while let Some(frame) = st.splitter.next_frame() {
                st.frame(&frame, &mut out);
            }
            if !out.is_empty() {
                return Poll::Ready(Some(Ok(out.freeze())));
            }
            match st.upstream.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(bytes))) => {
                    st.splitter.push(&bytes);
                    let idle = st.idle;
                    st.sleep.as_mut().reset(Instant::now() + idle);
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::warn!(error = %e, "LLM stream broken off by the upstream");
                    return Poll::Ready(Some(Ok(this.fail())));
                }
                Poll::Ready(None) => {
                    let rest = st.splitter.rest();
                    if let Some(settle) = st.finish(StreamEnd::Completed) {
                        tokio::spawn(settle);
                    }
                    this.state = None;
                    return Poll::Ready((!rest.is_empty()).then_some(Ok(rest)));
                }
                Poll::Pending => {
                    if st.sleep.as_mut().poll(cx).is_ready() {
                        tracing::warn!(idle = ?st.idle, "LLM stream stalled");
                        return Poll::Ready(Some(Ok(this.fail())));
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

impl Relay {
    /// Ends the stream on an upstream failure: settles, and answers the
    /// error event.
    fn fail(&mut self) -> Bytes {
        if let Some(mut st) = self.state.take() {
            if let Some(settle) = st.finish(StreamEnd::Failed) {
                tokio::spawn(settle);
            }
        }
        sse::error_frame(
            "the model's stream was broken off by the upstream; the response is incomplete",
        )
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let Some(st) = self.state.take() else {
            return;
        };
        // The client went away mid-stream: read on for the usage. Outside
        // a runtime (never, under the server) it is settled as it stands.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(st.drain());
            }
            Err(_) => {
                let mut st = st;
                drop(st.finish(StreamEnd::Disconnected { settled: false }));
                tracing::warn!("stream dropped outside a runtime; its reservation stands");
            }
        }
    }
}
