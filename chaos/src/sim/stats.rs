//! Request counters and captured W3C `traceparent` headers, so tests can
//! assert what actually reached the "upstream" (retries, hedges, breaker
//! probes) and that trace context was propagated.
//!
//! Requests are counted as they arrive, before any fault, so a request
//! answered with an injected error or reset still counts. `/_stats` adds
//! the chat model's gauges under `llm`: `capacity` (0 = unlimited),
//! `in_flight` (calls holding a slot), `max_in_flight` (its high-water
//! mark since start or the last reset) and `queued` (calls waiting for one).

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
}

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
        let counters = self
            .requests
            .iter()
            .chain([&self.errors, &self.hangs, &self.resets]);
        counters.for_each(|c| c.store(0, Ordering::Relaxed));
        *self.traces.lock().expect("traces lock poisoned") = Traces::default();
    }
}

/// The counters plus the chat model's `llm` gauges.
fn snapshot(state: &AppState) -> Value {
    let mut out = state.stats.snapshot();
    out["llm"] = state.capacity.stats();
    out
}

/// `GET /_stats`.
pub(crate) async fn show(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(snapshot(&state))
}

/// `POST /_stats/reset`: zeroes counters, forgets traceparents and
/// restarts the chat model's in-flight high-water mark.
pub(crate) async fn reset(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.stats.reset();
    state.capacity.reset_stats();
    Json(snapshot(&state))
}
