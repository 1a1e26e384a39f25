//! The deadline where work starts: after a queue or a limit, is there still time?
//!
//! [`RecheckLayer`] sits where the work starts, below whatever queues, and refuses a request
//! whose deadline no longer leaves the time its work takes; [`can_finish`] is the same check
//! for a worker pool of your own. Both are re-exported at [`server::deadline`](super).
//!
//! A request can wait after the [`ServerDeadlineLayer`](super::ServerDeadlineLayer) admitted
//! it: in a buffer, behind a concurrency limit, in a pool. Work started for a caller who has
//! gone is work for nobody, and it delays the callers still waiting.
//!
//! ```
//! use std::time::Duration;
//! use surely::server::deadline::{RecheckLayer, ServerDeadlineLayer};
//! use surely::server::limit::AdaptiveLimitLayer;
//! use tower::{service_fn, ServiceBuilder};
//!
//! let limit = AdaptiveLimitLayer::new();
//! let svc = ServiceBuilder::new()
//!     .layer(ServerDeadlineLayer::builder().max(Duration::from_secs(5)).build().unwrap())
//!     .layer(limit.clone())
//!     .concurrency_limit(64) // requests past it wait here
//!     // Where the work starts: at least 200 ms left, or refused (and counted in the limit's).
//!     .layer(RecheckLayer::new(Duration::from_millis(200)).count_in(&limit))
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
//!     }));
//! # let _ = svc;
//! ```

use std::time::Duration;

use tokio::time::Instant;

use crate::deadline::Deadline;

pub mod future;
mod layer;
mod service;

pub use self::layer::RecheckLayer;
pub use self::service::Recheck;

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
