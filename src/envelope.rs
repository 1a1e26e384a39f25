//! What surely needs to see of a request or a response.

use http::{Extensions, HeaderMap, Method, StatusCode};

use crate::ids::Operation;
use crate::time::Deadline;
use crate::Semantics;

use crate::headers::IDEMPOTENCY_KEY;

/// Access to the parts of a message that surely's layers read and write: headers, extensions,
/// method, and the [`Semantics`] and [`Deadline`] derived from them.
///
/// It is implemented for [`http::Request`] and [`http::Response`], which covers hyper, tonic and
/// any HTTP transport, and for plain values a service of your own may answer with (`()`, the
/// integers, `bool`, `char`, `f32`, `f64`, `String`, `&'static str`, `bytes::Bytes`, `Vec<T>`,
/// `Option<T>`). A service with its own request or response type implements it in one line and
/// gets the defaults: no headers, no extensions, no status, [`Semantics::NonIdempotent`] (the
/// cautious choice), and no deadline of its own (the deadline layers then carry the deadline in
/// the [`current`](crate::deadline::current) call context, which costs no allocation):
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
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a `surely::Envelope`: surely's layers cannot read it as a request or a response",
    label = "not an `Envelope`",
    note = "for a type of your own, `impl surely::Envelope for {Self} {{}}` gives the defaults \
            (no headers, no extensions, no status; a request is then non-idempotent: override \
            `semantics` for a read)",
    note = "a type from another crate needs a wrapper of your own; `http::Request`, \
            `http::Response`, `()`, the integers, `String`, `Bytes`, `Vec<T>` and `Option<T>` \
            are envelopes already"
)]
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
    /// predicates route on (a partition of the [adaptive limit][crate::server::limit] for
    /// `/checkout`, say).
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::limit",
        )
    )]
    fn uri(&self) -> Option<&http::Uri> {
        None
    }

    /// The response status, if the message is an HTTP response. The default
    /// [`HttpClassifier`](crate::classify::HttpClassifier) reads it; a response without one is
    /// a success (the service answered).
    fn status(&self) -> Option<StatusCode> {
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

    /// What the request does, for its records and its [ledger][crate::ledger] entry: an
    /// [`Operation`] extension, else none (an [`http::Request`] falls back to its method and
    /// path).
    #[cfg_attr(not(feature = "durable"), doc = crate::docs::links::to_features!("crate::ledger"))]
    fn operation(&self) -> Option<Operation> {
        self.extensions()?.get::<Operation>().cloned()
    }

    /// Whether this message belongs to a gRPC exchange: its `content-type` is `application/grpc`,
    /// optionally followed by `+format` or parameters. gRPC-Web (`application/grpc-web`), whose
    /// trailers travel in the body, is not.
    fn is_grpc(&self) -> bool {
        self.headers()
            .filter(|h| crate::headers::may_hold(h, &http::header::CONTENT_TYPE))
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

    fn status(&self) -> Option<StatusCode> {
        Some(http::Response::status(self))
    }
}

/// A unit message, as a service with nothing to answer returns: no headers, no extensions.
impl Envelope for () {}

/// Plain values as messages, with the defaults: no headers, no extensions (a response then
/// carries no [`CallOutcome`](crate::CallOutcome)). A service that answers with a `u64` or a
/// `String` is a transport as it is: the orphan rule would otherwise make its caller wrap them.
macro_rules! plain_envelope {
    ($($t:ty),* $(,)?) => {
        $(impl Envelope for $t {})*
    };
}

plain_envelope!(
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    String,
    &'static str,
    bytes::Bytes,
);

/// A list of values, as a plain message with the defaults.
impl<T> Envelope for Vec<T> {}

/// A value that may be absent (a lookup's answer), as a plain message with the defaults.
impl<T> Envelope for Option<T> {}
