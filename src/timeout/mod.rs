//! The attempt timeout: one try gets `min(per-try timeout, the call's remaining budget)`; and
//! the body idle timeout ([`BodyIdleTimeoutLayer`]), for the response body after the head.
//!
//! The attempt timeout ends an attempt that has no response head yet: it is the timeout of the
//! second of the three phases an attempt passes through (connect, the head, the body), each
//! with its own timeout and its own meaning for the outcome
//! ([`docs::deadlines`](crate::docs::deadlines#three-phases-three-timeouts)).
//!
//! When it fires, the error ([`Elapsed`]) says where: before the request was
//! sent or after. That is the difference between *rejected* (retry anything) and *maybe
//! committed* (retry only what can be repeated). The phase comes from a
//! [`Progress`](crate::delivery::Progress) handle in the request's extensions when the transport
//! reports one; without it, a timeout after the inner service was called is *maybe committed*.
//!
//! # How this differs from `tower::timeout`
//!
//! tower's `Timeout` has one fixed duration and creates a timer on every call. This layer also
//! obeys the call's deadline (from the [`SetDeadlineLayer`](crate::deadline::SetDeadlineLayer) or the
//! request), says where it fired, and starts no timer, and reads no clock, for an inner future
//! that answers on its first poll. The per-try clock starts at that first poll.
//!
//! ```
//! use std::time::Duration;
//! use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
//! use surely::timeout::AttemptTimeoutLayer;
//! use tower::{service_fn, Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let slow = service_fn(|_: http::Request<()>| async {
//!     tokio::time::sleep(Duration::from_secs(5)).await;
//!     Ok::<_, std::io::Error>(())
//! });
//! let mut svc = AttemptTimeoutLayer::new(Duration::from_millis(200)).layer(slow);
//! let err = svc.ready().await.unwrap().call(http::Request::new(())).await.unwrap_err();
//! assert!(err.is_elapsed());
//! assert_eq!(err.classify_error(DeliveryPhase::Sent).class(), AttemptClass::MaybeCommitted);
//! # }
//! ```

pub mod body;
pub mod future;
mod layer;
mod service;

pub use self::body::{
    BodyIdleTimeout, BodyIdleTimeoutLayer, BodyIdleTimeoutLayerBuilder, IdleTimeoutBody,
};
pub use self::layer::{AttemptTimeoutLayer, AttemptTimeoutLayerBuilder};
pub use self::service::AttemptTimeout;
pub use crate::error::{BodyIdle, Elapsed};
