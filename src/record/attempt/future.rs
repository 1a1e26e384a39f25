//! The attempt record layer's future, and the state of a recorded attempt.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use http::HeaderName;
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::classify::{
    AttemptClass, Classification, Classified, Classify, ClassifyEos, DeliveryPhase,
};
use crate::context::{CallTally, Context};
use crate::error::Elapsed;
use crate::error::{lift, lift_poll};
use crate::record::trailers::{End, Settled, Watch};
use crate::record::{AttemptRecord, BusinessKey, CallId, Recorder};
use crate::time::Deadline;
use crate::{Envelope, Error, IntoError};

pub(super) struct AttemptState<R: Recorder, C> {
    pub(super) recorder: R,
    pub(super) classifier: Option<C>,
    pub(super) request_id: HeaderName,
    pub(super) call: Option<CallId>,
    pub(super) key: Option<BusinessKey>,
    pub(super) attempt: u32,
    pub(super) hedge: bool,
    pub(super) started: Instant,
    pub(super) deadline_left: Option<std::time::Duration>,
    pub(super) deadline: Option<Deadline>,
    pub(super) span: tracing::Span,
    pub(super) ctx: Context,
}

impl<R: Recorder, C> AttemptState<R, C> {
    /// Runs `f` inside the attempt's span and context, outside the call's tally.
    pub(super) fn run<O>(&self, f: impl FnOnce() -> O) -> O {
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
    /// The future of [`RecordAttempt`](super::RecordAttempt): the attempt, recorded when it
    /// ends (or its body does), or when it is dropped.
    pub struct ResponseFuture<F, R: Recorder, C, E> {
        // Boxed: a disabled recorder (`()`) keeps the future small. Declared first, so that a
        // dropped attempt is recorded before the inner future goes.
        pub(super) state: Option<Box<AttemptState<R, C>>>,
        #[pin]
        pub(super) inner: F,
        pub(super) _error: PhantomData<fn() -> E>,
    }
}

impl<F, R, C, Res, T, E0> Future for ResponseFuture<F, R, C, Error<T>>
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

impl<F, R: Recorder, C, E> fmt::Debug for ResponseFuture<F, R, C, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
