//! Deadlines: one total budget per call, propagated down the chain.
//!
//! A per-attempt timeout says how long one try may take; a **deadline** says when the whole
//! logical call, retries and all, stops being useful to the caller. `surely` keeps one absolute
//! [`Deadline`] per call and hands it down:
//!
//! * **in the process**: the client [`SetDeadlineLayer`] makes the call's deadline the *current* one
//!   while its inner service is called and polled, so inner layers (attempt timeout, retry) and
//!   any client stack called further down see it with no plumbing. A caller may also put a
//!   [`Deadline`] in an `http::Request`'s extensions; the earlier one always wins;
//! * **on the wire**: the remaining budget, less a small reserve for transit, as a *relative*
//!   value (no clock sync needed): `grpc-timeout` for gRPC and a millisecond header
//!   (default [`DEFAULT_HEADER`]) for HTTP;
//! * **in the server**: the [`ServerDeadlineLayer`][crate::server::deadline::ServerDeadlineLayer] reads that header, caps it by the server's
//!   own maximum, refuses a request whose budget is spent (504 / `DEADLINE_EXCEEDED`) without
//!   calling the handler, and makes the deadline current for the handler, so the handler's own
//!   outgoing calls inherit it.
//!
//! A call whose budget is already spent is refused before anything is sent, with a
//! [`DeadlineExceeded`] error classified *rejected, not sent*: nothing
//! happened, and the record says why.
//!
//! # When the clock starts, and who ends a call at its deadline
//!
//! A layer with a budget of its own hands the budget down as a budget and writes it on the wire
//! without reading the clock: most calls answer on their first poll, and for them the instant
//! never matters. The budget becomes an instant the first time the call waits (or a layer or
//! nested client inside asks for it), so the clock starts at the end of the call's first,
//! synchronous, poll rather than at `call`: a difference of the time it takes to hand the
//! request to the transport. A deadline inherited as an instant (from the request, or a server
//! handler) is an instant from the start.
//!
//! A call still waiting at its deadline ends with
//! [`DeadlineExceeded`]. When an
//! [`AttemptTimeoutLayer`](crate::timeout::AttemptTimeoutLayer) is inside, as in the canonical
//! stack, its timer ends the attempt by the deadline and the deadline layer arms none; see
//! `SetDeadlineLayer`'s type parameter ([`OwnTimer`] or [`AttemptTimers`]) for where the deadline
//! layer's own timer lives when it needs one.
//!
//! The current context is held per thread and set only while the layers' synchronous code runs
//! (a `call`, a `poll`), so it follows the call's task across threads. Code that polls another
//! task's future by hand inside a call (a nested executor) would see the call's context.
//!
//! # How this differs from `tower::timeout`
//!
//! tower's `Timeout` bounds one call of one service. A deadline bounds a logical call across
//! layers, retries and hops, and a child's budget is never longer than its parent's. The layers
//! here also start no timer for a call whose inner future answers at once, which is most calls.
//!
//! ```
//! use std::time::Duration;
//! use surely::deadline::{Deadline, SetDeadlineLayer};
//! use tower::{service_fn, Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let inner = service_fn(|req: http::Request<()>| async move {
//!     // The budget left, as the server will see it.
//!     let header = req.headers()["x-request-timeout-ms"].to_str().unwrap().to_owned();
//!     // Inside the call, the deadline is current.
//!     assert!(surely::deadline::current().is_some());
//!     Ok::<_, std::io::Error>(header)
//! });
//! let layer = SetDeadlineLayer::builder().timeout(Duration::from_secs(2)).build().unwrap();
//! let mut svc = layer.layer(inner);
//! let header = svc.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
//! assert!(header.parse::<u64>().unwrap() <= 2_000);
//! # }
//! ```
#![cfg_attr(
    not(feature = "server"),
    doc = crate::docs::links::to_features!(
        "crate::server::deadline::ServerDeadlineLayer",
    )
)]

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

pub mod future;
mod layer;
mod service;
mod timer;

pub use self::layer::{SetDeadlineLayer, SetDeadlineLayerBuilder};
pub use self::service::SetDeadline;
pub use self::timer::{AttemptTimers, OwnTimer};
pub use crate::error::DeadlineExceeded;
pub use crate::time::{codec, Deadline};

use crate::context::{CallDeadline, Context};

use crate::headers::DEFAULT_HEADER;

/// A request extension: the header, other than [`DEFAULT_HEADER`], into which a client
/// [`SetDeadlineLayer`] wrote the call's budget, so that a retry layer inside can lower it on each
/// retry as it does the default one.
#[derive(Clone, Debug)]
pub(crate) struct WireHeader(pub(crate) http::HeaderName);

use crate::headers::GRPC_TIMEOUT;

/// The current deadline: the one a deadline layer or the server deadline layer set for the call
/// running on this task, or the one of a [`scope`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// assert_eq!(surely::deadline::current(), None);
/// let d = surely::deadline::Deadline::after(Duration::from_secs(1));
/// surely::deadline::scope(d, async move {
///     assert_eq!(surely::deadline::current(), Some(d));
/// }).await;
/// # }
/// ```
pub fn current() -> Option<Deadline> {
    Context::current()
        .deadline()
        .map(|d| d.anchor(Instant::now()))
}

/// What is left at `now` of the deadline an attempt works under: the earlier of the request's
/// own (`own`) and the current one. `None` without either. `now` is called only when an instant
/// is involved: a budget no layer has anchored yet (the call has not waited so far) is all
/// left, and reading the clock would not change that.
pub(crate) fn left_at(own: Option<Deadline>, now: impl FnOnce() -> Instant) -> Option<Duration> {
    let current = Context::current().deadline();
    match (own, current) {
        (None, None) => return None,
        (None, Some(CallDeadline::Budget(left))) => return Some(left),
        _ => {}
    }
    let now = now();
    Deadline::earliest(own, current.map(|d| d.anchor(now))).map(|d| d.remaining_at(now))
}

/// Runs `fut` with `deadline` as the current deadline (or the current one, if that is earlier),
/// for code that calls client stacks outside a server deadline layer, such as a background job.
pub async fn scope<F: Future>(deadline: Deadline, fut: F) -> F::Output {
    let mut ctx = Context::current();
    let outer = ctx.deadline().map(|d| d.anchor(Instant::now()));
    ctx.set_deadline(Deadline::earliest(Some(deadline), outer).map(CallDeadline::At));
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(move |cx| ctx.scope(|| fut.as_mut().poll(cx))).await
}
