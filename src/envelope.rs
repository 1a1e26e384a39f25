//! What surely needs to see of a request or a response.

use http::{Extensions, HeaderMap, Method};

use crate::ids::Operation;
use crate::time::Deadline;
use crate::Semantics;

use crate::headers::IDEMPOTENCY_KEY;

/// Access to the parts of a message that surely's layers read and write: headers, extensions,
/// method, and the [`Semantics`] and [`Deadline`] derived from them.
///
/// It is implemented for [`http::Request`] and [`http::Response`], which covers hyper, tonic and
/// any HTTP transport. A service with its own request type implements it in one line and gets
/// the defaults: no headers, no extensions, [`Semantics::NonIdempotent`] (the cautious choice),
/// and no deadline of its own (the deadline layers then carry the deadline in the
/// [`current`](crate::deadline::current) call context, which costs no allocation):
///
/// ```
/// use surely::{Envelope, Semantics};
///
/// struct GetUser(u64);
///
/// impl Envelope for GetUser {
///     fn semantics(&self) -> Semantics {
///         Semantics::Safe
///     }
/// }
///
/// struct CreateUser(String);
/// impl Envelope for CreateUser {}
///
/// assert_eq!(GetUser(7).semantics(), Semantics::Safe);
/// assert_eq!(CreateUser("ann".into()).semantics(), Semantics::NonIdempotent);
/// ```
pub trait Envelope {
    /// The message's headers, if it has any.
    fn headers(&self) -> Option<&HeaderMap> {
        None
    }

    /// The message's headers, mutably, if it has any. Layers write wire headers here
    /// (`grpc-timeout`, the deadline header, the idempotency key).
    fn headers_mut(&mut self) -> Option<&mut HeaderMap> {
        None
    }

    /// The message's extensions, if it has any.
    fn extensions(&self) -> Option<&Extensions> {
        None
    }

    /// The message's extensions, mutably, if it has any. The idempotency key layer puts the
    /// call's key here.
    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        None
    }

    /// The request method, if the message is an HTTP request.
    fn method(&self) -> Option<&Method> {
        None
    }

    /// The request's target, if the message is an HTTP request: what a server layer's
    /// predicates route on (a partition of the [adaptive limit](crate::server::limit) for
    /// `/checkout`, say).
    fn uri(&self) -> Option<&http::Uri> {
        None
    }

    /// The request's retry semantics.
    ///
    /// The default reads a [`Semantics`] extension, then the method and the `Idempotency-Key`
    /// header, and falls back to [`Semantics::NonIdempotent`].
    fn semantics(&self) -> Semantics {
        if let Some(s) = self.extensions().and_then(|e| e.get::<Semantics>()) {
            return *s;
        }
        match self.method().map(Semantics::from_method) {
            Some(Semantics::NonIdempotent) | None => {
                if self
                    .headers()
                    .is_some_and(|h| h.contains_key(IDEMPOTENCY_KEY))
                {
                    Semantics::Keyed
                } else {
                    Semantics::NonIdempotent
                }
            }
            Some(s) => s,
        }
    }

    /// The deadline the caller attached to this message, if any. The default reads a
    /// [`Deadline`] extension.
    ///
    /// Layers combine it with the [`current`](crate::deadline::current) deadline;
    /// the earlier one wins.
    fn deadline(&self) -> Option<Deadline> {
        self.extensions().and_then(|e| e.get::<Deadline>()).copied()
    }

    /// What the request does, for its records and its [ledger](crate::ledger) entry: an
    /// [`Operation`] extension, else none (an [`http::Request`] falls back to its method and
    /// path).
    fn operation(&self) -> Option<Operation> {
        self.extensions()?.get::<Operation>().cloned()
    }

    /// Whether this message belongs to a gRPC exchange: its `content-type` is `application/grpc`,
    /// optionally followed by `+format` or parameters. gRPC-Web (`application/grpc-web`), whose
    /// trailers travel in the body, is not.
    fn is_grpc(&self) -> bool {
        self.headers()
            .and_then(|h| h.get(http::header::CONTENT_TYPE))
            .and_then(|v| v.as_bytes().strip_prefix(b"application/grpc"))
            .is_some_and(|rest| matches!(rest.first(), None | Some(b'+' | b';')))
    }
}

impl<B> Envelope for http::Request<B> {
    fn headers(&self) -> Option<&HeaderMap> {
        Some(http::Request::headers(self))
    }

    fn headers_mut(&mut self) -> Option<&mut HeaderMap> {
        Some(http::Request::headers_mut(self))
    }

    fn extensions(&self) -> Option<&Extensions> {
        Some(http::Request::extensions(self))
    }

    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        Some(http::Request::extensions_mut(self))
    }

    fn method(&self) -> Option<&Method> {
        Some(http::Request::method(self))
    }

    fn uri(&self) -> Option<&http::Uri> {
        Some(http::Request::uri(self))
    }

    fn operation(&self) -> Option<Operation> {
        match http::Request::extensions(self).get::<Operation>() {
            Some(op) => Some(op.clone()),
            None => Some(Operation::http(
                http::Request::method(self).clone(),
                http::Request::uri(self).clone(),
            )),
        }
    }
}

impl<B> Envelope for http::Response<B> {
    fn headers(&self) -> Option<&HeaderMap> {
        Some(http::Response::headers(self))
    }

    fn headers_mut(&mut self) -> Option<&mut HeaderMap> {
        Some(http::Response::headers_mut(self))
    }

    fn extensions(&self) -> Option<&Extensions> {
        Some(http::Response::extensions(self))
    }

    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        Some(http::Response::extensions_mut(self))
    }
}

/// A unit message, as a service with nothing to answer returns: no headers, no extensions.
impl Envelope for () {}
