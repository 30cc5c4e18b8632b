//! `levee-chaos soak`: one levee on Redis (jobs, limits, memory) in front
//! of the simulator, under a mixed, bounded load for a fixed time, with
//! the simulator's faults on a cycle and live reloads every few seconds;
//! the gateway's memory and descriptors and Redis's memory and keys are
//! sampled every second, and the run fails when one of them grows after
//! the warm-up or when any request ends in a way it should not.
//!
//! # Layout
//!
//! - `config`: the levee config and the variants reloads switch between.
//! - `traffic`: the load, one open-loop stream per request kind, and the
//!   jobs polled to their end.
//! - `faults`: the simulator's fault cycle and the windows it applied.
//! - `reload`: the reload loop (SIGHUP and `POST /admin/reload`) and its
//!   checks.
//! - `sampler`: `/proc` and `INFO memory` / `DBSIZE` once a second.
//! - `verdict`: slopes, bounds and the assertions.
//! - `report`: `soak.json`, `samples.csv`, `soak.svg`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tokio::time::Instant;

use super::procs::{LeveeEnv, LeveeProc, RedisProc, SimProc};
use super::scenario::Binaries;
use crate::sim::LlmCapacity;

pub mod config;
pub mod faults;
pub mod reload;
pub mod report;
pub mod sampler;
pub mod traffic;
pub mod verdict;

pub use report::SoakReport;
pub use traffic::Rates;
pub use verdict::{bounds, warm_up, Bound, FAULT_GRACE, FD_END_SLACK};

/// Longest wait, after the traffic stops, for accepted jobs to end.
pub const DRAIN: Duration = Duration::from_secs(60);
/// Unexpected requests listed in the report (all are counted).
const UNEXPECTED_SHOWN: usize = 200;
/// How often progress is reported while the soak runs.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakSpec {
    /// How long traffic is sent.
    pub duration: Duration,
    /// Reload while sending (when the levee supports it).
    pub reloads: bool,
    /// Requests per second of each kind.
    pub rates: Rates,
}

/// The processes of a soak; dropping it kills them (by PID).
struct World {
    redis: RedisProc,
    sim: SimProc,
    levee: LeveeProc,
}

/// Runs a soak against `bins` and returns its report; `progress` gets a
/// line every [`PROGRESS_EVERY`].
pub async fn run(
    spec: &SoakSpec,
    bins: &Binaries,
    progress: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<SoakReport> {
    let world = start(bins).await?;
    let (reload_ok, reload_probe) = if spec.reloads {
        let (ok, probe) = reload::supported(&world.levee.url()).await;
        // Reloads are part of what a soak proves: a levee that has lost
        // them fails here rather than soaking without them.
        if !ok {
            anyhow::bail!(
                "reloads were asked for but levee has no live reload ({probe}); \
                 pass --no-reload to soak a build without it"
            );
        }
        (ok, probe)
    } else {
        (false, "disabled (--no-reload)".to_owned())
    };
    progress(&format!(
        "soak: levee pid {} at {}, redis :{}, sim :{}; {}s of traffic; reloads {}",
        world.levee.pid().unwrap_or(0),
        world.levee.url(),
        world.redis.port,
        world.sim.port,
        spec.duration.as_secs(),
        if reload_ok { "on" } else { "off" },
    ));
    let start = Instant::now() + Duration::from_millis(100);
    let observed = drive(spec, &world, reload_ok, start, progress).await?;
    drop(world);
    Ok(judge(spec, observed, start, reload_ok, reload_probe))
}

/// Sends the traffic, the faults and (with `reloads`) the reloads from
/// `start` for `spec.duration`, sampling throughout; returns once the
/// jobs have drained.
async fn drive(
    spec: &SoakSpec,
    world: &World,
    reloads: bool,
    start: Instant,
    progress: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<Observed> {
    let levee_pid = world.levee.pid().context("levee is not running")?;
    let stop = start + spec.duration;
    let records = traffic::Records::default();
    let (stop_tx, stop_rx) = watch::channel(false);
    let targets = sampler::Targets {
        levee_pid,
        sim_pid: world.sim.pid().context("sim is not running")?,
        redis: world.redis.addr(),
        levee: world.levee.url(),
    };
    let sampler = tokio::spawn(sampler::run(targets, records.clone(), start, stop_rx));
    let plan = traffic::Plan {
        levee: world.levee.url(),
        start,
        stop,
        drain_deadline: stop + DRAIN,
        rates: spec.rates.clone(),
    };
    let load = tokio::spawn(traffic::run(plan, records.clone()));
    let sim_url = world.sim.base_url();
    let faults = tokio::spawn(async move { faults::run(&sim_url, start, stop).await });
    let reloader = reload::Reloader {
        levee: world.levee.url(),
        pid: levee_pid,
        path: reload::config_path_of(levee_pid)?,
        llm_url: format!("{}/v1", world.sim.base_url()),
    };
    let reloads = tokio::spawn(async move {
        match reloads {
            true => reloader.run(start, stop).await,
            false => Ok(Vec::new()),
        }
    });
    watch_progress(&load, &records, levee_pid, start, progress).await;
    load.await.context("traffic task")??;
    let _ = stop_tx.send(true);
    Ok(Observed {
        samples: sampler.await.context("sampler task")?,
        windows: faults.await.context("fault task")??,
        reloads: reloads.await.context("reload task")??,
        // A process that exited is a zombie until reaped: no VmRSS.
        alive: sampler::rss_kib(levee_pid).is_some(),
        records,
    })
}

/// Redis, the simulator, and levee on the initial config.
async fn start(bins: &Binaries) -> anyhow::Result<World> {
    let redis = RedisProc::start().await?;
    let sim = SimProc::start(&bins.sim, LlmCapacity::default()).await?;
    let env = LeveeEnv {
        redis_url: redis.url(),
        llm_url: format!("{}/v1", sim.base_url()),
        vector_store_url: sim.base_url(),
    };
    let text = config::render(config::Variant::INITIAL, &env.llm_url);
    let levee = LeveeProc::start(&bins.levee, &text, &env).await?;
    Ok(World { redis, sim, levee })
}

/// Reports progress every [`PROGRESS_EVERY`] until the load task ends.
async fn watch_progress(
    load: &tokio::task::JoinHandle<anyhow::Result<()>>,
    records: &traffic::Records,
    pid: u32,
    start: Instant,
    progress: &(dyn Fn(&str) + Sync),
) {
    let mut tick = tokio::time::interval_at(start + PROGRESS_EVERY, PROGRESS_EVERY);
    while !load.is_finished() {
        tokio::select! {
            _ = tick.tick() => {}
            () = tokio::time::sleep(Duration::from_millis(200)) => continue,
        }
        progress(&format!(
            "soak: t={:.0}s requests={} levee rss={} KiB fds={}",
            start.elapsed().as_secs_f64(),
            records.len(),
            sampler::rss_kib(pid).unwrap_or(0),
            sampler::fds(pid).unwrap_or(0),
        ));
    }
}

/// Everything a soak observed.
struct Observed {
    samples: Vec<sampler::Sample>,
    windows: Vec<faults::Window>,
    reloads: Vec<reload::Reload>,
    records: traffic::Records,
    alive: bool,
}

/// The report: series over the traffic's time only (not the drain),
/// judged after the warm-up.
fn judge(
    spec: &SoakSpec,
    observed: Observed,
    start: Instant,
    reload_ok: bool,
    reload_probe: String,
) -> SoakReport {
    let warm = warm_up(spec.duration);
    let during: Vec<sampler::Sample> = observed
        .samples
        .iter()
        .filter(|s| s.t_s <= spec.duration.as_secs_f64())
        .cloned()
        .collect();
    let mut series: Vec<verdict::Series> = bounds()
        .iter()
        .map(|(name, unit, b)| verdict::series(&during, name, unit, Some(*b), warm))
        .collect();
    for (name, unit) in [("sim_rss", "MiB"), ("sim_fds", "fds")] {
        series.push(verdict::series(&during, name, unit, None, warm));
    }
    let records = observed.records.snapshot();
    let mut assertions =
        verdict::assertions(&records, &observed.windows, &observed.reloads, &series);
    assertions.push(crate::runner::report::Assertion::new(
        "levee alive",
        "the gateway still running at the end".to_owned(),
        if observed.alive { "running" } else { "gone" }.to_owned(),
        observed.alive,
    ));
    SoakReport {
        passed: assertions.iter().all(|a| a.passed),
        duration_s: spec.duration.as_secs_f64(),
        warm_up_s: warm.as_secs_f64(),
        wall_time_s: start.elapsed().as_secs_f64(),
        reloads_enabled: reload_ok,
        reload_probe,
        counts: observed.records.counts(),
        unexpected: records
            .iter()
            .filter(|r| !verdict::expected(r, &observed.windows))
            .take(UNEXPECTED_SHOWN)
            .cloned()
            .collect(),
        series,
        assertions,
        limited_admitted_per_s: limited_rates(&records, &observed.reloads, spec.duration),
        faults: observed.windows,
        reloads: observed.reloads,
        samples: observed.samples,
    }
}

/// The limited tenant's 200s per second under each limit in force
/// (between reloads), from the records: a reload that changes the limit
/// shows here.
fn limited_rates(
    records: &[traffic::Record],
    reloads: &[reload::Reload],
    duration: Duration,
) -> BTreeMap<u32, f64> {
    // (from, limit) phases: the initial limit, then each good reload's.
    let mut phases = vec![(0.0, config::Variant::INITIAL.limited_per_s)];
    phases.extend(
        reloads
            .iter()
            .filter(|r| r.ok && !r.broken)
            .map(|r| (r.t_s, r.limited_per_s)),
    );
    let mut seconds: BTreeMap<u32, f64> = BTreeMap::new();
    let mut admitted: BTreeMap<u32, f64> = BTreeMap::new();
    let end = duration.as_secs_f64();
    for (i, &(from, limit)) in phases.iter().enumerate() {
        let to = phases.get(i + 1).map_or(end, |p| p.0);
        // Leave the first second of a phase out: the sliding window still
        // holds the previous limit's admissions.
        let from = from + 1.0;
        if to <= from {
            continue;
        }
        *seconds.entry(limit).or_default() += to - from;
        *admitted.entry(limit).or_default() += records
            .iter()
            .filter(|r| r.kind == traffic::Kind::Limited && r.label == "200")
            .filter(|r| r.sent_s >= from && r.sent_s < to)
            .count() as f64;
    }
    admitted
        .into_iter()
        .map(|(limit, n)| (limit, n / seconds.get(&limit).copied().unwrap_or(1.0)))
        .collect()
}

/// Where `soak` writes by default.
pub fn default_out() -> PathBuf {
    PathBuf::from("soak-report")
}
