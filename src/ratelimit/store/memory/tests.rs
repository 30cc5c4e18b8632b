//! The in-process store against independent reference models, plus the
//! guarantees callers rely on: exact retry times, rejected requests
//! consuming nothing, shadow limits, all-or-nothing, adjust, bounded memory.

use proptest::prelude::*;

use super::*;
use crate::ratelimit::store::models::model;

const ALGORITHMS: [(Algorithm, &str); 4] = [
    (Algorithm::SlidingLog, "sliding_log"),
    (Algorithm::SlidingWindow, "sliding_window"),
    (Algorithm::Gcra, "gcra"),
    (Algorithm::FixedWindow, "fixed_window"),
];

fn spec(key: &str, algorithm: Algorithm, limit: u64, window_us: u64) -> LimitSpec {
    LimitSpec {
        key: key.to_owned(),
        algorithm,
        limit,
        window: Duration::from_micros(window_us),
        burst: 0,
        cost: 1,
        shadow: false,
    }
}

fn with_cost(mut spec: LimitSpec, cost: u64) -> LimitSpec {
    spec.cost = cost;
    spec
}

/// One randomised limit and the arrivals hitting it.
#[derive(Debug, Clone)]
struct Scenario {
    algorithm: usize,
    limit: u64,
    window: u64,
    burst: u64,
    start: u64,
    /// (gap since previous arrival µs, cost)
    arrivals: Vec<(u64, u64)>,
}

impl Scenario {
    fn spec(&self, key: &str, cost: u64) -> LimitSpec {
        let mut s = with_cost(
            spec(key, ALGORITHMS[self.algorithm].0, self.limit, self.window),
            cost,
        );
        s.burst = self.burst;
        s
    }

    fn times(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut t = self.start;
        self.arrivals.iter().map(move |&(gap, cost)| {
            t += gap;
            (t, cost)
        })
    }
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        0usize..4,
        1u64..=8,
        500_000u64..2_000_000,
        0u64..=10,
        0u64..5_000_000,
        prop::collection::vec((0u64..400_000, 1u64..=3), 1..60),
    )
        .prop_map(
            |(algorithm, limit, window, burst, start, arrivals)| Scenario {
                algorithm,
                limit,
                window,
                burst,
                start,
                arrivals,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn store_agrees_with_the_reference_model_on_every_decision(sc in scenario()) {
        let mut core = MemoryCore::default();
        let mut reference = model(ALGORITHMS[sc.algorithm].1, sc.limit, sc.window, sc.burst);
        for (t, cost) in sc.times() {
            let decision = core.check_at(t, &[sc.spec("k", cost)]);
            let expected = reference.admits(t, cost);
            prop_assert_eq!(decision.allowed, expected, "at t={} cost={}", t, cost);
            let state = decision.states[0];
            if expected {
                reference.consume(t, cost);
                prop_assert_eq!(state.retry_after, Duration::ZERO);
            } else {
                prop_assert!(state.retry_after > Duration::ZERO);
            }
            prop_assert!(state.remaining <= state.limit);
        }
    }

    #[test]
    fn retry_after_is_exact_for_every_rejection(sc in scenario()) {
        let mut core = MemoryCore::default();
        for (t, cost) in sc.times() {
            let spec = sc.spec("k", cost);
            let decision = core.check_at(t, std::slice::from_ref(&spec));
            let capacity = Params::of(&spec).capacity;
            if decision.allowed || cost > capacity {
                continue;
            }
            let retry = u64::try_from(decision.states[0].retry_after.as_micros()).unwrap();
            let mut probe = core.clone();
            prop_assert!(!probe.check_at(t + retry - 1, std::slice::from_ref(&spec)).allowed,
                "admitted 1 µs before retry_after ({} µs) at t={}", retry, t);
            prop_assert!(probe.check_at(t + retry, std::slice::from_ref(&spec)).allowed,
                "not admitted at retry_after ({} µs) at t={}", retry, t);
        }
    }

    #[test]
    fn sliding_log_never_admits_more_than_the_limit_in_any_window(sc in scenario()) {
        let sc = Scenario { algorithm: 0, ..sc };
        let mut core = MemoryCore::default();
        let mut admitted = Vec::new();
        for (t, cost) in sc.times() {
            if core.check_at(t, &[sc.spec("k", cost)]).allowed {
                admitted.push((t, cost));
            }
        }
        // The busiest interval of length W starts at an admitted instant.
        for &(start, _) in &admitted {
            let units: u64 = admitted
                .iter()
                .filter(|&&(t, _)| t >= start && t < start + sc.window)
                .map(|&(_, c)| c)
                .sum();
            prop_assert!(units <= sc.limit, "{} units in [{}, {})", units, start, start + sc.window);
        }
    }

    #[test]
    fn several_limits_are_consumed_all_or_nothing(
        a in scenario(),
        b_algorithm in 0usize..4,
        b_limit in 1u64..=5,
        shadow_algorithm in 0usize..4,
        shadow_limit in 1u64..=3,
    ) {
        let b = Scenario { algorithm: b_algorithm, limit: b_limit, ..a.clone() };
        let s = Scenario { algorithm: shadow_algorithm, limit: shadow_limit, ..a.clone() };
        let mut models = [
            model(ALGORITHMS[a.algorithm].1, a.limit, a.window, a.burst),
            model(ALGORITHMS[b.algorithm].1, b.limit, b.window, b.burst),
            model(ALGORITHMS[s.algorithm].1, s.limit, s.window, s.burst),
        ];
        let mut core = MemoryCore::default();
        for (t, cost) in a.times() {
            let mut shadow = s.spec("s", cost);
            shadow.shadow = true;
            let decision = core.check_at(t, &[a.spec("a", cost), b.spec("b", cost), shadow]);
            let admits: Vec<bool> = models.iter().map(|m| m.admits(t, cost)).collect();
            let allowed = admits[0] && admits[1];
            prop_assert_eq!(decision.allowed, allowed);
            for (i, m) in models.iter_mut().enumerate() {
                prop_assert_eq!(decision.states[i].allowed, admits[i]);
                if allowed && admits[i] {
                    m.consume(t, cost);
                }
            }
        }
    }
}

#[test]
fn rejected_request_consumes_no_quota() {
    for (algorithm, name) in ALGORITHMS {
        let mut core = MemoryCore::default();
        let limit = with_cost(spec("k", algorithm, 3, 1_000_000), 1);
        for t in 0..3 {
            assert!(
                core.check_at(t, std::slice::from_ref(&limit)).allowed,
                "{name}"
            );
        }
        let first = core.check_at(10, std::slice::from_ref(&limit));
        assert!(!first.allowed, "{name}");
        let retry = u64::try_from(first.states[0].retry_after.as_micros()).unwrap();
        // A client hammering while limited...
        for t in 11..10 + retry {
            if t % 997 == 0 {
                assert!(
                    !core.check_at(t, std::slice::from_ref(&limit)).allowed,
                    "{name}"
                );
            }
        }
        // ...is admitted exactly when the first rejection said.
        assert!(
            core.check_at(10 + retry, std::slice::from_ref(&limit))
                .allowed,
            "{name}"
        );
    }
}

#[test]
fn a_limit_that_rejects_leaves_the_other_limits_untouched() {
    let mut core = MemoryCore::default();
    let wide = spec("wide", Algorithm::SlidingLog, 5, 1_000_000);
    let narrow = spec("narrow", Algorithm::Gcra, 1, 1_000_000);
    let first = core.check_at(0, &[wide.clone(), narrow.clone()]);
    assert!(first.allowed);
    assert_eq!(first.states[0].remaining, 4);
    let second = core.check_at(1, &[wide.clone(), narrow]);
    assert!(!second.allowed);
    assert!(second.states[0].allowed, "the wide limit alone admits");
    assert_eq!(
        second.states[0].remaining, 4,
        "but nothing was taken from it"
    );
    assert_eq!(core.check_at(2, &[wide]).states[0].remaining, 3);
}

#[test]
fn shadow_limits_never_reject_and_count_only_what_they_admit() {
    let mut core = MemoryCore::default();
    let enforced = spec("enforced", Algorithm::FixedWindow, 100, 1_000_000);
    let mut shadow = spec("shadow", Algorithm::SlidingLog, 2, 1_000_000);
    shadow.shadow = true;
    let verdicts: Vec<bool> = (0..5)
        .map(|t| {
            let d = core.check_at(t, &[enforced.clone(), shadow.clone()]);
            assert!(d.allowed, "a shadow limit must never reject");
            d.states[1].allowed
        })
        .collect();
    assert_eq!(verdicts, [true, true, false, false, false]);
    let last = core.check_at(5, &[enforced, shadow]);
    assert_eq!(last.states[0].remaining, 100 - 6);
    assert_eq!(last.states[1].remaining, 0);
    // Only two units were counted, so the shadow log frees up after one window.
    assert_eq!(
        last.states[1].reset_after,
        Duration::from_micros(1_000_000 - 5)
    );
}

#[test]
fn a_cost_above_the_limit_is_rejected_with_retry_after_one_window() {
    for (algorithm, name) in ALGORITHMS {
        let mut core = MemoryCore::default();
        let d = core.check_at(0, &[with_cost(spec("k", algorithm, 3, 2_000_000), 4)]);
        assert!(!d.allowed, "{name}");
        assert_eq!(d.states[0].retry_after, Duration::from_secs(2), "{name}");
    }
}

#[test]
fn fixed_window_admits_twice_the_limit_across_a_window_edge() {
    let mut core = MemoryCore::default();
    let limit = spec("k", Algorithm::FixedWindow, 10, 1_000_000);
    let admitted = (0..20)
        .map(|i| 999_990 + i) // 10 µs before the edge, 10 µs after
        .filter(|&t| core.check_at(t, std::slice::from_ref(&limit)).allowed)
        .count();
    assert_eq!(
        admitted, 20,
        "the documented boundary burst of fixed windows"
    );
    // A sliding log over the same arrivals admits the limit only.
    let mut core = MemoryCore::default();
    let log = spec("k", Algorithm::SlidingLog, 10, 1_000_000);
    let admitted = (0..20)
        .map(|i| 999_990 + i)
        .filter(|&t| core.check_at(t, std::slice::from_ref(&log)).allowed)
        .count();
    assert_eq!(admitted, 10);
}

#[test]
fn gcra_reports_burst_remaining_and_the_time_until_full() {
    let mut core = MemoryCore::default();
    let mut limit = spec("k", Algorithm::Gcra, 10, 10_000_000); // T = 1 s
    limit.burst = 4;
    let d = core.check_at(0, std::slice::from_ref(&limit));
    assert_eq!(d.states[0].limit, 4);
    assert_eq!(d.states[0].remaining, 3);
    assert_eq!(d.states[0].reset_after, Duration::from_secs(1));
    let d = core.check_at(0, &[with_cost(limit.clone(), 3)]);
    assert!(d.allowed);
    assert_eq!(d.states[0].remaining, 0);
    let d = core.check_at(500_000, std::slice::from_ref(&limit));
    assert!(!d.allowed);
    assert_eq!(d.states[0].retry_after, Duration::from_millis(500));
}

#[test]
fn adjust_charges_and_refunds_a_gcra_budget() {
    let mut core = MemoryCore::default();
    let budget = spec("k", Algorithm::Gcra, 10, 10_000_000); // T = 1 s, burst 10
    assert_eq!(
        core.check_at(0, &[with_cost(budget.clone(), 2)]).states[0].remaining,
        8
    );
    core.adjust_at(0, &budget, 5); // real usage was 7
    assert_eq!(
        core.check_at(0, &[with_cost(budget.clone(), 0)]).states[0].remaining,
        3
    );
    core.adjust_at(0, &budget, -4); // then 4 came back
    assert_eq!(
        core.check_at(0, &[with_cost(budget.clone(), 0)]).states[0].remaining,
        7
    );
    core.adjust_at(0, &budget, -100); // a refund never goes below empty
    let d = core.check_at(0, &[with_cost(budget.clone(), 10)]);
    assert!(d.allowed);
    // A forced charge may overdraw: rejected until it is paid back.
    core.adjust_at(0, &budget, 5);
    let d = core.check_at(0, std::slice::from_ref(&budget));
    assert!(!d.allowed);
    assert_eq!(d.states[0].retry_after, Duration::from_secs(6));
}

#[test]
fn adjust_charges_and_refunds_the_window_and_log_algorithms() {
    for (algorithm, name) in [
        (Algorithm::SlidingLog, "sliding_log"),
        (Algorithm::SlidingWindow, "sliding_window"),
        (Algorithm::FixedWindow, "fixed_window"),
    ] {
        let mut core = MemoryCore::default();
        let limit = spec("k", algorithm, 10, 1_000_000);
        core.adjust_at(100, &limit, 7);
        assert_eq!(
            core.check_at(100, &[with_cost(limit.clone(), 0)]).states[0].remaining,
            3,
            "{name}"
        );
        core.adjust_at(100, &limit, 5);
        assert!(
            !core.check_at(100, std::slice::from_ref(&limit)).allowed,
            "{name}: overdrawn"
        );
        core.adjust_at(100, &limit, -4);
        assert_eq!(
            core.check_at(100, &[with_cost(limit.clone(), 0)]).states[0].remaining,
            2,
            "{name}"
        );
        core.adjust_at(100, &limit, -50);
        assert_eq!(
            core.check_at(100, std::slice::from_ref(&limit)).states[0].remaining,
            9,
            "{name}: floored at 0"
        );
    }
}

#[test]
fn sliding_log_refund_removes_the_newest_units() {
    let mut core = MemoryCore::default();
    let limit = spec("k", Algorithm::SlidingLog, 3, 1_000_000);
    assert!(core.check_at(0, std::slice::from_ref(&limit)).allowed);
    core.adjust_at(500_000, &limit, 2);
    core.adjust_at(500_000, &limit, -2);
    // Only the unit at t=0 remains: the log frees a slot at t=1 s.
    let d = core.check_at(600_000, &[with_cost(limit, 3)]);
    assert!(!d.allowed);
    assert_eq!(d.states[0].retry_after, Duration::from_micros(400_000));
}

#[test]
fn expired_entries_are_swept_so_memory_stays_bounded() {
    let mut core = MemoryCore::default();
    for i in 0..20_000u64 {
        let key = format!("client-{i}");
        // Each key is used once; 10 keys are live at any time.
        core.check_at(
            i * 1_000,
            &[spec(&key, ALGORITHMS[(i % 4) as usize].0, 5, 10_000)],
        );
        assert!(
            core.len() <= usize::try_from(SWEEP_EVERY).unwrap() + 10,
            "{} entries at i={i}",
            core.len()
        );
    }
}

#[test]
fn the_sweep_never_forgets_live_state() {
    let mut core = MemoryCore::default();
    let hot = spec("hot", Algorithm::SlidingLog, 1, 60_000_000);
    assert!(core.check_at(0, std::slice::from_ref(&hot)).allowed);
    for i in 0..5_000u64 {
        core.check_at(
            i,
            &[spec(&format!("cold-{i}"), Algorithm::FixedWindow, 5, 10)],
        );
    }
    assert!(!core.check_at(10_000, &[hot]).allowed);
}

#[tokio::test(start_paused = true)]
async fn memory_store_runs_on_tokio_time() {
    let store = MemoryStore::new();
    assert_eq!(store.kind(), "memory");
    let limit = spec("k", Algorithm::SlidingLog, 2, 60_000_000);
    for _ in 0..2 {
        assert!(
            store
                .check(std::slice::from_ref(&limit), "r")
                .await
                .unwrap()
                .allowed
        );
        tokio::time::advance(Duration::from_secs(10)).await;
    }
    let d = store
        .check(std::slice::from_ref(&limit), "r")
        .await
        .unwrap();
    assert!(!d.allowed);
    assert_eq!(d.states[0].retry_after, Duration::from_secs(40));
    tokio::time::advance(Duration::from_secs(40)).await;
    assert!(
        store
            .check(std::slice::from_ref(&limit), "r")
            .await
            .unwrap()
            .allowed
    );
    store.adjust(&limit, 1).await.unwrap();
    assert!(!store.check(&[limit], "r").await.unwrap().allowed);
    assert_eq!(store.len(), 1);
}
