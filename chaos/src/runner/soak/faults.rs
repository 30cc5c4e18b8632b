//! The simulator's faults during a soak: a fixed cycle of an error burst,
//! added latency and streams cut short, with calm between them, applied
//! through its `POST /_faults` (chat only, so retrieval is untouched).
//! Every applied fault is a [`Window`] with its real start and end, which
//! the verdict uses to tell a fault's failures from the gateway's.

use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};
use tokio::time::Instant;

/// Length of one fault cycle.
pub const CYCLE: Duration = Duration::from_secs(45);
/// Spacing of the SSE frames of every streamed completion, so that a
/// stream lasts long enough for a client to hang up in its middle.
const CHUNK_DELAY_MS: u64 = 5;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Half the chat calls answer 500.
    ErrorBurst,
    /// Every chat call takes 250 ms more.
    Latency,
    /// Streams fail after 4 frames (`stream_fail_after`).
    StreamFail,
}

/// A fault as applied.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    /// Which.
    pub fault: Fault,
    /// Applied, seconds from the start of the run.
    pub from_s: f64,
    /// Healed.
    pub to_s: f64,
}

/// The cycle: (offset, length, fault).
const STEPS: [(u64, u64, Fault); 3] = [
    (5, 4, Fault::ErrorBurst),
    (17, 6, Fault::Latency),
    (31, 6, Fault::StreamFail),
];

impl Fault {
    /// Its `/_faults` command.
    fn command(self) -> Value {
        match self {
            Self::ErrorBurst => json!({
                "target": "chat", "error_rate": 0.5, "error_status": 500,
                "stream_chunk_delay_ms": CHUNK_DELAY_MS,
            }),
            Self::Latency => json!({
                "target": "chat", "latency_ms": 250,
                "stream_chunk_delay_ms": CHUNK_DELAY_MS,
            }),
            Self::StreamFail => json!({
                "target": "chat", "stream_fail_after": 4,
                "stream_chunk_delay_ms": CHUNK_DELAY_MS,
            }),
        }
    }
}

/// The calm state between faults.
fn calm() -> Value {
    json!({"target": "chat", "stream_chunk_delay_ms": CHUNK_DELAY_MS})
}

/// Applies the cycle from `start` until `stop` (a fault that would not
/// end before `stop` is not started), leaves the simulator calm, and
/// returns the windows.
pub async fn run(sim: &str, start: Instant, stop: Instant) -> anyhow::Result<Vec<Window>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let url = format!("{sim}/_faults");
    post(&client, &url, &calm()).await?;
    let mut windows = Vec::new();
    for cycle in 0u32.. {
        let base = start + CYCLE * cycle;
        for (offset, length, fault) in STEPS {
            let (from, to) = (
                base + Duration::from_secs(offset),
                base + Duration::from_secs(offset + length),
            );
            if to >= stop {
                post(&client, &url, &calm()).await?;
                return Ok(windows);
            }
            tokio::time::sleep_until(from).await;
            let from_s = start.elapsed().as_secs_f64();
            post(&client, &url, &fault.command()).await?;
            tokio::time::sleep_until(to).await;
            post(&client, &url, &calm()).await?;
            windows.push(Window {
                fault,
                from_s,
                to_s: start.elapsed().as_secs_f64(),
            });
        }
    }
    Ok(windows)
}

/// `POST /_faults` with `body`; a refusal is an error.
async fn post(client: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<()> {
    let resp = client.post(url).json(body).send().await?;
    anyhow::ensure!(
        resp.status().is_success(),
        "the simulator refused {body}: {}",
        resp.status()
    );
    Ok(())
}
