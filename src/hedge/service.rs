//! The hedge layer's service.

use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::Config;
use super::HedgeLayer;
use crate::classify::{Classify, HttpClassifier, MakeClassifier};
use crate::{Envelope, Error, IntoError, Semantics};

/// The service made by [`HedgeLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's, for the first attempt. The inner service is cloned for
/// each call that may be hedged; a hedge waits for the clone's readiness (the other attempts
/// keep running meanwhile), so a concurrency limit below sees every hedge. A clone that fails
/// its readiness sends no hedge; the call goes on with the attempts already sent.
pub struct Hedge<S, M = HttpClassifier> {
    inner: S,
    config: Arc<Config<M>>,
}

impl<S> Hedge<S> {
    /// Wraps `inner` with [`HedgeLayer::new`]'s defaults (a retry budget of its own, unless a
    /// retry layer outside lends the call its own).
    pub fn new(inner: S) -> Self {
        HedgeLayer::new().layer(inner)
    }

    /// [`HedgeLayer::new`], whose services are `Hedge`s.
    pub fn layer() -> HedgeLayer {
        HedgeLayer::new()
    }
}

impl<S, M> Hedge<S, M> {
    pub(super) fn from_config(inner: S, config: Arc<Config<M>>) -> Self {
        Hedge { inner, config }
    }

    inner_accessors!();
}

impl<S: Clone, M> Clone for Hedge<S, M> {
    fn clone(&self) -> Self {
        Hedge {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S, M, Req, T> Service<Req> for Hedge<S, M>
where
    S: Service<Req> + Clone,
    S::Error: IntoError<Transport = T>,
    S::Response: Envelope,
    Req: Envelope + Clone,
    M: MakeClassifier<Req>,
    M::Classifier: Classify<S::Response, Error<T>>,
{
    type Response = S::Response;
    type Error = Error<T>;
    type Future = ResponseFuture<S, Req, M>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let config = &*self.config;
        let semantics = req.semantics();
        let hedgeable = config.max_attempts > 1
            && match semantics {
                Semantics::Safe => true,
                Semantics::Idempotent => config.hedge_idempotent,
                Semantics::Keyed | Semantics::NonIdempotent => false,
            };
        if !hedgeable {
            return ResponseFuture::passthrough(self.inner.call(req));
        }
        let classifier = config.classifier.make_classifier(&req);
        let lent = config.lent();
        let template = req.clone();
        let future = self.inner.call(req);
        ResponseFuture::hedged(
            future,
            classifier,
            semantics,
            template,
            self.inner.clone(),
            self.config.clone(),
            lent,
        )
    }
}

impl<S: std::fmt::Debug, M> std::fmt::Debug for Hedge<S, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hedge")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}
