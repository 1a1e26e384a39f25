//! The names of things: the ids a call, a request and a stored record go by.
//!
//! Vocabulary (see the architecture chapter of the docs): these types are re-exported where
//! users meet them (`record`, `idempotency`, `server::store`), and every layer may use them.

use std::fmt;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod key;
mod key_error;
#[cfg(feature = "server")]
mod record_key;

pub(crate) use self::key::random_u128;
pub(crate) use self::key::validate as validate_key;
pub use self::key::IdempotencyKey;
pub use self::key_error::InvalidKey;
#[cfg(feature = "server")]
pub use self::record_key::{Fence, RecordKey};

/// A logical call's id, unique within the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallId(NonZeroU64);

impl CallId {
    pub(crate) fn next() -> CallId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        // After 2^64 calls the counter wraps to zero; skip it.
        CallId(NonZeroU64::new(id).unwrap_or(NonZeroU64::MIN))
    }

    /// The id as a number.
    pub fn get(self) -> u64 {
        self.0.get()
    }

    /// The id whose number is `raw`, none for 0.
    #[inline]
    pub(crate) fn from_raw(raw: u64) -> Option<CallId> {
        NonZeroU64::new(raw).map(CallId)
    }
}

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call-{}", self.0)
    }
}

/// A business key for the records: what an operator searches by (an order number). Put it in a
/// request's extensions; without it, the records use the `Idempotency-Key` header.
///
/// ```
/// let mut req = http::Request::post("/orders").body(()).unwrap();
/// req.extensions_mut().insert(surely::record::BusinessKey::new("order o-1"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BusinessKey(Arc<str>);

impl BusinessKey {
    /// A business key.
    pub fn new(key: impl Into<Arc<str>>) -> Self {
        BusinessKey(key.into())
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BusinessKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a call did, for its records and its [ledger][crate::ledger] entry: `POST /orders` for an
/// HTTP request (its method and path; the query is left out, as it may carry secrets), or a
/// name of your own. Put one in a request's extensions to name the operation yourself; a
/// request type of your own names it through [`Envelope::operation`](crate::Envelope::operation).
///
/// ```
/// use surely::record::Operation;
///
/// let op = Operation::http(http::Method::POST, "/orders?token=s3cret".parse().unwrap());
/// assert_eq!(op.to_string(), "POST /orders");
/// assert_eq!(Operation::named("reserve-stock").to_string(), "reserve-stock");
/// ```
#[cfg_attr(not(feature = "durable"), doc = crate::docs::links::to_features!("crate::ledger"))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Operation(OperationKind);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum OperationKind {
    Http(http::Method, http::Uri),
    Named(Arc<str>),
}

impl Operation {
    /// An HTTP request's method and target; only the path is shown.
    pub fn http(method: http::Method, uri: http::Uri) -> Self {
        Operation(OperationKind::Http(method, uri))
    }

    /// An operation by name.
    pub fn named(name: impl Into<Arc<str>>) -> Self {
        Operation(OperationKind::Named(name.into()))
    }
}

impl Operation {
    /// What the operation is made of, for the recorders.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn kind(&self) -> &OperationKind {
        &self.0
    }

    /// Records the OpenTelemetry HTTP fields of an HTTP operation on `span` (the query is left
    /// out of `url.full`: it may carry secrets).
    pub(crate) fn record_http(&self, span: &tracing::Span) {
        let OperationKind::Http(method, uri) = &self.0 else {
            return;
        };
        span.record("http.request.method", method.as_str());
        if let Some(host) = uri.host() {
            span.record("server.address", host);
            let port = uri.port_u16().or(match uri.scheme_str() {
                Some("https") => Some(443),
                Some("http") => Some(80),
                _ => None,
            });
            if let Some(port) = port {
                span.record("server.port", port);
            }
            // Host and port only: an authority's user information is a credential.
            let scheme = uri.scheme_str().unwrap_or("http");
            let path = uri.path();
            match uri.port_u16() {
                Some(port) => span.record(
                    "url.full",
                    tracing::field::display(format_args!("{scheme}://{host}:{port}{path}")),
                ),
                None => span.record(
                    "url.full",
                    tracing::field::display(format_args!("{scheme}://{host}{path}")),
                ),
            };
        } else {
            span.record("url.full", uri.path());
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            OperationKind::Http(method, uri) => write!(f, "{method} {}", uri.path()),
            OperationKind::Named(name) => f.write_str(name),
        }
    }
}
