//! The scheduler in virtual time: shares by weight and by cost, no
//! starvation, refusals, cancellation and work conservation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;

use super::*;

const MS: Duration = Duration::from_millis(1);

fn policy(weight: u32, max_queue: usize, max_wait: Duration) -> QueuePolicy {
    QueuePolicy::try_new("t", weight, max_queue, max_wait).unwrap()
}

fn patient(weight: u32) -> QueuePolicy {
    policy(weight, 1000, Duration::from_secs(300))
}

/// Tokens served per tenant.
type Served = Arc<Mutex<HashMap<&'static str, u64>>>;

/// One tenant's backlog: `clients` concurrent callers, each looping until
/// `until`: wait for a slot, hold it for `hold`, report `cost` tokens used.
#[derive(Clone, Copy)]
struct Load {
    tenant: &'static str,
    weight: u32,
    cost: u64,
    clients: usize,
    hold: Duration,
    until: Instant,
}

fn backlog(q: &FairQueue, served: &Served, load: Load) {
    let Load {
        tenant,
        weight,
        cost,
        clients,
        hold,
        until,
    } = load;
    for _ in 0..clients {
        let (q, served) = (q.clone(), served.clone());
        tokio::spawn(async move {
            while Instant::now() < until {
                let mut permit = q
                    .acquire(tenant, patient(weight), cost, None)
                    .await
                    .unwrap();
                tokio::time::sleep(hold).await;
                permit.settle(cost);
                *served.lock().unwrap().entry(tenant).or_default() += cost;
                drop(permit);
            }
        });
    }
}

fn ratio(served: &Served, a: &str, b: &str) -> f64 {
    let s = served.lock().unwrap();
    s[a] as f64 / s[b] as f64
}

#[tokio::test(start_paused = true)]
async fn two_backlogged_tenants_with_weights_2_to_1_are_served_2_to_1_by_cost() {
    let q = FairQueue::new("llm", 2);
    let served = Served::default();
    let until = Instant::now() + Duration::from_secs(10);
    backlog(
        &q,
        &served,
        Load {
            tenant: "heavy",
            weight: 2,
            cost: 100,
            clients: 8,
            hold: 10 * MS,
            until,
        },
    );
    backlog(
        &q,
        &served,
        Load {
            tenant: "light",
            weight: 1,
            cost: 100,
            clients: 8,
            hold: 10 * MS,
            until,
        },
    );
    tokio::time::sleep(Duration::from_secs(11)).await;
    let r = ratio(&served, "heavy", "light");
    assert!((1.8..=2.2).contains(&r), "served heavy:light = {r:.3}");
}

#[tokio::test(start_paused = true)]
async fn a_tenant_with_10x_larger_requests_gets_an_equal_token_share() {
    let q = FairQueue::new("llm", 1);
    let served = Served::default();
    let until = Instant::now() + Duration::from_secs(20);
    backlog(
        &q,
        &served,
        Load {
            tenant: "big",
            weight: 1,
            cost: 1000,
            clients: 4,
            hold: 10 * MS,
            until,
        },
    );
    backlog(
        &q,
        &served,
        Load {
            tenant: "small",
            weight: 1,
            cost: 100,
            clients: 4,
            hold: 10 * MS,
            until,
        },
    );
    tokio::time::sleep(Duration::from_secs(21)).await;
    let r = ratio(&served, "big", "small");
    assert!((0.9..=1.1).contains(&r), "tokens big:small = {r:.3}");
}

#[tokio::test(start_paused = true)]
async fn estimates_are_settled_with_real_usage() {
    // "liar" estimates 10 tokens a call but uses 1000; "honest" estimates
    // and uses 100. Settlement makes the liar pay what it used.
    let q = FairQueue::new("llm", 1);
    let served = Served::default();
    let until = Instant::now() + Duration::from_secs(20);
    for _ in 0..4 {
        let (q, served) = (q.clone(), served.clone());
        tokio::spawn(async move {
            while Instant::now() < until {
                let mut p = q.acquire("liar", patient(1), 10, None).await.unwrap();
                tokio::time::sleep(10 * MS).await;
                p.settle(1000);
                *served.lock().unwrap().entry("liar").or_default() += 1000;
            }
        });
    }
    backlog(
        &q,
        &served,
        Load {
            tenant: "honest",
            weight: 1,
            cost: 100,
            clients: 4,
            hold: 10 * MS,
            until,
        },
    );
    tokio::time::sleep(Duration::from_secs(21)).await;
    let r = ratio(&served, "liar", "honest");
    assert!((0.85..=1.15).contains(&r), "tokens liar:honest = {r:.3}");
}

#[tokio::test(start_paused = true)]
async fn a_light_tenant_is_never_starved_by_a_heavy_one() {
    let q = FairQueue::new("llm", 1);
    let served = Served::default();
    let until = Instant::now() + Duration::from_secs(20);
    backlog(
        &q,
        &served,
        Load {
            tenant: "whale",
            weight: 50,
            cost: 100,
            clients: 16,
            hold: 10 * MS,
            until,
        },
    );
    backlog(
        &q,
        &served,
        Load {
            tenant: "minnow",
            weight: 1,
            cost: 100,
            clients: 1,
            hold: 10 * MS,
            until,
        },
    );
    tokio::time::sleep(Duration::from_secs(21)).await;
    // 2 000 slots in 20 s; a 1/51 share is about 39 of them.
    let minnow = served.lock().unwrap()["minnow"] / 100;
    assert!((30..=50).contains(&minnow), "minnow got {minnow} calls");
}

#[tokio::test(start_paused = true)]
async fn uncontended_calls_take_a_free_slot_at_once() {
    let q = FairQueue::new("llm", 4);
    let start = Instant::now();
    let mut permits = Vec::new();
    for _ in 0..4 {
        let p = q.acquire("solo", patient(1), 100, None).now_or_never();
        permits.push(p.expect("no wait").expect("admitted"));
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(q.load(), (4, 0));
    drop(permits);
    assert_eq!(q.load(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn idle_capacity_goes_to_whoever_is_waiting() {
    // Work-conserving: with "quiet" idle, "busy" gets every slot, and a
    // freed slot is handed on without waiting for anything else.
    let q = FairQueue::new("llm", 2);
    let a = q.acquire("busy", patient(1), 100, None).await.unwrap();
    let _b = q.acquire("busy", patient(1), 100, None).await.unwrap();
    let q2 = q.clone();
    let waiter = tokio::spawn(async move {
        let t = Instant::now();
        let p = q2.acquire("busy", patient(1), 100, None).await.unwrap();
        (t.elapsed(), p)
    });
    tokio::time::sleep(50 * MS).await;
    assert_eq!(q.load(), (2, 1));
    drop(a);
    let (waited, _p) = waiter.await.unwrap();
    assert_eq!(waited, 50 * MS, "dispatched the instant a slot freed");
    assert_eq!(q.load(), (2, 0));
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_is_refused_at_once_as_the_tenants_own_doing() {
    let q = FairQueue::new("llm", 1);
    let _held = q.acquire("noisy", patient(1), 1, None).await.unwrap();
    let tight = policy(1, 2, Duration::from_secs(10));
    let w1 = tokio::spawn({
        let q = q.clone();
        async move { q.acquire("noisy", tight, 1, None).await.map(drop) }
    });
    let w2 = tokio::spawn({
        let q = q.clone();
        async move { q.acquire("noisy", tight, 1, None).await.map(drop) }
    });
    tokio::task::yield_now().await;
    assert_eq!(q.load(), (1, 2));
    let start = Instant::now();
    let err = q.acquire("noisy", tight, 1, None).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO, "refused without waiting");
    let full = err
        .downcast_ref::<TenantQueueFull>()
        .expect("TenantQueueFull");
    assert!(full.retry_after >= Duration::from_secs(1));
    w1.abort();
    w2.abort();
}

#[tokio::test(start_paused = true)]
async fn a_wait_past_max_wait_is_refused_at_max_wait_never_later() {
    let q = FairQueue::new("llm", 1);
    let _held = q.acquire("noisy", patient(1), 1, None).await.unwrap();
    let start = Instant::now();
    let err = q
        .acquire("noisy", policy(1, 10, 100 * MS), 1, None)
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), 100 * MS);
    assert!(err.is::<TenantQueueFull>(), "{err}");
    assert_eq!(q.load(), (1, 0), "the refused request left the queue");

    // A tenant holding nothing, kept out by someone else's use of all of
    // the capacity, is not at fault: the backend is saturated.
    let err = q
        .acquire("quiet", policy(1, 10, 100 * MS), 1, None)
        .await
        .unwrap_err();
    let o = err.downcast_ref::<Overloaded>().expect("Overloaded");
    assert!(o.retry_after >= Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_cannot_fit_max_wait_is_refused_at_once() {
    let q = FairQueue::new("llm", 1);
    // One call held for 1 s teaches the queue the service time.
    let p = q.acquire("noisy", patient(1), 1, None).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(p);
    let _held = q.acquire("noisy", patient(1), 1, None).await.unwrap();
    let start = Instant::now();
    let err = q
        .acquire("noisy", policy(1, 10, 200 * MS), 1, None)
        .await
        .unwrap_err();
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "a 1 s wait cannot fit 200 ms"
    );
    assert!(err.is::<TenantQueueFull>());
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_wait_too() {
    let q = FairQueue::new("llm", 1);
    let _held = q.acquire("a", patient(1), 1, None).await.unwrap();
    let start = Instant::now();
    let deadline = start + 30 * MS;
    let err = q.acquire("a", patient(1), 1, Some(deadline)).await;
    assert!(err.is_err());
    assert_eq!(start.elapsed(), 30 * MS);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_leaves_its_queue_at_once() {
    let q = FairQueue::new("llm", 1);
    let held = q.acquire("a", patient(1), 1, None).await.unwrap();
    let one = policy(1, 1, Duration::from_secs(10));
    let waiter = tokio::spawn({
        let q = q.clone();
        async move { q.acquire("a", one, 1, None).await.map(drop) }
    });
    tokio::task::yield_now().await;
    assert_eq!(q.load(), (1, 1));
    waiter.abort();
    let _ = waiter.await;
    assert_eq!(
        q.load(),
        (1, 0),
        "the client went away: its slot in the queue is free"
    );
    // The freed place is usable, and the next slot goes to it.
    let next = tokio::spawn({
        let q = q.clone();
        async move { q.acquire("a", one, 1, None).await.map(drop) }
    });
    tokio::task::yield_now().await;
    assert_eq!(q.load(), (1, 1));
    drop(held);
    next.await.unwrap().unwrap();
    assert_eq!(q.load(), (0, 0));
}

#[test]
fn bad_policies_are_refused_naming_the_key_and_value() {
    let prefix = "ratelimit.tenants.acme";
    let cases = [
        (
            0,
            10,
            Duration::from_secs(1),
            "ratelimit.tenants.acme.weight",
            "0",
        ),
        (
            5000,
            10,
            Duration::from_secs(1),
            "ratelimit.tenants.acme.weight",
            "5000",
        ),
        (
            1,
            0,
            Duration::from_secs(1),
            "ratelimit.tenants.acme.max_queue",
            "0",
        ),
        (
            1,
            10,
            Duration::ZERO,
            "ratelimit.tenants.acme.max_wait",
            "0s",
        ),
        (
            1,
            10,
            Duration::from_secs(3600),
            "ratelimit.tenants.acme.max_wait",
            "1h",
        ),
    ];
    for (w, q, wait, key, value) in cases {
        let err = QueuePolicy::try_new(prefix, w, q, wait).unwrap_err();
        assert_eq!(err.key(), key);
        assert!(err.to_string().contains(value), "{err}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_tenant_under_its_share_waits_about_one_interval_while_another_floods() {
    // Capacity 8, calls of exactly 100 ms: unpaced, the flood's calls would
    // start and end together, and a newcomer would wait up to 100 ms for
    // the next burst of releases. Paced, releases come every 12.5 ms.
    let service = 100 * MS;
    let q = FairQueue::new("llm", 8);
    let served = Served::default();
    let until = Instant::now() + Duration::from_secs(6);
    backlog(
        &q,
        &served,
        Load {
            tenant: "noisy",
            weight: 1,
            cost: 100,
            clients: 40,
            hold: service,
            until,
        },
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut worst = Duration::ZERO;
    let mut quiet_calls = 0u64;
    while Instant::now() + Duration::from_secs(1) < until {
        let t = Instant::now();
        let p = q.acquire("quiet", patient(1), 100, None).await.unwrap();
        worst = worst.max(t.elapsed());
        tokio::time::sleep(service).await;
        drop(p);
        quiet_calls += 1;
        // Arrivals that do not line up with the service time.
        tokio::time::sleep(37 * MS).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        worst <= 2 * service / 8,
        "quiet waited up to {worst:?}; an interval is {:?}",
        service / 8
    );
    // The pace is the backend's own rate: the flood still gets what the
    // quiet tenant leaves (8 slots / 100 ms = 80 calls/s, minus quiet's).
    let noisy = served.lock().unwrap()["noisy"] / 100;
    let left = 6.0 * 80.0 - quiet_calls as f64;
    assert!(
        noisy as f64 >= 0.9 * left,
        "noisy got {noisy} calls of the {left} the quiet tenant left"
    );
}
