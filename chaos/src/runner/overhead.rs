//! Gateway overhead, measured the way TensorZero and LiteLLM publish it:
//! the same open-loop schedule of OpenAI chat completions sent directly to
//! an upstream and through a gateway to that same upstream, in the same
//! run, at fixed rates; the gateway's cost is the difference.
//!
//! For each rate and mode (plain JSON, and SSE streaming if asked) a
//! [`Plan`] runs: a warm-up of each target (discarded), then direct,
//! gateway, direct, gateway, so slow drift of the machine (thermal, other
//! load) falls on both targets alike; each target's figures combine its
//! two runs.
//!
//! Requests leave on a fixed schedule (`1 / rate` apart), each in its own
//! task whether or not earlier ones have answered, and latency counts from
//! the *scheduled* send time, so a slow target cannot slow the load down
//! and hide its own latency (no coordinated omission). The schedule is
//! paced by a thread of the blocking pool sleeping to each send time (the
//! runtime's timer has a 1 ms grain, which would add up to 1 ms of pacing
//! lag to every request at these rates); the pacing lag is reported too.
//!
//! The client can be held to a number of connections per target
//! (`connections`), as wrk2 holds its `-c`: a request whose send time has
//! come waits for a free one, and that wait counts in its latency (the
//! schedule is still the clock). Unbounded, a stall of a few tens of ms
//! makes the client open hundreds of connections at once, and a listen
//! backlog of 128 drops the excess SYNs: each costs the dropped request a
//! 1 s retransmission, which then measures the TCP stack, not the gateway.
//!
//! Only loopback targets are accepted, every request has a client timeout,
//! and the schedule is finite: a plan stops by itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{bail, Context};
use axum::body::Bytes;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// The system message of every request (the simulator answers from it).
pub const SYSTEM_PROMPT: &str =
    "Employees get 25 days of paid time off. Rollover is permitted up to 5 days.";

/// The user message of every request.
pub const USER_PROMPT: &str = "How many PTO days?";

/// The `max_tokens` of every request.
pub const MAX_TOKENS: u32 = 64;

/// Highest rate accepted, requests per second.
pub const MAX_RATE: u32 = 50_000;

/// Longest run accepted, per rate, mode and target.
pub const MAX_DURATION: Duration = Duration::from_secs(600);

/// Longest client timeout accepted.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// Pause between two runs, so one run's stragglers never overlap the next.
const SETTLE: Duration = Duration::from_millis(250);

/// How long after planning the first request of a run is due.
const LEAD: Duration = Duration::from_millis(20);

/// Plain JSON or SSE streaming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// `"stream": false`: latency until the whole response is read.
    Json,
    /// `"stream": true`: time to first token and until the stream ends.
    Stream,
}

impl Mode {
    /// Its name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Stream => "stream",
        }
    }
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx with a usable completion (for streams: a non-empty content
    /// delta).
    Ok,
    /// A non-2xx status.
    Status(u16),
    /// A 2xx whose body holds no completion text.
    BadBody,
    /// No complete response within the client timeout.
    Timeout,
    /// The connection failed (refused, reset) or the body broke off.
    Transport,
}

impl Outcome {
    /// Its key in the error counts.
    fn key(self) -> String {
        match self {
            Self::Ok => "ok".to_owned(),
            Self::Status(s) => format!("http_{s}"),
            Self::BadBody => "bad_body".to_owned(),
            Self::Timeout => "timeout".to_owned(),
            Self::Transport => "transport".to_owned(),
        }
    }
}

/// One request's record; times count from its scheduled send time.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Until the whole response was read (or the error).
    pub latency: Duration,
    /// Streams: until the first SSE frame with non-empty delta content.
    pub ttft: Option<Duration>,
    /// How far behind schedule the pacer handed it to the runtime.
    pub lag: Duration,
    /// When it ended, from the first scheduled send of its run.
    pub ended: Duration,
    /// How it ended.
    pub outcome: Outcome,
}

/// One run: `rate` requests per second for `duration` to one endpoint.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The full endpoint, `{base}/chat/completions`.
    pub endpoint: String,
    /// Requests per second.
    pub rate: u32,
    /// How long it sends.
    pub duration: Duration,
    /// JSON or streaming.
    pub mode: Mode,
    /// The serialized request body.
    pub body: Bytes,
    /// Client timeout of one request (also enforced here).
    pub timeout: Duration,
    /// Most requests in flight at once, so at most about as many
    /// connections (0: unbounded). A request waits for a free slot, and
    /// the wait is part of its latency.
    pub connections: usize,
}

/// What a run produced: every request's sample and how long it took from
/// the first scheduled send to the last response.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    /// One per scheduled request.
    pub samples: Vec<Sample>,
    /// From the first scheduled send until the last request ended.
    pub span: Duration,
    /// The start of the first body of each non-2xx status seen, by
    /// [`Outcome`] key (`http_429`, …).
    pub error_examples: BTreeMap<String, String>,
}

/// First error bodies of a run, shared by its request tasks.
type Examples = Arc<Mutex<BTreeMap<String, String>>>;

/// Longest error body excerpt kept.
const EXAMPLE_CHARS: usize = 200;

/// Keeps `body` as the example of `outcome` unless one is kept already.
fn keep_example(examples: &Examples, outcome: Outcome, body: &[u8]) {
    let mut map = examples.lock().unwrap_or_else(PoisonError::into_inner);
    map.entry(outcome.key()).or_insert_with(|| {
        String::from_utf8_lossy(body)
            .chars()
            .take(EXAMPLE_CHARS)
            .collect()
    });
}

/// The request body for `model` in `mode`.
pub fn request_body(model: &str, mode: Mode) -> Bytes {
    let mut body = json!({
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_PROMPT},
        ],
        "max_tokens": MAX_TOKENS,
    });
    if mode == Mode::Stream {
        body["stream"] = Value::Bool(true);
    }
    Bytes::from(body.to_string())
}

/// `base` (e.g. `http://127.0.0.1:9000/v1`) checked to be an http(s) URL on
/// a loopback host (`127.0.0.1`, `localhost`, `::1`), without its trailing
/// slash.
pub fn check_loopback(base: &str) -> anyhow::Result<String> {
    let url = reqwest::Url::parse(base).with_context(|| format!("{base:?} is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("{base:?}: only http:// and https:// targets are supported");
    }
    let host = url.host_str().unwrap_or_default();
    if !matches!(host, "127.0.0.1" | "localhost" | "[::1]") {
        bail!(
            "{base:?}: refusing a non-loopback target (host {host:?}); \
             only 127.0.0.1, localhost and [::1] are allowed"
        );
    }
    if url.query().is_some() || url.fragment().is_some() {
        bail!("{base:?}: give a base URL without query or fragment");
    }
    Ok(base.trim_end_matches('/').to_owned())
}

/// The HTTP client shared by both targets: HTTP/1.1 keep-alive, a pool big
/// enough that a burst never waits for a connection, no proxy.
pub fn client(timeout: Duration) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .http1_only()
        .pool_max_idle_per_host(4096)
        .pool_idle_timeout(Duration::from_secs(300))
        .tcp_nodelay(true)
        .no_proxy()
        .connect_timeout(timeout)
        .timeout(timeout)
        .build()
        .context("building the HTTP client")
}

/// Runs `spec` open loop and returns every request's sample once all have
/// ended.
pub async fn run(client: &reqwest::Client, spec: &RunSpec) -> anyhow::Result<RunResult> {
    let rate = spec.rate.max(1);
    let total = (spec.duration.as_secs_f64() * f64::from(rate)).round() as u64;
    let handle = tokio::runtime::Handle::current();
    let start = Instant::now() + LEAD;
    let (client, endpoint, body) = (
        client.clone(),
        Arc::<str>::from(spec.endpoint.as_str()),
        spec.body.clone(),
    );
    let (mode, timeout) = (spec.mode, spec.timeout);
    let slots = (spec.connections > 0).then(|| Arc::new(Semaphore::new(spec.connections)));
    let examples = Examples::default();
    let task_examples = examples.clone();
    // The pacer: a blocking-pool thread, so each send leaves within a
    // sleep's precision (tens of µs) of its time, not the timer wheel's ms.
    let pacer = tokio::task::spawn_blocking(move || {
        let mut tasks = Vec::with_capacity(total as usize);
        for n in 0..total {
            let due = start + Duration::from_nanos(n * 1_000_000_000 / u64::from(rate));
            let now = Instant::now();
            if due > now {
                sleep_thread(due - now);
            }
            let lag = Instant::now().saturating_duration_since(due);
            let (client, endpoint, body) = (client.clone(), endpoint.clone(), body.clone());
            let examples = task_examples.clone();
            let slots = slots.clone();
            tasks.push(handle.spawn(async move {
                let request = async {
                    // Held until the whole response is read, when its
                    // connection is back in the pool.
                    let _slot = match &slots {
                        Some(s) => Some(s.clone().acquire_owned().await),
                        None => None,
                    };
                    one(&client, &endpoint, body, mode, due, &examples).await
                };
                let (outcome, ttft) =
                    match tokio::time::timeout(timeout + Duration::from_secs(1), request).await {
                        Ok(result) => result,
                        Err(_) => (Outcome::Timeout, None),
                    };
                let now = Instant::now();
                Sample {
                    latency: now.saturating_duration_since(due),
                    ttft,
                    lag,
                    ended: now.saturating_duration_since(start),
                    outcome,
                }
            }));
        }
        tasks
    });
    let tasks = pacer.await.context("the pacer thread failed")?;
    let mut result = RunResult {
        samples: Vec::with_capacity(tasks.len()),
        span: Duration::ZERO,
        error_examples: BTreeMap::new(),
    };
    for task in tasks {
        let sample = task.await.context("a request task failed")?;
        result.span = result.span.max(sample.ended);
        result.samples.push(sample);
    }
    result.error_examples =
        std::mem::take(&mut *examples.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(result)
}

/// Sleeps the calling thread: only ever called on a blocking-pool thread
/// (the pacer), never on a runtime worker.
#[allow(clippy::disallowed_methods)]
fn sleep_thread(d: Duration) {
    std::thread::sleep(d);
}

/// One request; the caller stamps the end time. Returns the outcome and,
/// for streams, the time to first token from `due`.
async fn one(
    client: &reqwest::Client,
    endpoint: &str,
    body: Bytes,
    mode: Mode,
    due: Instant,
    examples: &Examples,
) -> (Outcome, Option<Duration>) {
    let sent = client
        .post(endpoint)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await;
    let mut resp = match sent {
        Ok(resp) => resp,
        Err(e) => return (transport_outcome(&e), None),
    };
    let status = resp.status();
    match mode {
        Mode::Json => match resp.bytes().await {
            Err(e) => (transport_outcome(&e), None),
            Ok(bytes) if !status.is_success() => {
                let outcome = Outcome::Status(status.as_u16());
                keep_example(examples, outcome, &bytes);
                (outcome, None)
            }
            Ok(bytes) if has_message_content(&bytes) => (Outcome::Ok, None),
            Ok(_) => (Outcome::BadBody, None),
        },
        Mode::Stream => {
            let mut sse = SseScan::default();
            let mut ttft = None;
            let mut error_body = Vec::new();
            loop {
                match resp.chunk().await {
                    Ok(Some(chunk)) if !status.is_success() => {
                        if error_body.len() < EXAMPLE_CHARS * 4 {
                            error_body.extend_from_slice(&chunk);
                        }
                    }
                    Ok(Some(chunk)) => {
                        if ttft.is_none() && sse.push(&chunk) {
                            ttft = Some(due.elapsed());
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return (transport_outcome(&e), ttft),
                }
            }
            if !status.is_success() {
                let outcome = Outcome::Status(status.as_u16());
                keep_example(examples, outcome, &error_body);
                (outcome, None)
            } else if ttft.is_some() {
                (Outcome::Ok, ttft)
            } else {
                (Outcome::BadBody, None)
            }
        }
    }
}

fn transport_outcome(e: &reqwest::Error) -> Outcome {
    if e.is_timeout() {
        Outcome::Timeout
    } else {
        Outcome::Transport
    }
}

/// A non-streaming body with a non-empty `choices[0].message.content`.
fn has_message_content(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body).is_ok_and(|v| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    })
}

/// Finds the first SSE frame carrying non-empty delta content, across
/// chunk boundaries.
#[derive(Debug, Default)]
struct SseScan {
    /// Bytes of the frame not yet complete (`\r` dropped).
    pending: Vec<u8>,
}

impl SseScan {
    /// Feeds a chunk; true once a complete frame with content is seen (the
    /// caller stops feeding then).
    fn push(&mut self, chunk: &[u8]) -> bool {
        self.pending
            .extend(chunk.iter().copied().filter(|&b| b != b'\r'));
        let mut consumed = 0;
        let mut found = false;
        while let Some(end) = find(&self.pending[consumed..], b"\n\n") {
            let frame = &self.pending[consumed..consumed + end];
            consumed += end + 2;
            if frame_has_content(frame) {
                found = true;
                break;
            }
        }
        self.pending.drain(..consumed);
        found
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// An SSE frame whose `data:` is a chunk with a non-empty `delta.content`.
fn frame_has_content(frame: &[u8]) -> bool {
    if find(frame, b"\"content\"").is_none() {
        return false;
    }
    frame.split(|&b| b == b'\n').any(|line| {
        let Some(data) = line.strip_prefix(b"data:") else {
            return false;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        serde_json::from_slice::<Value>(data).is_ok_and(|v| {
            v["choices"].as_array().is_some_and(|choices| {
                choices.iter().any(|c| {
                    c["delta"]["content"]
                        .as_str()
                        .is_some_and(|s| !s.is_empty())
                })
            })
        })
    })
}

/// Percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    /// Samples behind them.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `values` (sorted here); zeros when empty.
    pub fn of(mut values: Vec<Duration>) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        values.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let at = |q: f64| {
            let rank = (q * values.len() as f64).ceil() as usize;
            ms(values[rank.clamp(1, values.len()) - 1])
        };
        let sum: Duration = values.iter().sum();
        Self {
            count: values.len(),
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            p999_ms: at(0.999),
            max_ms: values.last().copied().map_or(0.0, ms),
            mean_ms: ms(sum) / values.len() as f64,
        }
    }
}

/// One target's figures at one rate and mode, both runs combined.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Requests scheduled.
    pub requests: usize,
    /// Requests that ended [`Outcome::Ok`].
    pub ok: usize,
    /// Requests that did not, by kind (`http_429`, `timeout`, …).
    pub errors: BTreeMap<String, usize>,
    /// Successful requests per second, from the first scheduled send to
    /// the last response of each run.
    pub achieved_rps: f64,
    /// Full-response latency of the successful requests.
    pub latency: Percentiles,
    /// Streams: time to first token of the successful requests.
    pub ttft: Option<Percentiles>,
    /// How far behind schedule requests were handed to the runtime (part
    /// of every latency above, as the schedule is the clock).
    pub pacer_lag: Percentiles,
    /// The start of the first body of each non-2xx status, by kind.
    pub error_examples: BTreeMap<String, String>,
}

impl Summary {
    /// The figures of `runs` combined.
    pub fn of(runs: &[RunResult], mode: Mode) -> Self {
        let samples = || runs.iter().flat_map(|r| r.samples.iter());
        let ok = || samples().filter(|s| s.outcome == Outcome::Ok);
        let mut errors = BTreeMap::new();
        for s in samples().filter(|s| s.outcome != Outcome::Ok) {
            *errors.entry(s.outcome.key()).or_insert(0) += 1;
        }
        let span: f64 = runs.iter().map(|r| r.span.as_secs_f64()).sum();
        let ok_count = ok().count();
        Self {
            requests: samples().count(),
            ok: ok_count,
            errors,
            achieved_rps: if span > 0.0 {
                ok_count as f64 / span
            } else {
                0.0
            },
            latency: Percentiles::of(ok().map(|s| s.latency).collect()),
            ttft: (mode == Mode::Stream)
                .then(|| Percentiles::of(ok().filter_map(|s| s.ttft).collect())),
            pacer_lag: Percentiles::of(samples().map(|s| s.lag).collect()),
            error_examples: runs.iter().flat_map(|r| r.error_examples.iter()).fold(
                BTreeMap::new(),
                |mut m, (k, v)| {
                    m.entry(k.clone()).or_insert_with(|| v.clone());
                    m
                },
            ),
        }
    }

    /// Requests that did not end OK.
    pub fn error_count(&self) -> usize {
        self.requests - self.ok
    }
}

/// The result of one rate and mode.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Requests per second asked for.
    pub rate: u32,
    /// JSON or streaming.
    pub mode: Mode,
    /// Straight to the upstream.
    pub direct: Summary,
    /// Through the gateway to the same upstream.
    pub gateway: Summary,
    /// Gateway p50 − direct p50 (full response), ms.
    pub added_p50_ms: f64,
    /// Gateway p99 − direct p99 (full response), ms.
    pub added_p99_ms: f64,
    /// Streams: the same for the time to first token, ms.
    pub added_ttft_p50_ms: Option<f64>,
    /// Streams: the same for the time to first token, ms.
    pub added_ttft_p99_ms: Option<f64>,
    /// The gateway process's user + system CPU over its two runs, divided
    /// by the requests it received, µs (with `--gateway-pid`).
    pub gateway_cpu_us_per_request: Option<f64>,
}

/// The whole measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The direct base URL.
    pub direct: String,
    /// The gateway base URL.
    pub gateway: String,
    /// The `model` of every request.
    pub model: String,
    /// Seconds per run (each target runs twice per rate and mode).
    pub duration_s: f64,
    /// Warm-up seconds per target, rate and mode (discarded).
    pub warmup_s: f64,
    /// Most requests in flight per target (0: unbounded).
    pub connections: usize,
    /// Clock ticks per second of `/proc/<pid>/stat`.
    pub clock_ticks_per_s: Option<u64>,
    /// One per rate and mode.
    pub rows: Vec<Row>,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Base URL of the upstream, e.g. `http://127.0.0.1:9000/v1`.
    pub direct: String,
    /// Base URL of the gateway in front of it.
    pub gateway: String,
    /// Requests per second, one measurement each.
    pub rates: Vec<u32>,
    /// Length of each measured run.
    pub duration: Duration,
    /// Length of each target's warm-up before a rate and mode.
    pub warmup: Duration,
    /// Also measure streaming.
    pub stream: bool,
    /// The `model` of every request.
    pub model: String,
    /// The gateway's PID, for its CPU per request.
    pub gateway_pid: Option<u32>,
    /// Client timeout of one request.
    pub timeout: Duration,
    /// Most requests in flight per target (0: unbounded).
    pub connections: usize,
}

/// Most connections per target accepted.
pub const MAX_CONNECTIONS: usize = 4096;

impl Plan {
    /// Checks targets (loopback only) and bounds; returns the plan with
    /// normalised base URLs.
    pub fn validated(mut self) -> anyhow::Result<Self> {
        self.direct = check_loopback(&self.direct).context("--direct")?;
        self.gateway = check_loopback(&self.gateway).context("--gateway")?;
        if self.rates.is_empty() {
            bail!("--rates: give at least one rate");
        }
        if let Some(r) = self.rates.iter().find(|&&r| r == 0 || r > MAX_RATE) {
            bail!("--rates: {r} is outside 1..={MAX_RATE}");
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            bail!("--duration must be between 1ms and {MAX_DURATION:?}");
        }
        if self.warmup > MAX_DURATION {
            bail!("--warmup must be at most {MAX_DURATION:?}");
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            bail!("--timeout must be between 1ms and {MAX_TIMEOUT:?}");
        }
        if self.model.is_empty() {
            bail!("--model must not be empty");
        }
        if self.connections > MAX_CONNECTIONS {
            bail!("--connections must be at most {MAX_CONNECTIONS} (0: unbounded)");
        }
        if let Some(pid) = self.gateway_pid {
            cpu_ticks(pid).with_context(|| format!("--gateway-pid {pid}"))?;
        }
        Ok(self)
    }

    /// The modes measured.
    pub fn modes(&self) -> Vec<Mode> {
        if self.stream {
            vec![Mode::Json, Mode::Stream]
        } else {
            vec![Mode::Json]
        }
    }

    /// An upper bound of the wall time, for the user.
    pub fn wall_time_bound(&self) -> Duration {
        let per = self.warmup * 2 + self.duration * 4 + (self.timeout + SETTLE) * 6;
        per * (self.rates.len() * self.modes().len()) as u32
    }
}

/// User + system CPU ticks of process `pid` (fields 14 and 15 of
/// `/proc/<pid>/stat`).
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("{path}: unexpected format"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    let tick = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("{path}: no field {}", i + 3))
    };
    Ok(tick(11)? + tick(12)?)
}

/// Clock ticks per second (`getconf CLK_TCK`), asked once.
pub fn clock_ticks_per_second() -> anyhow::Result<u64> {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .context("running getconf CLK_TCK")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let hz: u64 = text
        .trim()
        .parse()
        .with_context(|| format!("getconf CLK_TCK printed {text:?}"))?;
    if hz == 0 {
        bail!("getconf CLK_TCK printed 0");
    }
    Ok(hz)
}

/// Sends one request of `mode` to `endpoint` and fails, naming the target
/// and what it answered, unless it answers with a completion: a missing
/// route or a down target is reported before minutes of measurement, not
/// as a table of errors.
async fn preflight(
    client: &reqwest::Client,
    name: &str,
    endpoint: &str,
    body: Bytes,
    mode: Mode,
) -> anyhow::Result<()> {
    let resp = client
        .post(endpoint)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .with_context(|| format!("{name}: POST {endpoint} failed"))?;
    let status = resp.status();
    let text = resp
        .text()
        .await
        .with_context(|| format!("{name}: reading the answer of POST {endpoint}"))?;
    let usable = match mode {
        Mode::Json => has_message_content(text.as_bytes()),
        Mode::Stream => SseScan::default().push(text.as_bytes()),
    };
    if !status.is_success() || !usable {
        let excerpt: String = text.chars().take(300).collect();
        bail!(
            "{name}: POST {endpoint} ({} mode) answered HTTP {status} without a usable completion: {excerpt}",
            mode.name()
        );
    }
    Ok(())
}

/// Runs `plan` and returns the report; `progress` hears about each step.
pub async fn measure(plan: &Plan, progress: &dyn Fn(&str)) -> anyhow::Result<Report> {
    let client = client(plan.timeout)?;
    let hz = match plan.gateway_pid {
        Some(_) => Some(clock_ticks_per_second()?),
        None => None,
    };
    let direct = format!("{}/chat/completions", plan.direct);
    let gateway = format!("{}/chat/completions", plan.gateway);
    for mode in plan.modes() {
        let body = request_body(&plan.model, mode);
        preflight(&client, "direct", &direct, body.clone(), mode).await?;
        preflight(&client, "gateway", &gateway, body, mode).await?;
    }
    let mut rows = Vec::new();
    for &rate in &plan.rates {
        for mode in plan.modes() {
            let spec = |endpoint: &str, duration: Duration| RunSpec {
                endpoint: endpoint.to_owned(),
                rate,
                duration,
                mode,
                body: request_body(&plan.model, mode),
                timeout: plan.timeout,
                connections: plan.connections,
            };
            if !plan.warmup.is_zero() {
                progress(&format!("{rate}/s {}: warm-up", mode.name()));
                run(&client, &spec(&direct, plan.warmup)).await?;
                tokio::time::sleep(SETTLE).await;
                run(&client, &spec(&gateway, plan.warmup)).await?;
                tokio::time::sleep(SETTLE).await;
            }
            let (mut d_runs, mut g_runs, mut ticks) = (Vec::new(), Vec::new(), 0u64);
            for round in 1..=2 {
                progress(&format!("{rate}/s {}: direct, run {round}/2", mode.name()));
                d_runs.push(run(&client, &spec(&direct, plan.duration)).await?);
                tokio::time::sleep(SETTLE).await;
                progress(&format!("{rate}/s {}: gateway, run {round}/2", mode.name()));
                let before = plan.gateway_pid.map(cpu_ticks).transpose()?;
                g_runs.push(run(&client, &spec(&gateway, plan.duration)).await?);
                let after = plan.gateway_pid.map(cpu_ticks).transpose()?;
                if let (Some(b), Some(a)) = (before, after) {
                    ticks += a.saturating_sub(b);
                }
                tokio::time::sleep(SETTLE).await;
            }
            let d = Summary::of(&d_runs, mode);
            let g = Summary::of(&g_runs, mode);
            let cpu = hz.map(|hz| {
                let seconds = ticks as f64 / hz as f64;
                seconds * 1e6 / g.requests.max(1) as f64
            });
            let ttft_diff = |f: fn(&Percentiles) -> f64| match (&g.ttft, &d.ttft) {
                (Some(g), Some(d)) => Some(f(g) - f(d)),
                _ => None,
            };
            rows.push(Row {
                rate,
                mode,
                added_p50_ms: g.latency.p50_ms - d.latency.p50_ms,
                added_p99_ms: g.latency.p99_ms - d.latency.p99_ms,
                added_ttft_p50_ms: ttft_diff(|p| p.p50_ms),
                added_ttft_p99_ms: ttft_diff(|p| p.p99_ms),
                gateway_cpu_us_per_request: cpu,
                direct: d,
                gateway: g,
            });
        }
    }
    Ok(Report {
        direct: plan.direct.clone(),
        gateway: plan.gateway.clone(),
        model: plan.model.clone(),
        duration_s: plan.duration.as_secs_f64(),
        warmup_s: plan.warmup.as_secs_f64(),
        connections: plan.connections,
        clock_ticks_per_s: hz,
        rows,
    })
}

/// The report as a Markdown table: one row per rate and mode, two for
/// streams (time to first token, then the whole stream).
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| rate | mode | direct p50 ms | direct p99 ms | gateway p50 ms | gateway p99 ms \
         | added p50 ms | added p99 ms | errors (direct, gateway) \
         | achieved req/s (direct, gateway) | gateway CPU µs/req |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &report.rows {
        let cpu = row
            .gateway_cpu_us_per_request
            .map_or_else(|| "-".to_owned(), |us| format!("{us:.1}"));
        let mut line = |mode: &str, d: &Percentiles, g: &Percentiles| {
            let _ = writeln!(
                out,
                "| {} | {mode} | {:.3} | {:.3} | {:.3} | {:.3} | {:+.3} | {:+.3} | {}, {} | {:.0}, {:.0} | {cpu} |",
                row.rate,
                d.p50_ms,
                d.p99_ms,
                g.p50_ms,
                g.p99_ms,
                g.p50_ms - d.p50_ms,
                g.p99_ms - d.p99_ms,
                row.direct.error_count(),
                row.gateway.error_count(),
                row.direct.achieved_rps,
                row.gateway.achieved_rps,
            );
        };
        match (row.mode, &row.direct.ttft, &row.gateway.ttft) {
            (Mode::Stream, Some(dt), Some(gt)) => {
                line("stream ttft", dt, gt);
                line("stream total", &row.direct.latency, &row.gateway.latency);
            }
            _ => line(row.mode.name(), &row.direct.latency, &row.gateway.latency),
        }
    }
    let lag = report
        .rows
        .iter()
        .flat_map(|r| [&r.direct.pacer_lag, &r.gateway.pacer_lag])
        .map(|p| p.p99_ms)
        .fold(0.0, f64::max);
    let errors: BTreeMap<&str, usize> = report
        .rows
        .iter()
        .flat_map(|r| r.gateway.errors.iter().chain(r.direct.errors.iter()))
        .fold(BTreeMap::new(), |mut m, (k, v)| {
            *m.entry(k.as_str()).or_insert(0) += v;
            m
        });
    let connections = match report.connections {
        0 => "unbounded connections".to_owned(),
        n => format!("at most {n} requests in flight (connections) per target"),
    };
    let _ = writeln!(
        out,
        "\nOpen loop, latency from the scheduled send time, successful requests only; \
         each target ran twice per row ({:.0}s each, interleaved direct, gateway, direct, gateway) \
         after a {:.0}s warm-up; {connections}; added = difference of the percentiles. \
         Worst pacer lag p99: {lag:.3} ms.",
        report.duration_s, report.warmup_s
    );
    if !errors.is_empty() {
        let list: Vec<String> = errors.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        let _ = writeln!(out, "Errors by kind: {}.", list.join(", "));
        let mut shown = std::collections::BTreeSet::new();
        for row in &report.rows {
            for (target, summary) in [("direct", &row.direct), ("gateway", &row.gateway)] {
                for (kind, body) in &summary.error_examples {
                    if shown.insert((target, kind.as_str())) {
                        let _ = writeln!(out, "First {kind} body from {target}: {body}");
                    }
                }
            }
        }
    }
    out
}

/// Parses `10s`, `500ms`, `2m` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 10s, 500ms, 1m)"))?;
    let seconds = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1e3,
        "m" | "min" => value * 60.0,
        other => return Err(format!("unknown unit {other:?} in {text:?} (ms, s, m)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_targets_are_accepted() {
        assert_eq!(
            check_loopback("http://127.0.0.1:9000/v1/").unwrap(),
            "http://127.0.0.1:9000/v1"
        );
        assert!(check_loopback("http://localhost:8080/v1").is_ok());
        assert!(check_loopback("http://[::1]:8080/v1").is_ok());
        for bad in [
            "http://10.0.0.1/v1",
            "https://api.openai.com/v1",
            "http://127.0.0.1.example.com/v1",
            "ftp://127.0.0.1/v1",
            "127.0.0.1:9000",
        ] {
            assert!(check_loopback(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let p = Percentiles::of(values);
        assert_eq!(p.count, 100);
        assert!((p.p50_ms - 50.0).abs() < 1e-9);
        assert!((p.p99_ms - 99.0).abs() < 1e-9);
        assert!((p.max_ms - 100.0).abs() < 1e-9);
        assert_eq!(Percentiles::of(Vec::new()).count, 0);
    }

    #[test]
    fn sse_scan_finds_the_first_content_across_chunks() {
        let mut scan = SseScan::default();
        let role =
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
        assert!(!scan.push(role.as_bytes()));
        let word = "data: {\"choices\":[{\"delta\":{\"content\":\"Employees \"}}]}\r\n\r\n";
        let (a, b) = word.split_at(20);
        assert!(!scan.push(a.as_bytes()));
        assert!(scan.push(b.as_bytes()));
        assert!(!SseScan::default().push(b"data: [DONE]\n\n"));
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("3h").is_err());
    }

    #[test]
    fn cpu_ticks_reads_this_process() {
        assert!(cpu_ticks(std::process::id()).is_ok());
    }

    #[test]
    fn bodies_follow_the_mode() {
        let json: Value = serde_json::from_slice(&request_body("m", Mode::Json)).unwrap();
        assert_eq!(json["model"], "m");
        assert_eq!(json["max_tokens"], 64);
        assert!(json.get("stream").is_none());
        let stream: Value = serde_json::from_slice(&request_body("m", Mode::Stream)).unwrap();
        assert_eq!(stream["stream"], true);
    }
}
