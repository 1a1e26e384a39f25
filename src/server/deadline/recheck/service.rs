//! The service.

use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use super::future::ResponseFuture;
use super::{can_finish, RecheckLayer};
use crate::deadline::Deadline;
use crate::evidence::RefusalReason;
use crate::server::deadline::service::exceeded_response;
use crate::server::limit::Shared;
use crate::server::ResponseBody;
use crate::{Criticality, Envelope};

/// The service made by [`RecheckLayer`]: see the layer for what it does.
///
/// # Readiness
///
/// `poll_ready` is the handler's. A refused request does not call the handler.
#[derive(Clone, Debug)]
pub struct Recheck<S> {
    inner: S,
    layer: RecheckLayer,
}

impl<S> Recheck<S> {
    /// Wraps `inner`, refusing requests with less than `needs` left of their deadline, as
    /// [`RecheckLayer::new`] does.
    pub fn new(inner: S, needs: Duration) -> Self {
        RecheckLayer::new(needs).layer(inner)
    }

    /// The layer: [`RecheckLayer::new`].
    pub fn layer(needs: Duration) -> RecheckLayer {
        RecheckLayer::new(needs)
    }

    pub(super) fn from_layer(inner: S, layer: RecheckLayer) -> Self {
        Recheck { inner, layer }
    }

    inner_accessors!();
}

impl<S, B, ResB> Service<Request<B>> for Recheck<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let deadline = Deadline::earliest(Envelope::deadline(&req), crate::deadline::current());
        if can_finish(deadline, self.layer.needs) {
            return ResponseFuture::passing(self.inner.call(req));
        }
        if let Some(limit) = &self.layer.limit {
            let criticality = req
                .extensions()
                .get::<Criticality>()
                .copied()
                .unwrap_or_default();
            Shared::refuse(&limit.shared, RefusalReason::Deadline, criticality, None);
        }
        ResponseFuture::respond(exceeded_response(&self.layer.problems, req.is_grpc()))
    }
}
