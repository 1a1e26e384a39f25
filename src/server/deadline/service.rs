//! The service.

use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::ServerConfig;
use super::Malformed;
use super::ServerDeadlineLayer;
use crate::context::CallTally;
use crate::context::{CallDeadline, Context};
use crate::deadline::codec::{self, ParseTimeoutError};
use crate::deadline::Deadline;
use crate::headers::GRPC_TIMEOUT;
use crate::headers::NOT_PROCESSED;
use crate::headers::RETRY_OWNER;
use crate::server::answer::grpc_response;
use crate::server::problem::Problems;
use crate::server::ResponseBody;
use crate::Envelope;
use tower_layer::Layer;

/// The service made by [`ServerDeadlineLayer`]: see the layer for what it does.
///
/// # Readiness
///
/// `poll_ready` is the handler's. A refused request does not call the handler.
#[derive(Clone, Debug)]
pub struct ServerDeadline<S> {
    inner: S,
    config: ServerConfig,
}

impl<S> ServerDeadline<S> {
    /// Wraps `inner` with the default settings, as [`ServerDeadlineLayer::new`] does.
    pub fn new(inner: S) -> Self {
        ServerDeadlineLayer::new().layer(inner)
    }

    /// The layer with the default settings: [`ServerDeadlineLayer::new`].
    pub fn layer() -> ServerDeadlineLayer {
        ServerDeadlineLayer::new()
    }

    pub(super) fn from_config(inner: S, config: ServerConfig) -> Self {
        ServerDeadline { inner, config }
    }

    inner_accessors!();
}

impl<S, B, ResB> Service<Request<B>> for ServerDeadline<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let now = Instant::now();
        let grpc = req.is_grpc();
        let inbound = match self.inbound_budget(&req, grpc) {
            Ok(budget) => budget,
            Err(_) if self.config.malformed == Malformed::Ignore => None,
            Err(e) => {
                return ResponseFuture::respond(malformed_response(&self.config.problems, grpc, &e))
            }
        };
        let mut budget = match (inbound, self.config.max) {
            (Some(b), Some(max)) => Some(b.min(max)),
            (b, max) => b.or(max),
        };
        // Served in-process, inside a caller's call: never longer than the caller's budget.
        if let Some(outer) = Context::current().deadline() {
            let left = outer.anchor(now).remaining_at(now);
            budget = Some(budget.map_or(left, |b| b.min(left)));
        }
        let deadline = match budget {
            Some(b) if b.is_zero() || b < self.config.min => {
                return ResponseFuture::respond(exceeded_response(&self.config.problems, grpc));
            }
            Some(b) => {
                let deadline = Deadline::after_from(now, b);
                req.extensions_mut().insert(deadline);
                Some(deadline)
            }
            None => None,
        };
        // A fresh context: the handler's calls are new logical calls under this deadline.
        let mut ctx = Context::fresh(deadline.map(CallDeadline::At));
        // A trusted caller that retries for itself: the handler's own clients leave retries to
        // it. Anyone else's marker is taken off the request.
        let trusted = self.config.trust.as_ref().is_some_and(|t| t(&req));
        if trusted {
            ctx.set_retry_owned(upstream_retries(req.headers()));
        } else if req.headers().contains_key(RETRY_OWNER) {
            req.headers_mut().remove(RETRY_OWNER);
        }
        let inner = CallTally::isolate(|| ctx.scope(|| self.inner.call(req)));
        ResponseFuture::running(inner, ctx)
    }
}

/// Whether a request says that its caller retries it: this crate's marker, or a foreign
/// retrier's counter on an attempt after the first.
fn upstream_retries(headers: &http::HeaderMap) -> bool {
    let counter = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    headers.contains_key(RETRY_OWNER)
        || counter(GRPC_PREVIOUS_RPC_ATTEMPTS_NAME).is_some_and(|n| n >= 1)
        || counter(ENVOY_ATTEMPT_COUNT).is_some_and(|n| n >= 2)
}

/// gRPC's count of the attempts before this one, sent on retries and hedges only.
const GRPC_PREVIOUS_RPC_ATTEMPTS_NAME: &str = "grpc-previous-rpc-attempts";
/// Envoy's attempt number, 1 on the first attempt.
const ENVOY_ATTEMPT_COUNT: &str = "x-envoy-attempt-count";

impl<S> ServerDeadline<S> {
    /// The budget the caller sent, at most [`MAX_DURATION`](crate::MAX_DURATION): a
    /// `grpc-timeout` may say 11,415 years and the millisecond header 31.7 million, and a
    /// deadline ten years away outlives every caller as well.
    fn inbound_budget<B>(
        &self,
        req: &Request<B>,
        grpc: bool,
    ) -> Result<Option<Duration>, ParseTimeoutError> {
        let headers = req.headers();
        let budget = if grpc {
            headers
                .get(GRPC_TIMEOUT)
                .map(codec::parse_grpc_timeout_header)
                .transpose()
        } else {
            headers
                .get(&self.config.header)
                .map(codec::parse_millis_header)
                .transpose()
        };
        budget.map(|b| b.map(|b| b.min(crate::MAX_DURATION)))
    }
}

/// The refusal of a request whose budget is spent: `504` with its problem details, or gRPC
/// `DEADLINE_EXCEEDED`; both say that the handler never ran.
pub(crate) fn exceeded_response(problems: &Problems, grpc: bool) -> Response<Bytes> {
    let mut res = if grpc {
        grpc_response("4", "deadline exceeded before the handler started")
    } else {
        problems.deadline_exceeded()
    };
    // The handler never ran: say so, or the client must assume it may have.
    res.headers_mut().insert(
        NOT_PROCESSED,
        HeaderValue::from_static(crate::classify::DEADLINE_REFUSAL),
    );
    res
}

fn malformed_response(
    problems: &Problems,
    grpc: bool,
    error: &ParseTimeoutError,
) -> Response<Bytes> {
    if grpc {
        return grpc_response("3", &error.to_string());
    }
    problems.deadline_invalid(&error.to_string())
}
