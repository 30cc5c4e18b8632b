//! [`TraceLayer`] / [`Trace`]: the outermost observability layer of the
//! HTTP stack. One SERVER span per request (joining the client's W3C trace
//! when it sent a `traceparent`) and the `levee_http_*` metrics.
//!
//! It sits OUTSIDE the rate-limit layer, so requests answered early (429,
//! 503, 401) are traced and counted like any other; the limiter records
//! why it refused on this span (`levee.ratelimit.*`).

mod layer;
mod service;

pub use layer::TraceLayer;
pub use service::{ResponseFuture, Trace};
