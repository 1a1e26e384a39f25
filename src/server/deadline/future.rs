//! The [`ServerDeadline`](super::ServerDeadline)'s response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use http::Response;
use pin_project_lite::pin_project;

use crate::context::{CallTally, Context};
use crate::server::answer::Answer;
use crate::server::ResponseBody;
use bytes::Bytes;

pin_project! {
    /// The response future of [`ServerDeadline`](super::ServerDeadline): the handler's,
    /// polled in the request's call context (its deadline), or the layer's own refusal.
    pub struct ResponseFuture<F> {
        #[pin]
        answer: Answer<F, Context>,
    }
}

impl<F> ResponseFuture<F> {
    /// The handler's future, polled in `ctx`.
    pub(super) fn running(inner: F, ctx: Context) -> Self {
        ResponseFuture {
            answer: Answer::handler(inner, ctx),
        }
    }

    pub(super) fn respond(response: Response<Bytes>) -> Self {
        ResponseFuture {
            answer: Answer::now(response),
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        self.project().answer.poll(cx, |inner, ctx, cx| {
            CallTally::isolate(|| ctx.scope(|| inner.poll(cx)))
        })
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
