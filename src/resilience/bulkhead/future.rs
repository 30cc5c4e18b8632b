//! [`ResponseFuture`]: holds the bulkhead slot for the inner future's life.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::sync::OwnedSemaphorePermit;

use super::error::BulkheadFull;
use crate::resilience::BoxError;

pin_project! {
    /// The response future of [`super::Bulkhead`].
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Called {
            #[pin]
            future: F,
            permit: Option<OwnedSemaphorePermit>,
        },
        Rejected {
            error: Option<BulkheadFull>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(future: F, permit: OwnedSemaphorePermit) -> Self {
        Self {
            kind: Kind::Called {
                future,
                permit: Some(permit),
            },
        }
    }

    pub(crate) fn rejected(error: BulkheadFull) -> Self {
        Self {
            kind: Kind::Rejected { error: Some(error) },
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
        match self.project().kind.project() {
            KindProj::Called { future, permit } => {
                let result = ready!(future.poll(cx));
                // Free the slot as soon as the call is over.
                permit.take();
                Poll::Ready(result.map_err(Into::into))
            }
            KindProj::Rejected { error } => {
                let error = error.take().expect("polled after completion");
                Poll::Ready(Err(Box::new(error)))
            }
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
