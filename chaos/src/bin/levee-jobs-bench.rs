//! `levee-jobs-bench`: the driver of `benches/jobs/bench.sh`. Three
//! measurements of a running gateway's job queues, each printed as one
//! JSON object on stdout:
//!
//! - `submit`: closed loop, `--clients` concurrent clients each sending
//!   `POST /v1/jobs` as soon as the previous one answered, for a fixed
//!   time after a warm-up; submissions per second (overall and per
//!   second of the run), latency, and the CPU the gateway (and Redis)
//!   spent per submission, from `/proc/<pid>/stat`.
//! - `e2e`: one job at a time on an idle queue: submit, then
//!   `GET /v1/jobs/{id}` every `--poll` until it is finished; the
//!   client-side time, and the job's own timestamps split into the wait
//!   before a worker started it and the run.
//! - `fill`: submits exactly `--jobs` jobs (for the memory per queued job).
//!
//! Loopback targets only; every request has a timeout and every
//! measurement a fixed length or count, so it stops by itself.
//!
//! ```text
//! levee-jobs-bench submit --url http://127.0.0.1:8080 --key K --clients 16 \
//!     --duration 10s --gateway-pid 1234 [--redis-pid 1200]
//! levee-jobs-bench e2e --url http://127.0.0.1:8080 --key K --jobs 200 --poll 5ms
//! levee-jobs-bench fill --url http://127.0.0.1:8080 --key K --jobs 10000
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use levee_chaos::runner::overhead::{
    check_loopback, clock_ticks_per_second, cpu_ticks, parse_duration, Percentiles,
};
use serde_json::{json, Value};
use tokio::time::Instant;

/// The body of every submission (a `/v1/chat` body).
const BODY: &str = r#"{"message":"What is the PTO policy?","user_id":"u1","thread_id":"t1"}"#;

/// Most clients accepted.
const MAX_CLIENTS: usize = 1024;
/// Most jobs accepted by `e2e` and `fill`.
const MAX_JOBS: usize = 1_000_000;
/// Longest run accepted.
const MAX_DURATION: Duration = Duration::from_secs(600);
/// How long `e2e` waits for one job before counting it as lost.
const JOB_WAIT: Duration = Duration::from_secs(30);

/// Command line of `levee-jobs-bench`.
#[derive(Debug, Parser)]
#[command(version, about = "Job queue benchmark driver (loopback only)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Closed-loop submissions for a fixed time.
    Submit(SubmitArgs),
    /// End-to-end latency of one job at a time on an idle queue.
    E2e(E2eArgs),
    /// Submit exactly --jobs jobs.
    Fill(FillArgs),
}

/// Where and as whom.
#[derive(Debug, Args)]
struct Target {
    /// The gateway's base URL (loopback only), e.g. http://127.0.0.1:8080.
    #[arg(long)]
    url: String,
    /// The API key (sent as X-API-Key).
    #[arg(long)]
    key: String,
    /// Client timeout of one request.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    timeout: Duration,
}

#[derive(Debug, Args)]
struct SubmitArgs {
    #[command(flatten)]
    target: Target,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Length of the measured run.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,
    /// Length of the warm-up before it (not counted).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    warmup: Duration,
    /// The gateway's PID, for its CPU per submission.
    #[arg(long, value_name = "PID")]
    gateway_pid: Option<u32>,
    /// redis-server's PID, for its CPU per submission.
    #[arg(long, value_name = "PID")]
    redis_pid: Option<u32>,
}

#[derive(Debug, Args)]
struct E2eArgs {
    #[command(flatten)]
    target: Target,
    /// Jobs measured, one at a time.
    #[arg(long, default_value_t = 200)]
    jobs: usize,
    /// Jobs run first and not counted (the first also makes the tenant
    /// known to the workers).
    #[arg(long, default_value_t = 5)]
    warmup_jobs: usize,
    /// Interval between two polls of a job.
    #[arg(long, value_parser = parse_duration, default_value = "5ms")]
    poll: Duration,
}

#[derive(Debug, Args)]
struct FillArgs {
    #[command(flatten)]
    target: Target,
    /// Jobs to submit.
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
}

/// The HTTP side: one keep-alive client, the base URL and the key.
#[derive(Clone)]
struct Gateway {
    http: reqwest::Client,
    base: Arc<str>,
    key: Arc<str>,
}

/// How one submission ended.
enum Submission {
    /// 202 with this job id.
    Accepted(String),
    /// Anything else, by kind (`http_429`, `timeout`, …).
    Refused(String),
}

impl Gateway {
    fn new(target: &Target) -> anyhow::Result<Self> {
        let base = check_loopback(&target.url).context("--url")?;
        if target.key.is_empty() {
            bail!("--key must not be empty");
        }
        if target.timeout.is_zero() || target.timeout > Duration::from_secs(60) {
            bail!("--timeout must be between 1ms and 60s");
        }
        let http = reqwest::Client::builder()
            .http1_only()
            .pool_max_idle_per_host(MAX_CLIENTS)
            .tcp_nodelay(true)
            .no_proxy()
            .connect_timeout(target.timeout)
            .timeout(target.timeout)
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            http,
            base: base.into(),
            key: target.key.as_str().into(),
        })
    }

    async fn submit(&self) -> Submission {
        let sent = self
            .http
            .post(format!("{}/v1/jobs", self.base))
            .header("x-api-key", &*self.key)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(BODY)
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(e) => return Submission::Refused(transport(&e)),
        };
        let status = resp.status();
        let body = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => return Submission::Refused(transport(&e)),
        };
        if status != reqwest::StatusCode::ACCEPTED {
            return Submission::Refused(format!("http_{}", status.as_u16()));
        }
        match serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["job_id"].as_str().map(str::to_owned))
        {
            Some(id) => Submission::Accepted(id),
            None => Submission::Refused("bad_body".to_owned()),
        }
    }

    async fn get(&self, id: &str) -> anyhow::Result<Value> {
        let resp = self
            .http
            .get(format!("{}/v1/jobs/{id}", self.base))
            .header("x-api-key", &*self.key)
            .send()
            .await
            .context("GET /v1/jobs/{id}")?;
        let status = resp.status();
        let body = resp.bytes().await.context("reading a job")?;
        if !status.is_success() {
            bail!(
                "GET /v1/jobs/{id} answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        serde_json::from_slice(&body).context("a job that is not JSON")
    }
}

fn transport(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".to_owned()
    } else {
        "transport".to_owned()
    }
}

/// One client's tally.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    /// Completion times from the start of the measured run.
    ended: Vec<Duration>,
    errors: BTreeMap<String, usize>,
}

/// Closed loop of `clients` until `until`; completions before `from` are
/// not counted.
async fn closed_loop(gw: &Gateway, clients: usize, from: Instant, until: Instant) -> Vec<Tally> {
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let gw = gw.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                while Instant::now() < until {
                    let sent = Instant::now();
                    let outcome = gw.submit().await;
                    let now = Instant::now();
                    if sent < from {
                        continue;
                    }
                    match outcome {
                        Submission::Accepted(_) => {
                            tally.latencies.push(now - sent);
                            tally.ended.push(now - from);
                        }
                        Submission::Refused(kind) => *tally.errors.entry(kind).or_insert(0) += 1,
                    }
                }
                tally
            })
        })
        .collect();
    let mut out = Vec::with_capacity(clients);
    for t in tasks {
        out.push(t.await.unwrap_or_default());
    }
    out
}

fn ticks(pid: Option<u32>) -> anyhow::Result<Option<u64>> {
    pid.map(cpu_ticks).transpose()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn submit(args: SubmitArgs) -> anyhow::Result<Value> {
    let gw = Gateway::new(&args.target)?;
    if !(1..=MAX_CLIENTS).contains(&args.clients) {
        bail!("--clients must be between 1 and {MAX_CLIENTS}");
    }
    if args.duration.is_zero() || args.duration > MAX_DURATION || args.warmup > MAX_DURATION {
        bail!("--duration and --warmup must be at most {MAX_DURATION:?} (duration > 0)");
    }
    let hz = clock_ticks_per_second()?;
    if let Submission::Refused(kind) = gw.submit().await {
        bail!("the first submission was refused ({kind}): check the key and [jobs]");
    }
    let start = Instant::now();
    let from = start + args.warmup;
    let until = from + args.duration;
    let run = {
        let gw = gw.clone();
        tokio::spawn(async move { closed_loop(&gw, args.clients, from, until).await })
    };
    tokio::time::sleep_until(from).await;
    let (g0, r0) = (ticks(args.gateway_pid)?, ticks(args.redis_pid)?);
    let tallies = run.await.context("the clients failed")?;
    let elapsed = from.elapsed();
    let (g1, r1) = (ticks(args.gateway_pid)?, ticks(args.redis_pid)?);
    let mut latencies = Vec::new();
    let mut errors = BTreeMap::new();
    let seconds = args.duration.as_secs().max(1) as usize;
    let mut per_second = vec![0u64; seconds];
    for t in tallies {
        latencies.extend(t.latencies);
        for e in t.ended {
            if let Some(slot) = per_second.get_mut(e.as_secs() as usize) {
                *slot += 1;
            }
        }
        for (k, v) in t.errors {
            *errors.entry(k).or_insert(0) += v;
        }
    }
    let accepted = latencies.len();
    let per = |before: Option<u64>, after: Option<u64>| match (before, after) {
        (Some(b), Some(a)) => {
            let secs = a.saturating_sub(b) as f64 / hz as f64;
            json!(secs * 1e6 / accepted.max(1) as f64)
        }
        _ => Value::Null,
    };
    let p = Percentiles::of(latencies);
    Ok(json!({
        "measure": "submit",
        "clients": args.clients,
        "duration_s": elapsed.as_secs_f64(),
        "accepted": accepted,
        "errors": errors,
        "per_second": per_second,
        "rate": accepted as f64 / elapsed.as_secs_f64(),
        "latency_ms": p,
        "gateway_cpu_us_per_submission": per(g0, g1),
        "redis_cpu_us_per_submission": per(r0, r1),
    }))
}

/// Milliseconds since the Unix epoch of `2026-12-01T13:20:00.123Z`
/// (what the gateway writes: RFC 3339, UTC, optional fraction).
fn rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[10] != b'T' || !s.ends_with('Z') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let frac = match s.get(19..s.len() - 1) {
        Some(f) if f.starts_with('.') => {
            let digits = &f[1..];
            let mut v: i64 = digits.get(..3.min(digits.len()))?.parse().ok()?;
            for _ in digits.len()..3 {
                v *= 10;
            }
            v
        }
        _ => 0,
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + frac)
}

/// One job, submit to finished: client time, polls, and the view.
async fn one_job(gw: &Gateway, poll: Duration) -> anyhow::Result<(Duration, usize, Value)> {
    let t0 = Instant::now();
    let id = match gw.submit().await {
        Submission::Accepted(id) => id,
        Submission::Refused(kind) => bail!("a submission was refused ({kind})"),
    };
    let mut polls = 0;
    loop {
        if t0.elapsed() > JOB_WAIT {
            bail!("job {id} not finished within {JOB_WAIT:?}");
        }
        tokio::time::sleep(poll).await;
        polls += 1;
        let view = gw.get(&id).await?;
        match view["status"].as_str() {
            Some("queued" | "running") => {}
            Some("succeeded") => return Ok((t0.elapsed(), polls, view)),
            other => bail!("job {id} ended {other:?}: {view}"),
        }
    }
}

async fn e2e(args: E2eArgs) -> anyhow::Result<Value> {
    let gw = Gateway::new(&args.target)?;
    if !(1..=MAX_JOBS).contains(&args.jobs) || args.warmup_jobs > MAX_JOBS {
        bail!("--jobs must be between 1 and {MAX_JOBS}");
    }
    if args.poll.is_zero() || args.poll > Duration::from_secs(1) {
        bail!("--poll must be between 1ms and 1s");
    }
    for _ in 0..args.warmup_jobs {
        one_job(&gw, args.poll).await?;
    }
    let (mut total, mut wait, mut run) = (Vec::new(), Vec::new(), Vec::new());
    let mut polls = 0;
    for _ in 0..args.jobs {
        let (took, n, view) = one_job(&gw, args.poll).await?;
        total.push(took);
        polls += n;
        let at = |k: &str| view[k].as_str().and_then(rfc3339_ms);
        if let (Some(q), Some(s), Some(f)) =
            (at("enqueued_at"), at("started_at"), at("finished_at"))
        {
            let d = |a: i64, b: i64| Duration::from_millis(u64::try_from(b - a).unwrap_or(0));
            wait.push(d(q, s));
            run.push(d(s, f));
        }
    }
    Ok(json!({
        "measure": "e2e",
        "jobs": args.jobs,
        "poll_ms": ms(args.poll),
        "polls_per_job": polls as f64 / args.jobs as f64,
        "total_ms": Percentiles::of(total),
        "queued_ms": Percentiles::of(wait),
        "running_ms": Percentiles::of(run),
    }))
}

async fn fill(args: FillArgs) -> anyhow::Result<Value> {
    let gw = Gateway::new(&args.target)?;
    if !(1..=MAX_JOBS).contains(&args.jobs) {
        bail!("--jobs must be between 1 and {MAX_JOBS}");
    }
    if !(1..=MAX_CLIENTS).contains(&args.clients) {
        bail!("--clients must be between 1 and {MAX_CLIENTS}");
    }
    let left = Arc::new(std::sync::atomic::AtomicUsize::new(args.jobs));
    let start = Instant::now();
    let tasks: Vec<_> = (0..args.clients)
        .map(|_| {
            let (gw, left) = (gw.clone(), left.clone());
            tokio::spawn(async move {
                let mut errors: BTreeMap<String, usize> = BTreeMap::new();
                let mut accepted = 0usize;
                while left
                    .fetch_update(
                        std::sync::atomic::Ordering::Relaxed,
                        std::sync::atomic::Ordering::Relaxed,
                        |n| n.checked_sub(1),
                    )
                    .is_ok()
                {
                    match gw.submit().await {
                        Submission::Accepted(_) => accepted += 1,
                        Submission::Refused(kind) => *errors.entry(kind).or_insert(0) += 1,
                    }
                }
                (accepted, errors)
            })
        })
        .collect();
    let (mut accepted, mut errors) = (0, BTreeMap::new());
    for t in tasks {
        let (a, e) = t.await.context("a client failed")?;
        accepted += a;
        for (k, v) in e {
            *errors.entry(k).or_insert(0) += v;
        }
    }
    Ok(json!({
        "measure": "fill",
        "jobs": args.jobs,
        "accepted": accepted,
        "errors": errors,
        "seconds": start.elapsed().as_secs_f64(),
    }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let out = match Cli::parse().command {
        Command::Submit(a) => submit(a).await?,
        Command::E2e(a) => e2e(a).await?,
        Command::Fill(a) => fill(a).await?,
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{out}")?;
    stdout.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_parses_what_the_gateway_writes() {
        assert_eq!(rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_ms("1970-01-01T00:00:01.5Z"), Some(1500));
        assert_eq!(
            rfc3339_ms("2000-03-01T00:00:00.000Z"),
            Some(951_868_800_000)
        );
        assert_eq!(
            rfc3339_ms("2026-12-01T13:20:00.123Z")
                .map(|a| a - rfc3339_ms("2026-12-01T13:19:59.999Z").unwrap_or(0)),
            Some(124)
        );
        assert_eq!(rfc3339_ms("yesterday"), None);
    }
}
