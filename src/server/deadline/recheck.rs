//! The deadline where work starts: after a queue or a limit, is there still time?

use std::fmt;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::exceeded_response;
use super::future::ServerDeadlineFuture;
use crate::deadline::Deadline;
use crate::evidence::RefusalReason;
use crate::server::limit::{AdaptiveLimitLayer, Shared};
use crate::{Criticality, Envelope};

/// Whether work that needs `needs` can still finish before `deadline`: true without a
/// deadline, or when at least `needs` is left.
///
/// What a hand-written worker pool calls when it takes a job from its queue, where
/// [`RecheckLayer`] would sit in a tower stack: a job whose caller will have given up before
/// it is done is dropped without spending the work on it.
///
/// ```
/// use std::time::Duration;
/// use surely::deadline::Deadline;
/// use surely::server::deadline::can_finish;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let deadline = Deadline::after(Duration::from_millis(80));
/// assert!(can_finish(Some(deadline), Duration::from_millis(50)));
/// assert!(!can_finish(Some(deadline), Duration::from_millis(100)));
/// assert!(can_finish(None, Duration::from_secs(3600)));
/// # }
/// ```
pub fn can_finish(deadline: Option<Deadline>, needs: Duration) -> bool {
    deadline.is_none_or(|d| d.remaining_at(Instant::now()) >= needs)
}

/// Re-checks a request's deadline where its work starts, and refuses work that can no longer
/// finish in time.
///
/// [`ServerDeadlineLayer`](super::ServerDeadlineLayer) refuses a spent budget on arrival; a
/// request can still wait after that, in a queue (tower's `Buffer`, a `ConcurrencyLimit`
/// waiting in `poll_ready`, a worker pool) or behind a lock. Put this layer where the work
/// starts, below whatever queues: a request whose deadline (its `Deadline` extension, or the
/// current deadline) leaves less than [`needs`](RecheckLayer::new) is answered as the
/// deadline layer answers a spent budget (`504`, gRPC `DEADLINE_EXCEEDED`, with
/// `surely-not-processed: deadline`), and its handler is not called. A request without a
/// deadline passes.
///
/// `needs` is what the work takes, about its 99th percentile latency: a request that cannot
/// have it would be served for a caller who is gone.
///
/// ```
/// use std::time::Duration;
/// use surely::deadline::Deadline;
/// use surely::server::deadline::RecheckLayer;
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let handler = service_fn(|_req: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// });
/// let mut svc = RecheckLayer::new(Duration::from_millis(100)).layer(handler);
///
/// let mut late = http::Request::new(());
/// late.extensions_mut().insert(Deadline::after(Duration::from_millis(30)));
/// let res = svc.ready().await.unwrap().call(late).await.unwrap();
/// assert_eq!(res.status(), 504);
/// assert_eq!(res.headers()["surely-not-processed"], "deadline");
/// # }
/// ```
#[derive(Clone)]
pub struct RecheckLayer {
    needs: Duration,
    limit: Option<AdaptiveLimitLayer>,
}

impl RecheckLayer {
    /// Refuses requests with less than `needs` left of their deadline.
    pub fn new(needs: Duration) -> Self {
        RecheckLayer { needs, limit: None }
    }

    /// Counts the refusals in `limit`'s [`refused`](AdaptiveLimitLayer::refused) (reason
    /// [`Deadline`](RefusalReason::Deadline)) and reports them to its recorder, so that a
    /// dashboard sees every refusal of the server in one place.
    pub fn count_in(mut self, limit: &AdaptiveLimitLayer) -> Self {
        self.limit = Some(limit.clone());
        self
    }
}

impl fmt::Debug for RecheckLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecheckLayer")
            .field("needs", &self.needs)
            .field("counted", &self.limit.is_some())
            .finish()
    }
}

impl<S> Layer<S> for RecheckLayer {
    type Service = Recheck<S>;

    fn layer(&self, inner: S) -> Recheck<S> {
        Recheck {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service made by [`RecheckLayer`].
///
/// # Readiness
///
/// `poll_ready` is the handler's. A refused request does not call the handler.
#[derive(Clone, Debug)]
pub struct Recheck<S> {
    inner: S,
    layer: RecheckLayer,
}

impl<S> Recheck<S> {
    inner_accessors!();
}

impl<S, B, ResB> Service<Request<B>> for Recheck<S>
where
    S: Service<Request<B>, Response = Response<ResB>>,
    ResB: Default,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = ServerDeadlineFuture<S::Future, ResB>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let deadline = Deadline::earliest(Envelope::deadline(&req), crate::deadline::current());
        if can_finish(deadline, self.layer.needs) {
            return ServerDeadlineFuture::running(self.inner.call(req));
        }
        if let Some(limit) = &self.layer.limit {
            let criticality = req
                .extensions()
                .get::<Criticality>()
                .copied()
                .unwrap_or_default();
            Shared::refuse(&limit.shared, RefusalReason::Deadline, criticality, None);
        }
        ServerDeadlineFuture::respond(exceeded_response(req.is_grpc()))
    }
}
