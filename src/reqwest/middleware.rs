//! The client stack as one [`reqwest_middleware::Middleware`] (feature `reqwest-middleware`):
//! for a `ClientWithMiddleware`, in place of reqwest-retry.
//!
//! [`SurelyMiddleware`] sends each request through a surely client stack (the
//! [`client::http()`](crate::client::http) preset by default: a deadline, an idempotency key for
//! POST and PATCH, retries with the crate's classification, backoff, `Retry-After` and a retry
//! budget, one circuit breaker), and every attempt goes down the rest of the middleware chain:
//! the middlewares added after it, then reqwest. What the call came to travels back with the
//! answer:
//!
//! * on the response, as a [`CallOutcome`] in its extensions, read with [`OutcomeExt`]
//!   (`res.outcome()`);
//! * on the error, which is `reqwest_middleware::Error::Middleware` around the stack's
//!   [`surely::Error`](crate::Error): `err.outcome()` through the same trait,
//!   [`surely_error`] for the rest (how many attempts, why it stopped, reqwest's own error);
//! * in the call's extensions, for a caller of `execute_with_extensions`, either way.
//!
//! ```
//! use surely::reqwest::middleware::SurelyMiddleware;
//! use surely::{Outcome, OutcomeExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(SurelyMiddleware::new())
//!     .build();
//!
//! // Nothing listens there: every attempt is refused, so even a POST is tried again, and the
//! // call failed for sure: the server never saw it.
//! let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
//! let err = client.post(format!("http://{addr}/orders")).body("o-1").send().await.unwrap_err();
//! assert_eq!((err.outcome(), err.attempts()), (Outcome::Failed, 3));
//! assert!(err.to_string().starts_with("failed after 3 attempts (connection refused, not sent): "));
//! let surely = surely::reqwest::middleware::surely_error(&err).unwrap();
//! assert_eq!(surely.attempts(), 3);
//! assert!(surely.transport_ref().is_some_and(|e| e.is_connect()));
//! # }
//! ```
//!
//! The error's message is the stack's (`reqwest_middleware::Error` shows it as it is): it names
//! what ended the last attempt and how far it got, `failed after 3 attempts (connection refused,
//! not sent): error sending request for url (...)`.
//!
//! The outcome is decided when the response's head arrives: `Succeeded` says the server
//! answered. A body that then breaks off while it is read (`res.json().await` fails) is a reply
//! lost after the server acted: for a write, treat it as `Unknown`, as the stack would have.
//!
//! # Configuring the stack
//!
//! [`SurelyMiddleware::configure`] hands a closure the preset and takes it back with any
//! [`ClientBuilder`] setting (a per-try timeout, a recorder, a
//! breaker shared with other clients, hedges); the middleware builds and checks it:
//!
//! ```
//! use std::time::Duration;
//! use surely::reqwest::middleware::SurelyMiddleware;
//!
//! let middleware = SurelyMiddleware::configure(|stack| {
//!     stack
//!         .timeout(Duration::from_secs(3))
//!         .per_try_timeout(Duration::from_millis(800))
//! })
//! .unwrap();
//! # drop(middleware);
//! ```
//!
//! Two settings are decisions about the API called, which the crate cannot make: whether its
//! server honours `Idempotency-Key`
//! ([`server_honours_keys()`](crate::client::ClientBuilder::server_honours_keys): then a POST
//! whose reply was lost is sent again with the same key; without it, the POST ends `Unknown`),
//! and, for a third-party API,
//! [`no_internal_headers()`](crate::client::ClientBuilder::no_internal_headers) (none of the
//! crate's own headers, the retry-owner marker and the deadline header, go out).
//!
//! [`SurelyMiddleware::with_stack`] takes a whole stack built around the [`Attempts`]
//! transport instead, for one assembled elsewhere.
//!
//! # Request bodies
//!
//! A body reqwest holds as bytes (a `String`, a `Vec<u8>`, `json()`, `form()`) is sent again,
//! the same bytes, on every attempt, whatever its size. A body that reqwest cannot clone (a
//! stream: `Body::wrap_stream`, `Body::wrap`, a file) is **sent once**: the call has one
//! attempt, and if that attempt could have been retried its [`StopReason`] says
//! [`NotReplayable`](StopReason::NotReplayable). reqwest's `Request::try_clone` draws the same
//! line.
//!
//! # Extensions, and where the middleware goes
//!
//! The extensions of the call (`RequestBuilder::with_extension`) reach the stack: mark a request
//! with a [`Semantics`](crate::Semantics) (say, `Semantics::Idempotent` for a POST that may be
//! sent twice), give it a [`Deadline`](crate::time::Deadline), an
//! [`IdempotencyKey`](crate::idempotency::IdempotencyKey) or a
//! [`Progress`](crate::delivery::Progress) handle there. Each attempt goes down the chain with
//! a copy of them; what a middleware further down writes into its copy stays with that attempt.
//!
//! Add `SurelyMiddleware` first, so that the middlewares after it (auth, tracing) run once per
//! attempt, and keep it the one retry owner: no reqwest-retry beside it, and reqwest's own
//! `retry` setting at its default (see [the module above](super#one-retry-owner)).
//!
//! # How `Next` serves as the transport
//!
//! A surely stack is a `tower::Service` that owns its transport, and `Next<'_>` is borrowed
//! for one call. So the stack, built once, is `'static` and its transport, [`Attempts`], only
//! posts each attempt back to the call that made it: `handle` runs the stack's future and, in
//! the same task, every attempt the stack posts, each through a copy of `next`. An attempt the
//! stack gives up on (its timeout fired, a hedge won) is dropped with it. The circuit breaker
//! and the retry budget belong to the stack, so every call through one `SurelyMiddleware` (and
//! its clones) shares them.

use std::collections::VecDeque;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Extensions, Request, Response};
use http_body::Body;
use reqwest_middleware::{Middleware, Next};
use tokio::sync::{mpsc, oneshot};
use tower_layer::{Identity, Layer};
use tower_service::Service;

use crate::breaker::CircuitBreaker;
use crate::classify::HttpClassifier;
use crate::classify::{BoxError, Classification, ClassifyError, DeliveryPhase};
use crate::client::{BreakerPart, ClientBuilder, ClientLayer, NoRecords, Part, RecorderPart, Slot};
use crate::idempotency::SetIdempotencyKeyLayer;
use crate::outcome::sealed::Sealed;
use crate::record::WatchTrailersLayer;
use crate::retry::{NoResolver, NotReplayable, ReplayBody};
use crate::review::ClientSettings;
use crate::{CallOutcome, ConfigError, IntoError, Outcome, OutcomeExt, StopReason};

/// The error of a stack built around [`Attempts`]: the crate's [`Error`](crate::Error) around
/// the chain's.
pub type Error = crate::Error<reqwest_middleware::Error>;

/// The builder [`SurelyMiddleware::configure`] hands its closure: the
/// [`client::http()`](crate::client::http) preset without its body buffer.
pub type Preset = ClientBuilder<
    NoRecords,
    HttpClassifier,
    NoResolver,
    SetIdempotencyKeyLayer,
    Identity,
    Identity,
    CircuitBreaker,
    WatchTrailersLayer,
>;

/// The request a stack built around [`Attempts`] takes: reqwest's, with its body as bytes that
/// every attempt sends again, or as a stream sent once.
pub type StackRequest = Request<ReplayBody<::reqwest::Body>>;

/// One attempt posted to the call that made it, and where its answer goes.
type Posted = (
    ::reqwest::Request,
    oneshot::Sender<reqwest_middleware::Result<::reqwest::Response>>,
);

/// The call's end of the attempts' mailbox, in the stack request's extensions.
#[derive(Clone)]
struct Mailbox(mpsc::UnboundedSender<Posted>);

/// A boxed future, as reqwest-middleware's own.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The stack, erased: one call.
type Stack = dyn Fn(StackRequest) -> BoxFuture<'static, Result<Response<::reqwest::Body>, Error>>
    + Send
    + Sync;

/// A surely client stack as a [`reqwest_middleware::Middleware`]; see the [module docs](self).
///
/// `Clone`: clones share the stack, and so its circuit breaker and retry budget.
#[derive(Clone)]
pub struct SurelyMiddleware {
    stack: Arc<Stack>,
    /// The stack's settings, when the middleware built it from the preset.
    settings: Option<Arc<ClientSettings>>,
}

impl SurelyMiddleware {
    /// The [`client::http()`](crate::client::http) preset with its defaults: a 10 s budget per
    /// call, idempotency keys for POST and PATCH, 3 attempts with backoff and a retry budget,
    /// one circuit breaker, no records.
    ///
    /// Never fails: the preset's defaults are assembled as they are (a test builds the same
    /// stack through [`with_stack`](Self::with_stack), which checks it).
    ///
    /// ```
    /// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
    ///     .with(surely::reqwest::middleware::SurelyMiddleware::new())
    ///     .build();
    /// # drop(client);
    /// ```
    pub fn new() -> Self {
        let preset = crate::client::http().no_replay();
        let settings = preset.describe();
        let stack = preset.assemble();
        Self::from_stack(stack.layer(Attempts { _private: () })).described(settings)
    }

    /// The stack's effective settings, for a [review](crate::review) of the service: those of
    /// [`new`](Self::new) and [`configure`](Self::configure), which build the stack from the
    /// preset; `None` after [`with_stack`](Self::with_stack), whose stack the middleware did
    /// not build (describe its builder there).
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::reqwest::middleware::SurelyMiddleware;
    ///
    /// let middleware = SurelyMiddleware::configure(|stack| stack.timeout(Duration::from_secs(3))).unwrap();
    /// let settings = middleware.describe().unwrap();
    /// assert_eq!(settings.timeout, Some(Duration::from_secs(3)));
    /// assert!(!settings.replays_bodies);
    /// ```
    pub fn describe(&self) -> Option<&ClientSettings> {
        self.settings.as_deref()
    }

    fn described(mut self, settings: ClientSettings) -> Self {
        self.settings = Some(Arc::new(settings));
        self
    }

    /// The stack `make` builds around the [`Attempts`] transport: any client stack whose
    /// requests are [`StackRequest`]s and whose error is [`Error`], such as
    /// `surely::client::http().no_replay()` with settings of your own (the body buffer that
    /// `no_replay()` leaves out works too, and copies the bytes once more).
    /// [`configure`](Self::configure) starts from that preset for you. See the
    /// [module docs](self#configuring-the-stack).
    ///
    /// ```
    /// use surely::record::InMemoryRecorder;
    /// use surely::reqwest::middleware::SurelyMiddleware;
    ///
    /// let recorder = InMemoryRecorder::new();
    /// let middleware = SurelyMiddleware::with_stack(|attempts| {
    ///     surely::client::http().no_replay().recorder(recorder.clone()).build(attempts)
    /// })
    /// .unwrap();
    /// # drop(middleware);
    /// ```
    pub fn with_stack<S, B>(
        make: impl FnOnce(Attempts) -> Result<S, ConfigError>,
    ) -> Result<Self, ConfigError>
    where
        S: Service<StackRequest, Response = Response<B>, Error = Error>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        B: Body + Send + Sync + 'static,
        B::Data: Into<Bytes>,
        B::Error: Into<BoxError>,
    {
        Ok(Self::from_stack(make(Attempts { _private: () })?))
    }

    /// The [`client::http()`](crate::client::http) stack as `configure` sets it up: the
    /// closure gets the preset (without its body buffer, which the middleware does not need:
    /// see [Request bodies](self#request-bodies)) and returns it with settings of its own; the
    /// middleware builds it and checks every setting.
    ///
    /// The decisions a caller of someone else's API makes are two lines:
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::reqwest::middleware::SurelyMiddleware;
    ///
    /// let middleware = SurelyMiddleware::configure(|stack| {
    ///     stack
    ///         .timeout(Duration::from_secs(3))
    ///         .per_try_timeout(Duration::from_millis(800))
    ///         // The payments API documents `Idempotency-Key`: a POST whose reply was lost is
    ///         // sent again with the same key. Without this line it ends `Unknown`.
    ///         .server_honours_keys()
    ///         // Someone else's API: none of the crate's own headers (the retry-owner marker,
    ///         // the deadline header) go out.
    ///         .no_internal_headers()
    /// })
    /// .unwrap();
    /// # drop(middleware);
    /// ```
    ///
    /// A setting out of range is the error `build` gives:
    ///
    /// ```
    /// # use surely::reqwest::middleware::SurelyMiddleware;
    /// let err = SurelyMiddleware::configure(|stack| stack.timeout(std::time::Duration::ZERO))
    ///     .unwrap_err();
    /// assert_eq!(err.to_string(), "invalid deadline timeout: must be greater than zero");
    /// ```
    #[allow(clippy::type_complexity)]
    pub fn configure<R, M, Z, K, P, H, Br, W, S, B>(
        settings: impl FnOnce(Preset) -> ClientBuilder<R, M, Z, K, P, H, Br, W>,
    ) -> Result<Self, ConfigError>
    where
        M: Clone,
        R: RecorderPart<M>,
        H: Part<M> + Slot,
        Br: BreakerPart<M, H> + Slot,
        K: Slot,
        P: Slot,
        ClientLayer<R, M, Z, K, P, H, Br, W>: Layer<Attempts, Service = S>,
        S: Service<StackRequest, Response = Response<B>, Error = Error>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        B: Body + Send + Sync + 'static,
        B::Data: Into<Bytes>,
        B::Error: Into<BoxError>,
    {
        let builder = settings(crate::client::http().no_replay());
        let described = builder.describe();
        Self::with_stack(|attempts| builder.build(attempts)).map(|m| m.described(described))
    }

    /// The middleware around `stack`.
    fn from_stack<S, B>(stack: S) -> Self
    where
        S: Service<StackRequest, Response = Response<B>, Error = Error>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        B: Body + Send + Sync + 'static,
        B::Data: Into<Bytes>,
        B::Error: Into<BoxError>,
    {
        let stack = move |req: StackRequest| -> BoxFuture<'static, _> {
            let mut stack = stack.clone();
            Box::pin(async move {
                poll_fn(|cx| stack.poll_ready(cx)).await?;
                let res = stack.call(req).await?;
                Ok(res.map(::reqwest::Body::wrap))
            })
        };
        SurelyMiddleware {
            stack: Arc::new(stack),
            settings: None,
        }
    }
}

impl Default for SurelyMiddleware {
    /// [`SurelyMiddleware::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SurelyMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SurelyMiddleware").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Middleware for SurelyMiddleware {
    async fn handle(
        &self,
        req: ::reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<::reqwest::Response> {
        let (mailbox, mut posted) = mpsc::unbounded_channel();
        let req = match stack_request(req, extensions, Mailbox(mailbox)) {
            Ok(req) => req,
            Err(e) => {
                // Nothing went out: the call failed, before any attempt.
                let mut err = Error::transport(reqwest_middleware::Error::Reqwest(e));
                err.set_call_outcome(CallOutcome::refused(StopReason::Final, None));
                return Err(into_middleware_error(err, extensions));
            }
        };
        let mut call = (self.stack)(req);
        let mut running: Vec<BoxFuture<'_, ()>> = Vec::new();
        let out = poll_fn(|cx| loop {
            if let Poll::Ready(out) = call.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            while let Poll::Ready(Some(attempt)) = posted.poll_recv(cx) {
                running.push(run(next.clone(), extensions.clone(), attempt));
            }
            let before = running.len();
            running.retain_mut(|attempt| attempt.as_mut().poll(cx).is_pending());
            if running.len() == before {
                return Poll::Pending;
            }
            // An attempt ended: the stack has its answer.
        })
        .await;
        drop(running);
        match out {
            Ok(res) => {
                if let Some(outcome) = res.call_outcome() {
                    extensions.insert(outcome.clone());
                }
                Ok(::reqwest::Response::from(res))
            }
            Err(err) => Err(into_middleware_error(err, extensions)),
        }
    }
}

/// The stack's error as the chain's, its outcome also in the call's extensions.
fn into_middleware_error(err: Error, extensions: &mut Extensions) -> reqwest_middleware::Error {
    if let Some(outcome) = err.call_outcome() {
        extensions.insert(outcome.clone());
    }
    reqwest_middleware::Error::middleware(err)
}

/// One attempt down the chain, with its own copy of the call's extensions; dropped unanswered
/// when the stack stops waiting for it.
fn run<'a>(
    next: Next<'a>,
    mut extensions: Extensions,
    (req, mut reply): Posted,
) -> BoxFuture<'a, ()> {
    Box::pin(async move {
        let mut attempt = next.run(req, &mut extensions);
        let answer = poll_fn(|cx| {
            if reply.poll_closed(cx).is_ready() {
                return Poll::Ready(None);
            }
            attempt.as_mut().poll(cx).map(Some)
        })
        .await;
        if let Some(answer) = answer {
            let _ = reply.send(answer);
        }
    })
}

/// reqwest's request as the stack's: the call's extensions added to the request's, the body
/// replayable when reqwest holds it as bytes and marked [`NotReplayable`] otherwise.
fn stack_request(
    req: ::reqwest::Request,
    extensions: &Extensions,
    mailbox: Mailbox,
) -> Result<StackRequest, ::reqwest::Error> {
    let (mut parts, mut body) = Request::<::reqwest::Body>::try_from(req)?.into_parts();
    parts.extensions.extend(extensions.clone());
    parts.extensions.insert(mailbox);
    let body = match body.as_bytes().map(<[u8]>::len) {
        Some(len) => ReplayBody::from_bytes(take_bytes(&mut body, len)),
        None => {
            parts.extensions.insert(NotReplayable);
            ReplayBody::once(VecDeque::new(), Some(body), None)
        }
    };
    Ok(Request::from_parts(parts, body))
}

/// The bytes of a body reqwest holds as `len` bytes: handed over by its first frame, without a
/// copy (a bytes body is ready at once), else copied.
fn take_bytes(body: &mut ::reqwest::Body, len: usize) -> Bytes {
    let copy = body.as_bytes().map(Bytes::copy_from_slice);
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(body).poll_frame(&mut cx) {
        Poll::Ready(None) if len == 0 => Bytes::new(),
        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
            Ok(data) if data.len() == len => data,
            _ => copy.unwrap_or_default(),
        },
        _ => copy.unwrap_or_default(),
    }
}

/// The transport of a stack inside [`SurelyMiddleware`]: it hands each attempt to the call that
/// made it, which sends it down the rest of the middleware chain. Made by the middleware for
/// [`SurelyMiddleware::with_stack`]'s closure; a request that did not come through a
/// `SurelyMiddleware` fails, unsent.
///
/// It converts each request to reqwest's (a [`Progress`](crate::delivery::Progress) handle in
/// its extensions is marked [`Sent`](DeliveryPhase::Sent) when hyper reads the body, as by
/// [`Transport`](super::Transport)), and answers with `http::Response<reqwest::Body>`; its
/// errors are the chain's, classified as reqwest's when they are reqwest's
/// ([module above](super#what-reqwests-errors-mean)), else by what they wrap.
///
/// ```
/// use surely::reqwest::middleware::SurelyMiddleware;
///
/// // The closure's argument is the transport; the stack is built around it once.
/// let middleware = SurelyMiddleware::with_stack(|attempts| {
///     surely::client().no_replay().build(attempts)
/// });
/// assert!(middleware.is_ok());
/// ```
///
/// # Readiness
///
/// Always ready: the chain below takes attempts as they come.
#[derive(Clone, Debug)]
pub struct Attempts {
    _private: (),
}

impl<B> Service<Request<B>> for Attempts
where
    B: Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    type Response = Response<::reqwest::Body>;
    type Error = reqwest_middleware::Error;
    type Future = AttemptFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let state = match req.extensions_mut().remove::<Mailbox>() {
            None => State::Done {
                error: Some(reqwest_middleware::Error::middleware(OutsideCall)),
            },
            Some(Mailbox(mailbox)) => match super::to_reqwest(req) {
                Err(e) => State::Done {
                    error: Some(e.into()),
                },
                Ok(req) => {
                    let (reply, answer) = oneshot::channel();
                    match mailbox.send((req, reply)) {
                        Ok(()) => State::Waiting { answer },
                        Err(_) => State::Done {
                            error: Some(reqwest_middleware::Error::middleware(OutsideCall)),
                        },
                    }
                }
            },
        };
        AttemptFuture { state }
    }
}

/// The attempt's future, public in a private module: named by the service's `Future` type only.
mod future {
    use super::*;

    /// The future of [`Attempts`]: the chain's answer to one attempt.
    pub struct AttemptFuture {
        pub(super) state: State,
    }

    pub(super) enum State {
        Waiting {
            answer: oneshot::Receiver<reqwest_middleware::Result<::reqwest::Response>>,
        },
        Done {
            error: Option<reqwest_middleware::Error>,
        },
    }

    impl Future for AttemptFuture {
        type Output = Result<Response<::reqwest::Body>, reqwest_middleware::Error>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match &mut self.state {
                State::Waiting { answer } => {
                    Poll::Ready(match std::task::ready!(Pin::new(answer).poll(cx)) {
                        Ok(Ok(res)) => Ok(into_http(res)),
                        Ok(Err(e)) => Err(e),
                        // The call ended before its attempt did.
                        Err(_) => Err(reqwest_middleware::Error::middleware(OutsideCall)),
                    })
                }
                State::Done { error } => Poll::Ready(Err(error
                    .take()
                    .unwrap_or_else(|| reqwest_middleware::Error::middleware(OutsideCall)))),
            }
        }
    }

    impl fmt::Debug for AttemptFuture {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let state = match self.state {
                State::Waiting { .. } => "waiting",
                State::Done { .. } => "done",
            };
            f.debug_struct("AttemptFuture")
                .field("state", &state)
                .finish()
        }
    }
}

use self::future::{AttemptFuture, State};

/// reqwest's response as an `http::Response`, keeping its URL for the way back.
fn into_http(res: ::reqwest::Response) -> Response<::reqwest::Body> {
    use ::reqwest::ResponseBuilderExt;

    let url = res.url().clone();
    let mut res = Response::from(res);
    if let Ok(marked) = Response::builder().url(url).body(()) {
        res.extensions_mut()
            .extend(marked.into_parts().0.extensions);
    }
    res
}

/// An attempt that no `SurelyMiddleware` call is waiting for: the stack was called outside
/// the middleware, or the call ended first. Nothing was sent.
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("no surely middleware call is waiting for this attempt: nothing was sent")]
struct OutsideCall;

impl ClassifyError for OutsideCall {
    fn classify_error(&self, _: DeliveryPhase) -> Classification {
        Classification::new(crate::classify::AttemptClass::Final, DeliveryPhase::NotSent)
    }
}

/// The chain's error, classified: reqwest's as in the [module above](super#what-reqwests-errors-mean),
/// a middleware's by what it wraps (an I/O error, a surely error), else by how far the request
/// had got: *maybe committed* once sent.
impl ClassifyError for reqwest_middleware::Error {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        match self {
            reqwest_middleware::Error::Reqwest(e) => e.classify_error(phase),
            reqwest_middleware::Error::Middleware(e) => {
                if let Some(e) = e.downcast_ref::<OutsideCall>() {
                    return e.classify_error(phase);
                }
                crate::error::error_chain(&**e, phase)
            }
        }
    }
}

impl IntoError for reqwest_middleware::Error {
    type Transport = reqwest_middleware::Error;

    fn into_error(self) -> Error {
        crate::Error::transport(self)
    }
}

/// The stack's error inside an error of the chain, if a [`SurelyMiddleware`] made it: the
/// call's outcome, attempts and stop reason, and the last attempt's own error
/// ([`transport_ref`](crate::Error::transport_ref): reqwest's, or a middleware's further down).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// # let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
/// #     .with(surely::reqwest::middleware::SurelyMiddleware::new())
/// #     .build();
/// // reqwest refuses this URL: final, nothing sent, not tried again.
/// let err = client.get("ftp://127.0.0.1/orders").send().await.unwrap_err();
/// let surely = surely::reqwest::middleware::surely_error(&err).unwrap();
/// assert_eq!(surely.outcome(), surely::Outcome::Failed);
/// assert_eq!(surely.attempts(), 1);
/// let reqwest = surely.transport_ref().unwrap();
/// assert!(reqwest.is_builder());
/// # }
/// ```
pub fn surely_error(err: &reqwest_middleware::Error) -> Option<&Error> {
    match err {
        reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<Error>(),
        reqwest_middleware::Error::Reqwest(_) => None,
    }
}

impl Sealed for ::reqwest::Response {}
impl Sealed for reqwest_middleware::Error {}
impl Sealed for reqwest_middleware::Result<::reqwest::Response> {}

/// The outcome a [`SurelyMiddleware`] put in the response's extensions.
impl OutcomeExt for ::reqwest::Response {
    fn call_outcome(&self) -> Option<&CallOutcome> {
        self.extensions().get::<CallOutcome>()
    }

    fn outcome(&self) -> Outcome {
        self.call_outcome()
            .map_or(Outcome::Unknown, CallOutcome::outcome)
    }
}

/// The outcome of the stack's error inside ([`surely_error`]); an error that no
/// `SurelyMiddleware` made proves nothing, and says [`Unknown`](Outcome::Unknown).
impl OutcomeExt for reqwest_middleware::Error {
    fn call_outcome(&self) -> Option<&CallOutcome> {
        surely_error(self)?.call_outcome()
    }

    fn outcome(&self) -> Outcome {
        surely_error(self).map_or(Outcome::Unknown, crate::Error::outcome)
    }

    fn attempts(&self) -> u32 {
        surely_error(self).map_or(0, crate::Error::attempts)
    }
}

/// The outcome of a call's result, response or error.
impl OutcomeExt for reqwest_middleware::Result<::reqwest::Response> {
    fn call_outcome(&self) -> Option<&CallOutcome> {
        match self {
            Ok(res) => res.call_outcome(),
            Err(err) => err.call_outcome(),
        }
    }

    fn outcome(&self) -> Outcome {
        match self {
            Ok(res) => res.outcome(),
            Err(err) => err.outcome(),
        }
    }

    fn attempts(&self) -> u32 {
        match self {
            Ok(res) => res.attempts(),
            Err(err) => err.attempts(),
        }
    }
}
