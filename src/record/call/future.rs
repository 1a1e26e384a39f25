//! The call record layer's future, and the state of a recorded call.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context as TaskContext, Poll};

use http::HeaderValue;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::classify::{Classification, Classify, DeliveryPhase, OutcomeTally};
use crate::context::CallTally;
use crate::context::Context;
use crate::error::{lift, lift_poll};
use crate::outcome::CallOutcome;
use crate::record::trailers::{Settled, Watch};
use crate::record::{BusinessKey, CallId, CallRecord, Operation, Recorder};
use crate::time::Deadline;
use crate::Outcome;
use crate::StopReason;
use crate::{Envelope, Error, IntoError, Semantics};

/// What a call without a recorder needs to hand its outcome back when no layer inside does.
pub(super) struct Light<C> {
    pub(super) semantics: Semantics,
    pub(super) classifier: C,
    // Boxed: most calls have no key, and every layer outside moves this future.
    pub(super) key: Option<Box<HeaderValue>>,
}

impl<C> Light<C> {
    /// Hands back the outcome of the call's one attempt, unless a layer inside handed one back.
    fn hand_back<Res: Envelope, T>(self, out: &mut Result<Res, Error<T>>)
    where
        C: Classify<Res, Error<T>>,
    {
        let nowhere = matches!(out, Ok(res) if res.extensions().is_none());
        if nowhere || CallOutcome::of(out).is_some() {
            return;
        }
        let last = single(self.classifier, out);
        let (attempts, outcome, stop) = match last {
            Some(c) => {
                let mut tally = OutcomeTally::new(self.semantics);
                tally.observe(c.class());
                let stop = stop_after(out, c, self.semantics);
                (1, tally.outcome().unwrap_or(Outcome::Failed), stop)
            }
            None => (0, Outcome::Failed, refusal_stop(out)),
        };
        CallOutcome::hand_back(
            out,
            outcome,
            stop,
            attempts,
            self.key.map(|k| *k),
            crate::context::budget_left_now,
        );
        if let (Err(e), Some(last)) = (out, last) {
            e.note_last_attempt(last);
        }
    }
}

/// Classifies a call's result as its one attempt; `None` for a refusal by the crate's own
/// layers, which sent nothing (a spent deadline, an invalid key, an open breaker).
fn single<C, Res, T>(classifier: C, out: &Result<Res, Error<T>>) -> Option<Classification>
where
    C: Classify<Res, Error<T>>,
{
    match out {
        Ok(res) => Some(classifier.classify_response(res).at_head()),
        Err(e) if e.is_refusal() => None,
        Err(e) => Some(classifier.classify_error(e, DeliveryPhase::Sent)),
    }
}

/// Why a call whose last attempt was `c` stopped, when no layer inside said.
fn stop_after<Res, T>(
    out: &Result<Res, Error<T>>,
    c: Classification,
    semantics: Semantics,
) -> StopReason {
    match out {
        Err(e) if e.is_deadline_exceeded() || e.elapsed().is_some_and(|t| t.is_deadline()) => {
            StopReason::Deadline
        }
        _ => c.class().stop_reason(semantics),
    }
}

/// Why a call refused before any attempt stopped.
fn refusal_stop<Res, T>(out: &Result<Res, Error<T>>) -> StopReason {
    match out {
        Err(e) if e.invalid_key().is_some() => StopReason::Final,
        Err(e) if e.is_circuit_open() => StopReason::NotRetried,
        _ => StopReason::Deadline,
    }
}

pub(super) struct CallState<R, C> {
    pub(super) recorder: R,
    pub(super) classifier: Option<C>,
    pub(super) call: CallId,
    pub(super) key: Option<BusinessKey>,
    pub(super) operation: Option<Operation>,
    /// Whether the server answered with a stored result (`idempotent-replayed: true`).
    pub(super) replayed: bool,
    pub(super) semantics: Semantics,
    pub(super) started: Instant,
    pub(super) deadline_left: Option<std::time::Duration>,
    pub(super) span: tracing::Span,
    pub(super) ctx: Context,
    pub(super) tally: CallTally,
}

impl<R: Recorder, C> CallState<R, C> {
    /// Runs `f` inside the call's span, context and tally.
    pub(super) fn run<O>(&mut self, f: impl FnOnce() -> O) -> O {
        let (span, ctx) = (&self.span, self.ctx);
        self.tally.scope(|| span.in_scope(|| ctx.scope(f)))
    }

    /// Records the call; returns its outcome, which a resolver's answer may have settled.
    fn finish(
        &mut self,
        attempts: u32,
        outcome: Outcome,
        last: Option<Classification>,
        stop: StopReason,
    ) -> Outcome {
        let deadline_left = self.deadline_left.or_else(|| self.budget_set());
        // A resolver's answer settles an unknown outcome.
        let (resolution, key, retries) = self.tally.take_for_record();
        let outcome = match resolution {
            Some(q) if q.answer != Outcome::Unknown => q.answer,
            _ => outcome,
        };
        let rec = CallRecord {
            call: self.call,
            // A key layer inside may have given the call its key, and made it keyed.
            key: self.key.take().or(key),
            semantics: self.tally.outcome.semantics(),
            started: self.started,
            ended: Instant::now(),
            deadline_left,
            attempts,
            outcome,
            last,
            stop,
            resolution,
            retries,
            operation: self.operation.take(),
            replayed: self.replayed,
        };
        self.span.in_scope(|| self.recorder.record_call(&rec));
        outcome
    }

    /// The budget a deadline layer inside set for the call, as it stood when the call started.
    fn budget_set(&self) -> Option<std::time::Duration> {
        self.tally
            .deadline
            .map(|d| d.anchor(self.started).remaining_at(self.started))
    }

    /// What is left now of the budget the call had.
    fn budget_left(&self) -> Option<std::time::Duration> {
        let now = Instant::now();
        Deadline::earliest(
            self.deadline_left
                .map(|d| Deadline::after_from(self.started, d)),
            self.tally.deadline.map(|d| d.anchor(self.started)),
        )
        .map(|d| d.remaining_at(now))
    }

    /// What the call came to: the outcome a layer inside handed back on `out`, else the one
    /// the attempts the tally saw add up to, else `out` classified as the call's one attempt.
    fn verdict<Res: Envelope, T>(
        &mut self,
        out: &Result<Res, Error<T>>,
    ) -> (u32, Outcome, Option<Classification>, StopReason)
    where
        C: Classify<Res, Error<T>>,
    {
        let tally = &self.tally;
        if let Some(call) = CallOutcome::of(out) {
            return (
                call.attempts(),
                call.outcome(),
                tally.last,
                call.stop_reason(),
            );
        }
        let semantics = tally.outcome.semantics();
        let (attempts, outcome, last) = match tally.outcome.outcome() {
            Some(outcome) => (tally.ended.max(tally.started), outcome, tally.last),
            None => match self.classifier.take().and_then(|c| single(c, out)) {
                Some(c) => {
                    let mut one = OutcomeTally::new(semantics);
                    one.observe(c.class());
                    (1, one.outcome().unwrap_or(Outcome::Failed), Some(c))
                }
                None => (0, Outcome::Failed, None),
            },
        };
        let stop = match (self.tally.stop, last) {
            (Some(stop), _) => stop,
            (None, Some(c)) => stop_after(out, c, semantics),
            (None, None) => refusal_stop(out),
        };
        (attempts, outcome, last, stop)
    }

    /// Records the call that ended with `out`, and hands its outcome back on it, unless a
    /// layer inside did.
    fn finish_with<Res: Envelope, T>(&mut self, out: &mut Result<Res, Error<T>>)
    where
        C: Classify<Res, Error<T>>,
    {
        let handed_back = CallOutcome::of(out).is_some();
        let (attempts, outcome, last, stop) = self.verdict(out);
        let outcome = self.finish(attempts, outcome, last, stop);
        if !handed_back {
            self.hand_back(out, attempts, outcome, stop);
            if let (Err(e), Some(last)) = (out, last) {
                e.note_last_attempt(last);
            }
        }
    }

    /// Hands back an outcome no layer inside did.
    fn hand_back<Res: Envelope, T>(
        &mut self,
        out: &mut Result<Res, Error<T>>,
        attempts: u32,
        outcome: Outcome,
        stop: StopReason,
    ) {
        let key = self.tally.take_idempotency_key();
        let left = self.budget_left();
        CallOutcome::hand_back(out, outcome, stop, attempts, key, || left);
    }
}

pin_project! {
    /// The future of [`RecordCall`](super::RecordCall): the call, recorded (or only its
    /// outcome handed back, without a recorder) when it ends or is dropped.
    pub struct ResponseFuture<F, R: Recorder, C, E> {
        #[pin]
        pub(super) inner: F,
        // Boxed: a disabled recorder (`()`) keeps the future small.
        pub(super) state: Option<Box<CallState<R, C>>>,
        // Without a recorder, what hands the outcome back if no layer inside does.
        pub(super) light: Option<Light<C>>,
        pub(super) _error: PhantomData<fn() -> E>,
    }

    impl<F, R: Recorder, C, E> PinnedDrop for ResponseFuture<F, R, C, E> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(state) = this.project().state {
                // The response whose body is watched is dropped with this future, after this
                // runs: what its head said stands.
                let tally = state.tally.if_dropped_now();
                let outcome = match (tally.outcome.outcome(), tally.started) {
                    (Some(o), _) => o,
                    (None, 0) => Outcome::Failed,
                    // An attempt was in flight when the caller went away.
                    (None, _) if state.semantics.is_safe() => Outcome::Failed,
                    (None, _) => Outcome::Unknown,
                };
                state.finish(tally.started, outcome, tally.last, StopReason::Cancelled);
            }
        }
    }
}

impl<F, R, C, Res, T, E0> Future for ResponseFuture<F, R, C, Error<T>>
where
    F: Future<Output = Result<Res, E0>>,
    E0: IntoError<Transport = T>,
    Res: Envelope,
    R: Recorder + Send + 'static,
    C: Classify<Res, Error<T>> + Send + 'static,
{
    type Output = Result<Res, Error<T>>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(state) = this.state.as_mut() else {
            if this.light.is_none() {
                // A layer inside hands the outcome back: the answer passes on as it is.
                return lift_poll(this.inner.poll(cx));
            }
            let mut out = lift(ready!(this.inner.poll(cx)));
            if let Some(light) = this.light.take() {
                light.hand_back(&mut out);
            }
            return Poll::Ready(out);
        };
        let inner = this.inner;
        let mut out = match state.run(|| inner.poll(cx)) {
            Poll::Ready(out) => lift(out),
            Poll::Pending => return Poll::Pending,
        };
        state.replayed = matches!(&out, Ok(res) if crate::outcome::is_replay(res));
        if let (Some(_), Ok(res)) = (state.tally.deferred, &out)
            && res.extensions().and_then(|e| e.get::<Watch>()).is_some()
        {
            // The last attempt is recorded when its body ends: so is the call, after it.
            // The caller gets the outcome as it stands at the head.
            if CallOutcome::of(&out).is_none() {
                let (attempts, outcome, _, stop) = state.verdict(&out);
                state.hand_back(&mut out, attempts, outcome, stop);
            }
            let mut state = this.state.take().expect("checked above");
            if let Ok(res) = &out
                && let Some(watch) = res.extensions().and_then(|e| e.get::<Watch>())
            {
                watch.then_call(Box::new(move |settled: Settled| {
                    state.tally.observe(settled.attempt, settled.classification);
                    if settled.cancelled {
                        state.tally.stop.get_or_insert(StopReason::Cancelled);
                    }
                    let (attempts, outcome, last, stop) = state.settled();
                    state.finish(attempts, outcome, last, stop);
                }));
            }
            return Poll::Ready(out);
        }
        state.finish_with(&mut out);
        *this.state = None;
        Poll::Ready(out)
    }
}

impl<R: Recorder, C> CallState<R, C> {
    /// What a call whose last attempt was settled at the end of its body came to, from the
    /// attempts the tally saw.
    fn settled(&self) -> (u32, Outcome, Option<Classification>, StopReason) {
        let tally = &self.tally;
        let semantics = tally.outcome.semantics();
        let outcome = tally.outcome.outcome().unwrap_or(Outcome::Failed);
        let stop = match (tally.stop, tally.last) {
            (Some(stop), _) => stop,
            (None, Some(c)) => c.class().stop_reason(semantics),
            (None, None) => StopReason::Cancelled,
        };
        (tally.ended.max(tally.started), outcome, tally.last, stop)
    }
}

impl<F, R: Recorder, C, E> fmt::Debug for ResponseFuture<F, R, C, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
