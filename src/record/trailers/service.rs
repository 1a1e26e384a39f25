//! The trailers watch layer's service.

use std::task::{Context, Poll};

use http::{Request, Response};
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use super::future::ResponseFuture;
use super::watch::WantsTrailers;
use super::{WatchTrailersLayer, WatchedBody};

/// The service made by [`WatchTrailersLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's.
#[derive(Clone, Debug)]
pub struct WatchTrailers<S> {
    pub(super) inner: S,
}

impl<S> WatchTrailers<S> {
    /// Wraps `inner`, as [`WatchTrailersLayer::new`].
    pub fn new(inner: S) -> Self {
        WatchTrailersLayer::new().layer(inner)
    }

    /// [`WatchTrailersLayer::new`], whose services are `WatchTrailers`.
    pub fn layer() -> WatchTrailersLayer {
        WatchTrailersLayer::new()
    }

    inner_accessors!();
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for WatchTrailers<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body,
{
    type Response = Response<WatchedBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let asked = req.extensions().get::<WantsTrailers>().is_some();
        ResponseFuture {
            inner: self.inner.call(req),
            asked,
        }
    }
}
