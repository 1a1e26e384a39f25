//! The state the server layers' futures share: an answer the layer gave at once (a refusal), or
//! the handler's future, polled by each layer its own way. Written once here; each layer's
//! `future::ResponseFuture` holds one and says how it polls the handler. And the gRPC answer the
//! layers write themselves.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response};
use pin_project_lite::pin_project;

use super::ResponseBody;

pin_project! {
    /// The layer's own answer, or the handler's future with what the layer keeps beside it
    /// (`X`: the call context, a permit, nothing).
    #[project = AnswerProj]
    pub(crate) enum Answer<F, X> {
        /// Answered by the layer; `None` once returned.
        Now { response: Option<Response<Bytes>> },
        /// The handler's future, and the layer's part beside it.
        Handler { #[pin] inner: F, with: X },
    }
}

impl<F, X> Answer<F, X> {
    /// The layer's own answer.
    pub(crate) fn now(response: Response<Bytes>) -> Self {
        Answer::Now {
            response: Some(response),
        }
    }

    /// The handler's future, with the layer's part beside it.
    pub(crate) fn handler(inner: F, with: X) -> Self {
        Answer::Handler { inner, with }
    }

    /// The layer's answer at once, or the handler's through `poll_handler`, its body passed
    /// through.
    #[inline]
    pub(crate) fn poll<B, E>(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        poll_handler: impl FnOnce(
            Pin<&mut F>,
            &mut X,
            &mut TaskContext<'_>,
        ) -> Poll<Result<Response<B>, E>>,
    ) -> Poll<Result<Response<ResponseBody<B>>, E>> {
        match self.project() {
            AnswerProj::Now { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response.map(ResponseBody::layers))),
                // Polled after it returned: stays pending, as before.
                None => Poll::Pending,
            },
            AnswerProj::Handler { inner, with } => poll_handler(inner, with, cx)
                .map(|result| result.map(|response| response.map(ResponseBody::new))),
        }
    }
}

/// A gRPC answer of the layer's own: trailers-only, `code` and `message` in the head.
pub(crate) fn grpc_response(code: &'static str, message: &str) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    let headers = res.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(
        HeaderName::from_static("grpc-status"),
        HeaderValue::from_static(code),
    );
    if let Ok(v) = HeaderValue::from_str(message) {
        headers.insert(HeaderName::from_static("grpc-message"), v);
    }
    res
}
