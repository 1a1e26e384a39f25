//! The body idle timeout: a response body that goes quiet for too long is failed with
//! [`BodyIdle`](crate::timeout::BodyIdle).
//!
//! The attempt timeout ends an attempt that has no response head yet; once the head is in, the
//! body may still stall. [`BodyIdleTimeoutLayer`] times the body's silences, the third of the
//! three phases an attempt passes through
//! ([`docs::deadlines`](crate::docs::deadlines#three-phases-three-timeouts)): its service's
//! responses carry an [`IdleTimeoutBody`], which fails with a typed error when no frame comes
//! for too long while its caller waits. The layer and its service are re-exported at
//! [`timeout`](crate::timeout).
//!
//! ```
//! use std::time::Duration;
//! use http_body_util::{BodyExt, Empty};
//! use surely::timeout::body::BodyIdleTimeout;
//! use tower::{service_fn, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let server = service_fn(|_: http::Request<()>| async {
//!     Ok::<_, std::io::Error>(http::Response::new(Empty::<bytes::Bytes>::new()))
//! });
//! let client = BodyIdleTimeout::new(server, Duration::from_secs(5));
//! let res = client.oneshot(http::Request::new(())).await.unwrap();
//! // A body that ends at once never waits, so never times out.
//! assert!(res.into_body().collect().await.unwrap().to_bytes().is_empty());
//! # }
//! ```

pub mod future;
mod idle;
mod layer;
mod service;

pub use self::idle::IdleTimeoutBody;
pub use self::layer::{BodyIdleTimeoutLayer, BodyIdleTimeoutLayerBuilder};
pub use self::service::BodyIdleTimeout;
