//! The soak's traffic: one open-loop stream per [`Kind`], each at its own
//! fixed rate, every request in its own task, until a stop time; then the
//! requests in flight finish (bounded by the client timeout) and the jobs
//! are polled to a terminal state (bounded by the drain deadline).
//!
//! Every request ends as a [`Record`]: its kind, when it was sent and
//! answered, and a label (`"200"`, `"502 dependency_failed"`,
//! `"stream_error"`, `"timeout"`...). Whether a label was expected is
//! decided afterwards against the fault windows (`verdict`), not here, so
//! a request racing a fault is judged on the times alone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::config::{self, Key};

/// Client timeout of one request.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two reads of an unfinished job.
const JOB_POLL_EVERY: Duration = Duration::from_millis(250);
/// Requests of one kind in flight at most; past it a send is skipped (and
/// counted), so a stuck gateway cannot pile up tasks in the load itself.
const MAX_IN_FLIGHT: usize = 256;
/// Threads chat and jobs write to: few, so conversation memory fills
/// (`memory.max_turns`) early and then stays the same size.
const THREADS: u64 = 4;
/// The system prompt of completions: the simulator answers with its two
/// sentences closest to the question, streamed a word per frame.
const SYSTEM: &str = "Employees accrue fifteen paid days of PTO every year, credited monthly. \
    Unused PTO days roll over up to a limit of five days into the next year. \
    The office is closed on public holidays. Laptops are replaced every three years.";

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `POST /v1/chat` (half greetings, half retrieval questions).
    Chat,
    /// `POST /v1/chat/completions`, `stream: true`, read to the end.
    Stream,
    /// The same, the client hanging up after the first frame.
    StreamAbort,
    /// `POST /v1/chat/completions`, not streamed.
    Completion,
    /// `POST /v1/jobs`.
    JobSubmit,
    /// The final state of an accepted job (`GET /v1/jobs/{id}` polled).
    JobResult,
    /// A tenant sending 3x its limit.
    Limited,
    /// An unknown API key.
    Unauthorized,
}

/// One request's record.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// What it was.
    pub kind: Kind,
    /// Sent, seconds from the start of the run.
    pub sent_s: f64,
    /// Answered (or given up), seconds from the start.
    pub done_s: f64,
    /// How it ended.
    pub label: String,
}

/// The records of a run, shared by the request tasks.
#[derive(Debug, Clone, Default)]
pub struct Records(Arc<Mutex<Vec<Record>>>);

/// Requests per second of each kind.
#[derive(Debug, Clone)]
pub struct Rates(pub Vec<(Kind, f64)>);

/// Where and until when to send.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The gateway's base URL.
    pub levee: String,
    /// The run's clock.
    pub start: Instant,
    /// No request is sent from here on.
    pub stop: Instant,
    /// Jobs still unfinished here are lost.
    pub drain_deadline: Instant,
    /// The rates.
    pub rates: Rates,
}

impl Default for Rates {
    /// About 40 requests a second plus job polls: enough to turn over
    /// every buffer and pool many times a minute, little enough for two
    /// shared cores and a debug build.
    fn default() -> Self {
        Self(vec![
            (Kind::Chat, 10.0),
            (Kind::Stream, 4.0),
            (Kind::StreamAbort, 2.0),
            (Kind::Completion, 5.0),
            (Kind::JobSubmit, 3.0),
            (Kind::Limited, 6.0),
            (Kind::Unauthorized, 1.0),
        ])
    }
}

impl Records {
    fn push(&self, record: Record) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(record);
    }

    /// Every record so far, by send time.
    pub fn snapshot(&self) -> Vec<Record> {
        let mut all = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        all.sort_by(|a, b| a.sent_s.total_cmp(&b.sent_s));
        all
    }

    /// Records so far by kind and label.
    pub fn counts(&self) -> BTreeMap<Kind, BTreeMap<String, u64>> {
        let mut counts: BTreeMap<Kind, BTreeMap<String, u64>> = BTreeMap::new();
        for r in self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            *counts
                .entry(r.kind)
                .or_default()
                .entry(r.label.clone())
                .or_default() += 1;
        }
        counts
    }

    /// Records so far.
    pub fn len(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// No record yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Runs every kind's stream until `plan.stop`, then waits for the
/// requests in flight and the jobs' polls; the records go to `records`.
pub async fn run(plan: Plan, records: Records) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .pool_max_idle_per_host(64)
        .build()?;
    let streams: Vec<_> = plan
        .rates
        .0
        .iter()
        .map(|&(kind, rate)| {
            let (client, plan, records) = (client.clone(), plan.clone(), records.clone());
            tokio::spawn(async move { stream(kind, rate, &client, &plan, &records).await })
        })
        .collect();
    for s in streams {
        s.await?;
    }
    Ok(())
}

/// One kind at `rate` per second until `plan.stop`; returns when its last
/// request has ended.
async fn stream(kind: Kind, rate: f64, client: &reqwest::Client, plan: &Plan, records: &Records) {
    let interval = Duration::from_secs_f64(1.0 / rate.max(0.001));
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut tasks = JoinSet::new();
    let mut n = 0u64;
    loop {
        let due = plan.start + interval.mul_f64(n as f64);
        if due >= plan.stop {
            break;
        }
        tokio::time::sleep_until(due).await;
        let sent_s = due.saturating_duration_since(plan.start).as_secs_f64();
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            records.push(Record {
                kind,
                sent_s,
                done_s: sent_s,
                label: "skipped (too many in flight)".to_owned(),
            });
            n += 1;
            continue;
        };
        let (client, plan, records) = (client.clone(), plan.clone(), records.clone());
        tasks.spawn(async move {
            let _permit = permit;
            one(kind, n, &client, &plan, &records, sent_s).await;
        });
        // Reap finished tasks as we go so the set stays small.
        while tasks.try_join_next().is_some() {}
        n += 1;
    }
    while tasks.join_next().await.is_some() {}
}

/// One request of `kind` (the `n`-th), recorded.
async fn one(
    kind: Kind,
    n: u64,
    client: &reqwest::Client,
    plan: &Plan,
    records: &Records,
    sent_s: f64,
) {
    let label = match kind {
        Kind::Chat => chat(client, &plan.levee, config::CHAT.secret, n).await,
        Kind::Stream | Kind::StreamAbort => {
            streamed(client, &plan.levee, kind == Kind::StreamAbort).await
        }
        Kind::Completion => completion(client, &plan.levee).await,
        Kind::Limited => chat(client, &plan.levee, config::LIMITED.secret, 0).await,
        Kind::Unauthorized => chat(client, &plan.levee, config::UNKNOWN_SECRET, 0).await,
        Kind::JobSubmit => {
            job(client, plan, records, n, sent_s).await;
            return;
        }
        Kind::JobResult => return,
    };
    records.push(Record {
        kind,
        sent_s,
        done_s: plan.start.elapsed().as_secs_f64(),
        label,
    });
}

/// The label of a finished response: the status, plus the error code of
/// an error body.
async fn status_label(resp: reqwest::Response) -> (u16, String, Value) {
    let status = resp.status().as_u16();
    let body: Value = match resp.bytes().await {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        Err(e) => return (status, transport_label(&e), Value::Null),
    };
    let code = body["error"]
        .as_str()
        .or_else(|| body["error"]["code"].as_str())
        .or_else(|| body["error"]["type"].as_str());
    let label = match code {
        Some(code) if status >= 400 => format!("{status} {code}"),
        _ => status.to_string(),
    };
    (status, label, body)
}

/// `timeout` or `transport_error`.
fn transport_label(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout"
    } else {
        "transport_error"
    }
    .to_owned()
}

/// `POST /v1/chat` with `key`: a greeting or a retrieval question.
async fn chat(client: &reqwest::Client, levee: &str, key: &str, n: u64) -> String {
    let message = if n % 2 == 0 {
        "Hello"
    } else {
        "What is the PTO policy?"
    };
    let body = json!({
        "message": message,
        "user_id": "soak",
        "thread_id": format!("soak-{}", n % THREADS),
    });
    let sent = client
        .post(format!("{levee}/v1/chat"))
        .header("x-api-key", key)
        .json(&body)
        .send()
        .await;
    match sent {
        Ok(resp) => status_label(resp).await.1,
        Err(e) => transport_label(&e),
    }
}

/// A chat-completions body.
fn completion_body(stream: bool) -> Value {
    json!({
        "model": config::MODEL,
        "stream": stream,
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "How many PTO days roll over into the next year?"},
        ],
    })
}

/// A plain completion: 200 with a message, or an error label.
async fn completion(client: &reqwest::Client, levee: &str) -> String {
    let sent = client
        .post(format!("{levee}/v1/chat/completions"))
        .bearer_auth(config::CHAT.secret)
        .json(&completion_body(false))
        .send()
        .await;
    match sent {
        Ok(resp) => {
            let (status, label, body) = status_label(resp).await;
            match status {
                200 if body["choices"][0]["message"]["content"].is_string() => label,
                200 => "200 without a message".to_owned(),
                _ => label,
            }
        }
        Err(e) => transport_label(&e),
    }
}

/// A streamed completion read to `data: [DONE]` (`stream_done`), to an
/// in-band error (`stream_error`), or, with `abort`, dropped after its
/// first frame (`aborted`); a body that just stops is `stream_truncated`.
async fn streamed(client: &reqwest::Client, levee: &str, abort: bool) -> String {
    let sent = client
        .post(format!("{levee}/v1/chat/completions"))
        .bearer_auth(config::CHAT.secret)
        .json(&completion_body(true))
        .send()
        .await;
    let mut resp = match sent {
        Ok(resp) if resp.status().is_success() => resp,
        Ok(resp) => return status_label(resp).await.1,
        Err(e) => return transport_label(&e),
    };
    let mut seen = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => {
                if abort {
                    // Dropping the response closes the connection mid-stream.
                    return "aborted".to_owned();
                }
                seen.extend_from_slice(&bytes);
            }
            Ok(None) => break,
            Err(e) => return format!("stream_{}", transport_label(&e)),
        }
    }
    let text = String::from_utf8_lossy(&seen);
    if text.contains("upstream_stream_error") {
        "stream_error"
    } else if text.contains("data: [DONE]") {
        "stream_done"
    } else {
        "stream_truncated"
    }
    .to_owned()
}

/// Submits a job; a 202 is then polled until terminal or the drain
/// deadline. Records the submission and, for a 202, the job's end.
async fn job(client: &reqwest::Client, plan: &Plan, records: &Records, n: u64, sent_s: f64) {
    let body = json!({
        "message": "What is the PTO policy?",
        "user_id": "soak",
        "thread_id": format!("soak-job-{}", n % THREADS),
    });
    let sent = client
        .post(format!("{}/v1/jobs", plan.levee))
        .header("x-api-key", config::BATCH.secret)
        .json(&body)
        .send()
        .await;
    let (label, id) = match sent {
        Ok(resp) => {
            let (_, label, body) = status_label(resp).await;
            (label, body["job_id"].as_str().map(str::to_owned))
        }
        Err(e) => (transport_label(&e), None),
    };
    let accepted = label == "202";
    records.push(Record {
        kind: Kind::JobSubmit,
        sent_s,
        done_s: plan.start.elapsed().as_secs_f64(),
        label: if accepted && id.is_none() {
            "202 without job_id".to_owned()
        } else {
            label
        },
    });
    if let (true, Some(id)) = (accepted, id) {
        let end = poll_job(client, plan, &id, config::BATCH).await;
        records.push(Record {
            kind: Kind::JobResult,
            sent_s,
            done_s: plan.start.elapsed().as_secs_f64(),
            label: end,
        });
    }
}

/// Reads job `id` every [`JOB_POLL_EVERY`] until it is terminal (its
/// status) or the drain deadline (`lost: <last status or error>`).
async fn poll_job(client: &reqwest::Client, plan: &Plan, id: &str, key: Key) -> String {
    let mut last = "never read".to_owned();
    while Instant::now() < plan.drain_deadline {
        tokio::time::sleep(JOB_POLL_EVERY).await;
        let read = client
            .get(format!("{}/v1/jobs/{id}", plan.levee))
            .header("x-api-key", key.secret)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        match read {
            Ok(resp) => {
                let (status, label, body) = status_label(resp).await;
                let state = body["status"].as_str().unwrap_or_default();
                match (status, state) {
                    (200, "succeeded" | "failed" | "dead") => return state.to_owned(),
                    (200, state) => state.clone_into(&mut last),
                    _ => last = label,
                }
            }
            Err(e) => last = transport_label(&e),
        }
    }
    format!("lost: {last}")
}
