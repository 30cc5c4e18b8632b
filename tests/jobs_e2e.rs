//! Durable job queues against real redis-server processes, the simulator
//! as the LLM where one is needed, and levee replicas over real HTTP: a
//! burst absorbed and drained at the tenant's rate, a poison job
//! dead-lettered, tenant privacy and idempotency, a 202 that survives
//! Redis being SIGKILLed, and a killed replica's jobs finished by others.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use levee::identity::hash_key;
use levee_chaos::sim::{self, SimConfig};
use serde_json::{json, Value};
use support::levee::{signal, Levee};
use support::redis::RedisServer;
use tokio::time::Instant;

const KEY_A: &str = "jobs_key_a";
const KEY_B: &str = "jobs_key_b";

/// Two tenants; `acme`'s jobs run at `rate` per second (exact: sliding
/// log), at most `max_queued` queued.
fn config(rate: u64, max_queued: u64, extra: &str) -> String {
    format!(
        r#"
[[identity.api_keys]]
id = "a"
sha256 = "{a}"
tenant = "acme"
tier = "JOBS"
[[identity.api_keys]]
id = "b"
sha256 = "{b}"
tenant = "globex"
tier = "JOBS"
[ratelimit.tiers.JOBS]
limits = [{{ limit = {rate}, window = "1s" }}]
[jobs]
max_queued_jobs = {max_queued}
visibility_timeout = "2s"
poll_interval = "10ms"
{extra}
"#,
        a = hash_key(KEY_A),
        b = hash_key(KEY_B),
    )
}

fn chat(n: usize) -> Value {
    json!({"message": format!("What is the PTO policy? ({n})"), "user_id": "u1", "thread_id": format!("t{n}")})
}

async fn submit(
    c: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, Value, reqwest::header::HeaderMap) {
    let mut req = c
        .post(format!("{url}/v1/jobs"))
        .header("x-api-key", key)
        .json(body)
        .timeout(Duration::from_secs(10));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("submit");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, body, headers)
}

async fn get(c: &reqwest::Client, url: &str, key: &str, id: &str) -> (u16, Value) {
    let resp = c
        .get(format!("{url}/v1/jobs/{id}"))
        .header("x-api-key", key)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("get");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Polls every job until all are terminal or `limit` passes; returns the
/// last view of each.
async fn wait_all(
    c: &reqwest::Client,
    urls: &[String],
    key: &str,
    ids: &[String],
    limit: Duration,
) -> HashMap<String, Value> {
    let until = Instant::now() + limit;
    let mut done: HashMap<String, Value> = HashMap::new();
    let mut turn = 0usize;
    while Instant::now() < until && done.len() < ids.len() {
        let open: Vec<&String> = ids.iter().filter(|id| !done.contains_key(*id)).collect();
        for id in open {
            turn += 1;
            let url = &urls[turn % urls.len()];
            let (status, view) = get(c, url, key, id).await;
            let terminal = matches!(
                view["status"].as_str(),
                Some("succeeded" | "failed" | "dead")
            );
            if status == 200 && terminal {
                done.insert(id.clone(), view);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done
}

fn ms(rfc3339: &Value) -> u64 {
    let t = humantime::parse_rfc3339(rfc3339.as_str().expect("a time")).expect("RFC 3339");
    t.duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

#[tokio::test]
async fn a_burst_at_40x_the_rate_is_absorbed_and_drains_at_the_tenants_rate() {
    const RATE: u64 = 5;
    const MAX_QUEUED: u64 = 25;
    let redis = RedisServer::start().await;
    let levee = Levee::builder()
        .config_text(&config(RATE, MAX_QUEUED, ""))
        .env("LEVEE_REDIS_URL", redis.url())
        .start()
        .await;
    let url = levee.url();
    let c = reqwest::Client::new();
    // 40× the rate for 5 s: 200 submissions a second, each on its own task.
    let burst = Duration::from_secs(5);
    let start = Instant::now();
    let mut tasks = Vec::new();
    let mut n = 0usize;
    while start.elapsed() < burst {
        let (c, url) = (c.clone(), url.clone());
        let body = chat(n);
        tasks.push(tokio::spawn(async move {
            submit(&c, &url, KEY_A, &body, &[]).await
        }));
        n += 1;
        tokio::time::sleep_until(start + Duration::from_millis(5 * n as u64)).await;
    }
    let mut accepted = Vec::new();
    let mut full = 0;
    for t in tasks {
        let (status, body, headers) = t.await.expect("joined");
        match status {
            202 => {
                assert!(headers.contains_key("location"), "{headers:?}");
                accepted.push(body["job_id"].as_str().expect("job_id").to_owned());
            }
            429 => {
                assert_eq!(body["error"], "queue_full", "{body}");
                full += 1;
            }
            other => panic!("a submission got {other}: {body}"),
        }
    }
    let burst_end = Instant::now();
    assert_eq!(accepted.len() + full, n);
    assert!(full > 0, "the burst never filled the queue");
    assert!(
        accepted.len() as u64 >= MAX_QUEUED,
        "{} accepted",
        accepted.len()
    );
    // At most MAX_QUEUED are waiting when the burst ends.
    let bound = Duration::from_secs(MAX_QUEUED / RATE) + Duration::from_secs(2);
    let views = wait_all(
        &c,
        std::slice::from_ref(&url),
        KEY_A,
        &accepted,
        bound + Duration::from_secs(10),
    )
    .await;
    let finished_in = burst_end.elapsed();
    assert_eq!(
        views.len(),
        accepted.len(),
        "jobs not finished: {} of {}",
        accepted.len() - views.len(),
        accepted.len()
    );
    for v in views.values() {
        assert_eq!(v["status"], "succeeded", "{v}");
    }
    let last_finish = views
        .values()
        .map(|v| ms(&v["finished_at"]))
        .max()
        .expect("jobs");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let after_burst =
        Duration::from_millis(last_finish.saturating_sub(now_ms - finished_in.as_millis() as u64));
    assert!(
        after_burst <= bound,
        "last job finished {after_burst:?} after the burst; bound {bound:?}"
    );
    // Processing at no more than the tenant's rate: in any second, at most
    // RATE jobs started (one more for the gap between admission and start).
    let mut starts: Vec<u64> = views.values().map(|v| ms(&v["started_at"])).collect();
    starts.sort_unstable();
    let mut worst = 0;
    for (i, &s) in starts.iter().enumerate() {
        let in_window = starts[i..].iter().take_while(|&&t| t < s + 1000).count();
        worst = worst.max(in_window);
    }
    assert!(
        worst as u64 <= RATE + 1,
        "{worst} jobs started within one second; rate {RATE}/s"
    );
    // Over the whole drain: beyond the first window's allowance, no more
    // than RATE a second.
    let span = (starts[starts.len() - 1] - starts[0]) as f64 / 1000.0;
    let observed = (starts.len() as f64 - RATE as f64) / span;
    assert!(
        observed <= RATE as f64 * 1.05,
        "processed at {observed:.2}/s, rate {RATE}/s"
    );
    eprintln!(
        "burst: {n} submitted, {} accepted, {full} queue_full; {worst} max starts/s, {observed:.2}/s overall; last finished {after_burst:?} after the burst (bound {bound:?})",
        accepted.len()
    );
}

#[tokio::test]
async fn a_poison_job_ends_dead_after_max_deliveries_with_its_last_error() {
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let c = reqwest::Client::new();
    c.post(format!("{}/_faults", sim.base_url()))
        .json(&json!({"error_rate": 1.0, "error_status": 500, "target": "chat"}))
        .send()
        .await
        .expect("faults");
    let redis = RedisServer::start().await;
    let extra = "max_deliveries = 3\n[resilience.llm.retry]\nmax_attempts = 1\n[resilience.llm.breaker]\nenabled = false\n";
    let levee = Levee::builder()
        .config_text(&config(100, 100, extra))
        .env("LEVEE_REDIS_URL", redis.url())
        .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
        .start()
        .await;
    let url = levee.url();
    let (status, body, _) = submit(&c, &url, KEY_A, &chat(1), &[]).await;
    assert_eq!(status, 202, "{body}");
    let id = body["job_id"].as_str().expect("id").to_owned();
    let views = wait_all(
        &c,
        std::slice::from_ref(&url),
        KEY_A,
        std::slice::from_ref(&id),
        Duration::from_secs(20),
    )
    .await;
    let view = &views[&id];
    assert_eq!(view["status"], "dead", "{view}");
    assert_eq!(view["attempts"], 3, "{view}");
    assert!(
        view["error"].as_str().is_some_and(|e| e.contains("500")),
        "{view}"
    );
    assert!(view.get("result").is_none(), "{view}");
    let stats: Value = c
        .get(format!("{}/_stats", sim.base_url()))
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    assert_eq!(
        stats["requests"]["chat"], 3,
        "one LLM call per delivery: {stats}"
    );
}

#[tokio::test]
async fn jobs_are_private_to_their_tenant_idempotent_and_bad_bodies_are_never_queued() {
    let redis = RedisServer::start().await;
    let levee = Levee::builder()
        .config_text(&config(100, 100, ""))
        .env("LEVEE_REDIS_URL", redis.url())
        .start()
        .await;
    let url = levee.url();
    let c = reqwest::Client::new();
    let ready: Value = c
        .get(format!("{url}/ready"))
        .send()
        .await
        .expect("ready")
        .json()
        .await
        .expect("json");
    assert_eq!(ready["jobs"], json!({"kind": "redis", "durable": true}));

    let idem = [("idempotency-key", "order-42")];
    let (s1, b1, _) = submit(&c, &url, KEY_A, &chat(1), &idem).await;
    let (s2, b2, _) = submit(&c, &url, KEY_A, &chat(2), &idem).await;
    assert_eq!((s1, s2), (202, 202), "{b1} {b2}");
    assert_eq!(b1["job_id"], b2["job_id"], "a repeat returns the same job");
    let id = b1["job_id"].as_str().expect("id").to_owned();
    // The same key from another tenant is another job.
    let (_, b3, _) = submit(&c, &url, KEY_B, &chat(1), &idem).await;
    assert_ne!(b3["job_id"], b1["job_id"]);

    let views = wait_all(
        &c,
        std::slice::from_ref(&url),
        KEY_A,
        std::slice::from_ref(&id),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(views[&id]["status"], "succeeded");
    assert!(views[&id]["result"]["response"]
        .as_str()
        .is_some_and(|r| r.contains("PTO")));
    let (status, body) = get(&c, &url, KEY_B, &id).await;
    assert_eq!(status, 404, "another tenant must not see it: {body}");
    let (status, _) = get(&c, &url, KEY_A, "job_0000").await;
    assert_eq!(status, 404);

    // Bad input: 422 (or 401 without a key), and nothing queued.
    let stream = "levee:jobs:{acme}:stream";
    let mut conn = redis.conn();
    let before: u64 = redis::cmd("XLEN")
        .arg(stream)
        .query(&mut conn)
        .expect("xlen");
    let (status, body, _) = submit(&c, &url, KEY_A, &json!({"message": 5}), &[]).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["field"], "message");
    let resp = c
        .post(format!("{url}/v1/jobs"))
        .header("x-api-key", KEY_A)
        .header("content-type", "application/json")
        .body("{\"message\":")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 400);
    let resp = c
        .post(format!("{url}/v1/jobs"))
        .json(&chat(9))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 401, "jobs need a key");
    let after: u64 = redis::cmd("XLEN")
        .arg(stream)
        .query(&mut conn)
        .expect("xlen");
    assert_eq!(after, before, "a refused submission is never queued");
    // No secret in a key name: the idempotency key is stored hashed.
    assert!(redis
        .keys()
        .iter()
        .all(|k| !k.contains("order-42") && !k.contains(KEY_A)));
}

#[tokio::test]
async fn a_202_survives_redis_being_killed_and_nothing_is_accepted_while_it_is_down() {
    let dir = std::env::temp_dir().join(format!("levee-jobs-aof-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut redis = RedisServer::start_durable(dir.clone()).await;
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let c = reqwest::Client::new();
    // The LLM hangs: accepted jobs stay queued or running while Redis dies.
    c.post(format!("{}/_faults", sim.base_url()))
        .json(&json!({"hang": true, "target": "chat"}))
        .send()
        .await
        .expect("faults");
    let extra =
        "store_timeout = \"1s\"\n[resilience.llm]\nattempt_timeout = \"20s\"\ndeadline = \"30s\"\n";
    let levee = Levee::builder()
        .config_text(&config(100, 100, extra))
        .env("LEVEE_REDIS_URL", redis.url())
        .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
        .start()
        .await;
    let url = levee.url();
    let mut accepted = Vec::new();
    for n in 0..30 {
        let (status, body, _) = submit(&c, &url, KEY_A, &chat(n), &[]).await;
        assert_eq!(status, 202, "{body}");
        accepted.push(body["job_id"].as_str().expect("id").to_owned());
    }
    redis.kill();
    // Down: refused fast, never accepted.
    let started = Instant::now();
    let (status, body, headers) = submit(&c, &url, KEY_A, &chat(99), &[]).await;
    let took = started.elapsed();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "job_store_unavailable");
    assert!(headers.contains_key("retry-after"));
    assert!(took < Duration::from_secs(5), "refusal took {took:?}");
    redis.restart().await;
    // Every job accepted before the kill is still there and completes.
    c.delete(format!("{}/_faults", sim.base_url()))
        .send()
        .await
        .expect("clear");
    let views = wait_all(
        &c,
        std::slice::from_ref(&url),
        KEY_A,
        &accepted,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        views.len(),
        accepted.len(),
        "lost or unfinished: {}",
        accepted.len() - views.len()
    );
    for v in views.values() {
        assert_eq!(v["status"], "succeeded", "{v}");
    }
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_killed_replicas_jobs_complete_on_the_others_with_one_result_each() {
    let redis = RedisServer::start().await;
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let c = reqwest::Client::new();
    // Slow answers, so the replica dies holding jobs.
    c.post(format!("{}/_faults", sim.base_url()))
        .json(&json!({"latency_ms": 1500, "target": "chat"}))
        .send()
        .await
        .expect("faults");
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(
            Levee::builder()
                .config_text(&config(1000, 1000, "workers = 4\n"))
                .env("LEVEE_REDIS_URL", redis.url())
                .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
                .start()
                .await,
        );
    }
    let urls: Vec<String> = replicas.iter().map(Levee::url).collect();
    let mut accepted = Vec::new();
    for n in 0..30 {
        let (status, body, _) = submit(&c, &urls[n % 3], KEY_A, &chat(n), &[]).await;
        assert_eq!(status, 202, "{body}");
        accepted.push(body["job_id"].as_str().expect("id").to_owned());
    }
    // Let every replica find the tenant (workers list tenants every
    // second) and take jobs, then kill one mid-answer.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let killed = replicas.remove(2);
    signal(killed.pid(), "KILL");
    let survivors: Vec<String> = replicas.iter().map(Levee::url).collect();
    let views = wait_all(&c, &survivors, KEY_A, &accepted, Duration::from_secs(30)).await;
    assert_eq!(
        views.len(),
        accepted.len(),
        "lost: {}",
        accepted.len() - views.len()
    );
    for v in views.values() {
        assert_eq!(v["status"], "succeeded", "{v}");
    }
    let redelivered = views
        .values()
        .filter(|v| v["attempts"].as_u64() > Some(1))
        .count();
    assert!(
        redelivered > 0,
        "the killed replica held no job: the test proved nothing"
    );
    // One result each: what a second delivery computed was not stored over
    // the first (results are first-wins), and every job has exactly one.
    let mut conn = redis.conn();
    for id in &accepted {
        let key = format!("levee:jobs:{{acme}}:job:{id}");
        let status: String = redis::cmd("HGET")
            .arg(&key)
            .arg("status")
            .query(&mut conn)
            .expect("hget");
        assert_eq!(status, "succeeded");
    }
    let stream_len: u64 = redis::cmd("XLEN")
        .arg("levee:jobs:{acme}:stream")
        .query(&mut conn)
        .expect("xlen");
    assert_eq!(stream_len, 0, "every delivery acknowledged and removed");
    eprintln!(
        "replica kill: {} jobs, {redelivered} redelivered, 0 lost",
        accepted.len()
    );
    drop(killed);
}

#[tokio::test]
async fn with_redis_down_a_fail_open_tier_is_answered_now_and_jobs_are_never_accepted() {
    let mut redis = RedisServer::start().await;
    let extra = "[ratelimit.tiers.CLOSED]\nlimits = [{ limit = 100, window = \"1s\" }]\non_store_failure = \"fail_closed\"\n[[identity.api_keys]]\nid = \"c\"\nsha256 = \"".to_owned()
        + &hash_key("jobs_key_closed")
        + "\"\ntenant = \"initech\"\ntier = \"CLOSED\"\n";
    let levee = Levee::builder()
        .config_text(&(config(100, 100, "") + &extra))
        .env("LEVEE_REDIS_URL", redis.url())
        .start()
        .await;
    let url = levee.url();
    let c = reqwest::Client::new();
    redis.kill();
    let prefer = [("prefer", "respond-async")];
    // The job API itself never accepts what it cannot write.
    let (status, body, _) = submit(&c, &url, KEY_A, &chat(1), &[]).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "job_store_unavailable");
    // A respond-async chat of a fail-open tier is answered synchronously
    // (RFC 7240: the preference is not applied), under the limiter's
    // local safety limit.
    let resp = c
        .post(format!("{url}/v1/chat"))
        .header("x-api-key", KEY_A)
        .header(prefer[0].0, prefer[0].1)
        .json(&chat(2))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("preference-applied").is_none());
    assert_eq!(resp.headers()["x-ratelimit-degraded"], "true");
    let answer: Value = resp.json().await.expect("json");
    assert!(
        answer["response"]
            .as_str()
            .is_some_and(|r| r.contains("PTO")),
        "{answer}"
    );
    // A fail-closed tier is refused.
    let resp = c
        .post(format!("{url}/v1/chat"))
        .header("x-api-key", "jobs_key_closed")
        .header(prefer[0].0, prefer[0].1)
        .json(&chat(3))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 503);
}

#[tokio::test]
async fn a_callback_is_retried_until_delivered_and_a_dead_one_leaves_the_result_fetchable() {
    use std::sync::{Arc, Mutex};
    // A receiver that refuses the first delivery and keeps what it gets.
    let got: Arc<Mutex<Vec<Value>>> = Arc::default();
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let app = {
        let (got, calls) = (got.clone(), calls.clone());
        axum::Router::new().route(
            "/hook",
            axum::routing::post(move |axum::Json(v): axum::Json<Value>| {
                let (got, calls) = (got.clone(), calls.clone());
                async move {
                    if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                        return axum::http::StatusCode::INTERNAL_SERVER_ERROR;
                    }
                    got.lock().expect("lock").push(v);
                    axum::http::StatusCode::OK
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let hook = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    // In process this time: the same semantics without Redis.
    let levee = Levee::builder()
        .config_text(&config(100, 100, "callback_attempts = 3\n"))
        .start()
        .await;
    let url = levee.url();
    let c = reqwest::Client::new();
    let ready: Value = c
        .get(format!("{url}/ready"))
        .send()
        .await
        .expect("ready")
        .json()
        .await
        .expect("json");
    assert_eq!(ready["jobs"], json!({"kind": "memory", "durable": false}));
    let (status, body, _) = submit(
        &c,
        &url,
        KEY_A,
        &chat(1),
        &[("callback-url", hook.as_str())],
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let id = body["job_id"].as_str().expect("id").to_owned();
    let delivered = async {
        for _ in 0..100 {
            if !got.lock().expect("lock").is_empty() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }
    .await;
    assert!(delivered, "callback never delivered");
    let view = got.lock().expect("lock")[0].clone();
    assert_eq!(view["job_id"], id.as_str());
    assert_eq!(view["status"], "succeeded");
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "one refused, one delivered"
    );
    server.abort();

    // A callback nobody answers: the result is still there.
    let dead = format!("http://127.0.0.1:{}/hook", support::redis::free_port());
    let (_, body, _) = submit(
        &c,
        &url,
        KEY_A,
        &chat(2),
        &[("callback-url", dead.as_str())],
    )
    .await;
    let id = body["job_id"].as_str().expect("id").to_owned();
    let views = wait_all(
        &c,
        std::slice::from_ref(&url),
        KEY_A,
        std::slice::from_ref(&id),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(views[&id]["status"], "succeeded");
    let (status, body, _) = submit(&c, &url, KEY_A, &chat(3), &[("callback-url", "ftp://x")]).await;
    assert_eq!(status, 422, "{body}");
}
