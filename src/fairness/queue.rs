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
use tower::BoxError;

/// Weight of the newest hold time in the service-time estimate.
const EWMA_ALPHA: f64 = 0.2;
/// Shortest `Retry-After` (HTTP's is in whole seconds).
const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);
/// A tenant seen this recently counts as active for fair shares, even
/// between its requests: a quiet tenant's share does not vanish the moment
/// its last call returns.
const RECENT: Duration = Duration::from_secs(1);

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
    /// Earliest start of the next paced call (see `State::paced`).
    next_paced: Option<Instant>,
    /// Whether a task will run `dispatch` at `next_paced`.
    pacer_armed: bool,
    tenants: HashMap<Arc<str>, Tenant>,
}

struct Tenant {
    policy: QueuePolicy,
    /// The tenant's last arrival.
    last_seen: Instant,
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

impl Tenant {
    fn active(&self, now: Instant) -> bool {
        self.in_flight > 0 || !self.queue.is_empty() || now.duration_since(self.last_seen) < RECENT
    }
}

impl State {
    /// Whether a call of `tenant` must wait for the pacer. Calls of equal
    /// length that start together end together, so a saturated backend
    /// frees its slots in bursts and a newcomer would wait for the next
    /// burst. While several tenants are active, a tenant at or over its
    /// fair share is therefore started at most once per service time /
    /// capacity: starts, and so releases, spread out evenly, and a tenant
    /// under its share (never paced) finds a slot within about one
    /// interval. The pace is the backend's own rate, so the capacity stays
    /// in use; with one tenant active nothing is paced.
    fn paced(&self, tenant: &str, now: Instant) -> bool {
        self.next_paced.is_some_and(|at| now < at)
            && self.tenants.get(tenant).is_some_and(|t| {
                let (active, weight) = self.active(now);
                self.pacing_applies(t, active, weight)
            })
    }

    /// How many tenants are active, and their total weight.
    fn active(&self, now: Instant) -> (usize, u32) {
        self.tenants
            .values()
            .filter(|t| t.active(now))
            .fold((0, 0), |(n, w), t| (n + 1, w + t.policy.weight()))
    }

    /// Pacing applies to `t` when the service time is known, several
    /// tenants are active, and `t` holds its fair share or more.
    fn pacing_applies(&self, t: &Tenant, active: usize, weight: u32) -> bool {
        if self.service.is_none() || active < 2 {
            return false;
        }
        let share = self.capacity as f64 * f64::from(t.policy.weight()) / f64::from(weight.max(1));
        t.in_flight as f64 >= share.floor().max(1.0)
    }

    /// Books the next paced start after a dispatch of `tenant`.
    fn note_start(&mut self, tenant: &str, now: Instant) {
        let (active, weight) = self.active(now);
        let applies = self
            .tenants
            .get(tenant)
            .is_some_and(|t| self.pacing_applies(t, active, weight));
        if !applies {
            return;
        }
        if let Some(service) = self.service {
            let interval = service / u32::try_from(self.capacity).unwrap_or(u32::MAX);
            let from = self.next_paced.map_or(now, |at| at.max(now));
            self.next_paced = Some(from + interval);
        }
    }

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
        let now = Instant::now();
        let total: u32 = self
            .tenants
            .iter()
            .filter(|(name, t)| &***name == tenant || t.active(now))
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
                    next_paced: None,
                    pacer_armed: false,
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
                            last_seen: started,
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
            if was_idle {
                s.lift(&name);
            }
            if let Some(t) = s.tenants.get_mut(&name) {
                // A reload may have changed the policy.
                t.policy = policy;
                t.last_seen = started;
            }
            // The fast path: capacity is free and nobody waits for it.
            if s.queued == 0 && s.in_flight < s.capacity && !s.paced(&name, started) {
                s.note_start(&name, started);
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
            // A free slot the pacer held back may be this tenant's to take;
            // or the pacer must be armed for it.
            let granted = dispatch(shared, &mut s);
            self.observe_depth(&s, &name);
            for other in granted.iter().filter(|g| **g != name) {
                observe_depth(shared, &s, other);
            }
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

/// Hands free slots to the waiting tenants with the least service, until
/// capacity or the queues run out (or the pacer holds back the rest, and is
/// armed to try again). Returns the tenants served.
fn dispatch(shared: &Arc<Shared>, s: &mut State) -> Vec<Arc<str>> {
    let mut granted = Vec::new();
    let now = Instant::now();
    while s.in_flight < s.capacity && s.queued > 0 {
        // Computed once per slot, not once per candidate.
        let pacing = s.next_paced.is_some_and(|at| now < at);
        let (active, weight) = s.active(now);
        let next = s
            .tenants
            .iter()
            .filter(|(_, t)| {
                let held_back = pacing && s.pacing_applies(t, active, weight);
                !held_back && !t.queue.is_empty()
            })
            .min_by(|a, b| a.1.counter.total_cmp(&b.1.counter))
            .map(|(name, _)| name.clone());
        let Some(name) = next else {
            // Everyone waiting is paced: try again when the pace allows.
            if let Some(at) = s.next_paced {
                arm_pacer(shared, s, at);
            }
            break;
        };
        s.note_start(&name, now);
        let Some(t) = s.tenants.get_mut(&name) else {
            break;
        };
        let Some(w) = t.queue.pop_front() else { break };
        s.queued -= 1;
        // A waiter whose future is gone removed itself already; a send can
        // only fail in the instant between, and then the slot stays free
        // for the next.
        if w.grant.send(()).is_ok() {
            t.in_flight += 1;
            t.counter += w.cost as f64 / f64::from(t.policy.weight());
            s.in_flight += 1;
            granted.push(name);
        }
    }
    granted
}

/// Runs `dispatch` again at `at` (once: a pacer already armed will do).
fn arm_pacer(shared: &Arc<Shared>, s: &mut State, at: Instant) {
    if s.pacer_armed {
        return;
    }
    // Outside a runtime (a permit dropped at shutdown) there is nobody
    // left to dispatch to.
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    s.pacer_armed = true;
    let shared = shared.clone();
    rt.spawn(async move {
        tokio::time::sleep_until(at).await;
        let mut s = lock(&shared.state);
        s.pacer_armed = false;
        for name in dispatch(&shared, &mut s) {
            observe_depth(&shared, &s, &name);
        }
    });
}

/// Frees one slot of `tenant` and dispatches into it.
fn release(shared: &Arc<Shared>, s: &mut State, tenant: &str, held: Option<Duration>) {
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
    for name in dispatch(shared, s) {
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
