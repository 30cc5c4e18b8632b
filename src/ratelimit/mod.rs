//! Dual-layer rate limiting: the identity layer (API key / tenant / user /
//! route) and the network layer (client IP → internal or public tier), all
//! checked and consumed in one store call before any expensive work, plus
//! per-tenant LLM token budgets.
//!
//! - [`store`]: the algorithms behind [`store::LimitStore`], in process and
//!   in Redis (one Lua script, one round trip).
//! - [`policy`]: which limits apply to a request, with safe key names.
//! - [`Limiter`]: resolve → gather → check once; token reservations.
//! - [`RateLimitLayer`] / [`RateLimit`]: the tower layer.
//! - [`headers`]: `X-RateLimit-*`, `Retry-After`, IETF `RateLimit*`.

mod config;
mod error;
pub mod headers;
mod layer;
mod limiter;
mod metrics;
pub mod policy;
mod service;
pub mod store;

pub use crate::identity::USER_HEADER;
pub use config::{
    FailureMode, LimitConfig, NetworkPolicy, RateLimitConfig, RoutePolicy, StoreKind, TenantConfig,
    TierConfig, DEFAULT_ALGORITHM, DEFAULT_KEY_PREFIX, DEFAULT_TENANT_POLICY, TIER_API_KEY,
    TIER_INTERNAL_IP, TIER_PUBLIC_IP,
};
pub use error::{LimiterUnavailable, MissingIdentity, RateLimited};
pub use layer::RateLimitLayer;
pub use limiter::{Limiter, Rejection, TokenReservation, X_DEGRADED};
pub use metrics::{RateLimitDecision, RateLimitMetrics};
pub use service::{prefers_async, RateLimit, ResponseFuture};
