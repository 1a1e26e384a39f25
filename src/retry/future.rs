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

use super::backoff::Delays;
use super::layer::{Config, GRPC_PREVIOUS_RPC_ATTEMPTS};
use crate::classify::{
    AttemptClass, Classification, Classify, DeliveryPhase, MakeClassifier, Pushback,
};
use crate::context::Context;
use crate::deadline::Deadline;
use crate::record::{CallTally, StopReason};
use crate::{Envelope, Error, IntoError, Semantics};

pin_project! {
    /// The future of [`Retry`](super::Retry): one call, with as many attempts as it may have.
    pub struct ResponseFuture<S, Req, M>
    where
        S: Service<Req>,
        S::Error: IntoError,
        M: MakeClassifier<Req>,
    {
        #[pin]
        state: State<S::Future>,
        classifier: Option<M::Classifier>,
        semantics: Semantics,
        template: Option<Req>,
        service: S,
        config: Arc<Config<M>>,
        attempts: u32,
        delays: Option<Delays>,
        // The outcome of the attempt being retried, until the retry is sent: the call's outcome
        // if the retry cannot be.
        last: Option<Result<S::Response, Error<<S::Error as IntoError>::Transport>>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Attempt { #[pin] future: F },
        Waiting { #[pin] sleep: Sleep },
        Readying,
    }
}

impl<S, Req, M> ResponseFuture<S, Req, M>
where
    S: Service<Req>,
    S::Error: IntoError,
    M: MakeClassifier<Req>,
{
    pub(super) fn new(
        future: S::Future,
        classifier: M::Classifier,
        semantics: Semantics,
        template: Option<Req>,
        service: S,
        config: Arc<Config<M>>,
    ) -> Self {
        ResponseFuture {
            state: State::Attempt { future },
            classifier: Some(classifier),
            semantics,
            template,
            service,
            config,
            attempts: 1,
            delays: None,
            last: None,
        }
    }
}

/// What to do after a retryable attempt.
enum Next {
    /// Wait this long, then try again.
    Retry(Duration),
    /// Stop, for this reason.
    Stop(StopReason),
}

impl<S, Req, M, T> Future for ResponseFuture<S, Req, M>
where
    S: Service<Req>,
    S::Error: IntoError<Transport = T>,
    Req: Envelope + Clone,
    M: MakeClassifier<Req>,
    M::Classifier: Classify<S::Response, Error<T>>,
{
    type Output = Result<S::Response, Error<T>>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Attempt { future } => {
                    let out = ready!(future.poll(cx)).map_err(IntoError::into_error);
                    let Some(classifier) = this.classifier.take() else {
                        return Poll::Ready(out);
                    };
                    let classification = match &out {
                        Ok(res) => classifier.classify_response(res).at_head(),
                        Err(e) => classifier.classify_error(e, DeliveryPhase::Sent),
                    };
                    let config = &**this.config;
                    if let Some(budget) = &config.budget {
                        budget.record_outcome(classification.class());
                    }
                    if !classification.class().is_retryable(*this.semantics) {
                        return Poll::Ready(out);
                    }
                    let next = decide(
                        config,
                        &classification,
                        *this.attempts,
                        this.template.as_ref(),
                        this.delays,
                    );
                    match next {
                        Next::Stop(reason) => {
                            report_stop(reason);
                            return Poll::Ready(out);
                        }
                        Next::Retry(wait) if wait.is_zero() => {
                            *this.last = Some(out);
                            this.state.set(State::Readying);
                        }
                        Next::Retry(wait) => {
                            *this.last = Some(out);
                            let sleep = tokio::time::sleep_until(Instant::now() + wait);
                            this.state.set(State::Waiting { sleep });
                        }
                    }
                }
                StateProj::Waiting { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(State::Readying);
                }
                StateProj::Readying => {
                    if let Err(e) = ready!(this.service.poll_ready(cx)) {
                        return Poll::Ready(Err(e.into_error()));
                    }
                    // A retry is decided only for a replayable request (`decide`).
                    let template = this
                        .template
                        .as_ref()
                        .expect("a retried request has a template");
                    *this.last = None;
                    let mut req = template.clone();
                    let previous = *this.attempts;
                    *this.attempts += 1;
                    write_attempts(&mut req, previous, this.config.attempt_header.as_ref());
                    *this.classifier = Some(this.config.classifier.make_classifier(&req));
                    let future = this.service.call(req);
                    this.state.set(State::Attempt { future });
                }
            }
        }
    }
}

/// After a retryable attempt: retry after how long, or stop and why.
fn decide<M, Req: Envelope>(
    config: &Config<M>,
    classification: &Classification,
    attempts: u32,
    template: Option<&Req>,
    delays: &mut Option<Delays>,
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
    let wait = match classification.pushback() {
        Some(Pushback::Stop) => return Next::Stop(StopReason::PushbackStop),
        Some(Pushback::After(d)) if d <= config.max_pushback => d,
        // No pushback, or more than we obey: the backoff decides.
        _ => delays
            .get_or_insert_with(|| config.backoff.iter())
            .next()
            .unwrap_or(Duration::ZERO),
    };
    // Deadline admission: no wait that would leave the next attempt too little time. The
    // deadline is the earlier of the call's current one and the request's own.
    let current = Context::current().deadline();
    let own = template.deadline();
    if current.is_some() || own.is_some() {
        let now = Instant::now();
        let deadline = Deadline::earliest(own, current.map(|d| d.anchor(now)));
        let left = deadline.map_or(Duration::MAX, |d| d.remaining_at(now));
        if wait.saturating_add(config.min_attempt) > left {
            return Next::Stop(StopReason::Deadline);
        }
    }
    if let Some(budget) = &config.budget {
        if budget.withdraw().is_err() {
            return Next::Stop(StopReason::BudgetExhausted);
        }
    }
    Next::Retry(wait)
}

/// Tells the call's record why the call stopped, when a record layer is outside.
fn report_stop(reason: StopReason) {
    if Context::current().call.is_some() {
        CallTally::update(|t| t.stop = Some(reason));
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

impl<S, Req, M> fmt::Debug for ResponseFuture<S, Req, M>
where
    S: Service<Req>,
    S::Error: IntoError,
    M: MakeClassifier<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempts", &self.attempts)
            .field("semantics", &self.semantics)
            .finish_non_exhaustive()
    }
}
