//! [`Authenticate`]: resolves the caller once per request into the
//! [`Identity`] extension, or refuses it with a typed error (mapped to HTTP
//! by the one error path). Refusals never depend on whether limits are
//! configured: an unknown key is 401 in every configuration.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use axum::extract::ConnectInfo;
use http::Request;
use tower::{BoxError, Service};

use super::future::ResponseFuture;
use super::{Identity, IdentityError, Refused, Resolver};

/// Asked before a key is refused: the rate limiter counts the attempt
/// against the client's network limits and answers with the error to send
/// (the 401 with rate-limit headers, or a 429 once guessing is over the
/// limit).
#[async_trait]
pub trait OnRefusal: Send + Sync + 'static {
    /// The error to answer `identity` (the caller without a key) with.
    async fn refused(&self, identity: Identity, error: IdentityError) -> BoxError;
}

/// What every clone of the service shares.
pub(super) struct Shared {
    pub(super) resolver: Arc<Resolver>,
    pub(super) on_refusal: Option<Arc<dyn OnRefusal>>,
}

/// The authenticating service.
#[derive(Clone)]
pub struct Authenticate<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Authenticate<S> {
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Authenticate<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticate")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<Request<B>> for Authenticate<S>
where
    S: Service<Request<B>>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let peer = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0);
        let resolved = self
            .shared
            .resolver
            .resolve(peer, req.headers(), req.uri().path());
        match resolved {
            Ok(identity) => {
                req.extensions_mut().insert(identity);
                ResponseFuture::inner(self.inner.call(req))
            }
            Err(Refused::Network(error)) => ResponseFuture::refused(error.into()),
            Err(Refused::Key { identity, error }) => match &self.shared.on_refusal {
                Some(hook) => {
                    let hook = hook.clone();
                    ResponseFuture::hook(Box::pin(
                        async move { hook.refused(identity, error).await },
                    ))
                }
                None => ResponseFuture::refused(error.into()),
            },
        }
    }
}
