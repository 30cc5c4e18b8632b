//! The open-loop load generator: requests leave on a fixed schedule
//! (`rate` per second), each in its own task, whether or not earlier ones
//! have answered, so a slow gateway cannot slow the load down and hide its
//! own latency (no coordinated omission). Every request ends as a
//! [`Sample`]: a status, a client timeout or a transport error.
//!
//! A load is one or more [`Stream`]s running side by side, each with its
//! own rate, start, headers (an API key makes it a tenant) and HTTP client,
//! so one tenant's connections never queue behind another's; samples carry
//! their stream's tenant label.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An HTTP response with this status.
    Status(u16),
    /// No response within the client timeout.
    Timeout,
    /// The connection failed (refused, reset) before a response.
    Error,
}

/// One request's record.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was sent, from the start of the load.
    pub sent: Duration,
    /// Until the response body was read (or the timeout / error).
    pub latency: Duration,
    /// How it ended.
    pub outcome: Outcome,
    /// The replica it went to (index into the targets).
    pub replica: usize,
    /// `X-RateLimit-Degraded: true`: answered under the local safety limit.
    pub ratelimit_degraded: bool,
    /// A `Retry-After` header was present.
    pub retry_after: bool,
    /// The body's `metadata.degraded` (200s only).
    pub body_degraded: bool,
    /// The body's `error` code (errors only).
    pub error_code: Option<String>,
    /// The tenant label of the stream that sent it; `None` for anonymous
    /// traffic.
    pub tenant: Option<String>,
    /// The body's `job_id` (a `POST /v1/jobs` answered 202).
    pub job_id: Option<String>,
}

/// The replicas load goes to, round robin over the live ones; a scenario
/// takes a replica out before killing it, as a load balancer would.
#[derive(Debug, Clone, Default)]
pub struct Targets(Arc<Mutex<Vec<Option<String>>>>);

/// What to send: streams side by side, one client timeout.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// The streams, each open-loop on its own schedule.
    pub streams: Vec<Stream>,
    /// Client timeout of one request.
    pub timeout: Duration,
}

/// The path of a synchronous chat.
pub const CHAT_PATH: &str = "/v1/chat";
/// The path of a job submission (same body as a chat, answered 202).
pub const JOBS_PATH: &str = "/v1/jobs";

/// One open-loop stream of `POST` requests with a `/v1/chat` body: to
/// [`CHAT_PATH`] (synchronous) or [`JOBS_PATH`] (a job).
#[derive(Debug, Clone)]
pub struct Stream {
    /// The label its samples carry (the tenant its key belongs to);
    /// `None` for anonymous traffic.
    pub tenant: Option<String>,
    /// Requests per second.
    pub rate: u32,
    /// First send, from the start of the load.
    pub from: Duration,
    /// How long it sends.
    pub duration: Duration,
    /// Extra request headers, e.g. `("X-API-Key", key)`.
    pub headers: Vec<(String, String)>,
    /// The chat `message` (decides the route: "Hello" skips retrieval).
    pub message: String,
    /// The body's `user_id`.
    pub user_id: String,
    /// The body's `thread_id`; `None`: sixteen `chaos-N` threads in turn,
    /// so memory is exercised but stays small.
    pub thread_id: Option<String>,
    /// Where it posts: [`CHAT_PATH`] or [`JOBS_PATH`].
    pub path: &'static str,
}

impl LoadSpec {
    /// One anonymous stream at `rate` for `duration` from the start,
    /// sending `message`: the load of most scenarios.
    pub fn single(rate: u32, duration: Duration, timeout: Duration, message: &str) -> Self {
        Self {
            streams: vec![Stream {
                tenant: None,
                rate,
                from: Duration::ZERO,
                duration,
                headers: Vec::new(),
                message: message.to_owned(),
                user_id: "chaos".to_owned(),
                thread_id: None,
                path: CHAT_PATH,
            }],
            timeout,
        }
    }

    /// When the last stream stops sending.
    pub fn duration(&self) -> Duration {
        self.streams
            .iter()
            .map(|s| s.from + s.duration)
            .max()
            .unwrap_or_default()
    }

    /// Requests per second with every stream sending (the peak).
    pub fn rate(&self) -> u32 {
        self.streams.iter().map(|s| s.rate).sum()
    }
}

impl Targets {
    /// Targets with these base URLs.
    pub fn new(urls: Vec<String>) -> Self {
        Self(Arc::new(Mutex::new(urls.into_iter().map(Some).collect())))
    }

    /// Takes replica `i` out of rotation.
    pub fn remove(&self, i: usize) {
        if let Some(slot) = self.lock().get_mut(i) {
            *slot = None;
        }
    }

    /// Puts a replica (back) into rotation; returns its index.
    pub fn add(&self, url: String) -> usize {
        let mut urls = self.lock();
        urls.push(Some(url));
        urls.len() - 1
    }

    /// The base URLs of the replicas in rotation.
    pub fn live(&self) -> Vec<String> {
        self.lock().iter().flatten().cloned().collect()
    }

    /// The `n`-th pick of the round robin over live replicas: its index
    /// and base URL; `None` when none is live.
    pub fn pick(&self, n: u64) -> Option<(usize, String)> {
        let urls = self.lock();
        let live: Vec<(usize, &String)> = urls
            .iter()
            .enumerate()
            .filter_map(|(i, u)| u.as_ref().map(|u| (i, u)))
            .collect();
        if live.is_empty() {
            return None;
        }
        let (i, url) = live[(n % live.len() as u64) as usize];
        Some((i, url.clone()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<String>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Runs every stream of `spec` from `start`, and returns every request's
/// sample, by send time, once all have ended.
pub async fn run(spec: LoadSpec, targets: Targets, start: Instant) -> Vec<Sample> {
    let streams = spec
        .streams
        .into_iter()
        .map(|stream| run_stream(stream, spec.timeout, targets.clone(), start));
    let mut samples: Vec<Sample> = futures::future::join_all(streams)
        .await
        .into_iter()
        .flatten()
        .collect();
    samples.sort_by_key(|s| s.sent);
    samples
}

/// Sends `stream.rate` requests per second for `stream.duration` from
/// `start + stream.from`, and returns the samples once all have ended.
async fn run_stream(
    stream: Stream,
    timeout: Duration,
    targets: Targets,
    start: Instant,
) -> Vec<Sample> {
    let client = match reqwest::Client::builder()
        .timeout(timeout)
        .pool_max_idle_per_host(256)
        .build()
    {
        Ok(c) => c,
        Err(_) => reqwest::Client::new(),
    };
    let total = (stream.duration.as_secs_f64() * f64::from(stream.rate)).round() as u64;
    let interval = Duration::from_secs_f64(1.0 / f64::from(stream.rate.max(1)));
    let samples = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let stream = Arc::new(stream);
    let mut tasks = Vec::with_capacity(total as usize);
    for n in 0..total {
        let due = start + stream.from + interval.mul_f64(n as f64);
        tokio::time::sleep_until(due).await;
        let Some((replica, url)) = targets.pick(n) else {
            continue;
        };
        let thread_id = match &stream.thread_id {
            Some(id) => id.clone(),
            None => format!("chaos-{}", n % 16),
        };
        let body = json!({
            "message": stream.message,
            "user_id": stream.user_id,
            "thread_id": thread_id,
        });
        let (client, samples, stream) = (client.clone(), samples.clone(), stream.clone());
        tasks.push(tokio::spawn(async move {
            let sent = due.saturating_duration_since(start);
            let url = format!("{url}{}", stream.path);
            let mut sample = one(&client, &url, &stream.headers, &body, due).await;
            sample.sent = sent;
            sample.replica = replica;
            sample.tenant.clone_from(&stream.tenant);
            samples
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(sample);
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let samples = std::mem::take(
        &mut *samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    samples
}

/// One request to `url`; latency counts from its scheduled send time. The
/// caller fills in when it was sent, where it went and for whom.
async fn one(
    client: &reqwest::Client,
    url: &str,
    headers: &[(String, String)],
    body: &Value,
    due: Instant,
) -> Sample {
    let mut sample = Sample {
        sent: Duration::ZERO,
        latency: Duration::ZERO,
        outcome: Outcome::Error,
        replica: 0,
        ratelimit_degraded: false,
        retry_after: false,
        body_degraded: false,
        error_code: None,
        tenant: None,
        job_id: None,
    };
    let request = headers
        .iter()
        .fold(client.post(url), |r, (name, value)| r.header(name, value));
    let result = request.json(body).send().await;
    match result {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok());
            sample.ratelimit_degraded = header("x-ratelimit-degraded") == Some("true");
            sample.retry_after = header("retry-after").is_some();
            match resp.json::<Value>().await {
                Ok(json) => {
                    sample.outcome = Outcome::Status(status);
                    sample.body_degraded = json["metadata"]["degraded"] == true;
                    sample.error_code = json["error"].as_str().map(str::to_owned);
                    sample.job_id = json["job_id"].as_str().map(str::to_owned);
                }
                Err(e) if e.is_timeout() => sample.outcome = Outcome::Timeout,
                Err(_) => sample.outcome = Outcome::Status(status),
            }
        }
        Err(e) if e.is_timeout() => sample.outcome = Outcome::Timeout,
        Err(_) => sample.outcome = Outcome::Error,
    }
    sample.latency = due.elapsed();
    sample
}
