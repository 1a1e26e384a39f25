//! The attempt record layer's service.

use std::marker::PhantomData;
use std::task::{Context as TaskContext, Poll};

use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::future::{AttemptState, ResponseFuture};
use super::RecordAttemptLayer;
use crate::classify::{Classify, HttpClassifier, MakeClassifier};
use crate::context::{CallDeadline, CallTally, Context};
use crate::headers::DEFAULT_REQUEST_ID_HEADER;
use crate::record::trailers::WantsTrailers;
use crate::record::{key_of, Recorder};
use crate::time::Deadline;
use crate::{Envelope, Error, IntoError};

/// The service made by [`RecordAttemptLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's.
#[derive(Clone, Debug)]
pub struct RecordAttempt<S, R, M = HttpClassifier> {
    pub(super) inner: S,
    pub(super) layer: RecordAttemptLayer<R, M>,
}

impl<S, R> RecordAttempt<S, R> {
    /// Wraps `inner`, recording every attempt to `recorder`, as [`RecordAttemptLayer::new`].
    pub fn new(inner: S, recorder: R) -> Self
    where
        R: Clone,
    {
        RecordAttemptLayer::new(recorder).layer(inner)
    }

    /// [`RecordAttemptLayer::new`]`(recorder)`, whose services are `RecordAttempt`s.
    pub fn layer(recorder: R) -> RecordAttemptLayer<R> {
        RecordAttemptLayer::new(recorder)
    }
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
    type Future = ResponseFuture<S::Future, R, M::Classifier, Error<T>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    #[inline]
    fn call(&mut self, mut req: Req) -> Self::Future {
        if !self.layer.recorder.enabled() {
            return ResponseFuture {
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
        ResponseFuture {
            inner,
            state: Some(Box::new(state)),
            _error: PhantomData,
        }
    }
}
