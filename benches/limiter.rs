//! Limiter benchmark (not a test): decisions per second and per-decision
//! latency of the Redis store, beside `redis-benchmark` running the same
//! Lua script with the same arguments in the same run, and the in-process
//! store's decisions per second.
//!
//!     cargo bench --bench limiter            # full run
//!     cargo bench --bench limiter -- quick   # fewer operations
//!
//! Starts its own redis-server on a free loopback port and kills it (by
//! PID) at the end. Prints a Markdown table for BENCHMARKS.md.
#![allow(clippy::print_stdout, missing_docs)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use levee::ratelimit::store::{Algorithm, LimitSpec, LimitStore, MemoryStore, RedisStore};
use tokio::time::Instant;

const SCRIPT: &str = include_str!("../src/ratelimit/store/limits.lua");
const CONCURRENCY: usize = 16;

struct Redis(Child, u16);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> Redis {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    Redis(child, port)
}

fn spec(algorithm: Algorithm, key: &str) -> LimitSpec {
    // Limits far above the run's volume: every decision admits, so each one
    // takes the full read-check-write path.
    LimitSpec {
        key: key.to_owned(),
        algorithm,
        limit: 1_000_000_000,
        window: Duration::from_secs(60),
        burst: 1_000_000_000,
        cost: 1,
        shadow: false,
    }
}

fn algo_code(a: Algorithm) -> u8 {
    match a {
        Algorithm::SlidingLog => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::Gcra => 3,
        Algorithm::FixedWindow => 4,
    }
}

struct Run {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

async fn drive(store: Arc<dyn LimitStore>, limits: Vec<LimitSpec>, ops: usize) -> Run {
    let per_task = ops / CONCURRENCY;
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|t| {
            let store = store.clone();
            let limits = limits.clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let t0 = Instant::now();
                    let d = store
                        .check(&limits, &format!("b{t}-{i}"))
                        .await
                        .expect("store up");
                    assert!(d.allowed);
                    lat.push(t0.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::with_capacity(ops);
    for t in tasks {
        all.extend(t.await.expect("join"));
    }
    let elapsed = started.elapsed();
    all.sort();
    let pct = |p: f64| all[((all.len() as f64 - 1.0) * p) as usize].as_secs_f64() * 1e6;
    Run {
        per_sec: all.len() as f64 / elapsed.as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    }
}

fn redis_benchmark(port: u16, sha: &str, limits: &[LimitSpec], ops: usize) -> Option<f64> {
    let mut args: Vec<String> = vec![
        "-h".into(),
        "127.0.0.1".into(),
        "-p".into(),
        port.to_string(),
        "-c".into(),
        CONCURRENCY.to_string(),
        "-n".into(),
        ops.to_string(),
        "-r".into(),
        "1000000000".into(),
        "-q".into(),
        "EVALSHA".into(),
        sha.into(),
        limits.len().to_string(),
    ];
    args.extend(limits.iter().map(|l| format!("rb:{}", l.key)));
    args.extend([
        "check".into(),
        "m__rand_int__".into(),
        "0".into(),
        "0".into(),
    ]);
    for l in limits {
        args.extend([
            algo_code(l.algorithm).to_string(),
            l.limit.to_string(),
            (l.window.as_micros()).to_string(),
            l.burst.to_string(),
            l.cost.to_string(),
            "0".into(),
        ]);
    }
    let out = Command::new("redis-benchmark").args(&args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "EVALSHA ...: 41322.31 requests per second, p50=0.303 msec"
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("requests per second"))?;
    let before = line.split("requests per second").next()?;
    before
        .rsplit(':')
        .next()?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this
    // program without it, as a quick smoke test.
    let quick = std::env::args().any(|a| a == "quick") || !std::env::args().any(|a| a == "--bench");
    let ops = if quick { 4_000 } else { 40_000 };
    let redis = start_redis();
    let url = format!("redis://127.0.0.1:{}/", redis.1);
    let client = redis::Client::open(url.as_str()).expect("url");
    let mut conn = None;
    for _ in 0..100 {
        if let Ok(c) = client.get_connection_manager().await {
            conn = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut conn = conn.expect("redis-server did not start");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT)
        .query_async(&mut conn)
        .await
        .expect("SCRIPT LOAD");
    let store: Arc<dyn LimitStore> = Arc::new(RedisStore::new(
        levee::upstream::redis_conn::RedisConn::Single(conn),
        Duration::from_secs(1),
    ));
    let memory: Arc<dyn LimitStore> = Arc::new(MemoryStore::new());

    let cases: Vec<(&str, Vec<LimitSpec>)> = vec![
        ("sliding_log", vec![spec(Algorithm::SlidingLog, "b:sl")]),
        (
            "sliding_window",
            vec![spec(Algorithm::SlidingWindow, "b:sw")],
        ),
        ("gcra", vec![spec(Algorithm::Gcra, "b:gc")]),
        ("fixed_window", vec![spec(Algorithm::FixedWindow, "b:fw")]),
        (
            "key + tenant + ip (3 limits)",
            vec![
                spec(Algorithm::SlidingLog, "b3:key"),
                spec(Algorithm::SlidingWindow, "b3:tenant"),
                spec(Algorithm::Gcra, "b3:ip"),
            ],
        ),
    ];
    println!("ops per case: {ops}, concurrency: {CONCURRENCY}");
    println!();
    println!("| limits | Redis store decisions/s | p50 µs | p99 µs | redis-benchmark EVALSHA req/s | store / redis-benchmark | in-process decisions/s |");
    println!("|---|---|---|---|---|---|---|");
    for (name, limits) in cases {
        let r = drive(store.clone(), limits.clone(), ops).await;
        let rb = redis_benchmark(redis.1, &sha, &limits, ops);
        let m = drive(memory.clone(), limits.clone(), ops * 5).await;
        let ratio = rb.map_or("n/a".to_owned(), |rb| format!("{:.2}", r.per_sec / rb));
        let rb = rb.map_or("n/a".to_owned(), |rb| format!("{rb:.0}"));
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {rb} | {ratio} | {:.0} |",
            r.per_sec, r.p50_us, r.p99_us, m.per_sec
        );
    }
}
