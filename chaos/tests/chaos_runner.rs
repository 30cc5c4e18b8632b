//! The chaos runner end to end: real redis-server, simulator and levee
//! processes. Needs the `levee` binary next to the test executable's
//! target dir (`cargo test --workspace` builds it; otherwise run
//! `cargo build --bins` first).

use std::path::PathBuf;

use levee_chaos::runner::{self, scenario, Binaries, Profile, RunReport};

/// One scenario at a time: each measures latency on a small machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn binaries() -> Binaries {
    let levee = runner::sibling_binary("levee").unwrap_or_else(|| {
        panic!("the levee binary is not built next to this test; run `cargo build --bins` first")
    });
    Binaries {
        levee,
        sim: PathBuf::from(env!("CARGO_BIN_EXE_levee-upstream-sim")),
    }
}

fn describe(report: &RunReport) -> String {
    serde_json::to_string_pretty(
        &report
            .scenarios
            .iter()
            .map(|s| (&s.name, &s.error, &s.assertions))
            .collect::<Vec<_>>(),
    )
    .unwrap_or_default()
}

#[tokio::test]
async fn redis_killed_fail_closed_passes_end_to_end() {
    let _serial = SERIAL.lock().await;
    let profile = Profile::CI;
    let scenarios = [scenario::redis_killed_fail_closed(&profile)];
    let report = runner::run(&profile, &scenarios, &binaries()).await;
    assert!(report.passed, "{}", describe(&report));
    let s = &report.scenarios[0];
    assert_eq!(s.assertions.len(), 4);
    assert!(
        s.totals.get("503").copied().unwrap_or(0) > 100,
        "{:?}",
        s.totals
    );
    assert!(
        s.totals.get("200").copied().unwrap_or(0) > 500,
        "{:?}",
        s.totals
    );
    // The timeline has one slice per 250 ms of load.
    assert_eq!(s.timeline.len(), 64);
}

#[tokio::test]
async fn redis_frozen_without_the_redis_breaker_fails_its_latency_assertion() {
    let _serial = SERIAL.lock().await;
    let profile = Profile::CI;
    // `[resilience.redis.breaker] enabled = false`: every call waits out
    // the 50 ms attempt timeout on the frozen Redis.
    let scenario = scenario::redis_frozen(&profile, false);
    assert!(scenario.config.contains("enabled = false"));
    let report = runner::run(&profile, &[scenario], &binaries()).await;
    let s = &report.scenarios[0];
    assert!(s.error.is_none(), "{}", describe(&report));
    assert!(
        !report.passed,
        "the regression must be caught: {}",
        describe(&report)
    );
    let p99 = s
        .assertions
        .iter()
        .find(|a| a.name == "p99")
        .expect("a p99 assertion");
    assert!(
        !p99.passed,
        "p99 must fail without the breaker: {}",
        p99.measured
    );
    // Nothing else is wrong: every answer is still a 200, and it recovers.
    for a in s.assertions.iter().filter(|a| a.name != "p99") {
        assert!(a.passed, "{} should still hold: {}", a.name, a.measured);
    }
}

#[tokio::test]
async fn burst_absorbed_loses_no_job_and_keeps_the_quiet_tenant_isolated_end_to_end() {
    let _serial = SERIAL.lock().await;
    let profile = Profile::CI;
    let scenario = scenario::burst_absorbed(&profile);
    let report = runner::run(&profile, &[scenario], &binaries()).await;
    assert!(report.passed, "{}", describe(&report));
    let jobs = report.scenarios[0]
        .jobs
        .as_ref()
        .expect("the accepted jobs were read back");
    // Every submission is accounted for: accepted or refused as full.
    assert_eq!(jobs.accepted + jobs.queue_full, jobs.submitted, "{jobs:?}");
    assert_eq!(jobs.other, 0);
    // The queue holds 50; the burst leaves at least that many behind.
    assert!(jobs.accepted >= 50, "{jobs:?}");
    assert_eq!(jobs.lost, 0);
    assert_eq!(jobs.final_status.get("succeeded"), Some(&jobs.accepted));
}
