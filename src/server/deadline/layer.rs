//! The layer and its builder.

use crate::review::ServerDeadlineSettings;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use tower_layer::Layer;

use super::{Malformed, ServerDeadline};
use crate::headers::DEFAULT_HEADER;
use crate::server::problem::Problems;
use crate::{ConfigError, Envelope};

/// The server half of deadline propagation.
///
/// For each request it reads the remaining budget the client sent (`grpc-timeout` for gRPC,
/// the configured millisecond header otherwise), caps it by the server's own maximum (an inbound
/// header can shorten the server's budget, never lengthen it), and then:
///
/// * a budget that is spent, or below the configured minimum, is refused at once with 504
///   (HTTP) or `grpc-status: 4` `DEADLINE_EXCEEDED` (gRPC), and the handler is not called; the
///   refusal carries [`NOT_PROCESSED`](crate::headers::NOT_PROCESSED), so the client's
///   classifier knows nothing happened;
/// * a malformed header is refused with 400 / `INVALID_ARGUMENT`, or ignored, per [`Malformed`];
/// * otherwise the deadline is put in the request's extensions and made the
///   [`current`](crate::deadline::current) deadline while the handler runs, so every client stack the
///   handler calls inherits it.
///
/// A handler served in-process inside a caller's call (same task) never gets more than the
/// caller's current deadline. An inbound budget over [`MAX_DURATION`](crate::MAX_DURATION)
/// (ten years; the formats can say millions) counts as ten years: no caller waits that long,
/// and a budget read from a peer is only ever shortened, never lengthened.
///
/// # Who retries: a trust boundary
///
/// A request whose caller retries for itself should not be retried again by the handler's own
/// clients, or retries multiply with every hop. Callers say so in headers: this crate's
/// [`RETRY_OWNER`](crate::headers::RETRY_OWNER) marker, and the retry counters other retriers write on the attempts after the
/// first (gRPC's `grpc-previous-rpc-attempts` ≥ 1, Envoy's `x-envoy-attempt-count` ≥ 2). Those
/// headers are claims, and they switch off the service's own retries, so the layer honours them
/// only from callers it was told to trust ([`trust_retry_signals`]: a predicate on the request,
/// such as a peer address, an mTLS identity, or a header your gateway sets). From any other
/// caller the marker is stripped and the counters ignored: the handler's clients retry as they
/// would. Deadlines need no trust: an inbound budget can only shorten the server's own.
///
/// The first attempt of a foreign retrier carries no counter, so the handler's clients may
/// retry it; what bounds that case is their retry budget (10 % of first attempts by default).
///
/// [`trust_retry_signals`]: ServerDeadlineLayerBuilder::trust_retry_signals
///
/// The handler is not cancelled at the deadline: stopping work half done is how effects get
/// lost; the handler's own calls are bounded by the inherited deadline instead.
///
/// ```
/// use std::time::Duration;
/// use surely::server::deadline::ServerDeadlineLayer;
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let handler = service_fn(|_req: http::Request<()>| async {
///     let left = surely::deadline::current().unwrap().remaining();
///     assert!(left <= Duration::from_millis(250));
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let layer = ServerDeadlineLayer::builder().max(Duration::from_secs(10)).build().unwrap();
/// let mut svc = layer.layer(handler);
///
/// let req = http::Request::get("/").header("x-request-timeout-ms", "250").body(()).unwrap();
/// let res = svc.ready().await.unwrap().call(req).await.unwrap();
/// assert_eq!(res.status(), 200);
///
/// let spent = http::Request::get("/").header("x-request-timeout-ms", "0").body(()).unwrap();
/// let res = svc.ready().await.unwrap().call(spent).await.unwrap();
/// assert_eq!(res.status(), 504);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct ServerDeadlineLayer {
    config: ServerConfig,
}

#[derive(Clone)]
pub(super) struct ServerConfig {
    pub(super) header: HeaderName,
    pub(super) max: Option<Duration>,
    pub(super) min: Duration,
    pub(super) malformed: Malformed,
    pub(super) trust: Option<Trust>,
    pub(super) problems: Problems,
}

/// Which callers' retry signals are honoured.
type Trust = Arc<dyn Fn(&dyn Envelope) -> bool + Send + Sync>;

impl ServerConfig {
    fn describe(&self) -> ServerDeadlineSettings {
        ServerDeadlineSettings {
            max: self.max,
            trusts_retry_signals: self.trust.is_some(),
        }
    }
}

impl fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerConfig")
            .field("header", &self.header)
            .field("max", &self.max)
            .field("min", &self.min)
            .field("malformed", &self.malformed)
            .field("trusts_retry_signals", &self.trust.is_some())
            .field("problems", &self.problems)
            .finish()
    }
}

/// Builds a [`ServerDeadlineLayer`], validating its settings.
#[derive(Clone, Debug)]
#[must_use]
pub struct ServerDeadlineLayerBuilder {
    config: ServerConfig,
    problem_base: Option<String>,
}

impl ServerDeadlineLayer {
    /// The layer's settings, for a [review](crate::review) of the service.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::server::deadline::ServerDeadlineLayer;
    ///
    /// let layer = ServerDeadlineLayer::builder().max(Duration::from_secs(5)).build().unwrap();
    /// let settings = layer.describe();
    /// assert_eq!(settings.max, Some(Duration::from_secs(5)));
    /// assert!(!settings.trusts_retry_signals);
    /// ```
    pub fn describe(&self) -> ServerDeadlineSettings {
        self.config.describe()
    }

    /// A layer with the default settings: the default header, no maximum, no minimum, malformed
    /// headers rejected.
    pub fn new() -> Self {
        ServerDeadlineLayer {
            config: ServerConfig {
                header: DEFAULT_HEADER,
                max: None,
                min: Duration::ZERO,
                malformed: Malformed::Reject,
                trust: None,
                problems: Problems::default(),
            },
        }
    }

    /// A builder, starting from [`new`](Self::new)'s settings.
    pub fn builder() -> ServerDeadlineLayerBuilder {
        ServerDeadlineLayerBuilder {
            config: Self::new().config,
            problem_base: None,
        }
    }
}

impl Default for ServerDeadlineLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerDeadlineLayerBuilder {
    /// The layer's settings, for a [review](crate::review) of the service.
    pub fn describe(&self) -> ServerDeadlineSettings {
        self.config.describe()
    }

    /// The HTTP header carrying the remaining milliseconds (default
    /// [`DEFAULT_HEADER`]).
    pub fn http_header(mut self, header: HeaderName) -> Self {
        self.config.header = header;
        self
    }

    /// The server's own budget for a request: applies to requests without a header and caps
    /// those with one. Greater than zero, at most [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn max(mut self, max: Duration) -> Self {
        self.config.max = Some(max);
        self
    }

    /// Refuse requests that arrive with less budget than this (default zero: only a spent
    /// budget is refused). Less than the maximum, at most [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn min(mut self, min: Duration) -> Self {
        self.config.min = min;
        self
    }

    /// What to do with a malformed header (default [`Malformed::Reject`]).
    pub fn on_malformed(mut self, malformed: Malformed) -> Self {
        self.config.malformed = malformed;
        self
    }

    /// Honours the retry signals of the callers for which `trusted` returns true: this crate's
    /// [`RETRY_OWNER`](crate::headers::RETRY_OWNER) marker, `grpc-previous-rpc-attempts` ≥ 1 and `x-envoy-attempt-count` ≥ 2
    /// make the handler's own clients leave retries to the caller (see
    /// [who retries](ServerDeadlineLayer#who-retries-a-trust-boundary)). By default no caller is
    /// trusted: the marker is stripped, the counters ignored.
    ///
    /// Trust the callers inside your own system: a service mesh's sidecar, your gateway (by a
    /// header it sets and strips from outside requests), peers on a private network (by the
    /// address a connector put in the request's extensions), an mTLS identity. Not the public
    /// internet: a caller there could switch off the retries your handler's own calls rely on.
    ///
    /// ```
    /// use surely::server::deadline::ServerDeadlineLayer;
    /// use surely::Envelope;
    ///
    /// // Our gateway sets `x-internal: 1` and strips it from what comes from outside.
    /// let layer = ServerDeadlineLayer::builder()
    ///     .trust_retry_signals(|req: &dyn Envelope| {
    ///         req.headers().is_some_and(|h| h.get("x-internal").is_some_and(|v| v == "1"))
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn trust_retry_signals<F>(mut self, trusted: F) -> Self
    where
        F: Fn(&dyn Envelope) -> bool + Send + Sync + 'static,
    {
        self.config.trust = Some(Arc::new(trusted));
        self
    }

    /// Where the `type` of the layer's [problem details](crate::server::problem) points: the
    /// base of the service's own documentation of its errors, such as
    /// `https://api.example.com/problems/`, to which the problem's name
    /// (`deadline-exceeded`, `deadline-invalid`) is appended. Its refusals then also carry
    /// `Link: <type>; rel="describedby"`. By default the types point at the crate's
    /// [problem page](crate::server::problem) and no `Link` is sent.
    ///
    /// [`build`](Self::build) refuses a base that is not an absolute URI.
    ///
    /// ```
    /// use surely::server::deadline::ServerDeadlineLayer;
    ///
    /// assert!(ServerDeadlineLayer::builder().problem_base("https://api.example.com/problems/").build().is_ok());
    /// let e = ServerDeadlineLayer::builder().problem_base("/problems/").build().unwrap_err();
    /// assert_eq!(e.setting(), "server deadline problem base");
    /// ```
    pub fn problem_base(mut self, base: impl Into<String>) -> Self {
        self.problem_base = Some(base.into());
        self
    }

    /// Validates and builds.
    pub fn build(mut self) -> Result<ServerDeadlineLayer, ConfigError> {
        if let Some(base) = &self.problem_base {
            self.config.problems = Problems::at(base, "server deadline problem base")?;
        }
        if let Some(max) = self.config.max {
            ConfigError::positive_at_most_max("server deadline maximum", max)?;
        }
        ConfigError::at_most_max("server deadline minimum", self.config.min)?;
        if let Some(max) = self.config.max
            && self.config.min >= max
        {
            return Err(ConfigError::new(
                "server deadline minimum",
                "must be less than the maximum, or every request would be refused",
            ));
        }
        Ok(ServerDeadlineLayer {
            config: self.config,
        })
    }
}

impl<S> Layer<S> for ServerDeadlineLayer {
    type Service = ServerDeadline<S>;

    fn layer(&self, inner: S) -> ServerDeadline<S> {
        ServerDeadline::from_config(inner, self.config.clone())
    }
}
