//! The attempt record: one [`AttemptRecord`](crate::record::AttemptRecord) per attempt, with
//! how far the request got, how it was classified and how much of the call's budget was left.
//!
//! [`RecordAttemptLayer`] goes **outside** the attempt timeout, so that it sees the timeout
//! fire and how far the request had got, and inside the retry layer and the hedge, so that it
//! numbers every attempt and marks hedges ([layer order](crate::docs::architecture#layer-order)).
//! The layer and its service are re-exported at [`record`](crate::record).
//!
//! ```
//! use surely::record::attempt::RecordAttempt;
//! use surely::record::InMemoryRecorder;
//! use surely::classify::AttemptClass;
//! use tower::{service_fn, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let records = InMemoryRecorder::new();
//! let transport = service_fn(|_req: http::Request<()>| async {
//!     Ok::<_, std::io::Error>(http::Response::builder().status(502).body(()).unwrap())
//! });
//! let svc = RecordAttempt::new(transport, records.clone());
//! svc.oneshot(http::Request::get("/orders/o-1").body(()).unwrap()).await.unwrap();
//! // A gateway's 502: the request may have reached the server.
//! let attempt = &records.attempts()[0];
//! assert_eq!((attempt.attempt, attempt.class()), (1, AttemptClass::MaybeCommitted));
//! # }
//! ```

pub mod future;
mod layer;
mod service;

pub use self::layer::RecordAttemptLayer;
pub use self::service::RecordAttempt;
