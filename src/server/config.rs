//! The server's layers configured from a file or the environment (features `server` and
//! `serde`).
//!
//! [`ServerConfig`] is the client's [`ClientConfig`](crate::config::ClientConfig) for the
//! server half, with the same rules: a plain struct that implements serde's `Deserialize`,
//! every field optional (one left out keeps the builder's default), durations as humantime
//! strings (`"300ms"`, `"24h"`), an unknown field refused by name, and a value the builder
//! refuses reported by its field's path (`invalid deadline.min: must be less than the maximum,
//! or every request would be refused`).
//!
//! What only code can say (which callers to trust with retry signals, the tenant of a request,
//! the recovery hook, the recorder) is set on the builder that [`DeadlineConfig::apply`] and
//! [`IdempotencyConfig::apply`] hand back.
//!
//! ```
//! use std::time::Duration;
//! use surely::server::config::ServerConfig;
//! use surely::server::store::MemoryStore;
//! use surely::Envelope;
//!
//! let config: ServerConfig = toml::from_str(r#"
//! [deadline]
//! max = "5s"                     # the server's own budget for a request (default none)
//! min = "20ms"                   # refuse requests that arrive with less (default zero)
//! http_header = "x-request-timeout-ms"
//! malformed = "ignore"           # or "reject", the default
//! problem_base = "https://api.example.com/problems/"  # default: surely's docs
//!
//! [idempotency]
//! lease = "10s"                  # default 30 s
//! renew_for = "10m"              # default: no renewal
//! in_flight_retry_after = "2s"   # default 1 s
//! retention = "24h"              # default 24 h
//! max_body_bytes = 65536         # default 1 MiB
//! max_stored_bytes = 262144      # default 1 MiB
//! store_server_errors = false    # default true
//! require_key_for = ["POST"]     # default none
//! cancel_with_caller = false     # default false
//! problem_base = "https://api.example.com/problems/"  # default: surely's docs
//!
//! [limit]
//! algorithm = "gradient"         # or "aimd"; default gradient
//! initial = 50                   # default 20
//! min = 4                        # default 1
//! max = 500                      # default 1000
//! retry_after = "2s"             # default 1 s
//! problem_base = "https://api.example.com/problems/"  # default: surely's docs
//! tolerance = 2.5                # gradient only; default 2
//! window = 32                    # gradient only; default 16 timed answers
//! sample_every = 4               # gradient only; default: one answer in 8 timed
//!
//! [limit.criticality]            # the share of the limit each level may fill
//! sheddable = 0.7                # default 0.8
//! sheddable_plus = 0.85          # default 0.9
//! critical_plus = 1.2            # default 1.1 (critical is always 1.0)
//! "#).unwrap();
//!
//! let deadline = config
//!     .deadline
//!     .apply(surely::server::deadline::ServerDeadlineLayer::builder())
//!     .unwrap()
//!     .trust_retry_signals(|req: &dyn Envelope| {
//!         req.headers().is_some_and(|h| h.contains_key("x-internal"))
//!     })
//!     .build()
//!     .unwrap();
//! let idempotency = config.idempotency.layer(MemoryStore::new()).unwrap();
//! let limit = config.limit.layer().unwrap();
//! assert_eq!(limit.limit(), 50);
//! # let _ = (deadline, idempotency);
//! ```

use std::time::Duration;

use http::{HeaderName, Method};
use serde::Deserialize;

use crate::config::{duration, of_field};
use crate::server::deadline::{Malformed, ServerDeadlineLayer, ServerDeadlineLayerBuilder};
use crate::server::idempotency::{IdempotencyLayer, IdempotencyLayerBuilder};
use crate::server::limit::{AdaptiveLimitLayer, AdaptiveLimitLayerBuilder, Aimd, Gradient};
use crate::server::store::{IdempotencyStore, MemoryStore};
use crate::{ConfigError, Criticality};

/// The server layers' settings. See the [module docs](self).
///
/// ```
/// use surely::server::config::ServerConfig;
///
/// let config: ServerConfig = serde_yaml_ng::from_str("deadline:\n  max: 2s\n").unwrap();
/// let layer = config.deadline.layer().unwrap();
/// # let _ = layer;
/// ```
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ServerConfig {
    /// The server deadline layer.
    pub deadline: DeadlineConfig,
    /// The idempotency layer.
    pub idempotency: IdempotencyConfig,
    /// The adaptive concurrency limit.
    pub limit: LimitConfig,
}

/// How the [adaptive limit](crate::server::limit) moves: `gradient` or `aimd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LimitAlgorithm {
    /// [`Gradient`]: the default.
    Gradient,
    /// [`Aimd`].
    Aimd,
}

/// The adaptive limit's settings: [`AdaptiveLimitLayerBuilder`]. The gradient's settings
/// (`tolerance`, `smoothing`, `window`, `long_window`, `sample_every`) and AIMD's (`backoff`,
/// `latency_target`) are refused with the other algorithm.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct LimitConfig {
    /// `gradient` (the default) or `aimd`.
    pub algorithm: Option<LimitAlgorithm>,
    /// The limit to start from (default 20).
    pub initial: Option<u32>,
    /// The least the limit may fall to (default 1).
    pub min: Option<u32>,
    /// The most the limit may grow to (default 1000).
    pub max: Option<u32>,
    /// What refusals tell clients to wait (default 1 s).
    #[serde(deserialize_with = "duration")]
    pub retry_after: Option<Duration>,
    /// The share of the limit each criticality may fill.
    pub criticality: CriticalityShares,
    /// Gradient: how much slower than the long run a window may be (default 2).
    pub tolerance: Option<f64>,
    /// Gradient: how far a window moves the limit (default 0.2).
    pub smoothing: Option<f64>,
    /// Gradient: answers per window (default 32).
    pub window: Option<u32>,
    /// Gradient: windows the long-run latency spans (default 600).
    pub long_window: Option<u32>,
    /// Gradient: time one answer in this many (default 8).
    pub sample_every: Option<u32>,
    /// AIMD: what a drop multiplies the limit by (default 0.9).
    pub backoff: Option<f64>,
    /// AIMD: an answer slower than this is a drop (default none).
    #[serde(deserialize_with = "duration")]
    pub latency_target: Option<Duration>,
    /// The base of the refusal's problem `type` URI (default: this crate's docs):
    /// [`AdaptiveLimitLayerBuilder::problem_base`].
    pub problem_base: Option<String>,
}

/// The share of the adaptive limit each [`Criticality`] may fill (`critical` is always the
/// whole limit).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct CriticalityShares {
    /// Default 0.8.
    pub sheddable: Option<f64>,
    /// Default 0.9.
    pub sheddable_plus: Option<f64>,
    /// Default 1.1.
    pub critical_plus: Option<f64>,
}

impl LimitConfig {
    /// An [`AdaptiveLimitLayer`] with this configuration.
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub fn layer(&self) -> Result<AdaptiveLimitLayer, ConfigError> {
        self.apply(AdaptiveLimitLayer::builder())?.build()
    }

    /// Applies this configuration to `builder`, checked, and hands the builder back for what
    /// only code can say (partitions, trusted callers, the recorder).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] whose [setting](ConfigError::setting) is the path of the field that
    /// was refused: `limit.min`, `limit.tolerance`, `limit.criticality`, ...
    pub fn apply(
        &self,
        mut builder: AdaptiveLimitLayerBuilder,
    ) -> Result<AdaptiveLimitLayerBuilder, ConfigError> {
        let gradient_set = self.tolerance.is_some()
            || self.smoothing.is_some()
            || self.window.is_some()
            || self.long_window.is_some()
            || self.sample_every.is_some();
        let aimd_set = self.backoff.is_some() || self.latency_target.is_some();
        match self.algorithm.unwrap_or(LimitAlgorithm::Gradient) {
            LimitAlgorithm::Gradient => {
                if aimd_set {
                    return Err(ConfigError::new(
                        "limit.backoff",
                        "backoff and latency_target apply to algorithm = \"aimd\" only",
                    ));
                }
                let mut g = Gradient::new();
                if let Some(t) = self.tolerance {
                    g = g.tolerance(t);
                }
                if let Some(s) = self.smoothing {
                    g = g.smoothing(s);
                }
                if let Some(w) = self.window {
                    g = g.window(w);
                }
                if let Some(w) = self.long_window {
                    g = g.long_window(w);
                }
                if let Some(n) = self.sample_every {
                    g = g.sample_every(n);
                }
                builder = builder.algorithm(g);
            }
            LimitAlgorithm::Aimd => {
                if gradient_set {
                    return Err(ConfigError::new(
                        "limit.tolerance",
                        "tolerance, smoothing, window, long_window and sample_every apply to algorithm = \"gradient\" only",
                    ));
                }
                let mut a = Aimd::new();
                if let Some(b) = self.backoff {
                    a = a.backoff(b);
                }
                if let Some(t) = self.latency_target {
                    a = a.latency_target(t);
                }
                builder = builder.algorithm(a);
            }
        }
        if let Some(n) = self.initial {
            builder = builder.initial(n);
        }
        if let Some(n) = self.min {
            builder = builder.min(n);
        }
        if let Some(n) = self.max {
            builder = builder.max(n);
        }
        if let Some(d) = self.retry_after {
            builder = builder.retry_after(d);
        }
        if let Some(base) = &self.problem_base {
            builder = builder.problem_base(base.as_str());
        }
        let shares = &self.criticality;
        for (level, share) in [
            (Criticality::Sheddable, shares.sheddable),
            (Criticality::SheddablePlus, shares.sheddable_plus),
            (Criticality::CriticalPlus, shares.critical_plus),
        ] {
            if let Some(share) = share {
                builder = builder.criticality_share(level, share);
            }
        }
        builder.clone().build().map_err(of_field(&[
            ("limit minimum", "limit.min"),
            ("limit maximum", "limit.max"),
            ("initial limit", "limit.initial"),
            ("limit retry-after", "limit.retry_after"),
            ("limit problem base", "limit.problem_base"),
            ("criticality shares", "limit.criticality"),
            ("aimd backoff", "limit.backoff"),
            ("aimd latency target", "limit.latency_target"),
            ("gradient tolerance", "limit.tolerance"),
            ("gradient smoothing", "limit.smoothing"),
            ("gradient window", "limit.window"),
            ("gradient long window", "limit.long_window"),
            ("gradient sampling", "limit.sample_every"),
        ]))?;
        Ok(builder)
    }
}

/// The server deadline layer's settings: [`ServerDeadlineLayerBuilder`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DeadlineConfig {
    /// The server's own budget for a request: applies without a header and caps one (default
    /// none; greater than zero).
    #[serde(deserialize_with = "duration")]
    pub max: Option<Duration>,
    /// Refuse requests that arrive with less budget than this (default zero; less than `max`).
    #[serde(deserialize_with = "duration")]
    pub min: Option<Duration>,
    /// The HTTP header carrying the remaining milliseconds (default `x-request-timeout-ms`).
    pub http_header: Option<String>,
    /// `reject` (the default) or `ignore` a malformed header: [`Malformed`].
    pub malformed: Option<Malformed>,
    /// The base of the refusals' problem `type` URIs (default: this crate's docs):
    /// [`ServerDeadlineLayerBuilder::problem_base`].
    pub problem_base: Option<String>,
}

/// The idempotency layer's settings: [`IdempotencyLayerBuilder`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct IdempotencyConfig {
    /// How long an owner holds its record before another request may take over (default 30 s).
    #[serde(deserialize_with = "duration")]
    pub lease: Option<Duration>,
    /// Renew the owner's lease while its handler runs, for at most this long (default: no
    /// renewal).
    #[serde(deserialize_with = "duration")]
    pub renew_for: Option<Duration>,
    /// The longest `Retry-After` a duplicate gets while the key is in flight (default 1 s).
    #[serde(deserialize_with = "duration")]
    pub in_flight_retry_after: Option<Duration>,
    /// How long a completed record is replayed (default 24 h).
    #[serde(deserialize_with = "duration")]
    pub retention: Option<Duration>,
    /// The largest request body read (default 1 MiB).
    pub max_body_bytes: Option<usize>,
    /// The largest response body stored (default 1 MiB).
    pub max_stored_bytes: Option<usize>,
    /// Whether 5xx responses other than 503 are stored and replayed (default true).
    pub store_server_errors: Option<bool>,
    /// Requests with these methods must carry a key (default none).
    pub require_key_for: Option<Vec<String>>,
    /// `true` drops a keyed request's work when its caller goes away (default false: it
    /// finishes on a task of its own): [`IdempotencyLayerBuilder::cancel_with_caller`].
    pub cancel_with_caller: Option<bool>,
    /// The base of the problem details' `type` URIs, such as
    /// `https://api.example.com/problems/` (default: this crate's docs):
    /// [`IdempotencyLayerBuilder::problem_base`].
    pub problem_base: Option<String>,
}

impl DeadlineConfig {
    /// A [`ServerDeadlineLayer`] with this configuration.
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub fn layer(&self) -> Result<ServerDeadlineLayer, ConfigError> {
        self.apply(ServerDeadlineLayer::builder())?.build()
    }

    /// Applies this configuration to `builder`, checked, and hands the builder back for what
    /// only code can say ([`trust_retry_signals`](ServerDeadlineLayerBuilder::trust_retry_signals)).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] whose [setting](ConfigError::setting) is the path of the field that
    /// was refused: `deadline.max`, `deadline.min`, `deadline.http_header`.
    pub fn apply(
        &self,
        mut builder: ServerDeadlineLayerBuilder,
    ) -> Result<ServerDeadlineLayerBuilder, ConfigError> {
        if let Some(max) = self.max {
            builder = builder.max(max);
        }
        if let Some(min) = self.min {
            builder = builder.min(min);
        }
        if let Some(header) = &self.http_header {
            let header = HeaderName::try_from(header.as_str()).map_err(|_| {
                ConfigError::new("deadline.http_header", "must be a valid HTTP header name")
            })?;
            builder = builder.http_header(header);
        }
        if let Some(malformed) = self.malformed {
            builder = builder.on_malformed(malformed);
        }
        if let Some(base) = &self.problem_base {
            builder = builder.problem_base(base.as_str());
        }
        builder.clone().build().map_err(of_field(&[
            ("server deadline maximum", "deadline.max"),
            ("server deadline minimum", "deadline.min"),
            ("server deadline problem base", "deadline.problem_base"),
        ]))?;
        Ok(builder)
    }
}

impl IdempotencyConfig {
    /// An [`IdempotencyLayer`] over `store` with this configuration.
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub fn layer<St: IdempotencyStore>(
        &self,
        store: St,
    ) -> Result<IdempotencyLayer<St>, ConfigError> {
        self.apply(IdempotencyLayer::builder(store))?.build()
    }

    /// Applies this configuration to `builder`, checked, and hands the builder back for what
    /// only code can say (the tenant, the operation, the recorder, the hooks).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] whose [setting](ConfigError::setting) is the path of the field that
    /// was refused: `idempotency.lease`, `idempotency.retention`, ...
    pub fn apply<St: IdempotencyStore>(
        &self,
        builder: IdempotencyLayerBuilder<St>,
    ) -> Result<IdempotencyLayerBuilder<St>, ConfigError> {
        let required = match &self.require_key_for {
            Some(methods) => Some(
                methods
                    .iter()
                    .map(|m| Method::from_bytes(m.as_bytes()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| {
                        ConfigError::new(
                            "idempotency.require_key_for",
                            "must list HTTP methods, such as \"POST\"",
                        )
                    })?,
            ),
            None => None,
        };
        // Checked on a builder of its own: the caller's store is not built into a layer here.
        self.settle(
            IdempotencyLayer::builder(MemoryStore::new()),
            required.clone(),
        )
        .build()
        .map_err(of_field(&[
            ("idempotency lease", "idempotency.lease"),
            ("idempotency lease renewal", "idempotency.renew_for"),
            ("idempotency retention", "idempotency.retention"),
            (
                "idempotency in-flight retry-after",
                "idempotency.in_flight_retry_after",
            ),
            ("idempotency body limit", "idempotency.max_body_bytes"),
            ("idempotency problem base", "idempotency.problem_base"),
        ]))?;
        Ok(self.settle(builder, required))
    }

    fn settle<St: IdempotencyStore>(
        &self,
        mut b: IdempotencyLayerBuilder<St>,
        required: Option<Vec<Method>>,
    ) -> IdempotencyLayerBuilder<St> {
        if let Some(lease) = self.lease {
            b = b.lease(lease);
        }
        if let Some(max) = self.renew_for {
            b = b.renew_for(max);
        }
        if let Some(max) = self.in_flight_retry_after {
            b = b.in_flight_retry_after(max);
        }
        if let Some(retention) = self.retention {
            b = b.retention(retention);
        }
        if let Some(max) = self.max_body_bytes {
            b = b.max_body_bytes(max);
        }
        if let Some(max) = self.max_stored_bytes {
            b = b.max_stored_bytes(max);
        }
        if let Some(store) = self.store_server_errors {
            b = b.store_server_errors(store);
        }
        if let Some(methods) = required {
            b = b.require_key_for(methods);
        }
        if self.cancel_with_caller == Some(true) {
            b = b.cancel_with_caller();
        }
        if let Some(base) = &self.problem_base {
            b = b.problem_base(base.clone());
        }
        b
    }
}
