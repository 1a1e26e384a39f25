//! The [`Recheck`](super::Recheck)'s response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use http::Response;
use pin_project_lite::pin_project;

pin_project! {
    /// The response future of [`Recheck`](super::Recheck): the handler's, polled as it is, or
    /// the layer's refusal.
    pub struct ResponseFuture<F, B> {
        #[pin]
        state: State<F, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B> {
        Respond { response: Option<Response<B>> },
        Passing { #[pin] inner: F },
    }
}

impl<F, B> ResponseFuture<F, B> {
    /// The handler's future, polled as it is.
    pub(super) fn passing(inner: F) -> Self {
        ResponseFuture {
            state: State::Passing { inner },
        }
    }

    pub(super) fn respond(response: Response<B>) -> Self {
        ResponseFuture {
            state: State::Respond {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Respond { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending,
            },
            StateProj::Passing { inner } => inner.poll(cx),
        }
    }
}

impl<F, B> fmt::Debug for ResponseFuture<F, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
