//! The client stack configured from a file or the environment (feature `serde`).
//!
//! [`ClientConfig`] is a plain struct that implements serde's `Deserialize`: load it with the
//! loader your service already uses (`toml`, `serde_yaml`, the `config` crate, `figment`), as
//! the whole file or as one section of yours, and [`apply`](ClientConfig::apply) it to a preset.
//! The server's layers have theirs in [`server::config`][crate::server::config] (feature
//! `server`).
//!
//! * **Every field is optional**, and a field left out keeps the builder's default: an empty
//!   configuration builds exactly the stack of [`client()`](crate::client()). The defaults are
//!   the builders', said on each field.
//! * **Durations are strings**, as humantime writes them: `"300ms"`, `"2s"`, `"1m 30s"`.
//! * **A field this crate does not know is an error** that names it, so a typo is not silently
//!   a default.
//! * **Values are checked by the builders**, where the rules live, and a rejected value is
//!   reported by its field's path in the configuration: `invalid retry.backoff.max: must not
//!   be less than the base delay`. The path is relative to the struct; a section of a larger
//!   file is that section's.
//!
//! Which layers the stack has stays a decision of the code, since it is the stack's type: a
//! hedge only for a client of safe reads ([`apply_hedged`](ClientConfig::apply_hedged)), no
//! breaker after [`no_breaker`](crate::client::ClientBuilder::no_breaker). The configuration
//! tunes them.
//!
//! # An example
//!
//! Every field but `body_idle_timeout` (below), with values that are not the defaults:
//!
//! ```
//! use std::time::Duration;
//! use surely::config::ClientConfig;
//! use tower::{service_fn, Service, ServiceExt};
//!
//! const PAYMENTS: &str = r#"
//! timeout = "2s"             # the call's total budget (default 10 s)
//! per_try_timeout = "500ms"  # each attempt (default: only what the budget leaves)
//! internal_headers = true    # false for a third-party API
//! server_honours_keys = true # a keyed POST is retried after a lost reply (default false)
//!
//! [retry]
//! max_attempts = 4           # the first included (default 3)
//! max_pushback = "10s"       # obey Retry-After up to this (default 30 s)
//! min_attempt_time = "20ms"  # start no retry that would leave less (default 10 ms)
//!
//! [retry.backoff]            # default: 100 ms, doubling, full jitter, at most 20 s
//! base = "50ms"
//! max = "2s"
//! multiplier = 3.0
//! jitter = "equal"           # none, full, equal or decorrelated
//!
//! [budget]                   # default: ratio 0.1, ttl 10 s, 10 a second
//! kind = "ratio"             # the default; "token_bucket" (max_tokens, token_ratio); "none"
//! ratio = 0.2
//! ttl = "20s"
//! min_per_sec = 5.0
//!
//! [breaker]                  # see surely::breaker for the defaults
//! name = "payments"
//! failure_ratio = 0.6
//! min_throughput = 10
//! window = { calls = 50 }    # or { length = "30s", buckets = 10 }
//! break_duration = "2s"
//! break_multiplier = 1.5
//! max_break = "30s"
//! jitter = 0.2
//! half_open_probes = 2
//! slow_call_threshold = "1s"
//! min_timeout_evidence = "50ms"
//! "#;
//!
//! let config: ClientConfig = toml::from_str(PAYMENTS).unwrap();
//! assert_eq!(config.timeout, Some(Duration::from_secs(2)));
//! assert_eq!(config.retry.backoff.max, Some(Duration::from_secs(2)));
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! # let config: ClientConfig = toml::from_str(PAYMENTS).unwrap();
//! let transport = service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, std::io::Error>(http::Response::new(String::from("paid")))
//! });
//! let mut payments = config.apply(surely::client()).unwrap().build(transport).unwrap();
//! let charge = http::Request::post("/charges").body(String::new()).unwrap();
//! let res = payments.ready().await.unwrap().call(charge).await.unwrap();
//! assert_eq!(res.body(), "paid");
//! # }
//! ```
//!
//! A value a builder refuses names its field:
//!
//! ```
//! use surely::config::ClientConfig;
//!
//! let config: ClientConfig = toml::from_str(r#"
//! [retry.backoff]
//! base = "5s"
//! max = "1s"
//! "#).unwrap();
//! let err = config.apply(surely::client()).unwrap_err();
//! assert_eq!(err.setting(), "retry.backoff.max");
//! assert_eq!(err.to_string(), "invalid retry.backoff.max: must not be less than the base delay");
//! ```
//!
//! # YAML, and the environment
//!
//! The same struct reads YAML:
//!
//! ```
//! use std::time::Duration;
//! use surely::config::ClientConfig;
//!
//! let config: ClientConfig = serde_yaml_ng::from_str("
//! timeout: 2s
//! retry:
//!   max_attempts: 4
//!   backoff: { base: 50ms, max: 2s }
//! ").unwrap();
//! assert_eq!(config.retry.backoff.base, Some(Duration::from_millis(50)));
//! ```
//!
//! And environment variables, through a loader that nests keys, such as the `config` crate's
//! `Environment` with `__` between keys (`envy` reads only flat structs):
//!
//! ```
//! use std::time::Duration;
//! use surely::config::ClientConfig;
//!
//! # fn main() -> Result<(), config::ConfigError> {
//! # // The variables as a map, not the process's own: setting a process's environment is
//! # // `unsafe` (another thread may read it), and this crate has none.
//! # let vars = [
//! #     ("PAYMENTS_TIMEOUT", "2s"),
//! #     ("PAYMENTS_RETRY__MAX_ATTEMPTS", "4"),
//! #     ("PAYMENTS_RETRY__BACKOFF__BASE", "50ms"),
//! # ];
//! // PAYMENTS_TIMEOUT=2s PAYMENTS_RETRY__MAX_ATTEMPTS=4 PAYMENTS_RETRY__BACKOFF__BASE=50ms
//! let config: ClientConfig = config::Config::builder()
//!     .add_source(
//!         config::Environment::with_prefix("PAYMENTS")
//!             .prefix_separator("_")
//!             .separator("__")
//!             .try_parsing(true)
//! #           .source(Some(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())),
//!     )
//!     .build()?
//!     .try_deserialize()?;
//! assert_eq!(config.timeout, Some(Duration::from_secs(2)));
//! assert_eq!(config.retry.max_attempts, Some(4));
//! # Ok(()) }
//! ```
#![cfg_attr(
    not(all(feature = "server", feature = "serde")),
    doc = crate::docs::links::to_features!(
        "crate::server::config",
    )
)]

mod serde_support;

pub(crate) use self::serde_support::{duration, of_field};

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tower_layer::Identity;

use crate::backoff::{Backoff, Jitter};
use crate::breaker::{CircuitBreaker, CircuitBreakerBuilder, SlidingWindow};
use crate::budget::{RatioBudget, RetryBudget, TokenBucket};
use crate::client::ClientBuilder;
use crate::deadline::SetDeadlineLayer;
use crate::hedge::{HedgeDelay, HedgeLayer, HedgeLayerBuilder};
use crate::record::WatchTrailersLayer;
use crate::retry::{RetryLayer, RetryLayerBuilder};
use crate::timeout::{AttemptTimeoutLayer, BodyIdleTimeoutLayer};
use crate::ConfigError;

/// The client stack's settings: the call's budget, the attempt timeout, retries, the retry
/// budget, the breaker and the hedge. See the [module docs](self) for the format and an
/// example.
///
/// Every field is optional; one left out keeps the builder's default.
///
/// ```
/// use surely::config::ClientConfig;
///
/// // An empty file is the default stack.
/// let config: ClientConfig = toml::from_str("").unwrap();
/// assert_eq!(config, ClientConfig::default());
/// let client = config.apply(surely::client()).unwrap();
/// # let _ = client;
/// ```
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ClientConfig {
    /// The call's total budget (default 10 s):
    /// [`ClientBuilder::timeout`].
    #[serde(deserialize_with = "duration")]
    pub timeout: Option<Duration>,
    /// The longest one attempt may take (default: only the remaining budget bounds it):
    /// [`ClientBuilder::per_try_timeout`].
    #[serde(deserialize_with = "duration")]
    pub per_try_timeout: Option<Duration>,
    /// The longest a response body may stay quiet while the caller waits for a frame:
    /// [`ClientBuilder::body_idle_timeout`]. Whether the stack has the timeout is the code's
    /// decision, since it changes the body's type: a client built without one refuses a
    /// configuration that sets it, and this replaces the duration of one built with it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::config::ClientConfig;
    ///
    /// let config: ClientConfig = toml::from_str(r#"body_idle_timeout = "2s""#).unwrap();
    /// // The code decides that the stack has the timeout; the file says how long.
    /// let http = surely::client::http().body_idle_timeout(Duration::from_secs(30));
    /// assert!(config.apply(http).is_ok());
    /// // A client without one refuses it.
    /// let err = config.apply(surely::client::http()).unwrap_err();
    /// assert_eq!(err.setting(), "body_idle_timeout");
    /// ```
    #[serde(deserialize_with = "duration")]
    pub body_idle_timeout: Option<Duration>,
    /// `false` sends none of the crate's own headers, for a third-party API (default `true`):
    /// [`ClientBuilder::no_internal_headers`].
    pub internal_headers: Option<bool>,
    /// `true` declares that the server honours idempotency keys, so that a keyed POST is
    /// retried after a lost reply (default `false`): [`ClientBuilder::server_honours_keys`].
    /// Refused for a client that sends no keys (the [`grpc()`](crate::client::grpc()) preset).
    pub server_honours_keys: Option<bool>,
    /// The retry layer.
    pub retry: RetryConfig,
    /// The retry budget, shared by retries and hedges (default a ratio budget:
    /// [`RatioBudget::default`]).
    pub budget: BudgetConfig,
    /// The circuit breaker (default [`CircuitBreaker::new`]).
    pub breaker: BreakerConfig,
    /// The hedge, for a client built with [`apply_hedged`](ClientConfig::apply_hedged): a
    /// client without one refuses a configuration that sets it.
    pub hedge: Option<HedgeConfig>,
}

/// The retry layer's settings: [`RetryLayerBuilder`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RetryConfig {
    /// At most this many attempts per call, the first included (default 3; at least 1).
    pub max_attempts: Option<u32>,
    /// The wait before each retry when the server says nothing.
    pub backoff: BackoffConfig,
    /// Obey a server's `Retry-After` up to this long (default 30 s).
    #[serde(deserialize_with = "duration")]
    pub max_pushback: Option<Duration>,
    /// Start no retry that would leave the call less than this (default 10 ms).
    #[serde(deserialize_with = "duration")]
    pub min_attempt_time: Option<Duration>,
}

/// An exponential backoff: [`Backoff::exponential`]. Default: 100 ms, doubling, full jitter,
/// at most 20 s.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BackoffConfig {
    /// The wait before the first retry, before jitter (default 100 ms; greater than zero).
    #[serde(deserialize_with = "duration")]
    pub base: Option<Duration>,
    /// The longest single wait (default 20 s, or `base` if that is longer; at least `base`).
    #[serde(deserialize_with = "duration")]
    pub max: Option<Duration>,
    /// How much each wait grows over the one before (default 2.0; at least 1.0).
    pub multiplier: Option<f64>,
    /// `none`, `full` (the default), `equal` or `decorrelated`: see [`Jitter`].
    pub jitter: Option<Jitter>,
}

/// The base delay of [`RetryLayer::new`]'s backoff.
const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(100);

/// The retry budget: see [`budget`](crate::budget) for the two forms. Which one is `kind`'s
/// to say; a field of another kind is refused.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BudgetConfig {
    /// `ratio` (the default), `token_bucket` or `none`: [`BudgetKind`].
    pub kind: Option<BudgetKind>,
    /// A ratio budget's retries per first attempt (default 0.1; from 0 to 1000).
    pub ratio: Option<f64>,
    /// How long a ratio budget counts an attempt (default 10 s; from 1 to 60 s).
    #[serde(deserialize_with = "duration")]
    pub ttl: Option<Duration>,
    /// A ratio budget's retries a second whatever the traffic (default 10; not negative).
    pub min_per_sec: Option<f64>,
    /// A token bucket's size (needed for one; from 1 to 1000).
    pub max_tokens: Option<u32>,
    /// Tokens a success puts back in a token bucket (needed for one; from 0.001 to
    /// `max_tokens`).
    pub token_ratio: Option<f64>,
}

/// The form of a retry budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BudgetKind {
    /// A [`RatioBudget`]: retries at most `ratio` of first attempts over `ttl`, or
    /// `min_per_sec` a second when that is more.
    Ratio,
    /// A [`TokenBucket`], as gRPC's `retryThrottling`: `max_tokens` and `token_ratio`.
    TokenBucket,
    /// No budget: only the attempt limits bound retries and hedges. For tests.
    None,
}

/// The circuit breaker's settings: [`CircuitBreakerBuilder`], whose docs say the defaults.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// A name for the records and logs.
    pub name: Option<String>,
    /// Open when at least this share of the calls in the window failed (default 0.5; in
    /// `(0, 1]`).
    pub failure_ratio: Option<f64>,
    /// Never open with fewer calls than this in the window (default 20).
    pub min_throughput: Option<u32>,
    /// The window the failure ratio is measured over (default the last 100 calls).
    pub window: Option<WindowConfig>,
    /// Count a call that took longer than this as a failure (default off).
    #[serde(deserialize_with = "duration")]
    pub slow_call_threshold: Option<Duration>,
    /// The first break (default 5 s).
    #[serde(deserialize_with = "duration")]
    pub break_duration: Option<Duration>,
    /// Each break after a failed probe lasts this many times the one before (default 2.0).
    pub break_multiplier: Option<f64>,
    /// The longest break (default 60 s).
    #[serde(deserialize_with = "duration")]
    pub max_break: Option<Duration>,
    /// Spread each break by up to this share either way (default 0.1; in `[0, 1)`).
    pub jitter: Option<f64>,
    /// How many probes a half-open breaker lets through (default 1; from 1 to 1000).
    pub half_open_probes: Option<u32>,
    /// A timeout the call's deadline set counts only if the attempt was given this long
    /// (default 100 ms).
    #[serde(deserialize_with = "duration")]
    pub min_timeout_evidence: Option<Duration>,
}

/// The breaker's [`SlidingWindow`]: `{ calls = 100 }`, the last calls, or
/// `{ length = "30s", buckets = 10 }`, the calls of the last `length` (`buckets` default 10).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WindowConfig {
    /// A count window of this many calls.
    pub calls: Option<u32>,
    /// A time window this long.
    #[serde(deserialize_with = "duration")]
    pub length: Option<Duration>,
    /// How many slices a time window is counted in (default 10).
    pub buckets: Option<u32>,
}

/// The buckets of a time window whose configuration does not say.
const DEFAULT_WINDOW_BUCKETS: u32 = 10;

/// The hedge's settings: [`HedgeLayerBuilder`], whose docs say the defaults. The delay is
/// fixed (`delay`), or learned as a percentile of recent latencies (the other delay fields).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HedgeConfig {
    /// At most this many attempts in flight per call, the first included (default 2).
    pub max_attempts: Option<u32>,
    /// A fixed delay before each hedge (default: learned).
    #[serde(deserialize_with = "duration")]
    pub delay: Option<Duration>,
    /// The learned delay's percentile of recent successful latencies (default 95; in
    /// `(0, 100]`).
    pub percentile: Option<f64>,
    /// The learned delay until `min_samples` were seen (default 100 ms).
    #[serde(deserialize_with = "duration")]
    pub fallback: Option<Duration>,
    /// Successful attempts seen before the percentile is trusted (default 100).
    pub min_samples: Option<u32>,
    /// Recent successful attempts the percentile is computed from (default 1000).
    pub window: Option<u32>,
    /// Also hedge idempotent requests, not only safe ones (default false).
    pub hedge_idempotent: Option<bool>,
    /// Send no hedge that would leave the call less than this (default 10 ms).
    #[serde(deserialize_with = "duration")]
    pub min_attempt_time: Option<Duration>,
}

impl ClientConfig {
    /// [`client()`](crate::client()) with this configuration applied.
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub fn builder(&self) -> Result<ClientBuilder, ConfigError> {
        self.apply(ClientBuilder::new())
    }

    /// Applies this configuration to a builder without a hedge: a preset
    /// ([`client()`](crate::client()), [`http()`](crate::client::http()),
    /// [`grpc()`](crate::client::grpc())) or one the code has set up, with the presets' key
    /// layer or none. A field left out leaves the builder's setting as it was; a backoff or
    /// breaker section with any field replaces the builder's backoff or breaker with one of its
    /// own, made from the section and the defaults.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] whose [setting](ConfigError::setting) is the path of the field that
    /// was refused (`retry.max_attempts`, `budget.ratio`, ...); `hedge` if the configuration
    /// sets a hedge (use [`apply_hedged`](Self::apply_hedged)); `body_idle_timeout` if it sets
    /// one and the builder has none.
    #[allow(clippy::type_complexity)]
    pub fn apply<R, M, Z, K: KeySlot, P, W: WatchSlot>(
        &self,
        builder: ClientBuilder<R, M, Z, K, P, Identity, CircuitBreaker, W>,
    ) -> Result<ClientBuilder<R, M, Z, K, P, Identity, CircuitBreaker, W>, ConfigError> {
        if self.hedge.is_some() {
            return Err(ConfigError::new(
                "hedge",
                "is set, but this client has no hedge (build it with `ClientConfig::apply_hedged`)",
            ));
        }
        self.apply_layers(builder)
    }

    /// Applies this configuration to a builder without a hedge, as [`apply`](Self::apply),
    /// and adds a hedge configured by [`hedge`](Self::hedge) (the hedge's defaults if it is
    /// not set): for a client of safe reads.
    ///
    /// ```
    /// use surely::config::ClientConfig;
    ///
    /// let config: ClientConfig = toml::from_str(r#"
    /// [hedge]
    /// delay = "20ms"
    /// "#).unwrap();
    /// let catalogue = config.apply_hedged(surely::client()).unwrap();
    /// # let _ = catalogue;
    /// ```
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply), with the hedge's fields (`hedge.max_attempts`, ...).
    #[allow(clippy::type_complexity)]
    pub fn apply_hedged<R, M, Z, K: KeySlot, P, W: WatchSlot>(
        &self,
        builder: ClientBuilder<R, M, Z, K, P, Identity, CircuitBreaker, W>,
    ) -> Result<ClientBuilder<R, M, Z, K, P, HedgeLayerBuilder, CircuitBreaker, W>, ConfigError>
    {
        let hedge = self.hedge.clone().unwrap_or_default();
        // Checked on a builder of its own: the client's is handed over unbuilt.
        hedge
            .settle(HedgeLayer::builder())?
            .build()
            .map_err(of_field(&[
                ("hedge attempt limit", "hedge.max_attempts"),
                ("hedge delay percentile", "hedge.percentile"),
                ("hedge delay window", "hedge.window"),
                ("hedge delay minimum samples", "hedge.min_samples"),
                ("hedge delay", "hedge.delay"),
                ("hedge delay fallback", "hedge.fallback"),
                ("hedge minimum attempt time", "hedge.min_attempt_time"),
            ]))?;
        let builder = self.apply_layers(builder)?;
        Ok(builder.hedge(hedge.settle(HedgeLayer::builder())?))
    }

    #[allow(clippy::type_complexity)]
    fn apply_layers<R, M, Z, K: KeySlot, P, H, W: WatchSlot>(
        &self,
        mut builder: ClientBuilder<R, M, Z, K, P, H, CircuitBreaker, W>,
    ) -> Result<ClientBuilder<R, M, Z, K, P, H, CircuitBreaker, W>, ConfigError> {
        if let Some(timeout) = self.timeout {
            SetDeadlineLayer::builder()
                .timeout(timeout)
                .build()
                .map_err(|e| match e.setting() {
                    // The file has no reserve to blame: the timeout is too short for it.
                    "deadline reserve" => ConfigError::new(
                        "timeout",
                        "must be at least 2 ms: the deadline keeps 1 ms in reserve and writes \
                         at least a millisecond on the wire",
                    ),
                    _ => of_field(&[("deadline timeout", "timeout")])(e),
                })?;
            builder = builder.timeout(timeout);
        }
        if let Some(per_try) = self.per_try_timeout {
            AttemptTimeoutLayer::builder()
                .per_try(per_try)
                .build()
                .map_err(of_field(&[("attempt timeout", "per_try_timeout")]))?;
            builder = builder.per_try_timeout(per_try);
        }
        if let Some(idle) = self.body_idle_timeout {
            BodyIdleTimeoutLayer::builder()
                .idle(idle)
                .build()
                .map_err(of_field(&[("body idle timeout", "body_idle_timeout")]))?;
            builder = W::body_idle_timeout(builder, idle)?;
        }
        if self.internal_headers == Some(false) {
            builder = builder.no_internal_headers();
        }
        if self.server_honours_keys == Some(true) {
            builder = K::server_honours_keys(builder)?;
        }
        builder = match self.budget.build()? {
            Budget::Unchanged => builder,
            Budget::Removed => builder.no_budget(),
            Budget::Given(budget) => builder.budget(budget),
        };
        let backoff = self.retry.backoff.build()?;
        self.retry
            .settle(RetryLayer::builder(), backoff.clone())
            .build()
            .map_err(of_field(&[
                ("retry attempt limit", "retry.max_attempts"),
                ("retry max pushback", "retry.max_pushback"),
                ("retry minimum attempt time", "retry.min_attempt_time"),
                ("retry backoff base delay", "retry.backoff.base"),
                ("retry backoff cap", "retry.backoff.max"),
            ]))?;
        builder = builder.retry(|retry| self.retry.settle(retry, backoff));
        if let Some(breaker) = self.breaker.build()? {
            builder = builder.breaker(breaker);
        }
        Ok(builder)
    }
}

/// The key slot and the watch slot of a [`ClientBuilder`] that a [`ClientConfig`] applies to:
/// the presets' [`SetIdempotencyKeyLayer`] or none, and the layers around the transport. Public in
/// a private module, so that the bounds can name them and users cannot.
mod slots {
    use super::*;
    use crate::idempotency::SetIdempotencyKeyLayer;

    /// What `server_honours_keys = true` does to a builder with this key slot.
    pub trait KeySlot: Sized {
        /// The builder, told that the server honours keys.
        #[allow(clippy::type_complexity)]
        fn server_honours_keys<R, M, Z, P, H, B, W>(
            builder: ClientBuilder<R, M, Z, Self, P, H, B, W>,
        ) -> Result<ClientBuilder<R, M, Z, Self, P, H, B, W>, ConfigError>;
    }

    impl<Q> KeySlot for SetIdempotencyKeyLayer<Q> {
        fn server_honours_keys<R, M, Z, P, H, B, W>(
            builder: ClientBuilder<R, M, Z, Self, P, H, B, W>,
        ) -> Result<ClientBuilder<R, M, Z, Self, P, H, B, W>, ConfigError> {
            Ok(builder.server_honours_keys())
        }
    }

    /// What `body_idle_timeout` does to a builder with these layers around the transport: sets
    /// the duration of the timeout it has, or refuses for one that has none.
    pub trait WatchSlot: Sized {
        /// The builder, with its body idle timeout set to `idle`.
        #[allow(clippy::type_complexity)]
        fn body_idle_timeout<R, M, Z, K, P, H, B>(
            builder: ClientBuilder<R, M, Z, K, P, H, B, Self>,
            idle: Duration,
        ) -> Result<ClientBuilder<R, M, Z, K, P, H, B, Self>, ConfigError>;
    }

    fn no_body_idle<T>() -> Result<T, ConfigError> {
        Err(ConfigError::new(
            "body_idle_timeout",
            "is set, but this client has no body idle timeout (add one with \
             `ClientBuilder::body_idle_timeout`)",
        ))
    }

    impl WatchSlot for Identity {
        fn body_idle_timeout<R, M, Z, K, P, H, B>(
            _: ClientBuilder<R, M, Z, K, P, H, B, Self>,
            _: Duration,
        ) -> Result<ClientBuilder<R, M, Z, K, P, H, B, Self>, ConfigError> {
            no_body_idle()
        }
    }

    impl WatchSlot for WatchTrailersLayer {
        fn body_idle_timeout<R, M, Z, K, P, H, B>(
            _: ClientBuilder<R, M, Z, K, P, H, B, Self>,
            _: Duration,
        ) -> Result<ClientBuilder<R, M, Z, K, P, H, B, Self>, ConfigError> {
            no_body_idle()
        }
    }

    impl<W> WatchSlot for (W, BodyIdleTimeoutLayer) {
        fn body_idle_timeout<R, M, Z, K, P, H, B>(
            builder: ClientBuilder<R, M, Z, K, P, H, B, Self>,
            idle: Duration,
        ) -> Result<ClientBuilder<R, M, Z, K, P, H, B, Self>, ConfigError> {
            Ok(builder.set_body_idle(idle))
        }
    }

    impl KeySlot for Identity {
        fn server_honours_keys<R, M, Z, P, H, B, W>(
            _: ClientBuilder<R, M, Z, Self, P, H, B, W>,
        ) -> Result<ClientBuilder<R, M, Z, Self, P, H, B, W>, ConfigError> {
            Err(ConfigError::new(
                "server_honours_keys",
                "is set, but this client sends no idempotency keys",
            ))
        }
    }
}

use self::slots::{KeySlot, WatchSlot};

impl RetryConfig {
    /// The settings given, on `retry`.
    fn settle<M, Z>(
        &self,
        mut retry: RetryLayerBuilder<M, Z>,
        backoff: Option<Backoff>,
    ) -> RetryLayerBuilder<M, Z> {
        if let Some(n) = self.max_attempts {
            retry = retry.max_attempts(n);
        }
        if let Some(backoff) = backoff {
            retry = retry.backoff(backoff);
        }
        if let Some(max) = self.max_pushback {
            retry = retry.max_pushback(max);
        }
        if let Some(min) = self.min_attempt_time {
            retry = retry.min_attempt_time(min);
        }
        retry
    }
}

impl BackoffConfig {
    /// The backoff, if any field is given.
    fn build(&self) -> Result<Option<Backoff>, ConfigError> {
        if *self == BackoffConfig::default() {
            return Ok(None);
        }
        let mut backoff = Backoff::exponential(self.base.unwrap_or(DEFAULT_BACKOFF_BASE));
        if let Some(max) = self.max {
            backoff = backoff.cap(max);
        }
        if let Some(multiplier) = self.multiplier {
            backoff = backoff.multiplier(multiplier);
        }
        if let Some(jitter) = self.jitter {
            backoff = backoff.jitter(jitter);
        }
        backoff.build().map(Some).map_err(of_field(&[
            ("backoff base delay", "retry.backoff.base"),
            ("backoff multiplier", "retry.backoff.multiplier"),
            ("backoff cap", "retry.backoff.max"),
        ]))
    }
}

/// What a [`BudgetConfig`] makes of the client's budget.
enum Budget {
    Unchanged,
    Removed,
    Given(Arc<dyn RetryBudget>),
}

impl BudgetConfig {
    fn build(&self) -> Result<Budget, ConfigError> {
        let ratio_fields = [
            ("budget.ratio", self.ratio.is_some()),
            ("budget.ttl", self.ttl.is_some()),
            ("budget.min_per_sec", self.min_per_sec.is_some()),
        ];
        let bucket_fields = [
            ("budget.max_tokens", self.max_tokens.is_some()),
            ("budget.token_ratio", self.token_ratio.is_some()),
        ];
        let refuse = |fields: &[(&'static str, bool)], why: &'static str| match fields
            .iter()
            .find(|(_, given)| *given)
        {
            Some((field, _)) => Err(ConfigError::new(field, why)),
            None => Ok(()),
        };
        let kind = match self.kind {
            Some(kind) => kind,
            None if *self == BudgetConfig::default() => return Ok(Budget::Unchanged),
            None => BudgetKind::Ratio,
        };
        match kind {
            BudgetKind::Ratio => {
                refuse(&bucket_fields, "is for a budget of kind \"token_bucket\"")?;
                let mut budget = RatioBudget::builder();
                if let Some(ratio) = self.ratio {
                    budget = budget.ratio(ratio);
                }
                if let Some(ttl) = self.ttl {
                    budget = budget.ttl(ttl);
                }
                if let Some(min) = self.min_per_sec {
                    budget = budget.min_per_sec(min);
                }
                let budget = budget.build().map_err(of_field(&[
                    ("retry budget ratio", "budget.ratio"),
                    ("retry budget ttl", "budget.ttl"),
                    ("retry budget min_per_sec", "budget.min_per_sec"),
                ]))?;
                Ok(Budget::Given(Arc::new(budget)))
            }
            BudgetKind::TokenBucket => {
                refuse(&ratio_fields, "is for a budget of kind \"ratio\"")?;
                let (Some(max_tokens), Some(token_ratio)) = (self.max_tokens, self.token_ratio)
                else {
                    let missing = if self.max_tokens.is_none() {
                        "budget.max_tokens"
                    } else {
                        "budget.token_ratio"
                    };
                    return Err(ConfigError::new(missing, "is needed for a token bucket"));
                };
                let bucket = TokenBucket::builder()
                    .max_tokens(max_tokens)
                    .token_ratio(token_ratio)
                    .build()
                    .map_err(of_field(&[
                        ("retry token bucket max_tokens", "budget.max_tokens"),
                        ("retry token bucket token_ratio", "budget.token_ratio"),
                    ]))?;
                Ok(Budget::Given(Arc::new(bucket)))
            }
            BudgetKind::None => {
                refuse(&ratio_fields, "is for a budget of kind \"ratio\"")?;
                refuse(&bucket_fields, "is for a budget of kind \"token_bucket\"")?;
                Ok(Budget::Removed)
            }
        }
    }
}

impl BreakerConfig {
    /// The breaker, if any field is given.
    fn build(&self) -> Result<Option<CircuitBreaker>, ConfigError> {
        if *self == BreakerConfig::default() {
            return Ok(None);
        }
        let mut b: CircuitBreakerBuilder = CircuitBreaker::builder();
        if let Some(name) = &self.name {
            b = b.name(name.as_str());
        }
        if let Some(ratio) = self.failure_ratio {
            b = b.failure_ratio(ratio);
        }
        if let Some(n) = self.min_throughput {
            b = b.min_throughput(n);
        }
        if let Some(window) = &self.window {
            b = b.window(window.sliding()?);
        }
        if self.slow_call_threshold.is_some() {
            b = b.slow_call_threshold(self.slow_call_threshold);
        }
        if let Some(d) = self.break_duration {
            b = b.break_duration(d);
        }
        if self.break_multiplier.is_some() || self.max_break.is_some() {
            b = b.break_growth(
                self.break_multiplier
                    .unwrap_or(crate::breaker::DEFAULT_BREAK_MULTIPLIER),
                self.max_break.unwrap_or(crate::breaker::DEFAULT_MAX_BREAK),
            );
        }
        if let Some(jitter) = self.jitter {
            b = b.jitter(jitter);
        }
        if let Some(n) = self.half_open_probes {
            b = b.half_open_probes(n);
        }
        if let Some(d) = self.min_timeout_evidence {
            b = b.min_timeout_evidence(d);
        }
        b.build().map(Some).map_err(of_field(&[
            ("breaker failure ratio", "breaker.failure_ratio"),
            ("breaker minimum throughput", "breaker.min_throughput"),
            ("breaker slow-call threshold", "breaker.slow_call_threshold"),
            ("breaker break duration", "breaker.break_duration"),
            ("breaker break multiplier", "breaker.break_multiplier"),
            ("breaker maximum break", "breaker.max_break"),
            ("breaker jitter", "breaker.jitter"),
            ("breaker half-open probes", "breaker.half_open_probes"),
            ("breaker count window", "breaker.window.calls"),
            ("breaker time window buckets", "breaker.window.buckets"),
            ("breaker time window", "breaker.window.length"),
            (
                "breaker minimum timeout evidence",
                "breaker.min_timeout_evidence",
            ),
        ]))
    }
}

impl WindowConfig {
    fn sliding(&self) -> Result<SlidingWindow, ConfigError> {
        match (self.calls, self.length) {
            (Some(_), Some(_)) => Err(ConfigError::new(
                "breaker.window",
                "takes `calls` (a count window) or `length` (a time window), not both",
            )),
            (Some(_), None) if self.buckets.is_some() => Err(ConfigError::new(
                "breaker.window.buckets",
                "is for a time window (`length`), not a count window",
            )),
            (Some(calls), None) => Ok(SlidingWindow::Count(calls)),
            (None, Some(length)) => Ok(SlidingWindow::Time {
                length,
                buckets: self.buckets.unwrap_or(DEFAULT_WINDOW_BUCKETS),
            }),
            (None, None) => Err(ConfigError::new(
                "breaker.window",
                "needs `calls` (a count window) or `length` (a time window)",
            )),
        }
    }
}

impl HedgeConfig {
    /// The settings given, on `hedge`.
    fn settle(&self, mut hedge: HedgeLayerBuilder) -> Result<HedgeLayerBuilder, ConfigError> {
        if let Some(n) = self.max_attempts {
            hedge = hedge.max_attempts(n);
        }
        let learned = self.percentile.is_some()
            || self.fallback.is_some()
            || self.min_samples.is_some()
            || self.window.is_some();
        match self.delay {
            Some(_) if learned => {
                return Err(ConfigError::new(
                    "hedge.delay",
                    "is a fixed delay, which takes no percentile, fallback, min_samples or window",
                ))
            }
            Some(delay) => hedge = hedge.delay(HedgeDelay::fixed(delay)),
            None if learned => {
                let mut delay = match self.percentile {
                    Some(p) => HedgeDelay::percentile(p),
                    None => HedgeDelay::default(),
                };
                if let Some(fallback) = self.fallback {
                    delay = delay.fallback(fallback);
                }
                if let Some(n) = self.min_samples {
                    delay = delay.min_samples(n);
                }
                if let Some(n) = self.window {
                    delay = delay.window(n);
                }
                hedge = hedge.delay(delay);
            }
            None => {}
        }
        if let Some(yes) = self.hedge_idempotent {
            hedge = hedge.hedge_idempotent(yes);
        }
        if let Some(min) = self.min_attempt_time {
            hedge = hedge.min_attempt_time(min);
        }
        Ok(hedge)
    }
}
