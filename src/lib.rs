//! # surely
//!
//! Tower layers for calls whose outcome you cannot always know.
//!
//! A timeout only says that the caller got no answer in time. The server may never have seen
//! the request, may have committed it and lost the reply, or may still be working. `surely`
//! classifies every attempt as retryable, final, or *maybe committed*, using what the request is
//! ([`Semantics`]) and how far it got ([`DeliveryPhase`](classify::DeliveryPhase)), and ends every
//! call in one of three [`Outcome`]s: succeeded, failed, or **unknown**.
//!
//! The layers, outer to inner, for a client ([`client()`] builds them in one call):
//!
//! ```text
//! record::RecordCallLayer                   one record per logical call, its outcome and stop reason
//!   deadline::SetDeadlineLayer              one total budget, propagated in-process and on the wire
//!     idempotency::SetIdempotencyKeyLayer   one key per logical call, the same on every attempt
//!       retry::ReplayLayer                  HTTP bodies buffered so that every attempt sends them
//!         retry::RetryLayer                 retry what may be retried: budget, backoff, pushback
//!           hedge::HedgeLayer               safe reads only: a copy after a delay, first answer wins
//!             breaker::BreakerLayer         stop calling a failing dependency; say when to come back
//!               record::RecordAttemptLayer  one record per attempt: phase, class, budget left
//!                 timeout::AttemptTimeoutLayer  min(per-try timeout, remaining budget)
//!                   transport               hyper-util, tonic, any tower::Service
//! ```
//!
//! Each layer has the same shape: `FooLayer`, its service `Foo`, and the service's future
//! `foo::future::ResponseFuture`; `FooLayer::new(..)` never fails, and `FooLayer::builder()`
//! checks settings that can be wrong ([one shape for every
//! layer](docs::architecture#one-shape-for-every-layer)).
//!
//! Without a hedge, [`client()`] has the retry layer keep the breaker
//! ([`RetryLayerBuilder::circuit_breaker`](retry::RetryLayerBuilder::circuit_breaker)): the
//! same place in the order, and no layer of its own.
//!
//! Start with [`client()`] (or [`client::http()`], [`client::grpc()`]) and the guide in
//! [`docs`]; every layer also works on its own in a `tower::ServiceBuilder`.
//!
//! On the server (feature `server`), [`server::deadline::ServerDeadlineLayer`] reads the caller's
//! budget and makes it the current deadline for the handler, and [`fault::InjectFaultLayer`] injects
//! the failures this crate exists to handle, for tests and chaos drills.
//!
//! [`server::idempotency::IdempotencyLayer`] honours the client's `Idempotency-Key`: the first
//! request with a key runs, a duplicate waits (409) or gets the stored response, over an
//! in-memory, a PostgreSQL or a Redis [store][server::store] (features `server`, `postgres`,
//! `redis`).
//!
//! [`retry::RetryLayer`] puts the classification to work: it retries only what may be retried,
//! waits as [`retry::backoff`] or the server's pushback says, stops at the call's deadline, and
//! spends a [`budget`] so that retries stay a small share of the traffic.
//!
//! ```
//! use std::time::Duration;
//! use surely::Outcome;
//! use surely::deadline::SetDeadlineLayer;
//! use surely::record::{InMemoryRecorder, RecordAttemptLayer, RecordCallLayer};
//! use surely::timeout::AttemptTimeoutLayer;
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! // A transport that commits the order, then never answers.
//! let transport = service_fn(|_req: http::Request<String>| async {
//!     std::future::pending::<()>().await;
//!     Ok::<_, std::io::Error>(http::Response::new(()))
//! });
//! let records = InMemoryRecorder::new();
//! let mut client = ServiceBuilder::new()
//!     .layer(RecordCallLayer::new(records.clone()))
//!     .layer(SetDeadlineLayer::new(Duration::from_secs(2)))
//!     .layer(RecordAttemptLayer::new(records.clone()))
//!     .layer(AttemptTimeoutLayer::new(Duration::from_millis(500)))
//!     .service(transport);
//!
//! let order = http::Request::post("/orders").body("o-1".to_owned()).unwrap();
//! let err = client.ready().await.unwrap().call(order).await.unwrap_err();
//! assert!(err.is_elapsed());
//! // A POST without an idempotency key timed out after it was sent: nobody knows.
//! assert_eq!(records.calls()[0].outcome, Outcome::Unknown);
//! # }
//! ```
//!
//! # Features
//!
//! The default build is the client alone: every module that no feature below names. The rest is
//! behind features, all off by default; `full` turns them all on (docs.rs documents it). A link
//! in these docs to an item behind a feature that the build has off leads here.
//!
//! - `server`: `surely::server` (the server deadline layer, the adaptive limit, the idempotency
//!   layer and its in-memory store), the records of their events, and `surely::maintenance`.
//! - `durable`: `surely::outbox`, `surely::inbox`, `surely::ledger` and `surely::reconcile`
//!   (in-memory stores, the relay, the reconcilers), and `surely::maintenance`.
//! - `postgres`: `surely::postgres` (one pool, versioned migrations); with `server`, the
//!   PostgreSQL idempotency store (`server::store::PostgresStore`); with `durable`, the
//!   PostgreSQL outbox, inbox, ledger and differences; with either, `maintenance::PostgresLeases`.
//! - `postgres-log`: `outbox::LogRelay`, the outbox's events read from PostgreSQL's write-ahead
//!   log through a logical replication slot (turns on `durable` and `postgres`; needs
//!   `wal_level = logical`).
//! - `redis`: the idempotency store on Redis, `server::store::RedisStore` (turns on `server`).
//! - `nats`: the outbox's JetStream publisher, `outbox::JetStreamPublisher`, and with `postgres`
//!   the inbox's JetStream consumer (turns on `durable`).
//! - `rabbitmq`: the outbox's RabbitMQ publisher, `outbox::RabbitPublisher` (turns on
//!   `durable`).
//! - `hyper`: `surely::hyper`, hyper-util's client as the transport, and hyper's errors
//!   classified.
//! - `http2`: HTTP/2's `REFUSED_STREAM` read as rejected, not processed (turns on `hyper`).
//! - `tonic`: `grpc::GrpcTransport` and `grpc::StatusExt`, a tonic `Channel` as the transport of
//!   `client::grpc()` (`ClientBuilder::build_channel`), and tonic's transport errors classified
//!   (turns on `hyper`).
//! - `reqwest`: `surely::reqwest`, the client stack around a `reqwest::Client` (turns on
//!   `hyper`).
//! - `reqwest-middleware`: `surely::reqwest::middleware`, the client stack as one
//!   `reqwest_middleware` middleware (turns on `reqwest`).
//! - `opentelemetry`: `record::OtelRecorder`, metrics through the OpenTelemetry metrics API.
//! - `compression`: stored responses compressed, `IdempotencyLayerBuilder::compress_over`
//!   (turns on `server`).
//! - `serde`: `surely::config` and, with `server`, `surely::server::config`: the client presets
//!   and the server layers configured from plain structs.
//! - `review`: `review::Chain::from_toml`, a call chain read from a TOML file for a review of
//!   its settings (turns on `serde` and `server`; the review of a chain built in code needs no
//!   feature).
//! - `admin`: `surely::admin`, the operator's surface as an axum router (turns on `server`,
//!   `durable` and `serde`).
//! - `cli`: the `surely` command line, `surely review` among its commands (turns on `admin`,
//!   `postgres` and `review`).
#![cfg_attr(not(feature = "server"), doc = crate::docs::links::to_features!(
    "`server::deadline::ServerDeadlineLayer`",
    "`server::idempotency::IdempotencyLayer`",
    "server::store",
))]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// `get_ref`, `get_mut` and `into_inner` for a service whose inner service `S` is in `inner`.
macro_rules! inner_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// Consumes the layer, returning the inner service.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
    // A service that keeps a shared copy of its inner service in `spare` (`crate::spare`):
    // `get_mut` drops it, so that the attempts after it are cloned from the changed service.
    (spare) => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably. The copy the later attempts (retries, hedges) are cloned
        /// from is made again at the next call, from the inner service as it is then.
        pub fn get_mut(&mut self) -> &mut S {
            self.spare = None;
            &mut self.inner
        }

        /// Consumes the layer, returning the inner service.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}

#[cfg(feature = "admin")]
pub mod admin;
mod backoff;
pub mod breaker;
pub mod budget;
#[cfg(feature = "review")]
mod chainfile;
pub mod classify;
pub mod client;
#[cfg(feature = "serde")]
pub mod config;
mod context;
pub mod deadline;
pub mod delivery;
pub mod deps;
pub mod docs;
mod envelope;
mod error;
mod evidence;
pub mod fault;
pub mod grpc;
pub mod headers;
pub mod hedge;
#[cfg(feature = "hyper")]
pub mod hyper;
pub mod idempotency;
mod ids;
#[cfg(feature = "durable")]
pub mod inbox;
pub mod journal;
#[cfg(feature = "durable")]
pub mod ledger;
#[cfg(any(feature = "server", feature = "durable"))]
pub mod maintenance;
#[cfg(feature = "durable")]
pub mod outbox;
mod outcome;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod pushback;
#[cfg(feature = "durable")]
mod queue;
#[cfg(feature = "durable")]
pub mod reconcile;
pub mod record;
#[cfg(feature = "reqwest")]
pub mod reqwest;
mod resolve;
pub mod retry;
pub mod review;
mod semantics;
mod send;
#[cfg(feature = "server")]
pub mod server;
mod spare;
#[cfg(feature = "postgres")]
mod storage;
mod sync;
mod time;
pub mod timeout;

pub use crate::client::client;
pub use crate::envelope::Envelope;
pub use crate::error::{BoxedError, ConfigError, Error, ErrorKind, IntoError, TransportError};
pub use crate::outcome::{CallOutcome, Outcome, OutcomeExt, StopReason};
pub use crate::semantics::{Criticality, InvalidCriticality, Semantics};
pub use crate::send::Reply;
pub use crate::time::MAX_DURATION;

/// Under `--cfg surely_loom` only: the model's clock and the mutation switch, for the loom
/// models (`tests/loom/models.rs`, a crate of the workspace).
#[cfg(surely_loom)]
#[doc(hidden)]
pub use crate::sync::model as __loom;

/// The README's examples, compiled and run as doctests (with every feature they name on;
/// `tests/architecture`'s newcomer test compiles them in a crate of a user's, each with only its
/// own).
#[cfg(all(
    doctest,
    feature = "reqwest-middleware",
    feature = "hyper",
    feature = "server"
))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
