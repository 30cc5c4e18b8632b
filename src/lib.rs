//! Levee: a resilience gateway for retrieval-augmented generation backends.
//!
//! # Layout
//!
//! - [`config`]: the TOML configuration, its defaults, `LEVEE_*` overrides
//!   and validation.
//! - [`server`]: builds clients and the pipeline from a config and serves
//!   with graceful shutdown.
//! - [`http`]: axum routes, the chat handler and the JSON error contract
//!   (the one place errors become statuses).
//! - [`rag`]: the protected backend: router → retriever → synthesizer with
//!   per-thread conversation memory.
//! - [`upstream`]: the dependencies behind traits: OpenAI-compatible LLM,
//!   Qdrant vector store, and their embedded defaults.
//! - [`health`]: last-known dependency states for `/ready`.
//! - [`telemetry`]: Prometheus metrics (`/metrics`), OpenTelemetry traces
//!   over OTLP, W3C trace context in from clients and out to upstreams.
//! - [`text`]: tokenising shared by the built-in index and answerer.

pub mod config;
pub mod health;
pub mod http;
pub mod identity;
pub mod rag;
pub mod ratelimit;
pub mod resilience;
pub mod server;
pub mod telemetry;
pub mod text;
pub mod upstream;
pub mod wiring;
