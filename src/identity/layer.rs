//! [`IdentityLayer`]: holds the shared [`Resolver`] and the refusal hook;
//! `layer()` only builds the service.

use std::sync::Arc;

use tower::Layer;

use super::service::{Authenticate, OnRefusal, Shared};
use super::Resolver;

/// Authenticates every request before the inner service runs.
#[derive(Clone)]
pub struct IdentityLayer {
    shared: Arc<Shared>,
}

impl IdentityLayer {
    /// A layer resolving identities with `resolver`.
    pub fn new(resolver: Arc<Resolver>) -> Self {
        Self {
            shared: Arc::new(Shared {
                resolver,
                on_refusal: None,
            }),
        }
    }

    /// Consults `hook` before refusing a key, so guessing keys still counts
    /// against the client's network limits (the limiter implements it).
    #[must_use]
    pub fn with_refusal_hook(self, hook: Arc<dyn OnRefusal>) -> Self {
        Self {
            shared: Arc::new(Shared {
                resolver: self.shared.resolver.clone(),
                on_refusal: Some(hook),
            }),
        }
    }
}

impl std::fmt::Debug for IdentityLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityLayer")
            .field("hook", &self.shared.on_refusal.is_some())
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for IdentityLayer {
    type Service = Authenticate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authenticate::new(inner, self.shared.clone())
    }
}
