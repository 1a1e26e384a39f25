//! The state the server layers' futures share: an answer the layer gave at once (a refusal), or
//! the handler's future, polled by each layer its own way. Written once here; each layer's
//! `future::ResponseFuture` holds one and says how it polls the handler.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use http::Response;
use pin_project_lite::pin_project;

pin_project! {
    /// The layer's own answer, or the handler's future with what the layer keeps beside it
    /// (`X`: the call context, a permit, nothing).
    #[project = AnswerProj]
    pub(crate) enum Answer<F, B, X> {
        /// Answered by the layer; `None` once returned.
        Now { response: Option<Response<B>> },
        /// The handler's future, and the layer's part beside it.
        Handler { #[pin] inner: F, with: X },
    }
}

impl<F, B, X> Answer<F, B, X> {
    /// The layer's own answer.
    pub(crate) fn now(response: Response<B>) -> Self {
        Answer::Now {
            response: Some(response),
        }
    }

    /// The handler's future, with the layer's part beside it.
    pub(crate) fn handler(inner: F, with: X) -> Self {
        Answer::Handler { inner, with }
    }

    /// The layer's answer at once, or the handler's through `poll_handler`.
    #[inline]
    pub(crate) fn poll<E>(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        poll_handler: impl FnOnce(
            Pin<&mut F>,
            &mut X,
            &mut TaskContext<'_>,
        ) -> Poll<Result<Response<B>, E>>,
    ) -> Poll<Result<Response<B>, E>> {
        match self.project() {
            AnswerProj::Now { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled after it returned: stays pending, as before.
                None => Poll::Pending,
            },
            AnswerProj::Handler { inner, with } => poll_handler(inner, with, cx),
        }
    }
}
