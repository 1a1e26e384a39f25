//! The hedge layer's service.

use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::future::{ResponseFuture, Shared};
use super::layer::Config;
use super::HedgeLayer;
use crate::classify::{Classify, HttpClassifier, MakeClassifier};
use crate::spare::Spare;
use crate::{Envelope, Error, IntoError, Semantics};

/// The service made by [`HedgeLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's, and the first attempt is sent through the service it
/// made ready. A hedge is sent through a clone of the inner service, and waits for that clone's
/// readiness (the other attempts keep running meanwhile), so a concurrency limit below sees
/// every hedge. A clone that fails its readiness sends no hedge; the call goes on with the
/// attempts already sent.
///
/// The clones for the hedges are made from one copy of the inner service, made at the first
/// call that may be hedged and shared by the calls (and by this service's clones): a call's
/// future holds that copy's `Arc`, not a clone of the inner service. [`get_mut`](Hedge::get_mut)
/// drops the copy, so that the hedges after it see the change.
pub struct Hedge<S, M = HttpClassifier> {
    inner: S,
    config: Arc<Config<M>>,
    spare: Option<Arc<Shared<S, M>>>,
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
        Hedge {
            inner,
            config,
            spare: None,
        }
    }

    /// Makes the copy of the inner service the hedges are cloned from (once, out of the calls'
    /// way).
    #[cold]
    #[inline(never)]
    fn share(&mut self) -> Arc<Shared<S, M>>
    where
        S: Clone,
    {
        let shared = Arc::new(Shared {
            service: Spare::of(&self.inner),
            config: self.config.clone(),
        });
        self.spare = Some(shared.clone());
        shared
    }

    inner_accessors!(spare);
}

impl<S: Clone, M> Clone for Hedge<S, M> {
    fn clone(&self) -> Self {
        Hedge {
            inner: self.inner.clone(),
            config: self.config.clone(),
            spare: self.spare.clone(),
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

    #[inline]
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
        let shared = match &self.spare {
            Some(shared) => shared.clone(),
            None => self.share(),
        };
        let future = self.inner.call(req);
        ResponseFuture::hedged(future, classifier, semantics, template, shared, lent)
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
