//! The service.

use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::algorithm::{Handle, Shared, Signal, Ticket};
use super::future::ResponseFuture;
use super::AdaptiveLimitLayer;
use crate::classify::OVERLOAD_REFUSAL;
use crate::deadline::Deadline;
use crate::headers::{CRITICALITY, GRPC_RETRY_PUSHBACK_MS, NOT_PROCESSED};
use crate::server::answer::grpc_response;
use crate::server::problem::Problems;
use crate::server::ResponseBody;
use crate::{Criticality, Envelope};

/// The service made by [`AdaptiveLimitLayer`]: see the layer for what it does.
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
    /// Wraps `inner` in a limit of its own with the default settings, as
    /// [`AdaptiveLimitLayer::new`] does: the clones of this service share it. Services that
    /// should share one limit are made by one layer.
    pub fn new(inner: S) -> Self {
        AdaptiveLimitLayer::new().layer(inner)
    }

    /// A limit with the default settings: [`AdaptiveLimitLayer::new`].
    pub fn layer() -> AdaptiveLimitLayer {
        AdaptiveLimitLayer::new()
    }

    pub(super) fn from_handle(inner: S, shared: Handle) -> Self {
        AdaptiveLimit { inner, shared }
    }

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
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

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
                ResponseFuture::admitted(self.inner.call(req), permit)
            }
            Err((reason, criticality)) => {
                Shared::refuse(&self.shared, reason, criticality, partition);
                let config = &self.shared.config;
                let response = refusal(&config.problems, req.is_grpc(), config.retry_after);
                ResponseFuture::refused(response)
            }
        }
    }
}

/// An admitted request's place in the limit, given back when the request ends, answered or
/// dropped: its reference to the shared state is what counts it in flight.
pub(super) struct Permit {
    shared: Arc<Shared>,
    ticket: Ticket,
    start: Option<Instant>,
    deadline: Option<Deadline>,
}

impl Permit {
    /// Learns from the answer, if it says anything: most answers (untimed, ordinary, from a
    /// limit not in use) do not, and cost a few comparisons here.
    #[inline]
    pub(super) fn answered(&self, signal: Signal) {
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

/// The refusal: `503` with `Retry-After` and its problem details, or gRPC `UNAVAILABLE` with
/// its pushback; both say that the handler never ran.
fn refusal(problems: &Problems, grpc: bool, retry_after: Duration) -> Response<Bytes> {
    let mut res = if grpc {
        let mut res = grpc_response("14", "overloaded: refused before processing");
        let ms = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
        res.headers_mut()
            .insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(ms));
        res
    } else {
        let mut res = problems.overloaded();
        // Whole seconds, rounded up (the setting is at most an hour).
        let secs = retry_after
            .as_secs()
            .saturating_add(u64::from(retry_after.subsec_nanos() > 0));
        res.headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        res
    };
    res.headers_mut()
        .insert(NOT_PROCESSED, HeaderValue::from_static(OVERLOAD_REFUSAL));
    res
}
