//! Levee: a resilience gateway for retrieval-augmented generation backends.
//!
//! # Layout
//!
//! Modules in layers, lowest first; a module uses only modules below it
//! (`tests/layering.rs` checks this):
//!
//! 1. [`error`] (the config error every section's owner reports), [`text`]
//!    (tokenising for the built-in index and answerer), [`telemetry`] (the
//!    one metrics registry and the HTTP families, bounded label values,
//!    the tracing subscriber, W3C trace context, the outermost HTTP layer).
//! 2. [`identity`]: who is calling (client IP behind trusted proxies, API
//!    key by hash, tenant, tier, end user) and the tower layer that
//!    authenticates every request into the `Identity` extension.
//!    [`resilience`]: the per-dependency layers (deadline → retry → breaker
//!    → bulkhead → attempt timeout), judging failures through the
//!    `ClassifyFailure` trait each client error implements.
//!    [`fairness`]: per-tenant fair queues (weighted by token cost) in
//!    front of a capacity-limited dependency.
//! 3. [`upstream`]: the dependencies behind traits (OpenAI-compatible LLM,
//!    Qdrant, their embedded defaults), their errors, spans and metrics.
//! 4. [`health`]: last-known dependency states for `/ready`.
//! 5. [`rag`]: the protected backend: router → retriever → synthesizer
//!    with per-thread conversation memory.
//! 6. [`ratelimit`]: dual-layer limits (identity and network) checked once
//!    per request in one store call, token budgets, the tower layer.
//! 7. [`config`]: the TOML file, its defaults, `LEVEE_*` overrides and
//!    validation by section.
//! 8. [`wiring`]: the one place that knows every module: builds clients,
//!    wraps each in its resilience stack, keeps the breaker registry.
//! 9. [`http`]: the routes, the shared state, and the one error path
//!    (`http::respond`) every error leaves through.
//! 10. [`server`]: binds, serves, shuts down gracefully.
//!
//! # A request's path
//!
//! ```text
//! telemetry::TraceLayer (SERVER span, request metrics)
//!  ─▶ JSON errors for bare statuses ─▶ HandleError (http::rescue)
//!  ─▶ identity::Authenticate (401 here, in every configuration)
//!  ─▶ ratelimit::RateLimit (reads the Identity; 429 / 503)
//!  ─▶ handler: /v1/chat → rag::Pipeline → wiring::Guarded* → resilience
//!     stack → upstream client
//! ```
//!
//! Every refusal on the way is a typed error; `http::respond` walks its
//! causes and picks the status, the JSON body and the headers.

pub mod config;
pub mod error;
pub mod fairness;
pub mod health;
pub mod http;
pub mod identity;
pub mod jobs;
pub mod proxy;
pub mod rag;
pub mod ratelimit;
pub mod resilience;
pub mod server;
pub mod telemetry;
pub mod text;
pub mod upstream;
pub mod wiring;
