//! Replayable request bodies: buffer small bodies once so that every attempt sends the same
//! bytes.
//!
//! A retry sends a copy of the request, and a streaming body (hyper's `Incoming`, tonic's)
//! cannot be copied. [`ReplayLayer`], outside the [`RetryLayer`](crate::retry::RetryLayer),
//! reads each body ahead once, up to a limit, and hands the request on with a [`ReplayBody`]
//! that every copy replays; a body too large to keep is sent once, and its request is marked
//! [`NotReplayable`], so that the retry layer makes no copy of it. The layer and its service
//! are re-exported at [`retry`](crate::retry).
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use surely::retry::replay::{Replay, ReplayBody};
//! use tower::{service_fn, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let svc = Replay::new(service_fn(|req: http::Request<ReplayBody<Full<Bytes>>>| async move {
//!     // Buffered: a copy of this request would send the same bytes.
//!     assert!(req.body().is_replayable());
//!     let body = req.into_body().collect().await?.to_bytes();
//!     Ok::<_, surely::classify::BoxError>(body)
//! }));
//! let req = http::Request::put("/orders/o-1").body(Full::new(Bytes::from("qty=1"))).unwrap();
//! assert_eq!(svc.oneshot(req).await.unwrap(), "qty=1");
//! # }
//! ```

mod body;
pub mod future;
mod layer;
mod service;

pub use self::body::{NotReplayable, ReplayBody};
pub use self::layer::ReplayLayer;
pub use self::service::Replay;
