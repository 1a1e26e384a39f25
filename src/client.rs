//! The canonical client stack in one call.
//!
//! [`client()`] starts a [`ClientBuilder`] with documented defaults; [`build`](ClientBuilder::build)
//! wraps a transport (hyper-util's `Client`, a tonic `Channel`, any `tower::Service`) in these
//! layers, outer to inner (why in this order:
//! [layer order](crate::docs::architecture#layer-order)):
//!
//! ```text
//! call record        RecordCallLayer         one record per logical call (with a recorder)
//!   deadline         SetDeadlineLayer        total budget (default 10 s), propagated on the wire
//!     key            SetIdempotencyKeyLayer  one key per call for POST and PATCH
//!       replay       ReplayLayer             bodies buffered up to 64 KiB (`http()`, `grpc()` presets)
//!         retry      RetryLayer              3 attempts, backoff, pushback, budget, owner marker
//!           hedge    HedgeLayer              off by default; safe reads only, same budget
//!             breaker  CircuitBreaker        one breaker per client: fail fast while it is down
//!               attempt record  RecordAttemptLayer  (with a recorder)
//!                 attempt timeout  AttemptTimeoutLayer  min(per-try, remaining)
//!                   transport
//! ```
//!
//! The breaker guards each attempt where it costs least: without a hedge the retry layer
//! admits and counts the attempts itself ([`RetryLayerBuilder::circuit_breaker`]), with the
//! same counts as a [`BreakerLayer`] in that place and no layer of its own; with a hedge
//! it is a [`BreakerLayer`] under the hedge, which counts each copy (see
//! `BreakerPart`).
//!
//! The two record layers are there only when [`recorder`](ClientBuilder::recorder) gives one:
//! by default ([`NoRecords`]) a call pays nothing for records, and still gets its outcome back.
//! Every layer is configurable, and every optional one removable (`no_*`); each one also works
//! on its own in a `tower::ServiceBuilder`, which is the way to build any other order. The
//! retry layer, the hedge, the breaker and the records share one classifier
//! ([`classifier`](ClientBuilder::classifier)), so they never disagree about what an attempt
//! meant, and the retry layer and the hedge share one retry budget
//! ([`budget`](ClientBuilder::budget)), so that retries and hedges together stay a small share
//! of the traffic.
//!
//! **One breaker per client.** The default stack has a [`CircuitBreaker`] of its own, shared by
//! every clone of the client. A breaker stands for one dependency: build one client per
//! downstream service (as with Polly's and resilience4j's named instances), pass a breaker of
//! your own with [`breaker`](ClientBuilder::breaker), or remove it with
//! [`no_breaker`](ClientBuilder::no_breaker) for a client that talks to many hosts.
//!
//! **No hedging by default.** A hedge adds load to buy tail latency, and only for safe reads:
//! turn it on with [`hedge`](ClientBuilder::hedge).
//!
//! ```
//! use std::time::Duration;
//! use surely::record::InMemoryRecorder;
//! use tower::{service_fn, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let transport = service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, std::io::Error>(http::Response::new(String::from("created")))
//! });
//! let recorder = InMemoryRecorder::new();
//! let mut client = surely::client()
//!     .timeout(Duration::from_secs(2))
//!     .per_try_timeout(Duration::from_millis(500))
//!     .retry(|retry| retry.max_attempts(4))
//!     .recorder(recorder.clone())
//!     .build(transport)
//!     .unwrap();
//!
//! let order = http::Request::post("/orders").body("o-1".to_owned()).unwrap();
//! let res = client.ready().await.unwrap().call(order).await.unwrap();
//! assert_eq!(res.body(), "created");
//! // The POST got an idempotency key, and the call a record.
//! assert!(recorder.calls()[0].key.is_some());
//! # }
//! ```

use std::fmt;
use std::time::Duration;

use std::sync::Arc;

use tower_layer::{Identity, Layer};

use crate::breaker::{BreakerLayer, CircuitBreaker};
use crate::budget::{RatioBudget, RetryBudget};
use crate::classify::HttpClassifier;
use crate::deadline::{AttemptTimers, SetDeadline, SetDeadlineLayer, SetDeadlineLayerBuilder};
use crate::hedge::{HedgeLayer, HedgeLayerBuilder};
use crate::idempotency::SetIdempotencyKeyLayer;
use crate::record::{RecordAttemptLayer, RecordCallLayer, Recorder, WatchTrailersLayer};
use crate::retry::{NoResolver, ReplayLayer, Retry, RetryLayer, RetryLayerBuilder};
use crate::review::ClientSettings;
use crate::timeout::{AttemptTimeout, AttemptTimeoutLayer, BodyIdleTimeoutLayer};
use crate::ConfigError;

/// The default total budget of a call made through [`client()`]: 10 s.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A [`ClientBuilder`] with the defaults, for any transport. Without the body-buffering layer:
/// add it with [`replay_bodies`](ClientBuilder::replay_bodies) for HTTP transports whose body
/// is not `Clone` (or use [`http()`]).
///
/// # A service of your own
///
/// The transport need not speak HTTP. Its request type implements
/// [`Envelope`](crate::Envelope) (one line; override its `semantics` for a request that may be
/// sent twice) and is `Clone`, since each attempt sends a copy. Its response implements
/// `Envelope` too: `u64`, `String`, `Vec<T>`, `Option<T>` and the like already do, and a type of
/// your own does in one line. The default [`HttpClassifier`] takes an answer without an HTTP
/// status as a success, and reads errors through
/// [`ClassifyError`](crate::classify::ClassifyError): a `std::io::Error` of kind
/// `ConnectionRefused` proves the request was not sent, and is retried whatever the request; a
/// reset or a timeout after the request went out is retried only for a request that may be sent
/// twice, and ends any other call [`Unknown`](crate::Outcome::Unknown).
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use surely::{Envelope, OutcomeExt, Semantics};
/// use tower::service_fn;
///
/// #[derive(Clone)]
/// struct GetPrice {
///     id: u64,
/// }
///
/// impl Envelope for GetPrice {
///     fn semantics(&self) -> Semantics {
///         Semantics::Safe
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// // Refuses the first connection, then answers.
/// let attempts = AtomicU32::new(0);
/// let prices = service_fn(|req: GetPrice| {
///     let refused = attempts.fetch_add(1, Ordering::SeqCst) == 0;
///     async move {
///         if refused {
///             return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
///         }
///         Ok(req.id * 100)
///     }
/// });
/// let mut client = surely::client().build(prices).unwrap();
/// let res = client.send(GetPrice { id: 7 }).await;
/// assert_eq!(res.attempts(), 2);
/// let price: u64 = res.unwrap().into_inner();
/// assert_eq!(price, 700);
/// # drop(client);
/// assert_eq!(attempts.load(Ordering::SeqCst), 2);
/// # }
/// ```
///
/// A plain answer has no extensions: through `call` it carries no
/// [`CallOutcome`](crate::CallOutcome), through [`send`](crate::deadline::SetDeadline::send) its
/// [`Reply`](crate::Reply) does. An error carries its outcome either way
/// ([`Error::outcome`](crate::Error::outcome)).
///
/// An answer that can itself say "failed" or "try later" needs a classifier of its own: a
/// closure given to [`classify::from_fn`](crate::classify::from_fn). The error it sees is the
/// crate's [`Error`](crate::Error) around the transport's.
///
/// ```
/// use std::io;
/// use surely::classify::{self, AttemptClass, Attempted, Classification, ClassifyError, DeliveryPhase};
/// # use surely::Envelope;
/// # use tower::{service_fn, Service, ServiceExt};
/// # #[derive(Clone)] struct GetPrice;
/// # impl Envelope for GetPrice {}
///
/// #[derive(Debug, PartialEq)]
/// enum Quote {
///     Price(u64),
///     Busy,
/// }
/// impl Envelope for Quote {}
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// # let quotes = service_fn(|_: GetPrice| async { Ok::<_, io::Error>(Quote::Price(700)) });
/// let mut client = surely::client()
///     .classifier(classify::from_fn(|attempt: Attempted<'_, Quote, surely::Error<io::Error>>, _| match attempt {
///         Attempted::Response(Quote::Busy) => Classification::new(AttemptClass::Rejected, DeliveryPhase::ResponseStarted),
///         Attempted::Response(_) => Classification::success(),
///         Attempted::Error(e, phase) => e.classify_error(phase),
///     }))
///     .build(quotes)
///     .unwrap();
/// # assert_eq!(client.ready().await.unwrap().call(GetPrice).await.unwrap(), Quote::Price(700));
/// # }
/// ```
///
/// # Your own error type, and the outcome of a plain answer
///
/// An error type of your own implements one trait, [`TransportError`](crate::TransportError),
/// whose table says which failures are a business "no" (final: the server answered) and which
/// prove the request was never sent. [`send`](crate::deadline::SetDeadline::send) hands back
/// any answer as a [`Reply`](crate::Reply) with the call's outcome and attempts, which a plain
/// answer (a `u64`, a type of your own) cannot carry by itself.
///
/// # When a call does not compile
///
/// `build` takes any transport: whether the stack can serve a request is known at the call.
/// Call it with `client.send(req)`, and a missing piece is named, with what to implement:
///
/// ```text
/// error[E0277]: `Price` is not a `surely::Envelope`: surely's layers cannot read it as a request or a response
///    = note: for a type of your own, `impl surely::Envelope for Price {}` gives the defaults (...)
/// error[E0277]: surely's layers cannot take the error `MyError`: it is not a `surely::TransportError`
///    = note: for an error type of your own, `impl surely::TransportError for MyError {}` takes it (...)
/// ```
///
/// tower's `client.ready()` cannot: its method is found only once the bounds hold, so a missing
/// piece makes it an E0599 ("the method `ready` exists for struct `SetDeadline<…>`, but its
/// trait bounds were not satisfied") that names none. Naming the request,
/// `ServiceExt::<GetPrice>::ready(&mut client)`, brings the same messages as `send`.
///
/// ```compile_fail,E0277
/// # #[derive(Clone)] struct GetPrice;
/// # impl surely::Envelope for GetPrice {}
/// struct Price(u64); // not an `Envelope`
///
/// # async fn f() {
/// let prices = tower::service_fn(|_: GetPrice| async { Ok::<_, std::io::Error>(Price(700)) });
/// let mut client = surely::client().build(prices).unwrap();
/// let _ = client.send(GetPrice).await;
/// # }
/// ```
pub fn client() -> ClientBuilder {
    ClientBuilder::new()
}

/// The preset for HTTP transports such as hyper-util's legacy `Client`: the defaults, with
/// request bodies buffered up to 64 KiB so that retries send the same bytes
/// ([`ReplayLayer`]), and attempts recorded when their response body ends
/// ([`settle_at_body_end`](ClientBuilder::settle_at_body_end)), so that a body cut off mid-way
/// is recorded as maybe committed. Responses come back as
/// [`WatchedBody`](crate::record::WatchedBody)s of the transport's, which pass every frame
/// through.
///
/// The transport must take the buffered bodies, `http::Request<ReplayBody<B>>`, not
/// `http::Request<B>`: [`surely::hyper::transport()`][crate::hyper::transport] makes
/// hyper-util's client that way, and the result has a name, [`HttpClient`]. A hyper-util
/// client built for `B` itself compiles here and is refused at the first call, where the
/// request's body type is known (`build` cannot check it: transports generic over their body,
/// reqwest's or a `service_fn`'s, would be refused with it).
///
/// ```
/// # #[cfg(feature = "hyper")] {
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use surely::client::HttpClient;
/// use surely::hyper::Transport;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let client: HttpClient<Transport<Full<Bytes>>> =
///     surely::client::http().build(surely::hyper::transport()).unwrap();
/// # let _ = client;
/// # }
/// # main() }
/// ```
#[cfg_attr(not(feature = "hyper"), doc = crate::docs::links::to_features!("crate::hyper::transport"))]
pub fn http() -> HttpClientBuilder {
    ClientBuilder::new()
        .replay_bodies(ReplayLayer::new())
        .settle_at_body_end()
}

/// The preset for gRPC, such as a tonic `Channel`: the defaults, with request bodies buffered
/// (tonic's body is not `Clone`) and **no idempotency keys**.
///
/// * The [`HttpClassifier`] reads `grpc-status` from the headers of a trailers-only response
///   (how a server answers an error before any message: tonic's unary errors), so a
///   trailers-only `UNAVAILABLE` is retried (for a method that is not marked, only with
///   `grpc-retry-pushback-ms`: the handler may have done its work) and `INVALID_ARGUMENT` is
///   final. A status that
///   arrives in trailers after the response headers is not seen by the retry layer, which
///   decides at the head: by then the response has started and the call is not retried. The
///   records do see it: they are settled when the body ends, from its trailers.
/// * The deadline is written as `grpc-timeout` (a tonic server honours it), and every attempt
///   carries `grpc-previous-rpc-attempts`.
/// * gRPC methods are all POSTs, and a gRPC server ignores the `Idempotency-Key` header unless
///   it runs a layer that honours it, so the preset adds no keys: a gRPC call is
///   [`NonIdempotent`](crate::Semantics::NonIdempotent) unless marked, and an attempt that may
///   have committed is not retried. Mark reads and idempotent methods with a
///   [`MethodSemanticsLayer`](crate::grpc::MethodSemanticsLayer) around the stack, or a
///   [`Semantics`](crate::Semantics) extension per request (see [`crate::grpc`]); add keys with
///   [`idempotency_keys`](ClientBuilder::idempotency_keys) for a server that honours them.
///
/// With the `tonic` feature, [`build_channel`][ClientBuilder::build_channel] wraps a tonic
/// `Channel`, and the result is what tonic's generated clients take
/// (`tonic::client::Grpc::new`, or a generated `FooClient::new`):
///
/// ```
/// # #[cfg(feature = "tonic")] {
/// use std::time::Duration;
/// use surely::grpc::MethodSemanticsLayer;
/// use surely::Semantics;
/// use tonic::transport::Endpoint;
/// use tower::Layer;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let channel = Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
/// let stack = surely::client::grpc()
///     .timeout(Duration::from_secs(2))
///     .per_try_timeout(Duration::from_millis(500))
///     .build_channel(channel)
///     .unwrap();
/// // Reads may be retried after a lost reply; everything else only when provably not processed.
/// let marks = MethodSemanticsLayer::builder()
///     .method("/shop.Orders/GetOrder", Semantics::Safe)
///     .build()
///     .unwrap();
/// let grpc = tonic::client::Grpc::new(marks.layer(stack));
/// # let _ = grpc;
/// # }
/// # main() }
/// ```
#[cfg_attr(
    not(feature = "tonic"),
    doc = crate::docs::links::to_features!(
        "ClientBuilder::build_channel",
    )
)]
pub fn grpc(
) -> ClientBuilder<NoRecords, HttpClassifier, NoResolver, Identity, ReplayLayer, Identity> {
    ClientBuilder::new()
        .no_idempotency_keys()
        .replay_bodies(ReplayLayer::new())
}

/// The layer [`client()`] builds with its defaults.
pub type DefaultClientLayer = ClientLayer<
    NoRecords,
    HttpClassifier,
    NoResolver,
    SetIdempotencyKeyLayer,
    Identity,
    Identity,
    CircuitBreaker,
>;

/// What [`http()`] returns, by name, with the recorder `R` that
/// [`recorder`](ClientBuilder::recorder) gives it: for a function that sets up the builder a
/// service's clients share.
///
/// ```
/// use std::time::Duration;
/// use surely::client::HttpClientBuilder;
/// use surely::record::TracingRecorder;
///
/// fn shared() -> HttpClientBuilder<TracingRecorder> {
///     surely::client::http()
///         .timeout(Duration::from_secs(3))
///         .recorder(TracingRecorder::new())
/// }
/// let _payments = shared();
/// ```
pub type HttpClientBuilder<R = NoRecords> = ClientBuilder<
    R,
    HttpClassifier,
    NoResolver,
    SetIdempotencyKeyLayer,
    ReplayLayer,
    Identity,
    CircuitBreaker,
    WatchTrailersLayer,
>;

/// The layer [`http()`] builds with its defaults.
pub type HttpClientLayer = ClientLayer<
    NoRecords,
    HttpClassifier,
    NoResolver,
    SetIdempotencyKeyLayer,
    ReplayLayer,
    Identity,
    CircuitBreaker,
    WatchTrailersLayer,
>;

/// The layer [`grpc()`] builds with its defaults.
pub type GrpcClientLayer = ClientLayer<
    NoRecords,
    HttpClassifier,
    NoResolver,
    Identity,
    ReplayLayer,
    Identity,
    CircuitBreaker,
>;

/// The service [`client()`]`.build(transport)` makes with the defaults, by name, for a struct
/// field:
///
/// ```
/// use surely::client::Client;
/// use tower::service_fn;
///
/// type Transport = tower::util::ServiceFn<fn(http::Request<String>) -> std::future::Ready<std::io::Result<http::Response<String>>>>;
///
/// struct Payments {
///     client: Client<Transport>,
/// }
///
/// fn answer(_: http::Request<String>) -> std::future::Ready<std::io::Result<http::Response<String>>> {
///     std::future::ready(Ok(http::Response::new(String::new())))
/// }
/// let transport: Transport = service_fn(answer);
/// let payments = Payments { client: surely::client().build(transport).unwrap() };
/// # let _ = payments.client;
/// ```
///
/// Another configuration has another type: a [`ClientLayer`] with other parameters, as
/// [`Layer::Service`]. Names for the presets: [`HttpClient`] (and
/// [`surely::hyper::Client`][crate::hyper::Client] over hyper-util), [`GrpcClient`].
#[cfg_attr(not(feature = "hyper"), doc = crate::docs::links::to_features!("crate::hyper::Client"))]
pub type Client<S> = <DefaultClientLayer as Layer<S>>::Service;

/// The service [`http()`]`.build(transport)` makes with the defaults, by name.
pub type HttpClient<S> = <HttpClientLayer as Layer<S>>::Service;

/// The service [`grpc()`]`.build(transport)` makes with the defaults, by name; with the
/// `tonic` feature, `GrpcClient<GrpcTransport<Channel>>` is what
/// [`build_channel`][ClientBuilder::build_channel] returns.
#[cfg_attr(
    not(feature = "tonic"),
    doc = crate::docs::links::to_features!(
        "ClientBuilder::build_channel",
    )
)]
pub type GrpcClient<S> = <GrpcClientLayer as Layer<S>>::Service;

/// Builds the canonical client stack; see the [module docs](self).
///
/// The type parameters are the recorder `R` ([`NoRecords`] until one is given), the classifier `M`, the resolver `Z`, and the
/// optional layers: key `K`, replay `P`, hedge `H`, breaker `B` (`Identity` when absent; the
/// hedge and the breaker as a `Part`, which gets the shared classifier and budget), and the
/// body watch `W` around the transport.
///
/// `Clone` when its parts are (every part the crate provides is): a clone shares the budget and
/// the breaker of the builder it was cloned from, so the clients both build share them too.
#[derive(Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct ClientBuilder<
    R = NoRecords,
    M = HttpClassifier,
    Z = NoResolver,
    K = SetIdempotencyKeyLayer,
    P = Identity,
    H = Identity,
    B = CircuitBreaker,
    W = Identity,
> {
    recorder: R,
    classifier: M,
    shared: Shared,
    key: K,
    replay: P,
    retry: RetryLayerBuilder<M, Z>,
    hedge: H,
    breaker: B,
    watch: W,
}

/// The builder's settings that do not change its type.
#[derive(Clone)]
struct Shared {
    budget: Option<Arc<dyn RetryBudget>>,
    deadline: SetDeadlineLayerBuilder<AttemptTimers>,
    per_try: Option<Duration>,
    /// The body idle timeout, checked when the stack is built.
    body_idle: Option<Duration>,
    /// Whether HTTP attempts are recorded when their body ends.
    at_body_end: bool,
}

impl ClientBuilder {
    /// The defaults: no records and no record layers ([`NoRecords`]), [`HttpClassifier`], a 10 s total budget written on the
    /// wire, keys for POST and PATCH, [`RetryLayer::new`]'s retry settings with a
    /// [`RatioBudget`] shared with the hedge, no hedge, a [`CircuitBreaker::new`] of the
    /// client's own, and attempts bounded by the remaining budget only.
    pub fn new() -> Self {
        let budget: Arc<dyn RetryBudget> = Arc::new(RatioBudget::default());
        ClientBuilder {
            recorder: NoRecords,
            classifier: HttpClassifier::new(),
            shared: Shared {
                budget: Some(budget.clone()),
                deadline: SetDeadlineLayer::builder()
                    .timeout(DEFAULT_TIMEOUT)
                    .enforce_in_attempts(),
                per_try: None,
                body_idle: None,
                at_body_end: false,
            },
            key: SetIdempotencyKeyLayer::new(),
            replay: Identity::new(),
            retry: RetryLayer::builder().budget(budget),
            hedge: Identity::new(),
            breaker: CircuitBreaker::new(),
            watch: Identity::new(),
        }
    }
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder::new()
    }
}

impl<R, M, Z, K, P, H, B, W> ClientBuilder<R, M, Z, K, P, H, B, W> {
    /// The call's total budget (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.shared.deadline = self.shared.deadline.timeout(timeout);
        self
    }

    /// Configures the deadline layer beyond its budget: the wire header, the reserve, gRPC.
    pub fn deadline(
        mut self,
        f: impl FnOnce(SetDeadlineLayerBuilder<AttemptTimers>) -> SetDeadlineLayerBuilder<AttemptTimers>,
    ) -> Self {
        self.shared.deadline = f(self.shared.deadline);
        self
    }

    /// No budget of the client's own: calls keep only a deadline they inherit (from the request
    /// or the current context), which is still enforced and propagated.
    pub fn inherit_deadline(mut self) -> Self {
        self.shared.deadline = SetDeadlineLayer::builder().enforce_in_attempts();
        self
    }

    /// Ends each attempt after `per_try` at most (default: only the remaining budget bounds an
    /// attempt). A retry then has time left after a hung attempt.
    ///
    /// This is the timeout of the second phase, from the request to the response head: it
    /// ends an attempt that has no head yet, and says how far the request had got. Sent and
    /// unanswered, the attempt is *maybe committed*: a read is retried, a write without a key
    /// the server honours ends [`Unknown`](crate::Outcome::Unknown). See
    /// [three phases, three timeouts](crate::docs::deadlines#three-phases-three-timeouts).
    pub fn per_try_timeout(mut self, per_try: Duration) -> Self {
        self.shared.per_try = Some(per_try);
        self
    }

    /// The retry budget shared by the retry layer and the hedge (default: a
    /// [`RatioBudget::default`] of the client's own). Set it here rather than in
    /// [`retry`](Self::retry), so that hedges spend from it too.
    pub fn budget(mut self, budget: Arc<dyn RetryBudget>) -> Self {
        self.retry = self.retry.budget(budget.clone());
        self.shared.budget = Some(budget);
        self
    }

    /// No retry budget: only the attempt limits bound retries and hedges. For tests; in
    /// production an outage then multiplies the load.
    pub fn no_budget(mut self) -> Self {
        self.retry = self.retry.no_budget();
        self.shared.budget = None;
        self
    }

    /// Configures the retry layer (attempts, backoff, pushback, resolver...).
    pub fn retry<Z2>(
        self,
        f: impl FnOnce(RetryLayerBuilder<M, Z>) -> RetryLayerBuilder<M, Z2>,
    ) -> ClientBuilder<R, M, Z2, K, P, H, B, W> {
        ClientBuilder {
            recorder: self.recorder,
            classifier: self.classifier,
            shared: self.shared,
            key: self.key,
            replay: self.replay,
            retry: f(self.retry),
            hedge: self.hedge,
            breaker: self.breaker,
            watch: self.watch,
        }
    }

    /// Sends none of the crate's own headers: no retry-owner marker
    /// ([`RETRY_OWNER`](crate::headers::RETRY_OWNER)), no HTTP attempt counter, no millisecond
    /// deadline header. For a third-party API, which has no use for them and need not learn how
    /// this client works inside. The deadline still bounds every attempt here; gRPC requests
    /// keep gRPC's own `grpc-timeout` and `grpc-previous-rpc-attempts`, which every gRPC server
    /// reads. Keep the default for calls between your own services: the marker and the
    /// deadline header are how a chain keeps one retry owner and one budget. (The same goes for
    /// a request's [`Criticality`](crate::Criticality) extension, which the stack writes as
    /// `surely-criticality` for the next hop's limit unless internal headers are off.)
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{service_fn, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let transport = service_fn(|req: http::Request<String>| async move {
    ///     assert!(req.headers().get("surely-retry-owner").is_none());
    ///     assert!(req.headers().get("x-request-timeout-ms").is_none());
    ///     Ok::<_, std::io::Error>(http::Response::new(String::new()))
    /// });
    /// let mut payments = surely::client()
    ///     .timeout(Duration::from_secs(5))
    ///     .no_internal_headers()
    ///     .build(transport)
    ///     .unwrap();
    /// let charge = http::Request::post("https://api.example.com/charges").body(String::new()).unwrap();
    /// payments.ready().await.unwrap().call(charge).await.unwrap();
    /// # }
    /// ```
    pub fn no_internal_headers(mut self) -> Self {
        self.shared.deadline = self.shared.deadline.http_header(None);
        self.retry = self.retry.mark_owner(false).attempt_header(None);
        self
    }

    /// No retries: one attempt per call. The layer stays, so the call is still classified and
    /// its record says why it stopped.
    pub fn no_retry(mut self) -> Self {
        self.retry = self.retry.max_attempts(1);
        self
    }

    /// Writes the intent of every call that is not safe to `journal` before the call's first
    /// attempt: a process killed mid-call still leaves its question for a reconciler. With a
    /// [`LedgerRecorder`][crate::ledger::LedgerRecorder] as both the recorder and the journal, a
    /// call that ends unknown is one ledger entry. See [`journal`](crate::journal) and
    /// [`RetryLayerBuilder::journal`], and for the whole story
    /// [`docs::unknowns`](crate::docs::unknowns#a-client-that-dies-mid-call).
    #[cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::ledger::LedgerRecorder",
        )
    )]
    pub fn journal(mut self, journal: impl crate::journal::IntentJournal) -> Self {
        self.retry = self.retry.journal(journal);
        self
    }

    /// Where the records go: a [`TracingRecorder`](crate::record::TracingRecorder), an
    /// [`InMemoryRecorder`](crate::record::InMemoryRecorder), an
    /// `OtelRecorder`, a closure, a pair of them.
    ///
    /// By default ([`NoRecords`]) the stack has no record layers at all, and a call costs
    /// nothing for records. The outcome is handed back with every response and error either
    /// way (see [`OutcomeExt`](crate::OutcomeExt)). `()` is a recorder too, which records
    /// nothing but keeps the two record layers in the stack (each a pass-through).
    pub fn recorder<R2: Recorder>(self, recorder: R2) -> ClientBuilder<R2, M, Z, K, P, H, B, W> {
        ClientBuilder {
            recorder,
            classifier: self.classifier,
            shared: self.shared,
            key: self.key,
            replay: self.replay,
            retry: self.retry,
            hedge: self.hedge,
            breaker: self.breaker,
            watch: self.watch,
        }
    }

    /// The classifier shared by the retry layer, the hedge, the breaker and the records
    /// (default [`HttpClassifier`]).
    pub fn classifier<M2: Clone>(self, classifier: M2) -> ClientBuilder<R, M2, Z, K, P, H, B, W> {
        ClientBuilder {
            recorder: self.recorder,
            retry: self.retry.classifier(classifier.clone()),
            classifier,
            shared: self.shared,
            key: self.key,
            replay: self.replay,
            hedge: self.hedge,
            breaker: self.breaker,
            watch: self.watch,
        }
    }

    /// The idempotency-key layer (default [`SetIdempotencyKeyLayer::new`]: POST and PATCH).
    pub fn idempotency_keys<K2>(self, key: K2) -> ClientBuilder<R, M, Z, K2, P, H, B, W> {
        ClientBuilder {
            recorder: self.recorder,
            classifier: self.classifier,
            shared: self.shared,
            key,
            replay: self.replay,
            retry: self.retry,
            hedge: self.hedge,
            breaker: self.breaker,
            watch: self.watch,
        }
    }

    /// No idempotency keys: a POST without a key of its own is then never retried after it
    /// may have committed.
    pub fn no_idempotency_keys(self) -> ClientBuilder<R, M, Z, Identity, P, H, B, W> {
        self.idempotency_keys(Identity::new())
    }

    /// Buffers request bodies so that retries send the same bytes (the [`http()`] preset's
    /// default).
    pub fn replay_bodies<P2>(self, replay: P2) -> ClientBuilder<R, M, Z, K, P2, H, B, W> {
        ClientBuilder {
            recorder: self.recorder,
            classifier: self.classifier,
            shared: self.shared,
            key: self.key,
            replay,
            retry: self.retry,
            hedge: self.hedge,
            breaker: self.breaker,
            watch: self.watch,
        }
    }

    /// No body buffering: requests must be `Clone` themselves to be retried.
    pub fn no_replay(self) -> ClientBuilder<R, M, Z, K, Identity, H, B, W> {
        self.replay_bodies(Identity::new())
    }

    /// Hedges safe reads (none by default), configured by `hedge`; the client sets its
    /// classifier and its budget (the retry layer's, only withdrawn from).
    pub fn hedge<M0>(
        self,
        hedge: HedgeLayerBuilder<M0>,
    ) -> ClientBuilder<R, M, Z, K, P, HedgeLayerBuilder<M0>, B, W> {
        self.hedge_part(hedge)
    }

    fn hedge_part<H2>(self, hedge: H2) -> ClientBuilder<R, M, Z, K, P, H2, B, W> {
        ClientBuilder {
            recorder: self.recorder,
            classifier: self.classifier,
            shared: self.shared,
            key: self.key,
            replay: self.replay,
            retry: self.retry,
            hedge,
            breaker: self.breaker,
            watch: self.watch,
        }
    }

    /// No hedging.
    pub fn no_hedge(self) -> ClientBuilder<R, M, Z, K, P, Identity, B, W> {
        self.hedge_part(Identity::new())
    }

    /// The circuit breaker inside the retry layer (default: a [`CircuitBreaker::new`] of the
    /// client's own), so that its fast rejections are retried after the time it advertises,
    /// when the deadline allows. Share one breaker between clients of the same dependency by
    /// passing clones of it.
    pub fn breaker(
        self,
        breaker: CircuitBreaker,
    ) -> ClientBuilder<R, M, Z, K, P, H, CircuitBreaker, W> {
        self.breaker_part(breaker)
    }

    fn breaker_part<B2>(self, breaker: B2) -> ClientBuilder<R, M, Z, K, P, H, B2, W> {
        ClientBuilder {
            recorder: self.recorder,
            classifier: self.classifier,
            shared: self.shared,
            key: self.key,
            replay: self.replay,
            retry: self.retry,
            hedge: self.hedge,
            breaker,
            watch: self.watch,
        }
    }

    /// Records each HTTP attempt when its response body ends, not when its head arrives (the
    /// [`http()`] preset's default): a body that breaks off mid-way is recorded as *maybe
    /// committed*, and the call's record comes after it
    /// ([`RecordAttemptLayer::at_body_end`]). It puts a
    /// [`WatchTrailersLayer`] right around the transport,
    /// so the transport's responses must be `http::Response`s with an `http_body::Body`, and
    /// the client's are [`WatchedBody`](crate::record::WatchedBody)s of them. The body is
    /// watched only while a recorder is on; with `()` the wrapper passes every frame through
    /// and allocates nothing.
    ///
    /// The outcome handed back with the response is decided at its head: a caller whose body
    /// read fails learns it from the read.
    pub fn settle_at_body_end(self) -> ClientBuilder<R, M, Z, K, P, H, B, WatchTrailersLayer> {
        self.watch_part(WatchTrailersLayer::new(), true)
    }

    /// Fails a response body that sends no frame for `idle` while the caller waits for one
    /// (none by default), with a [`BodyIdle`](crate::timeout::BodyIdle) error from the body: the
    /// timeout of the third phase, after the head
    /// ([three phases, three timeouts](crate::docs::deadlines#three-phases-three-timeouts)).
    ///
    /// It puts a [`BodyIdleTimeoutLayer`] right around the transport, inside the body watch of
    /// [`settle_at_body_end`](Self::settle_at_body_end), so a body that goes quiet after a
    /// success head is recorded as cut off: *maybe committed* at
    /// [`ResponseStarted`](crate::classify::DeliveryPhase::ResponseStarted), and a write's
    /// call [`Unknown`](crate::Outcome::Unknown) in the records. The responses' bodies become
    /// [`IdleTimeoutBody`](crate::timeout::IdleTimeoutBody)s (inside the watch's), whose error
    /// type is [`BoxError`](crate::classify::BoxError); so the builder's type changes: its last
    /// parameter becomes `(W, BodyIdleTimeoutLayer)`, the watch outside the timeout (the
    /// `http()` preset's is `(WatchTrailersLayer, BodyIdleTimeoutLayer)`), and
    /// [`HttpClientBuilder`] and [`HttpClient`] no longer name it. `idle` must be greater than
    /// zero: [`build`](Self::build) refuses zero with a [`ConfigError`]. Set it after
    /// [`settle_at_body_end`](Self::settle_at_body_end) or
    /// [`no_body_watch`](Self::no_body_watch), which replace the layers around the transport.
    ///
    /// ```
    /// # #[cfg(feature = "hyper")] {
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let client = surely::client::http()
    ///     .per_try_timeout(Duration::from_secs(2)) // to the head
    ///     .body_idle_timeout(Duration::from_secs(5)) // between frames of the body
    ///     .build(surely::hyper::transport::<Full<Bytes>>());
    /// assert!(client.is_ok());
    ///
    /// let zero = surely::client::http()
    ///     .body_idle_timeout(Duration::ZERO)
    ///     .build(surely::hyper::transport::<Full<Bytes>>());
    /// assert!(zero.is_err());
    /// # }
    /// # main() }
    /// ```
    pub fn body_idle_timeout(
        mut self,
        idle: Duration,
    ) -> ClientBuilder<R, M, Z, K, P, H, B, (W, BodyIdleTimeoutLayer)> {
        self.shared.body_idle = Some(idle);
        // A pair of layers applies its first outside its second.
        let watch = (self.watch, BodyIdleTimeoutLayer::new(idle));
        ClientBuilder {
            recorder: self.recorder,
            classifier: self.classifier,
            shared: self.shared,
            key: self.key,
            replay: self.replay,
            retry: self.retry,
            hedge: self.hedge,
            breaker: self.breaker,
            watch,
        }
    }

    /// Records HTTP attempts at the head of their response, and leaves the transport's
    /// responses as they are.
    pub fn no_body_watch(self) -> ClientBuilder<R, M, Z, K, P, H, B, Identity> {
        self.watch_part(Identity::new(), false)
    }

    fn watch_part<W2>(
        self,
        watch: W2,
        at_body_end: bool,
    ) -> ClientBuilder<R, M, Z, K, P, H, B, W2> {
        ClientBuilder {
            recorder: self.recorder,
            classifier: self.classifier,
            shared: Shared {
                at_body_end,
                body_idle: None,
                ..self.shared
            },
            key: self.key,
            replay: self.replay,
            retry: self.retry,
            hedge: self.hedge,
            breaker: self.breaker,
            watch,
        }
    }

    /// No circuit breaker.
    pub fn no_breaker(self) -> ClientBuilder<R, M, Z, K, P, H, Identity, W> {
        self.breaker_part(Identity::new())
    }

    /// The stack's effective settings, every default filled in: the input of a
    /// [review](crate::review) of the services that use it. Describe the builder before
    /// [`build`](Self::build) takes it.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let builder = surely::client::http()
    ///     .timeout(Duration::from_secs(2))
    ///     .retry(|retry| retry.max_attempts(4));
    /// let settings = builder.describe();
    /// assert_eq!(settings.timeout, Some(Duration::from_secs(2)));
    /// assert_eq!(settings.retry.max_attempts, 4);
    /// assert!(settings.generates_keys && settings.replays_bodies);
    /// assert!(settings.hedge.is_none() && settings.breaker.is_some());
    /// ```
    pub fn describe(&self) -> ClientSettings
    where
        K: Slot,
        P: Slot,
        H: Slot,
        B: Slot,
    {
        let (timeout, propagates_deadline) = self.shared.deadline.described();
        let retry = self.retry.describe();
        let mut settings = ClientSettings {
            timeout,
            per_try_timeout: self.shared.per_try,
            propagates_deadline,
            generates_keys: false,
            server_honours_keys: false,
            replays_bodies: false,
            retry,
            hedge: None,
            breaker: None,
        };
        self.key.describe(&mut settings);
        self.replay.describe(&mut settings);
        self.hedge.describe(&mut settings);
        self.breaker.describe(&mut settings);
        settings
    }

    /// Validates every setting and makes the stack's layer, to apply to many transports.
    #[allow(clippy::type_complexity)]
    pub fn into_layer(self) -> Result<ClientLayer<R, M, Z, K, P, H, B, W>, ConfigError>
    where
        R: RecorderPart<M>,
        M: Clone,
        H: Part<M>,
        B: BreakerPart<M, H>,
    {
        self.validate()?;
        Ok(self.assemble())
    }

    /// Checks every setting, as [`into_layer`](Self::into_layer) does.
    fn validate(&self) -> Result<(), ConfigError>
    where
        H: Part<M>,
    {
        if let Some(per_try) = self.shared.per_try {
            AttemptTimeoutLayer::builder().per_try(per_try).build()?;
        }
        if let Some(idle) = self.shared.body_idle {
            BodyIdleTimeoutLayer::builder().idle(idle).build()?;
        }
        self.hedge.check()?;
        self.shared.deadline.validate()?;
        self.retry.validate()
    }

    /// The stack's layer of these settings, which the caller has checked (or which are a
    /// preset's defaults, as [`SurelyMiddleware::new`] uses them: a test builds the same
    /// through [`into_layer`](Self::into_layer)).
    ///
    /// [`SurelyMiddleware::new`]: crate::reqwest::middleware::SurelyMiddleware::new
    #[allow(clippy::type_complexity)]
    pub(crate) fn assemble(self) -> ClientLayer<R, M, Z, K, P, H, B, W>
    where
        R: RecorderPart<M>,
        M: Clone,
        H: Part<M>,
        B: BreakerPart<M, H>,
    {
        let timeout = match self.shared.per_try {
            Some(per_try) => AttemptTimeoutLayer::new(per_try),
            None => AttemptTimeoutLayer::deadline_only(),
        };
        let hedge = self
            .hedge
            .assemble(self.classifier.clone(), self.shared.budget.clone());
        let (breaker, retry) = self.breaker.into_part(self.classifier.clone(), self.retry);
        let (record_call, record_attempt) = self
            .recorder
            .into_layers(self.classifier, self.shared.at_body_end);
        ClientLayer {
            record_attempt,
            record_call,
            deadline: self.shared.deadline.assemble(),
            key: self.key,
            replay: self.replay,
            hedge,
            breaker,
            retry: retry.assemble(),
            timeout,
            watch: self.watch,
        }
    }

    /// Validates every setting and wraps a tonic `Channel` (or any service over
    /// `http::Request<tonic::body::Body>`) in the stack, through a
    /// [`GrpcTransport`](crate::grpc::GrpcTransport) that hands tonic its own body type back.
    /// See [`grpc()`] for an example.
    #[cfg(feature = "tonic")]
    #[allow(clippy::type_complexity)]
    pub fn build_channel<S>(
        self,
        channel: S,
    ) -> Result<
        <ClientLayer<R, M, Z, K, P, H, B, W> as Layer<crate::grpc::GrpcTransport<S>>>::Service,
        ConfigError,
    >
    where
        M: Clone,
        R: RecorderPart<M>,
        H: Part<M>,
        B: BreakerPart<M, H>,
        ClientLayer<R, M, Z, K, P, H, B, W>: Layer<crate::grpc::GrpcTransport<S>>,
    {
        self.build(crate::grpc::GrpcTransport::new(channel))
    }

    /// Validates every setting and wraps `transport` in the stack.
    #[allow(clippy::type_complexity)]
    pub fn build<S>(
        self,
        transport: S,
    ) -> Result<<ClientLayer<R, M, Z, K, P, H, B, W> as Layer<S>>::Service, ConfigError>
    where
        M: Clone,
        R: RecorderPart<M>,
        H: Part<M>,
        B: BreakerPart<M, H>,
        ClientLayer<R, M, Z, K, P, H, B, W>: Layer<S>,
    {
        Ok(self.into_layer()?.layer(transport))
    }
}

impl<R, M, Z, K, P, H, B, W> ClientBuilder<R, M, Z, K, P, H, B, (W, BodyIdleTimeoutLayer)> {
    /// Changes the duration of the body idle timeout the stack has (for the configuration),
    /// checked when the stack is built.
    #[cfg(feature = "serde")]
    pub(crate) fn set_body_idle(mut self, idle: Duration) -> Self {
        self.shared.body_idle = Some(idle);
        self.watch.1 = BodyIdleTimeoutLayer::new(idle);
        self
    }
}

impl<R, M, Z, Q, P, H, B, W> ClientBuilder<R, M, Z, SetIdempotencyKeyLayer<Q>, P, H, B, W> {
    /// Declares that the server this client calls honours idempotency keys (it runs this
    /// crate's [`IdempotencyLayer`][crate::server::idempotency::IdempotencyLayer], or documents
    /// the `Idempotency-Key` header): the keys the client generates then make POST and PATCH
    /// requests [`Keyed`](crate::Semantics::Keyed), retried with the same key after a lost
    /// reply.
    ///
    /// By default the client cannot know that, and promises nothing it cannot know: it still
    /// sends a generated key, but a POST whose reply was lost ends
    /// [`Unknown`](crate::Outcome::Unknown) and is not sent again. A key the caller sets (an
    /// `Idempotency-Key` header or an [`IdempotencyKey`](crate::idempotency::IdempotencyKey)
    /// extension) makes its request keyed either way, and a
    /// [`Semantics`](crate::Semantics) extension always wins. See
    /// [`SetIdempotencyKeyLayer::server_honours_keys`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::{Outcome, OutcomeExt};
    /// use tower::{service_fn, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// // The first reply is lost; the server honours keys, so the retry gets the stored result.
    /// let attempts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    /// let seen = attempts.clone();
    /// let transport = service_fn(move |_req: http::Request<String>| {
    ///     let n = seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    ///     async move {
    ///         if n == 0 {
    ///             return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    ///         }
    ///         Ok(http::Response::builder()
    ///             .header("idempotent-replayed", "true")
    ///             .body(String::from("created"))
    ///             .unwrap())
    ///     }
    /// });
    /// let mut client = surely::client()
    ///     .server_honours_keys()
    ///     .retry(|r| r.backoff(surely::retry::backoff::Backoff::none()))
    ///     .build(transport)
    ///     .unwrap();
    /// let order = http::Request::post("/orders").body("o-1".to_owned()).unwrap();
    /// let res = client.ready().await.unwrap().call(order).await.unwrap();
    /// assert_eq!(res.outcome(), Outcome::Succeeded);
    /// let call = res.call_outcome().unwrap();
    /// assert_eq!(call.attempts(), 2);
    /// assert!(call.is_replayed());
    /// assert!(call.idempotency_key().is_some());
    /// # }
    /// ```
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::idempotency::IdempotencyLayer",
        )
    )]
    pub fn server_honours_keys(mut self) -> Self {
        self.key = self.key.server_honours_keys();
        self
    }
}

impl<R, M, Z, K, P, H, B, W> fmt::Debug for ClientBuilder<R, M, Z, K, P, H, B, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("deadline", &self.shared.deadline)
            .field("retry", &self.retry)
            .field("per_try", &self.shared.per_try)
            .finish_non_exhaustive()
    }
}

/// The recorder slot of a [`ClientBuilder`] before [`recorder`](ClientBuilder::recorder) is
/// called: the stack it builds has no record layers at all, so records cost a call nothing,
/// not even a pass-through. The outcome still comes back with every response and error: the
/// retry layer, which every client stack has, hands it back.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoRecords;

/// The canonical client stack as one layer, made by [`ClientBuilder::into_layer`].
#[derive(Clone)]
pub struct ClientLayer<
    R: RecorderPart<M>,
    M,
    Z,
    K,
    P,
    H: Part<M>,
    B: BreakerPart<M, H>,
    W = Identity,
> {
    record_call: R::CallLayer,
    record_attempt: R::AttemptLayer,
    deadline: SetDeadlineLayer<AttemptTimers>,
    key: K,
    replay: P,
    retry: RetryLayer<M, Z>,
    hedge: H::Layer,
    breaker: B::Layer,
    timeout: AttemptTimeoutLayer,
    watch: W,
}

/// The services from the (watched) transport up to the breaker.
type Attempts<T, R, M> =
    <<R as RecorderPart<M>>::AttemptLayer as Layer<AttemptTimeout<T>>>::Service;

/// The services from the (watched) transport up to the hedge.
type LayeredHedge<T, R, M, H, B> = <<H as Part<M>>::Layer as Layer<
    <<B as BreakerPart<M, H>>::Layer as Layer<Attempts<T, R, M>>>::Service,
>>::Service;

impl<S, R, M, Z, K, P, H, B, W> Layer<S> for ClientLayer<R, M, Z, K, P, H, B, W>
where
    R: RecorderPart<M>,
    M: Clone,
    H: Part<M>,
    B: BreakerPart<M, H>,
    W: Layer<S>,
    R::AttemptLayer: Layer<AttemptTimeout<W::Service>>,
    B::Layer: Layer<Attempts<W::Service, R, M>>,
    H::Layer: Layer<<B::Layer as Layer<Attempts<W::Service, R, M>>>::Service>,
    P: Layer<Retry<LayeredHedge<W::Service, R, M, H, B>, M, Z>>,
    K: Layer<P::Service>,
    R::CallLayer: Layer<SetDeadline<K::Service, AttemptTimers>>,
{
    type Service = <R::CallLayer as Layer<SetDeadline<K::Service, AttemptTimers>>>::Service;

    fn layer(&self, transport: S) -> Self::Service {
        let watched = self.watch.layer(transport);
        let attempts = self.record_attempt.layer(self.timeout.layer(watched));
        let retried = self
            .retry
            .layer(self.hedge.layer(self.breaker.layer(attempts)));
        let keyed = self.key.layer(self.replay.layer(retried));
        self.record_call.layer(self.deadline.layer(keyed))
    }
}

impl<R: RecorderPart<M>, M, Z, K, P, H: Part<M>, B: BreakerPart<M, H>, W> fmt::Debug
    for ClientLayer<R, M, Z, K, P, H, B, W>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientLayer")
            .field("deadline", &self.deadline)
            .field("retry", &self.retry)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The builder's slots: what the hedge, breaker and recorder slots of a [`ClientBuilder`] may
/// hold, and the layers each becomes. Public in a private module, so that the builder's bounds
/// can name them and users cannot: they are filled through the builder's methods.
mod parts {
    use super::*;

    /// A part of the stack that takes the client's classifier and budget: the hedge slot of a
    /// [`ClientBuilder`] (`Identity` when absent).
    pub trait Part<M> {
        /// The layer it becomes.
        type Layer;

        /// Checks its settings.
        fn check(&self) -> Result<(), ConfigError>;

        /// Makes the layer, with the client's classifier and retry budget, from settings
        /// [`check`](Self::check) accepted.
        fn assemble(self, classifier: M, budget: Option<Arc<dyn RetryBudget>>) -> Self::Layer;
    }

    impl<M> Part<M> for Identity {
        type Layer = Identity;

        fn check(&self) -> Result<(), ConfigError> {
            Ok(())
        }

        fn assemble(self, _: M, _: Option<Arc<dyn RetryBudget>>) -> Identity {
            self
        }
    }

    impl<M, M0> Part<M> for HedgeLayerBuilder<M0> {
        type Layer = HedgeLayer<M>;

        fn check(&self) -> Result<(), ConfigError> {
            self.validate()
        }

        fn assemble(self, classifier: M, budget: Option<Arc<dyn RetryBudget>>) -> HedgeLayer<M> {
            let hedge = self.classifier(classifier);
            match budget {
                Some(budget) => hedge.budget(budget),
                None => hedge.no_budget(),
            }
            .assemble()
        }
    }

    /// The breaker slot of a [`ClientBuilder`], beside its hedge slot `H`: no breaker
    /// (`Identity`), or a [`CircuitBreaker`], which goes where it counts what it should at the
    /// least cost.
    ///
    /// * Without a hedge, the retry layer guards each attempt itself
    ///   ([`RetryLayerBuilder::circuit_breaker`]): the same admissions and counts as a
    ///   [`BreakerLayer`] right inside it, with no layer and no clone of the breaker per
    ///   call.
    /// * With a hedge, a [`BreakerLayer`] under the hedge admits and counts each copy of a
    ///   hedged attempt.
    pub trait BreakerPart<M, H> {
        /// The layer it puts under the hedge (`Identity` for none).
        type Layer;

        /// Makes its layer with the client's classifier, and gives the retry layer's builder its
        /// part.
        fn into_part<Z>(
            self,
            classifier: M,
            retry: RetryLayerBuilder<M, Z>,
        ) -> (Self::Layer, RetryLayerBuilder<M, Z>);
    }

    impl<M, H> BreakerPart<M, H> for Identity {
        type Layer = Identity;

        fn into_part<Z>(
            self,
            _: M,
            retry: RetryLayerBuilder<M, Z>,
        ) -> (Identity, RetryLayerBuilder<M, Z>) {
            (self, retry)
        }
    }

    impl<M> BreakerPart<M, Identity> for CircuitBreaker {
        type Layer = Identity;

        fn into_part<Z>(
            self,
            _: M,
            retry: RetryLayerBuilder<M, Z>,
        ) -> (Identity, RetryLayerBuilder<M, Z>) {
            (Identity::new(), retry.circuit_breaker(self))
        }
    }

    impl<M, M0> BreakerPart<M, HedgeLayerBuilder<M0>> for CircuitBreaker {
        type Layer = BreakerLayer<M>;

        fn into_part<Z>(
            self,
            classifier: M,
            retry: RetryLayerBuilder<M, Z>,
        ) -> (BreakerLayer<M>, RetryLayerBuilder<M, Z>) {
            (BreakerLayer::new(self).classifier(classifier), retry)
        }
    }

    /// A slot of a [`ClientBuilder`] that says what it adds to the stack's
    /// [`ClientSettings`]: the key, replay, hedge and breaker slots. An empty slot
    /// (`Identity`) adds nothing.
    pub trait Slot {
        /// Writes its part of the settings.
        fn describe(&self, settings: &mut ClientSettings);
    }

    impl Slot for Identity {
        fn describe(&self, _: &mut ClientSettings) {}
    }

    impl<Q> Slot for SetIdempotencyKeyLayer<Q> {
        fn describe(&self, settings: &mut ClientSettings) {
            settings.generates_keys = true;
            settings.server_honours_keys = self.honours_keys();
        }
    }

    impl Slot for ReplayLayer {
        fn describe(&self, settings: &mut ClientSettings) {
            settings.replays_bodies = true;
        }
    }

    impl<M0> Slot for HedgeLayerBuilder<M0> {
        fn describe(&self, settings: &mut ClientSettings) {
            settings.hedge = Some(HedgeLayerBuilder::describe(self));
        }
    }

    impl Slot for CircuitBreaker {
        fn describe(&self, settings: &mut ClientSettings) {
            settings.breaker = Some(CircuitBreaker::describe(self));
        }
    }

    /// The recorder slot of a [`ClientBuilder`]: [`NoRecords`], or any [`Recorder`], which gets
    /// a [`RecordCallLayer`] around the deadline and a [`RecordAttemptLayer`] around each attempt.
    pub trait RecorderPart<M> {
        /// The layer around the whole call.
        type CallLayer;
        /// The layer around each attempt.
        type AttemptLayer;

        /// Makes the two layers, with the client's classifier; `at_body_end` as
        /// [`ClientBuilder::settle_at_body_end`] sets it.
        fn into_layers(
            self,
            classifier: M,
            at_body_end: bool,
        ) -> (Self::CallLayer, Self::AttemptLayer);
    }

    impl<M> RecorderPart<M> for NoRecords {
        type CallLayer = Identity;
        type AttemptLayer = Identity;

        fn into_layers(self, _: M, _: bool) -> (Identity, Identity) {
            (Identity::new(), Identity::new())
        }
    }

    impl<R: Recorder + Clone, M: Clone> RecorderPart<M> for R {
        type CallLayer = RecordCallLayer<R, M>;
        type AttemptLayer = RecordAttemptLayer<R, M>;

        fn into_layers(
            self,
            classifier: M,
            at_body_end: bool,
        ) -> (RecordCallLayer<R, M>, RecordAttemptLayer<R, M>) {
            let attempt = RecordAttemptLayer::new(self.clone()).with_classifier(classifier.clone());
            let attempt = if at_body_end {
                attempt.at_body_end()
            } else {
                attempt
            };
            let call = RecordCallLayer::new(self)
                .with_classifier(classifier)
                .inner_reports();
            (call, attempt)
        }
    }
}

pub(crate) use self::parts::{BreakerPart, Part, RecorderPart, Slot};

#[cfg(test)]
mod tests {
    use super::*;

    /// The presets' defaults, which `SurelyMiddleware::new` assembles without checking, are
    /// the ones `into_layer` accepts.
    #[tokio::test(start_paused = true)]
    async fn the_presets_defaults_build() {
        assert!(client().validate().is_ok());
        assert!(http().validate().is_ok());
        assert!(http().no_replay().validate().is_ok());
        assert!(grpc().validate().is_ok());
        let built = http().no_replay().into_layer().unwrap();
        let assembled = http().no_replay().assemble();
        assert_eq!(format!("{built:?}"), format!("{assembled:?}"));
    }
}
