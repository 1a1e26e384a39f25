//! The call record layer.

use tower_layer::Layer;

use super::RecordCall;
use crate::classify::HttpClassifier;

/// Records every logical call that passes through it. See the [module docs](crate::record).
///
/// The call's outcome is folded from the attempts that [`RecordAttemptLayer`](crate::record::RecordAttemptLayer)s
/// inside it reported; without one, the layer classifies the call's result as a single attempt.
#[derive(Clone, Debug)]
pub struct RecordCallLayer<R, M = HttpClassifier> {
    pub(super) recorder: R,
    pub(super) classifier: M,
    // A retry layer inside hands every call's outcome back: with no recorder, nothing is left
    // to do here (the client stack).
    pub(super) inner_reports: bool,
}

impl<R> RecordCallLayer<R> {
    /// Records to `recorder`, classifying with [`HttpClassifier`].
    pub fn new(recorder: R) -> Self {
        RecordCallLayer {
            recorder,
            classifier: HttpClassifier::new(),
            inner_reports: false,
        }
    }
}

impl<R, M> RecordCallLayer<R, M> {
    /// Classifies with `classifier` instead.
    pub fn with_classifier<M2>(self, classifier: M2) -> RecordCallLayer<R, M2> {
        RecordCallLayer {
            recorder: self.recorder,
            classifier,
            inner_reports: self.inner_reports,
        }
    }

    /// Counts on a retry layer inside to hand every call's outcome back (the client stack,
    /// whose retry layer is always there), so that without a recorder the layer does nothing.
    pub(crate) fn inner_reports(mut self) -> Self {
        self.inner_reports = true;
        self
    }
}

impl<S, R: Clone, M: Clone> Layer<S> for RecordCallLayer<R, M> {
    type Service = RecordCall<S, R, M>;

    fn layer(&self, inner: S) -> Self::Service {
        RecordCall {
            inner,
            layer: self.clone(),
        }
    }
}
