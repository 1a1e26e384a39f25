//! The retry layer's service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use http::HeaderValue;
use tower_layer::Layer;
use tower_service::Service;

use super::future::{ResponseFuture, Shared};
use super::layer::Config;
use super::replay::NotReplayable;
use super::RetryLayer;
use crate::breaker::CircuitBreaker;
use crate::classify::{Classify, HttpClassifier, MakeClassifier};
use crate::headers::{CRITICALITY, RETRY_OWNER};
use crate::record::key_of;
use crate::resolve::{NoResolver, Resolve};
use crate::spare::Spare;
use crate::{Criticality, Envelope, Error, IntoError, Semantics};

/// The service made by [`RetryLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's, and the first attempt is sent through the service it
/// made ready. A retry is sent through a clone of the inner service, and waits for that
/// clone's readiness, so a concurrency limit or a buffer below sees every attempt.
///
/// The clones for the retries are made from one copy of the inner service, made at the first
/// call and shared by the calls (and by this service's clones): a call's future holds that
/// copy's `Arc`, not a clone of the inner service, so a large transport (hyper-util's client is
/// about 300 bytes) is not copied into every call's future. [`get_mut`](Retry::get_mut) drops
/// the copy, so that the retries after it see the change.
pub struct Retry<S, M = HttpClassifier, Z = NoResolver> {
    pub(super) inner: S,
    pub(super) config: Arc<Config<M, Z>>,
    // The settings and the copy of the inner service the calls' futures share, made at the
    // first call.
    pub(super) spare: Option<Arc<Shared<S, M, Z>>>,
}

impl<S: Clone, M, Z> Clone for Retry<S, M, Z> {
    fn clone(&self) -> Self {
        Retry {
            inner: self.inner.clone(),
            spare: self.spare.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S> Retry<S> {
    /// Wraps `inner` with [`RetryLayer::new`]'s defaults (a retry budget of its own).
    pub fn new(inner: S) -> Self {
        RetryLayer::new().layer(inner)
    }

    /// [`RetryLayer::new`], whose services are `Retry`s.
    pub fn layer() -> RetryLayer {
        RetryLayer::new()
    }
}

impl<S, M, Z> Retry<S, M, Z> {
    inner_accessors!(spare);
}

impl<S, M, Z, Req, T> Service<Req> for Retry<S, M, Z>
where
    S: Service<Req> + Clone,
    S::Error: IntoError<Transport = T>,
    S::Response: Envelope,
    Req: Envelope + Clone,
    M: MakeClassifier<Req>,
    M::Classifier: Classify<S::Response, Error<T>>,
    Z: Resolve<S::Response>,
{
    type Response = S::Response;
    type Error = Error<T>;
    type Future = ResponseFuture<S, Req, M, Z>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    #[inline]
    fn call(&mut self, mut req: Req) -> Self::Future {
        if let Some(budget) = &self.config.budget {
            budget.deposit();
        }
        if self.config.mark_owner {
            let criticality = req
                .extensions()
                .and_then(|e| e.get::<Criticality>())
                .copied();
            if let Some(headers) = req.headers_mut() {
                headers.insert(RETRY_OWNER, HeaderValue::from_static("1"));
                // The caller's criticality for the next hop's limit, unless it set the header.
                if let Some(c) = criticality
                    && !headers.contains_key(CRITICALITY)
                {
                    headers.insert(CRITICALITY, HeaderValue::from_static(c.as_str()));
                }
            }
        }
        let classifier = self.config.classifier.make_classifier(&req);
        let semantics = req.semantics();
        let replayable = self.config.max_attempts > 1
            && req
                .extensions()
                .is_none_or(|e| e.get::<NotReplayable>().is_none());
        let template = replayable.then(|| req.clone());
        let (key, operation) = if self.config.resolver.enabled() {
            (key_of(&req), req.operation())
        } else {
            (None, None)
        };
        // Reads never carry a key that matters; for the others, the call's outcome names it.
        let idempotency_key = match semantics {
            Semantics::Safe => None,
            _ => req
                .headers()
                .and_then(|h| h.get(crate::headers::IDEMPOTENCY_KEY))
                .cloned(),
        };
        // A journaled call is admitted by the breaker when its intent is written.
        let journaled = match &self.config.journal {
            None => None,
            Some(journal) => journal.begin(&req),
        };
        let gate = match journaled {
            None => self.config.breaker.as_ref().map(CircuitBreaker::admit),
            Some(_) => None,
        };
        // The service that was made ready is the one called; the future keeps the shared copy,
        // from which it clones a service for each retry and makes it ready itself.
        let (inner, config) = (&self.inner, &self.config);
        let shared = self
            .spare
            .get_or_insert_with(|| {
                Arc::new(Shared {
                    service: Spare::of(inner),
                    config: config.clone(),
                })
            })
            .clone();
        ResponseFuture::new(
            req,
            classifier,
            semantics,
            template,
            key,
            operation,
            idempotency_key,
            &mut self.inner,
            shared,
            gate,
            journaled,
        )
    }
}

impl<S: fmt::Debug, M, Z> fmt::Debug for Retry<S, M, Z> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("max_attempts", &self.config.max_attempts)
            .finish_non_exhaustive()
    }
}
