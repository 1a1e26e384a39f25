//! The server's side of the deadline: read the caller's budget, cap it, refuse a spent one
//! before any handler runs, and make it current for the handler.
//!
//! The budget arrives as a *relative* value (`grpc-timeout`, or a millisecond header written by
//! the client's [`SetDeadlineLayer`](crate::deadline::SetDeadlineLayer)); an inbound header can shorten
//! the server's own budget, never lengthen it. See [`ServerDeadlineLayer`] and the
//! [deadlines chapter](crate::docs::deadlines).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::context::CallTally;
use crate::context::{CallDeadline, Context};
use crate::deadline::codec::{self, ParseTimeoutError};
use crate::deadline::Deadline;
use crate::headers::DEFAULT_HEADER;
use crate::headers::GRPC_TIMEOUT;
use crate::headers::NOT_PROCESSED;
use crate::headers::RETRY_OWNER;
use crate::{ConfigError, Envelope};

mod recheck;

pub use self::recheck::{can_finish, Recheck, RecheckLayer};

/// What the [`ServerDeadlineLayer`] does with a malformed deadline header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum Malformed {
    /// Answer 400 (HTTP) or `INVALID_ARGUMENT` (gRPC) without calling the handler. The default:
    /// a client that sends garbage has a bug worth seeing.
    #[default]
    Reject,
    /// Ignore the header, as if it were absent (the server's own maximum still applies).
    Ignore,
}

/// The server half of deadline propagation.
///
/// For each request it reads the remaining budget the client sent (`grpc-timeout` for gRPC,
/// the configured millisecond header otherwise), caps it by the server's own maximum (an inbound
/// header can shorten the server's budget, never lengthen it), and then:
///
/// * a budget that is spent, or below the configured minimum, is refused at once with 504
///   (HTTP) or `grpc-status: 4` `DEADLINE_EXCEEDED` (gRPC), and the handler is not called; the
///   refusal carries [`NOT_PROCESSED`], so the client's
///   classifier knows nothing happened;
/// * a malformed header is refused with 400 / `INVALID_ARGUMENT`, or ignored, per [`Malformed`];
/// * otherwise the deadline is put in the request's extensions and made the
///   [`current`](crate::deadline::current) deadline while the handler runs, so every client stack the
///   handler calls inherits it.
///
/// A handler served in-process inside a caller's call (same task) never gets more than the
/// caller's current deadline.
///
/// # Who retries: a trust boundary
///
/// A request whose caller retries for itself should not be retried again by the handler's own
/// clients, or retries multiply with every hop. Callers say so in headers: this crate's
/// [`RETRY_OWNER`] marker, and the retry counters other retriers write on the attempts after the
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
struct ServerConfig {
    header: HeaderName,
    max: Option<Duration>,
    min: Duration,
    malformed: Malformed,
    trust: Option<Trust>,
}

/// Which callers' retry signals are honoured.
type Trust = Arc<dyn Fn(&dyn Envelope) -> bool + Send + Sync>;

impl fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerConfig")
            .field("header", &self.header)
            .field("max", &self.max)
            .field("min", &self.min)
            .field("malformed", &self.malformed)
            .field("trusts_retry_signals", &self.trust.is_some())
            .finish()
    }
}

/// Builds a [`ServerDeadlineLayer`], validating its settings.
#[derive(Clone, Debug)]
pub struct ServerDeadlineLayerBuilder {
    config: ServerConfig,
}

impl ServerDeadlineLayer {
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
            },
        }
    }

    /// A builder, starting from [`new`](Self::new)'s settings.
    pub fn builder() -> ServerDeadlineLayerBuilder {
        ServerDeadlineLayerBuilder {
            config: Self::new().config,
        }
    }
}

impl Default for ServerDeadlineLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerDeadlineLayerBuilder {
    /// The HTTP header carrying the remaining milliseconds (default
    /// [`DEFAULT_HEADER`]).
    pub fn http_header(mut self, header: HeaderName) -> Self {
        self.config.header = header;
        self
    }

    /// The server's own budget for a request: applies to requests without a header and caps
    /// those with one. Must be greater than zero.
    pub fn max(mut self, max: Duration) -> Self {
        self.config.max = Some(max);
        self
    }

    /// Refuse requests that arrive with less budget than this (default zero: only a spent
    /// budget is refused). Must be less than the maximum.
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
    /// [`RETRY_OWNER`] marker, `grpc-previous-rpc-attempts` ≥ 1 and `x-envoy-attempt-count` ≥ 2
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

    /// Validates and builds.
    pub fn build(self) -> Result<ServerDeadlineLayer, ConfigError> {
        if let Some(max) = self.config.max {
            if max.is_zero() {
                return Err(ConfigError::new(
                    "server deadline maximum",
                    "must be greater than zero",
                ));
            }
            if self.config.min >= max {
                return Err(ConfigError::new(
                    "server deadline minimum",
                    "must be less than the maximum, or every request would be refused",
                ));
            }
        }
        Ok(ServerDeadlineLayer {
            config: self.config,
        })
    }
}

impl<S> Layer<S> for ServerDeadlineLayer {
    type Service = ServerDeadline<S>;

    fn layer(&self, inner: S) -> ServerDeadline<S> {
        ServerDeadline {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service made by [`ServerDeadlineLayer`].
///
/// # Readiness
///
/// `poll_ready` is the handler's. A refused request does not call the handler.
#[derive(Clone, Debug)]
pub struct ServerDeadline<S> {
    inner: S,
    config: ServerConfig,
}

impl<S> ServerDeadline<S> {
    inner_accessors!();
}

impl<S, B, ResB> Service<Request<B>> for ServerDeadline<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    ResB: Default,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ServerDeadlineFuture<S::Future, ResB>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let now = Instant::now();
        let grpc = req.is_grpc();
        let inbound = match self.inbound_budget(&req, grpc) {
            Ok(budget) => budget,
            Err(_) if self.config.malformed == Malformed::Ignore => None,
            Err(e) => return ServerDeadlineFuture::respond(malformed_response(grpc, &e)),
        };
        let mut budget = match (inbound, self.config.max) {
            (Some(b), Some(max)) => Some(b.min(max)),
            (b, max) => b.or(max),
        };
        // Served in-process, inside a caller's call: never longer than the caller's budget.
        if let Some(outer) = Context::current().deadline() {
            let left = outer.anchor(now).remaining_at(now);
            budget = Some(budget.map_or(left, |b| b.min(left)));
        }
        let deadline = match budget {
            Some(b) if b.is_zero() || b < self.config.min => {
                return ServerDeadlineFuture::respond(exceeded_response(grpc));
            }
            Some(b) => {
                let deadline = Deadline::after_from(now, b);
                req.extensions_mut().insert(deadline);
                Some(deadline)
            }
            None => None,
        };
        // A fresh context: the handler's calls are new logical calls under this deadline.
        let mut ctx = Context::fresh(deadline.map(CallDeadline::At));
        // A trusted caller that retries for itself: the handler's own clients leave retries to
        // it. Anyone else's marker is taken off the request.
        let trusted = self.config.trust.as_ref().is_some_and(|t| t(&req));
        if trusted {
            ctx.set_retry_owned(upstream_retries(req.headers()));
        } else if req.headers().contains_key(RETRY_OWNER) {
            req.headers_mut().remove(RETRY_OWNER);
        }
        let inner = CallTally::isolate(|| ctx.scope(|| self.inner.call(req)));
        ServerDeadlineFuture {
            state: ServerState::Running { inner, ctx },
        }
    }
}

/// Whether a request says that its caller retries it: this crate's marker, or a foreign
/// retrier's counter on an attempt after the first.
fn upstream_retries(headers: &http::HeaderMap) -> bool {
    let counter = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    headers.contains_key(RETRY_OWNER)
        || counter(GRPC_PREVIOUS_RPC_ATTEMPTS_NAME).is_some_and(|n| n >= 1)
        || counter(ENVOY_ATTEMPT_COUNT).is_some_and(|n| n >= 2)
}

/// gRPC's count of the attempts before this one, sent on retries and hedges only.
const GRPC_PREVIOUS_RPC_ATTEMPTS_NAME: &str = "grpc-previous-rpc-attempts";
/// Envoy's attempt number, 1 on the first attempt.
const ENVOY_ATTEMPT_COUNT: &str = "x-envoy-attempt-count";

impl<S> ServerDeadline<S> {
    fn inbound_budget<B>(
        &self,
        req: &Request<B>,
        grpc: bool,
    ) -> Result<Option<Duration>, ParseTimeoutError> {
        let headers = req.headers();
        if grpc {
            headers
                .get(GRPC_TIMEOUT)
                .map(codec::parse_grpc_timeout_header)
                .transpose()
        } else {
            headers
                .get(&self.config.header)
                .map(codec::parse_millis_header)
                .transpose()
        }
    }
}

fn grpc_response<B: Default>(code: &'static str, message: &str) -> Response<B> {
    let mut res = Response::new(B::default());
    let headers = res.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(
        HeaderName::from_static("grpc-status"),
        HeaderValue::from_static(code),
    );
    if let Ok(v) = HeaderValue::from_str(message) {
        headers.insert(HeaderName::from_static("grpc-message"), v);
    }
    res
}

fn exceeded_response<B: Default>(grpc: bool) -> Response<B> {
    let mut res = if grpc {
        grpc_response("4", "deadline exceeded before the handler started")
    } else {
        let mut res = Response::new(B::default());
        *res.status_mut() = StatusCode::GATEWAY_TIMEOUT;
        res
    };
    // The handler never ran: say so, or the client must assume it may have.
    res.headers_mut().insert(
        NOT_PROCESSED,
        HeaderValue::from_static(crate::classify::DEADLINE_REFUSAL),
    );
    res
}

fn malformed_response<B: Default>(grpc: bool, error: &ParseTimeoutError) -> Response<B> {
    if grpc {
        return grpc_response("3", &error.to_string());
    }
    let mut res = Response::new(B::default());
    *res.status_mut() = StatusCode::BAD_REQUEST;
    res
}

/// The future, public in a private module: named by the services' `Future` types only.
mod future {
    use super::*;

    pin_project! {
        /// The future of [`ServerDeadline`].
        pub struct ServerDeadlineFuture<F, B> {
            #[pin]
            pub(super) state: ServerState<F, B>,
        }
    }

    pin_project! {
        #[project = ServerStateProj]
        pub(super) enum ServerState<F, B> {
            Respond { response: Option<Response<B>> },
            Running { #[pin] inner: F, ctx: Context },
            Passing { #[pin] inner: F },
        }
    }

    impl<F, B> ServerDeadlineFuture<F, B> {
        /// The handler's future, polled as it is.
        pub(super) fn running(inner: F) -> Self {
            ServerDeadlineFuture {
                state: ServerState::Passing { inner },
            }
        }

        pub(super) fn respond(response: Response<B>) -> Self {
            ServerDeadlineFuture {
                state: ServerState::Respond {
                    response: Some(response),
                },
            }
        }
    }

    impl<F, B, E> Future for ServerDeadlineFuture<F, B>
    where
        F: Future<Output = Result<Response<B>, E>>,
    {
        type Output = Result<Response<B>, E>;

        fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
            match self.project().state.project() {
                ServerStateProj::Respond { response } => match response.take() {
                    Some(response) => Poll::Ready(Ok(response)),
                    None => Poll::Pending,
                },
                ServerStateProj::Running { inner, ctx } => {
                    CallTally::isolate(|| ctx.scope(|| inner.poll(cx)))
                }
                ServerStateProj::Passing { inner } => inner.poll(cx),
            }
        }
    }

    impl<F, B> fmt::Debug for ServerDeadlineFuture<F, B> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ServerDeadlineFuture")
                .finish_non_exhaustive()
        }
    }
}

use self::future::{ServerDeadlineFuture, ServerState};
