//! HTTP attempts settled when their body ends (`RecordAttemptLayer::at_body_end`, the `http()`
//! preset's default): a body cut off mid-way is a failed attempt, and the call follows.

use std::convert::Infallible;
use std::io;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use surely::classify::AttemptClass;
use surely::record::{InMemoryRecorder, RecordAttemptLayer, RecordCallLayer, WatchTrailersLayer};
use surely::Outcome;
use surely::OutcomeExt;
use surely::StopReason;
use tower::{service_fn, ServiceBuilder};

use super::support::call;

type Body = BoxBody<Bytes, io::Error>;

/// Half an order list, then the connection breaks.
fn cut_off() -> Body {
    let frames: Vec<Result<http_body::Frame<Bytes>, io::Error>> = vec![
        Ok(http_body::Frame::data(Bytes::from_static(
            b"[{\"id\":\"o-1\"},",
        ))),
        Err(io::ErrorKind::ConnectionReset.into()),
    ];
    StreamBody::new(tokio_stream::iter(frames)).boxed()
}

fn whole() -> Body {
    Full::new(Bytes::from_static(b"created"))
        .map_err(|e: Infallible| match e {})
        .boxed()
}

macro_rules! client {
    ($records:expr, $body:expr) => {
        ServiceBuilder::new()
            .layer(RecordCallLayer::new($records.clone()))
            .layer(RecordAttemptLayer::new($records.clone()).at_body_end())
            .layer(WatchTrailersLayer::new())
            .service(service_fn(move |_req: Request<Empty<Bytes>>| async move {
                Ok::<_, io::Error>(Response::new($body))
            }))
    };
}

fn post() -> Request<Empty<Bytes>> {
    Request::post("http://shop/orders")
        .body(Empty::new())
        .unwrap()
}

fn get() -> Request<Empty<Bytes>> {
    Request::get("http://shop/orders")
        .body(Empty::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_body_cut_off_mid_way_is_a_failed_attempt_and_a_writes_call_is_unknown() {
    let records = InMemoryRecorder::new();
    let mut client = client!(records, cut_off());
    let res = call(&mut client, post()).await.unwrap();
    // The head said 200: the caller is handed what the head said...
    assert_eq!(res.status(), 200);
    // ...and nothing is recorded until the body ends.
    assert!(records.attempts().is_empty() && records.calls().is_empty());
    assert!(res.into_body().collect().await.is_err());
    let attempt = &records.attempts()[0];
    assert_eq!(attempt.class(), AttemptClass::MaybeCommitted);
    assert!(!attempt.cancelled);
    let call = &records.calls()[0];
    assert_eq!((call.outcome, call.attempts), (Outcome::Unknown, 1));
}

#[tokio::test(start_paused = true)]
async fn a_reads_body_cut_off_is_a_failed_call() {
    let records = InMemoryRecorder::new();
    let mut client = client!(records, cut_off());
    let res = call(&mut client, get()).await.unwrap();
    assert!(res.into_body().collect().await.is_err());
    assert_eq!(records.calls()[0].outcome, Outcome::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_body_read_to_its_end_keeps_what_the_head_said() {
    let records = InMemoryRecorder::new();
    let mut client = client!(records, whole());
    let res = call(&mut client, post()).await.unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "created");
    assert_eq!(records.attempts()[0].class(), AttemptClass::Success);
    let call = &records.calls()[0];
    assert_eq!(
        (call.outcome, call.stop),
        (Outcome::Succeeded, StopReason::Success)
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_unread_keeps_what_the_head_said_and_is_not_a_cancelled_call() {
    let records = InMemoryRecorder::new();
    let mut client = client!(records, cut_off());
    let res = call(&mut client, post()).await.unwrap();
    assert_eq!(res.outcome(), Outcome::Succeeded);
    drop(res);
    let attempt = &records.attempts()[0];
    assert_eq!(attempt.class(), AttemptClass::Success);
    assert!(!attempt.cancelled);
    let call = &records.calls()[0];
    assert_eq!(
        (call.outcome, call.stop),
        (Outcome::Succeeded, StopReason::Success)
    );
}

#[tokio::test(start_paused = true)]
async fn without_at_body_end_an_http_attempt_is_recorded_at_its_head() {
    let records = InMemoryRecorder::new();
    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(records.clone()))
        .layer(RecordAttemptLayer::new(records.clone()))
        .layer(WatchTrailersLayer::new())
        .service(service_fn(|_req: Request<Empty<Bytes>>| async {
            Ok::<_, io::Error>(Response::new(cut_off()))
        }));
    let res = call(&mut client, post()).await.unwrap();
    assert_eq!(records.calls()[0].outcome, Outcome::Succeeded);
    assert!(res.into_body().collect().await.is_err());
    assert_eq!(records.attempts().len(), 1);
}
