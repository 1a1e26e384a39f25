//! Hedging, for safe reads only: when an attempt is slow, send a copy and keep the first good
//! answer.
//!
//! A few slow replies (a garbage-collection pause, a cold cache, a busy replica) make the tail
//! of a service's latency. Waiting longer does not help them; asking again, elsewhere, does.
//! [`HedgeLayer`] sends a copy of the request (a *hedge*) when the first attempt has not
//! answered after a delay, keeps the first good answer, and drops (cancels) the others.
//!
//! # What may be hedged
//!
//! A hedge runs **concurrently** with the attempt it hedges: both may reach the server. So only
//! requests whose repetition is harmless are hedged, by their [`Semantics`](crate::Semantics):
//!
//! | semantics | hedged |
//! | --- | --- |
//! | `Safe` (GET, HEAD, OPTIONS, TRACE) | yes |
//! | `Idempotent` (PUT, DELETE) | only with [`hedge_idempotent(true)`](HedgeLayerBuilder::hedge_idempotent) |
//! | `Keyed`, `NonIdempotent` | **never**, whatever the configuration |
//!
//! A request that is not hedged passes through untouched: the layer then costs a branch. (A
//! keyed request is not hedged because two concurrent attempts with one key make the server's
//! idempotency layer answer the second with "key in flight": a wasted round trip.)
//!
//! # The delay
//!
//! [`HedgeDelay::fixed`], or [`HedgeDelay::percentile`] (the default, p95): the percentile of the
//! latencies of recent successful attempts (a rotating window of up to
//! [`window`](HedgeDelay::window) of them), kept in an [`hdrhistogram`](https://docs.rs/hdrhistogram)
//! histogram, with a fallback delay until enough were seen. With p95, about 5% of attempts are
//! slower than the delay, so hedges are at most about 5% of the load, and they are sent for
//! exactly the calls in the tail. Recording a latency takes no lock; the percentile is recomputed
//! every quarter of a window. Attempts answered on their first poll are not measured (the delay
//! never applies to them, and the fast path reads no clock), nor are attempts that lost the race
//! (they were cancelled), so the learned delay leans slightly low.
//!
//! # Which answer wins
//!
//! Every attempt's answer is classified by the same [classifier](crate::classify) the retry
//! layer and the records use. The first *answer from a working server* wins: a success, and also a
//! final answer or a conflict (a 404 is the server's answer; a hedge would get the same). A
//! *health failure* of one attempt (rejected, or maybe committed: a 503, a reset, a 502) is not
//! fatal, as gRPC's `nonFatalStatusCodes`: the next hedge is sent at once, without waiting for
//! the delay, while the other attempts keep running. A server's pushback is obeyed: "retry
//! after" delays the next hedge while other attempts run (with none running, the failure is
//! returned at once: waiting is the retry layer's job, with its cap on pushback), and "do not
//! retry" stops hedging. When every attempt failed and no hedge may be sent, the last failure is
//! the call's result, for a retry layer outside to judge.
//!
//! # What bounds the extra load
//!
//! * the attempt limit (default 2 in total: one hedge);
//! * a [retry budget](crate::budget): every hedge withdraws one unit, and no hedge is sent when
//!   the budget refuses. By default the layer pays from the budget of the
//!   [`RetryLayer`](crate::retry::RetryLayer) outside it, which lends it to the attempts it sends
//!   (the retry layer deposits for each call; this layer only withdraws), as it does when given
//!   that budget with [`budget`](HedgeLayerBuilder::budget). Without a retry layer outside (or
//!   one that calls it from another task, through a `Buffer`), it keeps one of its own, a
//!   [`RatioBudget`](crate::budget::RatioBudget), and deposits once per hedgeable call that did
//!   not answer at once; [`own_budget`](HedgeLayerBuilder::own_budget) gives it one of its own
//!   always;
//! * the call's deadline: no hedge is sent that would have less than the
//!   [minimum attempt time](HedgeLayerBuilder::min_attempt_time) left (or the learned median
//!   latency, when larger), and the hedge timer lives in the call's future: it ends with it.
//!
//! # Records
//!
//! Inside the hedge layer, a [`RecordAttemptLayer`](crate::record::RecordAttemptLayer) numbers
//! the attempts in the order they were sent and marks hedges
//! ([`AttemptRecord::hedge`](crate::record::AttemptRecord::hedge)); a hedge (or the first
//! attempt) that lost the race is recorded as `cancelled`.
//!
//! # Where it goes
//!
//! Inside the retry layer and outside the breaker, the attempt timeout and the attempt record
//! ([layer order](crate::docs::architecture#layer-order)): the retry layer sees one attempt per
//! hedged race.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use surely::budget::{RatioBudget, RetryBudget};
//! use surely::hedge::{HedgeDelay, HedgeLayer};
//! use surely::record::{InMemoryRecorder, RecordAttemptLayer, RecordCallLayer};
//! use surely::retry::RetryLayer;
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), surely::ConfigError> {
//! // The first attempt takes a second; the others, 10 ms.
//! let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
//! let transport = service_fn(move |_req: http::Request<()>| {
//!     let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
//!     async move {
//!         let ms = if n == 0 { 1000 } else { 10 };
//!         tokio::time::sleep(Duration::from_millis(ms)).await;
//!         Ok::<_, std::io::Error>(http::Response::new(()))
//!     }
//! });
//! let budget: Arc<dyn RetryBudget> = Arc::new(RatioBudget::default());
//! let records = InMemoryRecorder::new();
//! let mut client = ServiceBuilder::new()
//!     .layer(RecordCallLayer::new(records.clone()))
//!     .layer(RetryLayer::builder().budget(budget.clone()).build()?)
//!     .layer(
//!         HedgeLayer::builder()
//!             .delay(HedgeDelay::fixed(Duration::from_millis(50)))
//!             .budget(budget)
//!             .build()?,
//!     )
//!     .layer(RecordAttemptLayer::new(records.clone()))
//!     .service(transport);
//!
//! let start = tokio::time::Instant::now();
//! let get = http::Request::get("/orders/o-1").body(()).unwrap();
//! client.ready().await.unwrap().call(get).await.unwrap();
//! // The hedge, sent at 50 ms, answered at 60 ms.
//! assert_eq!(start.elapsed(), Duration::from_millis(60));
//! let attempts = records.attempts();
//! assert!(attempts.iter().any(|a| a.attempt == 2 && a.hedge && !a.cancelled));
//! assert!(attempts.iter().any(|a| a.attempt == 1 && !a.hedge && a.cancelled));
//! # Ok(()) }
//! ```
//!
//! # Compared with tower's `Hedge`
//!
//! tower's `hedge::Hedge` sends at most one hedge, learns its delay from a histogram of every
//! attempt behind a mutex taken twice per call, counts any response as the winner (a 503
//! too), has no budget and no deadline, and leaves it to a policy to decide which requests may be
//! hedged. This layer reads the request's semantics itself, classifies every answer, spends the
//! retry budget, respects the deadline, and records losers as cancelled hedges.

pub mod future;
mod latency;
mod layer;
mod service;

pub use self::layer::{HedgeDelay, HedgeLayer, HedgeLayerBuilder};
pub use self::service::Hedge;
