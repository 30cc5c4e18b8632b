//! `cluster-master-failover`: levee on a real Redis Cluster (three
//! masters, one replica each) while the master serving the load's limit
//! keys is SIGKILLed and its replica promoted.
//!
//! It needs processes the generic runner does not start (six Redis nodes,
//! levee with `LEVEE_REDIS_CLUSTER_NODES`) and a heal it does not schedule
//! (the promotion, whenever Redis Cluster completes it), so it runs here,
//! with the same load, checks and report as the others:
//!
//! 1. Start the cluster; find the master `M` serving the slot of
//!    `{ip:127.0.0.1}` (the anonymous loopback load's limit keys,
//!    `levee:rl:<algo>:{ip:127.0.0.1}:1m`), and pick the API key ids
//!    of the fail-closed tenant and of the probe so that their
//!    `{key:<id>}` slots are on `M` too: the kill hits every limit key.
//! 2. Two replicas; 75/s anonymous (`PUBLIC_IP`, 200/min, fail open) and
//!    75/s keyed (`CLOSED`, unlimited, fail closed).
//! 3. At 4 s SIGKILL `M`; the heal is the moment `CLUSTER NODES` shows
//!    its slots served by the promoted replica and every node is ok.
//! 4. The checks of `redis-killed-fail-open` (open tenant) and
//!    `redis-killed-fail-closed` (closed tenant) with that heal, plus: the
//!    closed tenant's 503s are all `limiter_unavailable`; and after the
//!    load a fresh key on the promoted master (`PROBE`, 20/min) is sent 30
//!    requests and admits exactly 20, none degraded.

use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use super::super::cluster::{key_slot, ClusterLevee, Master, RedisCluster, NODE_TIMEOUT_MS};
use super::super::load::{self, LoadSpec, Outcome, Sample, Stream, Targets, CHAT_PATH};
use super::super::procs::{LeveeEnv, SimProc};
use super::super::report::{Assertion, Event, ScenarioReport};
use super::checks::evaluate;
use super::jobs::JobsObserved;
use super::{ms, Binaries, Check, Profile, Scenario};
use crate::sim::LlmCapacity;

/// The scenario's name.
pub(super) const NAME: &str = "cluster-master-failover";

/// Levee replicas.
const REPLICAS: usize = 2;
/// The fail-open tier's shared limit (per minute: the window outlasts
/// the run), as in `redis-killed-fail-open`.
const OPEN_LIMIT: usize = 200;
/// The probe tier's limit, and the requests sent over it.
const PROBE_LIMIT: usize = 20;
const PROBE_EXTRA: usize = 10;
/// The anonymous loopback load's limit subject: `{ip:127.0.0.1}` is the
/// hash tag of its limit keys.
const IP_TAG: &str = "ip:127.0.0.1";
/// The fail-closed tenant's and the probe's API keys and their SHA-256
/// (`printf %s cluster_closed_key | sha256sum`).
const CLOSED_KEY: (&str, &str) = (
    "cluster_closed_key",
    "9879f1b0a11282ec8d5342657bee49cbbc3ba810cf82db20210ec1b92ac854e3",
);
const PROBE_KEY: (&str, &str) = (
    "cluster_probe_key",
    "17ee46ea2b66e7e1a43f928f5382249d307936bbc8859e45a6e8e8cedd9abf63",
);
/// Placeholders of the key ids in [`Scenario::config`], filled in once
/// the cluster's slot map is known.
const CLOSED_ID: &str = "@CLOSED_ID@";
const PROBE_ID: &str = "@PROBE_ID@";
/// The longest the cluster may take to promote a replica: the node
/// timeout, the failure report's spread, the election delay (0.5-1 s plus
/// rank), with room for 2 shared cores.
const PROMOTION_BOUND: Duration = Duration::from_millis(NODE_TIMEOUT_MS + 6000);
/// Bound on exact limits after the promotion: the Redis breaker's longest
/// open time (2 s), one half-open probe, and the cluster client's slot
/// refresh after its first failure on the new topology.
const RECOVERY: Duration = Duration::from_secs(4);
/// The nominal promotion time, after the kill, for the scenario as
/// listed (the run uses the measured one).
const NOMINAL_PROMOTION: Duration = Duration::from_millis(NODE_TIMEOUT_MS + 1000);
/// The load's client timeout, as in the other scenarios.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// When the master is killed, and when the load ends.
fn timing(p: &Profile) -> (Duration, Duration) {
    let s = |x: f64| Duration::from_secs_f64(x * p.time);
    (s(4.0), s(16.0))
}

/// The scenario, its checks at the nominal promotion time.
pub(super) fn cluster_master_failover(p: &Profile) -> Scenario {
    let (kill, end) = timing(p);
    let rate = (75.0 * p.rate).round() as u32;
    let stream = |tenant: &str, key: Option<&str>| Stream {
        tenant: Some(tenant.to_owned()),
        rate,
        from: Duration::ZERO,
        duration: end,
        headers: key
            .map(|k| vec![("X-API-Key".to_owned(), k.to_owned())])
            .unwrap_or_default(),
        message: "Hello".to_owned(),
        user_id: "chaos".to_owned(),
        thread_id: None,
        path: CHAT_PATH,
    };
    Scenario {
        name: NAME,
        summary: "Redis Cluster master of the limit keys' slot SIGKILLed under 2 replicas: fail-open tier only 200/429 (degraded under the local safety limit), fail-closed tier only 200/429/503 limiter_unavailable with fast 503s, exact limits after the replica's promotion (a fresh key admits exactly its limit)",
        replicas: REPLICAS,
        config: config(),
        load: LoadSpec {
            streams: vec![stream("open", None), stream("closed", Some(CLOSED_KEY.0))],
            timeout: CLIENT_TIMEOUT,
        },
        redis_proxy: false,
        vector_proxy: false,
        schedule: Vec::new(),
        fault_window: (kill, kill + NOMINAL_PROMOTION),
        checks: checks(kill, kill + NOMINAL_PROMOTION),
        sim: LlmCapacity::default(),
        contrast: None,
        jobs: None,
    }
}

/// Levee's config: the Redis settings of the single-node Redis scenarios
/// (attempt timeout 50 ms, consecutive breaker: 3 failures, open 0.5 s
/// doubling to 2 s, no jitter, 1 probe) and three tiers.
fn config() -> String {
    let (closed, probe) = (CLOSED_KEY.1, PROBE_KEY.1);
    format!(
        r#"
[ratelimit]
replicas = {REPLICAS}
[ratelimit.tiers.PUBLIC_IP]
limits = [{{ limit = {OPEN_LIMIT}, window = "1m" }}]
on_store_failure = "fail_open"
[ratelimit.tiers.CLOSED]
limits = [{{ limit = 1000000, window = "1m" }}]
on_store_failure = "fail_closed"
[ratelimit.tiers.PROBE]
limits = [{{ limit = {PROBE_LIMIT}, window = "1m" }}]
on_store_failure = "fail_closed"
[[identity.api_keys]]
id = "{CLOSED_ID}"
sha256 = "{closed}"
tenant = "closed"
tier = "CLOSED"
[[identity.api_keys]]
id = "{PROBE_ID}"
sha256 = "{probe}"
tenant = "probe"
tier = "PROBE"
[resilience.redis]
attempt_timeout = "50ms"
deadline = "50ms"
[resilience.redis.breaker]
enabled = true
policy = "consecutive"
consecutive_failures = 3
min_open = "500ms"
max_open = "2s"
open_jitter = 0.0
half_open_probes = 1
"#
    )
}

/// The checks, for a kill at `kill` and a promotion at `heal`.
fn checks(kill: Duration, heal: Duration) -> Vec<Check> {
    let tenant = |tenant, check| Check::Tenant {
        tenant,
        check: Box::new(check),
    };
    // Per replica (75/s there): the 3 failures that trip its breaker plus
    // those in flight during one 50 ms attempt timeout (4), about half
    // of them the closed tenant's; as `redis-killed-fail-closed` (K = 10
    // for one replica at 150/s), for two replicas.
    let skip = REPLICAS * 5;
    // One half-open probe per open period and replica (0.5 s, 1 s, 2 s,
    // 2 s... in the ~3-4 s outage: 3 each), each of which may wait out
    // the attempt timeout on the dead master.
    let probes = REPLICAS * 3;
    vec![
        tenant(
            "open",
            Check::Statuses {
                allowed: vec![200, 429],
                max_timeouts: 0,
                max_errors: 0,
            },
        ),
        tenant(
            "open",
            Check::LocalSafetyLimit {
                per_replica: OPEN_LIMIT / REPLICAS,
            },
        ),
        // The p99 of `redis-frozen` once the breakers are open (the first
        // 250 ms excluded), the probes excluded as for the closed tenant.
        tenant(
            "open",
            Check::P99 {
                from: kill + ms(250),
                to: heal,
                statuses: vec![],
                skip: 0,
                probes,
                max: ms(30),
            },
        ),
        // The counters survive the failover (replicated), so the window
        // stays spent: an exact 429 soon after the promotion.
        tenant(
            "open",
            Check::ExactLimitResumes {
                heal,
                within: RECOVERY,
                limit: OPEN_LIMIT,
            },
        ),
        tenant(
            "closed",
            Check::Statuses {
                allowed: vec![200, 429, 503],
                max_timeouts: 0,
                max_errors: 0,
            },
        ),
        tenant("closed", Check::RetryAfterOn { status: 503 }),
        // As `redis-killed-fail-closed`: open-breaker 503s are fast; a call
        // that waits on Redis takes the 50 ms attempt timeout.
        tenant(
            "closed",
            Check::P99 {
                from: kill,
                to: heal,
                statuses: vec![503],
                skip,
                probes,
                max: ms(20),
            },
        ),
        tenant(
            "closed",
            Check::Recovers {
                heal,
                within: RECOVERY,
                ok: vec![200],
            },
        ),
    ]
}

/// Runs the scenario: the cluster, the replicas, the load, the kill, the
/// wait for the promotion, the probe; the report with its checks.
pub(super) async fn execute(
    scenario: &Scenario,
    bins: &Binaries,
) -> anyhow::Result<ScenarioReport> {
    let mut cluster = RedisCluster::start()
        .await
        .context("starting the cluster")?;
    let slot = cluster.keyslot(&format!("{{{IP_TAG}}}")).await?;
    anyhow::ensure!(
        slot == key_slot(IP_TAG),
        "CLUSTER KEYSLOT {{{IP_TAG}}} = {slot}, computed {}",
        key_slot(IP_TAG)
    );
    let victim = cluster
        .masters()
        .await?
        .into_iter()
        .find(|m| m.owns(slot))
        .with_context(|| format!("no master serves slot {slot}"))?;
    let closed_id = id_on(&victim, "closed")?;
    let probe_id = id_on(&victim, "probe")?;
    let config = scenario
        .config
        .replace(CLOSED_ID, &closed_id)
        .replace(PROBE_ID, &probe_id);

    let sim = SimProc::start(&bins.sim, scenario.sim).await?;
    let env = LeveeEnv {
        redis_url: String::new(),
        llm_url: format!("{}/v1", sim.base_url()),
        vector_store_url: sim.base_url(),
    };
    let seeds = cluster.seeds();
    let mut replicas = Vec::new();
    for _ in 0..scenario.replicas {
        replicas.push(ClusterLevee::start(&bins.levee, &config, &seeds, &env).await?);
    }
    let targets = Targets::new(replicas.iter().map(ClusterLevee::url).collect());

    let (kill, _) = scenario.fault_window;
    let start = Instant::now() + ms(100);
    let load = tokio::spawn(load::run(scenario.load.clone(), targets.clone(), start));
    let mut events = vec![Event {
        t_s: 0.0,
        action: format!(
            "cluster {seeds}; slot {slot} of {{{IP_TAG}}} (and of {{key:{closed_id}}}, {{key:{probe_id}}}) on master 127.0.0.1:{} {:?}",
            victim.port, victim.slots
        ),
    }];
    tokio::time::sleep_until(start + kill).await;
    let pid = cluster
        .pid(victim.port)
        .context("the master is not running")?;
    cluster.kill(victim.port);
    let killed_at = start.elapsed();
    events.push(Event {
        t_s: killed_at.as_secs_f64(),
        action: format!("SIGKILL master 127.0.0.1:{} (pid {pid})", victim.port),
    });
    let promoted = cluster.wait_promoted(&victim, PROMOTION_BOUND).await;
    let heal = start.elapsed();
    let heir = match promoted {
        Ok(heir) => heir,
        Err(e) => {
            let _ = load.await;
            return Err(e);
        }
    };
    events.push(Event {
        t_s: heal.as_secs_f64(),
        action: format!(
            "replica 127.0.0.1:{} promoted: serves {:?}, cluster_state ok on every live node",
            heir.port, heir.slots
        ),
    });
    let samples = load.await.context("load task")?;

    // A fresh key on the promoted master: exactly its limit admitted.
    let probe_spec = LoadSpec {
        streams: vec![Stream {
            tenant: Some("probe".to_owned()),
            rate: u32::try_from(PROBE_LIMIT + PROBE_EXTRA)?,
            from: Duration::ZERO,
            duration: Duration::from_secs(1),
            headers: vec![("X-API-Key".to_owned(), PROBE_KEY.0.to_owned())],
            message: "Hello".to_owned(),
            user_id: "chaos".to_owned(),
            thread_id: Some("probe".to_owned()),
            path: CHAT_PATH,
        }],
        timeout: CLIENT_TIMEOUT,
    };
    let probe_start = Instant::now() + ms(20);
    let probe_at = probe_start.duration_since(start);
    let probe = load::run(probe_spec, targets.clone(), probe_start).await;
    let probe_slot = key_slot(&format!("key:{probe_id}"));
    let probe_keys = cluster.keys_in_slot(heir.port, probe_slot).await;
    events.push(Event {
        t_s: start.elapsed().as_secs_f64(),
        action: format!(
            "probe: {} requests with a fresh key from {:.2}s; slot {probe_slot} on 127.0.0.1:{} holds {probe_keys:?} keys",
            probe.len(),
            probe_at.as_secs_f64(),
            heir.port
        ),
    });

    let mut listed = scenario.clone();
    listed.fault_window = (killed_at, heal);
    listed.checks = checks(killed_at, heal);
    let end = scenario.load.duration();
    let mut assertions: Vec<Assertion> = listed
        .checks
        .iter()
        .map(|c| evaluate(c, &samples, &[], &JobsObserved::default(), end))
        .collect();
    assertions.push(promoted_within(killed_at, heal));
    assertions.push(closed_503s_limiter_unavailable(&samples, killed_at, heal));
    assertions.push(fresh_key_exact(&probe, probe_keys));
    drop(replicas);
    drop(cluster);
    let mut report = ScenarioReport::new(&listed, &samples, assertions);
    report.events = events;
    Ok(report)
}

/// The first `<prefix>-N` whose `{key:<prefix>-N}` slot `master` serves.
fn id_on(master: &Master, prefix: &str) -> anyhow::Result<String> {
    (0..10_000)
        .map(|n| format!("{prefix}-{n}"))
        .find(|id| master.owns(key_slot(&format!("key:{id}"))))
        .with_context(|| format!("no {prefix}-N key id on master {}", master.port))
}

/// The promotion happened within [`PROMOTION_BOUND`] of the kill.
fn promoted_within(kill: Duration, heal: Duration) -> Assertion {
    let took = heal.saturating_sub(kill);
    Assertion::new(
        "replica_promoted",
        format!(
            "a replica serves the killed master's slots, cluster_state ok, within {:.2}s (node timeout {NODE_TIMEOUT_MS} ms)",
            PROMOTION_BOUND.as_secs_f64()
        ),
        format!("after {:.2}s", took.as_secs_f64()),
        took <= PROMOTION_BOUND,
    )
}

/// Every 503 of the closed tenant is `limiter_unavailable`, and the
/// outage produced some.
fn closed_503s_limiter_unavailable(
    samples: &[Sample],
    kill: Duration,
    heal: Duration,
) -> Assertion {
    let closed: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.tenant.as_deref() == Some("closed") && s.outcome == Outcome::Status(503))
        .collect();
    let mut others: Vec<String> = closed
        .iter()
        .filter(|s| s.error_code.as_deref() != Some("limiter_unavailable"))
        .map(|s| s.error_code.clone().unwrap_or_else(|| "none".to_owned()))
        .collect();
    let total_others = others.len();
    others.sort();
    others.dedup();
    let during = closed
        .iter()
        .filter(|s| s.sent >= kill && s.sent < heal)
        .count();
    Assertion::new(
        "closed.503_limiter_unavailable",
        "closed tenant: every 503 is limiter_unavailable, and the outage brought some".to_owned(),
        format!(
            "{} 503s ({during} sent during the outage); {total_others} with another code {others:?}",
            closed.len()
        ),
        total_others == 0 && during > 0,
    )
}

/// Of the probe's requests, exactly [`PROBE_LIMIT`] 200s and the rest
/// 429s, none degraded, nothing else; and its key is on the promoted
/// master.
fn fresh_key_exact(probe: &[Sample], keys_on_heir: Option<i64>) -> Assertion {
    let count = |f: &dyn Fn(&Sample) -> bool| probe.iter().filter(|s| f(s)).count();
    let ok = count(&|s| s.outcome == Outcome::Status(200));
    let limited = count(&|s| s.outcome == Outcome::Status(429));
    let degraded = count(&|s| s.ratelimit_degraded);
    let other = probe.len() - ok - limited;
    Assertion::new(
        "fresh_key_exact_limit",
        format!(
            "after the promotion, a fresh key ({PROBE_LIMIT}/min, its slot on the promoted master) sent {}: exactly {PROBE_LIMIT} 200s and {PROBE_EXTRA} 429s, none degraded",
            PROBE_LIMIT + PROBE_EXTRA
        ),
        format!(
            "{} sent: {ok} 200s, {limited} 429s, {other} other, {degraded} degraded; keys in its slot on the promoted master: {}",
            probe.len(),
            keys_on_heir.map_or("unread".to_owned(), |n| n.to_string())
        ),
        probe.len() == PROBE_LIMIT + PROBE_EXTRA
            && ok == PROBE_LIMIT
            && limited == PROBE_EXTRA
            && degraded == 0
            && keys_on_heir.is_some_and(|n| n > 0),
    )
}
