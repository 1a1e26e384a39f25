//! reqwest as the transport: the client stack around a `reqwest::Client` in one call, and
//! reqwest's errors classified (feature `reqwest`).
//!
//! reqwest is the HTTP client most Rust SDKs hold. [`client()`] wraps one in the
//! [`client::http()`](crate::client::http) stack (deadline, idempotency keys, replayable bodies,
//! retries, breaker, records); [`Transport`] is the bare adapter, for a stack configured with
//! [`ClientBuilder`](crate::client::ClientBuilder) or assembled by hand. For a
//! `reqwest_middleware::ClientWithMiddleware`, `middleware::SurelyMiddleware` (feature
//! `reqwest-middleware`) is the same stack as one middleware.
//!
//! ```
//! use std::time::Duration;
//! use surely::{Outcome, OutcomeExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! # let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
//! // The defaults, in one call:
//! let defaults = surely::reqwest::client(reqwest::Client::new());
//! # drop(defaults);
//!
//! // Or configured, around a reqwest client of your own:
//! let http = reqwest::Client::builder()
//!     .connect_timeout(Duration::from_millis(500))
//!     .build()
//!     .unwrap();
//! let client = surely::client::http()
//!     .timeout(Duration::from_secs(2))
//!     .per_try_timeout(Duration::from_millis(800))
//!     .build(surely::reqwest::transport(http))
//!     .unwrap();
//!
//! // Nothing listens at `addr`: every attempt is refused, so even a POST is tried again, and
//! // the call fails for sure: the server never saw it.
//! let order = http::Request::post(format!("http://{addr}/orders")).body("o-1".to_owned()).unwrap();
//! let err = tower::ServiceExt::oneshot(client, order).await.unwrap_err();
//! assert!(err.transport_ref().is_some_and(reqwest::Error::is_connect));
//! assert_eq!(err.outcome(), Outcome::Failed);
//! assert_eq!(err.attempts(), 3);
//! # }
//! ```
//!
//! # Requests and responses
//!
//! Requests are `http::Request<B>`, not `reqwest::Request`, so that every layer of the crate
//! reads them as it reads hyper's: the [`Semantics`](crate::Semantics) come from the method
//! (and an `Idempotency-Key` header or a `Semantics` extension), keys and deadline headers are
//! added as headers, and bodies are buffered by the [`ReplayLayer`](crate::retry::ReplayLayer) so that a retried PUT
//! sends the same bytes. `B` is any `http_body::Body` that is `Send + Sync + 'static`: a `String`,
//! `Full<Bytes>`, a `reqwest::Body`, a stream. The URI must be absolute (`http://host/path`).
//!
//! Responses are `http::Response<reqwest::Body>` (inside the [`client::http()`](crate::client::http)
//! stack, a [`WatchedBody`](crate::record::WatchedBody) of it), carrying the call's outcome
//! ([`OutcomeExt`](crate::OutcomeExt)). To read one as reqwest does (`text()`, `json()`), turn
//! it back into a `reqwest::Response`:
//!
//! ```no_run
//! # async fn read(res: http::Response<surely::record::WatchedBody<reqwest::Body>>) -> reqwest::Result<()> {
//! let res = reqwest::Response::from(res.map(reqwest::Body::wrap));
//! let text = res.text().await?;
//! # let _ = text; Ok(()) }
//! ```
//!
//! # What reqwest's errors mean
//!
//! | reqwest says | class | so |
//! | --- | --- | --- |
//! | `is_builder()`: a relative or malformed URL, a scheme other than http(s) | final, not sent | fails at once, nothing sent |
//! | `is_connect()`: refused, unreachable, a `connect_timeout` | rejected, not sent | retried for every request, even a POST |
//! | a request hyper canceled before writing it (a pooled connection closed first) | rejected, not sent | retried for every request |
//! | `is_timeout()` (reqwest's `timeout` or `read_timeout`), a reset, a body error | maybe committed | retried only if safe, idempotent or keyed; otherwise *unknown* |
//! | `is_redirect()`, `is_decode()`: the response had started | maybe committed | as above |
//!
//! reqwest's own `timeout` covers the connection too, and its error does not say whether the
//! request was written: it is *maybe committed*. Give the reqwest client a `connect_timeout`
//! and a slow connection is provably *not sent*. Prefer the stack's
//! [`per_try_timeout`](crate::client::ClientBuilder::per_try_timeout) to reqwest's `timeout`:
//! it obeys the call's deadline and its record says where it fired.
//!
//! For an attempt timeout to tell "never sent" from "sent", put a [`Progress`] handle in the
//! request's extensions: the transport marks it [`Sent`](crate::classify::DeliveryPhase::Sent)
//! when hyper is about to write the request, once it has a connection. An attempt that timed out
//! while connecting (or waiting for a pooled connection) is then *not sent*, and retried even
//! for a POST. The handle is shared by the call's attempts, so once one attempt was sent, a
//! later timeout counts as sent too: it errs on the side of *maybe committed*. No need to wrap
//! the body in a [`TrackBody`] as for hyper-util: the transport
//! tracks the body itself, and must, since reqwest asks a body for its size before it has a
//! connection.
//!
//! # One retry owner
//!
//! reqwest (0.13) retries by itself only what a server refused before processing (HTTP/2's
//! `REFUSED_STREAM` and graceful `GOAWAY`, with its `http2` feature), and only bodies it can
//! copy, which the transport's are not. Leave its `retry` setting at that default: the stack is
//! the one retry owner, and retries that reqwest made would be invisible to the records and the
//! budget. Redirects that reqwest follows also happen inside one attempt; with
//! `redirect::Policy::none()` the stack sees the 3xx instead.
//!
//! # TLS
//!
//! The feature turns on no reqwest feature beyond its core: enable the TLS backend you use
//! (reqwest 0.13's `rustls` or `native-tls`) on your own `reqwest` dependency; cargo unifies the
//! two.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;

use tower_layer::Layer;
use tower_service::Service;

use crate::classify::{AttemptClass, BoxError, Classification, ClassifyError, DeliveryPhase};
use crate::delivery::{Progress, TrackBody};

use crate::{Error, IntoError};

#[cfg(feature = "reqwest-middleware")]
pub mod middleware;

/// The type of the stack [`client()`] returns, for a struct field: the
/// [`client::http()`](crate::client::http) layers around a [`Transport`]. Named apart from
/// `reqwest::Client`, the transport inside.
///
/// `client::http().build(surely::reqwest::transport(..))` has this type too with any setting
/// that keeps the layers as they are (the deadline, the per-try timeout, the attempts, the
/// backoff, the budget, the breaker's thresholds, whether the server honours keys); a
/// recorder, a hedge, a resolver or a classifier of your own make another type, named
/// [`ClientLayer`](crate::client::ClientLayer)`<..>` as `Layer<Transport>`.
///
/// It is a `tower::Service<http::Request<B>>` for the bodies described in the
/// [module docs](self), with `http::Response<WatchedBody<reqwest::Body>>` responses and
/// [`surely::Error<reqwest::Error>`](crate::Error) errors; `Clone`, `Send` and `Sync`.
///
/// ```
/// use std::time::Duration;
/// use surely::reqwest::ClientStack;
///
/// struct Payments {
///     http: ClientStack,
/// }
///
/// let payments = Payments {
///     http: surely::client::http()
///         .timeout(Duration::from_secs(3))
///         .build(surely::reqwest::transport(reqwest::Client::new()))
///         .unwrap(),
/// };
/// # drop(payments.http);
/// ```
pub type ClientStack = crate::client::HttpClient<Transport>;

/// Wraps `client` in the [`client::http()`](crate::client::http) stack with its defaults: a
/// 10 s budget per call, idempotency keys for POST and PATCH, request bodies buffered up to
/// 64 KiB, 3 attempts with backoff and a retry budget, one circuit breaker, no records.
///
/// To change any of it, build the stack yourself:
/// `surely::client::http().timeout(..).build(surely::reqwest::transport(client))`. See the
/// [module docs](self) for an example.
pub fn client(client: ::reqwest::Client) -> ClientStack {
    // The preset's defaults, assembled without a check: a test builds the same through
    // `build`, which checks (the architecture chapter: defaults are valid by construction).
    crate::client::http()
        .assemble()
        .layer(Transport::new(client))
}

/// The bare adapter around `client`, for [`ClientBuilder::build`](crate::client::ClientBuilder::build)
/// or a `tower::ServiceBuilder`: the same as [`Transport::new`].
pub fn transport(client: ::reqwest::Client) -> Transport {
    Transport::new(client)
}

/// A `reqwest::Client` as a `tower::Service<http::Request<B>>`: converts each request to
/// reqwest's, sends it, and hands the response back as an `http::Response<reqwest::Body>`.
///
/// A request that reqwest cannot take (a relative URI, a scheme other than http(s)) fails with
/// reqwest's builder error, classified final and not sent; nothing panics. If the request
/// carries a [`Progress`] handle, it is marked [`Sent`](DeliveryPhase::Sent) when hyper is
/// about to write the request.
///
/// The transport does not buffer bodies: a retry needs a copy of the request, which
/// [`ReplayLayer`](crate::retry::ReplayLayer) makes possible (the [`client()`] and
/// [`client::http()`](crate::client::http) stacks have one).
///
/// ```
/// use http_body_util::Full;
/// use surely::reqwest::Transport;
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let transport = Transport::new(reqwest::Client::new());
/// // reqwest needs an absolute URL: a typed error, classified final.
/// let req = http::Request::get("/orders/o-1").body(Full::new(bytes::Bytes::new())).unwrap();
/// let err = transport.oneshot(req).await.unwrap_err();
/// assert!(err.is_builder());
/// # }
/// ```
///
/// # Readiness
///
/// Always ready: reqwest queues requests on its own connection pool.
#[derive(Clone)]
pub struct Transport {
    client: ::reqwest::Client,
}

impl Transport {
    /// Wraps `client`.
    pub fn new(client: ::reqwest::Client) -> Self {
        Transport { client }
    }

    /// The reqwest client.
    pub fn get_ref(&self) -> &::reqwest::Client {
        &self.client
    }

    /// The reqwest client, mutably.
    pub fn get_mut(&mut self) -> &mut ::reqwest::Client {
        &mut self.client
    }

    /// Consumes the transport, returning the reqwest client.
    pub fn into_inner(self) -> ::reqwest::Client {
        self.client
    }
}

impl From<::reqwest::Client> for Transport {
    fn from(client: ::reqwest::Client) -> Self {
        Transport::new(client)
    }
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("client", &self.client)
            .finish()
    }
}

impl<B> Service<Request<B>> for Transport
where
    B: Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Response = Response<::reqwest::Body>;
    type Error = ::reqwest::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let state = match to_reqwest(req) {
            Ok(req) => State::Sending {
                send: Service::call(&mut self.client, req),
            },
            Err(error) => State::Refused { error: Some(error) },
        };
        ResponseFuture { state }
    }
}

/// `req` as reqwest's request, its body marking a [`Progress`] handle in its extensions
/// [`Sent`](DeliveryPhase::Sent) when hyper reads it; reqwest's builder error for a URI it cannot
/// take.
pub(crate) fn to_reqwest<B>(req: Request<B>) -> Result<::reqwest::Request, ::reqwest::Error>
where
    B: Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    let progress = req.extensions().get::<Progress>().cloned();
    let req = match progress {
        Some(progress) => {
            req.map(|inner| ::reqwest::Body::wrap(TrackBody::sent_when_read(inner, progress)))
        }
        None => req.map(::reqwest::Body::wrap),
    };
    ::reqwest::Request::try_from(req)
}

/// What reqwest's client returns for one request.
type Sending = <::reqwest::Client as Service<::reqwest::Request>>::Future;

/// The future, public in a private module: named by the service's `Future` type only.
mod future {
    use super::*;

    pin_project! {
        /// The future of [`Transport`].
        pub struct ResponseFuture {
            #[pin]
            pub(super) state: State,
        }
    }

    pin_project! {
        #[project = StateProj]
        pub(super) enum State {
            Sending { #[pin] send: Sending },
            Refused { error: Option<::reqwest::Error> },
        }
    }

    impl Future for ResponseFuture {
        type Output = Result<Response<::reqwest::Body>, ::reqwest::Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match self.project().state.project() {
                StateProj::Sending { send } => {
                    Poll::Ready(ready!(send.poll(cx)).map(Response::from))
                }
                StateProj::Refused { error } => Poll::Ready(Err(error
                    .take()
                    .expect("`ResponseFuture` polled after completion"))),
            }
        }
    }

    impl fmt::Debug for ResponseFuture {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let state = match self.state {
                State::Sending { .. } => "sending",
                State::Refused { .. } => "refused",
            };
            f.debug_struct("ResponseFuture")
                .field("state", &state)
                .finish()
        }
    }
}

use self::future::{ResponseFuture, State};

/// reqwest's error, classified as in the table of the [module docs](self): a builder error is
/// final and not sent, a connect error rejected and not sent, anything else by what it wraps
/// (hyper's and I/O errors as for hyper-util), else by phase: *maybe committed* once sent.
impl ClassifyError for ::reqwest::Error {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        if self.is_builder() {
            return Classification::new(AttemptClass::Final, DeliveryPhase::NotSent);
        }
        let cause = crate::error::cause_in(self).or_else(|| {
            self.is_timeout()
                .then_some(crate::classify::Cause::TimedOut)
        });
        if self.is_connect() {
            return Classification::failure_at(DeliveryPhase::NotSent).with_cause(cause);
        }
        let phase = if self.is_redirect() || self.is_decode() {
            phase.max(DeliveryPhase::ResponseStarted)
        } else {
            phase
        };
        let class = match std::error::Error::source(self) {
            Some(source) => crate::error::error_chain(source, phase),
            None => Classification::failure_at(phase),
        };
        match class.cause() {
            Some(_) => class,
            None => class.with_cause(cause),
        }
    }
}

impl IntoError for ::reqwest::Error {
    type Transport = ::reqwest::Error;

    fn into_error(self) -> Error<::reqwest::Error> {
        Error::transport(self)
    }
}
