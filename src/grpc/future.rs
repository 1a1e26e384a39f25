//! The method semantics layer's future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

pin_project! {
    /// The future of [`MethodSemantics`](super::MethodSemantics): the inner service's, as it
    /// is (the mark was put on the request before the call).
    pub struct ResponseFuture<F> {
        #[pin]
        pub(super) inner: F,
    }
}

impl<F: Future> Future for ResponseFuture<F> {
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().inner.poll(cx)
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
