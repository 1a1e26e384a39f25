//! Handing a call's outcome back on the return path: on the response, or in the error.

use std::time::Duration;

use http::HeaderValue;

use super::Error;
use crate::outcome::{is_replay, sealed, CallOutcome, Outcome, OutcomeExt, StopReason};
use crate::Envelope;

impl CallOutcome {
    /// Hands the outcome of a call that ended with `out` back on it: into the response's
    /// extensions (a response type without extensions carries none, and costs nothing), or
    /// into the error. The replay mark is read from the response; `left` is asked for the
    /// budget left only when the outcome has somewhere to go.
    #[inline]
    pub(crate) fn hand_back<Res: Envelope, T>(
        out: &mut Result<Res, Error<T>>,
        outcome: Outcome,
        stop: StopReason,
        attempts: u32,
        key: Option<HeaderValue>,
        left: impl FnOnce() -> Option<Duration>,
    ) {
        let call = CallOutcome::maker(outcome, stop, attempts, key, left);
        match out {
            Ok(res) => CallOutcome::put_on(res, call),
            Err(e) => e.set_call_outcome(call(false)),
        }
    }

    /// [`hand_back`](Self::hand_back) on a result taken by value and returned.
    ///
    /// The result is taken apart and put together again rather than changed in place: a
    /// success is then passed on without its error's room, which for a large error is most
    /// of the bytes, copied through every layer outside.
    #[inline]
    pub(crate) fn handed_back<Res: Envelope, T>(
        out: Result<Res, Error<T>>,
        outcome: Outcome,
        stop: StopReason,
        attempts: u32,
        key: Option<HeaderValue>,
        left: impl FnOnce() -> Option<Duration>,
    ) -> Result<Res, Error<T>> {
        let call = CallOutcome::maker(outcome, stop, attempts, key, left);
        match out {
            Ok(mut res) => {
                CallOutcome::put_on(&mut res, call);
                Ok(res)
            }
            Err(mut e) => {
                e.set_call_outcome(call(false));
                Err(e)
            }
        }
    }

    /// What makes the outcome to hand back, given whether the answer was a replay; `left` is
    /// asked only then.
    #[inline]
    fn maker(
        outcome: Outcome,
        stop: StopReason,
        attempts: u32,
        key: Option<HeaderValue>,
        left: impl FnOnce() -> Option<Duration>,
    ) -> impl FnOnce(bool) -> CallOutcome {
        move |replayed| CallOutcome {
            outcome,
            stop,
            attempts,
            replayed,
            key,
            budget_left: left(),
        }
    }

    /// Puts the outcome `call` makes into the response's extensions, with the response's replay
    /// mark; a response type without extensions carries none. A response the gRPC transport
    /// marked ([`OutcomeInHeaders`](crate::outcome::OutcomeInHeaders)) gets it in its headers
    /// too, where tonic keeps it for an error `Status`.
    #[inline]
    fn put_on<Res: Envelope>(res: &mut Res, call: impl FnOnce(bool) -> CallOutcome) {
        let replayed = is_replay(&*res);
        let Some(extensions) = res.extensions_mut() else {
            // Nobody to hand it to, the common case for such a response: nothing more to do.
            if crate::outcome::sending() {
                crate::outcome::hand_to_send(|| call(replayed));
            }
            return;
        };
        let call = call(replayed);
        #[cfg(feature = "tonic")]
        if extensions
            .get::<crate::outcome::OutcomeInHeaders>()
            .is_some()
        {
            let value = crate::outcome::metadata::encode(&call);
            extensions.insert(call);
            if let Some(headers) = res.headers_mut() {
                headers.insert(crate::headers::OUTCOME, value);
            }
            return;
        }
        extensions.insert(call);
    }

    /// The outcome already handed back on `out` by a layer inside, if any.
    pub(crate) fn of<Res: Envelope, T>(out: &Result<Res, Error<T>>) -> Option<&CallOutcome> {
        match out {
            Ok(res) => res.extensions()?.get::<CallOutcome>(),
            Err(e) => e.call_outcome(),
        }
    }
}

impl<B, E> OutcomeExt for Result<http::Response<B>, Error<E>> {
    fn call_outcome(&self) -> Option<&CallOutcome> {
        match self {
            Ok(res) => res.call_outcome(),
            Err(e) => e.call_outcome(),
        }
    }

    fn outcome(&self) -> Outcome {
        match self {
            Ok(res) => res.outcome(),
            Err(e) => e.outcome(),
        }
    }

    fn attempts(&self) -> u32 {
        match self {
            Ok(res) => res.attempts(),
            Err(e) => e.attempts(),
        }
    }
}

impl<B, E> sealed::Sealed for Result<http::Response<B>, Error<E>> {}
