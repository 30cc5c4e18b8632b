//! The runner: starts the processes a scenario needs, drives its load,
//! applies its fault schedule, polls the breaker and the simulator, reads
//! back the jobs the load submitted (`jobs`), and hands it all to the
//! checks. Kept apart from the catalogue and the checks because it is,
//! with `jobs`, the only part that touches real processes.
//!
//! A scenario with a contrast runs twice, each time on fresh processes:
//! the contrast first, then the main run, whose report carries the
//! contrast's beside it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use tokio::sync::watch;
use tokio::time::Instant;

use super::super::load::{self, Sample, Targets};
use super::super::procs::{signal, LeveeEnv, LeveeProc, RedisProc, SimProc, ADMIN_TOKEN};
use super::super::proxy::FaultProxy;
use super::super::report::{Assertion, Event, JobsSummary, ScenarioReport};
use super::checks::{contrast_fails, evaluate};
use super::jobs::{counter_sum, poll_jobs, unix_ms, JobsObserved};
use super::{ms, Action, Scenario};

/// How often the breaker state and the simulator's counters are polled.
pub(super) const POLL_EVERY: Duration = Duration::from_millis(100);

/// Where the binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The `levee` binary.
    pub levee: PathBuf,
    /// The `levee-upstream-sim` binary.
    pub sim: PathBuf,
}

/// One poll of breaker state and simulator counters.
#[derive(Debug, Clone, Default)]
pub struct Poll {
    /// From the start of the load.
    pub at: Duration,
    /// The LLM breaker's state on replica 0.
    pub llm_state: Option<String>,
    /// The simulator's chat counter (None while it is down).
    pub sim_chat: Option<u64>,
}

/// The processes of one run.
struct World {
    redis: RedisProc,
    sim: SimProc,
    redis_proxy: Option<FaultProxy>,
    vector_proxy: Option<FaultProxy>,
    replicas: Vec<LeveeProc>,
    env: LeveeEnv,
    targets: Targets,
}

/// Runs `scenario` against real processes and evaluates its checks; with
/// a contrast, runs that first and reports it beside the main run.
pub async fn execute(scenario: &Scenario, bins: &Binaries) -> anyhow::Result<ScenarioReport> {
    if scenario.name == super::cluster::NAME {
        return super::cluster::execute(scenario, bins).await;
    }
    let Some(spec) = &scenario.contrast else {
        return Ok(run_once(scenario, &scenario.config, bins)
            .await?
            .report(scenario));
    };
    let mut contrast = match run_once(scenario, &spec.config, bins).await {
        Ok(run) => run.report(scenario),
        Err(e) => ScenarioReport::failed_to_run(scenario, &e),
    };
    contrast.variant = Some(spec.label.to_owned());
    let mut run = run_once(scenario, &scenario.config, bins).await?;
    run.assertions.push(contrast_fails(&contrast));
    let mut report = run.report(scenario);
    report.variant = Some(spec.main_label.to_owned());
    report.contrast = Some(Box::new(contrast));
    Ok(report)
}

/// What one run observed, and its evaluated checks.
struct Run {
    samples: Vec<Sample>,
    jobs: Option<JobsObserved>,
    events: Vec<Event>,
    assertions: Vec<Assertion>,
}

impl Run {
    fn report(self, scenario: &Scenario) -> ScenarioReport {
        let mut report = ScenarioReport::new(scenario, &self.samples, self.assertions);
        report.events = self.events;
        if let (Some(drain), Some(jobs)) = (&scenario.jobs, &self.jobs) {
            report.jobs = Some(JobsSummary::new(drain.tenant, &self.samples, jobs));
        }
        report
    }
}

/// One run of `scenario` with levee on `config`: fresh processes, the
/// load, the schedule, the jobs read back; its samples, jobs and
/// evaluated checks.
async fn run_once(scenario: &Scenario, config: &str, bins: &Binaries) -> anyhow::Result<Run> {
    let redis = RedisProc::start().await?;
    let sim = SimProc::start(&bins.sim, scenario.sim).await?;
    let redis_proxy = match scenario.redis_proxy {
        true => Some(FaultProxy::start(redis.addr()).await?),
        false => None,
    };
    let sim_addr = std::net::SocketAddr::from(([127, 0, 0, 1], sim.port));
    let vector_proxy = match scenario.vector_proxy {
        true => Some(FaultProxy::start(sim_addr).await?),
        false => None,
    };
    let env = LeveeEnv {
        redis_url: redis_proxy
            .as_ref()
            .map_or_else(|| redis.url(), |p| format!("redis://{}/", p.addr())),
        llm_url: format!("{}/v1", sim.base_url()),
        vector_store_url: vector_proxy
            .as_ref()
            .map_or_else(|| sim.base_url(), |p| format!("http://{}", p.addr())),
    };
    let mut replicas = Vec::new();
    for _ in 0..scenario.replicas {
        replicas.push(LeveeProc::start(&bins.levee, config, &env).await?);
    }
    let targets = Targets::new(replicas.iter().map(LeveeProc::url).collect());
    let mut world = World {
        redis,
        sim,
        redis_proxy,
        vector_proxy,
        replicas,
        env,
        targets,
    };

    let start = Instant::now() + ms(100);
    let epoch_ms = unix_ms() + 100;
    let load = tokio::spawn(load::run(
        scenario.load.clone(),
        world.targets.clone(),
        start,
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    let poller = tokio::spawn(poll(
        world.replicas[0].url(),
        world.sim.base_url(),
        start,
        stop_rx,
    ));
    let mut events = Vec::new();
    for step in &scenario.schedule {
        tokio::time::sleep_until(start + step.at).await;
        apply(&mut world, &step.action, config, bins)
            .await
            .with_context(|| format!("{}: {:?}", scenario.name, step.action))?;
        events.push(Event {
            t_s: start.elapsed().as_secs_f64(),
            action: format!("{:?}", step.action),
        });
    }
    let samples = load.await.context("load task")?;
    let _ = stop_tx.send(true);
    let polls = poller.await.context("poll task")?;
    let jobs = match &scenario.jobs {
        Some(drain) => Some(poll_jobs(drain, &samples, &world.targets, start, epoch_ms).await),
        None => None,
    };
    let end = scenario.load.duration();
    let observed = jobs.clone().unwrap_or_default();
    let assertions = scenario
        .checks
        .iter()
        .map(|c| evaluate(c, &samples, &polls, &observed, end))
        .collect();
    drop(world);
    Ok(Run {
        samples,
        jobs,
        events,
        assertions,
    })
}

/// Applies one fault (or heal) action to the processes of the run;
/// `config` and `bins` start added replicas like the first ones.
async fn apply(
    world: &mut World,
    action: &Action,
    config: &str,
    bins: &Binaries,
) -> anyhow::Result<()> {
    match action {
        Action::KillRedis => world.redis.kill(),
        Action::RestartRedis => world.redis.restart().await?,
        Action::FreezeRedis | Action::ThawRedis => {
            let pid = world.redis.pid().context("redis is not running")?;
            let sig = if matches!(action, Action::FreezeRedis) {
                "STOP"
            } else {
                "CONT"
            };
            signal(pid, sig)?;
        }
        Action::RedisProxy(mode) => {
            world
                .redis_proxy
                .as_ref()
                .context("no redis proxy")?
                .set_mode(*mode);
        }
        Action::VectorProxy(mode) => {
            world
                .vector_proxy
                .as_ref()
                .context("no vector proxy")?
                .set_mode(*mode);
        }
        Action::KillSim => world.sim.kill(),
        Action::RestartSim => world.sim.restart().await?,
        Action::SimFaults(faults) => {
            let client = reqwest::Client::new();
            let url = format!("{}/_faults", world.sim.base_url());
            let req = match faults {
                Value::Null => client.delete(url),
                body => client.post(url).json(body),
            };
            let resp = req.send().await?;
            anyhow::ensure!(
                resp.status().is_success(),
                "faults refused: {}",
                resp.status()
            );
        }
        Action::Unroute(i) => world.targets.remove(*i),
        Action::KillReplicaMidCall {
            replica,
            tenant,
            within,
        } => {
            world.targets.remove(*replica);
            let levee = world
                .replicas
                .get_mut(*replica)
                .context("no such replica")?;
            wait_for_llm_dispatch(&levee.url(), tenant, *within).await;
            levee.kill();
        }
        Action::KillReplica(i) => {
            world.targets.remove(*i);
            world
                .replicas
                .get_mut(*i)
                .context("no such replica")?
                .kill();
        }
        Action::AddReplica => {
            let replica = LeveeProc::start(&bins.levee, config, &world.env).await?;
            world.targets.add(replica.url());
            world.replicas.push(replica);
        }
    }
    Ok(())
}

/// Returns once the replica at `levee` gives one of `tenant`'s requests
/// an LLM slot (`levee_fair_queue_dispatched_total{dependency="llm"}`
/// rises between two reads of its `/metrics`, 10 ms apart), or after
/// `within`.
async fn wait_for_llm_dispatch(levee: &str, tenant: &str, within: Duration) {
    let Ok(client) = reqwest::Client::builder().timeout(ms(500)).build() else {
        return;
    };
    let labels = [
        r#"dependency="llm""#.to_owned(),
        format!(r#"tenant="{tenant}""#),
    ];
    let read = || async {
        let text = client
            .get(format!("{levee}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        Some(counter_sum(
            &text,
            "levee_fair_queue_dispatched_total",
            &labels,
        ))
    };
    let deadline = Instant::now() + within;
    let mut before = read().await;
    while Instant::now() < deadline {
        tokio::time::sleep(ms(10)).await;
        let now = read().await;
        if let (Some(a), Some(b)) = (before, now) {
            if b > a {
                return;
            }
        }
        before = now.or(before);
    }
}

/// Polls the LLM breaker (replica `levee`) and the simulator's chat
/// counter every [`POLL_EVERY`] until stopped.
async fn poll(
    levee: String,
    sim: String,
    start: Instant,
    mut stop: watch::Receiver<bool>,
) -> Vec<Poll> {
    let Ok(client) = reqwest::Client::builder().timeout(ms(500)).build() else {
        return Vec::new();
    };
    let mut polls = Vec::new();
    let mut tick = tokio::time::interval(POLL_EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return polls,
        }
        let at = start.elapsed();
        // The state first, then the counter: every call counted after an
        // "open" reading was admitted while open.
        let llm_state = async {
            let v: Value = client
                .get(format!("{levee}/admin/breakers"))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            v["breakers"]
                .as_array()?
                .iter()
                .find(|b| b["dependency"] == "llm")
                .and_then(|b| b["state"].as_str().map(str::to_owned))
        }
        .await;
        let sim_chat = async {
            let v: Value = client
                .get(format!("{sim}/_stats"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            v["requests"]["chat"].as_u64()
        }
        .await;
        polls.push(Poll {
            at,
            llm_state,
            sim_chat,
        });
    }
}
