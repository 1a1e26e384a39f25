//! The attempt timeout layer and its builder.

use std::time::Duration;

use tower_layer::Layer;

use super::AttemptTimeout;
use crate::time::MAX_DURATION;
use crate::ConfigError;

/// The shortest per-try timeout the builder accepts: a nanosecond, in effect the clock's next
/// tick. [`AttemptTimeoutLayer::new`] counts zero as this.
const MIN_PER_TRY: Duration = Duration::from_nanos(1);

/// Bounds each attempt by `min(per-try timeout, remaining budget)`. See the
/// [module docs](super).
#[derive(Clone, Copy, Debug)]
pub struct AttemptTimeoutLayer {
    per_try: Option<Duration>,
}

/// Builds an [`AttemptTimeoutLayer`], validating its per-try timeout.
///
/// ```
/// use std::time::Duration;
/// use surely::timeout::AttemptTimeoutLayer;
///
/// let layer = AttemptTimeoutLayer::builder().per_try(Duration::from_millis(500)).build()?;
/// assert_eq!(layer.per_try(), Some(Duration::from_millis(500)));
/// let err = AttemptTimeoutLayer::builder().per_try(Duration::ZERO).build().unwrap_err();
/// assert_eq!(err.setting(), "attempt timeout");
/// # Ok::<(), surely::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct AttemptTimeoutLayerBuilder {
    per_try: Option<Duration>,
}

impl AttemptTimeoutLayer {
    /// Each attempt gets at most `per_try`, and never more than the call's remaining budget.
    ///
    /// Never fails: `per_try` is clamped into the range [`builder`](Self::builder) accepts. Zero
    /// counts as a nanosecond (an attempt that does not answer at once ends at the clock's next
    /// tick); a duration past [`MAX_DURATION`] (ten years) counts as `MAX_DURATION`. The
    /// builder refuses both instead.
    pub fn new(per_try: Duration) -> Self {
        AttemptTimeoutLayer {
            per_try: Some(per_try.clamp(MIN_PER_TRY, MAX_DURATION)),
        }
    }

    /// Each attempt is bounded by the call's deadline only.
    pub fn deadline_only() -> Self {
        AttemptTimeoutLayer { per_try: None }
    }

    /// A builder, starting from [`deadline_only`](Self::deadline_only)'s settings.
    pub fn builder() -> AttemptTimeoutLayerBuilder {
        AttemptTimeoutLayerBuilder { per_try: None }
    }

    /// The per-try timeout, if the layer has one.
    pub fn per_try(&self) -> Option<Duration> {
        self.per_try
    }
}

impl AttemptTimeoutLayerBuilder {
    /// Each attempt gets at most `per_try` (default: only the call's deadline bounds it). Must
    /// be greater than zero and at most [`MAX_DURATION`] (ten years).
    pub fn per_try(mut self, per_try: Duration) -> Self {
        self.per_try = Some(per_try);
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for the setting `"attempt timeout"` if the per-try timeout is zero or
    /// past [`MAX_DURATION`].
    pub fn build(self) -> Result<AttemptTimeoutLayer, ConfigError> {
        if let Some(per_try) = self.per_try {
            ConfigError::positive_at_most_max("attempt timeout", per_try)?;
        }
        Ok(AttemptTimeoutLayer {
            per_try: self.per_try,
        })
    }
}

impl<S> Layer<S> for AttemptTimeoutLayer {
    type Service = AttemptTimeout<S>;

    fn layer(&self, inner: S) -> AttemptTimeout<S> {
        AttemptTimeout {
            inner,
            per_try: self.per_try,
        }
    }
}
