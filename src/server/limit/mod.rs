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
//! * **[`Criticality`]**: a request says how critical it is (an extension
//!   the host sets, or the [`CRITICALITY`] header). Each level may
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

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_service::Service;

mod algorithm;
mod layer;

pub use self::algorithm::{Aimd, Algorithm, Gradient};
pub use self::layer::{AdaptiveLimitLayer, AdaptiveLimitLayerBuilder};

pub(crate) use self::algorithm::{Handle, Shared};
use self::algorithm::{Signal, Ticket};
use crate::classify::OVERLOAD_REFUSAL;
use crate::deadline::Deadline;
use crate::headers::{CRITICALITY, GRPC_RETRY_PUSHBACK_MS, NOT_PROCESSED};
use crate::{Criticality, Envelope};

/// The service made by [`AdaptiveLimitLayer`].
///
/// # Readiness
///
/// `poll_ready` is the handler's: the limit never makes a caller wait, it answers a refusal
/// from `call`. A refused request does not call the handler, so a readiness the handler gave
/// for it is left unused (as with any service whose `call` may answer without its inner one).
#[derive(Clone)]
pub struct AdaptiveLimit<S> {
    inner: S,
    shared: Handle,
}

impl<S> AdaptiveLimit<S> {
    inner_accessors!();
}

impl<S: std::fmt::Debug> std::fmt::Debug for AdaptiveLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdaptiveLimit")
            .field("inner", &self.inner)
            .field("limit", &self.shared.limit())
            .field("in_flight", &Shared::in_flight(&self.shared))
            .finish()
    }
}

impl<S> AdaptiveLimit<S> {
    /// The request's criticality: the host's extension, else the header (which an untrusted
    /// caller may use to lower it only), else `critical`.
    fn criticality<B>(&self, req: &Request<B>) -> Criticality {
        if let Some(c) = req.extensions().get::<Criticality>() {
            return *c;
        }
        let Some(value) = req.headers().get(CRITICALITY) else {
            return Criticality::Critical;
        };
        match Criticality::from_bytes(value.as_bytes()) {
            Ok(c) if c <= Criticality::Critical => c,
            Ok(c) if self.shared.config.trust.as_ref().is_some_and(|t| t(req)) => c,
            _ => Criticality::Critical,
        }
    }

    fn partition<B>(&self, req: &Request<B>) -> Option<u32> {
        if self.shared.partitions.is_empty() {
            return None;
        }
        self.shared
            .partitions
            .iter()
            .position(|p| (p.config.matches)(req))
            .and_then(|i| u32::try_from(i).ok())
    }
}

impl<S, B, ResB> Service<Request<B>> for AdaptiveLimit<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    ResB: Default,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResB>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let partition = self.partition(&req);
        match Shared::acquire(&self.shared, partition, || self.criticality(&req)) {
            Ok((shared, ticket)) => {
                let deadline = if shared.learns_from_deadlines() {
                    req.extensions().get::<Deadline>().copied()
                } else {
                    None
                };
                let start = ticket.timed.then(Instant::now);
                let permit = Permit {
                    shared,
                    ticket,
                    start,
                    deadline,
                };
                ResponseFuture {
                    state: State::Admitted {
                        inner: self.inner.call(req),
                        permit: Some(permit),
                    },
                }
            }
            Err((reason, criticality)) => {
                Shared::refuse(&self.shared, reason, criticality, partition);
                let response = refusal(req.is_grpc(), self.shared.config.retry_after);
                ResponseFuture {
                    state: State::Refused {
                        response: Some(response),
                    },
                }
            }
        }
    }
}

/// An admitted request's place in the limit, given back when the request ends, answered or
/// dropped: its reference to the shared state is what counts it in flight.
struct Permit {
    shared: Arc<Shared>,
    ticket: Ticket,
    start: Option<Instant>,
    deadline: Option<Deadline>,
}

impl Permit {
    /// Learns from the answer, if it says anything: most answers (untimed, ordinary, from a
    /// limit not in use) do not, and cost a few comparisons here.
    #[inline]
    fn answered(&self, signal: Signal) {
        if signal == Signal::Ignore
            || signal == Signal::Answered
                && self.start.is_none()
                && self.deadline.is_none()
                && !self.ticket.grows
        {
            return;
        }
        self.learn(signal);
    }

    #[inline(never)]
    fn learn(&self, signal: Signal) {
        let now = (self.start.is_some() || self.deadline.is_some()).then(Instant::now);
        let rtt = self
            .start
            .zip(now)
            .map(|(s, n)| n.saturating_duration_since(s));
        let late = self.deadline.zip(now).is_some_and(|(d, n)| n > d.instant());
        let dropped = signal == Signal::Overloaded || late;
        Shared::learn(&self.shared, self.ticket, rtt, dropped);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.shared.release(self.ticket);
    }
}

pin_project! {
    /// The future of [`AdaptiveLimit`]: the handler's, or a refusal.
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Refused { response: Option<Response<B>> },
        Admitted { #[pin] inner: F, permit: Option<Permit> },
    }
}

impl<F, B, E> std::future::Future for ResponseFuture<F, B>
where
    F: std::future::Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending,
            },
            StateProj::Admitted { inner, permit } => {
                let result = std::task::ready!(inner.poll(cx));
                if let Some(permit) = permit.take() {
                    let signal = match &result {
                        Ok(res) => signal_of(res.status()),
                        Err(_) => Signal::Ignore,
                    };
                    permit.answered(signal);
                }
                Poll::Ready(result)
            }
        }
    }
}

impl<F, B> std::fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// What a handler's status says about load.
fn signal_of(status: StatusCode) -> Signal {
    match status.as_u16() {
        429 | 503 | 504 => Signal::Overloaded,
        _ => Signal::Answered,
    }
}

/// The refusal: `503` with `Retry-After`, or gRPC `UNAVAILABLE` with its pushback; both say
/// that the handler never ran.
fn refusal<B: Default>(grpc: bool, retry_after: Duration) -> Response<B> {
    let mut res = Response::new(B::default());
    if !grpc {
        *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    }
    let headers = res.headers_mut();
    if grpc {
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(
            HeaderName::from_static("grpc-status"),
            HeaderValue::from_static("14"),
        );
        headers.insert(
            HeaderName::from_static("grpc-message"),
            HeaderValue::from_static("overloaded: refused before processing"),
        );
        let ms = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
        headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
    } else {
        let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    headers.insert(NOT_PROCESSED, HeaderValue::from_static(OVERLOAD_REFUSAL));
    res
}
