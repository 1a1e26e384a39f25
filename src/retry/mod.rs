//! Retries that cannot make things worse.
//!
//! [`RetryLayer`] sends an attempt again only when the shared classifier says it may be sent
//! again for this request (the attempt table of [`docs::outcomes`](crate::docs::outcomes)):
//!
//! * a *rejected, not processed* attempt (refused before send, 429, 503 with `Retry-After`, a
//!   keyed request's "in flight" 409) is retried for every request, a POST without a key
//!   included: nothing happened;
//! * a *maybe committed* attempt (a timeout or reset after send, a 502) is retried only for
//!   safe, idempotent and keyed requests. A POST without a key stops there, and its outcome is
//!   *unknown*;
//! * success, final answers and conflicts are never retried.
//!
//! And only while nothing else says stop:
//!
//! * the **attempt limit** (default 3, the first included);
//! * the server's **pushback**: `Retry-After` or `grpc-retry-pushback-ms` replaces the backoff,
//!   and is never shortened: a server that asks for more patience than the cap (default 30 s)
//!   or the call's deadline allows is not retried at all (the call stops, reason pushback); a
//!   negative or malformed `grpc-retry-pushback-ms` means do not retry, and a `Retry-After` that
//!   does not parse counts as absent;
//! * the call's **deadline**: no wait is begun that would leave the next attempt less than the
//!   minimum attempt time (default 10 ms), so no attempt starts that cannot finish;
//! * the **retry budget** ([`budget`](crate::budget)): retries stay a small share of first
//!   attempts, so an outage is not multiplied by the attempt limit. The budget is asked last,
//!   so a retry refused for another reason spends nothing.
//!
//! The waits come from a [`backoff::Backoff`] (exponential, capped, full jitter by default).
//! When the call stops with a retryable attempt, the call's record says why
//! ([`StopReason`](crate::StopReason): attempts exhausted, budget exhausted, deadline,
//! pushback, not replayable), and the call returns that last attempt's outcome.
//!
//! # One retry owner per chain
//!
//! If every hop of a call chain retries three times, a failure at the bottom of five hops is
//! tried 3⁵ = 243 times. So the layer marks each attempt with [`RETRY_OWNER`](crate::headers::RETRY_OWNER); the next hop's
//! [`ServerDeadlineLayer`][crate::server::deadline::ServerDeadlineLayer] carries the mark into its
//! handler's context, and a retry layer inside that handler then retries only attempts that
//! were provably not sent (refused before any byte left), stopping with
//! [`UpstreamOwnsRetries`](crate::StopReason::UpstreamOwnsRetries) otherwise. Retries
//! then happen once, at the top. The next hop honours the mark only if it trusts this caller
//! ([`trust_retry_signals`][crate::server::deadline::ServerDeadlineLayerBuilder::trust_retry_signals]);
//! turn it off with [`mark_owner(false)`](RetryLayerBuilder::mark_owner) (or the client's
//! [`no_internal_headers`](crate::client::ClientBuilder::no_internal_headers)) for a server that
//! is not yours.
//!
//! Retries go out as copies of the first request (`Req: Clone`), with the same idempotency key
//! when an [`SetIdempotencyKeyLayer`](crate::idempotency::SetIdempotencyKeyLayer) is outside. A
//! streaming HTTP body cannot be copied: a [`ReplayLayer`] outside buffers bodies up to
//! 64 KiB so that every attempt sends the same bytes, and marks larger ones [`NotReplayable`],
//! which this layer sends once (the record says
//! [`NotReplayable`](crate::StopReason::NotReplayable) when a retry was wanted). gRPC
//! requests say how many attempts came before in `grpc-previous-rpc-attempts`.
//!
//! # Where it goes
//!
//! Inside the deadline and idempotency-key layers, outside the attempt timeout and the attempt
//! record ([layer order](crate::docs::architecture#layer-order)), so that every attempt is timed
//! and recorded, and the deadline bounds them all.
//!
//! # How this differs from `tower::retry`
//!
//! tower's `Retry` asks you to write the policy; this layer has one, driven by the same
//! classifier as the records, and knows what tower's cannot: whether an attempt may have
//! committed, what the request's semantics allow, the call's deadline, and the server's
//! pushback.
//!
//! ```
//! use std::time::Duration;
//! use surely::fault::{Fault, InjectFaultLayer, Reply, Schedule};
//! use surely::retry::{backoff::Backoff, RetryLayer};
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! // The first request meets an overloaded upstream that asks to come back in 2 s.
//! let overloaded = Reply::new(http::StatusCode::SERVICE_UNAVAILABLE).retry_after(Duration::from_secs(2));
//! let mut client = ServiceBuilder::new()
//!     .layer(RetryLayer::builder().backoff(Backoff::none()).build().unwrap())
//!     .layer(InjectFaultLayer::new(Schedule::new().at(0, Fault::Respond(overloaded))))
//!     .service(service_fn(|_req: http::Request<String>| async {
//!         Ok::<_, std::io::Error>(http::Response::new(String::from("created")))
//!     }));
//!
//! let start = tokio::time::Instant::now();
//! let order = http::Request::post("/orders").body("o-1".to_owned()).unwrap();
//! let res = client.ready().await.unwrap().call(order).await.unwrap();
//! assert_eq!(res.body(), "created");
//! // A 503 with Retry-After was not processed: even a POST without a key may go again, after
//! // the wait the server asked for.
//! assert_eq!(start.elapsed(), Duration::from_secs(2));
//! # }
//! ```
#![cfg_attr(
    not(feature = "server"),
    doc = crate::docs::links::to_features!(
        "crate::server::deadline::ServerDeadlineLayer",
        "crate::server::deadline::ServerDeadlineLayerBuilder::trust_retry_signals",
    )
)]

pub mod backoff;
pub mod future;
mod layer;
mod learn;
pub mod replay;
mod service;

pub use self::layer::{RetryLayer, RetryLayerBuilder};
pub use self::replay::{NotReplayable, Replay, ReplayBody, ReplayLayer};
pub use self::service::Retry;
pub use crate::error::BodyNotReplayable;
pub use crate::resolve::{NoResolver, Query, Resolution, Resolve, Resolving};
