//! The method semantics layer's service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use tower_layer::Layer;
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::Table;
use super::MethodSemanticsLayer;
use crate::Semantics;

/// The service made by [`MethodSemanticsLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's.
#[derive(Clone)]
pub struct MethodSemantics<S> {
    pub(super) inner: S,
    pub(super) table: Arc<Table>,
}

impl<S> MethodSemantics<S> {
    /// Wraps `inner` with [`MethodSemanticsLayer::new`]: no entries, so every request passes
    /// unchanged; build the layer for entries.
    pub fn new(inner: S) -> Self {
        MethodSemanticsLayer::new().layer(inner)
    }

    /// [`MethodSemanticsLayer::new`], whose services are `MethodSemantics`.
    pub fn layer() -> MethodSemanticsLayer {
        MethodSemanticsLayer::new()
    }

    inner_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for MethodSemantics<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodSemantics")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<Request<B>> for MethodSemantics<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if req.extensions().get::<Semantics>().is_none()
            && let Some(s) = self.table.lookup(req.uri().path())
        {
            req.extensions_mut().insert(s);
        }
        ResponseFuture {
            inner: self.inner.call(req),
        }
    }
}
