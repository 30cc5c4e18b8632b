//! Tenant isolation end to end: the real gateway, the upstream simulator
//! as an LLM with a fixed service time, and two tenants, one of them
//! flooding. With the fair queue the quiet tenant is served as if alone;
//! without it (today's bulkhead only) the flood takes its answers.

mod support;

use std::time::Duration;

use levee::identity::hash_key;
use levee_chaos::sim::{self, SimConfig};
use serde_json::json;
use support::levee::Levee;
use tokio::time::Instant;

/// The simulated LLM's service time, and the gateway's capacity for it.
const SERVICE: Duration = Duration::from_millis(100);
const CAPACITY: usize = 4;
/// The noisy tenant's queue bound: its backlog drains in
/// NOISY_QUEUE × SERVICE / CAPACITY.
const NOISY_QUEUE: usize = 32;
/// More noisy clients than slots plus queue places, so the flood overflows.
const NOISY_CLIENTS: usize = 48;

fn config(isolation: bool) -> String {
    format!(
        r#"
[[identity.api_keys]]
id = "quiet"
sha256 = "{quiet}"
tenant = "quiet"
tier = "TENANT"
[[identity.api_keys]]
id = "noisy"
sha256 = "{noisy}"
tenant = "noisy"
tier = "TENANT"
[ratelimit.tiers.TENANT]
limits = []
[ratelimit.tenants.quiet]
limits = [{{ limit = 100000, window = "1m" }}]
max_wait = "2s"
[ratelimit.tenants.noisy]
limits = [{{ limit = 100000, window = "1m" }}]
max_queue = {NOISY_QUEUE}
max_wait = "2s"
[fairness]
enabled = {isolation}
[resilience.llm]
attempt_timeout = "5s"
deadline = "10s"
[resilience.llm.retry]
max_attempts = 1
[resilience.llm.bulkhead]
max_concurrent = {CAPACITY}
"#,
        quiet = hash_key("quiet_key"),
        noisy = hash_key("noisy_key"),
    )
}

struct Outcome {
    status: u16,
    retry_after: bool,
    took: Duration,
}

async fn call(c: &reqwest::Client, url: &str, key: &str) -> Outcome {
    let started = Instant::now();
    let resp = c
        .post(format!("{url}/v1/chat"))
        .header("x-api-key", key)
        .json(&json!({"message": "What is the PTO policy?", "user_id": "u1", "thread_id": "t1"}))
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    match resp {
        Ok(r) => Outcome {
            status: r.status().as_u16(),
            retry_after: r.headers().contains_key("retry-after"),
            took: started.elapsed(),
        },
        Err(_) => Outcome {
            status: 0,
            retry_after: false,
            took: started.elapsed(),
        },
    }
}

/// Floods with NOISY_CLIENTS noisy clients in closed loops for 3 s while the quiet
/// tenant sends one request every 100 ms after its answer; returns (quiet, noisy).
async fn run(isolation: bool) -> (Vec<Outcome>, Vec<Outcome>) {
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let c = reqwest::Client::new();
    let faults = json!({"latency_ms": SERVICE.as_millis() as u64, "target": "chat"});
    c.post(format!("{}/_faults", sim.base_url()))
        .json(&faults)
        .send()
        .await
        .expect("faults");
    let levee = Levee::builder()
        .config_text(&config(isolation))
        .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
        .start()
        .await;
    let url = levee.url();
    let until = Instant::now() + Duration::from_secs(3);
    let mut noisy = Vec::new();
    for _ in 0..NOISY_CLIENTS {
        let (c, url) = (c.clone(), url.clone());
        noisy.push(tokio::spawn(async move {
            let mut out = Vec::new();
            while Instant::now() < until {
                let o = call(&c, &url, "noisy_key").await;
                if o.status == 429 {
                    // An honest client backs off a little on 429.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                out.push(o);
            }
            out
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut quiet = Vec::new();
    while Instant::now() + Duration::from_millis(300) < until {
        quiet.push(call(&c, &url, "quiet_key").await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut all_noisy = Vec::new();
    for n in noisy {
        all_noisy.extend(n.await.expect("noisy client"));
    }
    (quiet, all_noisy)
}

#[tokio::test]
async fn the_quiet_tenant_is_served_as_if_alone_while_a_noisy_one_floods() {
    let (quiet, noisy) = run(true).await;
    assert!(quiet.len() >= 8, "{} quiet requests", quiet.len());
    let not_ok: Vec<u16> = quiet
        .iter()
        .map(|o| o.status)
        .filter(|s| *s != 200)
        .collect();
    assert!(not_ok.is_empty(), "quiet tenant got {not_ok:?}");
    // What the quiet tenant must not wait for is the noisy backlog, which
    // drains in NOISY_QUEUE × SERVICE / CAPACITY; it waits at most for one
    // slot to free, then its own call.
    let backlog = SERVICE * NOISY_QUEUE as u32 / CAPACITY as u32;
    let worst = quiet.iter().map(|o| o.took).max().unwrap_or_default();
    assert!(
        worst < backlog,
        "quiet worst {worst:?} vs the noisy backlog {backlog:?}"
    );

    let ok = noisy.iter().filter(|o| o.status == 200).count();
    let refused = noisy.iter().filter(|o| o.status == 429).count();
    assert_eq!(ok + refused, noisy.len(), "noisy gets only 200 and 429");
    assert!(noisy
        .iter()
        .filter(|o| o.status == 429)
        .all(|o| o.retry_after));
    assert!(refused > 0, "the flood exceeded the noisy tenant's queue");
    // Work-conserving: the capacity the quiet tenant leaves goes to the
    // noisy one. 3 s × CAPACITY / SERVICE = 120 calls in all; quiet takes
    // about 15.
    assert!(ok >= 90, "noisy admitted {ok} calls");
}

#[tokio::test]
async fn without_isolation_the_flood_takes_the_quiet_tenants_answers() {
    let (quiet, _) = run(false).await;
    let not_ok = quiet.iter().filter(|o| o.status != 200).count();
    assert!(
        not_ok > 0,
        "with the bulkhead alone the quiet tenant is refused while it is full"
    );
}
