//! The deadline layer's future.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::timer::sealed::Timer;
use super::timer::{Enforcement, OwnTimer};
use super::Deadline;
use crate::context::{CallDeadline, Context, Report};
use crate::error::DeadlineExceeded;
use crate::outcome::{CallOutcome, StopReason};
use crate::{Error, IntoError};

pin_project! {
    /// The future of [`SetDeadline`](super::SetDeadline): the inner service's future, run with
    /// the call's deadline current, and ended by the deadline when no layer inside ends it.
    pub struct ResponseFuture<F, E, T: Enforcement = OwnTimer> {
        #[pin]
        pub(super) state: State<F, T>,
        pub(super) _error: PhantomData<fn() -> E>,
    }
}

pin_project! {
    #[project = StateProj]
    pub(super) enum State<F, T: Enforcement> {
        Refused,
        Running {
            #[pin]
            inner: F,
            #[pin]
            timer: <T as Timer>::Slot,
            ctx: Context,
        },
    }
}

impl<F, E, T: Enforcement> ResponseFuture<F, E, T> {
    pub(super) fn refused() -> Self {
        ResponseFuture {
            state: State::Refused,
            _error: PhantomData,
        }
    }
}

impl<F, R, E0, T> Future for ResponseFuture<F, Error<E0::Transport>, T>
where
    F: Future<Output = Result<R, E0>>,
    E0: IntoError,
    T: Enforcement,
{
    type Output = Result<R, Error<E0::Transport>>;

    // Inlined, and kept to what a call that answers on its first poll runs, so that the
    // inner future's answer is not returned through memory once more; the rest is out of line.
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        let StateProj::Running { inner, ctx, .. } = state.as_mut().project() else {
            // Refused before any attempt: nothing went out.
            return Poll::Ready(Err(refused()));
        };
        let (out, inside) = ctx.scope_collect(|| inner.poll(cx));
        // Matched whole: binding the answer first would copy it with its error's room (see
        // `lift`).
        match out {
            Poll::Ready(Ok(res)) => return Poll::Ready(Ok(res)),
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into_error())),
            Poll::Pending => {}
        }
        if !ctx.has_deadline() {
            return Poll::Pending;
        }
        wait::<F, T, R, E0::Transport>(state, cx, inside)
    }
}

/// The error of a call its deadline refused before any attempt.
#[cold]
#[inline(never)]
fn refused<E>() -> Error<E> {
    let mut err: Error<E> = DeadlineExceeded::refused().into();
    err.set_call_outcome(CallOutcome::refused(
        StopReason::Deadline,
        Some(Duration::ZERO),
    ));
    err
}

/// The rest of a poll of [`ResponseFuture`] whose call has a deadline and waits: one timer for
/// the call, unless a layer inside (`inside` says what it reported) ends it by the deadline.
#[inline(never)]
fn wait<F, T, R, E>(
    mut state: Pin<&mut State<F, T>>,
    cx: &mut TaskContext<'_>,
    inside: Report,
) -> Poll<Result<R, Error<E>>>
where
    T: Enforcement,
{
    let StateProj::Running { mut timer, ctx, .. } = state.as_mut().project() else {
        // Only a running call is handed here (`poll` returns for a refused one).
        return Poll::Pending;
    };
    let armed = T::is_armed(&timer);
    if !armed && let Some((now, ends_by)) = inside.packed() {
        // The common case, in packed time: anchor the deadline at the clock reading of the
        // layer inside, and if that layer ends the call by the deadline, one timer is
        // enough.
        if ctx.anchor_packed(now).is_some_and(|d| ends_by <= d) {
            return Poll::Pending;
        }
    }
    let Some(deadline) = ctx.deadline() else {
        return Poll::Pending;
    };
    // The call waits: from now on its deadline is an instant.
    let (deadline, now) = match deadline {
        CallDeadline::At(d) => (d, inside.now()),
        CallDeadline::Budget(b) => {
            let now = inside.now().unwrap_or_else(Instant::now);
            let d = Deadline::after_from(now, b);
            ctx.set_deadline(Some(CallDeadline::At(d)));
            (d, Some(now))
        }
    };
    let inside_ends_by = inside.ends_by();
    if !armed && inside_ends_by.is_some_and(|e| e <= deadline.instant()) {
        // A layer inside (an attempt timeout) will end the call by the deadline: one timer is
        // enough.
        Report::publish(Report::new(now, inside_ends_by));
        return Poll::Pending;
    }
    if !armed {
        T::arm(timer.as_mut(), deadline.instant());
    }
    if T::poll(timer, cx).is_pending() {
        let ends_by = inside_ends_by.map_or(deadline.instant(), |e| e.min(deadline.instant()));
        Report::publish(Report::new(now, Some(ends_by)));
        return Poll::Pending;
    }
    // Let the attempt go now, so that it is cancelled (and recorded) before the call ends, not
    // whenever the caller drops this future. A retry layer inside leaves what its attempts came
    // to, to hand back with the deadline's error.
    crate::context::take_left_behind();
    state.set(State::Refused);
    let mut err: Error<E> = DeadlineExceeded::in_flight().into();
    if let Some(call) = crate::context::take_left_behind() {
        err.set_call_outcome(call.stopped(StopReason::Deadline, Duration::ZERO));
    }
    Poll::Ready(Err(err))
}

impl<F, E, T: Enforcement> fmt::Debug for ResponseFuture<F, E, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
