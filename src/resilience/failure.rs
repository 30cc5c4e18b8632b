//! What a client's failure means to the generic layers, without the layers
//! knowing the client's error type: each client error implements
//! [`ClassifyFailure`], and [`DependencyStack::wrap`](super::DependencyStack::wrap)
//! tags its errors with their [`FailureClass`] as they leave the client
//! (a [`Classified`] error whose source is the client's own error). The
//! breaker and retry read the tag; callers unwrap it with
//! [`Classified::into_source`] or walk through it, since it is transparent
//! in the cause chain.

use std::error::Error;
use std::time::Duration;

use super::BoxError;

/// How a call to a dependency failed, as far as resilience cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    /// No connection (refused, reset): a breaker failure, worth a retry.
    Unreachable,
    /// No answer in time: a breaker failure, worth a retry.
    Timeout,
    /// The dependency said it is overloaded or its gateway failed (502,
    /// 503, 504): a breaker failure, worth a retry after its hint.
    Overloaded {
        /// The dependency's `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// The dependency pushes back on our rate (429): it is up, so the
    /// breaker ignores it; a retry honours its hint.
    Throttled {
        /// The dependency's `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// The dependency failed in a way a retry will not fix (500, a body
    /// that cannot be understood): a breaker failure, never retried.
    Failed,
    /// The dependency answered that the request was bad (4xx): it did its
    /// job, so the breaker counts a success; never retried.
    Rejected,
    /// Not called: refused by a resilience layer further in (an inner
    /// breaker or bulkhead). Says nothing about health; never retried.
    Refused,
}

/// Implemented by every client's error type.
pub trait ClassifyFailure {
    /// What this failure means to the breaker and to retry.
    fn failure_class(&self) -> FailureClass;
}

/// A client error tagged with its class on its way out of the client.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct Classified {
    /// The class.
    pub class: FailureClass,
    /// The client's own error.
    #[source]
    pub source: BoxError,
}

impl Classified {
    /// Tags `error` with its own class.
    pub fn new<E>(error: E) -> Self
    where
        E: ClassifyFailure + Error + Send + Sync + 'static,
    {
        Self {
            class: error.failure_class(),
            source: Box::new(error),
        }
    }

    /// The client's error, with any tag removed (a boxed [`Classified`] is
    /// unwrapped, anything else returned as it is).
    pub fn into_source(error: BoxError) -> BoxError {
        match error.downcast::<Self>() {
            Ok(classified) => classified.source,
            Err(other) => other,
        }
    }
}

/// The class of the first tagged cause of `error`, if any.
pub fn class_of(error: &(dyn Error + 'static)) -> Option<FailureClass> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(c) = e.downcast_ref::<Classified>() {
            return Some(c.class);
        }
        cause = e.source();
    }
    None
}
