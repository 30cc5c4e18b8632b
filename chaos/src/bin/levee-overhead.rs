//! `levee-overhead`: the latency a gateway adds in front of an LLM. Sends
//! the same open-loop schedule of chat completions directly to an
//! upstream and through the gateway to it, interleaved, at fixed rates,
//! and prints a Markdown table (and optionally JSON) of both and their
//! difference. Loopback targets only; stops by itself.
//!
//! ```text
//! levee-overhead --direct http://127.0.0.1:9000/v1 --gateway http://127.0.0.1:8080/v1 \
//!     --rates 500,1000,2000 --duration 10s --stream --gateway-pid 1234 --connections 100
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use levee_chaos::runner::overhead::{self, parse_duration, Plan};

/// Command line of `levee-overhead`.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Latency a gateway adds: the same open-loop load direct and through the gateway"
)]
struct Cli {
    /// Base URL of the upstream (loopback only), e.g. http://127.0.0.1:9000/v1.
    #[arg(long)]
    direct: String,
    /// Base URL of the gateway in front of it (loopback only), e.g. http://127.0.0.1:8080/v1.
    #[arg(long)]
    gateway: String,
    /// Requests per second, comma separated; one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "500,1000,2000")]
    rates: Vec<u32>,
    /// Length of each run (each target runs twice per rate and mode).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,
    /// Warm-up of each target before each rate and mode (discarded).
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    warmup: Duration,
    /// Also measure streaming (time to first token and whole stream).
    #[arg(long)]
    stream: bool,
    /// PID of the gateway process, for its CPU per request (/proc/PID/stat).
    #[arg(long, value_name = "PID")]
    gateway_pid: Option<u32>,
    /// The `model` of every request.
    #[arg(long, default_value = "levee-sim")]
    model: String,
    /// Client timeout of one request.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    timeout: Duration,
    /// Most requests in flight per target, so about as many keep-alive
    /// connections (0: unbounded); a request waits for a free one and the
    /// wait counts in its latency.
    #[arg(long, default_value_t = 0)]
    connections: usize,
    /// Also write the full results (more percentiles, errors by kind) as JSON here.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let plan = Plan {
        direct: cli.direct,
        gateway: cli.gateway,
        rates: cli.rates,
        duration: cli.duration,
        warmup: cli.warmup,
        stream: cli.stream,
        model: cli.model,
        gateway_pid: cli.gateway_pid,
        timeout: cli.timeout,
        connections: cli.connections,
    }
    .validated()?;
    eprintln!(
        "levee-overhead: {} vs {}, at most {:.0}s",
        plan.direct,
        plan.gateway,
        plan.wall_time_bound().as_secs_f64()
    );
    let report = overhead::measure(&plan, &|step| eprintln!("levee-overhead: {step}")).await?;
    if let Some(path) = &cli.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(overhead::table(&report).as_bytes())?;
    stdout.flush()?;
    Ok(())
}
