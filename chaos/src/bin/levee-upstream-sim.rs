//! `levee-upstream-sim`: a fake OpenAI + Qdrant upstream with injectable
//! faults, for Levee's tests, chaos runs and benchmarks.
//!
//! Prints exactly one line to stdout once listening,
//! `levee-upstream-sim listening on 127.0.0.1:PORT`, and logs to stderr.
//!
//! `--capacity N --service-ms MS` makes the LLM finite: N chat completions
//! in service at once, each for MS (plus `--per-token-ms` per completion
//! token), the rest queued in arrival order, e.g.
//! `levee-upstream-sim --listen 127.0.0.1:0 --capacity 8 --service-ms 100`
//! serves about 80 calls/s and queues beyond that.

use std::io::Write;

use anyhow::Context;
use clap::Parser;
use levee_chaos::sim::{
    self, LlmCapacity, SimConfig, DEFAULT_COLLECTION, DEFAULT_DIM, DEFAULT_MODEL, LISTENING_PREFIX,
};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

/// Command line of `levee-upstream-sim`.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Fake OpenAI + Qdrant upstream with injectable faults"
)]
struct Cli {
    /// Address to listen on, e.g. 127.0.0.1:0 for a free port.
    #[arg(long)]
    listen: String,
    /// Name of the built-in Qdrant collection holding the Acme knowledge base.
    #[arg(long, default_value = DEFAULT_COLLECTION)]
    collection: String,
    /// Embedding dimension.
    #[arg(long, default_value_t = DEFAULT_DIM)]
    dim: usize,
    /// Chat completions (streamed or not) in service at once; calls beyond
    /// it wait in arrival order, so latency grows with the queue like a
    /// real model server's. 0 = unlimited. POST /_faults `capacity`
    /// changes it at run time; DELETE /_faults restores this value.
    #[arg(long, value_name = "N", default_value_t = 0)]
    capacity: usize,
    /// Base service time of a chat completion, holding its slot [default:
    /// the chat fault's `latency_ms`, i.e. 0 unless a fault sets it].
    /// POST /_faults `service_ms` overrides it.
    #[arg(long, value_name = "MS")]
    service_ms: Option<u64>,
    /// Service time per completion token returned, holding the slot too.
    /// POST /_faults `per_token_ms` overrides it.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    per_token_ms: u64,
    /// Model ids GET /v1/models lists, comma separated, e.g.
    /// `--models gpt-4o,gpt-4o-mini`. Chat accepts any model name anyway.
    #[arg(long, value_name = "IDS", value_delimiter = ',', default_value = DEFAULT_MODEL)]
    models: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // stdout carries only the address line; logs go to stderr.
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();

    let config = SimConfig {
        collection: cli.collection,
        dim: cli.dim,
        llm: LlmCapacity {
            capacity: cli.capacity,
            service_ms: cli.service_ms,
            per_token_ms: cli.per_token_ms,
        },
        models: cli.models,
    };
    config.validate().context("invalid configuration")?;
    let listener = TcpListener::bind(&cli.listen)
        .await
        .with_context(|| format!("binding {}", cli.listen))?;
    let addr = listener.local_addr()?;
    announce(addr)?;
    sim::serve(listener, config, shutdown_signal()).await?;
    Ok(())
}

/// Prints the one stdout line tests wait for, and flushes it.
#[allow(clippy::print_stdout)]
fn announce(addr: std::net::SocketAddr) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{LISTENING_PREFIX}{addr}")?;
    stdout.flush()
}

/// Resolves on ctrl-c or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sigterm) => {
                sigterm.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
