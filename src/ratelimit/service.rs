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
        // An asynchronous submission is limited when its job runs, not
        // now: a burst is queued instead of refused (`jobs`).
        if self.limiter.policy().is_exempt(req.uri().path()) || is_async_submission(&req) {
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

/// Whether `req` submits a job: `POST /v1/jobs`, or `POST /v1/chat` with
/// `Prefer: respond-async`.
fn is_async_submission<B>(req: &Request<B>) -> bool {
    req.method() == http::Method::POST
        && match req.uri().path() {
            "/v1/jobs" => true,
            "/v1/chat" => prefers_async(req.headers()),
            _ => false,
        }
}

/// Whether `Prefer` (RFC 7240) asks for `respond-async`.
pub fn prefers_async(headers: &http::HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| {
            p.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("respond-async"))
        })
}

#[cfg(test)]
mod tests {
    //! The layer against `tower_test::mock`: readiness, the identity it
    //! needs, exempt paths, and refusals that never reach the inner
    //! service.

    use std::net::IpAddr;
    use std::task::Poll;

    use http::{Request, Response};
    use tower_test::mock;

    use super::*;
    use crate::identity::NetworkClass;
    use crate::ratelimit::policy::Policy;
    use crate::ratelimit::store::MemoryStore;
    use crate::ratelimit::{LimitConfig, RateLimitConfig, RateLimitLayer, RateLimited};

    fn layer(limit: u64) -> RateLimitLayer {
        let mut config = RateLimitConfig::default();
        if let Some(t) = config.tiers.get_mut("PUBLIC_IP") {
            t.limits = vec![LimitConfig::per(limit, std::time::Duration::from_secs(60))];
        }
        let limiter = Limiter::new(Policy::new(config), Arc::new(MemoryStore::new()));
        RateLimitLayer::new(Arc::new(limiter))
    }

    fn request(path: &str) -> Request<()> {
        let mut req = Request::get(path).body(()).unwrap();
        req.extensions_mut().insert(Identity::anonymous(
            IpAddr::from([203, 0, 113, 9]),
            NetworkClass::Public,
        ));
        req
    }

    #[tokio::test]
    async fn readiness_is_the_inner_services_and_wakes_with_it() {
        let (mut svc, mut handle) = mock::spawn_layer::<Request<()>, Response<()>, _>(layer(5));
        handle.allow(0);
        assert!(matches!(svc.poll_ready(), Poll::Pending));
        handle.allow(1);
        assert!(svc.is_woken());
        assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
    }

    #[tokio::test]
    async fn admitted_requests_get_the_headers_and_refused_ones_never_reach_the_service() {
        let (mut svc, mut handle) = mock::spawn_layer::<Request<()>, Response<()>, _>(layer(1));
        handle.allow(2);
        assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
        // The limiter decides before the inner call: drive the future.
        let fut = tokio::spawn(svc.call(request("/v1/chat")));
        let (_, send) = handle.next_request().await.expect("admitted");
        send.send_response(Response::new(()));
        let resp = fut.await.expect("joined").expect("answered");
        assert_eq!(resp.headers()["x-ratelimit-remaining"], "0");

        assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
        let err = svc.call(request("/v1/chat")).await.expect_err("limited");
        let rejection = err
            .downcast_ref::<crate::ratelimit::Rejection>()
            .expect("Rejection");
        assert!(rejection.error.is::<RateLimited>());
        assert_eq!(rejection.headers["x-ratelimit-remaining"], "0");
        let forwarded =
            tokio::time::timeout(std::time::Duration::from_millis(50), handle.next_request()).await;
        assert!(forwarded.is_err(), "the refused request was not forwarded");
    }

    #[tokio::test]
    async fn exempt_paths_pass_without_an_identity_and_others_need_one() {
        let (mut svc, mut handle) = mock::spawn_layer::<Request<()>, Response<()>, _>(layer(1));
        handle.allow(2);
        assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
        let fut = tokio::spawn(svc.call(Request::get("/health").body(()).unwrap()));
        let (_, send) = handle.next_request().await.expect("exempt");
        send.send_response(Response::new(()));
        fut.await.expect("joined").expect("answered");

        assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
        let err = svc
            .call(Request::get("/v1/chat").body(()).unwrap())
            .await
            .expect_err("no identity");
        assert!(
            err.is::<MissingIdentity>(),
            "a wiring bug is a 500, not an unlimited request"
        );
    }
}
