//! gRPC: which methods may be sent twice, and (with the `tonic` feature) a tonic `Channel` as
//! the transport of [`client::grpc()`](crate::client::grpc).
//!
//! # Every gRPC method is a POST
//!
//! On the wire every gRPC call is an HTTP/2 `POST`, so by default the crate treats each one as
//! [`Semantics::NonIdempotent`]: an attempt that was provably not processed (a refused
//! connection, `RESOURCE_EXHAUSTED`, `UNAVAILABLE` with `grpc-retry-pushback-ms` in a
//! trailers-only response) is retried, and one that may have committed (`INTERNAL`, `UNKNOWN`,
//! `DEADLINE_EXCEEDED`, a plain `UNAVAILABLE`, a reset stream) ends the call with an *unknown*
//! outcome: a handler may answer `UNAVAILABLE` after it did its work
//! ([`GrpcCode`](crate::classify::GrpcCode) says why). Only the service's author knows that `GetOrder` is a read
//! and `SetQuantity` is idempotent; say so, and those methods are retried after a lost reply
//! too:
//!
//! * for every call of a method, with a [`MethodSemanticsLayer`] outside the client stack, which
//!   maps full method paths (`/shop.Orders/GetOrder`) or whole services (`shop.Catalog`) to their
//!   [`Semantics`];
//! * for one call, with a [`Semantics`] extension on the request: tonic copies a
//!   `tonic::Request`'s extensions into the HTTP request, so
//!   `request.extensions_mut().insert(Semantics::Idempotent)` is enough. An extension already on
//!   the request wins over the layer.
//!
//! `Semantics::Keyed` needs a server that honours the `Idempotency-Key` header (this crate's
//! server layer in front of the tonic service, for example); a plain gRPC server ignores the
//! header, which is why the [`grpc()`](crate::client::grpc) preset adds no keys of its own.
//!
//! # Statuses: in the head, or in the trailers
//!
//! A gRPC server that fails a call before sending any message answers *trailers-only*:
//! `grpc-status` in the response headers (tonic does so for every error of a unary method). The
//! retry layer and the records classify that status ([`GrpcCode`](crate::classify::GrpcCode)):
//! `UNAVAILABLE` there is retried for a read or an idempotent method (for any method with
//! `grpc-retry-pushback-ms`), `INVALID_ARGUMENT` is final. A status sent in the trailers,
//! after the response headers and some messages (a server stream that fails midway), comes after
//! the retry layer has handed the response to the caller, so it is never retried. The records
//! wait for it: over [`GrpcTransport`] (which [`client::grpc()`](crate::client::grpc) uses), an
//! attempt whose status is in the trailers is recorded when the body ends, from them, and its
//! call right after.
//!
//! # What a tonic caller sees
//!
//! tonic turns the stack's errors into a `tonic::Status`. A transport error keeps tonic's own
//! mapping (a refused connection is `UNAVAILABLE`); the stack's own errors (a spent deadline, an
//! attempt timeout) are unknown to tonic and arrive as `UNKNOWN`, with the
//! [`Error`](crate::Error) as the status's `source()`: downcast it to
//! `surely::Error<tonic::transport::Error>` to ask, say,
//! [`is_deadline_exceeded`](crate::Error::is_deadline_exceeded), or
//! [`outcome`](crate::Error::outcome).
//!
//! The call's outcome reaches a tonic caller too, whichever way the call ends (with the
//! `tonic` feature, [`StatusExt`] reads it: `status.call_outcome()`, `status.outcome()`):
//!
//! * on a reply, as a [`CallOutcome`](crate::CallOutcome) in the `tonic::Response`'s
//!   extensions;
//! * on an error status from the server: tonic makes that `Status` from the response headers
//!   alone and drops the extensions, so the stack also writes the outcome into the headers of
//!   the response it hands back, as `surely-outcome: failed; attempts=1; stop=final; left-ms=1994`
//!   ([`headers::OUTCOME`](crate::headers::OUTCOME)), which tonic keeps in
//!   `Status::metadata()`. Only over [`GrpcTransport`] (the one
//!   [`build_channel`](crate::client::ClientBuilder::build_channel) uses), and never sent to
//!   the server: it is the client's note to its caller. The transport removes any `surely-outcome` a
//!   server sent, in the head or the trailers, so a server cannot forge it;
//! * with the stack's own errors, from the error behind the status, as above.
//!
//! A handler that answers with a downstream call's `Status` passes its metadata on, the
//! outcome of its own call included (see [`StatusExt`] for what its caller then sees).
//!
//! A status in the trailers of a stream that had started carries none: the stack handed the
//! stream back when its head arrived (the reply's outcome says so), and the stream's end is the
//! status's own code to tell; the records wait for it.
//!
//! ```
//! # #[cfg(feature = "tonic")] {
//! use surely::grpc::StatusExt;
//! use surely::{Outcome, StopReason};
//! use tower::{service_fn, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! // A server that turns every call down with INVALID_ARGUMENT, trailers-only, as tonic does.
//! let server = service_fn(|_req: http::Request<tonic::body::Body>| async {
//!     let res = http::Response::builder()
//!         .header("content-type", "application/grpc")
//!         .header("grpc-status", "3")
//!         .body(tonic::body::Body::empty());
//!     Ok::<_, std::io::Error>(res.unwrap())
//! });
//! let stack = surely::client::grpc().build_channel(server).unwrap();
//! let req = http::Request::post("http://shop/shop.Orders/Create")
//!     .header("content-type", "application/grpc")
//!     .body(tonic::body::Body::empty())
//!     .unwrap();
//! let res = stack.oneshot(req).await.unwrap();
//!
//! // What tonic's client makes of that answer, and what its caller reads.
//! let status = tonic::Status::from_header_map(res.headers()).unwrap();
//! assert_eq!(status.code(), tonic::Code::InvalidArgument);
//! let call = status.call_outcome().unwrap();
//! assert_eq!(call.outcome(), Outcome::Failed);
//! assert_eq!((call.attempts(), call.stop_reason()), (1, StopReason::Final));
//! # }
//! # main() }
//! ```
//!
//! ```
//! use surely::grpc::MethodSemanticsLayer;
//! use surely::Semantics;
//! use tower::{service_fn, Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let marks = MethodSemanticsLayer::builder()
//!     .method("/shop.Orders/GetOrder", Semantics::Safe)
//!     .method("/shop.Orders/SetQuantity", Semantics::Idempotent)
//!     .service("shop.Catalog", Semantics::Safe)
//!     .build()
//!     .unwrap();
//! let mut svc = marks.layer(service_fn(|req: http::Request<()>| async move {
//!     Ok::<_, std::convert::Infallible>(req.extensions().get::<Semantics>().copied())
//! }));
//!
//! let get = http::Request::post("http://orders/shop.Orders/GetOrder").body(()).unwrap();
//! assert_eq!(svc.ready().await.unwrap().call(get).await.unwrap(), Some(Semantics::Safe));
//! let create = http::Request::post("http://orders/shop.Orders/CreateOrder").body(()).unwrap();
//! assert_eq!(svc.ready().await.unwrap().call(create).await.unwrap(), None);
//! # }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use tower_layer::Layer;
use tower_service::Service;

use crate::{ConfigError, Semantics};

/// Marks gRPC requests with the [`Semantics`] of their method, by path; see the
/// [module docs](self).
///
/// A request that already carries a [`Semantics`] extension keeps it. A method listed by its
/// full path wins over its service's entry. Requests of methods not listed pass unchanged (and
/// are then [`NonIdempotent`](Semantics::NonIdempotent), as POSTs).
///
/// Place it outside the client stack (outside the retry layer, which reads the mark).
#[derive(Clone, Debug)]
pub struct MethodSemanticsLayer {
    table: Arc<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// Full method paths, `/package.Service/Method`.
    methods: HashMap<String, Semantics>,
    /// Fully qualified service names, `package.Service`.
    services: HashMap<String, Semantics>,
}

impl Table {
    fn lookup(&self, path: &str) -> Option<Semantics> {
        if let Some(s) = self.methods.get(path) {
            return Some(*s);
        }
        if self.services.is_empty() {
            return None;
        }
        let service = path.strip_prefix('/')?.split_once('/')?.0;
        self.services.get(service).copied()
    }
}

impl MethodSemanticsLayer {
    /// A builder with no entries.
    pub fn builder() -> MethodSemanticsLayerBuilder {
        MethodSemanticsLayerBuilder {
            table: Table::default(),
            error: None,
        }
    }

    /// The semantics this layer gives a request for `path` (`/package.Service/Method`), if any.
    ///
    /// ```
    /// use surely::grpc::MethodSemanticsLayer;
    /// use surely::Semantics;
    ///
    /// let marks = MethodSemanticsLayer::builder()
    ///     .service("shop.Catalog", Semantics::Safe)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(marks.semantics_of("/shop.Catalog/List"), Some(Semantics::Safe));
    /// assert_eq!(marks.semantics_of("/shop.Orders/Create"), None);
    /// ```
    pub fn semantics_of(&self, path: &str) -> Option<Semantics> {
        self.table.lookup(path)
    }
}

/// Builds a [`MethodSemanticsLayer`]; [`build`](Self::build) checks the names.
pub struct MethodSemanticsLayerBuilder {
    table: Table,
    error: Option<ConfigError>,
}

impl MethodSemanticsLayerBuilder {
    /// Gives the method at `path` (`/package.Service/Method`, as on the wire) these semantics.
    pub fn method(mut self, path: impl Into<String>, semantics: Semantics) -> Self {
        let path = path.into();
        let valid = path
            .strip_prefix('/')
            .and_then(|rest| rest.split_once('/'))
            .is_some_and(|(service, method)| valid_name(service) && valid_name(method));
        if !valid {
            self.error.get_or_insert(ConfigError::new(
                "gRPC method path",
                "must be `/package.Service/Method`, with a non-empty service and method",
            ));
        }
        self.table.methods.insert(path, semantics);
        self
    }

    /// Gives every method of the service `name` (`package.Service`, without slashes) these
    /// semantics.
    pub fn service(mut self, name: impl Into<String>, semantics: Semantics) -> Self {
        let name = name.into();
        if !valid_name(&name) {
            self.error.get_or_insert(ConfigError::new(
                "gRPC service name",
                "must be a non-empty `package.Service`, without slashes",
            ));
        }
        self.table.services.insert(name, semantics);
        self
    }

    /// The layer, or the first malformed name.
    ///
    /// ```
    /// use surely::grpc::MethodSemanticsLayer;
    /// use surely::Semantics;
    ///
    /// let err = MethodSemanticsLayer::builder()
    ///     .method("GetOrder", Semantics::Safe)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.setting(), "gRPC method path");
    /// ```
    pub fn build(self) -> Result<MethodSemanticsLayer, ConfigError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(MethodSemanticsLayer {
                table: Arc::new(self.table),
            }),
        }
    }
}

impl fmt::Debug for MethodSemanticsLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodSemanticsLayerBuilder")
            .field("methods", &self.table.methods.len())
            .field("services", &self.table.services.len())
            .finish_non_exhaustive()
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && name.bytes().all(|b| b.is_ascii_graphic())
}

impl<S> Layer<S> for MethodSemanticsLayer {
    type Service = MethodSemantics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MethodSemantics {
            inner,
            table: self.table.clone(),
        }
    }
}

/// The service made by [`MethodSemanticsLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's.
#[derive(Clone)]
pub struct MethodSemantics<S> {
    inner: S,
    table: Arc<Table>,
}

impl<S> MethodSemantics<S> {
    inner_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for MethodSemantics<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MethodSemantics")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<Request<B>> for MethodSemantics<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        if req.extensions().get::<Semantics>().is_none() {
            if let Some(s) = self.table.lookup(req.uri().path()) {
                req.extensions_mut().insert(s);
            }
        }
        self.inner.call(req)
    }
}

#[cfg(feature = "tonic")]
pub use self::transport::GrpcTransport;

#[cfg(feature = "tonic")]
mod transport {
    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use http::{Request, Response};
    use pin_project_lite::pin_project;
    use tower_service::Service;

    use crate::classify::BoxError;
    use crate::headers::OUTCOME;
    use crate::outcome::OutcomeInHeaders;
    use crate::record::{watch_response, TrailersBody, WantsTrailers};

    /// A tonic transport (a `tonic::transport::Channel`, or any service over
    /// `http::Request<tonic::body::Body>`) that takes requests with any body, such as the
    /// [`ReplayBody`](crate::retry::ReplayBody) of the [`grpc()`](crate::client::grpc) preset.
    ///
    /// tonic's request body is not `Clone`, so a retried request must be buffered
    /// ([`ReplayLayer`](crate::retry::ReplayLayer), in the preset) and turned back into
    /// tonic's body for the channel, with no other copy. When an attempt record layer above asks
    /// (for a gRPC request, with a recorder enabled), it also watches the response body for its
    /// trailers, so that the records are settled from `grpc-status`, as
    /// [`WatchTrailersLayer`](crate::record::WatchTrailersLayer) does for other transports. Errors
    /// are the transport's own (`tonic::transport::Error` for a `Channel`, which the crate
    /// classifies: a failed connection is "not sent").
    /// [`ClientBuilder::build_channel`](crate::client::ClientBuilder::build_channel) wraps a
    /// channel in it for you.
    ///
    /// # Readiness
    ///
    /// `poll_ready` is the inner service's.
    #[derive(Clone, Debug)]
    pub struct GrpcTransport<S> {
        inner: S,
    }

    impl<S> GrpcTransport<S> {
        /// Wraps a tonic transport.
        pub fn new(inner: S) -> Self {
            GrpcTransport { inner }
        }

        inner_accessors!();
    }

    impl<S, B, RB> Service<Request<B>> for GrpcTransport<S>
    where
        S: Service<Request<tonic::body::Body>, Response = Response<RB>>,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
        RB: http_body::Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        type Response = Response<tonic::body::Body>;
        type Error = S::Error;
        type Future = ResponseFuture<S::Future>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, req: Request<B>) -> Self::Future {
            let watch = req.extensions().get::<WantsTrailers>().is_some();
            ResponseFuture {
                inner: self.inner.call(req.map(tonic::body::Body::new)),
                watch,
            }
        }
    }

    pin_project! {
        /// The future of [`GrpcTransport`].
        pub struct ResponseFuture<F> {
            #[pin]
            inner: F,
            watch: bool,
        }
    }

    impl<F> fmt::Debug for ResponseFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture").finish_non_exhaustive()
        }
    }

    impl<F, RB, E> Future for ResponseFuture<F>
    where
        F: Future<Output = Result<Response<RB>, E>>,
        RB: http_body::Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        type Output = Result<Response<tonic::body::Body>, E>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.project();
            let mut res = std::task::ready!(this.inner.poll(cx))?;
            // The call's outcome is the client stack's to write, never the server's: a value a
            // server sent is removed from the head here, and from the trailers as they pass,
            // and the mark asks the layer that hands the outcome back to write it.
            res.headers_mut().remove(OUTCOME);
            res.extensions_mut().insert(OutcomeInHeaders);
            // When an attempt record above asked, the body's end settles it from the trailers
            // (one more box for the body, one small shared cell); otherwise the body is only
            // given tonic's type.
            let watch = watch_response(*this.watch, &mut res);
            Poll::Ready(Ok(res.map(|body| {
                let body = NoOutcomeTrailers { inner: body };
                match watch {
                    Some(watch) => tonic::body::Body::new(TrailersBody::watched(body, Some(watch))),
                    None => tonic::body::Body::new(body),
                }
            })))
        }
    }

    pin_project! {
        /// A response body whose trailers lose any [`OUTCOME`] a server put there.
        struct NoOutcomeTrailers<B> {
            #[pin]
            inner: B,
        }
    }

    impl<B: http_body::Body> http_body::Body for NoOutcomeTrailers<B> {
        type Data = B::Data;
        type Error = B::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
            let frame = std::task::ready!(self.project().inner.poll_frame(cx));
            Poll::Ready(frame.map(|frame| {
                frame.map(|mut frame| {
                    if let Some(trailers) = frame.trailers_mut() {
                        trailers.remove(OUTCOME);
                    }
                    frame
                })
            }))
        }

        fn is_end_stream(&self) -> bool {
            self.inner.is_end_stream()
        }

        fn size_hint(&self) -> http_body::SizeHint {
            self.inner.size_hint()
        }
    }
}

#[cfg(feature = "tonic")]
pub use self::status::StatusExt;

#[cfg(feature = "tonic")]
mod status {
    use crate::headers::OUTCOME;
    use crate::outcome::metadata;
    use crate::{CallOutcome, Error, Outcome};

    /// Reads the [`CallOutcome`] the client stack handed back to a tonic caller: from a
    /// `tonic::Status`, a `tonic::Response`, or the `Result` of a call; see the
    /// [module docs](crate::grpc#what-a-tonic-caller-sees).
    ///
    /// * A `Status` made from the server's error status (a trailers-only response: tonic's
    ///   answer to every unary error) carries it in its metadata, as the
    ///   [`surely-outcome`](crate::headers::OUTCOME) value the stack wrote on the response.
    ///   What comes back is the outcome the stack decided, but for the budget left (to the
    ///   millisecond) and the key (kept only when it is visible ASCII, as the crate's keys are).
    /// * A `Status` made from the stack's own error (a spent deadline, a refused connection, a
    ///   timed-out attempt) has that error as its `source()`, and the outcome is read from it,
    ///   exactly: a `surely::Error<tonic::transport::Error>`, the error of the stack around a
    ///   tonic `Channel`.
    /// * A `Response` has the outcome in its extensions, exactly (and in its metadata too).
    /// * A `Status` from the trailers of a stream that had started has none: the stack handed
    ///   the response back when its head arrived, and the status came after. So has a `Status`
    ///   that no surely client made.
    ///
    /// The stack over [`GrpcTransport`](super::GrpcTransport) (which
    /// [`build_channel`](crate::client::ClientBuilder::build_channel) uses) removes the
    /// `surely-outcome` key from every response and every trailer it receives before it writes
    /// its own, so a server cannot forge the outcome; without it, the key would be the server's
    /// word.
    ///
    /// A handler that answers its own caller with a downstream call's `Status` (`?` on the
    /// call) passes that status's metadata on, `surely-outcome` included. A caller through the
    /// stack still reads its own call's outcome; a caller without it sees the handler's call's
    /// outcome, idempotency key included. Where that matters, remove it before answering:
    /// `status.metadata_mut().remove("surely-outcome")`.
    ///
    /// ```
    /// use surely::grpc::StatusExt;
    /// use surely::Outcome;
    ///
    /// fn tell_user(status: &tonic::Status) -> &'static str {
    ///     match status.outcome() {
    ///         Outcome::Succeeded => "done",
    ///         Outcome::Failed => "it did not happen; you may try again",
    ///         Outcome::Unknown => "it may have happened; we are checking",
    ///     }
    /// }
    ///
    /// // What the stack leaves in the metadata of a final error's `Status`.
    /// let mut status = tonic::Status::invalid_argument("no such size");
    /// status.metadata_mut().insert("surely-outcome", "failed; attempts=1; stop=final".parse().unwrap());
    /// let call = status.call_outcome().unwrap();
    /// assert_eq!((call.outcome(), call.attempts()), (Outcome::Failed, 1));
    /// assert_eq!(tell_user(&status), "it did not happen; you may try again");
    ///
    /// // A status no surely client made says nothing of the call.
    /// assert_eq!(tonic::Status::internal("lost").call_outcome(), None);
    /// ```
    pub trait StatusExt: sealed::Sealed {
        /// The outcome the client stack handed back, if it did.
        fn call_outcome(&self) -> Option<CallOutcome>;

        /// The call's outcome; [`Unknown`](Outcome::Unknown) when the stack handed none back
        /// (nothing vouches for the call, whatever the status's code).
        fn outcome(&self) -> Outcome {
            self.call_outcome()
                .map_or(Outcome::Unknown, |call| call.outcome())
        }
    }

    impl StatusExt for tonic::Status {
        fn call_outcome(&self) -> Option<CallOutcome> {
            if let Some(value) = self.metadata().as_ref().get(OUTCOME) {
                return metadata::decode(value.as_bytes());
            }
            // The stack's own error around a `Channel`, which tonic keeps as the source.
            let mut source = std::error::Error::source(self);
            while let Some(err) = source {
                if let Some(err) = err.downcast_ref::<Error<tonic::transport::Error>>() {
                    return err.call_outcome().cloned();
                }
                source = err.source();
            }
            None
        }
    }

    impl<T> StatusExt for tonic::Response<T> {
        fn call_outcome(&self) -> Option<CallOutcome> {
            self.extensions().get::<CallOutcome>().cloned()
        }
    }

    impl<T> StatusExt for Result<tonic::Response<T>, tonic::Status> {
        fn call_outcome(&self) -> Option<CallOutcome> {
            match self {
                Ok(res) => res.call_outcome(),
                Err(status) => status.call_outcome(),
            }
        }
    }

    mod sealed {
        pub trait Sealed {}
        impl Sealed for tonic::Status {}
        impl<T> Sealed for tonic::Response<T> {}
        impl<T> Sealed for Result<tonic::Response<T>, tonic::Status> {}
    }
}
