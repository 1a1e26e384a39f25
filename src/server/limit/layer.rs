//! The layer and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::algorithm::{Algorithm, Config, Handle, PartitionConfig, Shared};
use super::AdaptiveLimit;
use crate::evidence::{Recorder, RefusalReason};
use crate::server::problem::Problems;
use crate::{ConfigError, Criticality, Envelope};

/// An adaptive concurrency limit for a server: admit as many requests at once as the service
/// can take without queueing, refuse the rest at once and say so.
///
/// Every service this layer makes shares one limit: give the same layer to every connection
/// (hyper makes a service per connection). See the [module docs](super) for what it does and
/// why, and [`AdaptiveLimitLayerBuilder`] for the settings.
///
/// ```
/// use surely::server::limit::AdaptiveLimitLayer;
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limit = AdaptiveLimitLayer::builder().initial(1).max(1).build().unwrap();
/// let handler = service_fn(|_req: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let mut a = limit.layer(handler.clone());
/// let mut b = limit.layer(handler);
///
/// // One request in flight fills a limit of one: the next is refused, not queued.
/// let first = a.ready().await.unwrap().call(http::Request::new(()));
/// let refused = b.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
/// assert_eq!(refused.status(), 503);
/// assert!(refused.headers().contains_key("retry-after"));
/// assert_eq!(refused.headers()["surely-not-processed"], "overload");
/// assert_eq!(first.await.unwrap().status(), 200);
/// assert_eq!(limit.in_flight(), 0);
/// # }
/// ```
#[derive(Clone)]
pub struct AdaptiveLimitLayer {
    pub(crate) shared: Handle,
}

impl AdaptiveLimitLayer {
    /// A limit with the default settings (see [`AdaptiveLimitLayerBuilder`]), assembled as
    /// they are: a test builds the same through [`build`](AdaptiveLimitLayerBuilder::build).
    pub fn new() -> Self {
        AdaptiveLimitLayer {
            shared: Handle::new(Self::builder().config),
        }
    }

    /// A builder, starting from the default settings.
    pub fn builder() -> AdaptiveLimitLayerBuilder {
        AdaptiveLimitLayerBuilder {
            config: Config {
                algorithm: Algorithm::default(),
                initial: 20,
                min: 1,
                max: 1000,
                shares: [800, 900, 1000, 1100],
                partitions: Vec::new(),
                retry_after: Duration::from_secs(1),
                problems: Problems::default(),
                trust: None,
                recorder: None,
            },
            problem_base: None,
        }
    }

    /// The concurrency limit now.
    pub fn limit(&self) -> u32 {
        self.shared.limit()
    }

    /// Requests admitted and not yet answered.
    pub fn in_flight(&self) -> u32 {
        Shared::in_flight(&self.shared)
    }

    /// Requests refused so far, for `reason`.
    pub fn refused(&self, reason: RefusalReason) -> u64 {
        self.shared.refused(reason)
    }

    /// Sends the limit and the requests in flight to the recorder as a
    /// [`Snapshot`](crate::record::LimitEventKind::Snapshot) event, so that gauges follow a
    /// quiet server too: call it from a periodic task. The limit reports its refusals and its
    /// moves by itself.
    pub fn report(&self) {
        Shared::report(&self.shared);
    }
}

impl Default for AdaptiveLimitLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for AdaptiveLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimitLayer")
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .field("algorithm", &self.shared.config.algorithm)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for AdaptiveLimitLayer {
    type Service = AdaptiveLimit<S>;

    fn layer(&self, inner: S) -> AdaptiveLimit<S> {
        AdaptiveLimit::from_handle(inner, self.shared.clone())
    }
}

/// Builds an [`AdaptiveLimitLayer`], validating its settings.
///
/// The defaults: the [`Gradient`](super::Gradient) algorithm, a limit starting at 20 and kept
/// between 1 and 1000, criticality shares of 80 %, 90 %, 100 % and 110 % (from `sheddable`
/// to `critical-plus`), no partitions, `Retry-After: 1` on refusals, no trusted callers, no
/// recorder.
#[derive(Clone)]
#[must_use]
pub struct AdaptiveLimitLayerBuilder {
    config: Config,
    problem_base: Option<String>,
}

impl AdaptiveLimitLayerBuilder {
    /// How the limit moves (default [`Gradient`](super::Gradient)).
    pub fn algorithm(mut self, algorithm: impl Into<Algorithm>) -> Self {
        self.config.algorithm = algorithm.into();
        self
    }

    /// The limit to start from (default 20): between the minimum and the maximum.
    pub fn initial(mut self, limit: u32) -> Self {
        self.config.initial = limit;
        self
    }

    /// The least the limit may fall to (default 1): at least 1.
    pub fn min(mut self, limit: u32) -> Self {
        self.config.min = limit;
        self
    }

    /// The most the limit may grow to (default 1000).
    pub fn max(mut self, limit: u32) -> Self {
        self.config.max = limit;
        self
    }

    /// The share of the limit requests of `criticality` may fill: when that many requests are
    /// in flight, more of this criticality are refused (reason
    /// [`Shed`](RefusalReason::Shed)) while more critical ones still get in. Shares must not
    /// fall as criticality rises, and [`Critical`](Criticality::Critical) must be 1.0 (the
    /// limit itself); [`CriticalPlus`](Criticality::CriticalPlus) may go above it.
    pub fn criticality_share(mut self, criticality: Criticality, share: f64) -> Self {
        let permille = if share.is_finite() && share > 0.0 {
            (share * 1000.0).round().min(1e6) as u64
        } else {
            0
        };
        self.config.shares[criticality.rank()] = permille;
        self
    }

    /// A partition with a reserved `share` of the limit (in `(0, 1]`), for the requests for
    /// which `matches` returns true (the first matching partition wins). While a partition
    /// has fewer requests in flight than its share, its requests are admitted even when the
    /// limit is full: a critical route keeps its capacity when others flood the server. The
    /// shares of all partitions must not add up to more than 1; requests in no partition have
    /// no reserve.
    ///
    /// ```
    /// use surely::server::limit::AdaptiveLimitLayer;
    /// use surely::Envelope;
    ///
    /// let limit = AdaptiveLimitLayer::builder()
    ///     .partition("checkout", 0.4, |req: &dyn Envelope| {
    ///         req.uri().is_some_and(|uri| uri.path().starts_with("/checkout"))
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # let _ = limit;
    /// ```
    pub fn partition<F>(mut self, name: impl Into<Arc<str>>, share: f64, matches: F) -> Self
    where
        F: Fn(&dyn Envelope) -> bool + Send + Sync + 'static,
    {
        self.config.partitions.push(PartitionConfig {
            name: name.into(),
            share,
            matches: Arc::new(matches),
        });
        self
    }

    /// What refusals tell clients to wait before trying again (default 1 s): `Retry-After` in
    /// whole seconds (rounded up) for HTTP, `grpc-retry-pushback-ms` for gRPC. Greater than
    /// zero, at most an hour.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.config.retry_after = wait;
        self
    }

    /// Where the `type` of the refusal's [problem details](crate::server::problem) points: the
    /// base of the service's own documentation of its errors, to which `overloaded` is
    /// appended; refusals then also carry `Link: <type>; rel="describedby"`. By default the type
    /// points at the crate's [problem page](crate::server::problem) and no `Link` is sent.
    /// [`build`](Self::build) refuses a base that is not an absolute URI (`limit problem base`).
    ///
    /// ```
    /// use surely::server::limit::AdaptiveLimitLayer;
    ///
    /// assert!(AdaptiveLimitLayer::builder().problem_base("https://api.example.com/problems/").build().is_ok());
    /// let e = AdaptiveLimitLayer::builder().problem_base("problems").build().unwrap_err();
    /// assert_eq!(e.setting(), "limit problem base");
    /// ```
    pub fn problem_base(mut self, base: impl Into<String>) -> Self {
        self.problem_base = Some(base.into());
        self
    }

    /// Honours the [`CRITICALITY`](crate::headers::CRITICALITY) header of the callers for which
    /// `trusted` returns true, whatever it says. From any other caller the header may lower a
    /// request's criticality (`sheddable`, `sheddable-plus`), never raise it above `critical`:
    /// otherwise any client could jump the queue. A [`Criticality`] extension, set by the host
    /// itself, is always honoured.
    pub fn trust_criticality<F>(mut self, trusted: F) -> Self
    where
        F: Fn(&dyn Envelope) -> bool + Send + Sync + 'static,
    {
        self.config.trust = Some(Arc::new(trusted));
        self
    }

    /// Where the limit's events go: refusals, moves of the limit, and the snapshots of
    /// [`AdaptiveLimitLayer::report`]. See [`LimitEvent`](crate::record::LimitEvent).
    pub fn recorder<R>(mut self, recorder: R) -> Self
    where
        R: Recorder + Send + Sync + 'static,
    {
        // Kept whatever it says now (a `TracingRecorder` is enabled once a subscriber listens,
        // which may be later); each event asks it again.
        self.config.recorder = Some(Arc::new(recorder));
        self
    }

    /// Validates and builds.
    ///
    /// ```
    /// use surely::server::limit::AdaptiveLimitLayer;
    ///
    /// let err = AdaptiveLimitLayer::builder().min(10).max(5).build().unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "invalid limit maximum: must not be less than the minimum"
    /// );
    /// ```
    pub fn build(mut self) -> Result<AdaptiveLimitLayer, ConfigError> {
        self.config.validate()?;
        if let Some(base) = &self.problem_base {
            self.config.problems = Problems::at(base, "limit problem base")?;
        }
        Ok(AdaptiveLimitLayer {
            shared: Handle::new(self.config),
        })
    }
}

impl fmt::Debug for AdaptiveLimitLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("AdaptiveLimitLayerBuilder")
            .field("algorithm", &c.algorithm)
            .field("initial", &c.initial)
            .field("min", &c.min)
            .field("max", &c.max)
            .field(
                "partitions",
                &c.partitions.iter().map(|p| &*p.name).collect::<Vec<_>>(),
            )
            .field("retry_after", &c.retry_after)
            .field("problem_base", &self.problem_base)
            .finish_non_exhaustive()
    }
}
