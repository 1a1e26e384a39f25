use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tower_layer::Layer;

use super::latency::Learned;
use super::Hedge;
use crate::budget::{RatioBudget, RetryBudget};
use crate::classify::HttpClassifier;
use crate::ConfigError;

/// The default attempt limit, the first attempt included: one hedge.
pub(crate) const DEFAULT_MAX_ATTEMPTS: u32 = 2;

/// The default percentile of recent successful latencies after which a hedge is sent.
pub(crate) const DEFAULT_PERCENTILE: f64 = 95.0;

/// The default delay while too few latencies were seen to learn one.
pub(crate) const DEFAULT_FALLBACK_DELAY: Duration = Duration::from_millis(100);

/// The default number of successful attempts seen before the learned delay replaces the
/// fallback.
pub(crate) const DEFAULT_MIN_SAMPLES: u32 = 100;

/// The default number of recent successful attempts the learned delay is computed from.
pub(crate) const DEFAULT_WINDOW: u32 = 1000;

/// The largest window allowed (its latencies are kept in memory, 8 bytes each).
pub(crate) const MAX_WINDOW: u32 = 1 << 20;

/// The default least time a hedge needs: a hedge that would leave less of the call's budget is
/// not sent.
pub(crate) const DEFAULT_MIN_ATTEMPT: Duration = Duration::from_millis(10);

/// How long to wait for an attempt before sending the next one.
///
/// ```
/// use std::time::Duration;
/// use surely::hedge::HedgeDelay;
///
/// // Always 20 ms.
/// let fixed = HedgeDelay::fixed(Duration::from_millis(20));
/// // The 99th percentile of the last 500 successful attempts, 50 ms until 50 were seen.
/// let learned = HedgeDelay::percentile(99.0)
///     .fallback(Duration::from_millis(50))
///     .min_samples(50)
///     .window(500);
/// # let _ = (fixed, learned);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HedgeDelay {
    repr: DelayRepr,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum DelayRepr {
    Fixed(Duration),
    Percentile {
        percentile: f64,
        fallback: Duration,
        min_samples: u32,
        window: u32,
    },
}

impl HedgeDelay {
    /// Always this delay. At most [`MAX_DURATION`](crate::MAX_DURATION) (ten years):
    /// [`HedgeLayerBuilder::build`] refuses more.
    pub fn fixed(delay: Duration) -> Self {
        HedgeDelay {
            repr: DelayRepr::Fixed(delay),
        }
    }

    /// This percentile (in (0, 100]) of the latencies of recent successful attempts, learned
    /// as the service runs, with the defaults: 100 ms until 100 attempts succeeded, then the
    /// percentile of the last 1000.
    pub fn percentile(percentile: f64) -> Self {
        HedgeDelay {
            repr: DelayRepr::Percentile {
                percentile,
                fallback: DEFAULT_FALLBACK_DELAY,
                min_samples: DEFAULT_MIN_SAMPLES,
                window: DEFAULT_WINDOW,
            },
        }
    }

    /// For a learned delay: the delay until `min_samples` were seen (default 100 ms; at most
    /// [`MAX_DURATION`](crate::MAX_DURATION)). No effect on a fixed delay.
    pub fn fallback(mut self, delay: Duration) -> Self {
        if let DelayRepr::Percentile { fallback, .. } = &mut self.repr {
            *fallback = delay;
        }
        self
    }

    /// For a learned delay: how many successful attempts to see before trusting the
    /// percentile (default 100; at least 1, at most the window). No effect on a fixed delay.
    pub fn min_samples(mut self, n: u32) -> Self {
        if let DelayRepr::Percentile { min_samples, .. } = &mut self.repr {
            *min_samples = n;
        }
        self
    }

    /// For a learned delay: how many recent successful attempts the percentile is computed
    /// from (default 1000; at least 1, at most 2^20 = 1,048,576, as its latencies are kept in
    /// memory, 8 bytes each; outside that, [`HedgeLayerBuilder::build`] returns a
    /// [`ConfigError`]). The delay is recomputed every quarter of a window. No effect on a fixed
    /// delay.
    pub fn window(mut self, n: u32) -> Self {
        if let DelayRepr::Percentile { window, .. } = &mut self.repr {
            *window = n;
        }
        self
    }
}

impl Default for HedgeDelay {
    /// The 95th percentile, with the defaults of [`percentile`](Self::percentile).
    fn default() -> Self {
        Self::percentile(DEFAULT_PERCENTILE)
    }
}

/// The delay as the services use it. One per layer, in its shared configuration: its size does
/// not matter, an indirection on every read would.
#[allow(clippy::large_enum_variant)]
pub(super) enum Delay {
    Fixed(Duration),
    Learned(Learned),
}

impl Delay {
    /// The delay before the next hedge.
    #[inline]
    pub(super) fn current(&self) -> Duration {
        match self {
            Delay::Fixed(d) => *d,
            Delay::Learned(l) => l.delay(),
        }
    }

    /// The typical latency of a successful attempt, when known.
    #[inline]
    pub(super) fn typical(&self) -> Option<Duration> {
        match self {
            Delay::Fixed(_) => None,
            Delay::Learned(l) => l.typical(),
        }
    }

    /// Records a successful attempt's latency, if the delay is learned.
    #[inline]
    pub(super) fn learns(&self) -> Option<&Learned> {
        match self {
            Delay::Fixed(_) => None,
            Delay::Learned(l) => Some(l),
        }
    }
}

/// Sends a hedge (a copy of a safe request) when an attempt has not answered in time, and
/// keeps the first good answer. See the [module docs](super).
///
/// Clones of the layer, and every service it makes, share one configuration, one budget and
/// one learned delay.
#[derive(Clone)]
pub struct HedgeLayer<M = HttpClassifier> {
    config: Arc<Config<M>>,
}

pub(super) struct Config<M> {
    pub(super) classifier: M,
    pub(super) max_attempts: u32,
    pub(super) delay: Delay,
    pub(super) hedge_idempotent: bool,
    pub(super) budget: Option<Arc<dyn RetryBudget>>,
    /// Whether this layer deposits for its calls and records every attempt's outcome (its own
    /// budget), or only withdraws (a budget a retry layer outside keeps).
    pub(super) owns_budget: bool,
    /// Whether the layer was given no budget, so that a retry layer outside may lend it its
    /// own for a call.
    pub(super) lendable: bool,
    /// The budget last lent, by its id: most hedge layers have one retry layer outside, and
    /// find its budget here without the registry's lock.
    pub(super) lent: OnceLock<(u64, Arc<dyn RetryBudget>)>,
    pub(super) min_attempt: Duration,
}

impl<M> Config<M> {
    /// The budget a retry layer around this call lends it (taken from the call context), for
    /// a layer that was given no budget of its own.
    pub(super) fn lent(&self) -> Option<Arc<dyn RetryBudget>> {
        if !self.lendable {
            return None;
        }
        let id = crate::context::take_lender();
        if id == 0 {
            return None;
        }
        if let Some((cached, budget)) = self.lent.get()
            && *cached == id
        {
            return Some(budget.clone());
        }
        let budget = crate::budget::lend::lender(id)?;
        let _ = self.lent.set((id, budget.clone()));
        Some(budget)
    }
}

/// Builds a [`HedgeLayer`], validating its settings.
#[derive(Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct HedgeLayerBuilder<M = HttpClassifier> {
    classifier: M,
    max_attempts: u32,
    delay: HedgeDelay,
    hedge_idempotent: bool,
    budget: BudgetChoice,
    min_attempt: Duration,
}

#[derive(Clone)]
enum BudgetChoice {
    Default,
    Shared(Arc<dyn RetryBudget>),
    Own(Arc<dyn RetryBudget>),
    None,
}

impl HedgeLayer {
    /// A layer with the defaults (see [`builder`](Self::builder)).
    pub fn new() -> Self {
        // Assembled without checking: a test builds the same defaults through `build`.
        Self::builder().assemble()
    }

    /// A builder with the defaults: [`HttpClassifier`]; 2 attempts in total (one hedge); the
    /// delay learned as the 95th percentile of the last 1000 successful attempts (100 ms until
    /// 100 were seen); `Safe` requests only; the budget of a [`RetryLayer`] outside, which lends
    /// it to each call, else a [`RatioBudget`] of its own (hedges at most 10% of hedgeable
    /// calls, plus 10 a second); no hedge that would leave less than 10 ms of the call's
    /// deadline.
    ///
    /// [`RetryLayer`]: crate::retry::RetryLayer
    pub fn builder() -> HedgeLayerBuilder {
        HedgeLayerBuilder {
            classifier: HttpClassifier::new(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            delay: HedgeDelay::default(),
            hedge_idempotent: false,
            budget: BudgetChoice::Default,
            min_attempt: DEFAULT_MIN_ATTEMPT,
        }
    }
}

impl Default for HedgeLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<M> HedgeLayerBuilder<M> {
    /// The hedge's settings, for a [review](crate::review).
    pub(crate) fn describe(&self) -> crate::review::HedgeSettings {
        crate::review::HedgeSettings {
            max_attempts: self.max_attempts,
            delay: match self.delay.repr {
                DelayRepr::Fixed(delay) => Some(delay),
                DelayRepr::Percentile { .. } => None,
            },
            hedges_idempotent: self.hedge_idempotent,
        }
    }
}

impl<M> HedgeLayerBuilder<M> {
    /// The classifier that decides what each attempt's answer means (default
    /// [`HttpClassifier`]): use the same one as the retry layer.
    pub fn classifier<M2>(self, classifier: M2) -> HedgeLayerBuilder<M2> {
        HedgeLayerBuilder {
            classifier,
            max_attempts: self.max_attempts,
            delay: self.delay,
            hedge_idempotent: self.hedge_idempotent,
            budget: self.budget,
            min_attempt: self.min_attempt,
        }
    }

    /// At most this many attempts in flight per call, the first included (default 2). At
    /// least 1; 1 turns hedging off.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// How long to wait before each hedge (default: learned, the 95th percentile).
    pub fn delay(mut self, delay: HedgeDelay) -> Self {
        self.delay = delay;
        self
    }

    /// Also hedge [`Idempotent`](crate::Semantics::Idempotent) requests (default false). A
    /// hedged PUT may run twice on the server, concurrently: say yes only if that is harmless.
    /// `Keyed` and `NonIdempotent` requests are never hedged, whatever this says.
    pub fn hedge_idempotent(mut self, yes: bool) -> Self {
        self.hedge_idempotent = yes;
        self
    }

    /// Spend hedges from this budget, which a [`RetryLayer`](crate::retry::RetryLayer) outside
    /// this one keeps: the retry layer deposits for every call and records its outcome; this
    /// layer only withdraws one unit per hedge (and records the outcome of the attempts it
    /// does not return), so a call is not counted twice.
    pub fn budget(mut self, budget: Arc<dyn RetryBudget>) -> Self {
        self.budget = BudgetChoice::Shared(budget);
        self
    }

    /// Spend hedges from this budget, kept by this layer alone: it deposits once per call that
    /// may be hedged and did not answer on its first poll (a call that answers at once could
    /// never be hedged; this keeps the clock read of a deposit off that path), records the
    /// outcome of every attempt, and withdraws one unit per hedge.
    pub fn own_budget(mut self, budget: Arc<dyn RetryBudget>) -> Self {
        self.budget = BudgetChoice::Own(budget);
        self
    }

    /// No budget: only the attempt limit bounds hedges. For tests; in production a slow
    /// server then gets up to `max_attempts` times its load.
    pub fn no_budget(mut self) -> Self {
        self.budget = BudgetChoice::None;
        self
    }

    /// Send no hedge that would leave the call less than this of its deadline (default 10 ms;
    /// at most [`MAX_DURATION`](crate::MAX_DURATION)). With a learned delay, the median latency
    /// of recent successful attempts, when larger, is used instead: a hedge that cannot finish
    /// is not sent.
    pub fn min_attempt_time(mut self, min_attempt: Duration) -> Self {
        self.min_attempt = min_attempt;
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting: the attempt limit (`"hedge attempt limit"`), a
    /// learned delay's percentile, window or minimum samples out of their ranges, or a
    /// duration past [`MAX_DURATION`](crate::MAX_DURATION) (`"hedge delay"`, `"hedge delay
    /// fallback"`, `"hedge minimum attempt time"`).
    pub fn build(self) -> Result<HedgeLayer<M>, ConfigError> {
        self.validate()?;
        Ok(self.assemble())
    }

    /// Checks the settings, as [`build`](Self::build) does.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_attempts == 0 {
            return Err(ConfigError::new(
                "hedge attempt limit",
                "must be at least 1 (the first attempt)",
            ));
        }
        match self.delay.repr {
            DelayRepr::Fixed(d) => {
                ConfigError::at_most_max("hedge delay", d)?;
            }
            DelayRepr::Percentile {
                percentile,
                fallback,
                min_samples,
                window,
            } => {
                if !(percentile > 0.0 && percentile <= 100.0) {
                    return Err(ConfigError::new(
                        "hedge delay percentile",
                        "must be a number above 0 and at most 100",
                    ));
                }
                if window == 0 || window > MAX_WINDOW {
                    return Err(ConfigError::new(
                        "hedge delay window",
                        "must be at least 1 and at most 2^20 attempts",
                    ));
                }
                if min_samples == 0 || min_samples > window {
                    return Err(ConfigError::new(
                        "hedge delay minimum samples",
                        "must be at least 1 and at most the window",
                    ));
                }
                ConfigError::at_most_max("hedge delay fallback", fallback)?;
            }
        }
        ConfigError::at_most_max("hedge minimum attempt time", self.min_attempt)?;
        Ok(())
    }

    /// The layer of these settings, which the caller has checked (or which are the defaults).
    pub(crate) fn assemble(self) -> HedgeLayer<M> {
        let delay = match self.delay.repr {
            DelayRepr::Fixed(d) => Delay::Fixed(d),
            DelayRepr::Percentile {
                percentile,
                fallback,
                min_samples,
                window,
            } => Delay::Learned(Learned::new(percentile, fallback, min_samples, window)),
        };
        let lendable = matches!(self.budget, BudgetChoice::Default);
        let (budget, owns_budget) = match self.budget {
            BudgetChoice::Default => (
                Some(Arc::new(RatioBudget::default()) as Arc<dyn RetryBudget>),
                true,
            ),
            BudgetChoice::Shared(b) => (Some(b), false),
            BudgetChoice::Own(b) => (Some(b), true),
            BudgetChoice::None => (None, false),
        };
        HedgeLayer {
            config: Arc::new(Config {
                classifier: self.classifier,
                max_attempts: self.max_attempts,
                delay,
                hedge_idempotent: self.hedge_idempotent,
                budget,
                owns_budget,
                lendable,
                lent: OnceLock::new(),
                min_attempt: self.min_attempt,
            }),
        }
    }
}

impl<S, M> Layer<S> for HedgeLayer<M> {
    type Service = Hedge<S, M>;

    fn layer(&self, inner: S) -> Hedge<S, M> {
        Hedge::from_config(inner, self.config.clone())
    }
}

impl<M> HedgeLayer<M> {
    /// The delay the next hedge would wait now: the fixed delay, or the learned one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::hedge::{HedgeDelay, HedgeLayer};
    ///
    /// let layer = HedgeLayer::builder()
    ///     .delay(HedgeDelay::fixed(Duration::from_millis(20)))
    ///     .build()?;
    /// assert_eq!(layer.current_delay(), Duration::from_millis(20));
    /// # Ok::<_, surely::ConfigError>(())
    /// ```
    pub fn current_delay(&self) -> Duration {
        self.config.delay.current()
    }
}

impl<M> fmt::Debug for Config<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("max_attempts", &self.max_attempts)
            .field("delay", &self.delay.current())
            .field("hedge_idempotent", &self.hedge_idempotent)
            .field("budget", &self.budget)
            .field("owns_budget", &self.owns_budget)
            .field("lendable", &self.lendable)
            .field("min_attempt", &self.min_attempt)
            .finish_non_exhaustive()
    }
}

impl<M> fmt::Debug for HedgeLayer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeLayer")
            .field("config", &self.config)
            .finish()
    }
}

impl<M> fmt::Debug for HedgeLayerBuilder<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HedgeLayerBuilder")
            .field("max_attempts", &self.max_attempts)
            .field("delay", &self.delay)
            .field("hedge_idempotent", &self.hedge_idempotent)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults `new` assembles without checking are the ones `build` accepts.
    #[tokio::test(start_paused = true)]
    async fn the_defaults_build() {
        let built = HedgeLayer::builder().build().unwrap();
        let new = HedgeLayer::new();
        assert_eq!(format!("{built:?}"), format!("{new:?}"));
        assert!(matches!(new.config.delay, Delay::Learned(_)));
    }
}
