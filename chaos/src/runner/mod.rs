//! The chaos runner: real processes, an open-loop load, faults on a
//! schedule, assertions with numbers, and a report.
//!
//! # Layout
//!
//! - [`procs`]: `redis-server`, `levee-upstream-sim` and `levee` as child
//!   processes on free loopback ports, killed by PID.
//! - [`proxy`]: a TCP fault proxy (pass, latency, blackhole, reset).
//! - [`load`]: the open-loop load generator and its samples.
//! - [`scenario`]: the scenarios and [`scenario::execute`].
//! - [`report`]: timelines (HDR histograms per 250 ms), JSON and SVG.
//! - [`soak`]: `levee-chaos soak`, a long mixed load with faults and
//!   reloads that fails on growth of memory, descriptors or Redis.

pub mod cluster;
pub mod load;
pub mod overhead;
pub mod procs;
pub mod proxy;
pub mod report;
pub mod scenario;
pub mod soak;

use std::path::PathBuf;

use tokio::time::Instant;

pub use report::{RunReport, ScenarioReport};
pub use scenario::{Binaries, Profile, Scenario};

/// Runs `scenarios` one after another (never in parallel: on a small
/// machine they would measure each other) and returns the run report.
pub async fn run(profile: &Profile, scenarios: &[Scenario], bins: &Binaries) -> RunReport {
    let started = Instant::now();
    let mut reports = Vec::new();
    for scenario in scenarios {
        let report = match scenario::execute(scenario, bins).await {
            Ok(report) => report,
            Err(e) => ScenarioReport::failed_to_run(scenario, &e),
        };
        reports.push(report);
    }
    RunReport {
        profile: profile.name.to_owned(),
        passed: reports.iter().all(|r| r.passed),
        wall_time_s: started.elapsed().as_secs_f64(),
        scenarios: reports,
    }
}

/// The binary `name` next to the running executable (same target dir),
/// looking one level up too (`target/debug/deps` for tests).
pub fn sibling_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(name), dir.parent()?.join(name)]
        .into_iter()
        .find(|p| p.is_file())
}
