//! A tonic `Channel` as the transport of the client stack.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::classify::BoxError;
use crate::headers::OUTCOME;
use crate::outcome::OutcomeInHeaders;
use crate::record::{watch_response, TrailersBody, WantsTrailers};

/// A tonic transport (a `tonic::transport::Channel`, or any service over
/// `http::Request<tonic::body::Body>`) that takes requests with any body, such as the
/// [`ReplayBody`](crate::retry::ReplayBody) of the [`grpc()`](crate::client::grpc) preset.
///
/// tonic's request body is not `Clone`, so a retried request must be buffered
/// ([`ReplayLayer`](crate::retry::ReplayLayer), in the preset) and turned back into
/// tonic's body for the channel, with no other copy. When an attempt record layer above asks
/// (for a gRPC request, with a recorder enabled), it also watches the response body for its
/// trailers, so that the records are settled from `grpc-status`, as
/// [`WatchTrailersLayer`](crate::record::WatchTrailersLayer) does for other transports. Errors
/// are the transport's own (`tonic::transport::Error` for a `Channel`, which the crate
/// classifies: a failed connection is "not sent").
/// [`ClientBuilder::build_channel`](crate::client::ClientBuilder::build_channel) wraps a
/// channel in it for you.
///
/// # Readiness
///
/// `poll_ready` is the inner service's.
#[derive(Clone, Debug)]
pub struct GrpcTransport<S> {
    inner: S,
}

impl<S> GrpcTransport<S> {
    /// Wraps a tonic transport.
    pub fn new(inner: S) -> Self {
        GrpcTransport { inner }
    }

    inner_accessors!();
}

impl<S, B, RB> Service<Request<B>> for GrpcTransport<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<RB>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let watch = req.extensions().get::<WantsTrailers>().is_some();
        ResponseFuture {
            inner: self.inner.call(req.map(tonic::body::Body::new)),
            watch,
        }
    }
}

pin_project! {
    /// The future of [`GrpcTransport`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        watch: bool,
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, RB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Output = Result<Response<tonic::body::Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = std::task::ready!(this.inner.poll(cx))?;
        // The call's outcome is the client stack's to write, never the server's: a value a
        // server sent is removed from the head here, and from the trailers as they pass,
        // and the mark asks the layer that hands the outcome back to write it.
        res.headers_mut().remove(OUTCOME);
        res.extensions_mut().insert(OutcomeInHeaders);
        // When an attempt record above asked, the body's end settles it from the trailers
        // (one more box for the body, one small shared cell); otherwise the body is only
        // given tonic's type.
        let watch = watch_response(*this.watch, &mut res);
        Poll::Ready(Ok(res.map(|body| {
            let body = NoOutcomeTrailers { inner: body };
            match watch {
                Some(watch) => tonic::body::Body::new(TrailersBody::watched(body, Some(watch))),
                None => tonic::body::Body::new(body),
            }
        })))
    }
}

pin_project! {
    /// A response body whose trailers lose any [`OUTCOME`] a server put there.
    struct NoOutcomeTrailers<B> {
        #[pin]
        inner: B,
    }
}

impl<B: http_body::Body> http_body::Body for NoOutcomeTrailers<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let frame = std::task::ready!(self.project().inner.poll_frame(cx));
        Poll::Ready(frame.map(|frame| {
            frame.map(|mut frame| {
                if let Some(trailers) = frame.trailers_mut() {
                    trailers.remove(OUTCOME);
                }
                frame
            })
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
