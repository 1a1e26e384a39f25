//! The attempt timeout's service.

use std::marker::PhantomData;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

use super::future::ResponseFuture;
use super::AttemptTimeoutLayer;
use crate::delivery::Progress;
use crate::{Envelope, Error, IntoError};

/// The service made by [`AttemptTimeoutLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's and is not timed: time spent waiting for readiness is not
/// part of an attempt. Put a deadline layer outside to bound the whole call.
#[derive(Clone, Debug)]
pub struct AttemptTimeout<S> {
    pub(super) inner: S,
    pub(super) per_try: Option<Duration>,
}

impl<S> AttemptTimeout<S> {
    /// Wraps `inner`: each attempt gets at most `per_try`, as [`AttemptTimeoutLayer::new`]
    /// (which says how `per_try` is clamped).
    pub fn new(inner: S, per_try: Duration) -> Self {
        AttemptTimeoutLayer::new(per_try).layer(inner)
    }

    /// The layer of [`AttemptTimeoutLayer::new`]`(per_try)`, whose services are
    /// `AttemptTimeout`s.
    pub fn layer(per_try: Duration) -> AttemptTimeoutLayer {
        AttemptTimeoutLayer::new(per_try)
    }

    inner_accessors!();
}

impl<S, Req> Service<Req> for AttemptTimeout<S>
where
    S: Service<Req>,
    S::Error: IntoError,
    Req: Envelope,
{
    type Response = S::Response;
    type Error = Error<<S::Error as IntoError>::Transport>;
    type Future = ResponseFuture<S::Future, Self::Error>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        let deadline = req.deadline();
        let progress = req.extensions().and_then(|e| e.get::<Progress>()).cloned();
        ResponseFuture {
            inner: self.inner.call(req),
            sleep: None,
            per_try: self.per_try,
            deadline,
            by_deadline: false,
            given: Duration::ZERO,
            progress,
            _error: PhantomData,
        }
    }
}
