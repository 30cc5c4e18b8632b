//! Breaker benchmark (not a test): latency of a chat request rejected by an
//! open LLM breaker, beside a healthy chat request and a bare `/health`,
//! measured against the release `levee` binary in the same run.
//!
//!     cargo bench --bench breaker            # 3000 requests per case
//!     cargo bench --bench breaker -- quick   # 300
//!
//! The LLM is `levee-upstream-sim` (in process, real sockets); the breaker is
//! tripped for real by making the simulator answer 500s.
#![allow(clippy::print_stdout, missing_docs)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use levee_chaos::sim::{self, SimConfig};
use serde_json::json;
use tokio::time::Instant;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const CONFIG: &str = r#"
[ratelimit.tiers.PUBLIC_IP]
limits = [{ limit = 100000000, window = "1m" }]
[resilience.llm.retry]
max_attempts = 1
[resilience.llm.breaker]
policy = "consecutive"
consecutive_failures = 3
min_open = "10m"
max_open = "10m"
open_jitter = 0.0
"#;

async fn measure(
    client: &reqwest::Client,
    n: usize,
    f: impl Fn() -> reqwest::RequestBuilder,
) -> (u16, Vec<Duration>) {
    let mut took = Vec::with_capacity(n);
    let mut status = 0;
    for _ in 0..n {
        let t0 = Instant::now();
        let resp = f().send().await.expect("send");
        status = resp.status().as_u16();
        let _ = resp.bytes().await;
        took.push(t0.elapsed());
    }
    let _ = client;
    took.sort();
    (status, took)
}

fn pct(v: &[Duration], p: f64) -> f64 {
    v[((v.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this
    // program without it, as a quick smoke test.
    let quick = std::env::args().any(|a| a == "quick") || !std::env::args().any(|a| a == "--bench");
    let n = if quick { 300 } else { 3000 };
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let cfg = std::env::temp_dir().join(format!("levee-bench-breaker-{port}.toml"));
    std::fs::write(&cfg, CONFIG).expect("config");
    let _levee = Proc(
        Command::new(env!("CARGO_BIN_EXE_levee"))
            .args(["serve", "--config"])
            .arg(&cfg)
            .env("LEVEE_LISTEN", format!("127.0.0.1:{port}"))
            .env("LEVEE_LLM_URL", format!("{}/v1", sim.base_url()))
            .env("LEVEE_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .expect("levee"),
    );
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if client.get(format!("{base}/health")).send().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let chat = || {
        client
            .post(format!("{base}/v1/chat"))
            .json(&json!({"message": "What is the PTO policy?", "user_id": "u", "thread_id": "t"}))
    };
    let health = || client.get(format!("{base}/health"));
    // Warm up connections and caches.
    let _ = measure(&client, 200, chat).await;

    let (hs, h) = measure(&client, n, health).await;
    let (cs, c) = measure(&client, n, chat).await;
    // Trip the breaker for real: the LLM answers 500s.
    client
        .post(format!("{}/_faults", sim.base_url()))
        .json(&json!({"error_rate": 1.0, "error_status": 500, "target": "chat"}))
        .send()
        .await
        .expect("faults");
    for _ in 0..3 {
        let _ = chat().send().await;
    }
    let (os, o) = measure(&client, n, chat).await;
    assert_eq!((hs, cs, os), (200, 200, 503), "statuses of the three cases");

    println!("requests per case: {n} (sequential, one keep-alive connection)");
    println!();
    println!("| case | status | p50 µs | p99 µs | p50 / healthy chat p50 |");
    println!("|---|---|---|---|---|");
    let base_p50 = pct(&c, 0.5);
    for (name, status, v) in [
        ("GET /health (HTTP floor)", hs, &h),
        ("healthy chat (retrieval + LLM round trip)", cs, &c),
        ("chat rejected by the open LLM breaker", os, &o),
    ] {
        println!(
            "| {name} | {status} | {:.0} | {:.0} | {:.2} |",
            pct(v, 0.5),
            pct(v, 0.99),
            pct(v, 0.5) / base_p50
        );
    }
    let _ = std::fs::remove_file(cfg);
}
