//! The [`AdaptiveLimit`](super::AdaptiveLimit)'s response future.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use http::{Response, StatusCode};
use pin_project_lite::pin_project;

use super::algorithm::Signal;
use super::service::Permit;
use crate::server::answer::Answer;

pin_project! {
    /// The response future of [`AdaptiveLimit`](super::AdaptiveLimit): the handler's, or a
    /// refusal.
    pub struct ResponseFuture<F, B> {
        #[pin]
        answer: Answer<F, B, Option<Permit>>,
    }
}

impl<F, B> ResponseFuture<F, B> {
    /// An admitted request: the handler's future, and its place in the limit.
    pub(super) fn admitted(inner: F, permit: Permit) -> Self {
        ResponseFuture {
            answer: Answer::handler(inner, Some(permit)),
        }
    }

    /// A refused request: the refusal.
    pub(super) fn refused(response: Response<B>) -> Self {
        ResponseFuture {
            answer: Answer::now(response),
        }
    }
}

impl<F, B, E> std::future::Future for ResponseFuture<F, B>
where
    F: std::future::Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

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

impl<F, B> std::fmt::Debug for ResponseFuture<F, B> {
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
