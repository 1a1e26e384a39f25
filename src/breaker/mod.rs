//! A circuit breaker: stop calling a dependency that is failing, and find out when it is back.
//!
//! Retries with a budget keep a failing dependency's extra load small; they do not stop the
//! first attempts. When most calls fail, each one still costs the caller a wait (often a full
//! timeout) and the dependency a request it cannot serve. A [`CircuitBreaker`] watches the
//! failure rate and, past a threshold, refuses calls at once for a while (the *break*), then
//! lets a few probes through to see whether the dependency is back:
//!
//! ```text
//!            failure rate ≥ ratio, with ≥ min throughput
//!   Closed ───────────────────────────────────────────────▶ Open
//!     ▲                                                  │   ▲
//!     │ every probe succeeded          break ended,      │   │ a probe failed
//!     │                                next call         ▼   │ (next break longer)
//!     └──────────────────────────────────────────────── HalfOpen
//! ```
//!
//! [`isolate`](CircuitBreaker::isolate) shuts it by hand (every call refused, retries told to
//! stop) and [`reset`](CircuitBreaker::reset) closes it by hand.
//!
//! # What counts as a failure
//!
//! The shared classifier's answer, not `is_err()`: an attempt whose
//! [`AttemptClass::is_health_failure`](crate::classify::AttemptClass::is_health_failure) is
//! true (*rejected* or *maybe committed*: a refused connection, a timeout, a reset, 429, 503,
//! 500, 502, 504) counts as a failure; a success, a *final* answer (400, 404, 422) and a
//! *conflict* (409) count as successes, since the server was well enough to answer them. With
//! a [slow-call threshold](CircuitBreakerBuilder::slow_call_threshold), a call that answered but
//! took longer counts as a failure too. What says nothing about the dependency counts as
//! nothing: another breaker's [`CircuitOpen`], a deadline that left no time to send, a timeout
//! the call's deadline set on an attempt given less than
//! [`min_timeout_evidence`](CircuitBreakerBuilder::min_timeout_evidence), and a server's refusal
//! to start on a request whose deadline it found spent
//! ([`Classification::is_deadline_refusal`](crate::classify::Classification::is_deadline_refusal))
//! or that its admission control shed
//! ([`Classification::is_overload_refusal`](crate::classify::Classification::is_overload_refusal):
//! a server shedding half its load serves the other half, and a breaker opened by its
//! refusals would refuse it all). A call dropped before it ended
//! (its caller went away, a hedge lost) counts as nothing either.
//!
//! The failure rate is counted over a [`SlidingWindow`]: the last *n* calls, or the calls of
//! the last *t* seconds in buckets. It is checked each time a failure is counted, and the
//! breaker opens only with at least the minimum throughput in the window, so that a burst of
//! three failures at night does not cut a dependency off.
//!
//! # An open breaker
//!
//! An open breaker refuses a call at once, without calling the inner service, with a
//! [`CircuitOpen`] error inside [`Error`](crate::Error) that says when the break ends. It is
//! classified *rejected, not sent*: nothing was sent, so even a POST without an idempotency key
//! loses nothing, and a [`RetryLayer`](crate::retry::RetryLayer) outside may retry it after the
//! remaining break (its pushback), if the call's deadline leaves time for that; otherwise the
//! call stops with [`StopReason::Deadline`](crate::StopReason::Deadline).
//!
//! After the break, the next call turns the breaker half-open and goes through as a probe;
//! up to [`half_open_probes`](CircuitBreakerBuilder::half_open_probes) calls (default 1) are
//! let through, the others refused until the probes answer. When every probe succeeds the
//! breaker closes with an empty window; when one fails it opens again for a longer break
//! (times [`break_growth`](CircuitBreakerBuilder::break_growth)'s multiplier, up to its cap),
//! jittered so that many clients do not probe in step.
//!
//! # Defaults
//!
//! | setting | surely | Polly v8 | resilience4j |
//! | --- | --- | --- | --- |
//! | failure ratio | 0.5 | 0.1 | 50% |
//! | window | last 100 calls | 30 s sampling | last 100 calls |
//! | minimum throughput | 20 calls | 100 | 100 |
//! | break | 5 s, ×2 per failed probe up to 60 s, ±10% jitter | 5 s, fixed | 60 s, fixed |
//! | half-open probes | 1 | 1 | 10 |
//! | slow calls | off | — | off (60 s when on) |
//! | a deadline's timeout counts | if the attempt was given 100 ms or more | always | always |
//!
//! Why these:
//!
//! * **A timeout the call's deadline set counts only after 100 ms.** A refused call waits out
//!   the break when its deadline allows, so the calls refused in a break's last seconds all
//!   wake when it ends, and the probe may go to one with a few milliseconds left. Its attempt
//!   runs out of time whatever the dependency's health; counted, it reopens the breaker for a
//!   longer break, again and again, and the breaker never closes (the `overload` example
//!   found this). Such a probe now gives its place back to the next call.
//! * **0.5**, like resilience4j and Hystrix, rather than Polly's 0.1: only health failures are
//!   counted here (a 404 is not one), and retries with a budget already absorb a partial
//!   failure; the breaker is for a dependency that is mostly down. At 0.1 a dependency that
//!   sheds one call in ten would be cut off entirely, which makes the outage worse.
//! * **The last 100 calls**, like resilience4j: recording a call in a count window is two
//!   atomic operations and no clock read, so the breaker costs a fraction of a lock-based one
//!   (the time window's clock read alone doubled the breaker's cost on the bench's virtual
//!   machine). A count window reaches further back when traffic is low, but a breaker matters
//!   when traffic is high, and its window is emptied each time it closes. Choose
//!   [`SlidingWindow::Time`] for Polly's behaviour (a window that forgets at a known pace).
//! * **20 calls** (Hystrix's): Polly's and resilience4j's 100 suit a busy service; a client
//!   making a few calls a second would need most of a minute of failures to open. 20 still
//!   needs more than a blip.
//! * **5 s, growing**: Polly's 5 s probes soon after a brief blip; doubling on every failed
//!   probe (to resilience4j's 60 s) stops a long outage from being probed every 5 s by every
//!   client, and the jitter spreads those probes out.
//! * **1 probe**, like Polly: one request tells whether the dependency answers; resilience4j's
//!   10 send ten requests to a dependency that is probably still down.
//!
//! # Cost
//!
//! The breaker sits on every call. In the closed state a call reads the state word once when
//! it starts and once when it ends, and counts its result in the window with an atomic add and
//! a swap (count window) or a compare-and-swap (time window, after a clock read): no lock and
//! no allocation. The lock is taken only to change state.
//!
//! # Where it goes
//!
//! Inside retry and hedging, outside the attempt timeout
//! ([layer order](crate::docs::architecture#layer-order)): each attempt is counted, timeouts
//! included, and a refusal goes back to the retry layer, which knows the deadline.
//! One breaker per dependency: share a [`CircuitBreaker`] (clones share its state) between the
//! services that reach the same one.
//!
//! Right inside a retry layer, the retry layer can keep the breaker itself
//! ([`RetryLayerBuilder::circuit_breaker`](crate::retry::RetryLayerBuilder::circuit_breaker)):
//! the same admissions, refusals and counts as a [`BreakerLayer`] in that place (a
//! test drives both with generated scripts and compares them), without the layer, whose
//! service the retry layer clones for each call and whose future holds a clone of the breaker
//! until the answer comes. [`client()`](crate::client()) does this unless it hedges; with a
//! hedge the breaker is a layer under it, to count each copy.
//!
//! ```
//! use std::time::Duration;
//! use surely::breaker::{BreakerState, CircuitBreaker, BreakerLayer, SlidingWindow};
//! use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let breaker = CircuitBreaker::builder()
//!     .window(SlidingWindow::Count(10))
//!     .min_throughput(4)
//!     .break_duration(Duration::from_secs(5))
//!     .jitter(0.0)
//!     .build()
//!     .unwrap();
//! // A dependency that answers 503 to everything.
//! let mut client = ServiceBuilder::new()
//!     .layer(BreakerLayer::new(breaker.clone()))
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, std::io::Error>(http::Response::builder().status(503).body(()).unwrap())
//!     }));
//!
//! for _ in 0..4 {
//!     let res = client.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
//!     assert_eq!(res.status(), 503);
//! }
//! assert_eq!(breaker.state(), BreakerState::Open);
//!
//! // Refused at once, without calling the dependency, saying when to come back.
//! let err = client.ready().await.unwrap().call(http::Request::new(())).await.unwrap_err();
//! let open = err.circuit_open().unwrap();
//! assert_eq!(open.retry_after(), Some(Duration::from_secs(5)));
//! assert_eq!(err.classify_error(DeliveryPhase::Sent).class(), AttemptClass::Rejected);
//! # }
//! ```
//!
//! # How this differs from failsafe and tower
//!
//! tower has no breaker. failsafe's counts `is_err()` (or a predicate) and takes a lock on
//! every call; this one asks the classifier the other layers use, takes no lock on the closed
//! path, and its refusal carries the time to come back, which the retry layer obeys.

mod circuit;
pub mod future;
mod layer;
mod service;
mod window;

use std::time::Duration;

pub(crate) use self::circuit::{health, Pass};
pub use self::circuit::{CircuitBreaker, CircuitBreakerBuilder, SlidingWindow};
pub use self::layer::BreakerLayer;
pub use self::service::Breaker;
pub use self::window::WindowCounts;
pub use crate::error::BreakerState;
pub use crate::error::CircuitOpen;

/// The default failure ratio at which the breaker opens.
pub(crate) const DEFAULT_FAILURE_RATIO: f64 = 0.5;
/// The default minimum number of calls in the window before the breaker may open.
pub(crate) const DEFAULT_MIN_THROUGHPUT: u32 = 20;
/// The default window: the last 100 calls.
pub(crate) const DEFAULT_WINDOW_CALLS: u32 = 100;
/// The default first break.
pub(crate) const DEFAULT_BREAK: Duration = Duration::from_secs(5);
/// The default growth of the break after each failed probe.
pub(crate) const DEFAULT_BREAK_MULTIPLIER: f64 = 2.0;
/// The default longest break.
pub(crate) const DEFAULT_MAX_BREAK: Duration = Duration::from_secs(60);
/// The default jitter of breaks: ±10%.
pub(crate) const DEFAULT_JITTER: f64 = 0.1;
/// The default number of half-open probes.
pub(crate) const DEFAULT_HALF_OPEN_PROBES: u32 = 1;
/// The default least time an attempt ended by the call's deadline must have been given for its
/// timeout to count against the dependency.
pub(crate) const DEFAULT_MIN_TIMEOUT_EVIDENCE: Duration = Duration::from_millis(100);
