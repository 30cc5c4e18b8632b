//! [`ResponseFuture`]: the inner future or the typed timeout error,
//! whichever comes first.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;

use super::error::{DeadlineExceeded, Elapsed};
use super::service::TimeoutKind;
use crate::resilience::BoxError;

pin_project! {
    /// The response future of [`super::Timeout`].
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        future: F,
        #[pin]
        sleep: Sleep,
        dependency: &'static str,
        after: Duration,
        kind: TimeoutKind,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(
        future: F,
        sleep: Sleep,
        dependency: &'static str,
        after: Duration,
        kind: TimeoutKind,
    ) -> Self {
        Self {
            future,
            sleep,
            dependency,
            after,
            kind,
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(result) = this.future.poll(cx) {
            return Poll::Ready(result.map_err(Into::into));
        }
        if this.sleep.poll(cx).is_pending() {
            return Poll::Pending;
        }
        let (dependency, after) = (*this.dependency, *this.after);
        let error: BoxError = match this.kind {
            TimeoutKind::Attempt => Box::new(Elapsed { dependency, after }),
            TimeoutKind::Deadline => Box::new(DeadlineExceeded { dependency, after }),
        };
        Poll::Ready(Err(error))
    }
}
