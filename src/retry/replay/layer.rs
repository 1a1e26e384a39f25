//! The replay layer.

use tower_layer::Layer;

use super::Replay;

/// The default buffering limit: 64 KiB.
const DEFAULT_REPLAY_LIMIT: usize = 64 * 1024;

/// Buffers request bodies up to a limit (default 64 KiB), so that the
/// [`RetryLayer`](crate::retry::RetryLayer) inside can send the same bytes on every attempt.
///
/// A retry sends a copy of the request (`Req: Clone`), and a streaming body such as hyper's
/// `Incoming` cannot be copied. This layer turns `Request<B>` into `Request<ReplayBody<B>>`,
/// which is `Clone`:
///
/// * a body that ends within the limit is read once into memory, trailers included, and every
///   copy replays it;
/// * a larger body (by its size hint, or found while reading), or one that fails while being
///   read, is sent as it comes, once: the request is marked [`NotReplayable`](super::NotReplayable) and its copies
///   have no body to give (they fail if polled). The retry layer does not make copies of such a
///   request, so the call is single-attempt, and its record says why.
///
/// The body must be `Unpin` (hyper's `Incoming`, `Full`, `Empty` and boxed bodies are); pin
/// another one with `Box::pin` or `http_body_util::BodyExt::boxed` first.
///
/// Reading happens before the inner service is called, inside the call's deadline when a
/// [`SetDeadlineLayer`](crate::deadline::SetDeadlineLayer) is outside. Place the layer between the
/// idempotency-key layer and the retry layer
/// ([layer order](crate::docs::architecture#layer-order)).
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use surely::retry::{ReplayBody, ReplayLayer, RetryLayer};
/// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let mut client = ServiceBuilder::new()
///     .layer(ReplayLayer::new())
///     .layer(RetryLayer::new())
///     .service(service_fn(|req: http::Request<ReplayBody<Full<Bytes>>>| async move {
///         let body = req.into_body().collect().await?.to_bytes();
///         Ok::<_, surely::classify::BoxError>(http::Response::new(body))
///     }));
///
/// let req = http::Request::put("/orders/o-1").body(Full::new(Bytes::from("qty=1"))).unwrap();
/// let res = client.ready().await.unwrap().call(req).await.unwrap();
/// assert_eq!(res.body(), "qty=1");
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ReplayLayer {
    limit: usize,
}

impl ReplayLayer {
    /// Buffers bodies of up to 64 KiB.
    pub fn new() -> Self {
        ReplayLayer {
            limit: DEFAULT_REPLAY_LIMIT,
        }
    }

    /// Buffers bodies of up to `limit` bytes (default 64 KiB: 65,536); larger ones are sent
    /// once. Zero makes every request with a body single-attempt (an empty body is still
    /// replayable).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

impl Default for ReplayLayer {
    fn default() -> Self {
        ReplayLayer::new()
    }
}

impl<S> Layer<S> for ReplayLayer {
    type Service = Replay<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Replay {
            inner,
            limit: self.limit,
        }
    }
}
