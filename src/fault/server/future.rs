//! The [`InjectServerFault`](super::InjectServerFault)'s response future.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;

use super::FaultBody;
use crate::fault::future::ResponseFuture as FaultFuture;

pin_project! {
    /// The inner future of an [`InjectServerFault`](super::InjectServerFault): the handler's
    /// answer, its body passed through or, for a reset, replaced by one that fails.
    pub(super) struct WrapBody<F> {
        #[pin]
        future: F,
        reset: bool,
    }
}

impl<F> WrapBody<F> {
    pub(super) fn new(future: F, reset: bool) -> Self {
        WrapBody { future, reset }
    }
}

impl<F, B> Future for WrapBody<F>
where
    F: Future<Output = Result<http::Response<B>, Infallible>>,
{
    type Output = Result<http::Response<FaultBody<B>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = match ready!(this.future.poll(cx)) {
            Ok(res) => res,
            Err(never) => match never {},
        };
        let (head, body) = res.into_parts();
        let body = if *this.reset {
            // The handler's answer is dropped with the connection.
            drop(body);
            FaultBody::reset()
        } else {
            FaultBody::inner(body)
        };
        Poll::Ready(Ok(http::Response::from_parts(head, body)))
    }
}

pin_project! {
    /// The response future of [`InjectServerFault`](super::InjectServerFault): the handler's
    /// answer, delayed, replaced or broken as the request's fault says. It never fails.
    ///
    /// # Panics
    ///
    /// Like an `async fn`'s future, it panics if polled again after it completed.
    pub struct ResponseFuture<F, B> {
        #[pin]
        inner: FaultFuture<WrapBody<F>, http::Response<FaultBody<B>>, Infallible>,
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(super) fn new(
        inner: FaultFuture<WrapBody<F>, http::Response<FaultBody<B>>, Infallible>,
    ) -> Self {
        ResponseFuture { inner }
    }
}

impl<F, B> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<http::Response<B>, Infallible>>,
{
    type Output = Result<http::Response<FaultBody<B>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match ready!(self.project().inner.poll(cx)) {
            Ok(res) => Ok(res),
            // Only an injected fault fails the inner future, and this service answers every
            // fault with a response; should one come, the connection is dropped, as a reset.
            Err(_) => Ok(http::Response::new(FaultBody::reset())),
        })
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("inner", &self.inner)
            .finish()
    }
}
