//! The breaker layer.

use std::fmt;

use tower_layer::Layer;

use super::circuit::CircuitBreaker;
use super::Breaker;
use crate::classify::HttpClassifier;

/// Guards the services it wraps with one [`CircuitBreaker`]: every service the layer makes,
/// and all their clones, share it. See the [module docs](super).
#[derive(Clone)]
pub struct BreakerLayer<M = HttpClassifier> {
    breaker: CircuitBreaker,
    classifier: M,
}

impl BreakerLayer {
    /// A layer over `breaker`, classifying with [`HttpClassifier`].
    pub fn new(breaker: CircuitBreaker) -> Self {
        BreakerLayer {
            breaker,
            classifier: HttpClassifier::new(),
        }
    }
}

impl<M> BreakerLayer<M> {
    /// Classifies with `classifier` instead: the same classifier as the retry layer's, so that
    /// both agree on what a failure is.
    pub fn classifier<M2>(self, classifier: M2) -> BreakerLayer<M2> {
        BreakerLayer {
            breaker: self.breaker,
            classifier,
        }
    }

    /// The breaker.
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }
}

impl<S, M: Clone> Layer<S> for BreakerLayer<M> {
    type Service = Breaker<S, M>;

    fn layer(&self, inner: S) -> Breaker<S, M> {
        Breaker {
            inner,
            breaker: self.breaker.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<M> fmt::Debug for BreakerLayer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerLayer")
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}
