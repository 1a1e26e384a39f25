//! Records: the evidence of what every attempt and every call did.
//!
//! When a call's outcome is *unknown*, the records are how an operator finds out what happened:
//! which attempts went out, how far each got, with how much budget left, what came back and
//! why the call stopped.
//!
//! * [`RecordAttemptLayer`] yields one [`AttemptRecord`] per attempt. Put it **outside** the
//!   attempt timeout ([layer order](crate::docs::architecture#layer-order)): only from there does
//!   it see the timeout fire and how far the request had got, so that the record can say "timed
//!   out after send".
//! * [`RecordCallLayer`] yields one [`CallRecord`] per logical call: the attempts folded into the
//!   call's [`Outcome`](crate::Outcome) and the [`StopReason`](crate::StopReason). It is the outermost layer of a client stack, and
//!   gives the call the [`CallId`] that its attempt records carry.
//!
//! A gRPC response that streams has its status in its trailers, which arrive after the head
//! the record layers see. Over a transport that watches the body
//! ([`GrpcTransport`][crate::grpc::GrpcTransport], which the `grpc()` preset uses, or
//! [`WatchTrailersLayer`] around any transport of `http` messages),
//! such an attempt is recorded when its body ends, from the trailers, and its call right after;
//! elsewhere the records classify at the head.
//!
//! Records go to a [`Recorder`]: [`TracingRecorder`] (a span per call and per attempt, with
//! OpenTelemetry names such as `http.request.resend_count`), [`InMemoryRecorder`] for tests, any
//! closure `Fn(Record<'_>)`, or `()` for none. With `()`, the record layers read no clock and
//! build nothing: they cost a branch.
//!
//! ```
//! use surely::record::{InMemoryRecorder, RecordAttemptLayer, RecordCallLayer};
//! use surely::Outcome;
//! use tower::{service_fn, ServiceBuilder, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let recorder = InMemoryRecorder::new();
//! let transport = service_fn(|_req: http::Request<()>| async {
//!     Ok::<_, std::io::Error>(http::Response::builder().status(502).body(()).unwrap())
//! });
//! let mut client = ServiceBuilder::new()
//!     .layer(RecordCallLayer::new(recorder.clone()))
//!     .layer(RecordAttemptLayer::new(recorder.clone()))
//!     .service(transport);
//!
//! let req = http::Request::post("/orders").body(()).unwrap();
//! let _ = client.ready().await.unwrap().call(req).await;
//!
//! let call = &recorder.calls()[0];
//! assert_eq!(call.outcome, Outcome::Unknown); // a 502 on a POST without a key
//! assert_eq!(recorder.attempts()[0].attempt, 1);
//! # }
//! ```
#![cfg_attr(
    not(feature = "tonic"),
    doc = crate::docs::links::to_features!(
        "crate::grpc::GrpcTransport",
    )
)]

pub mod attempt;
pub mod call;
pub mod trailers;

pub use self::attempt::{RecordAttempt, RecordAttemptLayer};
pub use self::call::{RecordCall, RecordCallLayer};
#[cfg(feature = "tonic")]
pub(crate) use self::trailers::{watch_response, WantsTrailers, WatchedBody as TrailersBody};
pub use self::trailers::{WatchTrailers, WatchTrailersLayer, WatchedBody};

pub(crate) use crate::evidence::key_of;
#[cfg(feature = "opentelemetry")]
pub use crate::evidence::OtelRecorder;
#[cfg(feature = "server")]
pub use crate::evidence::{
    AbandonedVerdict, LimitEvent, LimitEventKind, RecoveryVerdict, RefusalReason, ServerEvent,
    ServerEventKind,
};
pub use crate::evidence::{
    AttemptRecord, BreakerEvent, BreakerEventKind, BusinessKey, CallId, CallRecord,
    InMemoryRecorder, MaintenanceOutcome, MaintenanceReport, Operation, OutboxStats,
    ReconcileReport, Record, Recorder, RelayReport, RelayRound, ResolutionRecord, RetryRecord,
    TracingRecorder, TransitionReason,
};
