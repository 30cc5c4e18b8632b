//! [`FairQueue`]: the scheduler. One mutex guards the whole state; it is
//! held for a few map and deque operations, never across an await.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::config::QueuePolicy;
use super::error::{Overloaded, TenantQueueFull};
use super::metrics::{FairnessMetrics, Refusal};
use crate::resilience::BoxError;

/// Weight of the newest hold time in the service-time estimate.
const EWMA_ALPHA: f64 = 0.2;
/// Shortest `Retry-After` (HTTP's is in whole seconds).
const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Per-tenant fair queues in front of `capacity` concurrent calls.
#[derive(Clone)]
pub struct FairQueue {
    shared: Arc<Shared>,
}

struct Shared {
    dependency: &'static str,
    state: Mutex<State>,
    metrics: Option<FairnessMetrics>,
}

struct State {
    capacity: usize,
    in_flight: usize,
    queued: usize,
    next_id: u64,
    /// Mean time a slot is held, once one has been.
    service: Option<Duration>,
    tenants: HashMap<Arc<str>, Tenant>,
}

struct Tenant {
    policy: QueuePolicy,
    /// Service received: estimated-then-settled cost over weight.
    counter: f64,
    in_flight: usize,
    queue: VecDeque<Waiter>,
}

struct Waiter {
    id: u64,
    cost: u64,
    grant: oneshot::Sender<()>,
}

/// A slot of capacity, held while the call runs; dropping it frees the
/// slot and dispatches the next waiter.
pub struct Permit {
    shared: Arc<Shared>,
    tenant: Arc<str>,
    charged: u64,
    started: Instant,
}

impl std::fmt::Debug for FairQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairQueue")
            .field("dependency", &self.shared.dependency)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("tenant", &self.tenant)
            .field("charged", &self.charged)
            .finish_non_exhaustive()
    }
}

impl State {
    /// Lifts a tenant that becomes active to the least counter among the
    /// active ones, so time spent idle is not banked as credit (VTC's
    /// counter lift).
    fn lift(&mut self, tenant: &str) {
        let floor = self
            .tenants
            .iter()
            .filter(|(name, t)| &***name != tenant && (t.in_flight > 0 || !t.queue.is_empty()))
            .map(|(_, t)| t.counter)
            .fold(f64::INFINITY, f64::min);
        if let Some(t) = self.tenants.get_mut(tenant) {
            if floor.is_finite() && t.counter < floor {
                t.counter = floor;
            }
        }
    }

    /// The tenant's fair share of the slots, among the active tenants.
    fn fair_slots(&self, tenant: &str) -> f64 {
        let total: u32 = self
            .tenants
            .iter()
            .filter(|(name, t)| &***name == tenant || t.in_flight > 0 || !t.queue.is_empty())
            .map(|(_, t)| t.policy.weight())
            .sum();
        let own = self.tenants.get(tenant).map_or(1, |t| t.policy.weight());
        self.capacity as f64 * f64::from(own) / f64::from(total.max(1))
    }

    /// Expected wait of a request that would be `position`-th (1-based) in
    /// the tenant's queue, served at the tenant's fair share.
    fn expected_wait(&self, tenant: &str, position: usize) -> Option<Duration> {
        let service = self.service?;
        let slots = self.fair_slots(tenant).max(0.01);
        Some(service.mul_f64(position as f64 / slots))
    }

    /// A refusal for `tenant`: its own doing when it holds its fair share
    /// or more, else the dependency is saturated for everyone.
    fn refusal(&self, dependency: &'static str, tenant: &str) -> (BoxError, Refusal) {
        let Some(t) = self.tenants.get(tenant) else {
            return (
                Box::new(Overloaded {
                    dependency,
                    retry_after: MIN_RETRY_AFTER,
                }),
                Refusal::Overloaded,
            );
        };
        let share = self.fair_slots(tenant);
        let service = self.service.unwrap_or(MIN_RETRY_AFTER);
        if (t.in_flight + t.queue.len()) as f64 >= share.floor().max(1.0) {
            // Drained at its share: its queue, and this request, pass in
            // about (queued + 1) service times per slot of its share.
            let wait = service.mul_f64((t.queue.len() + 1) as f64 / share.max(0.01));
            (
                Box::new(TenantQueueFull {
                    dependency,
                    retry_after: wait.max(MIN_RETRY_AFTER),
                }),
                Refusal::QueueFull,
            )
        } else {
            let wait = service.mul_f64((self.queued + 1) as f64 / self.capacity.max(1) as f64);
            (
                Box::new(Overloaded {
                    dependency,
                    retry_after: wait.max(MIN_RETRY_AFTER),
                }),
                Refusal::Overloaded,
            )
        }
    }

    /// Hands free slots to the waiting tenants with the least service,
    /// until capacity or the queues run out. Returns how many were handed.
    fn dispatch(&mut self) -> Vec<Arc<str>> {
        let mut granted = Vec::new();
        while self.in_flight < self.capacity && self.queued > 0 {
            let next = self
                .tenants
                .iter()
                .filter(|(_, t)| !t.queue.is_empty())
                .min_by(|a, b| a.1.counter.total_cmp(&b.1.counter))
                .map(|(name, _)| name.clone());
            let Some(name) = next else { break };
            let Some(t) = self.tenants.get_mut(&name) else {
                break;
            };
            let Some(w) = t.queue.pop_front() else { break };
            self.queued -= 1;
            // A waiter whose future is gone removed itself already; a send
            // can only fail in the instant between, and then the slot stays
            // free for the next.
            if w.grant.send(()).is_ok() {
                t.in_flight += 1;
                t.counter += w.cost as f64 / f64::from(t.policy.weight());
                self.in_flight += 1;
                granted.push(name);
            }
        }
        granted
    }
}

impl FairQueue {
    /// Queues in front of `capacity` concurrent calls to `dependency`.
    pub fn new(dependency: &'static str, capacity: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                dependency,
                state: Mutex::new(State {
                    capacity: capacity.max(1),
                    in_flight: 0,
                    queued: 0,
                    next_id: 0,
                    service: None,
                    tenants: HashMap::new(),
                }),
                metrics: None,
            }),
        }
    }

    /// Records queue depth, waits, dispatches and refusals into `metrics`
    /// (a builder: call it before the queue is shared).
    #[must_use]
    pub fn with_metrics(mut self, metrics: FairnessMetrics) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.metrics = Some(metrics);
        }
        self
    }

    /// Calls in flight and requests queued, for tests and `/ready`.
    pub fn load(&self) -> (usize, usize) {
        let s = lock(&self.shared.state);
        (s.in_flight, s.queued)
    }

    /// Waits for a slot for one call of `tenant` costing about `cost`
    /// tokens, for at most the policy's `max_wait` and `deadline`. Refuses
    /// at once when the queue is full or the wait would pass either.
    /// Dropping the returned future leaves the queue at once.
    pub async fn acquire(
        &self,
        tenant: &str,
        policy: QueuePolicy,
        cost: u64,
        deadline: Option<Instant>,
    ) -> Result<Permit, BoxError> {
        let started = Instant::now();
        let limit = {
            let wait = started + policy.max_wait();
            deadline.map_or(wait, |d| d.min(wait))
        };
        let shared = &self.shared;
        let (id, rx, name) = {
            let mut s = lock(&shared.state);
            let name: Arc<str> = match s.tenants.get_key_value(tenant) {
                Some((k, _)) => k.clone(),
                None => {
                    let k: Arc<str> = Arc::from(tenant);
                    s.tenants.insert(
                        k.clone(),
                        Tenant {
                            policy,
                            counter: 0.0,
                            in_flight: 0,
                            queue: VecDeque::new(),
                        },
                    );
                    k
                }
            };
            let was_idle = s
                .tenants
                .get(&name)
                .is_some_and(|t| t.in_flight == 0 && t.queue.is_empty());
            if let Some(t) = s.tenants.get_mut(&name) {
                // A reload may have changed the policy.
                t.policy = policy;
            }
            if was_idle {
                s.lift(&name);
            }
            // The fast path: capacity is free and nobody waits for it.
            if s.in_flight < s.capacity && s.queued == 0 {
                s.in_flight += 1;
                if let Some(t) = s.tenants.get_mut(&name) {
                    t.in_flight += 1;
                    t.counter += cost as f64 / f64::from(t.policy.weight());
                }
                drop(s);
                self.observe_dispatch(&name, Duration::ZERO);
                return Ok(self.permit(name, cost));
            }
            let position = s.tenants.get(&name).map_or(0, |t| t.queue.len()) + 1;
            let too_long = s
                .expected_wait(&name, position)
                .is_some_and(|w| started + w > limit);
            if position > policy.max_queue() || too_long {
                let (err, why) = s.refusal(shared.dependency, &name);
                drop(s);
                self.observe_refusal(&name, why);
                return Err(err);
            }
            let id = s.next_id;
            s.next_id += 1;
            let (tx, rx) = oneshot::channel();
            if let Some(t) = s.tenants.get_mut(&name) {
                t.queue.push_back(Waiter {
                    id,
                    cost,
                    grant: tx,
                });
            }
            s.queued += 1;
            self.observe_depth(&s, &name);
            (id, rx, name)
        };
        let mut waiting = Waiting {
            shared: shared.clone(),
            tenant: name.clone(),
            id,
            rx: Some(rx),
        };
        let granted = tokio::select! {
            biased;
            r = waiting.rx.as_mut().expect("set above") => r.is_ok(),
            () = tokio::time::sleep_until(limit) => false,
        };
        if granted {
            waiting.rx = None;
            self.observe_dispatch(&name, started.elapsed());
            return Ok(self.permit(name, cost));
        }
        // Timed out: leave the queue (the guard does), then refuse. A grant
        // that raced the timer is released by the guard.
        drop(waiting);
        let (err, why) = lock(&shared.state).refusal(shared.dependency, &name);
        self.observe_refusal(&name, why);
        Err(err)
    }

    fn permit(&self, tenant: Arc<str>, cost: u64) -> Permit {
        Permit {
            shared: self.shared.clone(),
            tenant,
            charged: cost,
            started: Instant::now(),
        }
    }

    fn observe_dispatch(&self, tenant: &str, waited: Duration) {
        if let Some(m) = &self.shared.metrics {
            m.dispatched(tenant, waited);
        }
    }

    fn observe_refusal(&self, tenant: &str, why: Refusal) {
        if let Some(m) = &self.shared.metrics {
            m.refused(tenant, why);
        }
    }

    fn observe_depth(&self, s: &State, tenant: &str) {
        observe_depth(&self.shared, s, tenant);
    }
}

fn observe_depth(shared: &Shared, s: &State, tenant: &str) {
    if let Some(m) = &shared.metrics {
        let depth = s.tenants.get(tenant).map_or(0, |t| t.queue.len());
        m.depth(tenant, depth);
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // The state stays consistent at every unlock; a panic elsewhere while
    // holding the lock is no reason to stop scheduling.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A queued request's place; dropping it (the client went away, or the
/// wait timed out) removes it at once, or frees the slot it was just
/// granted.
struct Waiting {
    shared: Arc<Shared>,
    tenant: Arc<str>,
    id: u64,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut s = lock(&self.shared.state);
        let removed = s.tenants.get_mut(&self.tenant).and_then(|t| {
            let i = t.queue.iter().position(|w| w.id == self.id)?;
            t.queue.remove(i)
        });
        if removed.is_some() {
            s.queued -= 1;
            observe_depth(&self.shared, &s, &self.tenant);
            return;
        }
        if rx.try_recv().is_ok() {
            // Granted, never used: give the slot back.
            release(&self.shared, &mut s, &self.tenant, None);
        }
    }
}

/// Frees one slot of `tenant` and dispatches into it.
fn release(shared: &Shared, s: &mut State, tenant: &str, held: Option<Duration>) {
    s.in_flight = s.in_flight.saturating_sub(1);
    if let Some(t) = s.tenants.get_mut(tenant) {
        t.in_flight = t.in_flight.saturating_sub(1);
    }
    if let Some(held) = held {
        s.service = Some(match s.service {
            None => held,
            Some(mean) => mean.mul_f64(1.0 - EWMA_ALPHA) + held.mul_f64(EWMA_ALPHA),
        });
    }
    for name in s.dispatch() {
        observe_depth(shared, s, &name);
    }
}

impl Permit {
    /// Settles the estimate with what the call really cost (tokens used;
    /// 0 for a call that failed before using any).
    pub fn settle(&mut self, actual: u64) {
        let mut s = lock(&self.shared.state);
        if let Some(t) = s.tenants.get_mut(&self.tenant) {
            let delta = actual as f64 - self.charged as f64;
            t.counter += delta / f64::from(t.policy.weight());
        }
        self.charged = actual;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut s = lock(&self.shared.state);
        release(
            &self.shared,
            &mut s,
            &self.tenant,
            Some(self.started.elapsed()),
        );
    }
}
