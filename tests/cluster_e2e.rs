//! Levee on a real Redis Cluster (three masters, three replicas, started by
//! `support::cluster`): exact limits across replicas for every algorithm,
//! all-or-nothing checks across slots, keys spread over every master, and
//! a master SIGKILLed under load.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use levee::identity::hash_key;
use levee::ratelimit::store::{Algorithm, LimitSpec, RedisStore};
use levee::upstream::redis_conn::{LazyCluster, RedisConn};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};
use support::cluster::{node_query, Master, RedisCluster};
use support::levee::Levee;
use tokio::time::Instant;

const ALGORITHMS: [&str; 4] = ["sliding_log", "sliding_window", "gcra", "fixed_window"];

/// The failover test measures latency under the default 50 ms Redis
/// timeout, so it runs alone (write); the others share the machine
/// (read). Each test still starts its own cluster.
static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

struct Reply {
    status: u16,
    headers: HeaderMap,
    body: Value,
    latency: Duration,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn degraded(&self) -> bool {
        self.header("x-ratelimit-degraded") == Some("true")
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

async fn chat(c: &reqwest::Client, base: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
    let mut req = c.post(format!("{base}/v1/chat")).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let started = Instant::now();
    let resp = req.send().await.expect("send");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.json().await.unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        body,
        latency: started.elapsed(),
    }
}

fn hello_body(thread: &str) -> Value {
    json!({"message": "Hello", "user_id": "u1", "thread_id": thread})
}

async fn hello(c: &reqwest::Client, base: &str, headers: &[(&str, &str)]) -> Reply {
    chat(c, base, &hello_body("t1"), headers).await
}

/// `[[identity.api_keys]]` entries: (id, raw key, tenant, tier).
fn api_keys(keys: &[(&str, &str, &str, &str)]) -> String {
    keys.iter()
        .map(|(id, raw, tenant, tier)| {
            format!(
                "[[identity.api_keys]]\nid = \"{id}\"\nsha256 = \"{}\"\ntenant = \"{tenant}\"\ntier = \"{tier}\"\n",
                hash_key(raw)
            )
        })
        .collect()
}

async fn start_replicas(n: usize, config: &str, cluster: &RedisCluster) -> Vec<Levee> {
    let mut replicas = Vec::new();
    for _ in 0..n {
        replicas.push(
            Levee::builder()
                .config_text(config)
                .env("LEVEE_REDIS_CLUSTER_NODES", cluster.seeds())
                .start()
                .await,
        );
    }
    replicas
}

/// Waits until the cluster's clock is not within `margin` of a minute
/// boundary, so window-aligned algorithms are not split across windows.
async fn away_from_minute_edge(cluster: &RedisCluster, margin: Duration) {
    let deadline = Instant::now() + Duration::from_secs(70);
    loop {
        let port = cluster.live_ports()[0];
        let (secs, _): (u64, u64) = node_query(port, &redis::cmd("TIME")).await.expect("TIME");
        let into = secs % 60;
        if into >= 1 && 60 - into > margin.as_secs() {
            return;
        }
        assert!(Instant::now() < deadline, "clock never left the edge");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn tally(replies: &[Reply]) -> BTreeMap<u16, usize> {
    let mut t = BTreeMap::new();
    for r in replies {
        *t.entry(r.status).or_insert(0) += 1;
    }
    t
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::test]
async fn three_replicas_on_a_cluster_admit_exactly_the_limit_for_every_algorithm() {
    let _shared = MACHINE.read().await;
    let started = Instant::now();
    let cluster = RedisCluster::start().await;
    let cluster_up = started.elapsed();
    // One key per algorithm (fresh counters each), each in its own tier
    // of 60/min. A generous Redis timeout, as in tests/ratelimit_e2e.rs:
    // this is about atomicity across replicas, not a busy 2-core machine
    // answering 300 requests within 50 ms.
    let mut config =
        String::from("[resilience.redis]\nattempt_timeout = \"2s\"\ndeadline = \"2s\"\n\n");
    let raws: Vec<String> = ALGORITHMS
        .iter()
        .map(|a| format!("cluster_exact_{a}"))
        .collect();
    let entries: Vec<(String, String)> = ALGORITHMS
        .iter()
        .map(|a| (format!("exact-{a}"), format!("EXACT_{}", a.to_uppercase())))
        .collect();
    let keys: Vec<(&str, &str, &str, &str)> = entries
        .iter()
        .zip(&raws)
        .map(|((id, tier), raw)| (id.as_str(), raw.as_str(), "partner", tier.as_str()))
        .collect();
    config.push_str(&api_keys(&keys));
    for (a, (_, tier)) in ALGORITHMS.iter().zip(&entries) {
        config.push_str(&format!(
            "[ratelimit.tiers.{tier}]\nlimits = [{{ limit = 60, window = \"1m\", algorithm = \"{a}\" }}]\n"
        ));
    }
    let replicas = start_replicas(3, &config, &cluster).await;
    let c = client();
    let urls: Vec<String> = replicas.iter().map(Levee::url).collect();
    // Warm each replica (cluster connection, slot map, script cache) on
    // the anonymous tier.
    for url in &urls {
        assert_eq!(hello(&c, url, &[]).await.status, 200);
    }
    for (a, raw) in ALGORITHMS.iter().zip(&raws) {
        away_from_minute_edge(&cluster, Duration::from_secs(8)).await;
        let burst = Instant::now();
        let replies = join_all((0..300).map(|i| {
            let c = c.clone();
            let url = urls[i % 3].clone();
            let raw = raw.clone();
            async move { hello(&c, &url, &[("X-API-Key", raw.as_str())]).await }
        }))
        .await;
        let elapsed = burst.elapsed();
        let t = tally(&replies);
        eprintln!("exactness {a}: {t:?} in {elapsed:?}");
        assert_eq!(
            (t.get(&200).copied(), t.get(&429).copied()),
            (Some(60), Some(240)),
            "{a}: 300 concurrent requests over 3 replicas on the cluster in {elapsed:?}: {t:?}"
        );
        assert!(
            replies.iter().all(|r| !r.degraded()),
            "{a}: no decision may come from the local fallback"
        );
        for r in replies.iter().filter(|r| r.status == 429) {
            assert_eq!(r.body["error"], "rate_limited", "{a}: {}", r.body);
            assert!(
                r.header("retry-after").is_some(),
                "{a}: 429 without Retry-After"
            );
        }
    }
    eprintln!(
        "exactness: cluster up in {cluster_up:?}, test {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------
// All-or-nothing across slots, on the store itself.

/// A realistic Redis `TIME` in µs for the virtual clock.
const EPOCH_US: u64 = 1_700_000_000_000_000;

fn algorithm(name: &str) -> Algorithm {
    match name {
        "sliding_log" => Algorithm::SlidingLog,
        "sliding_window" => Algorithm::SlidingWindow,
        "gcra" => Algorithm::Gcra,
        _ => Algorithm::FixedWindow,
    }
}

fn spec(key: String, algorithm: Algorithm, limit: u64) -> LimitSpec {
    LimitSpec {
        key,
        algorithm,
        limit,
        window: Duration::from_secs(60),
        burst: 0,
        cost: 1,
        shadow: false,
    }
}

/// The stored state of one limit, read through the cluster connection
/// (which routes to the key's owner): the log's members with scores, the
/// window hash, or the TAT.
async fn stored(conn: &RedisConn, spec: &LimitSpec) -> String {
    let mut conn = conn.clone();
    let key = spec.key.as_str();
    match spec.algorithm {
        Algorithm::SlidingLog => {
            let v: Vec<(String, String)> = redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await
                .expect("ZRANGE");
            format!("{v:?}")
        }
        Algorithm::Gcra => {
            let v: Option<String> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut conn)
                .await
                .expect("GET");
            format!("{v:?}")
        }
        _ => {
            let v: BTreeMap<String, String> = redis::cmd("HGETALL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .expect("HGETALL");
            format!("{v:?}")
        }
    }
}

/// How many units a limit holds now: log entries, the window's `cur`, or
/// the TAT's distance from `now` in emission intervals.
async fn units(conn: &RedisConn, spec: &LimitSpec, now_us: u64) -> u64 {
    let mut conn = conn.clone();
    let key = spec.key.as_str();
    match spec.algorithm {
        Algorithm::SlidingLog => redis::cmd("ZCARD")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("ZCARD"),
        Algorithm::Gcra => {
            let tat: Option<u64> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut conn)
                .await
                .expect("GET");
            let interval = (spec.window.as_micros() as u64).div_ceil(spec.limit);
            tat.map_or(0, |t| (t.saturating_sub(now_us)) / interval)
        }
        _ => {
            let cur: Option<u64> = redis::cmd("HGET")
                .arg(key)
                .arg("cur")
                .query_async(&mut conn)
                .await
                .expect("HGET");
            cur.unwrap_or(0)
        }
    }
}

/// Charges `n` units to `spec` alone (single-limit checks).
async fn fill(store: &RedisStore, now: u64, spec: &LimitSpec, n: u64) {
    for i in 0..n {
        let d = store
            .check_at(now, std::slice::from_ref(spec), &format!("fill-{i}"))
            .await
            .expect("check");
        assert!(d.allowed, "filling {} ({i} of {n})", spec.key);
    }
}

#[tokio::test]
async fn cross_slot_checks_are_all_or_nothing() {
    let _shared = MACHINE.read().await;
    let started = Instant::now();
    let cluster = RedisCluster::start().await;
    let lazy = LazyCluster::new(&cluster.seed_urls(), Duration::from_secs(2)).expect("cluster");
    let conn = RedisConn::Cluster(lazy);
    let store = RedisStore::new(conn.clone(), Duration::from_secs(2));
    for (n, name) in ALGORITHMS.iter().enumerate() {
        let algo = algorithm(name);
        let now = EPOCH_US + 1_000_000 * n as u64;
        // Cross-slot: a roomy limit and a full one, in two slots (the key
        // limit and an IP ceiling of one request, as the policy names them).
        let roomy = spec(format!("levee:rl:xs:{{key:roomy-{name}}}:1m:10"), algo, 10);
        let full = spec(format!("levee:rl:xs:{{ip:full-{name}}}:1m:3"), algo, 3);
        let (s_roomy, s_full) = (
            cluster.keyslot(&roomy.key).await,
            cluster.keyslot(&full.key).await,
        );
        assert_ne!(
            s_roomy, s_full,
            "{name}: the two keys must be in different slots"
        );
        fill(&store, now, &roomy, 2).await;
        fill(&store, now, &full, 3).await;
        let before = (stored(&conn, &roomy).await, stored(&conn, &full).await);
        for order in [[&roomy, &full], [&full, &roomy]] {
            let limits = [order[0].clone(), order[1].clone()];
            let d = store.check_at(now, &limits, "cross").await.expect("check");
            assert!(
                !d.allowed,
                "{name}: a full limit in one slot refuses the request"
            );
            let states: Vec<bool> = d.states.iter().map(|s| s.allowed).collect();
            let want: Vec<bool> = order.iter().map(|s| s.key == roomy.key).collect();
            assert_eq!(states, want, "{name}: per-limit verdicts in request order");
            let after = (stored(&conn, &roomy).await, stored(&conn, &full).await);
            assert_eq!(
                after, before,
                "{name}: the refused request left no trace in either slot (slots {s_roomy}, {s_full})"
            );
        }
        assert_eq!(
            units(&conn, &roomy, now).await,
            2,
            "{name}: roomy unchanged"
        );

        // Both roomy, in two slots: admitted, each charged exactly once.
        let other = spec(format!("levee:rl:xs:{{ip:roomy-{name}}}:1m:10"), algo, 10);
        assert_ne!(
            cluster.keyslot(&other.key).await,
            s_roomy,
            "{name}: two slots"
        );
        fill(&store, now, &other, 2).await;
        let d = store
            .check_at(now, &[roomy.clone(), other.clone()], "both")
            .await
            .expect("check");
        assert!(d.allowed, "{name}: two roomy slots admit");
        let remaining: Vec<u64> = d.states.iter().map(|s| s.remaining).collect();
        assert_eq!(remaining, vec![7, 7], "{name}: reported remaining");
        for s in [&roomy, &other] {
            assert_eq!(
                units(&conn, s, now).await,
                3,
                "{name}: {} charged once",
                s.key
            );
            // The same state on the node that owns the key, read directly.
            let owner = cluster.master_of(&s.key).await;
            let direct: redis::Value = node_query(owner.port, redis::cmd("TYPE").arg(&s.key))
                .await
                .expect("TYPE on the owner");
            assert_ne!(
                direct,
                redis::Value::SimpleString("none".into()),
                "{name}: {} lives on its slot's master {}",
                s.key,
                owner.port
            );
        }

        // One slot, two limits (one hash tag): one script, atomic.
        let tag = format!("key:one-{name}");
        let a = spec(format!("levee:rl:xs:{{{tag}}}:1m:10"), algo, 10);
        let b = spec(format!("levee:rl:xs:{{{tag}}}:1h:3"), algo, 3);
        let c = spec(format!("levee:rl:xs:{{{tag}}}:1d:5"), algo, 5);
        let slot = cluster.keyslot(&a.key).await;
        assert_eq!(
            cluster.keyslot(&b.key).await,
            slot,
            "{name}: one hash tag, one slot"
        );
        assert_eq!(
            cluster.keyslot(&c.key).await,
            slot,
            "{name}: one hash tag, one slot"
        );
        fill(&store, now, &b, 3).await;
        let before_a = stored(&conn, &a).await;
        let d = store
            .check_at(now, &[a.clone(), b.clone()], "one-slot-refused")
            .await
            .expect("check");
        assert!(!d.allowed, "{name}: single slot, one limit full");
        assert_eq!(stored(&conn, &a).await, before_a, "{name}: nothing charged");
        let d = store
            .check_at(now, &[a.clone(), c.clone()], "one-slot-admitted")
            .await
            .expect("check");
        assert!(d.allowed, "{name}: single slot, both roomy");
        assert_eq!(units(&conn, &a, now).await, 1, "{name}: a charged once");
        assert_eq!(units(&conn, &c, now).await, 1, "{name}: c charged once");
    }
    eprintln!("cross-slot store checks: {:?}", started.elapsed());
}

/// Trials of one exhausted key (five requests in flight) and a roomy key
/// behind the same IP ceiling (limit 1, unused), fresh keys each; the five
/// are sent just before the roomy one (a multiplexed connection keeps that
/// order per node). Returns the trials in which the roomy key was refused.
async fn refused_behind_a_shared_ceiling(
    store: &RedisStore,
    conn: &RedisConn,
    cluster: Option<&RedisCluster>,
    tag: &str,
    trials: u64,
) -> Vec<u64> {
    let mut refused = Vec::new();
    for n in 0..trials {
        let now = EPOCH_US + n * 1_000_000;
        let ip = spec(
            format!("levee:rl:{tag}:{{ip:nat-{n}}}:1m:1"),
            Algorithm::SlidingLog,
            1,
        );
        let roomy = spec(
            format!("levee:rl:{tag}:{{key:roomy-{n}}}:1m:10"),
            Algorithm::SlidingLog,
            10,
        );
        let spent = spec(
            format!("levee:rl:{tag}:{{key:spent-{n}}}:1m:1"),
            Algorithm::SlidingLog,
            1,
        );
        if let Some(cluster) = cluster {
            let slots = [
                cluster.keyslot(&ip.key).await,
                cluster.keyslot(&roomy.key).await,
                cluster.keyslot(&spent.key).await,
            ];
            assert!(
                slots[0] != slots[1] && slots[0] != slots[2],
                "two slots: {slots:?}"
            );
        }
        fill(store, now, &spent, 1).await;
        let exhausted = (0..5).map(|i| {
            let (store, limits) = (store.clone(), [spent.clone(), ip.clone()]);
            async move { store.check_at(now, &limits, &format!("spent-{i}")).await }
        });
        let good = {
            let (store, limits) = (store.clone(), [roomy.clone(), ip.clone()]);
            async move { store.check_at(now, &limits, "roomy").await }
        };
        let (bad, good) = tokio::join!(join_all(exhausted), good);
        for d in bad {
            assert!(
                !d.expect("check").allowed,
                "{tag}: an exhausted key is refused"
            );
        }
        if !good.expect("check").allowed {
            let left = units(conn, &ip, now).await;
            assert_eq!(left, 0, "{tag}: all-or-nothing: the ceiling holds nothing");
            refused.push(n);
        }
    }
    refused
}

/// A request refused by one slot must not refuse another request in a
/// slot it shares: an exhausted key's requests must not use up the IP
/// ceiling of a roomy key behind the same address. A standalone Redis
/// (one atomic script per request) is the control: there the exhausted
/// key is refused without touching the ceiling and the roomy key admitted.
#[tokio::test]
async fn a_request_refused_in_one_slot_does_not_refuse_others_in_another() {
    let _shared = MACHINE.read().await;
    let trials: u64 = 20;
    let server = support::redis::RedisServer::start().await;
    let manager =
        redis::aio::ConnectionManager::new(redis::Client::open(server.url()).expect("redis url"))
            .await
            .expect("connect");
    let single = RedisConn::Single(manager);
    let store = RedisStore::new(single.clone(), Duration::from_secs(2));
    let control = refused_behind_a_shared_ceiling(&store, &single, None, "nat1", trials).await;
    assert!(
        control.is_empty(),
        "standalone control refused in {control:?}"
    );

    let cluster = RedisCluster::start().await;
    let lazy = LazyCluster::new(&cluster.seed_urls(), Duration::from_secs(2)).expect("cluster");
    let conn = RedisConn::Cluster(lazy);
    let store = RedisStore::new(conn.clone(), Duration::from_secs(2));
    let refused =
        refused_behind_a_shared_ceiling(&store, &conn, Some(&cluster), "nat", trials).await;
    assert!(
        refused.is_empty(),
        "on the cluster, a roomy key behind an unused IP ceiling (limit 1) was refused in {} \
         of {trials} trials (standalone: 0 of {trials}); all-or-nothing held (the ceiling \
         held 0 units afterwards): five concurrent requests of an exhausted key reserved the \
         ceiling before their release",
        refused.len()
    );
}

/// The same all-or-nothing rule through the gateway: a key limit and a
/// per-IP ceiling (`network.keyed_tier`) live in two slots; after 300
/// concurrent requests only the admitted ones are counted in the slot
/// that did not refuse.
#[tokio::test]
async fn cross_slot_limits_through_the_gateway_count_only_admitted_requests() {
    let _shared = MACHINE.read().await;
    let started = Instant::now();
    let cluster = RedisCluster::start().await;
    let mut config = String::from(
        r#"
[resilience.redis]
attempt_timeout = "2s"
deadline = "2s"

[identity]
trusted_proxies = ["127.0.0.1/32"]

[ratelimit.network]
keyed_tier = "CEILING"

[ratelimit.tiers.CEILING]
limits = [{ limit = 100, window = "1m" }]
[ratelimit.tiers.KEY60]
limits = [{ limit = 60, window = "1m" }]
[ratelimit.tiers.KEYBIG]
limits = [{ limit = 100000, window = "1m" }]

"#,
    );
    // Three fresh keys of 60/min (each burst from its own address), and
    // one of 100000/min.
    let key60: Vec<(String, String)> = (0..3)
        .map(|r| (format!("xs-key60-{r}"), format!("xs_key_60_{r}")))
        .collect();
    let mut keys: Vec<(&str, &str, &str, &str)> = key60
        .iter()
        .map(|(id, raw)| (id.as_str(), raw.as_str(), "t1", "KEY60"))
        .collect();
    keys.push(("xs-keybig", "xs_key_big", "t2", "KEYBIG"));
    config.push_str(&api_keys(&keys));
    let replicas = start_replicas(3, &config, &cluster).await;
    let urls: Vec<String> = replicas.iter().map(Levee::url).collect();
    let c = client();
    for url in &urls {
        assert_eq!(
            hello(&c, url, &[("X-Forwarded-For", "10.9.9.9")])
                .await
                .status,
            200
        );
    }
    // (raw key, client IP, admitted, the binding limit's key, the other's)
    let mut cases: Vec<(String, String, usize, String, String)> = key60
        .iter()
        .enumerate()
        .map(|(r, (id, raw))| {
            // The key limit (60) binds; the IP ceiling (100) must hold 60.
            let ip = format!("198.51.100.{}", 10 + r);
            (
                raw.clone(),
                ip.clone(),
                60,
                format!("levee:rl:sl:{{key:{id}}}:1m"),
                format!("levee:rl:sl:{{ip:{ip}}}:1m"),
            )
        })
        .collect();
    // The IP ceiling (100) binds; the key limit must hold 100.
    cases.push((
        "xs_key_big".into(),
        "198.51.100.2".into(),
        100,
        "levee:rl:sl:{ip:198.51.100.2}:1m".into(),
        "levee:rl:sl:{key:xs-keybig}:1m".into(),
    ));
    let lazy = LazyCluster::new(&cluster.seed_urls(), Duration::from_secs(2)).expect("cluster");
    let mut conn = RedisConn::Cluster(lazy);
    let mut results = Vec::new();
    for (raw, ip, admitted, binding, other) in &cases {
        assert_ne!(
            cluster.keyslot(other).await,
            cluster.keyslot(binding).await,
            "two slots"
        );
        let replies = join_all((0..300).map(|i| {
            let c = c.clone();
            let url = urls[i % 3].clone();
            let headers = [
                ("X-API-Key", raw.as_str()),
                ("X-Forwarded-For", ip.as_str()),
            ];
            async move { hello(&c, &url, &headers).await }
        }))
        .await;
        let t = tally(&replies);
        let ok = t.get(&200).copied().unwrap_or(0);
        let mut counted = Vec::new();
        for key in [binding, other] {
            let n: u64 = redis::cmd("ZCARD")
                .arg(key)
                .query_async(&mut conn)
                .await
                .expect("ZCARD");
            counted.push(n);
        }
        eprintln!("gateway cross-slot {raw}: {t:?}, stored {counted:?}");
        assert!(replies.iter().all(|r| !r.degraded()), "{raw}: no fallback");
        // All-or-nothing: both slots count exactly the admitted requests
        // (a refused request's reservation was released).
        assert_eq!(
            counted,
            vec![ok as u64; 2],
            "{raw}: {binding} and {other} count exactly the {ok} admitted requests ({t:?})"
        );
        results.push((raw.clone(), *admitted, binding.clone(), other.clone(), t));
    }
    // Exact: a request is refused only once the binding limit is really
    // used up (as one script on a standalone Redis does).
    let short: Vec<String> = results
        .iter()
        .filter(|(_, admitted, _, _, t)| {
            (t.get(&200).copied(), t.get(&429).copied()) != (Some(*admitted), Some(300 - *admitted))
        })
        .map(|(raw, admitted, binding, other, t)| {
            let ok = t.get(&200).copied().unwrap_or(0);
            format!(
                "{raw}: {t:?}, want {admitted} × 200: {} requests refused (429) although, \
                 once reservations were released, {binding} held {ok} of {admitted} and \
                 {other} {ok}",
                admitted.saturating_sub(ok)
            )
        })
        .collect();
    assert!(
        short.is_empty(),
        "300 concurrent requests over 3 replicas, cross-slot limits:\n{}",
        short.join("\n")
    );
    eprintln!("gateway cross-slot: {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------
// Keys spread over every master.

#[tokio::test]
async fn a_mixed_run_puts_keys_on_every_master() {
    let _shared = MACHINE.read().await;
    let started = Instant::now();
    let cluster = RedisCluster::start().await;
    let raws: Vec<String> = (0..6).map(|i| format!("spread_key_{i}")).collect();
    let ids: Vec<String> = (0..6).map(|i| format!("spread-{i}")).collect();
    let keys: Vec<(&str, &str, &str, &str)> = ids
        .iter()
        .zip(&raws)
        .enumerate()
        .map(|(i, (id, raw))| {
            let tenant = if i % 2 == 0 { "acme" } else { "globex" };
            (id.as_str(), raw.as_str(), tenant, "API_KEY")
        })
        .collect();
    let config = format!(
        "[identity]\ntrusted_proxies = [\"127.0.0.1/32\"]\n\n{}",
        api_keys(&keys)
    );
    let levee = start_replicas(1, &config, &cluster).await.remove(0);
    let c = client();
    let mut statuses = Vec::new();
    // Keyed chat from six keys, anonymous chat from eight addresses, each
    // on its own thread (memory keys).
    for (i, raw) in raws.iter().enumerate() {
        let body = hello_body(&format!("thread-key-{i}"));
        statuses.push(
            chat(&c, &levee.url(), &body, &[("X-API-Key", raw)])
                .await
                .status,
        );
    }
    for i in 0..8 {
        let ip = format!("203.0.113.{}", 10 + i);
        let body = hello_body(&format!("thread-ip-{i}"));
        statuses.push(
            chat(&c, &levee.url(), &body, &[("X-Forwarded-For", &ip)])
                .await
                .status,
        );
    }
    // Jobs of two tenants.
    let body = json!({"message": "What is the PTO policy?", "user_id": "u1", "thread_id": "t1"});
    for raw in &raws[..4] {
        let resp = c
            .post(format!("{}/v1/jobs", levee.url()))
            .header("x-api-key", raw)
            .json(&body)
            .send()
            .await
            .expect("submit");
        statuses.push(resp.status().as_u16());
    }
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 202),
        "every request succeeds: {statuses:?}"
    );
    let masters = cluster.masters().await;
    assert_eq!(masters.len(), 3, "{masters:?}");
    let mut report = Vec::new();
    for m in &masters {
        let keys = cluster.keys(m.port).await;
        let kind = |p: &str| keys.iter().filter(|k| k.starts_with(p)).count();
        let size = cluster.dbsize(m.port).await;
        report.push(format!(
            "master {} {:?}: dbsize {size} (limiter {}, memory {}, jobs {})",
            m.port,
            m.slots,
            kind("levee:rl:"),
            kind("levee:mem:"),
            kind("levee:jobs:")
        ));
        assert!(size > 0, "master {} holds no key: {report:?}", m.port);
    }
    eprintln!("spread: {report:#?} in {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------
// A master SIGKILLed under load.

/// One answer of the stream.
struct Sample {
    at: Duration,
    closed: bool,
    reply: Reply,
}

/// The first id `<prefix>-<n>` whose key limit's slot `master` serves.
async fn id_on(cluster: &RedisCluster, master: &Master, prefix: &str) -> String {
    for n in 0..1000 {
        let id = format!("{prefix}-{n}");
        if master.owns(cluster.keyslot(&format!("{{key:{id}}}")).await) {
            return id;
        }
    }
    panic!("no id on master {}", master.port);
}

#[tokio::test]
async fn a_master_killed_under_load_gives_only_configured_outcomes_then_exact_limits() {
    let _alone = MACHINE.write().await;
    let started = Instant::now();
    let mut cluster = RedisCluster::start().await;
    // Two keys whose limits live on the same master: one fail-closed tier,
    // one fail-open tier, both 20 per 2 s. Default Redis resilience
    // (50 ms per call, breaker after 3 consecutive failures).
    let victim = cluster.masters().await.remove(0);
    let closed_id = id_on(&cluster, &victim, "fo-closed").await;
    let open_id = id_on(&cluster, &victim, "fo-open").await;
    let config = format!(
        r#"
[ratelimit.tiers.FO_CLOSED]
limits = [{{ limit = 20, window = "2s" }}]
on_store_failure = "fail_closed"
[ratelimit.tiers.FO_OPEN]
limits = [{{ limit = 20, window = "2s" }}]
on_store_failure = "fail_open"

{}"#,
        api_keys(&[
            (&closed_id, "fo_closed_key", "t1", "FO_CLOSED"),
            (&open_id, "fo_open_key", "t2", "FO_OPEN"),
        ])
    );
    let replicas = start_replicas(2, &config, &cluster).await;
    let urls: Vec<String> = replicas.iter().map(Levee::url).collect();
    let c = client();
    for url in &urls {
        for key in ["fo_closed_key", "fo_open_key"] {
            let r = hello(&c, url, &[("X-API-Key", key)]).await;
            assert_eq!(r.status, 200, "{}", r.body);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await; // the warm-up's window passes

    // The stream: four workers on replica 0, two per key, each one request
    // then 250 ms: 8 requests/s per key, under the 10/s limit.
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (c, url, stop) = (c.clone(), urls[0].clone(), stop.clone());
            tokio::spawn(async move {
                let closed = w % 2 == 0;
                let key = if closed {
                    "fo_closed_key"
                } else {
                    "fo_open_key"
                };
                let body = hello_body(&format!("stream-{w}"));
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let at = t0.elapsed();
                    let reply = chat(&c, &url, &body, &[("X-API-Key", key)]).await;
                    out.push(Sample { at, closed, reply });
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                out
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let killed_at = t0.elapsed();
    let killed = cluster
        .kill_master_of(&format!("{{key:{closed_id}}}"))
        .await;
    assert_eq!(killed.port, victim.port);
    let promotion = cluster
        .wait_promoted(&killed, Duration::from_secs(30))
        .await;
    let promoted_at = t0.elapsed();
    eprintln!(
        "failover: killed {} at {killed_at:?}, promoted after {promotion:?}: {:?}",
        killed.port,
        cluster.describe().await
    );
    // Exact decisions resume on both replicas: a non-degraded answer for
    // both keys from each (bounded: the breaker opens for at most 5 s).
    let deadline = Instant::now() + Duration::from_secs(20);
    for url in &urls {
        for key in ["fo_closed_key", "fo_open_key"] {
            loop {
                let r = hello(&c, url, &[("X-API-Key", key)]).await;
                if matches!(r.status, 200 | 429) && !r.degraded() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{url} {key}: still {} degraded={} 20 s after promotion",
                    r.status,
                    r.degraded()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let recovered_at = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    for w in workers {
        samples.extend(w.await.expect("worker"));
    }

    // Only the configured outcomes.
    let mut outcomes: BTreeMap<(&str, u16, bool), usize> = BTreeMap::new();
    for s in &samples {
        let tier = if s.closed { "fail_closed" } else { "fail_open" };
        *outcomes
            .entry((tier, s.reply.status, s.reply.degraded()))
            .or_insert(0) += 1;
        let r = &s.reply;
        match (s.closed, r.status, r.degraded()) {
            (_, 200 | 429, false) => {}
            (true, 503, false) => {
                assert_eq!(r.body["error"], "limiter_unavailable", "{}", r.body);
                assert!(r.header("retry-after").is_some(), "503 without Retry-After");
            }
            (false, 200 | 429, true) => {
                assert!(
                    s.at + Duration::from_millis(500) >= killed_at,
                    "degraded before the kill at {:?}",
                    s.at
                );
            }
            (closed, status, degraded) => panic!(
                "unexpected outcome at {:?} (kill at {killed_at:?}): closed tier {closed}, \
                 status {status}, degraded {degraded}: {}",
                s.at, r.body
            ),
        }
    }
    let mut latencies: Vec<Duration> = samples.iter().map(|s| s.reply.latency).collect();
    latencies.sort();
    let (p50, p99, max) = (
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        *latencies.last().expect("samples"),
    );
    let during: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at >= killed_at && s.at <= recovered_at)
        .collect();
    eprintln!(
        "failover stream: {} requests, outcomes {outcomes:?}; latency p50 {p50:?} p99 {p99:?} \
         max {max:?}; {} during the outage window ({killed_at:?}..{recovered_at:?}, promoted \
         at {promoted_at:?})",
        samples.len(),
        during.len()
    );
    // The outage was seen, and answered by each tier's own policy.
    assert!(
        samples.iter().any(|s| s.closed && s.reply.status == 503),
        "the fail-closed tier answered 503 while its master was down: {outcomes:?}"
    );
    assert!(
        samples.iter().any(|s| !s.closed && s.reply.degraded()),
        "the fail-open tier answered degraded while its master was down: {outcomes:?}"
    );
    // Bounded latency: each Redis call is bounded by 50 ms (attempt
    // timeout = deadline); a chat makes at most three (limit check,
    // memory read, memory write), so 4 × 50 ms covers p99 with slack.
    assert!(
        p99 <= Duration::from_millis(200),
        "p99 {p99:?} (p50 {p50:?}, max {max:?}) during a master failover"
    );

    // A fresh window after the promotion admits exactly the limit again,
    // on both replicas together, for both tiers.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for key in ["fo_closed_key", "fo_open_key"] {
        let replies = join_all((0..50).map(|i| {
            let c = c.clone();
            let url = urls[i % 2].clone();
            async move { hello(&c, &url, &[("X-API-Key", key)]).await }
        }))
        .await;
        let t = tally(&replies);
        eprintln!("after failover {key}: {t:?}");
        assert_eq!(
            (t.get(&200).copied(), t.get(&429).copied()),
            (Some(20), Some(30)),
            "{key}: 50 concurrent requests in a fresh 2 s window after promotion: {t:?}"
        );
        assert!(replies.iter().all(|r| !r.degraded()), "{key}: exact again");
    }
    eprintln!("failover test: {:?}", started.elapsed());
}
