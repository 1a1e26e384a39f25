//! The retry layer's future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context as TaskContext, Poll};
use std::time::Duration;

use http::HeaderValue;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use super::layer::Config;
use crate::backoff::Delays;
use crate::breaker::{health, CircuitBreaker, CircuitOpen, Pass};
use crate::classify::{
    AttemptClass, Classification, Classify, DeliveryPhase, MakeClassifier, OutcomeTally,
};
use crate::context::budget_left_now;
use crate::context::CallTally;
use crate::context::Context;
use crate::deadline::{self, codec};
use crate::error::lift;
use crate::headers::DEFAULT_HEADER;
use crate::headers::GRPC_PREVIOUS_RPC_ATTEMPTS;
use crate::headers::GRPC_TIMEOUT;
use crate::journal::{BeginFuture, IntentId};
use crate::outcome::CallOutcome;
use crate::pushback::Pushback;
use crate::record::{BusinessKey, Operation, ResolutionRecord, RetryRecord};
use crate::resolve::{NoResolver, Query, Resolution, Resolve, Resolving};
use crate::time::later;
use crate::Outcome;
use crate::StopReason;
use crate::{Envelope, Error, IntoError, Semantics};

pin_project! {
    /// The future of [`Retry`](super::Retry): one call, with as many attempts as it may have.
    ///
    /// It hands the call's [`CallOutcome`] back with its result.
    pub struct ResponseFuture<S, Req, M, Z = NoResolver>
    where
        S: Service<Req>,
        S::Error: IntoError,
        M: MakeClassifier<Req>,
    {
        #[pin]
        state: State<S::Future, S::Response>,
        classifier: Option<M::Classifier>,
        tally: OutcomeTally,
        template: Option<Req>,
        // The layer's settings, and the copy of the inner service the retries are cloned from.
        shared: Arc<Shared<S, M, Z>>,
        // The attempt number: the one in flight, or the last one made.
        attempts: u32,
        // Attempts that went out and ended (a breaker's refusal did not go out; a hedged
        // attempt counts its copies).
        sent: u32,
        // The leave of the layer's own breaker for the attempt in flight, if it has one.
        pass: Option<Pass>,
        // What only some calls need (a wait before a retry, a resolver, a learned attempt
        // time), boxed and made the first time it is needed, so that every layer outside moves
        // a small future.
        cold: Option<Box<Cold<S, S::Response, Error<<S::Error as IntoError>::Transport>>>>,
    }

    impl<S, Req, M, Z> PinnedDrop for ResponseFuture<S, Req, M, Z>
    where
        S: Service<Req>,
        S::Error: IntoError,
        M: MakeClassifier<Req>,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let (Some(pass), Some(breaker)) = (this.pass.take(), &this.shared.config.breaker) {
                // An attempt cut short says nothing of the dependency; a probe's place is
                // given back.
                breaker.complete(pass, None, None);
            }
            let in_flight = match this.state.as_ref().get_ref() {
                State::Done => return,
                State::Attempt { .. } => this.classifier.is_some(),
                State::Journaling => {
                    // Nothing was sent: the intent, if it was written, may go.
                    end_intent(&this.shared.config, this.cold, Outcome::Failed);
                    false
                }
                _ => false,
            };
            // Dropped before it ended (a deadline layer outside cut it short, or its caller
            // went away): what it knows is left for the layer that dropped it.
            let (mut tally, mut sent) = (*this.tally, *this.sent);
            if in_flight {
                // The attempt in flight may have been written: it may have committed.
                tally.observe(AttemptClass::MaybeCommitted);
                sent += 1;
            }
            let key = this.cold.as_mut().and_then(|c| c.idempotency_key.take());
            crate::context::leave_behind(|| {
                let outcome = tally.outcome().unwrap_or(Outcome::Failed);
                let call = CallOutcome::new(outcome, StopReason::Cancelled, sent);
                match key {
                    Some(key) => call.with_idempotency_key(key),
                    None => call,
                }
            });
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, Res> {
        // The call's intent is being written (the write is in `Cold`, where it costs the
        // calls that are not journaled nothing); the request waits in the template.
        Journaling,
        Attempt { #[pin] future: F },
        // The layer's own breaker refused the attempt: it was not made.
        Refused { error: Option<CircuitOpen> },
        // The timer is in `Cold`; the retry is recorded when it goes out.
        Waiting { retry: RetryRecord },
        Readying { retry: RetryRecord },
        Resolving { query: Resolving<Res>, stop: StopReason },
        // The call's result was returned.
        Done,
    }
}

/// What a retry layer's service shares with its calls' futures: the layer's settings, and the
/// copy of the inner service each retry clones the service it sends through from.
pub(super) type Shared<S, M, Z> = crate::spare::Shared<S, Config<M, Z>>;

/// The rarely used part of a retry future.
struct Cold<S, Res, E> {
    // The service of the attempt about to be made: the one the layer made ready, for a
    // journaled call's first attempt (sent once the intent is written), or a retry's clone
    // that was not ready at once.
    service: Option<S>,
    delays: Option<Delays>,
    sleep: Option<Pin<Box<Sleep>>>,
    // The outcome of the last attempt while a resolver is asked: the call's outcome if
    // nothing replaces it.
    last: Option<Result<Res, E>>,
    // The business key and the operation, kept for a resolver.
    key: Option<BusinessKey>,
    operation: Option<Operation>,
    // The idempotency key every attempt carries, for the call's outcome.
    idempotency_key: Option<HeaderValue>,
    // When the attempt in flight (or the resolver's query) started, when it is timed.
    started: Option<Instant>,
    // The call's intent, when it was journaled, and its write while it is under way.
    intent: Option<IntentId>,
    write: Option<BeginFuture>,
    // Whether the first attempt of a journaled call sends a copy of the template (the
    // request can be retried) or the template itself.
    copy_first: bool,
}

impl<S, Res, E> Cold<S, Res, E> {
    fn new() -> Box<Self> {
        Box::new(Cold {
            service: None,
            delays: None,
            sleep: None,
            last: None,
            key: None,
            operation: None,
            idempotency_key: None,
            started: None,
            intent: None,
            write: None,
            copy_first: false,
        })
    }
}

impl<S, Req, M, Z> ResponseFuture<S, Req, M, Z>
where
    S: Service<Req> + Clone,
    S::Error: IntoError,
    M: MakeClassifier<Req>,
{
    /// The call's future: its first attempt sent through `service` (made ready by the layer)
    /// now, or, for a journaled call, once its intent is written.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn new(
        req: Req,
        classifier: M::Classifier,
        semantics: Semantics,
        template: Option<Req>,
        key: Option<BusinessKey>,
        operation: Option<Operation>,
        idempotency_key: Option<HeaderValue>,
        service: &mut S,
        shared: Arc<Shared<S, M, Z>>,
        gate: Option<Result<Pass, CircuitOpen>>,
        journaled: Option<(IntentId, BeginFuture)>,
    ) -> Self {
        let (timed, lender) = (shared.config.timed, shared.config.lender);
        let cold = (key.is_some()
            || operation.is_some()
            || idempotency_key.is_some()
            || timed
            || journaled.is_some())
        .then(|| {
            let mut cold = Cold::new();
            cold.key = key;
            cold.operation = operation;
            cold.idempotency_key = idempotency_key;
            cold.started = timed.then(Instant::now);
            cold
        });
        if let Some((intent, write)) = journaled {
            // The first attempt waits for the intent; the request waits in the template.
            let mut cold = cold.unwrap_or_else(Cold::new);
            cold.intent = Some(intent);
            cold.write = Some(write);
            // The service made ready is kept for the first attempt; the layer keeps a clone.
            let clone = service.clone();
            cold.service = Some(std::mem::replace(service, clone));
            cold.copy_first = template.is_some();
            let template = if cold.copy_first { template } else { Some(req) };
            return ResponseFuture {
                classifier: Some(classifier),
                tally: OutcomeTally::new(semantics),
                template,
                attempts: 1,
                sent: 0,
                pass: None,
                cold: Some(cold),
                state: State::Journaling,
                shared,
            };
        }
        let (pass, refused) = match gate {
            Some(Ok(pass)) => (Some(pass), None),
            Some(Err(open)) => (None, Some(open)),
            None => (None, None),
        };
        // The attempt's `call` runs with the budget lent, for a hedge layer inside.
        let _lent = crate::context::lend(lender);
        // The first attempt's future is made last, in its place, so that it is not copied.
        ResponseFuture {
            classifier: Some(classifier),
            tally: OutcomeTally::new(semantics),
            template,
            attempts: 1,
            sent: 0,
            pass,
            cold,
            state: match refused {
                None => State::Attempt {
                    future: service.call(req),
                },
                error => State::Refused { error },
            },
            shared,
        }
    }
}

/// Sends an attempt through the service `service` gives, unless the layer's own breaker
/// refuses it (then the service is not asked for, and the attempt is not made).
#[inline]
fn send<S, Req, M, Z>(
    config: &Config<M, Z>,
    pass: &mut Option<Pass>,
    mut state: Pin<&mut State<S::Future, S::Response>>,
    service: impl FnOnce() -> S,
    req: Req,
) where
    S: Service<Req>,
{
    match config.breaker.as_ref().map(CircuitBreaker::admit) {
        Some(Err(open)) => state.set(State::Refused { error: Some(open) }),
        gate => {
            *pass = gate.and_then(Result::ok);
            let mut service = service();
            // The attempt's `call` runs with the budget lent, for a hedge layer inside.
            let _lent = crate::context::lend(config.lender);
            state.set(State::Attempt {
                future: service.call(req),
            });
        }
    }
}

/// What to do after a retryable attempt.
enum Next {
    /// Wait this long (set by the server's pushback, or not), then try again.
    Retry(Duration, bool),
    /// Stop, for this reason.
    Stop(StopReason),
    /// Not retryable: stop; the record knows why from the attempt's class.
    Done,
}

impl<S, Req, M, Z, T> Future for ResponseFuture<S, Req, M, Z>
where
    S: Service<Req> + Clone,
    S::Error: IntoError<Transport = T>,
    S::Response: Envelope,
    Req: Envelope + Clone,
    M: MakeClassifier<Req>,
    M::Classifier: Classify<S::Response, Error<T>>,
    Z: Resolve<S::Response>,
{
    type Output = Result<S::Response, Error<T>>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let out = match this.state.as_mut().project() {
                StateProj::Journaling => {
                    let write = this
                        .cold
                        .as_mut()
                        .and_then(|cold| cold.write.as_mut())
                        .expect("a journaled call keeps its intent's write");
                    let written = ready!(write.as_mut().poll(cx));
                    if let Some(cold) = this.cold.as_mut() {
                        cold.write = None;
                    }
                    if let Err(e) = written {
                        // Not written: not sent.
                        this.state.set(State::Done);
                        let mut err: Error<T> = e.into();
                        err.set_call_outcome(CallOutcome::refused(
                            StopReason::NotRetried,
                            budget_left_now(),
                        ));
                        return Poll::Ready(Err(err));
                    }
                    let cold = this
                        .cold
                        .as_mut()
                        .expect("a journaled call keeps its intent");
                    if this.shared.config.timed {
                        cold.started = Some(Instant::now());
                    }
                    let req = if cold.copy_first {
                        this.template.clone()
                    } else {
                        this.template.take()
                    };
                    let req = req.expect("a journaled request waits in the template");
                    let service = || {
                        cold.service
                            .take()
                            .expect("a journaled call keeps the service made ready")
                    };
                    send(
                        &this.shared.config,
                        this.pass,
                        this.state.as_mut(),
                        service,
                        req,
                    );
                    continue;
                }
                StateProj::Attempt { future } => lift(ready!(future.poll(cx))),
                StateProj::Refused { error } => {
                    Err(error.take().expect("a refused attempt ends once").into())
                }
                StateProj::Waiting { retry } => {
                    if let Some(sleep) = this.cold.as_mut().and_then(|c| c.sleep.as_mut()) {
                        ready!(sleep.as_mut().poll(cx));
                    }
                    let retry = *retry;
                    this.state.set(State::Readying { retry });
                    continue;
                }
                StateProj::Readying { retry } => {
                    // A clone of the shared copy, or the clone kept when it was not ready.
                    let mut service = match this.cold.as_mut().and_then(|c| c.service.take()) {
                        Some(service) => service,
                        None => this.shared.service.service(),
                    };
                    let ready = match service.poll_ready(cx) {
                        Poll::Ready(ready) => ready,
                        Poll::Pending => {
                            this.cold.get_or_insert_with(Cold::new).service = Some(service);
                            return Poll::Pending;
                        }
                    };
                    if let Err(e) = ready {
                        // The service failed before the retry went out: the call ends with its
                        // error, and the outcome of the attempts made.
                        let outcome = this.tally.outcome().unwrap_or(Outcome::Failed);
                        this.state.set(State::Done);
                        end_intent(&this.shared.config, this.cold, outcome);
                        return Poll::Ready(hand_back(
                            Err(e.into_error()),
                            outcome,
                            StopReason::NotRetried,
                            *this.sent,
                            this.cold,
                            None,
                        ));
                    }
                    // The retry happens now: the record lists it (a call dropped while it
                    // waited lists no retry that never went out).
                    report_retry(*retry);
                    // A retry is decided only for a replayable request (`decide`). The last
                    // attempt the limit allows takes the template itself: no copy of the
                    // request (for HTTP, of its headers) is made that no attempt could use.
                    let template = if *this.attempts + 1 >= this.shared.config.max_attempts {
                        this.template.take()
                    } else {
                        this.template.clone()
                    };
                    let mut req = template.expect("a retried request has a template");
                    let previous = *this.attempts;
                    *this.attempts += 1;
                    write_attempts(
                        &mut req,
                        previous,
                        this.shared.config.attempt_header.as_ref(),
                    );
                    refresh_deadline(&mut req);
                    *this.classifier = Some(this.shared.config.classifier.make_classifier(&req));
                    if this.shared.config.timed {
                        this.cold.get_or_insert_with(Cold::new).started = Some(Instant::now());
                    }
                    send(
                        &this.shared.config,
                        this.pass,
                        this.state.as_mut(),
                        || service,
                        req,
                    );
                    continue;
                }
                StateProj::Resolving { query, stop } => {
                    let answer = ready!(query.future().poll(cx));
                    let stop = *stop;
                    let cold = this
                        .cold
                        .as_mut()
                        .expect("the last result is kept while resolving");
                    let last = cold
                        .last
                        .take()
                        .expect("the last result is kept while resolving");
                    let (outcome, out) = match answer {
                        Resolution::Succeeded(res) => (Outcome::Succeeded, Ok(res)),
                        Resolution::Failed => (Outcome::Failed, last),
                        Resolution::Unknown => (Outcome::Unknown, last),
                    };
                    let started = cold.started.unwrap_or_else(Instant::now);
                    report_resolution(outcome, started);
                    this.state.set(State::Done);
                    end_intent(&this.shared.config, this.cold, outcome);
                    return Poll::Ready(hand_back(out, outcome, stop, *this.sent, this.cold, None));
                }
                // Polled again after it returned.
                StateProj::Done => return Poll::Pending,
            };
            // The attempt ended (or was refused by the layer's own breaker).
            let Some(classifier) = this.classifier.take() else {
                return Poll::Ready(out);
            };
            *this.sent += copies(&out);
            let classification = match &out {
                Ok(res) => classifier.classify_response(res).at_head(),
                Err(e) => classifier.classify_error(e, DeliveryPhase::Sent),
            };
            this.tally.observe(classification.class());
            let config = &*this.shared.config;
            let started = this.cold.as_ref().and_then(|c| c.started);
            if let (Some(pass), Some(breaker)) = (this.pass.take(), &config.breaker) {
                let failure = match &out {
                    Err(e) if breaker.says_nothing(e) => None,
                    _ => health(&classification),
                };
                breaker.settle(pass, failure, started);
            }
            if let (Some(learned), Some(started)) = (&config.learned, started) {
                // Only answered attempts say how long the server takes.
                if classification.phase() == DeliveryPhase::ResponseStarted {
                    learned.observe(started.elapsed());
                }
            }
            if let Some(budget) = &config.budget {
                budget.record_outcome(classification.class());
            }
            let next = if ended_by_deadline(&out) {
                // Whatever the attempt was, the call has no time left for another.
                Next::Stop(StopReason::Deadline)
            } else if classification.class().is_retryable(this.tally.semantics()) {
                decide(
                    config,
                    &classification,
                    *this.attempts,
                    this.template.as_ref(),
                    this.cold,
                )
            } else {
                Next::Done
            };
            let stop = match next {
                Next::Retry(wait, pushback) => {
                    let retry = RetryRecord {
                        after: *this.attempts,
                        wait,
                        pushback,
                    };
                    if wait.is_zero() {
                        this.state.set(State::Readying { retry });
                        continue;
                    }
                    let until = later(Instant::now(), wait);
                    let cold = this.cold.get_or_insert_with(Cold::new);
                    match &mut cold.sleep {
                        Some(sleep) => sleep.as_mut().reset(until),
                        None => cold.sleep = Some(Box::pin(tokio::time::sleep_until(until))),
                    }
                    this.state.set(State::Waiting { retry });
                    continue;
                }
                Next::Stop(reason) => {
                    report_stop(reason);
                    reason
                }
                Next::Done => classification.class().stop_reason(this.tally.semantics()),
            };
            // An unknown outcome is settled by the resolver, when there is one and it
            // takes the question.
            if this.tally.outcome() == Some(Outcome::Unknown) {
                let query = Query {
                    key: this.cold.as_mut().and_then(|c| c.key.take()),
                    operation: this.cold.as_mut().and_then(|c| c.operation.take()),
                    semantics: this.tally.semantics(),
                    attempts: *this.attempts,
                    last: classification,
                };
                if let Some(query) = config.resolver.resolve(query) {
                    let cold = this.cold.get_or_insert_with(Cold::new);
                    cold.last = Some(out);
                    cold.started = Some(Instant::now());
                    this.state.set(State::Resolving { query, stop });
                    continue;
                }
            }
            let outcome = this.tally.outcome().unwrap_or(Outcome::Unknown);
            this.state.set(State::Done);
            end_intent(&this.shared.config, this.cold, outcome);
            return Poll::Ready(hand_back(
                out,
                outcome,
                stop,
                *this.sent,
                this.cold,
                Some(classification),
            ));
        }
    }
}

/// How many attempts a finished attempt stands for: none for a circuit breaker's refusal (it
/// never went out), as many as a layer inside that made several (a hedge) handed back, and
/// otherwise one.
#[inline]
fn copies<Res: Envelope, T>(out: &Result<Res, Error<T>>) -> u32 {
    match out {
        Err(e) if e.is_circuit_open() => 0,
        out => CallOutcome::of(out).map_or(1, CallOutcome::attempts),
    }
}

/// Whether the attempt was ended by the call's deadline (an attempt timeout at the deadline,
/// or a deadline layer inside).
fn ended_by_deadline<Res, T>(out: &Result<Res, Error<T>>) -> bool {
    match out {
        Ok(_) => false,
        Err(e) => e.is_deadline_exceeded() || e.elapsed().is_some_and(|t| t.is_deadline()),
    }
}

/// Tells the journal, if the call was journaled, how it ended.
#[inline]
fn end_intent<M, Z, Sv, R, E>(
    config: &Config<M, Z>,
    cold: &mut Option<Box<Cold<Sv, R, E>>>,
    outcome: Outcome,
) {
    if let (Some(journal), Some(intent)) =
        (&config.journal, cold.as_mut().and_then(|c| c.intent.take()))
    {
        journal.end(intent, outcome);
    }
}

/// Hands the call's outcome back with its result, and with an error, how its last attempt
/// (classified `last`) ended.
///
/// An answer that cannot carry the outcome (no extensions), polled by no client's `send`, has
/// nobody to hand it to: it is returned as it is, without a call (the outcome's making is
/// [`hand_back_made`]).
#[inline(always)]
fn hand_back<Res: Envelope, T, Sv, R, E>(
    mut out: Result<Res, Error<T>>,
    outcome: Outcome,
    stop: StopReason,
    sent: u32,
    cold: &mut Option<Box<Cold<Sv, R, E>>>,
    last: Option<Classification>,
) -> Result<Res, Error<T>> {
    if let Ok(res) = &mut out
        && res.extensions_mut().is_none()
        && !crate::outcome::sending()
    {
        return out;
    }
    hand_back_made(out, outcome, stop, sent, cold, last)
}

/// [`hand_back`], the outcome made and put on the answer or the error.
#[inline(never)]
fn hand_back_made<Res: Envelope, T, Sv, R, E>(
    out: Result<Res, Error<T>>,
    outcome: Outcome,
    stop: StopReason,
    sent: u32,
    cold: &mut Option<Box<Cold<Sv, R, E>>>,
    last: Option<Classification>,
) -> Result<Res, Error<T>> {
    let key = cold.as_mut().and_then(|c| c.idempotency_key.take());
    match CallOutcome::handed_back(out, outcome, stop, sent, key, budget_left_now) {
        Ok(res) => Ok(res),
        Err(mut e) => {
            if let Some(last) = last {
                e.note_last_attempt(last);
            }
            Err(e)
        }
    }
}

/// After a retryable attempt: retry after how long, or stop and why.
fn decide<M, Z, Req: Envelope, Sv, Res, E>(
    config: &Config<M, Z>,
    classification: &Classification,
    attempts: u32,
    template: Option<&Req>,
    cold: &mut Option<Box<Cold<Sv, Res, E>>>,
) -> Next {
    if attempts >= config.max_attempts {
        return Next::Stop(StopReason::AttemptsExhausted);
    }
    let Some(template) = template else {
        return Next::Stop(StopReason::NotReplayable);
    };
    // Inside a handler whose caller retries: leave retries to it, but for attempts that were
    // provably not sent, which cost the chain nothing.
    let not_sent = classification.class() == AttemptClass::Rejected
        && classification.phase() == DeliveryPhase::NotSent;
    if !not_sent && Context::current().retry_owned() {
        return Next::Stop(StopReason::UpstreamOwnsRetries);
    }
    let (wait, pushback) = match classification.pushback() {
        Some(Pushback::Stop) => return Next::Stop(StopReason::PushbackStop),
        // The server asked for more patience than this client has: it is not asked sooner.
        Some(Pushback::After(d)) if d > config.max_pushback => {
            return Next::Stop(StopReason::PushbackStop)
        }
        Some(Pushback::After(d)) => (d, true),
        // No pushback: the backoff decides.
        None if config.backoff.cap().is_zero() => (Duration::ZERO, false),
        None => (
            cold.get_or_insert_with(Cold::new)
                .delays
                .get_or_insert_with(|| config.backoff.iter())
                .next()
                .unwrap_or(Duration::ZERO),
            false,
        ),
    };
    // Deadline admission: no wait that would leave the next attempt too little time. The
    // deadline is the earlier of the call's current one and the request's own.
    if let Some(left) = deadline::left_at(template.deadline(), Instant::now) {
        let learned = config.learned.as_ref().and_then(|l| l.estimate());
        let min_attempt = learned.map_or(config.min_attempt, |l| l.max(config.min_attempt));
        if wait.saturating_add(min_attempt) > left {
            // A server's pushback is never shortened to fit: past the deadline, it stops.
            return Next::Stop(if pushback {
                StopReason::PushbackStop
            } else {
                StopReason::Deadline
            });
        }
    }
    if let Some(budget) = &config.budget
        && budget.withdraw().is_err()
    {
        return Next::Stop(StopReason::BudgetExhausted);
    }
    Next::Retry(wait, pushback)
}

/// Lowers the budget a retry carries on the wire to what is left of the call's deadline: the
/// copy of the first request still carries the budget written when the call started. The
/// `grpc-timeout` of a gRPC request, and the [`DEFAULT_HEADER`] or the header a deadline layer
/// said it wrote instead ([`WireHeader`](deadline::WireHeader)), are rewritten when present,
/// with the deadline layer's default reserve of a millisecond for transit; a value is only ever
/// lowered.
fn refresh_deadline<Req: Envelope>(req: &mut Req) {
    let grpc = req.is_grpc();
    let own = req.deadline();
    let custom = if grpc {
        None
    } else {
        req.extensions()
            .and_then(|e| e.get::<deadline::WireHeader>())
            .map(|w| w.0.clone())
    };
    let Some(headers) = req.headers_mut() else {
        return;
    };
    let name = if grpc {
        GRPC_TIMEOUT
    } else {
        custom.unwrap_or(DEFAULT_HEADER)
    };
    let Some(value) = headers.get(&name) else {
        return;
    };
    let written = if grpc {
        codec::parse_grpc_timeout_header(value)
    } else {
        codec::parse_millis_header(value)
    };
    let (Ok(written), Some(left)) = (written, deadline::left_at(own, Instant::now)) else {
        return;
    };
    let left = left.saturating_sub(Duration::from_millis(1));
    if left < written {
        let value = if grpc {
            codec::encode_grpc_timeout(left)
        } else {
            codec::encode_millis(left)
        };
        headers.insert(name, value);
    }
}

/// Tells the call's record what the resolver said, when a record layer is outside.
fn report_resolution(answer: Outcome, started: Instant) {
    if Context::current().call.is_some() {
        let query = ResolutionRecord {
            answer,
            started,
            ended: Instant::now(),
        };
        CallTally::update(|t| t.cold().resolution = Some(query));
    }
}

/// Tells the call's record why the call stopped, when a record layer is outside.
fn report_stop(reason: StopReason) {
    if Context::current().call.is_some() {
        CallTally::update(|t| t.stop = Some(reason));
    }
}

/// Tells the call record layer outside, if there is one, of a retry decided.
fn report_retry(retry: RetryRecord) {
    if Context::current().call.is_some() {
        CallTally::update(|t| t.cold().retries.push(retry));
    }
}

/// Writes how many attempts came before this one: `grpc-previous-rpc-attempts` on gRPC
/// requests, and the configured HTTP header on others.
fn write_attempts<Req: Envelope>(req: &mut Req, previous: u32, header: Option<&http::HeaderName>) {
    let grpc = req.is_grpc();
    let Some(headers) = req.headers_mut() else {
        return;
    };
    let value = HeaderValue::from(previous);
    if grpc {
        headers.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, value);
    } else if let Some(name) = header {
        headers.insert(name.clone(), value);
    }
}

impl<S, Req, M, Z> fmt::Debug for ResponseFuture<S, Req, M, Z>
where
    S: Service<Req>,
    S::Error: IntoError,
    M: MakeClassifier<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempts", &self.attempts)
            .field("semantics", &self.tally.semantics())
            .finish_non_exhaustive()
    }
}
