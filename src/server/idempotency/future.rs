//! The [`Idempotency`](super::Idempotency) service's response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body_util::Full;

use crate::context::{Context as CallContext, InContext};

/// The response future of [`Idempotency`](super::Idempotency).
///
/// One boxed future per request: the work is a sequence of awaits on the store and on two
/// bodies, whose store I/O dwarfs one allocation; a hand-written state machine over a generic
/// store's `impl Future`s would gain little and be hard to read.
///
/// A keyed request's future, dropped before it answered (its caller went away), is not dropped
/// with it: it moves onto a task of its own and runs to its end there, in the call context and
/// `tracing` span it was called in (unless the layer was told to
/// [`cancel_with_caller`](super::IdempotencyLayerBuilder::cancel_with_caller)). While its caller
/// waits, it runs in the caller's task, at no extra cost.
pub struct ResponseFuture<E: Send + 'static> {
    // `None` once it answered.
    inner: Option<BoxFuture<E>>,
    // Where to finish the work if the caller goes away first; `None` to drop it with the caller.
    orphan: Option<(CallContext, tracing::Span)>,
}

pub(super) type BoxFuture<E> =
    Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, E>> + Send>>;

impl<E: Send + 'static> ResponseFuture<E> {
    /// The work of a request, and where to finish it if the caller goes away first (`None`:
    /// dropped with the caller).
    pub(super) fn new(work: BoxFuture<E>, orphan: Option<(CallContext, tracing::Span)>) -> Self {
        ResponseFuture {
            inner: Some(work),
            orphan,
        }
    }

    /// An answer known without any work.
    pub(super) fn ready(res: Response<Full<Bytes>>) -> Self {
        ResponseFuture {
            inner: Some(Box::pin(std::future::ready(Ok(res)))),
            orphan: None,
        }
    }
}

impl<E: Send + 'static> Future for ResponseFuture<E> {
    type Output = Result<Response<Full<Bytes>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(inner) = self.inner.as_mut() else {
            // Polled again after it answered.
            return Poll::Pending;
        };
        let out = std::task::ready!(inner.as_mut().poll(cx));
        self.inner = None;
        Poll::Ready(out)
    }
}

impl<E: Send + 'static> Drop for ResponseFuture<E> {
    fn drop(&mut self) {
        let (Some(work), Some((ctx, span))) = (self.inner.take(), self.orphan.take()) else {
            return;
        };
        // The caller went away mid-request: the work goes on, on a task of its own, so that its
        // result is stored for the retry. No runtime (or one shutting down, which drops the
        // task): the owner's key waits out its lease.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(InContext::with(work, ctx, span));
        }
    }
}

impl<E: Send + 'static> fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
