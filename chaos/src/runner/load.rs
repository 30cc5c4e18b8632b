//! The open-loop load generator: requests leave on a fixed schedule
//! (`rate` per second), each in its own task, whether or not earlier ones
//! have answered, so a slow gateway cannot slow the load down and hide its
//! own latency (no coordinated omission). Every request ends as a
//! [`Sample`]: a status, a client timeout or a transport error.

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
}

/// The replicas load goes to, round robin over the live ones; a scenario
/// takes a replica out before killing it, as a load balancer would.
#[derive(Debug, Clone, Default)]
pub struct Targets(Arc<Mutex<Vec<Option<String>>>>);

/// What to send, how often, for how long.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Requests per second.
    pub rate: u32,
    /// How long requests are sent.
    pub duration: Duration,
    /// Client timeout of one request.
    pub timeout: Duration,
    /// The chat `message` (decides the route: "Hello" skips retrieval).
    pub message: String,
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

    /// The `n`-th pick of the round robin over live replicas.
    fn pick(&self, n: u64) -> Option<(usize, String)> {
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

/// Sends `spec.rate` requests per second for `spec.duration` from `start`,
/// and returns every request's sample once all have ended.
pub async fn run(spec: LoadSpec, targets: Targets, start: Instant) -> Vec<Sample> {
    let client = match reqwest::Client::builder()
        .timeout(spec.timeout)
        .pool_max_idle_per_host(256)
        .build()
    {
        Ok(c) => c,
        Err(_) => reqwest::Client::new(),
    };
    let total = (spec.duration.as_secs_f64() * f64::from(spec.rate)).round() as u64;
    let interval = Duration::from_secs_f64(1.0 / f64::from(spec.rate.max(1)));
    let samples = Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let mut tasks = Vec::with_capacity(total as usize);
    for n in 0..total {
        let due = start + interval.mul_f64(n as f64);
        tokio::time::sleep_until(due).await;
        let Some((replica, url)) = targets.pick(n) else {
            continue;
        };
        let body = json!({
            "message": spec.message,
            "user_id": "chaos",
            // A handful of threads: memory is exercised but stays small.
            "thread_id": format!("chaos-{}", n % 16),
        });
        let client = client.clone();
        let samples = samples.clone();
        tasks.push(tokio::spawn(async move {
            let sent = due.saturating_duration_since(start);
            let sample = one(&client, &url, &body, replica, sent, due).await;
            samples
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(sample);
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let mut samples = std::mem::take(
        &mut *samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    samples.sort_by_key(|s| s.sent);
    samples
}

/// One request; latency counts from its scheduled send time.
async fn one(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    replica: usize,
    sent: Duration,
    due: Instant,
) -> Sample {
    let mut sample = Sample {
        sent,
        latency: Duration::ZERO,
        outcome: Outcome::Error,
        replica,
        ratelimit_degraded: false,
        retry_after: false,
        body_degraded: false,
        error_code: None,
    };
    let result = client
        .post(format!("{url}/v1/chat"))
        .json(body)
        .send()
        .await;
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
