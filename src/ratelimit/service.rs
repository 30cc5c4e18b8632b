//! [`RateLimit`]: the tower service. Exempt paths pass straight through;
//! everything else is admitted (headers added to the response) or refused
//! with a typed [`Rejection`](super::Rejection) that carries the same
//! headers, for the one error path to turn into a response. It reads the
//! caller from the [`Identity`] extension set by the identity layer and
//! never parses identity headers itself. It never waits for capacity: axum
//! services are always ready, so a refusal is an immediate answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{BoxError, Service};

use super::error::MissingIdentity;
use super::limiter::Limiter;
use crate::identity::Identity;

/// The rate-limiting service.
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    limiter: Arc<Limiter>,
}

impl<S> RateLimit<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, limiter: Arc<Limiter>) -> Self {
        Self { inner, limiter }
    }
}

/// The service's future.
pub type ResponseFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, ReqB, ResB> Service<Request<ReqB>> for RateLimit<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    ReqB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = BoxError;
    type Future = ResponseFuture<Self::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        if self.limiter.policy().is_exempt(req.uri().path()) {
            let fut = self.inner.call(req);
            return Box::pin(async move { fut.await.map_err(Into::into) });
        }
        // The ready inner service is the one to call; leave a clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        Box::pin(async move {
            let Some(identity) = req.extensions().get::<Identity>() else {
                return Err(MissingIdentity.into());
            };
            let headers = limiter.admit(identity, req.uri().path()).await?;
            let mut resp = inner.call(req).await.map_err(Into::into)?;
            resp.headers_mut().extend(headers);
            Ok(resp)
        })
    }
}
