//! The idempotency-key layer's future.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::InvalidKey;
use crate::error::lift_poll;
use crate::outcome::{CallOutcome, StopReason};
use crate::{Error, IntoError};

pin_project! {
    /// The future of [`SetIdempotencyKey`](super::SetIdempotencyKey): the inner service's, or
    /// the caller's invalid key.
    pub struct ResponseFuture<F, E> {
        #[pin]
        pub(super) state: State<F>,
        pub(super) _error: PhantomData<fn() -> E>,
    }
}

pin_project! {
    #[project = StateProj]
    pub(super) enum State<F> {
        Call { #[pin] future: F },
        Invalid { error: InvalidKey },
    }
}

impl<F, T, E0> Future for ResponseFuture<F, Error<E0::Transport>>
where
    F: Future<Output = Result<T, E0>>,
    E0: IntoError,
{
    type Output = Result<T, Error<E0::Transport>>;

    // Inlined, so that the inner future's answer is not returned through memory once more.
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Call { future } => lift_poll(future.poll(cx)),
            StateProj::Invalid { error } => Poll::Ready(Err(invalid_key(*error))),
        }
    }
}

/// A call refused before any attempt: the key never left the process.
#[cold]
#[inline(never)]
fn invalid_key<T>(error: InvalidKey) -> Error<T> {
    let mut err: Error<T> = error.into();
    err.set_call_outcome(CallOutcome::refused(
        StopReason::Final,
        crate::context::budget_left_now(),
    ));
    err
}

impl<F, E> fmt::Debug for ResponseFuture<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Call { .. } => "call",
            State::Invalid { .. } => "invalid key",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
