//! Traces end to end: the levee binary exports over OTLP to an in-process
//! receiver (gRPC and HTTP/protobuf), with the upstream simulator as LLM
//! and vector store, and W3C trace context flowing client → levee →
//! upstream.

mod support;

use std::time::Duration;

use levee_chaos::sim::{self, SimConfig, SimHandle};
use serde_json::{json, Value};
use support::levee::Levee;
use support::otlp::{
    OtlpReceiver, Received, KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, STATUS_ERROR,
};
use support::redis::RedisServer;

/// The client's trace and span ids.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
const SECRET: &str = "sk-test-secret-do-not-export-123";

/// Anonymous loopback callers are PUBLIC_IP: 3 requests a minute.
const CONFIG: &str = r#"
[ratelimit.tiers.PUBLIC_IP]
limits = [{ limit = 3, window = "1m" }]
"#;

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{CLIENT_SPAN}-01")
}

async fn start(receiver_endpoint: &str, protocol: &str, sim: &SimHandle, delay_ms: u32) -> Levee {
    start_with(Levee::builder(), receiver_endpoint, protocol, sim, delay_ms).await
}

async fn start_with(
    builder: support::levee::LeveeBuilder,
    receiver_endpoint: &str,
    protocol: &str,
    sim: &SimHandle,
    delay_ms: u32,
) -> Levee {
    builder
        .config_text(CONFIG)
        .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
        .env("LEVEE_VECTOR_STORE_URL", sim.base_url())
        .env("LEVEE_LLM_API_KEY", SECRET)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver_endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        .env("OTEL_BSP_SCHEDULE_DELAY", delay_ms.to_string())
        .start()
        .await
}

async fn chat(levee: &Levee, traceparent: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/v1/chat", levee.url()))
        .json(&json!({"message": "What is the PTO policy?", "user_id": "u1", "thread_id": "t1"}));
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let resp = req.send().await.expect("chat");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn stats(sim: &SimHandle) -> Value {
    reqwest::get(format!("{}/_stats", sim.base_url()))
        .await
        .expect("stats")
        .json()
        .await
        .expect("stats json")
}

async fn set_faults(sim: &SimHandle, faults: Option<Value>) {
    let c = reqwest::Client::new();
    let url = format!("{}/_faults", sim.base_url());
    let req = match faults {
        Some(f) => c.post(url).json(&f),
        None => c.delete(url),
    };
    assert!(req.send().await.expect("faults").status().is_success());
}

fn find<'a>(spans: &'a [Received], name: &str) -> Option<&'a Received> {
    spans.iter().find(|s| s.span.name == name)
}

fn named<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    find(spans, name).unwrap_or_else(|| {
        let names: Vec<&str> = spans.iter().map(|s| s.span.name.as_str()).collect();
        panic!("no span named {name:?}; got {names:?}")
    })
}

/// Whether `ancestor` is `span`'s parent, grandparent, … (resilience layers
/// may add spans in between).
fn descends_from(spans: &[Received], span: &Received, ancestor: &Received) -> bool {
    let mut parent = span.parent_id();
    for _ in 0..16 {
        if parent == ancestor.span_id() {
            return true;
        }
        match spans.iter().find(|s| s.span_id() == parent) {
            Some(p) => parent = p.parent_id(),
            None => return false,
        }
    }
    false
}

/// The spans of the trace whose SERVER span has `status`.
fn request_trace(spans: &[Received], status: &str) -> Vec<Received> {
    let Some(server) = spans.iter().find(|s| {
        s.span.kind == KIND_SERVER && s.attr("http.response.status_code").as_deref() == Some(status)
    }) else {
        return Vec::new();
    };
    spans
        .iter()
        .filter(|s| s.trace_id() == server.trace_id())
        .cloned()
        .collect()
}

#[tokio::test]
async fn chat_request_is_one_trace_from_client_through_every_stage_to_the_upstreams() {
    let receiver = OtlpReceiver::start().await;
    let sim = sim::spawn(SimConfig::default()).await.expect("spawn sim");
    let redis = RedisServer::start().await;
    let builder = Levee::builder().env("LEVEE_REDIS_URL", redis.url());
    let levee = start_with(builder, &receiver.grpc_endpoint(), "grpc", &sim, 100).await;

    let (status, body) = chat(&levee, Some(&traceparent())).await;
    assert_eq!(status, 200, "{body}");

    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| {
            let ours: Vec<&Received> = spans.iter().filter(|s| s.trace_id() == TRACE_ID).collect();
            ours.iter().any(|s| s.span.kind == KIND_SERVER)
                && ours.iter().any(|s| s.span.name == "chat gpt-4o-mini")
        })
        .await;
    let trace: Vec<Received> = spans
        .iter()
        .filter(|s| s.trace_id() == TRACE_ID)
        .cloned()
        .collect();

    // The SERVER span joins the client's trace, with HTTP semantic conventions.
    let server = named(&trace, "POST /v1/chat");
    assert_eq!(server.span.kind, KIND_SERVER);
    assert_eq!(
        server.parent_id(),
        CLIENT_SPAN,
        "parent is the client's span"
    );
    assert_eq!(server.attr("http.request.method").as_deref(), Some("POST"));
    assert_eq!(server.attr("http.route").as_deref(), Some("/v1/chat"));
    assert_eq!(server.attr("url.path").as_deref(), Some("/v1/chat"));
    assert_eq!(server.attr_i64("http.response.status_code"), Some(200));
    assert_eq!(server.attr("client.address").as_deref(), Some("127.0.0.1"));
    assert_ne!(server.status_code(), STATUS_ERROR);
    assert_eq!(
        server.resource.get("service.name").map(String::as_str),
        Some("levee")
    );

    // The rate-limit check: decision, tier, layer, store and its latency.
    let rl = named(&trace, "ratelimit.check");
    assert_eq!(rl.parent_id(), server.span_id());
    assert_eq!(
        rl.attr("levee.ratelimit.decision").as_deref(),
        Some("allowed")
    );
    assert_eq!(rl.attr("levee.ratelimit.layer").as_deref(), Some("network"));
    assert_eq!(
        rl.attr("levee.ratelimit.tier").as_deref(),
        Some("PUBLIC_IP")
    );
    assert_eq!(rl.attr("levee.ratelimit.store").as_deref(), Some("redis"));
    let latency: f64 = rl
        .attr("levee.ratelimit.store.latency_ms")
        .expect("store latency")
        .parse()
        .expect("latency is a number");
    assert!((0.0..1000.0).contains(&latency), "{latency}");

    // The pipeline's stages are INTERNAL children of the request.
    for stage in ["router", "retrieval", "synthesis"] {
        let s = named(&trace, stage);
        assert_eq!(s.span.kind, KIND_INTERNAL, "{stage}");
        assert!(
            descends_from(&trace, s, server),
            "{stage} is under the request"
        );
    }
    assert_eq!(
        named(&trace, "router").attr("levee.rag.route").as_deref(),
        Some("retrieve")
    );

    // CLIENT spans for every upstream call, under the stage that made it.
    let retrieval = named(&trace, "retrieval");
    let synthesis = named(&trace, "synthesis");
    let embed = named(&trace, "embeddings text-embedding-3-small");
    let search = named(&trace, "search acme_kb");
    let llm = named(&trace, "chat gpt-4o-mini");
    for (client, stage) in [(embed, retrieval), (search, retrieval), (llm, synthesis)] {
        assert_eq!(client.span.kind, KIND_CLIENT, "{}", client.span.name);
        assert!(
            descends_from(&trace, client, stage),
            "{} under {}",
            client.span.name,
            stage.span.name
        );
        assert_eq!(client.attr_i64("http.response.status_code"), Some(200));
        assert_eq!(client.attr("server.address").as_deref(), Some("127.0.0.1"));
    }
    assert_eq!(llm.attr("gen_ai.system").as_deref(), Some("openai"));
    assert_eq!(
        llm.attr("gen_ai.request.model").as_deref(),
        Some("gpt-4o-mini")
    );
    let input = llm
        .attr_i64("gen_ai.usage.input_tokens")
        .expect("input tokens");
    let output = llm
        .attr_i64("gen_ai.usage.output_tokens")
        .expect("output tokens");
    assert_eq!(
        (input, output),
        (
            body["metadata"]["usage"]["prompt_tokens"]
                .as_i64()
                .expect("prompt"),
            body["metadata"]["usage"]["completion_tokens"]
                .as_i64()
                .expect("completion")
        ),
        "span usage is the model's reported usage"
    );
    assert_eq!(search.attr("db.system.name").as_deref(), Some("qdrant"));
    // Conversation memory in Redis: a read before and a write after.
    for op in ["LRANGE", "MULTI"] {
        let r = named(&trace, op);
        assert_eq!(r.span.kind, KIND_CLIENT, "{op}");
        assert_eq!(r.attr("db.system.name").as_deref(), Some("redis"));
        assert!(
            descends_from(&trace, r, server),
            "{op} is under the request"
        );
    }

    // The upstream saw the client's trace id, with our CLIENT spans as parents.
    let st = stats(&sim).await;
    let seen: Vec<&str> = st["traceparents"]
        .as_array()
        .expect("traceparents")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(seen.len(), 3, "embeddings, search, chat: {st}");
    let client_ids: Vec<String> = [embed, search, llm].iter().map(|s| s.span_id()).collect();
    for tp in seen {
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(parts[1], TRACE_ID, "{tp}");
        assert!(
            client_ids.contains(&parts[2].to_owned()),
            "{tp} parent is a CLIENT span"
        );
    }

    // No secret in any span.
    for s in &spans {
        for v in s.all_values() {
            assert!(!v.contains(SECRET), "secret in {}: {v}", s.span.name);
        }
    }
}

#[tokio::test]
async fn rejected_and_failed_requests_are_traced_with_why() {
    let receiver = OtlpReceiver::start().await;
    let sim = sim::spawn(SimConfig::default()).await.expect("spawn sim");
    let levee = start(&receiver.grpc_endpoint(), "grpc", &sim, 100).await;

    // A failing LLM: a 5xx answer and an error status on the spans.
    set_faults(
        &sim,
        Some(json!({"error_rate": 1.0, "error_status": 500, "target": "chat"})),
    )
    .await;
    let (status, body) = chat(&levee, None).await;
    assert!(status >= 500, "{status} {body}");
    set_faults(&sim, None).await;
    // Spend the 3/min limit, then one more: 429.
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(chat(&levee, None).await.0);
    }
    assert_eq!(statuses, [200, 200, 429]);

    let five = status.to_string();
    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| {
            let failed = request_trace(spans, &five);
            !request_trace(spans, "429").is_empty()
                && failed.iter().any(|s| s.span.kind == KIND_SERVER)
                && failed.iter().any(|s| s.span.name == "chat gpt-4o-mini")
        })
        .await;

    let failed = request_trace(&spans, &five);
    let server = failed
        .iter()
        .find(|s| s.span.kind == KIND_SERVER)
        .expect("server span");
    assert_eq!(server.status_code(), STATUS_ERROR, "5xx is an error");
    let llm = named(&failed, "chat gpt-4o-mini");
    assert_eq!(llm.status_code(), STATUS_ERROR);
    assert_eq!(llm.attr("error.type").as_deref(), Some("500"));
    assert_eq!(llm.attr_i64("http.response.status_code"), Some(500));

    // The 429 is traced, its SERVER span says why, and it is not an error.
    let limited = request_trace(&spans, "429");
    let server = limited
        .iter()
        .find(|s| s.span.kind == KIND_SERVER)
        .expect("server span");
    assert_eq!(server.span.name, "POST /v1/chat");
    assert_eq!(
        server.attr("levee.ratelimit.decision").as_deref(),
        Some("limited")
    );
    assert_eq!(
        server.attr("levee.ratelimit.layer").as_deref(),
        Some("network")
    );
    assert_eq!(
        server.attr("levee.ratelimit.tier").as_deref(),
        Some("PUBLIC_IP")
    );
    assert_ne!(server.status_code(), STATUS_ERROR);
    let rl = named(&limited, "ratelimit.check");
    assert_eq!(rl.parent_id(), server.span_id());
    assert_eq!(
        rl.attr("levee.ratelimit.decision").as_deref(),
        Some("limited")
    );
    assert!(
        find(&limited, "synthesis").is_none(),
        "a refused request does no work"
    );
}

#[tokio::test]
async fn spans_batched_at_shutdown_are_flushed_over_http_protobuf() {
    let receiver = OtlpReceiver::start().await;
    let sim = sim::spawn(SimConfig::default()).await.expect("spawn sim");
    // A minute-long batch delay: only the shutdown flush can export.
    let mut levee = start(&receiver.http_endpoint(), "http/protobuf", &sim, 60_000).await;
    let (status, _) = chat(&levee, Some(&traceparent())).await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        receiver.spans().is_empty(),
        "nothing exported before shutdown"
    );

    levee.terminate();
    let exit = levee
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("levee exits");
    assert!(exit.success(), "{exit}");
    let spans = receiver.spans();
    let server = named(&spans, "POST /v1/chat");
    assert_eq!(server.trace_id(), TRACE_ID);
    assert!(find(&spans, "chat gpt-4o-mini").is_some());
}

#[tokio::test]
async fn client_traceparent_reaches_the_upstreams_without_an_exporter() {
    let sim = sim::spawn(SimConfig::default()).await.expect("spawn sim");
    let levee = Levee::builder()
        .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
        .env("LEVEE_VECTOR_STORE_URL", sim.base_url())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "")
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
        .start()
        .await;
    let (status, _) = chat(&levee, Some(&traceparent())).await;
    assert_eq!(status, 200);
    let st = stats(&sim).await;
    let seen: Vec<String> = st["traceparents"]
        .as_array()
        .expect("traceparents")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    assert_eq!(seen.len(), 3, "{st}");
    for tp in &seen {
        let parts: Vec<&str> = tp.split('-').collect();
        assert_eq!(parts.len(), 4, "{tp}");
        assert_eq!(parts[1], TRACE_ID, "same trace id upstream: {tp}");
        assert_ne!(
            parts[2], CLIENT_SPAN,
            "levee's own span is the parent: {tp}"
        );
    }

    // Without a client traceparent, levee starts a trace of its own.
    let (status, _) = chat(&levee, None).await;
    assert_eq!(status, 200);
    let st = stats(&sim).await;
    let last = st["last_traceparent"].as_str().expect("a traceparent");
    let trace = last.split('-').nth(1).expect("trace id");
    assert_ne!(trace, TRACE_ID);
    assert_ne!(trace, "0".repeat(32));
}

#[tokio::test]
async fn an_openai_stream_is_a_gen_ai_client_span_open_to_its_end_with_its_usage() {
    let receiver = OtlpReceiver::start().await;
    let sim = sim::spawn(SimConfig::default()).await.expect("spawn sim");
    let levee = start(&receiver.grpc_endpoint(), "grpc", &sim, 100).await;
    let body = json!({
        "model": "gpt-4o-mini",
        "stream": true,
        "messages": [
            {"role": "system", "content": "Employees get 25 days of paid time off."},
            {"role": "user", "content": "How many days of paid time off?"}
        ]
    });
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", levee.url()))
        .header("traceparent", traceparent())
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("stream");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| {
            spans.iter().any(|s| {
                s.trace_id() == TRACE_ID && s.attr("levee.deployment").as_deref() == Some("llm")
            })
        })
        .await;
    let trace: Vec<Received> = spans
        .iter()
        .filter(|s| s.trace_id() == TRACE_ID)
        .cloned()
        .collect();
    let server = named(&trace, "POST /v1/chat/completions");
    let llm = named(&trace, "chat gpt-4o-mini");
    assert_eq!(llm.span.kind, KIND_CLIENT);
    assert!(descends_from(&trace, llm, server));
    assert_eq!(llm.attr("gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(llm.attr("gen_ai.system").as_deref(), Some("openai"));
    assert_eq!(llm.attr("levee.model").as_deref(), Some("passthrough"));
    assert_eq!(llm.attr("levee.stream").as_deref(), Some("true"));
    // Usage is recorded when the stream ends, from its usage chunk (which
    // the client, who did not ask for it, never saw).
    assert!(!text.contains("\"usage\""), "{text}");
    let stats = stats(&sim).await;
    assert_eq!(
        llm.attr_i64("gen_ai.usage.input_tokens"),
        stats["llm"]["prompt_tokens"].as_i64()
    );
    assert_eq!(
        llm.attr_i64("gen_ai.usage.output_tokens"),
        stats["llm"]["completion_tokens"].as_i64()
    );
    // The span stays open for the stream: it ends after the server span
    // sent the response head.
    assert!(llm.span.end_time_unix_nano >= llm.span.start_time_unix_nano);
    // The upstream joined the client's trace.
    let last = stats["last_traceparent"].as_str().unwrap_or_default();
    assert!(last.contains(TRACE_ID), "{last}");
}

#[tokio::test]
async fn a_job_is_processed_in_a_span_linked_to_the_request_that_submitted_it() {
    let receiver = OtlpReceiver::start().await;
    let sim = sim::spawn(SimConfig::default()).await.expect("spawn sim");
    let key = "trace_jobs_key";
    let config = format!(
        "[[identity.api_keys]]\nid = \"t\"\nsha256 = \"{}\"\ntenant = \"acme\"\ntier = \"API_KEY\"\n",
        levee::identity::hash_key(key)
    );
    let levee = Levee::builder()
        .config_text(&config)
        .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.grpc_endpoint())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .start()
        .await;
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/jobs", levee.url()))
        .header("traceparent", traceparent())
        .header("x-api-key", key)
        .json(&json!({"message": "What is the PTO policy?", "user_id": "u1", "thread_id": "t1"}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 202);
    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| {
            spans.iter().any(|s| s.span.name == "job.process")
        })
        .await;
    let submit = spans
        .iter()
        .find(|s| s.trace_id() == TRACE_ID && s.span.name == "POST /v1/jobs")
        .expect("the submitting request's span");
    let job = spans
        .iter()
        .find(|s| s.span.name == "job.process")
        .expect("a job.process span");
    assert_ne!(job.trace_id(), TRACE_ID, "a job is its own trace");
    let linked = job.span.links.iter().any(|l| {
        hex::encode(&l.trace_id) == TRACE_ID && hex::encode(&l.span_id) == submit.span_id()
    });
    assert!(
        linked,
        "job.process links to the submitting span: {:?}",
        job.span.links
    );
}
