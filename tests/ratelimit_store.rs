//! The Redis limit store (its Lua script) against a real redis-server: it
//! agrees with the reference models and with the in-process store, stays
//! exact under concurrent replicas, never keeps a key forever, survives a
//! script flush, and fails fast when Redis stops answering.

// The shared support module is written for several test crates.
#[allow(unreachable_pub, dead_code, clippy::disallowed_types)]
#[path = "support/redis.rs"]
mod redis_support;

#[allow(dead_code)]
#[path = "../src/ratelimit/store/models.rs"]
mod models;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use levee::ratelimit::store::{
    Algorithm, Decision, LimitSpec, LimitStore, MemoryStore, RedisStore,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis_support::RedisServer;
use tokio::time::Instant;

/// A realistic Redis `TIME` in µs, so the script's arithmetic sees
/// production-sized numbers.
const EPOCH_US: u64 = 1_700_000_000_000_000;

const ALGORITHMS: [(Algorithm, &str); 4] = [
    (Algorithm::SlidingLog, "sliding_log"),
    (Algorithm::SlidingWindow, "sliding_window"),
    (Algorithm::Gcra, "gcra"),
    (Algorithm::FixedWindow, "fixed_window"),
];

static KEYS: AtomicU64 = AtomicU64::new(0);

fn fresh_key(tag: &str) -> String {
    format!("levee:test:{tag}:{}", KEYS.fetch_add(1, Ordering::Relaxed))
}

fn spec(key: &str, algorithm: Algorithm, limit: u64, window: Duration) -> LimitSpec {
    LimitSpec {
        key: key.to_owned(),
        algorithm,
        limit,
        window,
        burst: 0,
        cost: 1,
        shadow: false,
    }
}

async fn store(server: &RedisServer, timeout: Duration) -> RedisStore {
    let client = redis::Client::open(server.url()).expect("redis url");
    let conn = ConnectionManager::new(client)
        .await
        .expect("connect to test redis");
    RedisStore::new(
        levee::upstream::redis_conn::RedisConn::Single(conn),
        timeout,
    )
}

fn query<T: redis::FromRedisValue>(server: &RedisServer, cmd: &str, args: &[&str]) -> T {
    let mut c = redis::cmd(cmd);
    for a in args {
        c.arg(*a);
    }
    c.query(&mut server.conn()).expect("redis query")
}

/// Limits and arrivals `(gap µs, cost, adjust delta applied first)`.
#[derive(Debug, Clone)]
struct Scenario {
    limits: Vec<(usize, u64, u64, u64, bool)>, // algorithm, limit, window µs, burst, shadow
    start: u64,
    arrivals: Vec<(u64, u64, i64)>,
}

fn scenario(algorithm: Option<usize>, max_limits: usize) -> impl Strategy<Value = Scenario> {
    let algorithm = match algorithm {
        Some(a) => Just(a).boxed(),
        None => (0usize..4).boxed(),
    };
    let limit = (
        algorithm,
        1u64..=8,
        500_000u64..2_000_000,
        0u64..=10,
        any::<bool>(),
    );
    (
        prop::collection::vec(limit, 1..=max_limits),
        0u64..5_000_000,
        prop::collection::vec(
            (
                0u64..400_000,
                1u64..=3,
                prop_oneof![4 => Just(0i64), 1 => -3i64..=3],
            ),
            1..40,
        ),
    )
        .prop_map(|(limits, start, arrivals)| Scenario {
            limits,
            start,
            arrivals,
        })
}

impl Scenario {
    fn specs(&self, cost: u64) -> Vec<LimitSpec> {
        let case = KEYS.fetch_add(1, Ordering::Relaxed);
        self.limits
            .iter()
            .enumerate()
            .map(
                |(i, &(algorithm, limit, window, burst, shadow))| LimitSpec {
                    key: format!("levee:test:model:{case}:{i}"),
                    algorithm: ALGORITHMS[algorithm].0,
                    limit,
                    window: Duration::from_micros(window),
                    burst,
                    cost,
                    shadow,
                },
            )
            .collect()
    }
}

/// Replays one scenario against Redis (virtual clock), the memory store
/// and the reference models; all three must agree on every decision, and
/// the two stores on every reported number.
async fn replay(redis: &RedisStore, sc: &Scenario, with_models: bool) -> Result<(), TestCaseError> {
    let memory = MemoryStore::new();
    let mut specs = sc.specs(1);
    let mut models: Vec<_> = sc
        .limits
        .iter()
        .map(|&(a, limit, window, burst, _)| models::model(ALGORITHMS[a].1, limit, window, burst))
        .collect();
    let mut t = EPOCH_US + sc.start;
    for (n, &(gap, cost, delta)) in sc.arrivals.iter().enumerate() {
        t += gap;
        if delta != 0 {
            redis.adjust_at(t, &specs[0], delta).await.expect("adjust");
            memory.adjust_at(t, &specs[0], delta);
        }
        for s in &mut specs {
            s.cost = cost;
        }
        let got: Decision = redis
            .check_at(t, &specs, &format!("req-{n}"))
            .await
            .expect("check");
        let want = memory.check_at(t, &specs);
        prop_assert_eq!(
            &got,
            &want,
            "redis vs memory at t={} cost={}",
            t - EPOCH_US,
            cost
        );
        if with_models {
            let admits: Vec<bool> = models.iter().map(|m| m.admits(t, cost)).collect();
            let allowed = specs.iter().zip(&admits).all(|(s, a)| s.shadow || *a);
            prop_assert_eq!(got.allowed, allowed, "redis vs model at t={}", t - EPOCH_US);
            for (m, admits) in models.iter_mut().zip(admits) {
                if allowed && admits {
                    m.consume(t, cost);
                }
            }
        }
    }
    Ok(())
}

#[test]
fn redis_script_agrees_with_the_reference_models_for_every_algorithm() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let server = rt.block_on(RedisServer::start());
    let redis = rt.block_on(store(&server, Duration::from_secs(5)));
    for (algorithm, (_, name)) in ALGORITHMS.iter().enumerate() {
        let mut runner = TestRunner::new(Config {
            cases: 32,
            ..Config::default()
        });
        // No adjustments here: the models only know checks.
        let strategy = scenario(Some(algorithm), 1).prop_map(|mut sc| {
            sc.limits[0].4 = false;
            sc.arrivals.iter_mut().for_each(|a| a.2 = 0);
            sc
        });
        runner
            .run(&strategy, |sc| rt.block_on(replay(&redis, &sc, true)))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn redis_and_memory_stores_agree_on_several_limits_shadows_and_adjustments() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let server = rt.block_on(RedisServer::start());
    let redis = rt.block_on(store(&server, Duration::from_secs(5)));
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    runner
        .run(&scenario(None, 3), |sc| {
            rt.block_on(replay(&redis, &sc, false))
        })
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_admit_exactly_the_limit_under_concurrency() {
    let server = RedisServer::start().await;
    let replicas = [
        store(&server, Duration::from_secs(5)).await,
        store(&server, Duration::from_secs(5)).await,
        store(&server, Duration::from_secs(5)).await,
    ];
    // Fixed "now" in the middle of a minute: window edges cannot interfere.
    let now = EPOCH_US + 30_000_000;
    for (algorithm, name) in ALGORITHMS {
        let limit = spec(&fresh_key(name), algorithm, 60, Duration::from_secs(60));
        let admitted = concurrent_admissions(&replicas, &limit, Some(now)).await;
        assert_eq!(admitted, 60, "{name}");
    }
    // The production path (Redis TIME) for the sliding log, whose exactness
    // does not depend on where window edges fall.
    let limit = spec(
        &fresh_key("time"),
        Algorithm::SlidingLog,
        60,
        Duration::from_secs(60),
    );
    assert_eq!(concurrent_admissions(&replicas, &limit, None).await, 60);
}

async fn concurrent_admissions(
    replicas: &[RedisStore; 3],
    limit: &LimitSpec,
    now: Option<u64>,
) -> usize {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..300 {
        let store = replicas[i % 3].clone();
        let limit = limit.clone();
        tasks.spawn(async move {
            let id = format!("req-{i}");
            let limits = std::slice::from_ref(&limit);
            let d = match now {
                Some(now) => store.check_at(now, limits, &id).await,
                None => store.check(limits, &id).await,
            };
            d.expect("check").allowed
        });
    }
    tasks.join_all().await.into_iter().filter(|&a| a).count()
}

#[tokio::test]
async fn sliding_log_counts_every_request_in_the_same_microsecond() {
    let server = RedisServer::start().await;
    let redis = store(&server, Duration::from_secs(5)).await;
    let key = fresh_key("same-us");
    let limit = spec(&key, Algorithm::SlidingLog, 150, Duration::from_secs(60));
    let now = EPOCH_US + 123;
    let mut admitted = 0;
    for i in 0..200 {
        let d = redis
            .check_at(now, std::slice::from_ref(&limit), &format!("req-{i}"))
            .await
            .unwrap();
        admitted += usize::from(d.allowed);
    }
    assert_eq!(admitted, 150);
    assert_eq!(query::<u64>(&server, "ZCARD", &[&key]), 150);
}

#[tokio::test]
async fn a_replayed_request_id_is_still_counted() {
    let server = RedisServer::start().await;
    let redis = store(&server, Duration::from_secs(5)).await;
    let limit = spec(
        &fresh_key("replay"),
        Algorithm::SlidingLog,
        3,
        Duration::from_secs(60),
    );
    let now = EPOCH_US + 7;
    let mut verdicts = Vec::new();
    for _ in 0..5 {
        verdicts.push(
            redis
                .check_at(now, std::slice::from_ref(&limit), "same-id")
                .await
                .unwrap()
                .allowed,
        );
    }
    assert_eq!(verdicts, [true, true, true, false, false]);
}

#[tokio::test]
async fn rejected_request_consumes_no_quota() {
    let server = RedisServer::start().await;
    let redis = store(&server, Duration::from_secs(5)).await;
    let now = EPOCH_US + 10_000_000;
    for (algorithm, name) in ALGORITHMS {
        let key = fresh_key(name);
        let limit = spec(&key, algorithm, 2, Duration::from_secs(60));
        let one = std::slice::from_ref(&limit);
        assert!(redis.check_at(now, one, "a").await.unwrap().allowed);
        assert!(redis.check_at(now, one, "b").await.unwrap().allowed);
        let stored_before = dump(&server, &key);
        let first = redis.check_at(now + 1, one, "c").await.unwrap();
        assert!(!first.allowed, "{name}");
        let retry = u64::try_from(first.states[0].retry_after.as_micros()).unwrap();
        for i in 0..50 {
            assert!(
                !redis
                    .check_at(now + 1 + i * 1_000, one, "d")
                    .await
                    .unwrap()
                    .allowed,
                "{name}"
            );
        }
        assert_eq!(
            dump(&server, &key),
            stored_before,
            "{name}: rejections wrote to the key"
        );
        assert!(
            !redis.check_at(now + retry, one, "e").await.unwrap().allowed,
            "{name}"
        );
        assert!(
            redis
                .check_at(now + 1 + retry, one, "f")
                .await
                .unwrap()
                .allowed,
            "{name}"
        );
    }
}

/// The key's stored value, whatever its type.
fn dump(server: &RedisServer, key: &str) -> String {
    match query::<String>(server, "TYPE", &[key]).as_str() {
        "zset" => format!(
            "{:?}",
            query::<Vec<String>>(server, "ZRANGE", &[key, "0", "-1", "WITHSCORES"])
        ),
        "hash" => format!("{:?}", query::<Vec<String>>(server, "HGETALL", &[key])),
        "string" => query::<String>(server, "GET", &[key]),
        other => other.to_owned(),
    }
}

#[tokio::test]
async fn every_key_gets_a_ttl() {
    let server = RedisServer::start().await;
    let redis = store(&server, Duration::from_secs(5)).await;
    let window = Duration::from_secs(60);
    // The longest each key may live, in ms: log W, sliding 2W, GCRA until
    // TAT (T = 1 s here), fixed until the window ends.
    let bounds = [60_000, 120_000, 1_000, 60_000];
    for ((algorithm, name), bound) in ALGORITHMS.into_iter().zip(bounds) {
        let key = fresh_key(name);
        let limit = spec(&key, algorithm, 60, window);
        assert!(
            redis
                .check(std::slice::from_ref(&limit), "r")
                .await
                .unwrap()
                .allowed
        );
        let ttl: i64 = query(&server, "PTTL", &[&key]);
        assert!(ttl > 0 && ttl <= bound, "{name}: PTTL {ttl} ms");
        redis.adjust(&limit, 3).await.unwrap();
        let ttl: i64 = query(&server, "PTTL", &[&key]);
        assert!(
            ttl > 0 && ttl <= bound * 4,
            "{name} after adjust: PTTL {ttl} ms"
        );
    }
    for key in server.keys() {
        let ttl: i64 = query(&server, "PTTL", &[&key]);
        assert!(ttl > 0, "{key} has no TTL");
    }
}

#[tokio::test]
async fn the_script_is_reloaded_after_a_script_flush() {
    let server = RedisServer::start().await;
    let redis = store(&server, Duration::from_secs(5)).await;
    assert_eq!(redis.kind(), "redis");
    let limit = spec(
        &fresh_key("flush"),
        Algorithm::Gcra,
        10,
        Duration::from_secs(10),
    );
    let one = std::slice::from_ref(&limit);
    assert_eq!(redis.check(one, "a").await.unwrap().states[0].remaining, 9);
    let _: String = query(&server, "SCRIPT", &["FLUSH"]);
    let d = redis
        .check(one, "b")
        .await
        .expect("NOSCRIPT must trigger a reload");
    assert!(d.allowed);
    assert!(d.states[0].remaining <= 8);
    let _: String = query(&server, "SCRIPT", &["FLUSH"]);
    redis.adjust(&limit, -1).await.expect("adjust reloads too");
}

/// Resumes a SIGSTOPped redis-server even if the test fails.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid}");
}

#[tokio::test]
async fn a_stopped_redis_gives_store_unavailable_within_the_timeout() {
    let server = RedisServer::start().await;
    let timeout = Duration::from_millis(200);
    let redis = store(&server, timeout).await;
    let key = fresh_key("secret-tenant");
    let limit = spec(&key, Algorithm::SlidingLog, 10, Duration::from_secs(60));
    let one = std::slice::from_ref(&limit);
    assert!(redis.check(one, "a").await.unwrap().allowed);

    signal(server.pid(), "-STOP");
    let resume = Resume(server.pid());
    let started = Instant::now();
    let err = redis
        .check(one, "b")
        .await
        .expect_err("a stopped redis cannot answer");
    let elapsed = started.elapsed();
    assert!(
        elapsed < timeout + Duration::from_millis(300),
        "took {elapsed:?}"
    );
    assert!(err.timeout);
    assert!(!err.to_string().contains(&key), "{err}");
    let started = Instant::now();
    let err = redis.adjust(&limit, 1).await.expect_err("adjust too");
    assert!(started.elapsed() < timeout + Duration::from_millis(300));
    assert!(err.timeout);
    drop(resume);

    // Once Redis answers again, so does the store.
    let mut recovered = false;
    for _ in 0..50 {
        if redis.check(one, "c").await.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recovered);
}

#[tokio::test]
async fn an_unreachable_redis_gives_store_unavailable_within_the_timeout() {
    let port = redis_support::free_port(); // nobody listens here
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
    let config = ConnectionManagerConfig::new().set_number_of_retries(1);
    let conn = ConnectionManager::new_lazy_with_config(client, config).expect("lazy manager");
    let timeout = Duration::from_millis(300);
    let redis = RedisStore::new(
        levee::upstream::redis_conn::RedisConn::Single(conn),
        timeout,
    );
    let limit = spec(
        "levee:test:unreachable",
        Algorithm::Gcra,
        10,
        Duration::from_secs(1),
    );
    let started = Instant::now();
    let err = redis
        .check(&[limit], "a")
        .await
        .expect_err("nothing listens");
    assert!(started.elapsed() < timeout + Duration::from_millis(300));
    assert!(!err.reason.contains("unreachable"), "{err}");
}
