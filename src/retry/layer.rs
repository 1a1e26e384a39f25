//! The retry layer and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use tower_layer::Layer;

use super::learn::AttemptTimes;
use super::Retry;
use crate::backoff::{Backoff, BackoffBuilder, Jitter};
use crate::breaker::CircuitBreaker;
use crate::budget::{RatioBudget, RetryBudget};
use crate::classify::HttpClassifier;
use crate::journal::{IntentJournal, JournalHook};
use crate::resolve::NoResolver;
use crate::review::{BackoffSettings, BudgetSettings, RetrySettings};
use crate::ConfigError;

/// The default attempt limit, the first attempt included.
pub(crate) const DEFAULT_MAX_ATTEMPTS: u32 = 3;

/// The default longest server pushback obeyed.
pub(crate) const DEFAULT_MAX_PUSHBACK: Duration = Duration::from_secs(30);

/// The default least time an attempt needs: a retry that would leave less of the call's budget
/// is not started.
pub(crate) const DEFAULT_MIN_ATTEMPT: Duration = Duration::from_millis(10);

/// Retries attempts that may be retried, within the attempt limit, the retry budget and the
/// call's deadline. See the [module docs](super).
#[derive(Clone)]
pub struct RetryLayer<M = HttpClassifier, Z = NoResolver> {
    config: Arc<Config<M, Z>>,
}

pub(super) struct Config<M, Z = NoResolver> {
    pub(super) resolver: Z,
    pub(super) learned: Option<AttemptTimes>,
    pub(super) classifier: M,
    pub(super) max_attempts: u32,
    pub(super) backoff: Backoff,
    pub(super) budget: Option<Arc<dyn RetryBudget>>,
    /// The budget's id as lent to the attempts (0 without a budget): a hedge layer inside that
    /// was given no budget pays from this one.
    pub(super) lender: u64,
    pub(super) max_pushback: Duration,
    pub(super) min_attempt: Duration,
    pub(super) attempt_header: Option<HeaderName>,
    pub(super) mark_owner: bool,
    pub(super) breaker: Option<CircuitBreaker>,
    // Whether each attempt is timed: for a learned attempt time, or for the breaker's
    // slow-call threshold. Decided once here, not read through the breaker on every call.
    pub(super) timed: bool,
    pub(super) journal: Option<JournalHook>,
}

/// Builds a [`RetryLayer`], validating its settings.
#[derive(Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RetryLayerBuilder<M = HttpClassifier, Z = NoResolver> {
    classifier: M,
    resolver: Z,
    settings: Settings,
}

/// The builder's settings that do not change its type.
#[derive(Clone)]
struct Settings {
    learn: Option<f64>,
    max_attempts: u32,
    backoff: Option<Backoff>,
    budget: Option<Arc<dyn RetryBudget>>,
    own_budget: bool,
    max_pushback: Duration,
    min_attempt: Duration,
    attempt_header: Option<HeaderName>,
    mark_owner: bool,
    breaker: Option<CircuitBreaker>,
    journal: Option<JournalHook>,
    /// Whether a resolver was given (for [`describe`](RetryLayerBuilder::describe)).
    resolver: bool,
}

impl RetryLayer {
    /// A layer with the defaults: [`HttpClassifier`], 3 attempts, exponential backoff from
    /// 100 ms with full jitter capped at 20 s, a [`RatioBudget`] of its own (10% of first
    /// attempts, or 10 a second if that is more, shared by every service the layer makes),
    /// pushback obeyed up to 30 s, and no retry that would leave less than 10 ms of the call's
    /// budget.
    pub fn new() -> Self {
        // Assembled without checking: a test builds the same defaults through `build`.
        Self::builder().assemble()
    }

    /// A builder, starting from [`new`](Self::new)'s settings.
    pub fn builder() -> RetryLayerBuilder {
        RetryLayerBuilder {
            classifier: HttpClassifier::new(),
            resolver: NoResolver,
            settings: Settings {
                learn: None,
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                backoff: None,
                budget: None,
                own_budget: true,
                max_pushback: DEFAULT_MAX_PUSHBACK,
                min_attempt: DEFAULT_MIN_ATTEMPT,
                attempt_header: None,
                mark_owner: true,
                breaker: None,
                journal: None,
                resolver: false,
            },
        }
    }
}

impl Default for RetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<M, Z> RetryLayerBuilder<M, Z> {
    /// The classifier that decides what each attempt means (default [`HttpClassifier`]).
    pub fn classifier<M2>(self, classifier: M2) -> RetryLayerBuilder<M2, Z> {
        RetryLayerBuilder {
            classifier,
            resolver: self.resolver,
            settings: self.settings,
        }
    }

    /// At most this many attempts per call, the first included (default 3). At least 1.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.settings.max_attempts = max_attempts;
        self
    }

    /// The wait before each retry when the server says nothing. Its base delay and cap are at
    /// most [`MAX_DURATION`](crate::MAX_DURATION) (ten years): [`build`](Self::build) refuses
    /// more.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.settings.backoff = Some(backoff);
        self
    }

    /// Spend retries from this budget, which may be shared with other services.
    ///
    /// Whichever budget the layer has (this one, or its own by default) it lends to the
    /// attempts it sends: a [`HedgeLayer`](crate::hedge::HedgeLayer) inside that was given no
    /// budget of its own pays its hedges from it ([`docs::retries`](crate::docs::retries)).
    pub fn budget(mut self, budget: Arc<dyn RetryBudget>) -> Self {
        self.settings.budget = Some(budget);
        self.settings.own_budget = false;
        self
    }

    /// No retry budget: only the attempt limit bounds retries. For tests; in production, an
    /// outage then multiplies the load by the attempt limit.
    pub fn no_budget(mut self) -> Self {
        self.settings.budget = None;
        self.settings.own_budget = false;
        self
    }

    /// Obey a server's `Retry-After` or `grpc-retry-pushback-ms` up to this long (default
    /// 30 s). A server that asks for longer, or for a wait that the call's deadline cannot
    /// cover, is not retried at all: the call stops ([`StopReason::PushbackStop`]). The client
    /// never comes back sooner than it was asked to. At most [`MAX_DURATION`](crate::MAX_DURATION)
    /// (ten years): [`build`](Self::build) refuses more.
    ///
    /// [`StopReason::PushbackStop`]: crate::StopReason::PushbackStop
    pub fn max_pushback(mut self, max_pushback: Duration) -> Self {
        self.settings.max_pushback = max_pushback;
        self
    }

    /// Settles calls that would end with an unknown outcome by asking the server (see
    /// [`Resolve`](crate::retry::Resolve)); by default ([`NoResolver`]) an unknown outcome stays unknown.
    pub fn resolver<Z2>(mut self, resolver: Z2) -> RetryLayerBuilder<M, Z2> {
        self.settings.resolver = true;
        RetryLayerBuilder {
            classifier: self.classifier,
            resolver,
            settings: self.settings,
        }
    }

    /// Start no retry that would leave the call less than this (default 10 ms) after its wait.
    /// With [`learn_min_attempt_time`](Self::learn_min_attempt_time), this is the floor. At
    /// most [`MAX_DURATION`](crate::MAX_DURATION) (ten years): [`build`](Self::build) refuses
    /// more.
    pub fn min_attempt_time(mut self, min_attempt: Duration) -> Self {
        self.settings.min_attempt = min_attempt;
        self
    }

    /// Learns the minimum attempt time from the attempts themselves: the `quantile` (say 0.9)
    /// of the last 64 answered attempts' times, shared by every service the layer makes, and
    /// never below [`min_attempt_time`](Self::min_attempt_time). A retry is then not started
    /// when the call has less left than a typical attempt takes. Until 8 attempts have been
    /// answered, the fixed minimum applies. `quantile` must be in (0, 1].
    pub fn learn_min_attempt_time(mut self, quantile: f64) -> Self {
        self.settings.learn = Some(quantile);
        self
    }

    /// Also write the number of earlier attempts in this HTTP header on retries (off by default;
    /// gRPC requests always get `grpc-previous-rpc-attempts`).
    pub fn attempt_header(mut self, header: Option<HeaderName>) -> Self {
        self.settings.attempt_header = header;
        self
    }

    /// Whether to tell the next hop that this layer owns retries, with [`RETRY_OWNER`](crate::headers::RETRY_OWNER) on every
    /// attempt (default true). With it, a request's [`Criticality`](crate::Criticality) extension is written too, as
    /// the [`CRITICALITY`](crate::headers::CRITICALITY) header the next hop's [adaptive limit][crate::server::limit] sheds
    /// by (unless the request already has that header).
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::limit",
        )
    )]
    pub fn mark_owner(mut self, mark: bool) -> Self {
        self.settings.mark_owner = mark;
        self
    }

    /// Guards every attempt with `breaker`, as a
    /// [`BreakerLayer`](crate::breaker::BreakerLayer) right inside this layer
    /// would, with this layer's classifier: an attempt the breaker refuses is not made and
    /// ends with its [`CircuitOpen`](crate::breaker::CircuitOpen), which is retried after the
    /// break when the call's deadline allows; an attempt made is counted when it ends, and
    /// counts nothing if the call is dropped first. The breaker's state lives with the layer's
    /// settings, so guarding costs a call no clone of it, where a breaker layer clones it for
    /// the service each call keeps and again for its future. A layer that makes several
    /// requests of one attempt (a hedge) sits inside, so its copies count as one attempt: put
    /// a breaker layer under it to count each copy, as [`client()`](crate::client()) does. In a
    /// client stack, give the breaker with
    /// [`ClientBuilder::breaker`](crate::client::ClientBuilder::breaker): the client's breaker
    /// slot, which has one by default, replaces a breaker set here.
    ///
    /// ```
    /// use surely::breaker::{BreakerState, CircuitBreaker};
    /// use surely::retry::RetryLayer;
    ///
    /// let breaker = CircuitBreaker::new();
    /// let layer = RetryLayer::builder()
    ///     .circuit_breaker(breaker.clone())
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(breaker.state(), BreakerState::Closed);
    /// # drop(layer);
    /// ```
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.settings.breaker = Some(breaker);
        self
    }

    /// Writes the intent of every call that is not [safe](crate::Semantics::Safe) to `journal` before
    /// its first attempt, and waits for the write; a [`Journaled`](crate::journal::Journaled)
    /// extension decides for one request. A call whose intent cannot be written is not sent
    /// (it fails with a [`JournalError`](crate::journal::JournalError)). See
    /// [`journal`](crate::journal).
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use surely::journal::{Intent, IntentId, IntentJournal, JournalError};
    /// use surely::retry::RetryLayer;
    /// use surely::Outcome;
    /// use tower::{service_fn, Layer, Service, ServiceExt};
    ///
    /// /// Intents in memory (a real journal writes them where a crash cannot lose them).
    /// #[derive(Clone, Default)]
    /// struct Notes(Arc<Mutex<Vec<String>>>);
    ///
    /// impl IntentJournal for Notes {
    ///     async fn begin(&self, intent: &Intent) -> Result<(), JournalError> {
    ///         let key = intent.key.clone().unwrap_or_default();
    ///         self.0.lock().unwrap().push(format!("begin {key}"));
    ///         Ok(())
    ///     }
    ///     fn end(&self, _id: IntentId, outcome: Outcome) {
    ///         self.0.lock().unwrap().push(format!("end {outcome:?}"));
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let notes = Notes::default();
    /// let retry = RetryLayer::builder().journal(notes.clone()).build().unwrap();
    /// let mut svc = retry.layer(service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, std::io::Error>(http::Response::new(()))
    /// }));
    /// let mut order = http::Request::post("/orders").body(()).unwrap();
    /// order.extensions_mut().insert(surely::record::BusinessKey::new("o-1"));
    /// svc.ready().await.unwrap().call(order).await.unwrap();
    /// // A read is not journaled.
    /// svc.ready().await.unwrap().call(http::Request::get("/orders/o-1").body(()).unwrap()).await.unwrap();
    /// assert_eq!(*notes.0.lock().unwrap(), ["begin o-1", "end Succeeded"]);
    /// # }
    /// ```
    pub fn journal(mut self, journal: impl IntentJournal) -> Self {
        self.settings.journal = Some(JournalHook::new(journal));
        self
    }

    /// Validates and builds.
    pub fn build(self) -> Result<RetryLayer<M, Z>, ConfigError> {
        self.validate()?;
        Ok(self.assemble())
    }

    /// Checks the settings, as [`build`](Self::build) does.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.settings.max_attempts == 0 {
            return Err(ConfigError::new(
                "retry attempt limit",
                "must be at least 1 (the first attempt)",
            ));
        }
        if let Some(q) = self.settings.learn
            && !(q > 0.0 && q <= 1.0)
        {
            return Err(ConfigError::new(
                "learned minimum attempt time",
                "the quantile must be greater than 0 and at most 1",
            ));
        }
        ConfigError::at_most_max("retry max pushback", self.settings.max_pushback)?;
        ConfigError::at_most_max("retry minimum attempt time", self.settings.min_attempt)?;
        if let Some(backoff) = &self.settings.backoff {
            ConfigError::at_most_max("retry backoff base delay", backoff.base())?;
            ConfigError::at_most_max("retry backoff cap", backoff.cap())?;
        }
        Ok(())
    }

    /// The effective settings, as a [review](crate::review) reads them: the budget is
    /// `fallback` (the client's shared one) when the layer was given none of its own.
    pub(crate) fn describe(&self) -> RetrySettings {
        let s = &self.settings;
        let backoff = s.backoff.clone().unwrap_or_else(default_backoff);
        let budget = match (&s.budget, s.own_budget) {
            (_, true) => RatioBudget::default().describe(),
            (Some(budget), false) => budget.describe(),
            (None, false) => BudgetSettings::None,
        };
        RetrySettings {
            max_attempts: s.max_attempts,
            backoff: BackoffSettings {
                base: backoff.base(),
                max: backoff.cap(),
                multiplier: backoff.multiplier(),
                jitter: backoff.jitter(),
            },
            budget,
            max_pushback: s.max_pushback,
            min_attempt_time: s.min_attempt,
            marks_owner: s.mark_owner,
            journal: s.journal.is_some(),
            resolver: s.resolver,
        }
    }

    /// The layer of these settings, which the caller has checked (or which are the defaults).
    pub(crate) fn assemble(self) -> RetryLayer<M, Z> {
        let Settings {
            learn,
            max_attempts,
            backoff,
            budget,
            own_budget,
            max_pushback,
            min_attempt,
            attempt_header,
            mark_owner,
            breaker,
            journal,
            resolver: _,
        } = self.settings;
        let budget = if own_budget {
            Some(Arc::new(RatioBudget::default()) as Arc<dyn RetryBudget>)
        } else {
            budget
        };
        let lender = budget.as_ref().map_or(0, crate::budget::lend::register);
        RetryLayer {
            config: Arc::new(Config {
                resolver: self.resolver,
                timed: learn.is_some() || breaker.as_ref().is_some_and(CircuitBreaker::times_calls),
                learned: learn.map(AttemptTimes::new),
                classifier: self.classifier,
                max_attempts,
                backoff: backoff.unwrap_or_else(default_backoff),
                budget,
                lender,
                max_pushback,
                min_attempt,
                attempt_header,
                mark_owner,
                breaker,
                journal,
            }),
        }
    }
}

/// The default backoff's settings: 100 ms, doubling, full jitter, capped at 20 s.
fn default_backoff_settings() -> BackoffBuilder {
    Backoff::exponential(Duration::from_millis(100)).jitter(Jitter::Full)
}

/// The default backoff, assembled without checking: the test below builds the same settings.
fn default_backoff() -> Backoff {
    default_backoff_settings().assemble()
}

impl<S, M, Z> Layer<S> for RetryLayer<M, Z> {
    type Service = Retry<S, M, Z>;

    fn layer(&self, inner: S) -> Retry<S, M, Z> {
        Retry {
            inner,
            spare: None,
            config: self.config.clone(),
        }
    }
}

impl<M, Z> fmt::Debug for RetryLayer<M, Z> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryLayer")
            .field("max_attempts", &self.config.max_attempts)
            .field("backoff", &self.config.backoff)
            .field("budget", &self.config.budget)
            .field("max_pushback", &self.config.max_pushback)
            .field("min_attempt", &self.config.min_attempt)
            .field("breaker", &self.config.breaker)
            .finish_non_exhaustive()
    }
}

impl<M, Z> fmt::Debug for RetryLayerBuilder<M, Z> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryLayerBuilder")
            .field("max_attempts", &self.settings.max_attempts)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults `new` assembles without checking are the ones `build` accepts.
    #[tokio::test(start_paused = true)]
    async fn the_defaults_build() {
        let built = RetryLayer::builder().build().unwrap();
        // The backoff's entropy differs between two layers; its settings must not.
        let settings = |layer: &RetryLayer| {
            let c = &layer.config;
            (
                c.max_attempts,
                c.backoff.base(),
                c.backoff.multiplier(),
                c.backoff.cap(),
                c.backoff.jitter(),
                c.budget.is_some(),
                c.max_pushback,
                c.min_attempt,
                c.mark_owner,
                c.breaker.is_none(),
                c.timed,
            )
        };
        assert_eq!(settings(&built), settings(&RetryLayer::new()));
        let backoff = default_backoff_settings().build().unwrap();
        let assembled = default_backoff();
        assert_eq!(
            (
                backoff.base(),
                backoff.multiplier(),
                backoff.cap(),
                backoff.jitter()
            ),
            (
                assembled.base(),
                assembled.multiplier(),
                assembled.cap(),
                assembled.jitter()
            )
        );
    }
}
