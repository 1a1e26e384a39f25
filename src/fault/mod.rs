//! Fault injection: make a service fail the ways networks fail, on cue, for the crate's own
//! tests and for your chaos tests.
//!
//! Whether a call *happened* is hard to answer only because of a handful of failure shapes.
//! Each needs a different answer from the caller, so each needs its own test:
//!
//! * **Refused before send**: nothing reached the server. Any request may be retried, a POST
//!   included; the call fails cleanly if the retries run out.
//! * **Lost after commit**: the server did the work and the reply never came back (a reset
//!   after the request was written, a gateway timeout). Only a repeatable request (safe,
//!   idempotent, or carrying an idempotency key) may be sent again; a plain POST ends with an
//!   *unknown* outcome, and a keyed one must not commit twice.
//! * **Slow**: the reply comes, late, before or after the effect. Attempt timeouts, the call's
//!   deadline and hedging are about this one.
//! * **Answered, badly**: the server says no (503 with `Retry-After` from an overloaded
//!   upstream, 429, a 502 or 504 from a gateway). The status and the pushback decide.
//!
//! An [`InjectFaultLayer`] wraps the real service (a transport, or a server's handler; in an
//! axum router, [`InjectServerFaultLayer`]: see [below](#inside-an-axum-router)) and, for the
//! requests its [`FaultPolicy`] picks, injects one [`Fault`]. The real service still runs
//! where the fault says so, so "lost after commit" really commits, and a test can check that
//! the order exists while the caller was told nothing:
//!
//! | [`Fault`] | inner service | the caller gets | classified |
//! | --- | --- | --- | --- |
//! | [`RefuseBeforeSend`](Fault::RefuseBeforeSend) | not called | [`InjectedFault`], not sent | rejected |
//! | [`ResetAfterSend`](Fault::ResetAfterSend) | runs to completion, result dropped | [`InjectedFault`], sent | maybe committed |
//! | [`Delay(d)`](Fault::Delay) | runs after `d` | its result | by its result |
//! | [`DelayReply(d)`](Fault::DelayReply) | runs at once, result held `d` | its result, late | by its result |
//! | [`Respond(reply)`](Fault::Respond) | not called | `reply` | by the reply's status |
//! | [`RespondAfterSend(reply)`](Fault::RespondAfterSend) | runs to completion, result dropped | `reply` | by the reply's status |
//!
//! Which requests get a fault is the [`FaultPolicy`]'s choice: a fixed [`Schedule`] by request
//! index, [`Seeded`] random faults with given probabilities, or a closure. A request can also
//! carry its own [`Fault`] in its extensions, which wins over the policy ("inject this into
//! this request"); with `()` as the policy, only such requests get faults.
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//!
//! use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
//! use surely::fault::{Fault, InjectFaultLayer, Schedule};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let orders = Arc::new(AtomicUsize::new(0));
//! let store = orders.clone();
//! // The first request commits, then loses its reply.
//! let mut svc = ServiceBuilder::new()
//!     .layer(InjectFaultLayer::new(Schedule::new().at(0, Fault::ResetAfterSend)))
//!     .service_fn(move |_req: http::Request<()>| {
//!         let store = store.clone();
//!         async move {
//!             store.fetch_add(1, Ordering::SeqCst);
//!             Ok::<_, Infallible>(http::Response::new(String::from("created")))
//!         }
//!     });
//!
//! let post = http::Request::post("/orders").body(()).unwrap();
//! let err = svc.ready().await.unwrap().call(post).await.unwrap_err();
//! // The caller cannot know; the order exists.
//! assert_eq!(err.classify_error(DeliveryPhase::Sent).class(), AttemptClass::MaybeCommitted);
//! assert_eq!(orders.load(Ordering::SeqCst), 1);
//!
//! // One request of our choosing is refused, whatever the schedule says.
//! let mut post = http::Request::post("/orders").body(()).unwrap();
//! post.extensions_mut().insert(Fault::RefuseBeforeSend);
//! let err = svc.ready().await.unwrap().call(post).await.unwrap_err();
//! assert_eq!(err.classify_error(DeliveryPhase::Sent).class(), AttemptClass::Rejected);
//! assert_eq!(orders.load(Ordering::SeqCst), 1);
//!
//! // Everything else passes.
//! let post = http::Request::post("/orders").body(()).unwrap();
//! let res = svc.ready().await.unwrap().call(post).await.unwrap();
//! assert_eq!(res.body(), "created");
//! assert_eq!(orders.load(Ordering::SeqCst), 2);
//! # }
//! ```
//!
//! # Requests and responses
//!
//! Requests are read through [`Envelope`](crate::Envelope), for the [`Fault`] extension: every
//! `http::Request` is one, and a request type of your own becomes one with
//! `impl Envelope for MyRequest {}` (it then has no extensions, and only the policy decides).
//!
//! The [`Respond`](Fault::Respond) faults make up a response. By default ([`EmptyBody`]) that
//! works for any `http::Response<B>` whose body type has a `Default`. For other response types
//! (a non-HTTP service, or a hyper client's `Response<Incoming>`, which cannot be built outside
//! hyper) choose [`NoResponse`] or a closure with [`InjectFaultLayer::responses`]; every other fault
//! works the same.
//!
//! # On the server side
//!
//! Around a hyper server's handler the faults are what the clients see from a misbehaving
//! server. [`ResetAfterSend`](Fault::ResetAfterSend) lets the handler commit, then returns an
//! error to hyper, which closes the connection (HTTP/1) or resets the stream (HTTP/2) without a
//! response: the client sees an incomplete message after the server did the work, which is
//! how a client's idempotency-key handling, or the crate's server-side idempotency layer, is
//! tested end to end.
//!
//! ```
//! use std::convert::Infallible;
//!
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper::body::Incoming;
//! use hyper_util::rt::TokioIo;
//! use hyper_util::service::TowerToHyperService;
//! use surely::fault::{Fault, InjectFaultLayer, Schedule};
//! use tower::ServiceBuilder;
//!
//! async fn handler(_req: http::Request<Incoming>) -> Result<http::Response<Full<Bytes>>, Infallible> {
//!     // ... commit the order ...
//!     Ok(http::Response::new(Full::from("created")))
//! }
//!
//! /// Serves every connection with the same schedule: the second request (on whichever
//! /// connection) commits, then loses its reply.
//! async fn serve(listener: tokio::net::TcpListener) -> std::io::Result<()> {
//!     let faults = Schedule::new().at(1, Fault::ResetAfterSend);
//!     loop {
//!         let (stream, _) = listener.accept().await?;
//!         let svc = ServiceBuilder::new()
//!             .layer(InjectFaultLayer::new(faults.clone()))
//!             .service_fn(handler);
//!         tokio::spawn(
//!             hyper::server::conn::http1::Builder::new()
//!                 .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc)),
//!         );
//!     }
//! }
//! ```
//!
//! Clones of a [`Schedule`] (or of [`Seeded`]) share their state, so the script counts requests
//! across connections.
//!
//! # Inside an axum router
//!
//! An axum `Router` (or any server stack whose services never fail) takes only layers whose
//! error is `Infallible`: an [`InjectFault`]'s error carries the fault, so `Router::layer`
//! refuses it. [`InjectServerFaultLayer`] takes the same policies and answers each fault as a
//! server can instead: a reset lets the handler commit, then breaks its answer's body, which
//! makes the server drop the connection (over HTTP/1 before any byte of the answer); a refusal
//! does not run the handler and answers `503` with
//! [`surely-not-processed`](crate::headers::NOT_PROCESSED), which the crate's client classifies
//! *rejected*; the delays and made-up replies are as above. Its docs say why these two are the
//! honest forms.
//!
//! ```
//! use axum::routing::post;
//! use axum::Router;
//! use http::StatusCode;
//! use surely::fault::{Fault, InjectServerFaultLayer, Seeded};
//! use surely::server::idempotency::IdempotencyLayer;
//! use surely::server::store::MemoryStore;
//!
//! // One request in ten commits its order and loses its answer, one in twenty is refused
//! // unprocessed: the clients' keyed retries must end with one order each.
//! let chaos = Seeded::new(7, [(0.1, Fault::ResetAfterSend), (0.05, Fault::RefuseBeforeSend)])
//!     .unwrap();
//! let keys = IdempotencyLayer::builder(MemoryStore::new()).build().unwrap();
//! let app: Router = Router::new()
//!     .route("/orders", post(|| async { (StatusCode::CREATED, "o-1") }).layer(keys))
//!     .layer(InjectServerFaultLayer::new(chaos));
//! # let _ = app;
//! ```
//!
//! # How it differs from a mock
//!
//! A mock (`tower_test::mock`) replaces the service; a fault layer wraps the real one. The
//! difference is the point for failures after commit: with a mock a test can only pretend the
//! work was done, with [`ResetAfterSend`](Fault::ResetAfterSend) the work is done, and the test
//! can look for its effect.

use std::time::Duration;

pub mod future;
mod layer;
mod policy;
mod reply;
pub mod server;
mod service;

pub use self::layer::InjectFaultLayer;
pub use self::policy::{FaultPolicy, Schedule, Seeded};
pub use self::reply::{EmptyBody, MakeResponse, NoResponse, Reply};
pub use self::server::{FaultBody, InjectServerFault, InjectServerFaultLayer};
pub use self::service::InjectFault;
pub use crate::error::InjectedFault;

/// What to do to one request. No fault (`None` where an `Option<Fault>` is expected) passes the
/// request through untouched.
///
/// A `Fault` in a request's extensions is injected into that request, whatever the policy
/// says. It stays in the extensions: two fault layers on the same stack both inject it, and a
/// retry layer that copies extensions onto each attempt injects it into every attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Fails at once with an [`InjectedFault`] whose phase is
    /// [`NotSent`](crate::classify::DeliveryPhase::NotSent), without calling the inner service: a refused
    /// connection, classified [`Rejected`](crate::classify::AttemptClass::Rejected).
    RefuseBeforeSend,
    /// Calls the inner service and lets its future complete, so the side effect happens; then
    /// drops its response (or error) and fails with an [`InjectedFault`] whose phase is
    /// [`Sent`](crate::classify::DeliveryPhase::Sent): the reply lost after commit, classified
    /// [`MaybeCommitted`](crate::classify::AttemptClass::MaybeCommitted).
    ResetAfterSend,
    /// Waits this long (`tokio::time::sleep`, so paused time in tests), then lets the inner
    /// service's future run and passes its result through: a slow way to the server. A timeout
    /// that fires during the wait drops the request before it ran.
    ///
    /// The inner service's `call` is made at once (it has just been polled ready) and only its
    /// future waits. For the usual lazy futures (hyper-util's client, `async` handlers,
    /// `service_fn`) nothing is done before the wait ends; a service that starts work inside
    /// `call` itself (tower's `Buffer`, and so tonic's `Channel`) sends the request at once, and
    /// only its answer is late. The request's [`Progress`](crate::delivery::Progress) handle,
    /// if it has one, is left alone: it still says [`NotSent`](crate::classify::DeliveryPhase::NotSent) during
    /// the wait, so an attempt timeout that fires then is rightly classified as not sent.
    Delay(Duration),
    /// Lets the inner service's future run at once and complete, then holds its result back
    /// this long: a slow answer after the effect committed. A timeout that fires during the
    /// wait is a timeout after commit; so that an attempt timeout classifies it so even over a
    /// fake transport that marks nothing, the request's [`Progress`](crate::delivery::Progress)
    /// handle, if it has one, is marked [`Sent`](crate::classify::DeliveryPhase::Sent) when the inner service
    /// answers.
    DelayReply(Duration),
    /// Answers with this reply without calling the inner service: an overloaded upstream's
    /// 503 with `Retry-After`, a rate limiter's 429. The response is built by the layer's
    /// [`MakeResponse`]; if it cannot be, the request fails as with
    /// [`RefuseBeforeSend`](Fault::RefuseBeforeSend).
    Respond(Reply),
    /// Calls the inner service and lets its future complete, then drops its response (or
    /// error) and answers with this reply instead: a gateway's 502 or 504 after the upstream
    /// committed. If the layer's [`MakeResponse`] cannot build the reply, the request fails as
    /// with [`ResetAfterSend`](Fault::ResetAfterSend).
    RespondAfterSend(Reply),
}
