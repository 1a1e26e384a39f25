//! An adaptive concurrency limit for a server: say no early and clearly.
//!
//! Backoff and jitter only spread a rush of retries; a service that takes every request it is
//! sent still queues them when it is overloaded, and a queued request waits, times out at its
//! caller, and is served anyway, for nobody. The server's side of overload protection is to
//! admit only as many requests at once as it can serve without queueing, and to refuse the
//! rest *at once*, in words its callers understand:
//!
//! * `503 Service Unavailable` with `Retry-After` (gRPC: `UNAVAILABLE` with
//!   `grpc-retry-pushback-ms`), so that clients wait at least that long: pushback is flow
//!   control;
//! * [`surely-not-processed: overload`](crate::headers::NOT_PROCESSED), so that a client knows
//!   the handler never ran: surely's classifiers read the refusal as *rejected*, which every
//!   request may retry (a POST too), within the client's retry budget.
//!
//! # How much is "as many as it can serve"
//!
//! Nobody knows the right number in advance, and it changes with the machine, the database,
//! the request mix. [`AdaptiveLimitLayer`] learns it, as Netflix's concurrency-limits and
//! Envoy's adaptive concurrency filter do: the [`Gradient`] algorithm (the default) shrinks
//! the limit when latency rises above its long-run level (requests are waiting somewhere) and
//! grows it while latency holds; [`Aimd`] grows it slowly and cuts it when requests are
//! *dropped* (the handler answered `429`, `503` or `504`, or finished after its caller's
//! deadline).
//!
//! # Who is refused first
//!
//! * **[`Criticality`](crate::Criticality)**: a request says how critical it is (an extension
//!   the host sets, or the [`CRITICALITY`](crate::headers::CRITICALITY) header). Each level may
//!   fill a share of the limit (by default `sheddable` 80 %, `sheddable-plus` 90 %, `critical`
//!   100 %, `critical-plus` 110 %), so as the limit fills, batch work is refused first and
//!   what users wait for still gets in. An untrusted caller's header can lower its request's
//!   criticality, never raise it ([`trust_criticality`](AdaptiveLimitLayerBuilder::trust_criticality)).
//! * **Partitions**: a route can have a reserved share of the limit
//!   ([`partition`](AdaptiveLimitLayerBuilder::partition)): while it uses less than its share,
//!   its requests get in even when other routes have filled the limit.
//!
//! # Where work starts
//!
//! A limit keeps queues short, but a request can still wait: in a queue before the limit, in
//! the handler's own pool. [`RecheckLayer`](crate::server::deadline::RecheckLayer) (and its
//! function form, [`can_finish`](crate::server::deadline::can_finish)) looks at the request's
//! deadline where the work starts and refuses work that can no longer finish in time.
//!
//! # Placing it
//!
//! Put the limit outside everything that costs (the idempotency layer's store, the handler),
//! and inside the [`ServerDeadlineLayer`](crate::server::deadline::ServerDeadlineLayer), so that
//! the limit sees the request's deadline (AIMD learns from missed deadlines):
//!
//! ```
//! use std::time::Duration;
//! use surely::server::deadline::ServerDeadlineLayer;
//! use surely::server::limit::AdaptiveLimitLayer;
//! use tower::{service_fn, ServiceBuilder};
//!
//! let limit = AdaptiveLimitLayer::new();
//! let svc = ServiceBuilder::new()
//!     .layer(ServerDeadlineLayer::builder().max(Duration::from_secs(5)).build().unwrap())
//!     .layer(limit.clone())
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//!     }));
//! # let _ = svc;
//! // For dashboards: `limit.limit()`, `limit.in_flight()`, `limit.refused(reason)`, or a
//! // recorder on the builder.
//! ```
//!
//! # How it differs from tower's `ConcurrencyLimit` and `LoadShed`
//!
//! tower's `ConcurrencyLimit` has a fixed limit and makes excess requests *wait* in
//! `poll_ready`; `LoadShed` refuses when the inner service is not ready, with an error the
//! server must turn into a response. This layer learns its limit, answers the refusal itself
//! with the headers that make clients back off and know nothing ran, and sheds by criticality
//! and partition.
//!
//! # Cost
//!
//! Admission and release are a few atomic operations, no lock and no allocation. A request's
//! criticality (an extension, a header) is read only when the limit is nearly full, and an
//! answer that teaches the algorithm nothing (most of them) costs a few comparisons; the
//! gradient reads the clock twice for one request in eight. `cargo bench --bench limit`
//! measures it against the bare service and tower's `ConcurrencyLimit` (see
//! `benches/README.md`).

mod algorithm;
pub mod future;
mod layer;
mod service;

pub use self::algorithm::{Aimd, Algorithm, Gradient};
pub use self::layer::{AdaptiveLimitLayer, AdaptiveLimitLayerBuilder};
pub use self::service::AdaptiveLimit;

pub(crate) use self::algorithm::Shared;
