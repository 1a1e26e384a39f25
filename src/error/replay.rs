//! The replay layer's error.

/// The error of a copy of a request whose body was not buffered: the body of a
/// [`ReplayBody`](crate::retry::ReplayBody) that could be sent only once, polled again.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use surely::retry::{BodyNotReplayable, NotReplayable, ReplayBody, ReplayLayer};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // A body over the limit is sent once: a copy of its request has no body to give.
/// let svc = ReplayLayer::new().limit(2).layer(service_fn(
///     |req: http::Request<ReplayBody<Full<Bytes>>>| async move {
///         assert!(req.extensions().get::<NotReplayable>().is_some());
///         let copy = req.body().clone();
///         let err = copy.collect().await.unwrap_err();
///         assert!(err.is::<BodyNotReplayable>());
///         Ok::<_, std::convert::Infallible>(())
///     },
/// ));
/// let req = http::Request::put("/orders/o-1").body(Full::new(Bytes::from("qty=1"))).unwrap();
/// svc.oneshot(req).await.unwrap();
/// # }
/// ```
#[derive(Clone, Copy, Debug, thiserror::Error)]
#[error("request body was not buffered (too large, or it failed while being read), so it cannot be sent again")]
#[non_exhaustive]
pub struct BodyNotReplayable;
