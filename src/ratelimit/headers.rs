//! Rate-limit response headers: the legacy `X-RateLimit-*` set describing
//! the most constraining limit, `Retry-After` on 429, and the IETF
//! `RateLimit-Policy` / `RateLimit` fields
//! (draft-ietf-httpapi-ratelimit-headers-10) listing every limit.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::policy::Applied;
use super::store::Decision;

/// `X-RateLimit-Limit`.
pub const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset` (seconds until the limit resets).
pub const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `X-RateLimit-Tier`.
pub const X_TIER: HeaderName = HeaderName::from_static("x-ratelimit-tier");
/// `X-RateLimit-Shadow-Limited`: shadow policies that would have rejected.
pub const X_SHADOW: HeaderName = HeaderName::from_static("x-ratelimit-shadow-limited");
/// `RateLimit-Policy` (IETF draft 10).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft 10).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Whole seconds, rounded up.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The index of the limit the legacy headers describe: on rejection the
/// enforced limit that makes the client wait longest; otherwise the one
/// with the least remaining (ties: the later reset). Shadow limits never
/// constrain.
pub fn most_constraining(applied: &[Applied], decision: &Decision) -> Option<usize> {
    let enforced = || {
        applied
            .iter()
            .zip(&decision.states)
            .enumerate()
            .filter(|(_, (a, _))| !a.spec.shadow)
    };
    if decision.allowed {
        enforced()
            .min_by(|(_, (_, x)), (_, (_, y))| {
                x.remaining
                    .cmp(&y.remaining)
                    .then(y.reset_after.cmp(&x.reset_after))
            })
            .map(|(i, _)| i)
    } else {
        enforced()
            .filter(|(_, (_, s))| !s.allowed)
            .max_by_key(|(_, (_, s))| s.retry_after)
            .map(|(i, _)| i)
    }
}

/// All rate-limit headers for a decision.
pub fn build(applied: &[Applied], decision: &Decision) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(i) = most_constraining(applied, decision) {
        let (a, s) = (&applied[i], &decision.states[i]);
        h.insert(X_LIMIT, HeaderValue::from(s.limit));
        h.insert(X_REMAINING, HeaderValue::from(s.remaining));
        h.insert(X_RESET, HeaderValue::from(ceil_secs(s.reset_after)));
        if let Ok(v) = HeaderValue::from_str(&a.tier) {
            h.insert(X_TIER, v);
        }
        if !decision.allowed {
            h.insert(
                http::header::RETRY_AFTER,
                HeaderValue::from(ceil_secs(s.retry_after).max(1)),
            );
        }
    }
    let policies: Vec<String> = applied
        .iter()
        .map(|a| {
            format!(
                "\"{}\";q={};w={}",
                a.name,
                a.spec.limit,
                ceil_secs(a.spec.window).max(1)
            )
        })
        .collect();
    let current: Vec<String> = applied
        .iter()
        .zip(&decision.states)
        .map(|(a, s)| {
            format!(
                "\"{}\";r={};t={}",
                a.name,
                s.remaining,
                ceil_secs(s.reset_after)
            )
        })
        .collect();
    let shadowed: Vec<&str> = applied
        .iter()
        .zip(&decision.states)
        .filter(|(a, s)| a.spec.shadow && !s.allowed)
        .map(|(a, _)| a.name.as_str())
        .collect();
    for (name, items) in [(RATELIMIT_POLICY, policies), (RATELIMIT, current)] {
        if let Ok(v) = HeaderValue::from_str(&items.join(", ")) {
            if !items.is_empty() {
                h.insert(name, v);
            }
        }
    }
    if let Ok(v) = HeaderValue::from_str(&shadowed.join(", ")) {
        if !shadowed.is_empty() {
            h.insert(X_SHADOW, v);
        }
    }
    h
}
