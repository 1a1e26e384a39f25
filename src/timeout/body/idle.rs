//! The response body the body idle timeout hands back.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::classify::BoxError;
use crate::error::BodyIdle;
use crate::time::later;

pin_project! {
    /// A response body failed with [`BodyIdle`] when no frame arrives for its idle timeout
    /// while the caller waits. Made by [`BodyIdleTimeoutLayer`]; frames pass through unchanged,
    /// and the inner body's errors are boxed.
    pub struct IdleTimeoutBody<B> {
        #[pin]
        pub(super) inner: B,
        // Made on the first wait, and reset for each later one. Boxed, so that the body is
        // `Unpin` when the inner body is (as hyper's is), and `frame()` works on it.
        pub(super) sleep: Option<Pin<Box<Sleep>>>,
        pub(super) idle: Duration,
        // Whether the timer counts the current wait.
        pub(super) waiting: bool,
        // Whether the body was failed for being idle: it ends there.
        pub(super) timed_out: bool,
    }
}

impl<B> IdleTimeoutBody<B> {
    /// How long the body may stay quiet.
    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// The wrapped body.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: fmt::Debug> fmt::Debug for IdleTimeoutBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleTimeoutBody")
            .field("inner", &self.inner)
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl<B> Body for IdleTimeoutBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = self.project();
        if *this.timed_out {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            *this.waiting = false;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if !*this.waiting {
            // A new wait: the clock starts now.
            let at = later(Instant::now(), *this.idle);
            match this.sleep.as_mut() {
                Some(sleep) => sleep.as_mut().reset(at),
                None => *this.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
            }
            *this.waiting = true;
        }
        let fired = this
            .sleep
            .as_mut()
            .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready());
        if !fired {
            return Poll::Pending;
        }
        *this.timed_out = true;
        *this.waiting = false;
        Poll::Ready(Some(Err(Box::new(BodyIdle::new(*this.idle)))))
    }

    fn is_end_stream(&self) -> bool {
        self.timed_out || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.timed_out {
            return SizeHint::with_exact(0);
        }
        self.inner.size_hint()
    }
}
