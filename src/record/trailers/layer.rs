//! The trailers watch layer.

use tower_layer::Layer;

use super::WatchTrailers;

/// Lets the record layers above settle gRPC attempts from their trailers, over a transport of
/// `http` messages. [`GrpcTransport`][crate::grpc::GrpcTransport] does the same for tonic
/// channels, without this layer.
///
/// Put it right around the transport, inside every record layer. A response gets a
/// [`WatchedBody`](super::WatchedBody) always; the body is watched (at the cost of one small allocation) only for
/// requests an enabled [`RecordAttemptLayer`](crate::record::RecordAttemptLayer) above marked, which
/// it does for gRPC requests.
///
/// An attempt whose classifier defers to the end of the stream is then recorded when the body
/// ends, and its call right after it; until then neither is. The body ends in one of three
/// ways:
///
/// * with its trailers, or with none: the classifier reads them (no `grpc-status` at all is a
///   failure after the response started);
/// * with an error: the stream broke after the response started (*maybe committed*);
/// * dropped before its end: the caller stopped reading. The attempt keeps what the head said
///   and is marked `cancelled`, and the call stops as
///   [`StopReason::Cancelled`](crate::StopReason::Cancelled).
///
/// Without a watched body, the records classify at the head, as the retry layer always does
/// (a stream that has reached the caller cannot be retried anyway).
///
/// ```
/// use surely::record::{InMemoryRecorder, RecordAttemptLayer, WatchTrailersLayer};
/// use surely::classify::AttemptClass;
/// use http_body_util::{BodyExt, Full};
/// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // A gRPC server that answers 200, then `UNAVAILABLE` in the trailers.
/// let server = service_fn(|_req: http::Request<Full<bytes::Bytes>>| async {
///     let mut trailers = http::HeaderMap::new();
///     trailers.insert("grpc-status", http::HeaderValue::from_static("14"));
///     let body = Full::new(bytes::Bytes::from_static(b"update"))
///         .with_trailers(async { Some(Ok(trailers)) });
///     Ok::<_, std::io::Error>(http::Response::new(body))
/// });
/// let recorder = InMemoryRecorder::new();
/// let mut client = ServiceBuilder::new()
///     .layer(RecordAttemptLayer::new(recorder.clone()))
///     .layer(WatchTrailersLayer::new())
///     .service(server);
/// let req = http::Request::post("http://shop/shop.Orders/Watch")
///     .header("content-type", "application/grpc")
///     .body(Full::default())
///     .unwrap();
/// let res = client.ready().await.unwrap().call(req).await.unwrap();
/// // Nothing is recorded until the body ends...
/// assert!(recorder.attempts().is_empty());
/// res.into_body().collect().await.unwrap();
/// // ...and then from the trailers.
/// assert_eq!(recorder.attempts()[0].class(), AttemptClass::MaybeCommitted);
/// # }
/// ```
#[cfg_attr(
    not(feature = "tonic"),
    doc = crate::docs::links::to_features!(
        "crate::grpc::GrpcTransport",
    )
)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WatchTrailersLayer {
    _priv: (),
}

impl WatchTrailersLayer {
    /// The layer.
    pub fn new() -> Self {
        WatchTrailersLayer::default()
    }
}

impl<S> Layer<S> for WatchTrailersLayer {
    type Service = WatchTrailers<S>;

    fn layer(&self, inner: S) -> WatchTrailers<S> {
        WatchTrailers { inner }
    }
}
