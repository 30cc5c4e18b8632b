//! Request counters and captured W3C `traceparent` headers, so tests can
//! assert what actually reached the "upstream" (retries, hedges, breaker
//! probes) and that trace context was propagated.
//!
//! Requests are counted as they arrive, before any fault, so a request
//! answered with an injected error or reset still counts. `/_stats` adds
//! the chat model's gauges under `llm`: `capacity` (0 = unlimited),
//! `in_flight` (calls holding a slot), `max_in_flight` (its high-water
//! mark since start or the last reset) and `queued` (calls waiting for one);
//! and what the completions themselves did, so a gateway's tests can check
//! its accounting and its streams against the upstream's:
//!
//! - `streams_open`: streamed chat bodies neither finished nor dropped. A
//!   client (or gateway) that hangs up mid-stream brings it back down when
//!   hyper drops the body, so 0 after a test proves no upstream stream was
//!   left open. A gauge: reset leaves it.
//! - `completions`, `prompt_tokens`, `completion_tokens`: chat completions
//!   answered and the totals of their `usage`. A streamed one counts when
//!   it is created, with the figures its usage chunk carries, whether or
//!   not the client asks for that chunk or reads to the end.
//! - `include_usage_requests`: streamed requests that asked for the usage
//!   chunk (`stream_options.include_usage: true`).

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use axum::{extract::State, http::HeaderMap, Json};
use serde_json::{json, Value};

use super::{app::AppState, error::Api};

/// How many distinct traceparents `/_stats` remembers.
const MAX_TRACEPARENTS: usize = 100;

/// Counters of one simulator instance.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    requests: [AtomicU64; 3],
    errors: AtomicU64,
    hangs: AtomicU64,
    resets: AtomicU64,
    traces: Mutex<Traces>,
    /// Shared with every [`OpenStream`], which outlives the handler.
    streams_open: Arc<AtomicU64>,
    completions: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    include_usage_requests: AtomicU64,
}

/// One streamed chat body counted in `streams_open`; uncounts itself when
/// dropped. The body drops it as soon as its last frame (or its injected
/// failure) is out, and hyper drops the body, guard and all, when the
/// client goes away, so every way a stream ends uncounts it exactly once.
#[derive(Debug)]
pub(crate) struct OpenStream(Arc<AtomicU64>);

#[derive(Debug, Default)]
struct Traces {
    /// The header of the most recent API request, if it had one.
    last: Option<String>,
    /// Distinct values, oldest first, at most [`MAX_TRACEPARENTS`].
    recent: VecDeque<String>,
}

impl Stats {
    /// Counts an API request and remembers its `traceparent`.
    pub(crate) fn record_arrival(&self, api: Api, headers: &HeaderMap) {
        self.requests[api.index()].fetch_add(1, Ordering::Relaxed);
        let traceparent = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut traces = self.traces.lock().expect("traces lock poisoned");
        if let Some(value) = &traceparent {
            traces.recent.retain(|seen| seen != value);
            traces.recent.push_back(value.clone());
            if traces.recent.len() > MAX_TRACEPARENTS {
                traces.recent.pop_front();
            }
        }
        traces.last = traceparent;
    }

    /// Counts an injected error answer.
    pub(crate) fn record_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an injected hang.
    pub(crate) fn record_hang(&self) {
        self.hangs.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an injected connection reset.
    pub(crate) fn record_reset(&self) {
        self.resets.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a chat completion answered with this `usage`.
    pub(crate) fn record_completion(&self, prompt_tokens: u64, completion_tokens: u64) {
        self.completions.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(completion_tokens, Ordering::Relaxed);
    }

    /// Counts a streamed request with `stream_options.include_usage: true`.
    pub(crate) fn record_include_usage(&self) {
        self.include_usage_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a streamed body as open until the returned guard goes.
    pub(crate) fn open_stream(&self) -> OpenStream {
        self.streams_open.fetch_add(1, Ordering::Relaxed);
        OpenStream(self.streams_open.clone())
    }

    /// The completion counters `/_stats` shows under `llm`.
    fn llm(&self) -> serde_json::Map<String, Value> {
        let load = |c: &AtomicU64| json!(c.load(Ordering::Relaxed));
        [
            ("streams_open", load(&self.streams_open)),
            ("completions", load(&self.completions)),
            ("prompt_tokens", load(&self.prompt_tokens)),
            ("completion_tokens", load(&self.completion_tokens)),
            ("include_usage_requests", load(&self.include_usage_requests)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    fn snapshot(&self) -> Value {
        let count = |api: Api| self.requests[api.index()].load(Ordering::Relaxed);
        let traces = self.traces.lock().expect("traces lock poisoned");
        json!({
            "requests": {
                "chat": count(Api::Chat),
                "embeddings": count(Api::Embeddings),
                "vector": count(Api::Vector),
                "total": Api::ALL.into_iter().map(count).sum::<u64>(),
            },
            "faulted": {
                "errors": self.errors.load(Ordering::Relaxed),
                "hangs": self.hangs.load(Ordering::Relaxed),
                "resets": self.resets.load(Ordering::Relaxed),
            },
            "last_traceparent": traces.last,
            "traceparents": traces.recent,
        })
    }

    fn reset(&self) {
        // Not `streams_open`: those streams are still open.
        let counters = self.requests.iter().chain([
            &self.errors,
            &self.hangs,
            &self.resets,
            &self.completions,
            &self.prompt_tokens,
            &self.completion_tokens,
            &self.include_usage_requests,
        ]);
        counters.for_each(|c| c.store(0, Ordering::Relaxed));
        *self.traces.lock().expect("traces lock poisoned") = Traces::default();
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The counters plus the chat model's `llm` gauges and completion counters.
fn snapshot(state: &AppState) -> Value {
    let mut out = state.stats.snapshot();
    let mut llm = state.capacity.stats();
    if let Value::Object(llm) = &mut llm {
        llm.extend(state.stats.llm());
    }
    out["llm"] = llm;
    out
}

/// `GET /_stats`.
pub(crate) async fn show(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(snapshot(&state))
}

/// `POST /_stats/reset`: zeroes counters (completions and token totals
/// too), forgets traceparents and restarts the chat model's in-flight
/// high-water mark; gauges (`in_flight`, `queued`, `streams_open`) stay.
pub(crate) async fn reset(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.stats.reset();
    state.capacity.reset_stats();
    Json(snapshot(&state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_streams_uncount_on_drop_and_survive_a_reset() {
        let stats = Stats::default();
        let first = stats.open_stream();
        let second = stats.open_stream();
        stats.record_completion(10, 4);
        stats.record_completion(5, 2);
        stats.record_include_usage();
        assert_eq!(
            Value::Object(stats.llm()),
            json!({
                "streams_open": 2,
                "completions": 2,
                "prompt_tokens": 15,
                "completion_tokens": 6,
                "include_usage_requests": 1,
            })
        );
        drop(first);
        stats.reset();
        assert_eq!(
            Value::Object(stats.llm()),
            json!({
                "streams_open": 1,
                "completions": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "include_usage_requests": 0,
            })
        );
        drop(second);
        assert_eq!(stats.llm()["streams_open"], 0);
    }
}
