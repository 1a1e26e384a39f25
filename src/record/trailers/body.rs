//! The response body whose end settles the records deferred to it.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::watch::{End, Watch};

pin_project! {
    /// A response body whose end settles the records deferred to it. Made by
    /// [`WatchTrailersLayer`](super::WatchTrailersLayer); the data and trailers pass through unchanged.
    pub struct WatchedBody<B: Body> {
        #[pin]
        inner: B,
        watch: Option<Watch>,
    }

    impl<B: Body> PinnedDrop for WatchedBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(watch) = this.watch.take() {
                // A body that had ended without trailers ended so, read or not.
                watch.end(if this.inner.is_end_stream() {
                    End::Trailers(None)
                } else {
                    End::Dropped
                });
            }
        }
    }
}

impl<B: Body> WatchedBody<B> {
    /// A body nobody watches: what a [resolver](crate::retry::Resolve) or a test hands back
    /// where the client's responses are watched bodies.
    pub fn new(inner: B) -> Self {
        WatchedBody { inner, watch: None }
    }

    pub(crate) fn watched(inner: B, watch: Option<Watch>) -> Self {
        WatchedBody { inner, watch }
    }
}

impl<B: Body + fmt::Debug> fmt::Debug for WatchedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchedBody")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for WatchedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if let Some(watch) = this.watch.as_ref() {
            let end = match &frame {
                Some(Ok(frame)) => frame.trailers_ref().map(|t| End::Trailers(Some(t))),
                Some(Err(_)) => Some(End::Broken),
                None => Some(End::Trailers(None)),
            };
            if let Some(end) = end {
                watch.end(end);
                *this.watch = None;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
