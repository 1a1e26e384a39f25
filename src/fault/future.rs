//! The [`InjectFault`](super::InjectFault)'s response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{sleep, Sleep};

use crate::classify::DeliveryPhase;
use crate::delivery::Progress;
use crate::error::lift;
use crate::error::InjectedFault;
use crate::{Error, IntoError};

const POLLED_AFTER_COMPLETION: &str = "fault::ResponseFuture polled after completion";

pin_project! {
    /// The response future of [`InjectFault`](super::InjectFault): the inner service's
    /// future, delayed, replaced or thrown away as the request's fault says.
    ///
    /// # Panics
    ///
    /// Like an `async fn`'s future, it panics if polled again after it completed.
    pub struct ResponseFuture<F, Res, E> {
        #[pin]
        state: State<F, Res, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, Res, E> {
        // The answer is known without running the inner future.
        Ready { result: Option<Result<Res, Error<E>>> },
        // Waiting before the inner future may run (it is not polled yet, so not pinned yet).
        Delay { #[pin] sleep: Sleep, future: Option<F> },
        // The inner future runs; `then` says what becomes of its result.
        Call { #[pin] future: F, then: Option<Then<Res>> },
        // Holding the inner future's result back.
        Hold { #[pin] sleep: Sleep, result: Option<Result<Res, Error<E>>> },
        Done,
    }
}

/// What becomes of the inner future's result.
pub(super) enum Then<Res> {
    /// Returned as it is.
    Pass,
    /// Dropped; the caller gets a reset.
    Reset,
    /// Dropped; the caller gets this instead.
    Replace(Result<Res, InjectedFault>),
    /// Returned after this long; the progress handle, if any, is marked sent first.
    Hold(Duration, Option<Progress>),
}

impl<F, Res, E> ResponseFuture<F, Res, E> {
    /// An answer made up without the inner service.
    pub(super) fn ready(result: Result<Res, InjectedFault>) -> Self {
        Self::with_state(State::Ready {
            result: Some(result.map_err(Error::from)),
        })
    }

    /// Runs `future` after `delay`, then passes its result through.
    pub(super) fn delay(delay: Duration, future: F) -> Self {
        Self::with_state(State::Delay {
            sleep: sleep(delay),
            future: Some(future),
        })
    }

    /// Runs `future` at once, then does `then` with its result.
    pub(super) fn call(future: F, then: Then<Res>) -> Self {
        Self::with_state(State::Call {
            future,
            then: Some(then),
        })
    }

    fn with_state(state: State<F, Res, E>) -> Self {
        ResponseFuture { state }
    }
}

impl<F, Res, E, FE> Future for ResponseFuture<F, Res, E>
where
    F: Future<Output = Result<Res, FE>>,
    FE: IntoError<Transport = E>,
{
    type Output = Result<Res, Error<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Ready { result } => {
                    let result = result.take().expect(POLLED_AFTER_COMPLETION);
                    state.set(State::Done);
                    return Poll::Ready(result);
                }
                StateProj::Delay { sleep, future } => {
                    ready!(sleep.poll(cx));
                    let future = future.take().expect(POLLED_AFTER_COMPLETION);
                    state.set(State::Call {
                        future,
                        then: Some(Then::Pass),
                    });
                }
                StateProj::Call { future, then } => {
                    let output = ready!(future.poll(cx));
                    let then = then.take().expect(POLLED_AFTER_COMPLETION);
                    let output = lift(output);
                    let result = match then {
                        Then::Pass => output,
                        Then::Reset => {
                            drop(output);
                            Err(InjectedFault::reset().into())
                        }
                        Then::Replace(replacement) => {
                            drop(output);
                            replacement.map_err(Error::from)
                        }
                        Then::Hold(delay, progress) => {
                            // The inner service answered, so it got the request: a timeout
                            // during the hold is a timeout after send.
                            if let Some(progress) = progress {
                                progress.mark(DeliveryPhase::Sent);
                            }
                            state.set(State::Hold {
                                sleep: sleep(delay),
                                result: Some(output),
                            });
                            continue;
                        }
                    };
                    state.set(State::Done);
                    return Poll::Ready(result);
                }
                StateProj::Hold { sleep, result } => {
                    ready!(sleep.poll(cx));
                    let result = result.take().expect(POLLED_AFTER_COMPLETION);
                    state.set(State::Done);
                    return Poll::Ready(result);
                }
                StateProj::Done => panic!("{POLLED_AFTER_COMPLETION}"),
            }
        }
    }
}

impl<F, Res, E> fmt::Debug for ResponseFuture<F, Res, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Ready { .. } => "ready",
            State::Delay { .. } => "delaying",
            State::Call { .. } => "calling",
            State::Hold { .. } => "holding",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
