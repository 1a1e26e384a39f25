//! The body idle timeout's service.

use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use super::future::ResponseFuture;
use super::{BodyIdleTimeoutLayer, IdleTimeoutBody};

/// The service made by [`BodyIdleTimeoutLayer`]: its responses' bodies are
/// [`IdleTimeoutBody`]s.
///
/// # Readiness
///
/// `poll_ready` is the inner service's.
#[derive(Clone, Debug)]
pub struct BodyIdleTimeout<S> {
    pub(super) inner: S,
    pub(super) idle: Duration,
}

impl<S> BodyIdleTimeout<S> {
    /// Wraps `inner`: its response bodies fail after `idle` without a frame, as
    /// [`BodyIdleTimeoutLayer::new`] (which says how `idle` is clamped).
    pub fn new(inner: S, idle: Duration) -> Self {
        BodyIdleTimeoutLayer::new(idle).layer(inner)
    }

    /// The layer of [`BodyIdleTimeoutLayer::new`]`(idle)`, whose services are
    /// `BodyIdleTimeout`s.
    pub fn layer(idle: Duration) -> BodyIdleTimeoutLayer {
        BodyIdleTimeoutLayer::new(idle)
    }

    inner_accessors!();
}

impl<S, Req, B> Service<Req> for BodyIdleTimeout<S>
where
    S: Service<Req, Response = http::Response<B>>,
    B: Body,
{
    type Response = http::Response<IdleTimeoutBody<B>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        ResponseFuture {
            inner: self.inner.call(req),
            idle: self.idle,
        }
    }
}
