//! The call record layer's service.

use std::marker::PhantomData;
use std::task::{Context as TaskContext, Poll};

use http::HeaderValue;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::future::{CallState, Light, ResponseFuture};
use super::RecordCallLayer;
use crate::classify::{Classify, HttpClassifier, MakeClassifier};
use crate::context::CallTally;
use crate::context::Context;
use crate::record::{key_of, CallId, Recorder};
use crate::time::Deadline;
use crate::{Envelope, Error, IntoError};

/// The service made by [`RecordCallLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's.
#[derive(Clone, Debug)]
pub struct RecordCall<S, R, M = HttpClassifier> {
    pub(super) inner: S,
    pub(super) layer: RecordCallLayer<R, M>,
}

impl<S, R> RecordCall<S, R> {
    /// Wraps `inner`, recording every call to `recorder`, as [`RecordCallLayer::new`].
    pub fn new(inner: S, recorder: R) -> Self
    where
        R: Clone,
    {
        RecordCallLayer::new(recorder).layer(inner)
    }

    /// [`RecordCallLayer::new`]`(recorder)`, whose services are `RecordCall`s.
    pub fn layer(recorder: R) -> RecordCallLayer<R> {
        RecordCallLayer::new(recorder)
    }
}

impl<S, R, M> RecordCall<S, R, M> {
    inner_accessors!();
    crate::send::send_method!();
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
    type Future = ResponseFuture<S::Future, R, M::Classifier, Error<T>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    // Inlined, so that the inner future is made in its place in the caller's, not made and
    // then copied there (the whole stack's future, for the outermost layer).
    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        if !self.layer.recorder.enabled() {
            // Nothing to record: only the call's outcome to hand back, if no layer inside does.
            let light = (!self.layer.inner_reports).then(|| Light {
                semantics: req.semantics(),
                classifier: self.layer.classifier.make_classifier(&req),
                key: idempotency_key(&req).map(Box::new),
            });
            return ResponseFuture {
                inner: self.inner.call(req),
                state: None,
                light,
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
            operation: req.operation(),
            replayed: false,
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
        if let Some(key) = idempotency_key(&req) {
            state.tally.cold().idempotency_key = Some(key);
        }
        let inner = state.run(|| self.inner.call(req));
        ResponseFuture {
            inner,
            state: Some(Box::new(state)),
            light: None,
            _error: PhantomData,
        }
    }
}

/// The `Idempotency-Key` a request carries.
pub(super) fn idempotency_key<Req: Envelope>(req: &Req) -> Option<HeaderValue> {
    req.headers()?.get(crate::headers::IDEMPOTENCY_KEY).cloned()
}
