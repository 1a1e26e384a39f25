//! The call record: one [`CallRecord`](crate::record::CallRecord) per logical call, its
//! outcome and why it stopped.
//!
//! [`RecordCallLayer`] is the outermost layer of a client stack: it gives the call the
//! [`CallId`](crate::record::CallId) its attempt records carry, and folds what the
//! [attempt records](crate::record::attempt) inside it report into the call's
//! [`Outcome`](crate::Outcome) and [`StopReason`](crate::StopReason). Without one inside, it
//! classifies the call's result as a single attempt. The layer and its service are re-exported
//! at [`record`](crate::record).
//!
//! ```
//! use surely::record::call::RecordCall;
//! use surely::record::InMemoryRecorder;
//! use surely::Outcome;
//! use tower::{service_fn, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let records = InMemoryRecorder::new();
//! let transport = service_fn(|_req: http::Request<()>| async {
//!     Ok::<_, std::io::Error>(http::Response::new(()))
//! });
//! let svc = RecordCall::new(transport, records.clone());
//! svc.oneshot(http::Request::get("/orders/o-1").body(()).unwrap()).await.unwrap();
//! assert_eq!(records.calls()[0].outcome, Outcome::Succeeded);
//! # }
//! ```

pub mod future;
mod layer;
mod service;

pub use self::layer::RecordCallLayer;
pub use self::service::RecordCall;
