//! The router and the state its handlers share.

use std::{
    sync::{atomic::AtomicU64, Arc},
    time::{SystemTime, UNIX_EPOCH},
};

use axum::{
    middleware,
    routing::{get, post, put},
    Router,
};

use super::{
    capacity::Capacity, chat, config::SimConfig, embeddings, faults, faults::Faults, models, stats,
    stats::Stats, vector, vector::VectorStore,
};

/// Everything one simulator instance remembers.
#[derive(Debug)]
pub(crate) struct AppState {
    /// What this instance serves.
    pub(crate) config: SimConfig,
    /// Collections, starting with the knowledge base.
    pub(crate) store: VectorStore,
    /// Active fault sets.
    pub(crate) faults: Faults,
    /// The chat model's slots.
    pub(crate) capacity: Capacity,
    /// Counters and traceparents.
    pub(crate) stats: Stats,
    /// Source of `chatcmpl-sim-N` ids.
    pub(crate) next_id: AtomicU64,
    /// Unix seconds when this instance started: the `created` of every
    /// listed model.
    pub(crate) started: u64,
}

impl AppState {
    /// Fresh state: the knowledge base loaded, no faults, zero counters.
    pub(crate) fn new(config: SimConfig) -> Self {
        Self {
            store: VectorStore::with_knowledge_base(&config.collection, config.dim),
            faults: Faults::new(),
            capacity: Capacity::new(config.llm),
            stats: Stats::default(),
            next_id: AtomicU64::new(0),
            started: unix_now(),
            config,
        }
    }
}

/// The simulator as a plain [`Router`], for `oneshot` tests without sockets.
///
/// Everything works except the `reset` fault, which needs a socket and
/// answers 502 here; use [`serve`](super::serve) or [`spawn`](super::spawn)
/// for that. The caller is responsible for a valid `config`.
pub fn router(config: SimConfig) -> Router {
    app(Arc::new(AppState::new(config)))
}

/// The router over existing state.
pub(crate) fn app(state: Arc<AppState>) -> Router {
    // Faults (and counting) wrap only the API routes: the control endpoints
    // must keep answering while the upstream misbehaves.
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::completions))
        .route("/v1/models", get(models::list))
        .route("/v1/embeddings", post(embeddings::create))
        .route(
            "/collections/{name}",
            get(vector::info).put(vector::create_collection),
        )
        .route("/collections/{name}/points", put(vector::upsert))
        .route("/collections/{name}/points/search", post(vector::search))
        .route_layer(middleware::from_fn_with_state(state.clone(), faults::apply));
    let control = Router::new()
        .route(
            "/_faults",
            get(faults::show)
                .post(faults::replace)
                .delete(faults::clear),
        )
        .route("/_stats", get(stats::show))
        .route("/_stats/reset", post(stats::reset))
        .route("/healthz", get(|| async { "ok\n" }));
    api.merge(control).with_state(state)
}

/// Seconds since the Unix epoch; 0 if the clock is before it.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
