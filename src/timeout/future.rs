//! The attempt timeout's future.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::classify::DeliveryPhase;
use crate::context::Report;
use crate::deadline::{self, Deadline};
use crate::delivery::Progress;
use crate::error::Elapsed;
use crate::{Error, IntoError};

pin_project! {
    /// The future of [`AttemptTimeout`](super::AttemptTimeout): the attempt, and its timer
    /// once it waits.
    #[project = ResponseFutureProj]
    pub struct ResponseFuture<F, E> {
        #[pin]
        pub(super) inner: F,
        #[pin]
        pub(super) sleep: Option<Sleep>,
        pub(super) per_try: Option<Duration>,
        // The request's own deadline; the call's comes from the context when the timer is armed.
        pub(super) deadline: Option<Deadline>,
        // Whether the armed timer is the call's deadline rather than the per-try timeout.
        pub(super) by_deadline: bool,
        // How long the armed timer gave the attempt.
        pub(super) given: Duration,
        pub(super) progress: Option<Progress>,
        pub(super) _error: PhantomData<fn() -> E>,
    }
}

impl<F, T, E0> Future for ResponseFuture<F, Error<E0::Transport>>
where
    F: Future<Output = Result<T, E0>>,
    E0: IntoError,
{
    type Output = Result<T, Error<E0::Transport>>;

    // Inlined, and kept to what an attempt that answers on its first poll runs, so that the
    // inner future's answer is not returned through memory once more; the rest is out of line.
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // Matched whole: binding the answer first would copy it with its error's room (see
        // `lift`).
        match this.inner.as_mut().poll(cx) {
            Poll::Ready(Ok(res)) => Poll::Ready(Ok(res)),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e.into_error())),
            Poll::Pending => wait(this, cx),
        }
    }
}

/// The rest of a poll of [`ResponseFuture`] whose attempt waits: its timer, armed on the first
/// wait.
#[inline(never)]
fn wait<F, T, E>(
    mut this: ResponseFutureProj<'_, F, Error<E>>,
    cx: &mut TaskContext<'_>,
) -> Poll<Result<T, Error<E>>> {
    let mut armed = false;
    if this.sleep.is_none() {
        // The first wait: read the clock once, and arm one timer for the earlier of the per-try
        // timeout and the call's deadline, both counted from that reading.
        let mut read = None;
        let left = deadline::left_at(*this.deadline, || *read.insert(Instant::now()));
        let (after, by_deadline) = match (*this.per_try, left) {
            (None, None) => return Poll::Pending,
            (Some(per_try), Some(left)) if left > per_try => (per_try, false),
            (Some(per_try), None) => (per_try, false),
            (_, Some(left)) => (left, true),
        };
        let now = read.unwrap_or_else(Instant::now);
        *this.by_deadline = by_deadline;
        *this.given = after;
        let limit = Deadline::after_from(now, after);
        let sleep = tokio::time::sleep_until(limit.instant());
        // This attempt ends by `limit`: an outer deadline layer needs no timer of its own. Said
        // before the timer is polled (if it fires at once, the attempt ends in this poll and the
        // report is moot), so that the timer's fresh stores have landed by the time it is moved
        // into the future.
        Report::publish(Report::after(now, after));
        this.sleep.set(Some(sleep));
        armed = true;
    }
    let Some(sleep) = this.sleep.as_pin_mut() else {
        return Poll::Pending;
    };
    let limit = sleep.deadline();
    if sleep.poll(cx).is_pending() {
        if !armed {
            Report::publish(Report::new(None, Some(limit)));
        }
        return Poll::Pending;
    }
    let phase = this
        .progress
        .as_ref()
        .map_or(DeliveryPhase::Sent, Progress::phase);
    Poll::Ready(Err(Elapsed::new(phase, *this.by_deadline)
        .with_given(*this.given)
        .into()))
}

impl<F, E> fmt::Debug for ResponseFuture<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("per_try", &self.per_try)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}
