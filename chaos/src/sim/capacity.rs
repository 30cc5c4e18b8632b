//! A finite-capacity LLM: every chat completion takes one of `capacity`
//! slots for its service time (a base plus a cost per completion token it
//! returns) and calls beyond `capacity` wait for a slot in arrival order,
//! so a saturated simulator behaves like a real model server, whose
//! latency grows with its queue, rather than answering everything at once.
//!
//! The settings start as the command line's [`LlmCapacity`] and are
//! replaced through `POST /_faults` (`capacity`, `service_ms`,
//! `per_token_ms`, absent fields back to the command line's value);
//! `DELETE /_faults` restores the command line's. The whole service time is
//! spent before the first byte of the answer; a streamed answer keeps its
//! slot until its last frame is sent, as generation would.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc, Mutex,
};
use std::time::Duration;

use axum::{
    body::Body,
    extract::Request,
    http::{header, HeaderValue},
    middleware::Next,
    response::Response,
};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::config::LlmCapacity;
use super::faults::{FaultSpec, FaultTarget};

/// Completion tokens of a successful chat answer, left on the response by
/// the handler so that the slot can charge `per_token_ms` for them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CompletionTokens(pub(crate) u64);

/// The slots of the chat model and the counters `/_stats` shows.
#[derive(Debug)]
pub(crate) struct Capacity {
    /// The command line's settings, restored by `DELETE /_faults`.
    defaults: LlmCapacity,
    current: Mutex<Current>,
    counters: Arc<Counters>,
}

/// The settings in force and the semaphore that enforces them.
#[derive(Debug)]
struct Current {
    settings: LlmCapacity,
    /// `None` when unlimited. A new capacity gets a new semaphore instead
    /// of resizing this one (tokio cannot take back permits that are held):
    /// calls already in service or queued finish under the capacity they
    /// arrived under, new arrivals queue under the new one.
    slots: Option<Arc<Semaphore>>,
}

#[derive(Debug, Default)]
struct Counters {
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    queued: AtomicU64,
}

/// A call in service: gives back its slot and its in-flight count when
/// dropped, so a client that hangs up mid-answer frees the slot too.
#[derive(Debug)]
struct InService {
    _permit: Option<OwnedSemaphorePermit>,
    counters: Arc<Counters>,
}

/// A call waiting for a slot; uncounts itself however the wait ends.
#[derive(Debug)]
struct Waiting(Arc<Counters>);

impl Capacity {
    /// The command line's settings in force, nothing in flight.
    pub(crate) fn new(defaults: LlmCapacity) -> Self {
        Self {
            defaults,
            current: Mutex::new(Current::new(defaults)),
            counters: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().expect("capacity lock poisoned")
    }

    /// Installs the settings of a fault command that targets chat (or
    /// everything); its absent fields fall back to the command line's.
    /// Commands for other APIs leave the chat model alone.
    pub(crate) fn replace(&self, spec: &FaultSpec) {
        if !matches!(spec.target, FaultTarget::All | FaultTarget::Chat) {
            return;
        }
        let settings = LlmCapacity {
            capacity: spec.capacity.unwrap_or(self.defaults.capacity),
            service_ms: spec.service_ms.or(self.defaults.service_ms),
            per_token_ms: spec.per_token_ms.unwrap_or(self.defaults.per_token_ms),
        };
        self.lock().install(settings);
    }

    /// Restores the command line's settings.
    pub(crate) fn reset(&self) {
        self.lock().install(self.defaults);
    }

    /// Serves one chat call that its fault set lets through: waits in
    /// arrival order for a slot, holds it for the service time, then for
    /// a streamed answer until the stream ends. `latency` is the chat
    /// fault set's `latency_ms`: network time before queueing when
    /// `service_ms` is set, the base service time itself when not (so it
    /// is never spent twice).
    pub(crate) async fn serve(&self, latency: Duration, request: Request, next: Next) -> Response {
        // A call's service time is fixed by the settings it arrived under.
        let (settings, slots) = {
            let current = self.lock();
            (current.settings, current.slots.clone())
        };
        let base = match settings.service_ms {
            Some(ms) => {
                sleep(latency).await;
                Duration::from_millis(ms)
            }
            None => latency,
        };
        let slot = self.admit(slots).await;
        sleep(base).await;
        let response = next.run(request).await;
        let tokens = response
            .extensions()
            .get::<CompletionTokens>()
            .map_or(0, |t| t.0);
        sleep(Duration::from_millis(
            settings.per_token_ms.saturating_mul(tokens),
        ))
        .await;
        if is_event_stream(&response) {
            // The slot travels with the body and is dropped with it.
            response.map(|body| {
                Body::from_stream(body.into_data_stream().map(move |frame| {
                    let _held = &slot;
                    frame
                }))
            })
        } else {
            drop(slot);
            response
        }
    }

    /// Waits for a slot of `slots` (at once when unlimited), in arrival
    /// order: tokio's semaphore is fair.
    async fn admit(&self, slots: Option<Arc<Semaphore>>) -> InService {
        let permit = match slots {
            None => None,
            Some(slots) => {
                let _waiting = Waiting::new(&self.counters);
                // The semaphore is never closed, so acquiring cannot fail;
                // if it somehow did, serving unthrottled beats a 500.
                slots.acquire_owned().await.ok()
            }
        };
        InService::new(permit, &self.counters)
    }

    /// `{"capacity","in_flight","max_in_flight","queued"}` for `/_stats`.
    pub(crate) fn stats(&self) -> Value {
        let capacity = self.lock().settings.capacity;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        json!({
            "capacity": capacity,
            "in_flight": load(&self.counters.in_flight),
            "max_in_flight": load(&self.counters.max_in_flight),
            "queued": load(&self.counters.queued),
        })
    }

    /// Restarts the high-water mark from what is in flight now (gauges
    /// stay: the calls are still there).
    pub(crate) fn reset_stats(&self) {
        let now = self.counters.in_flight.load(Ordering::Relaxed);
        self.counters.max_in_flight.store(now, Ordering::Relaxed);
    }

    /// The settings for `GET /_faults`; `service_ms: null` means the
    /// fault's `latency_ms` is the service time.
    pub(crate) fn settings(&self) -> Value {
        let s = self.lock().settings;
        json!({
            "capacity": s.capacity,
            "service_ms": s.service_ms,
            "per_token_ms": s.per_token_ms,
        })
    }
}

impl Current {
    fn new(settings: LlmCapacity) -> Self {
        Self {
            settings,
            slots: semaphore(settings.capacity),
        }
    }

    fn install(&mut self, settings: LlmCapacity) {
        if settings.capacity != self.settings.capacity {
            self.slots = semaphore(settings.capacity);
        }
        self.settings = settings;
    }
}

impl InService {
    fn new(permit: Option<OwnedSemaphorePermit>, counters: &Arc<Counters>) -> Self {
        let now = counters.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        counters.max_in_flight.fetch_max(now, Ordering::Relaxed);
        Self {
            _permit: permit,
            counters: counters.clone(),
        }
    }
}

impl Drop for InService {
    fn drop(&mut self) {
        self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Waiting {
    fn new(counters: &Arc<Counters>) -> Self {
        counters.queued.fetch_add(1, Ordering::Relaxed);
        Self(counters.clone())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `capacity` slots, or `None` (unlimited) for 0.
fn semaphore(capacity: usize) -> Option<Arc<Semaphore>> {
    (capacity > 0).then(|| Arc::new(Semaphore::new(capacity)))
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

fn is_event_stream(response: &Response) -> bool {
    response.headers().get(header::CONTENT_TYPE)
        == Some(&HeaderValue::from_static("text/event-stream"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(capacity: usize) -> Capacity {
        Capacity::new(LlmCapacity {
            capacity,
            ..LlmCapacity::default()
        })
    }

    #[tokio::test]
    async fn calls_beyond_capacity_queue_and_are_admitted_in_arrival_order() {
        let capacity = Arc::new(limited(2));
        let slots = capacity.lock().slots.clone();
        let first = capacity.admit(slots.clone()).await;
        let _second = capacity.admit(slots.clone()).await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for n in 0..3 {
            let (capacity, slots, tx) = (capacity.clone(), slots.clone(), tx.clone());
            tokio::spawn(async move {
                let _slot = capacity.admit(slots).await;
                let _ = tx.send(n);
            });
            // Let each waiter queue before the next one arrives.
            tokio::task::yield_now().await;
        }
        tokio::task::yield_now().await;
        assert_eq!(capacity.stats()["queued"], 3);
        assert_eq!(capacity.stats()["in_flight"], 2);
        drop(first);
        let mut order = Vec::new();
        for _ in 0..3 {
            order.push(rx.recv().await.expect("every waiter is admitted"));
        }
        assert_eq!(order, [0, 1, 2]);
        assert_eq!(capacity.stats()["max_in_flight"], 2);
    }

    #[tokio::test]
    async fn a_new_capacity_applies_to_new_arrivals_and_reset_restores_the_default() {
        let capacity = limited(1);
        capacity.replace(&FaultSpec {
            capacity: Some(3),
            ..FaultSpec::default()
        });
        let slots = capacity.lock().slots.clone();
        let held: Vec<InService> =
            futures::future::join_all((0..3).map(|_| capacity.admit(slots.clone()))).await;
        assert_eq!(capacity.stats()["in_flight"], 3);
        assert_eq!(capacity.settings()["capacity"], 3);
        capacity.reset();
        assert_eq!(capacity.settings()["capacity"], 1);
        drop(held);
        assert_eq!(capacity.stats()["in_flight"], 0);
        assert_eq!(capacity.stats()["max_in_flight"], 3);
    }

    #[test]
    fn commands_for_other_apis_leave_the_chat_model_alone() {
        let capacity = limited(4);
        capacity.replace(&FaultSpec {
            latency_ms: Some(5),
            target: FaultTarget::Vector,
            ..FaultSpec::default()
        });
        assert_eq!(capacity.settings()["capacity"], 4);
        capacity.replace(&FaultSpec {
            per_token_ms: Some(7),
            target: FaultTarget::Chat,
            ..FaultSpec::default()
        });
        // Absent fields fall back to the command line's values.
        assert_eq!(
            capacity.settings(),
            json!({"capacity": 4, "service_ms": null, "per_token_ms": 7})
        );
    }
}
