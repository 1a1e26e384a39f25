//! The body idle timeout's future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use http_body::Body;
use pin_project_lite::pin_project;

use super::IdleTimeoutBody;

pin_project! {
    /// The future of [`BodyIdleTimeout`](super::BodyIdleTimeout): the inner service's, whose
    /// response body it wraps in an [`IdleTimeoutBody`].
    pub struct ResponseFuture<F> {
        #[pin]
        pub(super) inner: F,
        pub(super) idle: Duration,
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    B: Body,
{
    type Output = Result<http::Response<IdleTimeoutBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = std::task::ready!(this.inner.poll(cx))?;
        let idle = *this.idle;
        Poll::Ready(Ok(res.map(|inner| IdleTimeoutBody {
            inner,
            sleep: None,
            idle,
            waiting: false,
            timed_out: false,
        })))
    }
}
