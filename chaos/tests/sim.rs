//! The upstream simulator over real sockets: OpenAI and Qdrant wire formats,
//! every fault kind, stats, and the binary's stdout contract.

use std::time::Duration;

use levee_chaos::sim::{
    self, FaultSpec, FaultTarget, LlmCapacity, SimConfig, SimHandle, LISTENING_PREFIX,
};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use tokio::time::Instant;

const CONTEXT: &str = "Rollover is permitted up to 5 days. Laptops are replaced every 3 years.";

async fn start() -> SimHandle {
    sim::spawn(SimConfig::default()).await.expect("sim starts")
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client builds")
}

async fn post(sim: &SimHandle, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("{}{path}", sim.base_url()))
        .json(body)
        .send()
        .await
        .expect("request is answered")
}

async fn get_json(sim: &SimHandle, path: &str) -> Value {
    client()
        .get(format!("{}{path}", sim.base_url()))
        .send()
        .await
        .expect("request is answered")
        .json()
        .await
        .expect("json body")
}

async fn set_faults(sim: &SimHandle, spec: &FaultSpec) {
    let response = client()
        .post(format!("{}/_faults", sim.base_url()))
        .json(spec)
        .send()
        .await
        .expect("faults accepted");
    assert_eq!(response.status(), StatusCode::OK);
}

fn chat_request(question: &str) -> Value {
    json!({
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": CONTEXT},
            {"role": "user", "content": question},
        ],
    })
}

async fn embedding(sim: &SimHandle, text: &str) -> Value {
    let body: Value = post(sim, "/v1/embeddings", &json!({"input": text, "model": "e"}))
        .await
        .json()
        .await
        .expect("json body");
    body["data"][0]["embedding"].clone()
}

/// `data:` payloads of an SSE body, in order.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn chat_answers_with_the_overlapping_sentence_and_counts_words() {
    let sim = start().await;
    let response = post(
        &sim,
        "/v1/chat/completions",
        &chat_request("Can I rollover unused days?"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("json body");

    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "gpt-test");
    assert!(body["id"]
        .as_str()
        .expect("id")
        .starts_with("chatcmpl-sim-"));
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Rollover is permitted up to 5 days."
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    // 13 context words + 5 question words; 7 answer words.
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 18, "completion_tokens": 7, "total_tokens": 25})
    );
}

#[tokio::test]
async fn chat_without_overlap_admits_it_does_not_know() {
    let sim = start().await;
    let body: Value = post(
        &sim,
        "/v1/chat/completions",
        &chat_request("Who won the match?"),
    )
    .await
    .json()
    .await
    .expect("json body");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "I don't know based on the provided context."
    );
}

#[tokio::test]
async fn chat_with_history_names_the_previous_question() {
    let sim = start().await;
    let request = json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": CONTEXT},
            {"role": "user", "content": "What about laptops? I need one."},
            {"role": "assistant", "content": "Laptops are replaced every 3 years."},
            {"role": "user", "content": "How often are laptops replaced?"},
        ],
    });
    let body: Value = post(&sim, "/v1/chat/completions", &request)
        .await
        .json()
        .await
        .expect("json body");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "Following up on \"What about laptops?\": Laptops are replaced every 3 years."
    );
}

#[tokio::test]
async fn chat_rejects_bad_requests_in_openai_error_shape() {
    let sim = start().await;
    for request in [
        json!({"model": "m"}),
        json!({"model": "m", "messages": [{"role": "system", "content": CONTEXT}]}),
    ] {
        let response = post(&sim, "/v1/chat/completions", &request).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body: Value = response.json().await.expect("json body");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(body["error"]["message"].is_string());
        assert_eq!(body["error"]["param"], Value::Null);
        assert_eq!(body["error"]["code"], Value::Null);
    }
}

#[tokio::test]
async fn streamed_chat_reassembles_to_the_same_answer_with_usage_and_done() {
    let sim = start().await;
    let mut request = chat_request("Can I rollover unused days?");
    request["stream"] = json!(true);
    request["stream_options"] = json!({"include_usage": true});
    let response = post(&sim, "/v1/chat/completions", &request).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"].to_str().expect("ascii"),
        "text/event-stream"
    );
    let data = sse_data(&response.text().await.expect("body"));

    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk is json"))
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    // role chunk + 7 words + stop chunk + usage chunk
    assert_eq!(chunks.len(), 10);
    let text: String = chunks[1..8]
        .iter()
        .map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .expect("content")
        })
        .collect();
    assert_eq!(text, "Rollover is permitted up to 5 days.");
    assert_eq!(chunks[8]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[8]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[9]["choices"], json!([]));
    assert_eq!(
        chunks[9]["usage"],
        json!({"prompt_tokens": 18, "completion_tokens": 7, "total_tokens": 25})
    );
}

#[tokio::test]
async fn stream_chunk_delay_spaces_out_the_chunks() {
    let sim = start().await;
    set_faults(
        &sim,
        &FaultSpec {
            stream_chunk_delay_ms: Some(30),
            target: FaultTarget::Chat,
            ..FaultSpec::default()
        },
    )
    .await;
    let mut request = chat_request("Can I rollover unused days?");
    request["stream"] = json!(true);
    let started = Instant::now();
    let body = post(&sim, "/v1/chat/completions", &request)
        .await
        .text()
        .await
        .expect("body");
    // 10 frames (role, 7 words, stop, [DONE]) -> 9 gaps of 30 ms.
    assert_eq!(sse_data(&body).len(), 10);
    assert!(
        started.elapsed() >= Duration::from_millis(270),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn embeddings_are_unit_vectors_and_deterministic() {
    let sim = sim::spawn(SimConfig {
        dim: 16,
        ..SimConfig::default()
    })
    .await
    .expect("sim starts");
    let request = json!({
        "model": "text-embedding-3-small",
        "input": ["What is the PTO policy?", "What is the PTO policy?", "a of it"],
    });
    let body: Value = post(&sim, "/v1/embeddings", &request)
        .await
        .json()
        .await
        .expect("json");

    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], "text-embedding-3-small");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 13, "total_tokens": 13})
    );
    let vectors: Vec<Vec<f32>> = (0..3)
        .map(|i| {
            assert_eq!(body["data"][i]["object"], "embedding");
            assert_eq!(body["data"][i]["index"], i);
            serde_json::from_value(body["data"][i]["embedding"].clone()).expect("floats")
        })
        .collect();
    assert!(vectors.iter().all(|v| v.len() == 16));
    assert_eq!(vectors[0], vectors[1]);
    assert_eq!(vectors[0], sim::embed("What is the PTO policy?", 16));
    let norm: f32 = vectors[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    assert!(vectors[2].iter().all(|&x| x == 0.0));
}

#[tokio::test]
async fn search_ranks_the_pto_policy_first_for_both_pto_questions() {
    let sim = start().await;
    for question in [
        "What is the PTO policy?",
        "Can I rollover more than 5 days?",
    ] {
        let vector = embedding(&sim, question).await;
        let response = post(
            &sim,
            "/collections/acme_kb/points/search",
            &json!({"vector": vector, "limit": 3, "with_payload": true}),
        )
        .await;
        assert_eq!(response.status(), StatusCode::OK);
        let body: Value = response.json().await.expect("json body");
        assert_eq!(body["status"], "ok");
        let hits = body["result"].as_array().expect("result array");
        assert!(!hits.is_empty() && hits.len() <= 3);
        assert_eq!(
            hits[0]["payload"]["doc_id"], "hr-pto",
            "{question}: {hits:?}"
        );
        assert_eq!(hits[0]["id"], 1);
        assert_eq!(hits[0]["payload"]["source"], "acme/hr/pto-policy.md");
        let scores: Vec<f64> = hits
            .iter()
            .map(|h| h["score"].as_f64().expect("score"))
            .collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
        assert!(scores.iter().all(|&s| s > 0.0));
    }
}

#[tokio::test]
async fn search_without_payload_and_with_threshold() {
    let sim = start().await;
    let vector = embedding(&sim, "What is the PTO policy?").await;
    let body: Value = post(
        &sim,
        "/collections/acme_kb/points/search",
        &json!({"vector": vector, "limit": 10, "with_payload": false, "score_threshold": 0.99}),
    )
    .await
    .json()
    .await
    .expect("json body");
    let hits = body["result"].as_array().expect("result array");
    assert!(hits.is_empty(), "{hits:?}");

    let body: Value = post(
        &sim,
        "/collections/acme_kb/points/search",
        &json!({"vector": vector, "limit": 1}),
    )
    .await
    .json()
    .await
    .expect("json body");
    assert_eq!(body["result"][0]["id"], 1);
    assert!(body["result"][0].get("payload").is_none());
}

#[tokio::test]
async fn unknown_collection_and_wrong_dimension_answer_in_qdrant_shape() {
    let sim = start().await;
    let response = post(
        &sim,
        "/collections/nope/points/search",
        &json!({"vector": [1.0, 0.0], "limit": 3}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let body: Value = response.json().await.expect("json body");
    assert_eq!(
        body["status"]["error"],
        "Not found: Collection `nope` doesn't exist!"
    );

    let response = post(
        &sim,
        "/collections/acme_kb/points/search",
        &json!({"vector": [1.0, 0.0], "limit": 3}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.expect("json body");
    let message = body["status"]["error"].as_str().expect("message");
    assert!(message.contains("expected dim: 64, got 2"), "{message}");
}

#[tokio::test]
async fn upsert_creates_a_searchable_collection() {
    let sim = start().await;
    let response = client()
        .put(format!("{}/collections/notes/points", sim.base_url()))
        .json(&json!({"points": [
            {"id": 7, "vector": [1.0, 0.0, 0.0], "payload": {"text": "x"}},
            {"id": "5c56c793-69f3-4fbf-87e6-c4bf54c28c26", "vector": [0.0, 1.0, 0.0]},
        ]}))
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.expect("json body");
    assert_eq!(body["result"]["status"], "completed");
    assert_eq!(body["status"], "ok");

    let info = get_json(&sim, "/collections/notes").await;
    assert_eq!(info["result"]["status"], "green");
    assert_eq!(info["result"]["points_count"], 2);
    let kb = get_json(&sim, "/collections/acme_kb").await;
    assert_eq!(kb["result"]["points_count"], 8);

    let body: Value = post(
        &sim,
        "/collections/notes/points/search",
        &json!({"vector": [0.9, 0.1, 0.0], "limit": 5, "with_payload": true}),
    )
    .await
    .json()
    .await
    .expect("json body");
    assert_eq!(body["result"][0]["id"], 7);
    assert_eq!(body["result"][0]["payload"]["text"], "x");
    assert_eq!(
        body["result"][1]["id"],
        "5c56c793-69f3-4fbf-87e6-c4bf54c28c26"
    );
}

#[tokio::test]
async fn latency_fault_delays_only_its_target() {
    let sim = start().await;
    set_faults(
        &sim,
        &FaultSpec {
            latency_ms: Some(300),
            target: FaultTarget::Embeddings,
            ..FaultSpec::default()
        },
    )
    .await;
    let started = Instant::now();
    let response = post(&sim, "/v1/embeddings", &json!({"input": "pto"})).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let response = post(&sim, "/v1/chat/completions", &chat_request("laptops?")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn error_rate_half_fails_exactly_every_other_request() {
    let sim = start().await;
    set_faults(
        &sim,
        &FaultSpec {
            error_rate: Some(0.5),
            error_status: Some(503),
            retry_after_s: Some(7),
            ..FaultSpec::default()
        },
    )
    .await;
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let response = post(&sim, "/v1/chat/completions", &chat_request("laptops?")).await;
        let status = response.status();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(response.headers()["retry-after"], "7");
            let body: Value = response.json().await.expect("json body");
            assert_eq!(body["error"]["type"], "server_error");
        }
        statuses.push(status.as_u16());
    }
    assert_eq!(statuses, [200, 503].repeat(5));

    // The vector store fails in Qdrant's shape.
    let response = post(
        &sim,
        "/collections/acme_kb/points/search",
        &json!({"vector": vec![0.0_f32; 64]}),
    )
    .await;
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "first vector request passes"
    );
    let response = post(
        &sim,
        "/collections/acme_kb/points/search",
        &json!({"vector": vec![0.0_f32; 64]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = response.json().await.expect("json body");
    assert!(body["status"]["error"].is_string());

    let stats = get_json(&sim, "/_stats").await;
    assert_eq!(stats["requests"]["chat"], 10);
    assert_eq!(stats["requests"]["vector"], 2);
    assert_eq!(stats["faulted"]["errors"], 6);
}

#[tokio::test]
async fn hang_fault_outlasts_a_client_timeout() {
    let sim = start().await;
    set_faults(
        &sim,
        &FaultSpec {
            hang: true,
            ..FaultSpec::default()
        },
    )
    .await;
    let impatient = Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client builds");
    let started = Instant::now();
    let err = impatient
        .post(format!("{}/v1/embeddings", sim.base_url()))
        .json(&json!({"input": "pto"}))
        .send()
        .await
        .expect_err("a hung request never answers");
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(get_json(&sim, "/_stats").await["faulted"]["hangs"], 1);
}

#[tokio::test]
async fn hung_requests_are_released_when_faults_are_cleared() {
    let sim = start().await;
    set_faults(
        &sim,
        &FaultSpec {
            hang: true,
            ..FaultSpec::default()
        },
    )
    .await;
    let url = format!("{}/v1/embeddings", sim.base_url());
    let hung = tokio::spawn(async move {
        client()
            .post(url)
            .json(&json!({"input": "pto"}))
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    client()
        .delete(format!("{}/_faults", sim.base_url()))
        .send()
        .await
        .expect("faults cleared");
    let response = hung.await.expect("task").expect("released with an answer");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn reset_fault_drops_the_connection_without_a_response() {
    let sim = start().await;
    set_faults(
        &sim,
        &FaultSpec {
            reset: true,
            target: FaultTarget::Vector,
            ..FaultSpec::default()
        },
    )
    .await;
    let err = client()
        .post(format!(
            "{}/collections/acme_kb/points/search",
            sim.base_url()
        ))
        .json(&json!({"vector": vec![0.0_f32; 64]}))
        .send()
        .await
        .expect_err("a reset connection gives no response");
    assert!(err.status().is_none(), "{err:?}");
    assert!(!err.is_timeout(), "{err:?}");

    // Other targets and, after clearing, the vector store work again.
    let response = post(&sim, "/v1/embeddings", &json!({"input": "pto"})).await;
    assert_eq!(response.status(), StatusCode::OK);
    client()
        .delete(format!("{}/_faults", sim.base_url()))
        .send()
        .await
        .expect("faults cleared");
    let response = post(
        &sim,
        "/collections/acme_kb/points/search",
        &json!({"vector": vec![0.0_f32; 64]}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(get_json(&sim, "/_stats").await["faulted"]["resets"], 1);
}

#[tokio::test]
async fn faults_never_touch_the_control_endpoints() {
    let sim = start().await;
    set_faults(
        &sim,
        &FaultSpec {
            reset: true,
            latency_ms: Some(2_000),
            ..FaultSpec::default()
        },
    )
    .await;
    let started = Instant::now();
    for path in ["/healthz", "/_stats", "/_faults"] {
        let response = client()
            .get(format!("{}{path}", sim.base_url()))
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
    assert!(started.elapsed() < Duration::from_millis(2_000));
    let faults = get_json(&sim, "/_faults").await;
    assert_eq!(faults["chat"]["reset"], true);
    assert_eq!(faults["vector"]["latency_ms"], 2_000);
}

#[tokio::test]
async fn invalid_fault_commands_name_the_field() {
    let sim = start().await;
    for (body, field) in [
        (json!({"error_rate": "lots"}), "error_rate"),
        (json!({"error_rate": 2.0}), "error_rate"),
        (json!({"error_status": 200}), "error_status"),
        (json!({"target": "llm"}), "target"),
        (json!({"bogus": 1}), "bogus"),
        (json!({"capacity": 2, "target": "embeddings"}), "capacity"),
        (json!({"per_token_ms": 60_001}), "per_token_ms"),
    ] {
        let response = post(&sim, "/_faults", &body).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
        let message = response.json::<Value>().await.expect("json body")["error"]
            .as_str()
            .expect("message")
            .to_owned();
        assert!(message.contains(field), "{message}");
    }
}

#[tokio::test]
async fn stats_count_arrivals_and_capture_traceparents() {
    let sim = start().await;
    let tp_a = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let tp_b = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let send = |path: &'static str, body: Value, traceparent: Option<&'static str>| {
        let mut request = client()
            .post(format!("{}{path}", sim.base_url()))
            .json(&body);
        if let Some(tp) = traceparent {
            request = request.header("traceparent", tp);
        }
        async move { request.send().await.expect("answered") }
    };
    send("/v1/chat/completions", chat_request("laptops?"), Some(tp_a)).await;
    send("/v1/chat/completions", chat_request("laptops?"), None).await;
    send("/v1/embeddings", json!({"input": "pto"}), Some(tp_b)).await;
    send(
        "/collections/acme_kb/points/search",
        json!({"vector": vec![0.0_f32; 64]}),
        None,
    )
    .await;

    let stats = get_json(&sim, "/_stats").await;
    assert_eq!(
        stats["requests"],
        json!({"chat": 2, "embeddings": 1, "vector": 1, "total": 4})
    );
    assert_eq!(
        stats["faulted"],
        json!({"errors": 0, "hangs": 0, "resets": 0})
    );
    assert_eq!(stats["last_traceparent"], Value::Null);
    assert_eq!(stats["traceparents"], json!([tp_a, tp_b]));

    send("/v1/embeddings", json!({"input": "pto"}), Some(tp_a)).await;
    let stats = get_json(&sim, "/_stats").await;
    assert_eq!(stats["last_traceparent"], tp_a);
    assert_eq!(stats["traceparents"], json!([tp_b, tp_a]));

    let response = client()
        .post(format!("{}/_stats/reset", sim.base_url()))
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), StatusCode::OK);
    let stats = get_json(&sim, "/_stats").await;
    assert_eq!(stats["requests"]["total"], 0);
    assert_eq!(stats["traceparents"], json!([]));
}

#[tokio::test]
async fn shutdown_finishes_promptly_with_a_hung_request_in_flight() {
    let sim = start().await;
    set_faults(
        &sim,
        &FaultSpec {
            hang: true,
            ..FaultSpec::default()
        },
    )
    .await;
    let url = format!("{}/v1/embeddings", sim.base_url());
    let hung = tokio::spawn(async move {
        client()
            .post(url)
            .json(&json!({"input": "pto"}))
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    sim.shutdown().await.expect("clean shutdown");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let response = hung.await.expect("task").expect("released with an answer");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

/// Sends `n` chat calls at once; returns each one's time to its full
/// answer, fastest first.
async fn concurrent_chats(sim: &SimHandle, n: usize, request: &Value) -> Vec<Duration> {
    let started = Instant::now();
    let calls = (0..n).map(|_| async {
        let response = post(sim, "/v1/chat/completions", request).await;
        assert_eq!(response.status(), StatusCode::OK);
        response.bytes().await.expect("full body");
        started.elapsed()
    });
    let mut done = futures::future::join_all(calls).await;
    done.sort();
    done
}

/// The chat model's capacity gauges out of `/_stats` `llm`, which also
/// holds completion counters these tests do not look at.
fn capacity_gauges(llm: &Value) -> Value {
    let keys = ["capacity", "in_flight", "max_in_flight", "queued"];
    keys.iter()
        .map(|&k| (k.to_owned(), llm[k].clone()))
        .collect()
}

/// Timer slack for lower bounds: tokio rounds sleeps up to the next
/// millisecond, so a sleep is never shorter; 2 ms covers clock reads.
const SLACK: Duration = Duration::from_millis(2);

#[tokio::test]
async fn capacity_two_serves_six_concurrent_calls_in_three_waves() {
    let sim = sim::spawn(SimConfig {
        llm: LlmCapacity {
            capacity: 2,
            service_ms: Some(100),
            per_token_ms: 0,
        },
        ..SimConfig::default()
    })
    .await
    .expect("sim starts");
    let request = chat_request("Can I rollover unused days?");
    let poll = async {
        // While the first wave is in service the other four wait.
        let mut most_queued = 0;
        for _ in 0..20 {
            let llm = get_json(&sim, "/_stats").await["llm"].clone();
            assert!(llm["in_flight"].as_u64().expect("gauge") <= 2, "{llm}");
            most_queued = most_queued.max(llm["queued"].as_u64().expect("gauge"));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        most_queued
    };
    let (done, most_queued) = tokio::join!(concurrent_chats(&sim, 6, &request), poll);

    // Wave k (1-based) cannot finish before k service times.
    for (i, t) in done.iter().enumerate() {
        let wave = (i / 2 + 1) as u32;
        assert!(
            *t + SLACK >= Duration::from_millis(100) * wave,
            "call {i} done after {t:?}: {done:?}"
        );
    }
    assert!(done[5] + SLACK >= Duration::from_millis(300), "{done:?}");
    assert_eq!(most_queued, 4, "{done:?}");
    let llm = get_json(&sim, "/_stats").await["llm"].clone();
    assert_eq!(
        capacity_gauges(&llm),
        json!({"capacity": 2, "in_flight": 0, "max_in_flight": 2, "queued": 0})
    );
}

#[tokio::test]
async fn per_token_cost_lengthens_service_time() {
    let sim = start().await;
    // The answer to this question is 7 completion tokens.
    let request = chat_request("Can I rollover unused days?");
    let fault = |per_token_ms| FaultSpec {
        capacity: Some(1),
        service_ms: Some(50),
        per_token_ms: Some(per_token_ms),
        target: FaultTarget::Chat,
        ..FaultSpec::default()
    };
    set_faults(&sim, &fault(0)).await;
    let flat = concurrent_chats(&sim, 2, &request).await;
    set_faults(&sim, &fault(20)).await;
    let per_token = concurrent_chats(&sim, 2, &request).await;

    // One slot: the second call waits for the first. 50 ms each flat;
    // 50 + 7 x 20 = 190 ms each with the token cost.
    assert!(flat[1] + SLACK >= Duration::from_millis(100), "{flat:?}");
    assert!(
        per_token[0] + SLACK >= Duration::from_millis(190),
        "{per_token:?}"
    );
    assert!(
        per_token[1] + SLACK >= Duration::from_millis(380),
        "{per_token:?}"
    );
    assert!(
        per_token[1] > flat[1] + Duration::from_millis(200),
        "{flat:?} {per_token:?}"
    );
}

#[tokio::test]
async fn a_streamed_answer_holds_its_slot_until_the_stream_ends() {
    let sim = start().await;
    set_faults(
        &sim,
        &FaultSpec {
            capacity: Some(1),
            service_ms: Some(0),
            stream_chunk_delay_ms: Some(30),
            target: FaultTarget::Chat,
            ..FaultSpec::default()
        },
    )
    .await;
    let mut streamed = chat_request("Can I rollover unused days?");
    streamed["stream"] = json!(true);
    let started = Instant::now();
    let stream = async {
        let body = post(&sim, "/v1/chat/completions", &streamed)
            .await
            .text()
            .await
            .expect("body");
        assert_eq!(sse_data(&body).len(), 10);
        started.elapsed()
    };
    let plain = async {
        // Arrive second, behind the stream's slot.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let response = post(&sim, "/v1/chat/completions", &chat_request("laptops?")).await;
        assert_eq!(response.status(), StatusCode::OK);
        started.elapsed()
    };
    let (stream_done, plain_done) = tokio::join!(stream, plain);
    // 10 frames, 9 gaps of 30 ms; the plain call (instant on its own)
    // only gets the one slot once they are all sent.
    assert!(
        stream_done + SLACK >= Duration::from_millis(270),
        "{stream_done:?}"
    );
    assert!(
        plain_done + SLACK >= Duration::from_millis(270),
        "{plain_done:?}"
    );
}

#[tokio::test]
async fn capacity_set_through_faults_is_shown_and_delete_restores_the_command_line() {
    let sim = sim::spawn(SimConfig {
        llm: LlmCapacity {
            capacity: 3,
            ..LlmCapacity::default()
        },
        ..SimConfig::default()
    })
    .await
    .expect("sim starts");
    set_faults(
        &sim,
        &FaultSpec {
            capacity: Some(2),
            service_ms: Some(100),
            target: FaultTarget::Chat,
            ..FaultSpec::default()
        },
    )
    .await;
    let faults = get_json(&sim, "/_faults").await;
    assert_eq!(faults["chat"]["capacity"], 2);
    assert_eq!(faults["chat"]["service_ms"], 100);
    assert_eq!(faults["chat"]["per_token_ms"], 0);
    let done = concurrent_chats(&sim, 4, &chat_request("laptops?")).await;
    assert!(done[3] + SLACK >= Duration::from_millis(200), "{done:?}");
    assert_eq!(get_json(&sim, "/_stats").await["llm"]["max_in_flight"], 2);

    let cleared: Value = client()
        .delete(format!("{}/_faults", sim.base_url()))
        .send()
        .await
        .expect("faults cleared")
        .json()
        .await
        .expect("json body");
    assert_eq!(cleared["chat"]["capacity"], 3);
    assert_eq!(cleared["chat"]["service_ms"], Value::Null);

    // Back to the command line's 3 slots; `latency_ms` alone is now the
    // service time, spent holding a slot.
    set_faults(
        &sim,
        &FaultSpec {
            latency_ms: Some(100),
            ..FaultSpec::default()
        },
    )
    .await;
    client()
        .post(format!("{}/_stats/reset", sim.base_url()))
        .send()
        .await
        .expect("stats reset");
    let done = concurrent_chats(&sim, 6, &chat_request("laptops?")).await;
    assert!(done[5] + SLACK >= Duration::from_millis(200), "{done:?}");
    assert_eq!(get_json(&sim, "/_stats").await["llm"]["max_in_flight"], 3);
}

#[tokio::test]
async fn unlimited_capacity_serves_every_call_at_once() {
    let sim = start().await;
    set_faults(
        &sim,
        &FaultSpec {
            latency_ms: Some(100),
            target: FaultTarget::Chat,
            ..FaultSpec::default()
        },
    )
    .await;
    let done = concurrent_chats(&sim, 6, &chat_request("laptops?")).await;
    assert!(done[0] + SLACK >= Duration::from_millis(100), "{done:?}");
    let llm = get_json(&sim, "/_stats").await["llm"].clone();
    assert_eq!(
        capacity_gauges(&llm),
        json!({"capacity": 0, "in_flight": 0, "max_in_flight": 6, "queued": 0})
    );
}

#[tokio::test]
async fn binary_prints_its_address_serves_and_exits_on_sigterm() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_levee-upstream-sim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--collection",
            "kb2",
            "--dim",
            "32",
            "--capacity",
            "8",
            "--service-ms",
            "100",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("binary starts");
    let pid = child.id().expect("running child has a pid");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("address line within 20 s")
        .expect("readable stdout")
        .expect("one line");
    let addr = line
        .strip_prefix(LISTENING_PREFIX)
        .unwrap_or_else(|| panic!("unexpected line {line:?}"));
    let addr: std::net::SocketAddr = addr.parse().expect("a socket address");
    assert!(addr.ip().is_loopback());
    assert_ne!(addr.port(), 0);

    let info: Value = client()
        .get(format!("http://{addr}/collections/kb2"))
        .send()
        .await
        .expect("answered")
        .json()
        .await
        .expect("json body");
    assert_eq!(info["result"]["points_count"], 8);
    assert_eq!(info["result"]["config"]["params"]["vectors"]["size"], 32);
    let faults: Value = client()
        .get(format!("http://{addr}/_faults"))
        .send()
        .await
        .expect("answered")
        .json()
        .await
        .expect("json body");
    assert_eq!(faults["chat"]["capacity"], 8);
    assert_eq!(faults["chat"]["service_ms"], 100);

    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await
        .expect("kill runs");
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits within 10 s after SIGTERM")
        .expect("wait works");
    assert!(status.success(), "{status:?}");
    assert_eq!(
        lines.next_line().await.expect("readable"),
        None,
        "nothing else on stdout"
    );
}
