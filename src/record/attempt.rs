use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use http::HeaderName;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::trailers::{End, Settled, WantsTrailers, Watch};
use super::{key_of, AttemptRecord, BusinessKey, CallId, Recorder};
use crate::classify::{
    AttemptClass, Classification, Classified, Classify, ClassifyEos, DeliveryPhase, HttpClassifier,
    MakeClassifier,
};
use crate::context::CallTally;
use crate::context::{CallDeadline, Context};
use crate::error::Elapsed;
use crate::error::{lift, lift_poll};
use crate::headers::DEFAULT_REQUEST_ID_HEADER;
use crate::time::Deadline;
use crate::{Envelope, Error, IntoError};

/// Records every attempt that passes through it. See the [module docs](super).
///
/// The classifier (default [`HttpClassifier`]) is the same one the other layers use, so the
/// records say what retry decided on.
#[derive(Clone, Debug)]
pub struct RecordAttemptLayer<R, M = HttpClassifier> {
    recorder: R,
    classifier: M,
    // `None` for the default name: the layer is cloned with every service a retry layer clones
    // (once per call), and a custom name's clone is a call through its bytes' vtable.
    request_id: Option<HeaderName>,
    // Whether HTTP attempts are settled when their body ends (gRPC ones always are).
    at_body_end: bool,
}

impl<R> RecordAttemptLayer<R> {
    /// Records to `recorder`, classifying with [`HttpClassifier`].
    pub fn new(recorder: R) -> Self {
        RecordAttemptLayer {
            recorder,
            classifier: HttpClassifier::new(),
            request_id: None,
            at_body_end: false,
        }
    }
}

impl<R, M> RecordAttemptLayer<R, M> {
    /// Classifies with `classifier` instead.
    pub fn with_classifier<M2>(self, classifier: M2) -> RecordAttemptLayer<R, M2> {
        RecordAttemptLayer {
            recorder: self.recorder,
            classifier,
            request_id: self.request_id,
            at_body_end: self.at_body_end,
        }
    }

    /// Records an HTTP attempt when its response body ends, not when its head arrives: a body
    /// that breaks off mid-way is then recorded as *maybe committed* (a write's call becomes
    /// unknown, a read's failed), and the call's record comes after it. A body the caller drops
    /// unread keeps what its head said.
    ///
    /// It needs a transport that watches response bodies:
    /// [`WatchTrailersLayer`](super::WatchTrailersLayer) right around it, which the
    /// [`http()`](crate::client::http) preset puts there. Elsewhere the records classify at the
    /// head. gRPC attempts are settled at the end of their stream whatever this says.
    pub fn at_body_end(mut self) -> Self {
        self.at_body_end = true;
        self
    }

    /// Reads the downstream request id from this response header (default `x-request-id`).
    pub fn request_id_header(mut self, header: HeaderName) -> Self {
        self.request_id = Some(header);
        self
    }
}

impl<S, R: Clone, M: Clone> Layer<S> for RecordAttemptLayer<R, M> {
    type Service = RecordAttempt<S, R, M>;

    fn layer(&self, inner: S) -> Self::Service {
        RecordAttempt {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service made by [`RecordAttemptLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's.
#[derive(Clone, Debug)]
pub struct RecordAttempt<S, R, M = HttpClassifier> {
    inner: S,
    layer: RecordAttemptLayer<R, M>,
}

impl<S, R, M> RecordAttempt<S, R, M> {
    inner_accessors!();
}

impl<S, R, M, Req, T> Service<Req> for RecordAttempt<S, R, M>
where
    S: Service<Req>,
    S::Error: IntoError<Transport = T>,
    S::Response: Envelope,
    Req: Envelope,
    R: Recorder + Clone + Send + 'static,
    M: MakeClassifier<Req>,
    M::Classifier: Classify<S::Response, Error<T>> + Send + 'static,
    <M::Classifier as Classify<S::Response, Error<T>>>::ClassifyEos: Send + 'static,
{
    type Response = S::Response;
    type Error = Error<T>;
    type Future = AttemptFuture<S::Future, R, M::Classifier, Error<T>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    #[inline]
    fn call(&mut self, mut req: Req) -> Self::Future {
        if !self.layer.recorder.enabled() {
            return AttemptFuture {
                inner: self.inner.call(req),
                state: None,
                _error: PhantomData,
            };
        }
        let ctx = Context::current();
        let attempt = CallTally::update(|t| {
            t.started += 1;
            t.started
        })
        .unwrap_or(1);
        let hedge = crate::context::take_hedge_mark();
        let started = Instant::now();
        let deadline =
            Deadline::earliest(req.deadline(), ctx.deadline().map(|d| d.anchor(started)));
        let deadline_left = deadline.map(|d| d.remaining_at(started));
        let span = self.layer.recorder.attempt_span(ctx.call, attempt);
        // Inside the attempt, the deadline still holds (anchored where this record measured
        // it), but a nested client (a token fetch in the transport, an in-process server) is not
        // part of this call.
        let mut inner_ctx = ctx;
        inner_ctx.call = None;
        inner_ctx.set_deadline(deadline.map(CallDeadline::At));
        let state = AttemptState {
            recorder: self.layer.recorder.clone(),
            classifier: Some(self.layer.classifier.make_classifier(&req)),
            request_id: self
                .layer
                .request_id
                .clone()
                .unwrap_or(DEFAULT_REQUEST_ID_HEADER),
            call: ctx.call,
            key: key_of(&req),
            attempt,
            hedge,
            started,
            deadline_left,
            deadline,
            span: span.clone(),
            ctx: inner_ctx,
        };
        if self.layer.at_body_end || req.is_grpc() {
            // A gRPC status may be in the trailers, and an HTTP body may break off: a transport
            // that can watch the body to its end (`GrpcTransport`, `WatchTrailersLayer`) is
            // asked to.
            if let Some(extensions) = req.extensions_mut() {
                extensions.insert(WantsTrailers);
            }
        }
        let inner = state.run(|| self.inner.call(req));
        AttemptFuture {
            inner,
            state: Some(Box::new(state)),
            _error: PhantomData,
        }
    }
}

struct AttemptState<R: Recorder, C> {
    recorder: R,
    classifier: Option<C>,
    request_id: HeaderName,
    call: Option<CallId>,
    key: Option<BusinessKey>,
    attempt: u32,
    hedge: bool,
    started: Instant,
    deadline_left: Option<std::time::Duration>,
    deadline: Option<Deadline>,
    span: tracing::Span,
    ctx: Context,
}

impl<R: Recorder, C> AttemptState<R, C> {
    /// Runs `f` inside the attempt's span and context, outside the call's tally.
    fn run<O>(&self, f: impl FnOnce() -> O) -> O {
        let (span, ctx) = (&self.span, self.ctx);
        CallTally::isolate(|| ctx.scope(|| span.in_scope(f)))
    }

    fn finish(&mut self, classification: Classification, record: impl FnOnce(&mut AttemptRecord)) {
        let mut rec = AttemptRecord {
            call: self.call,
            key: self.key.take(),
            attempt: self.attempt,
            started: self.started,
            ended: Instant::now(),
            deadline_left: self.deadline_left,
            classification,
            timeout: None,
            cancelled: false,
            hedge: self.hedge,
            request_id: None,
        };
        record(&mut rec);
        CallTally::update(|t| t.observe(rec.attempt, classification));
        self.span.in_scope(|| self.recorder.record_attempt(&rec));
    }
}

/// An attempt dropped before it ended is recorded as it goes: the call's deadline ended it (a
/// deadline layer outside let it go), or the caller went away. The request may have been sent.
impl<R: Recorder, C> Drop for AttemptState<R, C> {
    fn drop(&mut self) {
        // The classifier is taken when the attempt ends and is recorded.
        if self.classifier.take().is_none() {
            return;
        }
        let timeout = self
            .deadline
            .filter(|d| d.is_expired())
            .map(|_| Elapsed::new(DeliveryPhase::Sent, true));
        self.finish(Classification::failure_at(DeliveryPhase::Sent), |r| {
            r.timeout = timeout;
            r.cancelled = timeout.is_none();
        });
    }
}

pin_project! {
    /// The future of [`RecordAttempt`].
    pub struct AttemptFuture<F, R: Recorder, C, E> {
        // Boxed: a disabled recorder (`()`) keeps the future small. Declared first, so that a
        // dropped attempt is recorded before the inner future goes.
        state: Option<Box<AttemptState<R, C>>>,
        #[pin]
        inner: F,
        _error: PhantomData<fn() -> E>,
    }
}

impl<F, R, C, Res, T, E0> Future for AttemptFuture<F, R, C, Error<T>>
where
    F: Future<Output = Result<Res, E0>>,
    E0: IntoError<Transport = T>,
    Res: Envelope,
    R: Recorder + Send + 'static,
    C: Classify<Res, Error<T>> + Send + 'static,
    C::ClassifyEos: Send + 'static,
{
    type Output = Result<Res, Error<T>>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(state) = this.state.as_mut() else {
            return lift_poll(this.inner.poll(cx));
        };
        let inner = this.inner;
        let out = match state.run(|| inner.poll(cx)) {
            Poll::Ready(out) => lift(out),
            Poll::Pending => return Poll::Pending,
        };
        let mut state = this.state.take().expect("polled after completion");
        if let Some(classifier) = state.classifier.take() {
            match &out {
                Ok(res) => {
                    let request_id = res
                        .headers()
                        .and_then(|h| h.get(&state.request_id))
                        .cloned();
                    let classified = classifier.classify_response(res);
                    // A response whose body is watched (the transport was asked to) is
                    // recorded when the body ends; the call layer outside waits for it.
                    if let Some(watch) = res.extensions().and_then(|e| e.get::<Watch>()).cloned() {
                        let attempt = state.attempt;
                        let head = match &classified {
                            Classified::Ready(head) => Some(*head),
                            Classified::RequiresEos(_) => None,
                        };
                        CallTally::update(|t| {
                            t.deferred = Some(attempt);
                            t.deferred_head = head;
                        });
                        watch.defer_attempt(Box::new(move |end| {
                            let (classification, cancelled) = match (classified, end) {
                                // gRPC: the status is in the trailers.
                                (Classified::RequiresEos(eos), End::Trailers(trailers)) => {
                                    (eos.classify_eos(trailers), false)
                                }
                                (Classified::RequiresEos(eos), End::Broken) => {
                                    (eos.classify_body_error(), false)
                                }
                                (Classified::RequiresEos(_), End::Dropped) => {
                                    (Classification::success(), true)
                                }
                                // HTTP: the head said it all, unless the body broke off.
                                (Classified::Ready(head), End::Broken)
                                    if head.class() == AttemptClass::Success =>
                                {
                                    (
                                        Classification::failure_at(DeliveryPhase::ResponseStarted),
                                        false,
                                    )
                                }
                                (Classified::Ready(head), _) => (head, false),
                            };
                            // Wherever the body ends, the attempt is not part of a call
                            // being polled there: its call hears of it through the watch.
                            CallTally::isolate(|| {
                                state.finish(classification, |r| {
                                    r.request_id = request_id;
                                    r.cancelled = cancelled;
                                })
                            });
                            Settled {
                                attempt,
                                classification,
                                cancelled,
                            }
                        }));
                        return Poll::Ready(out);
                    }
                    state.finish(classified.at_head(), |r| r.request_id = request_id);
                }
                Err(e) => {
                    let classification = classifier.classify_error(e, DeliveryPhase::Sent);
                    let timeout = e.elapsed().copied();
                    state.finish(classification, |r| r.timeout = timeout);
                }
            }
        }
        Poll::Ready(out)
    }
}

impl<F, R: Recorder, C, E> fmt::Debug for AttemptFuture<F, R, C, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptFuture").finish_non_exhaustive()
    }
}
