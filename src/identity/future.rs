//! [`ResponseFuture`]: the inner service's future, or a refusal. Admitted
//! requests pay no allocation here; only a refused key that must consult
//! the limiter is boxed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use pin_project_lite::pin_project;
use tower::BoxError;

pin_project! {
    /// The future of [`super::Authenticate`].
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Inner { #[pin] fut: F },
        Hook { fut: BoxFuture<'static, BoxError> },
        Refused { error: Option<BoxError> },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn inner(fut: F) -> Self {
        Self {
            state: State::Inner { fut },
        }
    }

    pub(super) fn hook(fut: BoxFuture<'static, BoxError>) -> Self {
        Self {
            state: State::Hook { fut },
        }
    }

    pub(super) fn refused(error: BoxError) -> Self {
        Self {
            state: State::Refused { error: Some(error) },
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
        match self.project().state.project() {
            StateProj::Inner { fut } => fut.poll(cx).map_err(Into::into),
            StateProj::Hook { fut } => fut.as_mut().poll(cx).map(Err),
            StateProj::Refused { error } => Poll::Ready(Err(error
                .take()
                .unwrap_or_else(|| "identity future polled after completion".into()))),
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
