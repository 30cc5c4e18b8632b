//! The `levee` binary: parse the command line, load the config, serve.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use levee::config::Config;
use levee::server;
use levee::telemetry::{Tracing, TracingConfig, DEFAULT_LOG_FILTER};

/// mimalloc instead of the system allocator: a request makes a few dozen
/// short-lived allocations across two worker threads, where glibc's
/// malloc spent about a fifth of the gateway's CPU (BENCHMARKS.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Levee: a resilience gateway for RAG / LLM backends.
#[derive(Debug, Parser)]
#[command(name = "levee", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway (embedded defaults when no config is given).
    Serve {
        /// TOML config file (default: `LEVEE_CONFIG`, else none).
        #[arg(long, env = "LEVEE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Validate a config file (with `LEVEE_*` overrides) and exit.
    CheckConfig {
        /// TOML config file.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let env = |k: &str| std::env::var(k).ok();
    match cli.command {
        Command::CheckConfig { file } => {
            Tracing::init_logs(&env("LEVEE_LOG").unwrap_or_else(|| DEFAULT_LOG_FILTER.to_owned()));
            match Config::load(Some(&file), env) {
                Ok(_) => {
                    eprintln!("{}: ok", file.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{}: {e}", file.display());
                    ExitCode::from(2)
                }
            }
        }
        Command::Serve { config } => {
            let config = match Config::load(config.as_deref(), env) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("levee: {e}");
                    return ExitCode::from(2);
                }
            };
            let tracing_config = match TracingConfig::from_env(env) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("levee: {e}");
                    return ExitCode::from(2);
                }
            };
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("levee: cannot start runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // The OTLP exporters keep their connections on the runtime.
            let tracing = match runtime.block_on(async { Tracing::init(&tracing_config) }) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("levee: {e}");
                    return ExitCode::from(2);
                }
            };
            let result = runtime.block_on(run(config));
            // Flush batched spans after the drain, while the runtime that
            // carries the exporter's connection is still running.
            tracing.shutdown();
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("levee: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn run(config: Config) -> Result<(), server::StartError> {
    let state = server::build(&config, |k| std::env::var(k).ok()).await?;
    let listener = server::bind(&config).await?;
    let addr = listener.local_addr().map_err(server::StartError::Serve)?;
    tracing::info!(%addr, llm = state.pipeline.synthesizer().kind(),
        vector_store = state.pipeline.retriever().kind(),
        memory = state.pipeline.memory().kind(), "levee listening");
    // SIGHUP re-reads the config file (as `POST /admin/reload` does).
    tokio::spawn(state.reloader.clone().on_hangup());
    server::serve(listener, state, &config, server::shutdown_signal()).await
}
