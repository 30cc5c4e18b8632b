//! The chat conversation end to end over real sockets: the levee binary on
//! embedded defaults, on the real OpenAI / Qdrant clients against
//! `levee-upstream-sim`, and with conversation memory in a real Redis.

mod support;

use std::time::Duration;

use levee_chaos::sim::{self, SimConfig};
use serde_json::{json, Value};
use support::levee::{check_config, Levee};
use support::redis::RedisServer;

async fn chat(client: &reqwest::Client, base: &str, body: Value) -> (u16, Value) {
    let resp = client
        .post(format!("{base}/v1/chat"))
        .json(&body)
        .send()
        .await
        .expect("send chat");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("json body"))
}

fn question(message: &str) -> Value {
    json!({"message": message, "user_id": "user_1", "thread_id": "thread_99"})
}

/// The PTO conversation of the README; returns both answers.
async fn pto_conversation(base: &str) -> (Value, Value) {
    let client = reqwest::Client::new();
    let (status, first) = chat(&client, base, question("What is the PTO policy?")).await;
    assert_eq!(status, 200, "{first}");
    let (status, second) = chat(&client, base, question("Can I rollover more than 5 days?")).await;
    assert_eq!(status, 200, "{second}");
    (first, second)
}

fn assert_pto_conversation(first: &Value, second: &Value) {
    let a1 = first["response"].as_str().expect("response");
    assert!(
        a1.contains("25 days"),
        "first answer must state 25 days: {a1}"
    );
    assert_eq!(first["thread_id"], "thread_99");
    assert_eq!(first["metadata"]["user_id"], "user_1");
    assert_eq!(
        first["metadata"]["agents_used"],
        json!(["router", "retriever", "synthesizer"])
    );
    assert_eq!(first["metadata"]["sources"][0]["id"], "hr-pto");
    assert_eq!(first["metadata"]["degraded"], false);

    let a2 = second["response"].as_str().expect("response");
    // The follow-up is answered from the policy, and with the conversation:
    // the answer names the earlier question, which only the history holds.
    assert!(
        a2.contains("5 days"),
        "follow-up must address rollover: {a2}"
    );
    assert!(
        a2.contains("What is the PTO policy?"),
        "follow-up must use the conversation: {a2}"
    );
    assert_eq!(second["metadata"]["history_turns"], 2);
}

#[tokio::test]
async fn embedded_defaults_answer_the_pto_conversation() {
    let levee = Levee::start().await;
    let (first, second) = pto_conversation(&levee.url()).await;
    assert_pto_conversation(&first, &second);
    // The built-in answerer leads a follow-up with the most relevant sentence.
    let a2 = second["response"].as_str().expect("response");
    assert!(a2.contains("Rollover is permitted up to 5 days"), "{a2}");
}

#[tokio::test]
async fn real_llm_and_qdrant_clients_answer_the_pto_conversation() {
    let sim = sim::spawn(SimConfig::default()).await.expect("spawn sim");
    let levee = Levee::builder()
        .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
        .env("LEVEE_VECTOR_STORE_URL", sim.base_url())
        .start()
        .await;
    let (first, second) = pto_conversation(&levee.url()).await;
    assert_pto_conversation(&first, &second);
    // Token usage comes from the LLM's response.
    assert!(first["metadata"]["usage"]["prompt_tokens"].as_u64() > Some(0));

    let stats: Value = reqwest::get(format!("{}/_stats", sim.base_url()))
        .await
        .expect("stats")
        .json()
        .await
        .expect("stats json");
    // Two questions: two embeddings, two searches, two completions.
    assert_eq!(stats["requests"]["chat"], 2, "{stats}");
    assert_eq!(stats["requests"]["embeddings"], 2, "{stats}");
    assert_eq!(stats["requests"]["vector"], 2, "{stats}");

    let ready: Value = reqwest::get(format!("{}/ready", levee.url()))
        .await
        .expect("ready")
        .json()
        .await
        .expect("ready json");
    assert_eq!(ready["dependencies"]["llm"]["kind"], "openai");
    assert_eq!(ready["dependencies"]["llm"]["state"], "up");
    assert_eq!(ready["dependencies"]["vector_store"]["state"], "up");
}

#[tokio::test]
async fn failing_llm_is_a_json_502_and_the_gateway_keeps_serving() {
    let sim = sim::spawn(SimConfig::default()).await.expect("spawn sim");
    let levee = Levee::builder()
        .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
        .start()
        .await;
    let client = reqwest::Client::new();
    client
        .post(format!("{}/_faults", sim.base_url()))
        .json(&json!({"error_rate": 1.0, "error_status": 500, "target": "chat"}))
        .send()
        .await
        .expect("set faults");
    let (status, body) = chat(&client, &levee.url(), question("What is the PTO policy?")).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"], "dependency_failed");
    assert!(
        body["message"].as_str().unwrap_or("").contains("llm"),
        "{body}"
    );

    client
        .delete(format!("{}/_faults", sim.base_url()))
        .send()
        .await
        .expect("clear faults");
    let (status, _) = chat(&client, &levee.url(), question("What is the PTO policy?")).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn conversations_live_in_redis_and_are_shared_by_replicas() {
    let redis = RedisServer::start().await;
    let a = Levee::builder()
        .env("LEVEE_REDIS_URL", redis.url())
        .start()
        .await;
    let b = Levee::builder()
        .env("LEVEE_REDIS_URL", redis.url())
        .start()
        .await;
    let client = reqwest::Client::new();
    let (s1, _) = chat(&client, &a.url(), question("What is the PTO policy?")).await;
    assert_eq!(s1, 200);
    // The follow-up goes to the other replica and still sees the thread.
    let (s2, second) = chat(
        &client,
        &b.url(),
        question("Can I rollover more than 5 days?"),
    )
    .await;
    assert_eq!(s2, 200);
    assert_eq!(second["metadata"]["history_turns"], 2, "{second}");
    assert_eq!(second["metadata"]["degraded"], false);

    let keys: Vec<String> = redis
        .keys()
        .into_iter()
        .filter(|k| k.starts_with("levee:mem:"))
        .collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(keys[0].starts_with("levee:mem:"), "{keys:?}");
    // Thread and user ids are hashed, never raw key names.
    assert!(!keys[0].contains("thread_99") && !keys[0].contains("user_1"));
    let ttl: i64 = ::redis::cmd("TTL")
        .arg(&keys[0])
        .query(&mut redis.conn())
        .expect("TTL");
    assert!(
        ttl > 0 && ttl <= 3600,
        "memory key must expire, ttl = {ttl}"
    );
}

#[tokio::test]
async fn dead_redis_degrades_memory_but_still_answers() {
    let port = support::redis::free_port();
    let levee = Levee::builder()
        .env("LEVEE_REDIS_URL", format!("redis://127.0.0.1:{port}/"))
        .start()
        .await;
    let client = reqwest::Client::new();
    let started = tokio::time::Instant::now();
    let (status, body) = chat(&client, &levee.url(), question("What is the PTO policy?")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["metadata"]["degraded"], true);
    assert!(body["response"].as_str().unwrap_or("").contains("25 days"));
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests_then_exits() {
    let sim = sim::spawn(SimConfig::default()).await.expect("spawn sim");
    let mut levee = Levee::builder()
        .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
        .start()
        .await;
    let client = reqwest::Client::new();
    client
        .post(format!("{}/_faults", sim.base_url()))
        .json(&json!({"latency_ms": 800, "target": "chat"}))
        .send()
        .await
        .expect("set faults");
    let url = levee.url();
    let in_flight = tokio::spawn(async move {
        chat(
            &reqwest::Client::new(),
            &url,
            question("What is the PTO policy?"),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    levee.terminate();
    let (status, body) = in_flight.await.expect("join");
    assert_eq!(status, 200, "the in-flight request completes: {body}");
    let exit = levee.wait_exit(Duration::from_secs(5)).await;
    assert!(
        exit.is_some_and(|s| s.success()),
        "levee exits cleanly: {exit:?}"
    );
}

#[test]
fn check_config_names_the_bad_key() {
    let dir = std::env::temp_dir();
    let bad = dir.join(format!("levee-bad-{}.toml", std::process::id()));
    std::fs::write(&bad, "[vector_store]\ntop_k = 0\n").expect("write");
    let (ok, stderr) = check_config(&bad);
    assert!(!ok);
    assert!(
        stderr.contains("vector_store.top_k") && stderr.contains('0'),
        "{stderr}"
    );

    std::fs::write(&bad, "[resilience.llm]\nattempt_timeout = \"soon\"\n").expect("write");
    let (ok, stderr) = check_config(&bad);
    assert!(!ok);
    assert!(
        stderr.contains("resilience.llm.attempt_timeout"),
        "{stderr}"
    );

    let good = dir.join(format!("levee-good-{}.toml", std::process::id()));
    std::fs::write(&good, "[server]\nlisten = \"127.0.0.1:0\"\n").expect("write");
    let (ok, stderr) = check_config(&good);
    assert!(ok, "{stderr}");
    let _ = std::fs::remove_file(bad);
    let _ = std::fs::remove_file(good);
}
