//! Limiter on Redis Cluster (not a test): decisions per second and
//! per-decision latency of `RedisStore` on one standalone `redis-server`
//! beside a 3-master Redis Cluster (without, and with, a replica per
//! master), in the same run, for a single-slot check (the key limit) and a
//! cross-slot check (the key limit plus a per-IP ceiling, whose `{ip:…}`
//! hash tag is another slot).
//!
//!     cargo bench --bench cluster            # 5 s per mode and case
//!     cargo bench --bench cluster -- quick   # 0.3 s per mode and case
//!
//! Starts its own redis-servers on free loopback ports (the cluster via
//! `tests/support/cluster.rs`) and kills them (by PID) at the end. Prints
//! a Markdown table for BENCHMARKS.md.
#![allow(clippy::print_stdout, missing_docs)]

#[allow(dead_code, unreachable_pub)]
#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use levee::ratelimit::store::{Algorithm, LimitSpec, LimitStore, RedisStore};
use levee::upstream::redis_conn::{LazyCluster, RedisConn};
use redis::cluster_routing::Slot;
use tokio::time::Instant;

const CONCURRENCY: usize = 16;
/// Distinct API keys (and client IPs) the decisions cycle through, so a
/// cluster spreads them over its masters as real traffic would.
const SUBJECTS: usize = 64;
/// Each mode's run is cut into this many slices, interleaved.
const ROUNDS: u32 = 5;

struct Redis(Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> (Redis, u16) {
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
    (Redis(child), port)
}

/// A limit far above the run's volume: every decision admits, so each
/// takes the full read-check-write path (the production default
/// algorithm, sliding log, and the policy's key layout).
fn spec(key: String) -> LimitSpec {
    LimitSpec {
        key,
        algorithm: Algorithm::SlidingLog,
        limit: 1_000_000_000,
        window: Duration::from_secs(60),
        burst: 1_000_000_000,
        cost: 1,
        shadow: false,
    }
}

fn key_limit(subject: usize) -> LimitSpec {
    spec(format!("levee:rl:sl:{{key:bench-{subject}}}:1m:1000000000"))
}

fn ip_ceiling(subject: usize) -> LimitSpec {
    spec(format!(
        "levee:rl:sl:{{ip:10.0.{}.{}}}:1m:1000000000",
        subject / 250,
        subject % 250 + 1
    ))
}

/// The limit sets one case cycles through.
fn case(name: &str) -> Vec<Vec<LimitSpec>> {
    match name {
        "hot" => vec![vec![key_limit(0)]],
        "single" => (0..SUBJECTS).map(|s| vec![key_limit(s)]).collect(),
        _ => (0..SUBJECTS)
            .map(|s| {
                let pair = vec![key_limit(s), ip_ceiling(s)];
                assert_ne!(
                    Slot::for_key(&pair[0].key),
                    Slot::for_key(&pair[1].key),
                    "the cross-slot case needs two slots"
                );
                pair
            })
            .collect(),
    }
}

/// Decisions made and their latencies, over some wall time.
#[derive(Default)]
struct Run {
    wall: Duration,
    lat: Vec<Duration>,
}

impl Run {
    fn per_sec(&self) -> f64 {
        self.lat.len() as f64 / self.wall.as_secs_f64()
    }

    fn pct_us(&mut self, p: f64) -> f64 {
        self.lat.sort_unstable();
        self.lat[((self.lat.len() as f64 - 1.0) * p) as usize].as_secs_f64() * 1e6
    }
}

/// `CONCURRENCY` tasks deciding on `sets` in turn for `run`; adds to `into`.
async fn drive(
    store: &Arc<dyn LimitStore>,
    sets: &Arc<Vec<Vec<LimitSpec>>>,
    run: Duration,
    into: &mut Run,
) {
    let started = Instant::now();
    let until = started + run;
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|t| {
            let (store, sets) = (store.clone(), sets.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut i = t;
                while Instant::now() < until {
                    let limits = &sets[i % sets.len()];
                    let t0 = Instant::now();
                    let d = store
                        .check(limits, &format!("b{t}-{i}"))
                        .await
                        .expect("store up");
                    assert!(d.allowed);
                    lat.push(t0.elapsed());
                    i += CONCURRENCY;
                }
                lat
            })
        })
        .collect();
    for t in tasks {
        into.lat.extend(t.await.expect("join"));
    }
    into.wall += started.elapsed();
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this
    // program without it, as a quick smoke test.
    let quick = std::env::args().any(|a| a == "quick") || !std::env::args().any(|a| a == "--bench");
    let run = if quick {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(5)
    };

    let (_standalone, port) = start_redis();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
    let mut conn = None;
    for _ in 0..100 {
        if let Ok(c) = client.get_connection_manager().await {
            conn = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let single: Arc<dyn LimitStore> = Arc::new(RedisStore::new(
        RedisConn::Single(conn.expect("redis-server did not start")),
        Duration::from_secs(1),
    ));

    // Both clusters have three masters with the same slot ranges; the
    // second also has a replica per master (what a failover needs), which
    // applies every write too.
    let bare = cluster::RedisCluster::start_with(0).await;
    let full = cluster::RedisCluster::start_with(1).await;
    let on = |c: &cluster::RedisCluster| -> Arc<dyn LimitStore> {
        let lazy = LazyCluster::new(&c.seed_urls(), Duration::from_secs(1)).expect("cluster");
        Arc::new(RedisStore::new(
            RedisConn::Cluster(lazy),
            Duration::from_secs(1),
        ))
    };
    let modes: [(&str, Arc<dyn LimitStore>); 3] = [
        ("standalone", single),
        ("cluster, 3 masters", on(&bare)),
        ("cluster, 3 masters + 3 replicas", on(&full)),
    ];
    let masters = full.masters().await;

    let cases = [
        ("hot", "single-slot: key limit, one hot key"),
        ("single", "single-slot: key limit, 64 keys"),
        ("cross", "cross-slot: key limit + IP ceiling, 64 pairs"),
    ];
    println!(
        "run per mode and case: {run:?} in {ROUNDS} interleaved slices, concurrency: \
         {CONCURRENCY}, algorithm: sliding_log, every decision admits"
    );
    for (name, label) in cases {
        // Which masters the case's keys live on.
        let mut per_master: BTreeMap<u16, usize> = BTreeMap::new();
        let mut two_masters = 0;
        let sets = case(name);
        for set in &sets {
            let mut owners = Vec::new();
            for l in set {
                let slot = full.keyslot(&l.key).await;
                let m = masters.iter().find(|m| m.owns(slot)).expect("owner");
                *per_master.entry(m.port).or_insert(0) += 1;
                owners.push(m.port);
            }
            owners.dedup();
            two_masters += usize::from(owners.len() > 1);
        }
        let spread: Vec<String> = per_master.values().map(ToString::to_string).collect();
        println!(
            "{label}: keys per master {}; checks spanning two masters: {two_masters} of {}",
            spread.join(" / "),
            sets.len()
        );
    }
    println!();
    println!("| check | mode | decisions/s | p50 µs | p99 µs | decisions/s vs standalone | p99 vs standalone |");
    println!("|---|---|---|---|---|---|---|");
    for (name, label) in cases {
        let sets = Arc::new(case(name));
        // Warm every mode (connections, slot map, script cache).
        let mut warm = Run::default();
        for (_, store) in &modes {
            drive(store, &sets, Duration::from_millis(100), &mut warm).await;
        }
        // Interleaved slices (standalone, cluster, cluster + replicas,
        // standalone, …): the machine's other load falls on all alike.
        let mut runs: Vec<Run> = modes.iter().map(|_| Run::default()).collect();
        for _ in 0..ROUNDS {
            for ((_, store), r) in modes.iter().zip(&mut runs) {
                drive(store, &sets, run / ROUNDS, r).await;
            }
        }
        let base = (runs[0].per_sec(), runs[0].pct_us(0.99));
        for ((mode, _), r) in modes.iter().zip(&mut runs) {
            let p99 = r.pct_us(0.99);
            println!(
                "| {label} | {mode} | {:.0} | {:.0} | {p99:.0} | {:.2} | {:.2} |",
                r.per_sec(),
                r.pct_us(0.50),
                r.per_sec() / base.0,
                p99 / base.1
            );
        }
    }
}
