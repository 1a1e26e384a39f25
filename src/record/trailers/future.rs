//! The trailers watch layer's future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;
use http_body::Body;
use pin_project_lite::pin_project;

use super::watch::watch_response;
use super::WatchedBody;

pin_project! {
    /// The future of [`WatchTrailers`](super::WatchTrailers): the inner service's, whose
    /// response body it wraps in a [`WatchedBody`].
    pub struct ResponseFuture<F> {
        #[pin]
        pub(super) inner: F,
        pub(super) asked: bool,
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    type Output = Result<Response<WatchedBody<B>>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = std::task::ready!(this.inner.poll(cx))?;
        let watch = watch_response(*this.asked, &mut res);
        Poll::Ready(Ok(res.map(|body| WatchedBody::watched(body, watch))))
    }
}
