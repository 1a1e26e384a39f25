//! Records of responses whose status is in their trailers (gRPC), settled at the end of the
//! stream: the body wrapper, the cell it shares with the record layers, and the layer that
//! puts them around a transport. [`WatchTrailersLayer`] says how the records settle.
//!
//! A gRPC response that streams has its status in its trailers, which arrive after the head
//! the record layers see. [`WatchTrailersLayer`], right around the transport, hands every
//! response back with a [`WatchedBody`], which tells the record layers above how the body
//! ended. The layer, its service and the body are re-exported at [`record`](crate::record).
//!
//! ```
//! use http_body_util::{BodyExt, Full};
//! use surely::record::trailers::WatchTrailers;
//! use tower::{service_fn, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let server = service_fn(|_req: http::Request<()>| async {
//!     Ok::<_, std::io::Error>(http::Response::new(Full::new(bytes::Bytes::from("o-1"))))
//! });
//! // Without a record layer above asking, the body passes every frame through, unwatched.
//! let res = WatchTrailers::new(server).oneshot(http::Request::new(())).await.unwrap();
//! assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "o-1");
//! # }
//! ```

mod body;
pub mod future;
mod layer;
mod service;
mod watch;

pub use self::body::WatchedBody;
pub use self::layer::WatchTrailersLayer;
pub use self::service::WatchTrailers;
#[cfg(feature = "tonic")]
pub(crate) use self::watch::watch_response;
pub(crate) use self::watch::{End, Settled, WantsTrailers, Watch};
