//! [`RateLimit`]: the tower service. Exempt paths pass straight through;
//! everything else is admitted (identity stored in the request's
//! extensions, headers added to the response) or refused with the mapped
//! JSON error and the same headers. It never waits for capacity: axum
//! services are always ready, so a refusal is an immediate answer.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::{IntoResponse, Response};
use http::Request;
use tower::Service;

use super::limiter::Limiter;

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
pub type ResponseFuture<E> = Pin<Box<dyn Future<Output = Result<Response, E>> + Send>>;

impl<S> Service<Request<Body>> for RateLimit<S>
where
    S: Service<Request<Body>, Response = Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        // The ready inner service is the one to call; leave a clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        Box::pin(async move {
            if limiter.policy().is_exempt(req.uri().path()) {
                return inner.call(req).await;
            }
            let peer = req
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0);
            let path = req.uri().path().to_owned();
            match limiter.admit(peer, req.headers(), &path).await {
                Ok(admission) => {
                    req.extensions_mut().insert(admission.identity);
                    let mut resp = inner.call(req).await?;
                    resp.headers_mut().extend(admission.headers);
                    Ok(resp)
                }
                Err(rejection) => Ok(rejection.into_response()),
            }
        })
    }
}
