//! The attempt timeout: one try gets `min(per-try timeout, the call's remaining budget)`; and
//! the body idle timeout ([`BodyIdleTimeoutLayer`]), for the response body after the head.
//!
//! The attempt timeout ends an attempt that has no response head yet: it is the timeout of the
//! second of the three phases an attempt passes through (connect, the head, the body), each
//! with its own timeout and its own meaning for the outcome
//! ([`docs::deadlines`](crate::docs::deadlines#three-phases-three-timeouts)).
//!
//! When it fires, the error ([`Elapsed`]) says where: before the request was
//! sent or after. That is the difference between *rejected* (retry anything) and *maybe
//! committed* (retry only what can be repeated). The phase comes from a
//! [`Progress`] handle in the request's extensions when the transport
//! reports one; without it, a timeout after the inner service was called is *maybe committed*.
//!
//! # How this differs from `tower::timeout`
//!
//! tower's `Timeout` has one fixed duration and creates a timer on every call. This layer also
//! obeys the call's deadline (from the [`SetDeadlineLayer`](crate::deadline::SetDeadlineLayer) or the
//! request), says where it fired, and starts no timer, and reads no clock, for an inner future
//! that answers on its first poll. The per-try clock starts at that first poll.
//!
//! ```
//! use std::time::Duration;
//! use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
//! use surely::timeout::AttemptTimeoutLayer;
//! use tower::{service_fn, Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let slow = service_fn(|_: http::Request<()>| async {
//!     tokio::time::sleep(Duration::from_secs(5)).await;
//!     Ok::<_, std::io::Error>(())
//! });
//! let mut svc = AttemptTimeoutLayer::new(Duration::from_millis(200)).unwrap().layer(slow);
//! let err = svc.ready().await.unwrap().call(http::Request::new(())).await.unwrap_err();
//! assert!(err.is_elapsed());
//! assert_eq!(err.classify_error(DeliveryPhase::Sent).class(), AttemptClass::MaybeCommitted);
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

pub use crate::error::{BodyIdle, Elapsed};

mod body;
pub use self::body::{BodyIdleTimeout, BodyIdleTimeoutLayer, IdleTimeoutBody};

use crate::classify::DeliveryPhase;
use crate::context::Report;
use crate::deadline::{self, Deadline};
use crate::delivery::Progress;
use crate::{ConfigError, Envelope, Error, IntoError};

/// Bounds each attempt by `min(per-try timeout, remaining budget)`. See the [module docs](self).
#[derive(Clone, Copy, Debug)]
pub struct AttemptTimeoutLayer {
    per_try: Option<Duration>,
}

impl AttemptTimeoutLayer {
    /// Each attempt gets at most `per_try`, and never more than the call's remaining budget.
    /// `per_try` must be greater than zero.
    pub fn new(per_try: Duration) -> Result<Self, ConfigError> {
        if per_try.is_zero() {
            return Err(ConfigError::new(
                "attempt timeout",
                "must be greater than zero",
            ));
        }
        Ok(AttemptTimeoutLayer {
            per_try: Some(per_try),
        })
    }

    /// Each attempt is bounded by the call's deadline only.
    pub fn deadline_only() -> Self {
        AttemptTimeoutLayer { per_try: None }
    }
}

impl<S> Layer<S> for AttemptTimeoutLayer {
    type Service = AttemptTimeout<S>;

    fn layer(&self, inner: S) -> AttemptTimeout<S> {
        AttemptTimeout {
            inner,
            per_try: self.per_try,
        }
    }
}

/// The service made by [`AttemptTimeoutLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's and is not timed: time spent waiting for readiness is not
/// part of an attempt. Put a deadline layer outside to bound the whole call.
#[derive(Clone, Debug)]
pub struct AttemptTimeout<S> {
    inner: S,
    per_try: Option<Duration>,
}

impl<S> AttemptTimeout<S> {
    /// Wraps `inner` with the layer's settings.
    pub fn new(inner: S, layer: AttemptTimeoutLayer) -> Self {
        layer.layer(inner)
    }

    inner_accessors!();
}

impl<S, Req> Service<Req> for AttemptTimeout<S>
where
    S: Service<Req>,
    S::Error: IntoError,
    Req: Envelope,
{
    type Response = S::Response;
    type Error = Error<<S::Error as IntoError>::Transport>;
    type Future = ResponseFuture<S::Future, Self::Error>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    #[inline]
    fn call(&mut self, req: Req) -> Self::Future {
        let deadline = req.deadline();
        let progress = req.extensions().and_then(|e| e.get::<Progress>()).cloned();
        ResponseFuture {
            inner: self.inner.call(req),
            sleep: None,
            per_try: self.per_try,
            deadline,
            by_deadline: false,
            given: Duration::ZERO,
            progress,
            _error: PhantomData,
        }
    }
}

/// The future, public in a private module: named by the service's `Future` type only.
mod future {
    use super::*;

    pin_project! {
        /// The future of [`AttemptTimeout`].
        #[project = ResponseFutureProj]
        pub struct ResponseFuture<F, E> {
            #[pin]
            pub(super) inner: F,
            #[pin]
            pub(super) sleep: Option<Sleep>,
            pub(super) per_try: Option<Duration>,
            // The request's own deadline; the call's comes from the context when the timer is armed.
            pub(super) deadline: Option<Deadline>,
            // Whether the armed timer is the call's deadline rather than the per-try timeout.
            pub(super) by_deadline: bool,
            // How long the armed timer gave the attempt.
            pub(super) given: Duration,
            pub(super) progress: Option<Progress>,
            pub(super) _error: PhantomData<fn() -> E>,
        }
    }

    impl<F, T, E0> Future for ResponseFuture<F, Error<E0::Transport>>
    where
        F: Future<Output = Result<T, E0>>,
        E0: IntoError,
    {
        type Output = Result<T, Error<E0::Transport>>;

        // Inlined, and kept to what an attempt that answers on its first poll runs, so that the
        // inner future's answer is not returned through memory once more; the rest is out of line.
        #[inline]
        fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
            let mut this = self.project();
            // Matched whole: binding the answer first would copy it with its error's room (see
            // `lift`).
            match this.inner.as_mut().poll(cx) {
                Poll::Ready(Ok(res)) => Poll::Ready(Ok(res)),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e.into_error())),
                Poll::Pending => wait(this, cx),
            }
        }
    }

    /// The rest of a poll of [`ResponseFuture`] whose attempt waits: its timer, armed on the first
    /// wait.
    #[inline(never)]
    fn wait<F, T, E>(
        mut this: ResponseFutureProj<'_, F, Error<E>>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Result<T, Error<E>>> {
        let mut armed = false;
        if this.sleep.is_none() {
            // The first wait: read the clock once, and arm one timer for the earlier of the per-try
            // timeout and the call's deadline, both counted from that reading.
            let mut read = None;
            let left = deadline::left_at(*this.deadline, || *read.insert(Instant::now()));
            let (after, by_deadline) = match (*this.per_try, left) {
                (None, None) => return Poll::Pending,
                (Some(per_try), Some(left)) if left > per_try => (per_try, false),
                (Some(per_try), None) => (per_try, false),
                (_, Some(left)) => (left, true),
            };
            let now = read.unwrap_or_else(Instant::now);
            *this.by_deadline = by_deadline;
            *this.given = after;
            let limit = Deadline::after_from(now, after);
            let sleep = tokio::time::sleep_until(limit.instant());
            // This attempt ends by `limit`: an outer deadline layer needs no timer of its own. Said
            // before the timer is polled (if it fires at once, the attempt ends in this poll and the
            // report is moot), so that the timer's fresh stores have landed by the time it is moved
            // into the future.
            Report::publish(Report::after(now, after));
            this.sleep.set(Some(sleep));
            armed = true;
        }
        let Some(sleep) = this.sleep.as_pin_mut() else {
            return Poll::Pending;
        };
        let limit = sleep.deadline();
        if sleep.poll(cx).is_pending() {
            if !armed {
                Report::publish(Report::new(None, Some(limit)));
            }
            return Poll::Pending;
        }
        let phase = this
            .progress
            .as_ref()
            .map_or(DeliveryPhase::Sent, Progress::phase);
        Poll::Ready(Err(Elapsed::new(phase, *this.by_deadline)
            .with_given(*this.given)
            .into()))
    }

    impl<F, E> fmt::Debug for ResponseFuture<F, E> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("ResponseFuture")
                .field("per_try", &self.per_try)
                .field("deadline", &self.deadline)
                .finish_non_exhaustive()
        }
    }
}

use self::future::ResponseFuture;
