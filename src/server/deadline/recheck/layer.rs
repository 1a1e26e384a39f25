//! The layer.

use std::fmt;
use std::time::Duration;

use tower_layer::Layer;

use super::Recheck;
use crate::server::limit::AdaptiveLimitLayer;
use crate::server::problem::Problems;
use crate::ConfigError;

/// Re-checks a request's deadline where its work starts, and refuses work that can no longer
/// finish in time.
///
/// [`ServerDeadlineLayer`](crate::server::deadline::ServerDeadlineLayer) refuses a spent budget on arrival; a
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
    pub(super) needs: Duration,
    pub(super) limit: Option<AdaptiveLimitLayer>,
    pub(super) problems: Problems,
}

impl RecheckLayer {
    /// Refuses requests with less than `needs` left of their deadline. A `needs` over
    /// [`MAX_DURATION`](crate::MAX_DURATION) (ten years) counts as ten years.
    pub fn new(needs: Duration) -> Self {
        RecheckLayer {
            needs: needs.min(crate::MAX_DURATION),
            limit: None,
            problems: Problems::default(),
        }
    }

    /// Where the `type` of the refusal's [problem details](crate::server::problem) points, as
    /// [`ServerDeadlineLayerBuilder::problem_base`](crate::server::deadline::ServerDeadlineLayerBuilder::problem_base)
    /// says: the refusal then also carries `Link: <type>; rel="describedby"`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if `base` is not an absolute URI.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::server::deadline::RecheckLayer;
    ///
    /// let layer = RecheckLayer::new(Duration::from_millis(100));
    /// assert!(layer.clone().problem_base("https://api.example.com/problems/").is_ok());
    /// assert_eq!(layer.problem_base("/problems/").unwrap_err().setting(), "recheck problem base");
    /// ```
    pub fn problem_base(mut self, base: &str) -> Result<Self, ConfigError> {
        self.problems = Problems::at(base, "recheck problem base")?;
        Ok(self)
    }

    /// Counts the refusals in `limit`'s [`refused`](AdaptiveLimitLayer::refused) (reason
    /// [`Deadline`](crate::record::RefusalReason::Deadline)) and reports them to its recorder, so that a
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
        Recheck::from_layer(inner, self.clone())
    }
}
