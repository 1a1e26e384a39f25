//! The [`AdaptiveLimit`](super::AdaptiveLimit)'s response future.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use http::{Response, StatusCode};
use pin_project_lite::pin_project;

use super::algorithm::Signal;
use super::service::Permit;
use crate::server::answer::Answer;
use crate::server::ResponseBody;
use bytes::Bytes;

pin_project! {
    /// The response future of [`AdaptiveLimit`](super::AdaptiveLimit): the handler's, or a
    /// refusal.
    pub struct ResponseFuture<F> {
        #[pin]
        answer: Answer<F, Option<Permit>>,
    }
}

impl<F> ResponseFuture<F> {
    /// An admitted request: the handler's future, and its place in the limit.
    pub(super) fn admitted(inner: F, permit: Permit) -> Self {
        ResponseFuture {
            answer: Answer::handler(inner, Some(permit)),
        }
    }

    /// A refused request: the refusal.
    pub(super) fn refused(response: Response<Bytes>) -> Self {
        ResponseFuture {
            answer: Answer::now(response),
        }
    }
}

impl<F, B, E> std::future::Future for ResponseFuture<F>
where
    F: std::future::Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        self.project().answer.poll(cx, |inner, permit, cx| {
            let result = std::task::ready!(inner.poll(cx));
            if let Some(permit) = permit.take() {
                let signal = match &result {
                    Ok(res) => signal_of(res.status()),
                    Err(_) => Signal::Ignore,
                };
                permit.answered(signal);
            }
            Poll::Ready(result)
        })
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// What a handler's status says about load.
fn signal_of(status: StatusCode) -> Signal {
    match status.as_u16() {
        429 | 503 | 504 => Signal::Overloaded,
        _ => Signal::Answered,
    }
}
