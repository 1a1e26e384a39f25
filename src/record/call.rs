use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::tally::CallTally;
use super::trailers::{Settled, Watch};
use super::{key_of, BusinessKey, CallId, CallRecord, Recorder, StopReason};
use crate::classify::{
    Classification, Classify, DeliveryPhase, HttpClassifier, MakeClassifier, Outcome,
};
use crate::context::Context;
use crate::deadline::Deadline;
use crate::{Envelope, Error, IntoError, Semantics};

/// Records every logical call that passes through it. See the [module docs](super).
///
/// The call's outcome is folded from the attempts that [`RecordAttemptLayer`](super::RecordAttemptLayer)s
/// inside it reported; without one, the layer classifies the call's result as a single attempt.
#[derive(Clone, Debug)]
pub struct RecordCallLayer<R, M = HttpClassifier> {
    recorder: R,
    classifier: M,
}

impl<R> RecordCallLayer<R> {
    /// Records to `recorder`, classifying with [`HttpClassifier`].
    pub fn new(recorder: R) -> Self {
        RecordCallLayer {
            recorder,
            classifier: HttpClassifier::new(),
        }
    }
}

impl<R, M> RecordCallLayer<R, M> {
    /// Classifies with `classifier` instead.
    pub fn with_classifier<M2>(self, classifier: M2) -> RecordCallLayer<R, M2> {
        RecordCallLayer {
            recorder: self.recorder,
            classifier,
        }
    }
}

impl<S, R: Clone, M: Clone> Layer<S> for RecordCallLayer<R, M> {
    type Service = RecordCall<S, R, M>;

    fn layer(&self, inner: S) -> Self::Service {
        RecordCall {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service made by [`RecordCallLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's.
#[derive(Clone, Debug)]
pub struct RecordCall<S, R, M = HttpClassifier> {
    inner: S,
    layer: RecordCallLayer<R, M>,
}

impl<S, R, M> RecordCall<S, R, M> {
    inner_accessors!();
}

impl<S, R, M, Req, T> Service<Req> for RecordCall<S, R, M>
where
    S: Service<Req>,
    S::Error: IntoError<Transport = T>,
    S::Response: Envelope,
    Req: Envelope,
    R: Recorder + Clone + Send + 'static,
    M: MakeClassifier<Req>,
    M::Classifier: Classify<S::Response, Error<T>> + Send + 'static,
{
    type Response = S::Response;
    type Error = Error<T>;
    type Future = CallFuture<S::Future, R, M::Classifier, Error<T>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        if !self.layer.recorder.enabled() {
            return CallFuture {
                inner: self.inner.call(req),
                state: None,
                _error: PhantomData,
            };
        }
        let mut ctx = Context::current();
        let call = CallId::next();
        ctx.call = Some(call);
        let started = Instant::now();
        let semantics = req.semantics();
        let key = key_of(&req);
        let span = self.layer.recorder.call_span(call, key.as_ref(), semantics);
        let mut state = CallState {
            recorder: self.layer.recorder.clone(),
            classifier: Some(self.layer.classifier.make_classifier(&req)),
            call,
            key,
            semantics,
            started,
            deadline_left: Deadline::earliest(
                req.deadline(),
                ctx.deadline().map(|d| d.anchor(started)),
            )
            .map(|d| d.remaining_at(started)),
            span,
            ctx,
            tally: CallTally::new(semantics),
        };
        let inner = state.run(|| self.inner.call(req));
        CallFuture {
            inner,
            state: Some(Box::new(state)),
            _error: PhantomData,
        }
    }
}

struct CallState<R, C> {
    recorder: R,
    classifier: Option<C>,
    call: CallId,
    key: Option<BusinessKey>,
    semantics: Semantics,
    started: Instant,
    deadline_left: Option<std::time::Duration>,
    span: tracing::Span,
    ctx: Context,
    tally: CallTally,
}

impl<R: Recorder, C> CallState<R, C> {
    /// Runs `f` inside the call's span, context and tally.
    fn run<O>(&mut self, f: impl FnOnce() -> O) -> O {
        let (span, ctx) = (&self.span, self.ctx);
        self.tally.scope(|| span.in_scope(|| ctx.scope(f)))
    }

    fn finish(
        &mut self,
        attempts: u32,
        outcome: Outcome,
        last: Option<Classification>,
        stop: StopReason,
    ) {
        // A deadline layer inside the call layer reports the deadline it set.
        let deadline_left = self.deadline_left.or_else(|| {
            self.tally
                .deadline
                .map(|d| d.anchor(self.started).remaining_at(self.started))
        });
        // A resolver's answer settles an unknown outcome.
        let resolution = self.tally.resolution.take();
        let outcome = match resolution {
            Some(q) if q.answer != Outcome::Unknown => q.answer,
            _ => outcome,
        };
        let rec = CallRecord {
            call: self.call,
            // A key layer inside may have given the call its key, and made it keyed.
            key: self.key.take().or_else(|| self.tally.key.take()),
            semantics: self.tally.outcome.semantics(),
            started: self.started,
            ended: Instant::now(),
            deadline_left,
            attempts,
            outcome,
            last,
            stop,
            resolution,
            retries: std::mem::take(&mut self.tally.retries),
        };
        self.span.in_scope(|| self.recorder.record_call(&rec));
    }

    /// Finishes from the attempts the tally saw, or, if none reported, from `fallback`.
    fn finish_with(
        &mut self,
        deadline_error: Option<bool>,
        fallback: impl FnOnce(&mut Self) -> Option<Classification>,
    ) {
        let tally = self.tally.clone();
        let (attempts, outcome, last) = match tally.outcome.outcome() {
            Some(outcome) => (tally.ended.max(tally.started), outcome, tally.last),
            None => match fallback(self) {
                Some(c) => {
                    let mut single =
                        crate::classify::OutcomeTally::new(self.tally.outcome.semantics());
                    single.observe(c.class());
                    (1, single.outcome().unwrap_or(Outcome::Failed), Some(c))
                }
                // Refused before any attempt: nothing was sent.
                None => (0, Outcome::Failed, None),
            },
        };
        let stop = match (tally.stop, deadline_error, last) {
            (Some(stop), _, _) => stop,
            (None, Some(_), _) => StopReason::Deadline,
            (None, None, Some(c)) => StopReason::after(c.class(), self.tally.outcome.semantics()),
            (None, None, None) => StopReason::Deadline,
        };
        self.finish(attempts, outcome, last, stop);
    }
}

pin_project! {
    /// The future of [`RecordCall`].
    pub struct CallFuture<F, R: Recorder, C, E> {
        #[pin]
        inner: F,
        // Boxed: a disabled recorder (`()`) keeps the future small.
        state: Option<Box<CallState<R, C>>>,
        _error: PhantomData<fn() -> E>,
    }

    impl<F, R: Recorder, C, E> PinnedDrop for CallFuture<F, R, C, E> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(state) = this.project().state {
                let tally = state.tally.clone();
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

impl<F, R, C, Res, T, E0> Future for CallFuture<F, R, C, Error<T>>
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
            return this.inner.poll(cx).map_err(IntoError::into_error);
        };
        let inner = this.inner;
        let out = match state.run(|| inner.poll(cx)) {
            Poll::Ready(out) => out.map_err(IntoError::into_error),
            Poll::Pending => return Poll::Pending,
        };
        if let (Some(_), Ok(res)) = (state.tally.deferred, &out) {
            if let Some(watch) = res.extensions().and_then(|e| e.get::<Watch>()) {
                // The last attempt is recorded when its body ends: so is the call, after it.
                let mut state = this.state.take().expect("checked above");
                watch.then_call(Box::new(move |settled: Settled| {
                    state.tally.observe(settled.attempt, settled.classification);
                    if settled.cancelled {
                        state.tally.stop.get_or_insert(StopReason::Cancelled);
                    }
                    state.finish_with(None, |_| None);
                }));
                return Poll::Ready(out);
            }
        }
        let deadline_error = match &out {
            Err(e) => e
                .deadline_exceeded()
                .map(|d| d.is_refused())
                .or_else(|| e.elapsed().filter(|t| t.is_deadline()).map(|_| false)),
            Ok(_) => None,
        };
        state.finish_with(deadline_error, |state| {
            let classifier = state.classifier.take()?;
            match &out {
                Ok(res) => Some(classifier.classify_response(res).at_head()),
                Err(e) if e.deadline_exceeded().is_some_and(|d| d.is_refused()) => None,
                Err(e) => Some(classifier.classify_error(e, DeliveryPhase::Sent)),
            }
        });
        *this.state = None;
        Poll::Ready(out)
    }
}

impl<F, R: Recorder, C, E> fmt::Debug for CallFuture<F, R, C, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallFuture").finish_non_exhaustive()
    }
}
