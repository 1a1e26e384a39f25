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
//!   [`build_channel`][crate::client::ClientBuilder::build_channel] uses), and never sent to
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

//!
//! [`Semantics`]: crate::Semantics
//! [`Semantics::NonIdempotent`]: crate::Semantics::NonIdempotent
#![cfg_attr(
    not(feature = "tonic"),
    doc = crate::docs::links::to_features!(
        "`GrpcTransport`",
        "`StatusExt`",
        "crate::client::ClientBuilder::build_channel",
    )
)]

pub mod future;
mod layer;
mod service;
#[cfg(feature = "tonic")]
mod status;
#[cfg(feature = "tonic")]
mod transport;

pub use self::layer::{MethodSemanticsLayer, MethodSemanticsLayerBuilder};
pub use self::service::MethodSemantics;
#[cfg(feature = "tonic")]
pub use self::status::StatusExt;
#[cfg(feature = "tonic")]
pub use self::transport::GrpcTransport;
