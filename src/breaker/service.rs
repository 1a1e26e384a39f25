//! The breaker layer's service.

use std::fmt;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::circuit::CircuitBreaker;
use super::future::ResponseFuture;
use super::BreakerLayer;
use crate::classify::{Classify, HttpClassifier, MakeClassifier};
use crate::sync::now as clock;
use crate::{Error, IntoError};

/// The service made by [`BreakerLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's, whatever the breaker's state: an open breaker does
/// not make it pend (a caller waiting for readiness would wait out the whole break, holding
/// its request). It refuses in `call` instead, at once, without calling the inner service.
/// A refused call leaves the inner service's readiness unused, for the next call.
#[derive(Clone)]
pub struct Breaker<S, M = HttpClassifier> {
    pub(super) inner: S,
    pub(super) breaker: CircuitBreaker,
    pub(super) classifier: M,
}

impl<S> Breaker<S> {
    /// Guards `inner` with `breaker`, classifying with [`HttpClassifier`], as
    /// [`BreakerLayer::new`].
    pub fn new(inner: S, breaker: CircuitBreaker) -> Self {
        BreakerLayer::new(breaker).layer(inner)
    }

    /// [`BreakerLayer::new`]`(breaker)`, whose services are `Breaker`s.
    pub fn layer(breaker: CircuitBreaker) -> BreakerLayer {
        BreakerLayer::new(breaker)
    }
}

impl<S, M> Breaker<S, M> {
    /// The breaker.
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    inner_accessors!();
}

impl<S, M, Req, T> Service<Req> for Breaker<S, M>
where
    S: Service<Req>,
    S::Error: IntoError<Transport = T>,
    M: MakeClassifier<Req>,
    M::Classifier: Classify<S::Response, Error<T>>,
{
    type Response = S::Response;
    type Error = Error<T>;
    type Future = ResponseFuture<S::Future, M::Classifier>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        match self.breaker.admit() {
            Ok(pass) => {
                let classifier = self.classifier.make_classifier(&req);
                let started = self.breaker.times_calls().then(clock);
                let future = self.inner.call(req);
                ResponseFuture::called(future, classifier, self.breaker.clone(), pass, started)
            }
            Err(open) => ResponseFuture::rejected(open),
        }
    }
}

impl<S: fmt::Debug, M> fmt::Debug for Breaker<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Breaker")
            .field("inner", &self.inner)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}
