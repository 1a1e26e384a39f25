//! The breaker's response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::circuit::{health, CircuitBreaker, Pass};
use crate::classify::{Classify, DeliveryPhase};
use crate::error::lift;
use crate::error::CircuitOpen;
use crate::{Error, IntoError};

pin_project! {
    /// The future of [`Breaker`](super::Breaker): a refusal ready at once, or the inner
    /// service's future, whose result the breaker counts when it ends.
    ///
    /// Dropped before it ends, it counts nothing, and a half-open probe gives its place back.
    pub struct ResponseFuture<F, C> {
        #[pin]
        kind: Kind<F, C>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C> {
        Rejected { error: Option<CircuitOpen> },
        Called {
            #[pin]
            future: F,
            classifier: Option<C>,
            permit: Permit,
            started: Option<Instant>,
        },
    }
}

/// A passed call's leave, counted when the call ends and given back if it never does.
struct Permit {
    breaker: CircuitBreaker,
    pass: Pass,
    done: bool,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            self.breaker.complete(self.pass, None, None);
        }
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(super) fn called(
        future: F,
        classifier: C,
        breaker: CircuitBreaker,
        pass: Pass,
        started: Option<Instant>,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Called {
                future,
                classifier: Some(classifier),
                permit: Permit {
                    breaker,
                    pass,
                    done: false,
                },
                started,
            },
        }
    }

    pub(super) fn rejected(error: CircuitOpen) -> Self {
        ResponseFuture {
            kind: Kind::Rejected { error: Some(error) },
        }
    }
}

impl<F, C, Res, E0, T> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<Res, E0>>,
    E0: IntoError<Transport = T>,
    C: Classify<Res, Error<T>>,
{
    type Output = Result<Res, Error<T>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Rejected { error } => {
                let error = error
                    .take()
                    .expect("breaker::ResponseFuture polled after completion");
                Poll::Ready(Err(error.into()))
            }
            KindProj::Called {
                future,
                classifier,
                permit,
                started,
            } => {
                let out = lift(ready!(future.poll(cx)));
                let Some(classifier) = classifier.take() else {
                    return Poll::Ready(out);
                };
                let breaker = &permit.breaker;
                let failure = match &out {
                    Err(e) if breaker.says_nothing(e) => None,
                    Ok(res) => health(&classifier.classify_response(res).at_head()),
                    Err(e) => health(&classifier.classify_error(e, DeliveryPhase::Sent)),
                };
                permit.done = true;
                breaker.settle(permit.pass, failure, *started);
                Poll::Ready(out)
            }
        }
    }
}

impl<F, C> fmt::Debug for ResponseFuture<F, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Rejected { .. } => "rejected",
            Kind::Called { .. } => "called",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}
