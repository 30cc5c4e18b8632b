//! The Redis limit store: every limit of a request checked and consumed by
//! one Lua script (`limits.lua`) in one round trip, shared by all replicas.
//!
//! The script runs via EVALSHA and is reloaded automatically on NOSCRIPT
//! (after a `SCRIPT FLUSH` or a failover). Time comes from Redis `TIME`, so
//! replicas with skewed clocks agree. Every call is bounded by our own
//! timeout; failures become [`StoreUnavailable`] with a reason that never
//! names a key.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::upstream::redis_conn::RedisConn;
use ::redis::{RedisError, Script};
use async_trait::async_trait;

use super::{Algorithm, Decision, LimitSpec, LimitState, LimitStore, StoreUnavailable};

/// The script source (see its header for the ARGV and reply layout).
const LIMITS_LUA: &str = include_str!("limits.lua");

/// Reply integers per limit: allowed, limit, remaining, reset_after_us,
/// retry_after_us.
const FIELDS_PER_LIMIT: usize = 5;

/// The Redis [`LimitStore`], exact across replicas.
#[derive(Clone)]
pub struct RedisStore {
    conn: RedisConn,
    timeout: Duration,
    script: Script,
    /// Random per store, so member names stay unique even if a caller
    /// reuses a request id (a replayed id must not make requests free).
    instance: u64,
    seq: std::sync::Arc<AtomicU64>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store over `conn`; each call fails with [`StoreUnavailable`] after
    /// `timeout`.
    pub fn new(conn: RedisConn, timeout: Duration) -> Self {
        Self {
            conn,
            timeout,
            script: Script::new(LIMITS_LUA),
            instance: rand::random(),
            seq: std::sync::Arc::new(AtomicU64::new(0)),
        }
    }

    /// [`LimitStore::check`] with a virtual clock (`now_us` > 0) instead of
    /// Redis `TIME`. For tests only: production never passes a clock.
    #[doc(hidden)]
    pub async fn check_at(
        &self,
        now_us: u64,
        limits: &[LimitSpec],
        request_id: &str,
    ) -> Result<Decision, StoreUnavailable> {
        self.run_check(now_us, limits, request_id).await
    }

    /// [`LimitStore::adjust`] with a virtual clock. For tests only.
    #[doc(hidden)]
    pub async fn adjust_at(
        &self,
        now_us: u64,
        limit: &LimitSpec,
        delta: i64,
    ) -> Result<(), StoreUnavailable> {
        self.run_adjust(now_us, limit, delta).await
    }

    async fn run_check(
        &self,
        now_us: u64,
        limits: &[LimitSpec],
        request_id: &str,
    ) -> Result<Decision, StoreUnavailable> {
        if limits.is_empty() {
            return Ok(Decision {
                allowed: true,
                states: Vec::new(),
            });
        }
        let prefix = self.member_prefix(request_id);
        if self.conn.is_cluster() {
            let groups = by_slot(limits);
            if groups.len() > 1 {
                return self.cross_slot(now_us, limits, &prefix, &groups).await;
            }
        }
        let specs: Vec<&LimitSpec> = limits.iter().collect();
        self.invoke_check("check", now_us, &prefix, &specs).await
    }

    /// One script call checking `specs` (all in one slot); `mode` is
    /// `check` (consume if admitted) or `peek` (consume nothing).
    async fn invoke_check(
        &self,
        mode: &str,
        now_us: u64,
        prefix: &str,
        specs: &[&LimitSpec],
    ) -> Result<Decision, StoreUnavailable> {
        let mut call = self.script.prepare_invoke();
        call.arg(mode).arg(prefix).arg(now_us).arg(0i64);
        for spec in specs {
            call.key(spec.key.as_str());
            push_limit(&mut call, spec);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = self.bounded(call.invoke_async(&mut conn)).await?;
        decode(&reply, specs.len())
    }

    /// Undoes an admitting check of `specs` made with `prefix`.
    async fn release(&self, now_us: u64, prefix: &str, specs: &[&LimitSpec]) {
        let mut call = self.script.prepare_invoke();
        call.arg("release").arg(prefix).arg(now_us).arg(0i64);
        for spec in specs {
            call.key(spec.key.as_str());
            push_limit(&mut call, spec);
        }
        let mut conn = self.conn.clone();
        let result: Result<Vec<i64>, _> = self.bounded(call.invoke_async(&mut conn)).await;
        if let Err(e) = result {
            // The reservation stands until its window passes: the request
            // was refused, yet it counted (never the other way round).
            tracing::warn!(error = %e, "could not release a cross-slot reservation");
        }
    }

    /// A request whose limits live in several slots (a cluster), kept
    /// all-or-nothing without letting a refused request hold anything:
    ///
    /// 1. peek at every slot at once (nothing consumed): if any slot
    ///    refuses, so does the request, having reserved nothing (an
    ///    exhausted key never blocks the IP ceiling it shares with others);
    /// 2. otherwise reserve slot by slot, the one with the least room
    ///    first, each only once the previous admitted; if one refuses
    ///    (another request took the room in between), release the slots
    ///    already reserved.
    ///
    /// The cost: one parallel round trip, then one per slot; the single-slot
    /// path stays one round trip.
    async fn cross_slot(
        &self,
        now_us: u64,
        limits: &[LimitSpec],
        prefix: &str,
        groups: &[Vec<usize>],
    ) -> Result<Decision, StoreUnavailable> {
        let specs: Vec<Vec<&LimitSpec>> = groups
            .iter()
            .map(|g| g.iter().map(|&i| &limits[i]).collect())
            .collect();
        let peeks = futures::future::join_all(
            specs
                .iter()
                .map(|g| self.invoke_check("peek", now_us, prefix, g)),
        )
        .await;
        let mut peeked = Vec::with_capacity(peeks.len());
        for p in peeks {
            peeked.push(p?);
        }
        if !peeked.iter().all(|d| d.allowed) {
            return Ok(merge(limits.len(), groups, peeked, false));
        }
        // Least room first: the slot most likely to refuse is tried before
        // anything is held elsewhere.
        let mut order: Vec<usize> = (0..groups.len()).collect();
        order.sort_by(|&a, &b| room(&peeked[a]).total_cmp(&room(&peeked[b])));
        let mut held: Vec<usize> = Vec::new();
        let mut decisions: Vec<Option<Decision>> = vec![None; groups.len()];
        let mut allowed = true;
        for &g in &order {
            match self.invoke_check("check", now_us, prefix, &specs[g]).await {
                Ok(d) => {
                    let admitted = d.allowed;
                    decisions[g] = Some(d);
                    if admitted {
                        held.push(g);
                    } else {
                        allowed = false;
                        break;
                    }
                }
                Err(e) => {
                    self.release_all(now_us, prefix, &specs, &held).await;
                    return Err(e);
                }
            }
        }
        if !allowed {
            self.release_all(now_us, prefix, &specs, &held).await;
        }
        // Slots not reached report what the peek saw.
        let decisions = decisions
            .into_iter()
            .zip(peeked)
            .map(|(d, p)| d.unwrap_or(p))
            .collect();
        Ok(merge(limits.len(), groups, decisions, allowed))
    }

    async fn release_all(
        &self,
        now_us: u64,
        prefix: &str,
        specs: &[Vec<&LimitSpec>],
        held: &[usize],
    ) {
        futures::future::join_all(
            held.iter()
                .map(|&g| self.release(now_us, prefix, &specs[g])),
        )
        .await;
    }

    async fn run_adjust(
        &self,
        now_us: u64,
        limit: &LimitSpec,
        delta: i64,
    ) -> Result<(), StoreUnavailable> {
        if delta == 0 {
            return Ok(());
        }
        let mut call = self.script.prepare_invoke();
        call.arg("adjust")
            .arg(self.member_prefix("adjust"))
            .arg(now_us)
            .arg(delta);
        call.key(limit.key.as_str());
        push_limit(&mut call, limit);
        let mut conn = self.conn.clone();
        let _: Vec<i64> = self.bounded(call.invoke_async(&mut conn)).await?;
        Ok(())
    }

    fn member_prefix(&self, request_id: &str) -> String {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        format!("{request_id}:{:x}.{seq:x}", self.instance)
    }

    /// Runs a Redis call under our timeout, mapping every failure.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreUnavailable> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(unavailable(&err)),
            Err(_) => Err(StoreUnavailable {
                reason: format!(
                    "redis did not answer within {} ms",
                    self.timeout.as_millis()
                ),
                timeout: true,
                refused: false,
            }),
        }
    }
}

#[async_trait]
impl LimitStore for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn check(
        &self,
        limits: &[LimitSpec],
        request_id: &str,
    ) -> Result<Decision, StoreUnavailable> {
        self.run_check(0, limits, request_id).await
    }

    async fn adjust(&self, limit: &LimitSpec, delta: i64) -> Result<(), StoreUnavailable> {
        self.run_adjust(0, limit, delta).await
    }
}

/// The smallest share of a limit left in a slot's decision.
fn room(d: &Decision) -> f64 {
    d.states
        .iter()
        .map(|s| s.remaining as f64 / s.limit.max(1) as f64)
        .fold(f64::INFINITY, f64::min)
}

/// Per-slot decisions back into the request's limit order.
fn merge(n: usize, groups: &[Vec<usize>], decisions: Vec<Decision>, allowed: bool) -> Decision {
    let mut states = vec![None; n];
    for (decision, group) in decisions.into_iter().zip(groups) {
        for (state, &i) in decision.states.into_iter().zip(group) {
            states[i] = Some(state);
        }
    }
    Decision {
        allowed,
        states: states.into_iter().flatten().collect(),
    }
}

/// The limits grouped by cluster slot (indices into `limits`, in order).
fn by_slot(limits: &[LimitSpec]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(::redis::cluster_routing::Slot, Vec<usize>)> = Vec::new();
    for (i, spec) in limits.iter().enumerate() {
        let slot = ::redis::cluster_routing::Slot::for_key(spec.key.as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, g)) => g.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// Appends one limit's six ARGV fields.
fn push_limit(call: &mut ::redis::ScriptInvocation<'_>, spec: &LimitSpec) {
    let code: u8 = match spec.algorithm {
        Algorithm::SlidingLog => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::Gcra => 3,
        Algorithm::FixedWindow => 4,
    };
    call.arg(code)
        .arg(spec.limit)
        .arg(super::window_us(spec.window))
        .arg(spec.burst)
        .arg(spec.cost)
        .arg(u8::from(spec.shadow));
}

/// Turns the script's flat reply into a [`Decision`].
fn decode(reply: &[i64], limits: usize) -> Result<Decision, StoreUnavailable> {
    if reply.len() != 1 + FIELDS_PER_LIMIT * limits {
        return Err(StoreUnavailable {
            reason: format!("unexpected script reply of {} integers", reply.len()),
            timeout: false,
            refused: false,
        });
    }
    let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
    let states = reply[1..]
        .chunks_exact(FIELDS_PER_LIMIT)
        .map(|f| LimitState {
            allowed: f[0] == 1,
            limit: unsigned(f[1]),
            remaining: unsigned(f[2]),
            reset_after: Duration::from_micros(unsigned(f[3])),
            retry_after: Duration::from_micros(unsigned(f[4])),
        })
        .collect();
    Ok(Decision {
        allowed: reply[0] == 1,
        states,
    })
}

/// A reason from the error's kind and code only: Redis messages may quote
/// arguments, and arguments are key names.
fn unavailable(err: &RedisError) -> StoreUnavailable {
    let reason = if err.is_timeout() {
        "redis call timed out".to_owned()
    } else if err.is_connection_refusal() {
        "redis refused the connection".to_owned()
    } else if err.is_io_error() || err.is_connection_dropped() {
        "redis connection failed".to_owned()
    } else if let Some(code) = err.code() {
        format!("redis replied with an error ({code})")
    } else {
        format!("redis call failed ({:?})", err.kind())
    };
    StoreUnavailable {
        reason,
        timeout: err.is_timeout(),
        refused: false,
    }
}
