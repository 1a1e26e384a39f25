//! hyper-util as the transport: its legacy client made with the body type the
//! [`client::http()`](crate::client::http) stack sends, and names for the result (feature
//! `hyper`).
//!
//! The stack buffers every request body in a [`ReplayBody`] so that a retry sends the same
//! bytes, so the hyper-util client inside must be built for `ReplayBody<B>`, not for `B`:
//! [`transport()`] does that, and [`client()`] wraps it in the stack's defaults. Both results
//! have names, [`Transport`] and [`Client`], for a struct field.
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use std::time::Duration;
//! use surely::{Outcome, OutcomeExt};
//!
//! /// An SDK's client: the stack around hyper-util, held by name.
//! struct Shop {
//!     http: surely::hyper::Client<Full<Bytes>>,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! # let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
//! let shop = Shop { http: surely::hyper::client() };
//! # drop(shop);
//! // Or configured: the same types, other settings.
//! let shop = Shop {
//!     http: surely::client::http()
//!         .timeout(Duration::from_secs(2))
//!         .build(surely::hyper::transport())
//!         .unwrap(),
//! };
//!
//! // Nothing listens at `addr`: every attempt is refused, and the call fails for sure.
//! let order = http::Request::post(format!("http://{addr}/orders"))
//!     .body(Full::new(Bytes::from_static(b"o-1")))
//!     .unwrap();
//! let err = tower::ServiceExt::oneshot(shop.http, order).await.unwrap_err();
//! assert_eq!(err.outcome(), Outcome::Failed);
//! assert_eq!(err.attempts(), 3);
//! # }
//! ```
//!
//! For TLS, build hyper-util's client over your connector (hyper-rustls, hyper-tls) with
//! [`transport_with`], and name it with [`Transport<B, C>`](Transport).
//!
//! # A connect timeout
//!
//! [`transport()`]'s connector has none: a host that never answers the connection holds the
//! attempt until the per-try timeout or the deadline ends it, as *maybe committed*, though
//! nothing was sent. Give the connector one, and such an attempt ends at the connect timeout
//! as *rejected, not sent*: hyper-util reports a connect error (`is_connect()`, its source an
//! `io::Error` of kind `TimedOut`), and every request, a POST without a key included, is
//! retried. See [three phases, three
//! timeouts](crate::docs::deadlines#three-phases-three-timeouts).
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::client::legacy::connect::HttpConnector;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let mut connector = HttpConnector::new();
//! connector.set_connect_timeout(Some(Duration::from_millis(200)));
//! let client: surely::hyper::Client<Full<Bytes>> = surely::client::http()
//!     .per_try_timeout(Duration::from_secs(1))
//!     .build(surely::hyper::transport_with(connector))
//!     .unwrap();
//! # let _ = client;
//! # }
//! ```

use ::hyper_util::client::legacy::connect::HttpConnector;
use ::hyper_util::rt::TokioExecutor;
use tower_layer::Layer;

use crate::classify::BoxError;
use crate::client::HttpClientLayer;
use crate::retry::ReplayBody;

/// hyper-util's legacy client over connector `C` (default: plain HTTP), sending the
/// [`ReplayBody`]s of request bodies `B`: what the [`client::http()`](crate::client::http)
/// stack wraps.
pub type Transport<B, C = HttpConnector> = ::hyper_util::client::legacy::Client<C, ReplayBody<B>>;

/// The [`client::http()`](crate::client::http) stack with its defaults around a
/// [`Transport`]: a `tower::Service<http::Request<B>>` answering
/// `http::Response<WatchedBody<hyper::body::Incoming>>`, with
/// [`surely::Error<hyper_util::client::legacy::Error>`](crate::Error) errors; `Clone`, `Send`
/// and `Sync` when `B` is.
pub type Client<B, C = HttpConnector> = <HttpClientLayer as Layer<Transport<B, C>>>::Service;

/// hyper-util's legacy client over plain HTTP, on tokio, for request bodies `B`. Its connector
/// has no connect timeout: for one, configure an [`HttpConnector`] and pass it to
/// [`transport_with`] (see the [module docs](self#a-connect-timeout)).
pub fn transport<B>() -> Transport<B>
where
    B: http_body::Body + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    transport_with(HttpConnector::new())
}

/// hyper-util's legacy client over `connector` (a TLS connector, a configured
/// [`HttpConnector`]), on tokio, for request bodies `B`.
pub fn transport_with<B, C>(connector: C) -> Transport<B, C>
where
    B: http_body::Body + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
    C: ::hyper_util::client::legacy::connect::Connect + Clone,
{
    ::hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector)
}

/// The [`client::http()`](crate::client::http) stack with its defaults (a 10 s budget per
/// call, keys for POST and PATCH, bodies buffered up to 64 KiB, 3 attempts with backoff and a
/// retry budget, one circuit breaker, no records) around [`transport()`].
pub fn client<B>() -> Client<B>
where
    B: http_body::Body + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    // The preset's defaults, assembled without a check: a test builds the same through
    // `build`, which checks (the architecture chapter: defaults are valid by construction).
    crate::client::http().assemble().layer(transport())
}
