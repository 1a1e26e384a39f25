//! The attempt record layer.

use http::HeaderName;
use tower_layer::Layer;

use super::RecordAttempt;
use crate::classify::HttpClassifier;

/// Records every attempt that passes through it. See the [module docs](crate::record).
///
/// The classifier (default [`HttpClassifier`]) is the same one the other layers use, so the
/// records say what retry decided on.
#[derive(Clone, Debug)]
pub struct RecordAttemptLayer<R, M = HttpClassifier> {
    pub(super) recorder: R,
    pub(super) classifier: M,
    // `None` for the default name: the layer is cloned with every service a retry layer clones
    // (once per call), and a custom name's clone is a call through its bytes' vtable.
    pub(super) request_id: Option<HeaderName>,
    // Whether HTTP attempts are settled when their body ends (gRPC ones always are).
    pub(super) at_body_end: bool,
}

impl<R> RecordAttemptLayer<R> {
    /// Records to `recorder`, classifying with [`HttpClassifier`].
    pub fn new(recorder: R) -> Self {
        RecordAttemptLayer {
            recorder,
            classifier: HttpClassifier::new(),
            request_id: None,
            at_body_end: false,
        }
    }
}

impl<R, M> RecordAttemptLayer<R, M> {
    /// Classifies with `classifier` instead.
    pub fn with_classifier<M2>(self, classifier: M2) -> RecordAttemptLayer<R, M2> {
        RecordAttemptLayer {
            recorder: self.recorder,
            classifier,
            request_id: self.request_id,
            at_body_end: self.at_body_end,
        }
    }

    /// Records an HTTP attempt when its response body ends, not when its head arrives: a body
    /// that breaks off mid-way is then recorded as *maybe committed* (a write's call becomes
    /// unknown, a read's failed), and the call's record comes after it. A body the caller drops
    /// unread keeps what its head said.
    ///
    /// It needs a transport that watches response bodies:
    /// [`WatchTrailersLayer`](crate::record::WatchTrailersLayer) right around it, which the
    /// [`http()`](crate::client::http) preset puts there. Elsewhere the records classify at the
    /// head. gRPC attempts are settled at the end of their stream whatever this says.
    pub fn at_body_end(mut self) -> Self {
        self.at_body_end = true;
        self
    }

    /// Reads the downstream request id from this response header (default `x-request-id`).
    pub fn request_id_header(mut self, header: HeaderName) -> Self {
        self.request_id = Some(header);
        self
    }
}

impl<S, R: Clone, M: Clone> Layer<S> for RecordAttemptLayer<R, M> {
    type Service = RecordAttempt<S, R, M>;

    fn layer(&self, inner: S) -> Self::Service {
        RecordAttempt {
            inner,
            layer: self.clone(),
        }
    }
}
