//! Per-dependency resilience over real sockets: the levee binary, the
//! upstream simulator as LLM and vector store, and a real redis-server that
//! the tests SIGKILL, SIGSTOP and restart (only their own, by PID).

mod support;

use std::time::Duration;

use levee_chaos::sim::{self, SimConfig, SimHandle};
use serde_json::{json, Value};
use support::levee::{signal, Levee};
use support::redis::RedisServer;
use tokio::time::Instant;

struct Reply {
    status: u16,
    retry_after: Option<u64>,
    degraded: bool,
    body: Value,
    took: Duration,
}

async fn chat(client: &reqwest::Client, base: &str, message: &str) -> Reply {
    let started = Instant::now();
    let resp = client
        .post(format!("{base}/v1/chat"))
        .json(&json!({"message": message, "user_id": "u1", "thread_id": "t1"}))
        .send()
        .await
        .expect("send");
    let took = started.elapsed();
    let status = resp.status().as_u16();
    let header = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let retry_after = header("retry-after").and_then(|v| v.parse().ok());
    let degraded = header("x-ratelimit-degraded").as_deref() == Some("true");
    let body = resp.json().await.unwrap_or(Value::Null);
    Reply {
        status,
        retry_after,
        degraded,
        body,
        took,
    }
}

/// The tests of this file run one at a time: several assert latency, and
/// on a 2-core machine parallel tests would measure each other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// (p50, p99).
/// The LLM's attempt timeout in the breaker tests' config.
const LLM_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(300);

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
    (at(0.5), at(0.99))
}

async fn sim_chat_count(sim: &str) -> u64 {
    let stats: Value = reqwest::get(format!("{sim}/_stats"))
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    stats["requests"]["chat"].as_u64().expect("chat counter")
}

async fn set_faults(sim: &str, faults: Value) {
    let c = reqwest::Client::new();
    let req = if faults.is_null() {
        c.delete(format!("{sim}/_faults"))
    } else {
        c.post(format!("{sim}/_faults")).json(&faults)
    };
    assert!(req.send().await.expect("faults").status().is_success());
}

/// An LLM breaker that opens after 3 consecutive failures for exactly 2 s,
/// with no retries, so calls can be counted exactly.
const LLM_BREAKER: &str = r#"
[ratelimit.tiers.PUBLIC_IP]
limits = [{ limit = 100000, window = "1m" }]
[resilience.llm]
attempt_timeout = "300ms" # LLM_ATTEMPT_TIMEOUT
deadline = "1s"
[resilience.llm.retry]
max_attempts = 1
[resilience.llm.breaker]
policy = "consecutive"
consecutive_failures = 3
min_open = "2s"
max_open = "2s"
open_jitter = 0.0
half_open_probes = 1
"#;

async fn levee_on_sim(sim: &SimHandle, extra: &str) -> Levee {
    Levee::builder()
        .config_text(&format!("{LLM_BREAKER}\n{extra}"))
        .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
        .env("LEVEE_ADMIN_TOKEN", "test-admin-token")
        .start()
        .await
}

/// The breaker opens after 3 failures; then 503s come back fast without
/// touching the LLM; after the open time one probe closes it again.
async fn breaker_cycle(fault: Value, failure_status: u16) {
    let _serial = SERIAL.lock().await;
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let base = sim.base_url();
    let levee = levee_on_sim(&sim, "").await;
    let c = reqwest::Client::new();
    assert_eq!(
        chat(&c, &levee.url(), "What is the PTO policy?")
            .await
            .status,
        200
    );

    set_faults(&base, fault).await;
    for _ in 0..3 {
        let r = chat(&c, &levee.url(), "What is the PTO policy?").await;
        assert_eq!(r.status, failure_status, "{}", r.body);
    }
    let calls_when_opened = sim_chat_count(&base).await;
    assert_eq!(
        calls_when_opened, 4,
        "1 success + 3 failures reached the LLM"
    );

    let opened = Instant::now();
    let mut took = Vec::new();
    for _ in 0..200 {
        let r = chat(&c, &levee.url(), "What is the PTO policy?").await;
        assert_eq!(r.status, 503, "{}", r.body);
        assert_eq!(r.body["error"], "dependency_unavailable");
        assert_eq!(r.body["dependency"], "llm");
        let wait = r.retry_after.expect("Retry-After on an open breaker");
        assert!((1..=2).contains(&wait), "Retry-After {wait}");
        took.push(r.took);
    }
    // Bounded by what an open breaker must not wait for: the 300 ms
    // attempt timeout of the LLM (`llm_config`). A tenth of it is far above
    // an open breaker's answer and far below any call that waited.
    let (p50, p99) = percentiles(took);
    assert!(
        p99 < LLM_ATTEMPT_TIMEOUT / 10,
        "open breaker p50 {p50:?} p99 {p99:?}"
    );
    assert_eq!(
        sim_chat_count(&base).await,
        calls_when_opened,
        "no traffic while open"
    );

    // The LLM is back; once the open time is over, one probe closes it.
    set_faults(&base, Value::Null).await;
    tokio::time::sleep_until(opened + Duration::from_millis(2100)).await;
    let r = chat(&c, &levee.url(), "What is the PTO policy?").await;
    assert_eq!(r.status, 200, "the probe succeeds: {}", r.body);
    assert_eq!(
        chat(&c, &levee.url(), "What is the PTO policy?")
            .await
            .status,
        200
    );
    assert_eq!(sim_chat_count(&base).await, calls_when_opened + 2);
}

#[tokio::test]
async fn llm_answering_500s_trips_the_breaker_and_recovers_by_itself() {
    breaker_cycle(
        json!({"error_rate": 1.0, "error_status": 500, "target": "chat"}),
        502,
    )
    .await;
}

#[tokio::test]
async fn hanging_llm_trips_the_breaker_on_attempt_timeouts() {
    breaker_cycle(json!({"hang": true, "target": "chat"}), 504).await;
}

#[tokio::test]
async fn killed_llm_trips_the_breaker_and_a_restart_recovers() {
    let _serial = SERIAL.lock().await;
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let addr = sim.addr();
    let levee = levee_on_sim(&sim, "").await;
    let c = reqwest::Client::new();
    assert_eq!(
        chat(&c, &levee.url(), "What is the PTO policy?")
            .await
            .status,
        200
    );
    sim.shutdown().await.expect("stop sim");
    for _ in 0..3 {
        let r = chat(&c, &levee.url(), "What is the PTO policy?").await;
        assert_eq!(r.status, 502, "connection refused: {}", r.body);
    }
    let opened = Instant::now();
    let r = chat(&c, &levee.url(), "What is the PTO policy?").await;
    assert_eq!(r.status, 503);
    // Restart the LLM on the same address.
    let listener = tokio::net::TcpListener::bind(addr).await.expect("rebind");
    let sim = sim::spawn_on(listener, SimConfig::default()).expect("restart sim");
    tokio::time::sleep_until(opened + Duration::from_millis(2100)).await;
    let r = chat(&c, &levee.url(), "What is the PTO policy?").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        sim_chat_count(&sim.base_url()).await,
        1,
        "exactly one probe"
    );
}

#[tokio::test]
async fn admin_api_forces_and_resets_breakers_behind_its_token() {
    let _serial = SERIAL.lock().await;
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let levee = levee_on_sim(&sim, "").await;
    let c = reqwest::Client::new();
    let admin = format!("{}/admin/breakers", levee.url());
    let unauth = c.get(&admin).send().await.expect("admin");
    assert_eq!(unauth.status(), 401);
    let list: Value = c
        .get(&admin)
        .bearer_auth("test-admin-token")
        .send()
        .await
        .expect("admin")
        .json()
        .await
        .expect("json");
    assert_eq!(list["breakers"][0]["dependency"], "llm");
    assert_eq!(list["breakers"][0]["state"], "closed");

    let forced = c
        .post(format!("{admin}/llm/force_open"))
        .bearer_auth("test-admin-token")
        .send()
        .await
        .expect("force");
    assert_eq!(forced.status(), 200);
    let r = chat(&c, &levee.url(), "What is the PTO policy?").await;
    assert_eq!(r.status, 503);
    assert_eq!(sim_chat_count(&sim.base_url()).await, 0);
    let ready: Value = c
        .get(format!("{}/ready", levee.url()))
        .send()
        .await
        .expect("ready")
        .json()
        .await
        .expect("json");
    assert_eq!(
        ready["dependencies"]["llm"]["breaker"]["state"], "forced_open",
        "{ready}"
    );

    c.post(format!("{admin}/llm/reset"))
        .bearer_auth("test-admin-token")
        .send()
        .await
        .expect("reset");
    assert_eq!(
        chat(&c, &levee.url(), "What is the PTO policy?")
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn vector_store_failure_degrades_or_fails_by_policy() {
    let _serial = SERIAL.lock().await;
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    set_faults(
        &sim.base_url(),
        json!({"error_rate": 1.0, "error_status": 503, "target": "vector"}),
    )
    .await;
    let c = reqwest::Client::new();
    for (policy, status) in [("degrade", 200), ("fail", 502)] {
        let levee = Levee::builder()
            .config_text(&format!(
                "[vector_store]\non_failure = \"{policy}\"\n[resilience.vector_store.retry]\nmax_attempts = 1\n"
            ))
            .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
            .env("LEVEE_VECTOR_STORE_URL", sim.base_url())
            .start()
            .await;
        let r = chat(&c, &levee.url(), "What is the PTO policy?").await;
        assert_eq!(r.status, status, "{policy}: {}", r.body);
        if policy == "degrade" {
            assert_eq!(r.body["metadata"]["degraded"], true);
            assert_eq!(
                r.body["metadata"]["agents_used"],
                json!(["router", "synthesizer"])
            );
            assert_eq!(r.body["metadata"]["sources"], json!([]));
        } else {
            assert_eq!(r.body["error"], "dependency_failed");
        }
    }
}

#[tokio::test]
async fn secondary_llm_answers_when_the_primary_fails() {
    let _serial = SERIAL.lock().await;
    let primary = sim::spawn(SimConfig::default()).await.expect("sim");
    let secondary = sim::spawn(SimConfig::default()).await.expect("sim");
    set_faults(
        &primary.base_url(),
        json!({"error_rate": 1.0, "error_status": 500, "target": "chat"}),
    )
    .await;
    let levee = Levee::builder()
        .config_text(&format!(
            "[llm]\nsecondary_url = \"{}/v1\"\n",
            secondary.base_url()
        ))
        .env("LEVEE_LLM_URL", format!("{}/v1", primary.base_url()))
        .start()
        .await;
    let c = reqwest::Client::new();
    let r = chat(&c, &levee.url(), "What is the PTO policy?").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body["response"]
        .as_str()
        .unwrap_or("")
        .contains("25 days"));
    assert_eq!(sim_chat_count(&secondary.base_url()).await, 1);
}

/// PUBLIC_IP: 10/min shared through Redis; 2 replicas, so 5 per replica
/// while Redis is down. The Redis breaker opens after 3 failures, for 300 ms.
fn redis_config(mode: &str) -> String {
    format!(
        r#"
[ratelimit]
replicas = 2
[ratelimit.tiers.PUBLIC_IP]
limits = [{{ limit = 10, window = "1m" }}]
on_store_failure = "{mode}"
[resilience.redis]
attempt_timeout = "50ms"
deadline = "50ms"
[resilience.redis.breaker]
policy = "consecutive"
consecutive_failures = 3
min_open = "300ms"
max_open = "300ms"
open_jitter = 0.0
half_open_probes = 1
"#
    )
}

#[tokio::test]
async fn killed_redis_fails_open_under_the_local_safety_limit_then_exact_limits_resume() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start().await;
    let levee = Levee::builder()
        .config_text(&redis_config("fail_open"))
        .env("LEVEE_REDIS_URL", redis.url())
        .start()
        .await;
    let c = reqwest::Client::new();
    for _ in 0..3 {
        let r = chat(&c, &levee.url(), "Hello").await;
        assert_eq!((r.status, r.degraded), (200, false));
    }
    redis.kill();
    let mut admitted = 0;
    for _ in 0..20 {
        let r = chat(&c, &levee.url(), "Hello").await;
        assert!(
            r.status == 200 || r.status == 429,
            "{} {}",
            r.status,
            r.body
        );
        assert!(r.degraded, "answers under the local limit are marked");
        if r.status == 200 {
            admitted += 1;
        }
    }
    assert_eq!(
        admitted, 5,
        "the local safety limit (10 / 2 replicas) holds"
    );

    redis.restart().await;
    // Within open time + one probe the exact shared limit is back (the
    // restarted Redis is empty: a fresh window of 10).
    tokio::time::sleep(Duration::from_millis(400)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while chat(&c, &levee.url(), "Hello").await.degraded {
        assert!(Instant::now() < deadline, "exact limits did not resume");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let r = chat(&c, &levee.url(), "Hello").await;
        assert!(!r.degraded);
        statuses.push(r.status);
    }
    assert!(
        statuses.contains(&429),
        "a 429 at the limit again: {statuses:?}"
    );
    let ok = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        ok <= 9,
        "the recovery probe counted once, then the exact limit: {statuses:?}"
    );
}

#[tokio::test]
async fn killed_redis_fails_closed_fast_with_retry_after() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start().await;
    let levee = Levee::builder()
        .config_text(&redis_config("fail_closed"))
        .env("LEVEE_REDIS_URL", redis.url())
        .start()
        .await;
    let c = reqwest::Client::new();
    assert_eq!(chat(&c, &levee.url(), "Hello").await.status, 200);
    redis.kill();
    let mut took = Vec::new();
    for _ in 0..203 {
        let r = chat(&c, &levee.url(), "Hello").await;
        assert_eq!(r.status, 503, "{}", r.body);
        assert_eq!(r.body["error"], "limiter_unavailable");
        assert!(r.retry_after.is_some_and(|s| s >= 1));
        assert!(
            r.took < Duration::from_millis(250),
            "never a long wait: {:?}",
            r.took
        );
        took.push(r.took);
    }
    // The 3 calls that tripped the breaker may each wait up to the 50 ms
    // attempt timeout; every answer after them is the open breaker's.
    let (p50, p99) = percentiles(took.split_off(3));
    assert!(
        p99 < Duration::from_millis(5),
        "fail-closed p50 {p50:?} p99 {p99:?}"
    );
}

#[tokio::test]
async fn frozen_redis_costs_at_most_its_timeout_until_the_breaker_opens() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start().await;
    let levee = Levee::builder()
        .config_text(&redis_config("fail_closed"))
        .env("LEVEE_REDIS_URL", redis.url())
        .start()
        .await;
    let c = reqwest::Client::new();
    assert_eq!(chat(&c, &levee.url(), "Hello").await.status, 200);
    signal(redis.pid(), "STOP");
    let mut replies = Vec::new();
    for _ in 0..100 {
        replies.push(chat(&c, &levee.url(), "Hello").await);
    }
    signal(redis.pid(), "CONT");
    for r in &replies {
        assert_eq!(r.status, 503, "{}", r.body);
        // Never a long Redis wait: at most the 50 ms attempt timeout (plus
        // scheduling slack on a loaded 2-core machine).
        assert!(r.took < Duration::from_millis(250), "took {:?}", r.took);
    }
    let slow = replies
        .iter()
        .filter(|r| r.took >= Duration::from_millis(40))
        .count();
    assert!(
        slow <= 6,
        "only the calls before the breaker opens (and its probes) wait: {slow}"
    );
    let fast: Vec<Duration> = replies[3..].iter().map(|r| r.took).collect();
    let median = {
        let mut f = fast.clone();
        f.sort();
        f[f.len() / 2]
    };
    assert!(
        median < Duration::from_millis(5),
        "median once open: {median:?}"
    );
}
