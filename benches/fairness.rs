//! Fair-queue benchmark (not a test): what the scheduler costs a request.
//!
//!     cargo bench --bench fairness            # full counts
//!     cargo bench --bench fairness -- quick   # a smoke run
//!
//! Cases, each timed beside a baseline in the same run (a bare
//! `tokio::sync::Semaphore` acquire/release: the least any capacity gate
//! can cost):
//!
//! - uncontended: acquire a free slot and release it, one tenant;
//! - 10 000 queued: one slot, 10 000 requests of 100 tenants waiting; the
//!   time per request to dispatch each in turn (release → pick the least
//!   served tenant → wake its waiter → the waiter runs).
//!
//! CPU time is the process's, from `/proc/self/stat` (utime + stime), over
//! the fixed number of operations.

use std::time::Duration;

use tokio::time::Instant;

use levee::fairness::{FairQueue, QueuePolicy};

fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // After the command name (in parentheses): field 3 (state) first, so
    // utime and stime (fields 14 and 15) are the 12th and 13th.
    let rest: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let field = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let ticks = field(11) + field(12);
    Duration::from_secs_f64(ticks as f64 / 100.0)
}

fn patient() -> QueuePolicy {
    QueuePolicy::try_new("bench", 1, 100_000, Duration::from_secs(300)).expect("policy")
}

async fn uncontended(n: u32) -> (Duration, Duration) {
    let q = FairQueue::new("llm", 64);
    let (t0, c0) = (Instant::now(), cpu());
    for _ in 0..n {
        let p = q.acquire("solo", patient(), 100, None).await.expect("slot");
        drop(p);
    }
    (t0.elapsed() / n, (cpu() - c0) / n)
}

async fn semaphore(n: u32) -> (Duration, Duration) {
    let s = tokio::sync::Semaphore::new(64);
    let (t0, c0) = (Instant::now(), cpu());
    for _ in 0..n {
        let p = s.acquire().await.expect("open");
        drop(p);
    }
    (t0.elapsed() / n, (cpu() - c0) / n)
}

async fn queued(n: usize) -> (Duration, Duration) {
    let q = FairQueue::new("llm", 1);
    let first = q.acquire("t0", patient(), 100, None).await.expect("slot");
    let mut waiters = Vec::with_capacity(n);
    for i in 0..n {
        let q = q.clone();
        let tenant = format!("t{}", i % 100);
        waiters.push(tokio::spawn(async move {
            let p = q
                .acquire(&tenant, patient(), 100, None)
                .await
                .expect("slot");
            drop(p);
        }));
    }
    while q.load().1 < n {
        tokio::task::yield_now().await;
    }
    let (t0, c0) = (Instant::now(), cpu());
    drop(first);
    for w in waiters {
        w.await.expect("waiter");
    }
    (t0.elapsed() / n as u32, (cpu() - c0) / n as u32)
}

#[allow(clippy::print_stdout)] // a benchmark reports on stdout
fn main() {
    // `cargo test` runs benches once without `--bench`: keep that quick.
    let quick = std::env::args().any(|a| a == "quick") || !std::env::args().any(|a| a == "--bench");
    let n = if quick { 20_000 } else { 1_000_000 };
    let queued_n = if quick { 1_000 } else { 10_000 };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (sw, sc) = semaphore(n).await;
        let (uw, uc) = uncontended(n).await;
        let (qw, qc) = queued(queued_n).await;
        println!("| case | wall per request | CPU per request | vs semaphore (CPU) |");
        println!("|---|---|---|---|");
        println!("| tokio Semaphore acquire + release (baseline) | {sw:?} | {sc:?} | 1.00 |");
        let ratio = |c: Duration| c.as_secs_f64() / sc.as_secs_f64().max(1e-12);
        println!(
            "| fair queue, uncontended | {uw:?} | {uc:?} | {:.2} |",
            ratio(uc)
        );
        println!(
            "| fair queue, {queued_n} queued over 100 tenants, per dispatch | {qw:?} | {qc:?} | {:.2} |",
            ratio(qc)
        );
    });
}
