//! Streams through the OpenAI-compatible API against the simulator, in
//! the cases the SDK tests cannot steer: a client gone past the drain
//! bound, and an upstream that breaks a stream off. Real HTTP between the
//! processes; settlement read back from the gateway's `/metrics`.

mod support;

use std::time::Duration;

use futures::StreamExt;
use levee::identity::hash_key;
use levee_chaos::sim::{self, SimConfig};
use serde_json::{json, Value};
use support::levee::Levee;
use tokio::time::Instant;

const KEY: &str = "stream_key_1";
const MAX_TOKENS: u64 = 40;

fn config(drain: &str) -> String {
    format!(
        r#"
[llm]
stream_drain_timeout = "{drain}"
[[identity.api_keys]]
id = "s"
sha256 = "{key}"
tenant = "acme"
tier = "API_KEY"
[ratelimit.tenants.acme]
tokens_per_minute = 1000000
[resilience.llm]
attempt_timeout = "5s"
[resilience.llm.retry]
max_attempts = 1
"#,
        key = hash_key(KEY),
    )
}

fn body() -> String {
    json!({
        "model": "gpt-4o-mini",
        "stream": true,
        "max_tokens": MAX_TOKENS,
        "messages": [
            {"role": "system", "content": "Employees get 25 days of paid time off every year. \
                Unused days roll over up to five days into the next calendar year."},
            {"role": "user", "content": "How many paid time off days do employees get every year?"}
        ]
    })
    .to_string()
}

/// The sum of every sample of `family` whose labels contain `labels`.
async fn metric(c: &reqwest::Client, url: &str, family: &str, labels: &str) -> f64 {
    let text = c
        .get(format!("{url}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with('{'))
        .filter(|l| l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn sim_stats(c: &reqwest::Client, base: &str) -> Value {
    c.get(format!("{base}/_stats"))
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("json")
}

async fn faults(c: &reqwest::Client, base: &str, spec: Value) {
    let resp = c
        .post(format!("{base}/_faults"))
        .json(&spec)
        .send()
        .await
        .expect("faults");
    assert!(resp.status().is_success());
}

/// Polls `check` every 50 ms for up to `limit`.
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn a_client_gone_past_the_drain_bound_is_charged_the_reservation_and_the_upstream_closed() {
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let base = sim.base_url();
    let c = reqwest::Client::new();
    // A frame every 400 ms: the 300 ms drain bound cannot reach the usage.
    faults(
        &c,
        &base,
        json!({"stream_chunk_delay_ms": 400, "target": "chat"}),
    )
    .await;
    let levee = Levee::builder()
        .config_text(&config("300ms"))
        .env("LEVEE_LLM_URL", format!("{base}/v1"))
        .start()
        .await;
    let url = levee.url();
    let tokens = "levee_ratelimit_tenant_tokens_total";
    let before = metric(&c, &url, tokens, r#"tenant="acme""#).await;

    let body = body();
    let resp = c
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.expect("a frame").expect("bytes");
    assert!(first.starts_with(b"data: "), "{first:?}");
    drop(stream);

    let drains = "levee_gen_ai_stream_drains_total";
    let charged = eventually(Duration::from_secs(5), || async {
        metric(&c, &url, drains, r#"outcome="charged_in_full""#).await >= 1.0
    })
    .await;
    assert!(charged, "no drain charged in full");
    // The reservation as estimated: a token per four body bytes plus the
    // completion allowance.
    let reserved = (body.len() as u64).div_ceil(4) + MAX_TOKENS;
    let after = metric(&c, &url, tokens, r#"tenant="acme""#).await;
    assert_eq!((after - before) as u64, reserved);
    assert_eq!(metric(&c, &url, drains, r#"outcome="settled""#).await, 0.0);
    // The drain closed the upstream stream when it gave up.
    let closed = eventually(Duration::from_secs(3), || async {
        sim_stats(&c, &base).await["llm"]["streams_open"] == 0
    })
    .await;
    assert!(closed, "{}", sim_stats(&c, &base).await);
}

#[tokio::test]
async fn a_stream_broken_off_ends_with_an_error_event_and_is_a_breaker_failure() {
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let base = sim.base_url();
    let c = reqwest::Client::new();
    faults(&c, &base, json!({"stream_fail_after": 3, "target": "chat"})).await;
    let levee = Levee::builder()
        .config_text(&config("5s"))
        .env("LEVEE_LLM_URL", format!("{base}/v1"))
        .start()
        .await;
    let url = levee.url();
    let failures = "levee_breaker_calls_total";
    let sel = r#"dependency="llm",outcome="failure""#;
    let before = metric(&c, &url, failures, sel).await;

    let resp = c
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(body())
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), 200);
    // The gateway ends the body cleanly, with the error as the last event.
    let text = resp.text().await.expect("a whole body");
    let frames: Vec<&str> = text.split("\n\n").filter(|f| !f.is_empty()).collect();
    assert_eq!(frames.len(), 4, "{text}");
    let last: Value =
        serde_json::from_str(frames[3].trim_start_matches("data: ")).expect("json event");
    assert_eq!(last["error"]["code"], "upstream_stream_error", "{last}");
    assert_eq!(last["error"]["type"], "server_error");
    assert!(!text.contains("[DONE]"));
    let after = metric(&c, &url, failures, sel).await;
    assert_eq!(after - before, 1.0, "the broken stream counts once");
    let broken = metric(
        &c,
        &url,
        "levee_gen_ai_requests_total",
        r#"outcome="stream_failed""#,
    )
    .await;
    assert_eq!(broken, 1.0);
}
