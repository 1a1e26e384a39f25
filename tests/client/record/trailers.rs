//! Records of gRPC responses whose status is in the trailers, over any transport of `http`
//! messages with `WatchTrailersLayer`: settled when the body ends, call after attempt.

use std::convert::Infallible;
use std::io;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use surely::classify::AttemptClass;
use surely::record::WatchTrailersLayer;
use surely::record::{InMemoryRecorder, RecordAttemptLayer, RecordCallLayer};
use surely::Outcome;
use surely::Semantics;
use surely::StopReason;
use tower::{service_fn, ServiceBuilder};

use super::support::call;

type Body = BoxBody<Bytes, io::Error>;

fn grpc_request(semantics: Semantics) -> Request<Empty<Bytes>> {
    let mut req = Request::post("http://shop/shop.Orders/Watch")
        .header("content-type", "application/grpc")
        .body(Empty::new())
        .unwrap();
    req.extensions_mut().insert(semantics);
    req
}

fn trailers(status: &'static str) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static(status));
    trailers
}

/// One message, then the status in the trailers.
fn streamed(status: &'static str) -> Body {
    Full::new(Bytes::from_static(b"update"))
        .map_err(|e: Infallible| match e {})
        .with_trailers(async move { Some(Ok(trailers(status))) })
        .boxed()
}

/// One message, then a broken stream.
fn broken() -> Body {
    let frames: Vec<Result<http_body::Frame<Bytes>, io::Error>> = vec![
        Ok(http_body::Frame::data(Bytes::from_static(b"update"))),
        Err(io::ErrorKind::ConnectionReset.into()),
    ];
    StreamBody::new(tokio_stream::iter(frames)).boxed()
}

/// The client records calls and attempts over a transport that answers with `body`, and
/// watches the body for its trailers unless told `unwatched`.
macro_rules! client {
    ($records:expr, $body:expr) => {
        ServiceBuilder::new()
            .layer(RecordCallLayer::new($records.clone()))
            .layer(RecordAttemptLayer::new($records.clone()))
            .layer(WatchTrailersLayer::new())
            .service(service_fn(move |_req: Request<Empty<Bytes>>| async move {
                Ok::<_, io::Error>(Response::new($body))
            }))
    };
    ($records:expr, $body:expr, unwatched) => {
        ServiceBuilder::new()
            .layer(RecordCallLayer::new($records.clone()))
            .layer(RecordAttemptLayer::new($records.clone()))
            .service(service_fn(move |_req: Request<Empty<Bytes>>| async move {
                Ok::<_, io::Error>(Response::new($body))
            }))
    };
}

#[tokio::test(start_paused = true)]
async fn a_status_in_the_trailers_settles_the_attempt_then_the_call() {
    let records = InMemoryRecorder::new();
    let mut client = client!(records, streamed("14"));
    let res = call(&mut client, grpc_request(Semantics::NonIdempotent))
        .await
        .unwrap();
    assert!(records.attempts().is_empty() && records.calls().is_empty());

    let collected = res.into_body().collect().await.unwrap();
    assert_eq!(
        collected.trailers().map(|t| &t["grpc-status"]),
        Some(&HeaderValue::from_static("14"))
    );
    let attempts = records.attempts();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].class(), AttemptClass::MaybeCommitted);
    let calls = records.calls();
    assert_eq!(calls.len(), 1);
    // A write whose stream broke off with UNAVAILABLE after it started may have committed.
    assert_eq!(calls[0].outcome, Outcome::Unknown);
    assert_eq!(calls[0].attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn an_ok_status_in_the_trailers_is_a_success() {
    let records = InMemoryRecorder::new();
    let mut client = client!(records, streamed("0"));
    let res = call(&mut client, grpc_request(Semantics::Safe))
        .await
        .unwrap();
    res.into_body().collect().await.unwrap();
    assert_eq!(records.attempts()[0].class(), AttemptClass::Success);
    assert_eq!(records.calls()[0].outcome, Outcome::Succeeded);
    assert_eq!(records.calls()[0].stop, StopReason::Success);
}

#[tokio::test(start_paused = true)]
async fn a_broken_stream_may_have_committed() {
    let records = InMemoryRecorder::new();
    let mut client = client!(records, broken());
    let res = call(&mut client, grpc_request(Semantics::NonIdempotent))
        .await
        .unwrap();
    assert!(res.into_body().collect().await.is_err());
    assert_eq!(records.attempts()[0].class(), AttemptClass::MaybeCommitted);
    assert_eq!(records.calls()[0].outcome, Outcome::Unknown);
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_ends_without_trailers_failed_after_it_started() {
    let records = InMemoryRecorder::new();
    let body = || {
        Full::new(Bytes::from_static(b"update"))
            .map_err(|e: Infallible| match e {})
            .boxed()
    };
    let mut client = client!(records, body());
    let res = call(&mut client, grpc_request(Semantics::Safe))
        .await
        .unwrap();
    res.into_body().collect().await.unwrap();
    assert_eq!(records.attempts()[0].class(), AttemptClass::MaybeCommitted);
    // A read that failed is a failure, whatever it committed.
    assert_eq!(records.calls()[0].outcome, Outcome::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_body_dropped_before_its_end_is_recorded_as_cancelled() {
    let records = InMemoryRecorder::new();
    let mut client = client!(records, streamed("14"));
    let res = call(&mut client, grpc_request(Semantics::Safe))
        .await
        .unwrap();
    let mut body = res.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    assert!(records.attempts().is_empty());
    drop(body);

    let attempt = &records.attempts()[0];
    assert!(attempt.cancelled);
    assert_eq!(attempt.class(), AttemptClass::Success);
    assert_eq!(records.calls()[0].stop, StopReason::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn without_a_watched_body_the_records_classify_at_the_head() {
    let records = InMemoryRecorder::new();
    let mut client = client!(records, streamed("14"), unwatched);
    let res = call(&mut client, grpc_request(Semantics::NonIdempotent))
        .await
        .unwrap();
    // Recorded at once, from the head (200, no `grpc-status`): a success so far.
    assert_eq!(records.attempts()[0].class(), AttemptClass::Success);
    assert_eq!(records.calls()[0].outcome, Outcome::Succeeded);
    res.into_body().collect().await.unwrap();
    assert_eq!(records.attempts().len(), 1);
    assert_eq!(records.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_plain_http_response_is_recorded_at_the_head_even_when_watched() {
    let records = InMemoryRecorder::new();
    let mut client = client!(records, streamed("14"));
    let req = Request::get("http://shop/orders/1")
        .body(Empty::new())
        .unwrap();
    let res = call(&mut client, req).await.unwrap();
    // Not gRPC: its status is in its head, and nothing waits for the body.
    assert_eq!(records.attempts()[0].class(), AttemptClass::Success);
    assert_eq!(records.calls().len(), 1);
    drop(res);
    assert_eq!(records.attempts().len(), 1);
}
