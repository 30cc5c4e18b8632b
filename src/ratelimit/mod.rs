//! Dual-layer rate limiting: the identity layer (API key / tenant) and the
//! network layer (client IP), checked and consumed together before any
//! expensive work.

pub mod store;
