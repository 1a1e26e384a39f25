//! The call's outcome reaches a tonic caller whose call failed: tonic builds the error `Status`
//! from the response headers alone, and the stack writes the outcome there
//! (`surely-outcome`), read back with `surely::grpc::StatusExt`. A server cannot forge it.

use std::time::Duration;

use http::uri::PathAndQuery;
use surely::client::GrpcClient;
use surely::grpc::{GrpcTransport, StatusExt};
use surely::headers::OUTCOME;
use surely::retry::backoff::Backoff;
use surely::server::deadline::ServerDeadlineLayer;
use surely::{CallOutcome, Outcome, StopReason};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::{channel, order, serve, Shop, Step, Utf8Codec, CREATE, FORGED, WATCH};

/// The stack over a tonic channel to `shop`, retrying without backoff.
async fn client(shop: &Shop) -> tonic::client::Grpc<GrpcClient<GrpcTransport<Channel>>> {
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let stack = surely::client::grpc()
        .retry(|r| r.backoff(Backoff::none()))
        .per_try_timeout(Duration::from_millis(300))
        .build_channel(channel(base).await)
        .unwrap();
    tonic::client::Grpc::new(stack)
}

/// One unary `Create` through tonic's client, as its caller gets it.
async fn create<T>(grpc: &mut tonic::client::Grpc<T>) -> Result<tonic::Response<String>, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body, ResponseBody = tonic::body::Body>,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.into().to_string()))?;
    grpc.unary(order(), PathAndQuery::from_static(CREATE), Utf8Codec)
        .await
}

/// What a caller cares about: (outcome, attempts, stop).
fn summary(call: &CallOutcome) -> (Outcome, u32, StopReason) {
    (call.outcome(), call.attempts(), call.stop_reason())
}

/// The budget a call left, in whole milliseconds, as written.
fn left_ms(call: &CallOutcome) -> u128 {
    call.budget_left()
        .expect("the preset's deadline")
        .as_millis()
}

/// The `surely-outcome` value in a metadata map, as text.
fn written(metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    metadata
        .as_ref()
        .get(OUTCOME)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test(start_paused = true)]
async fn a_final_error_carries_a_failed_outcome_after_one_attempt() {
    let shop = Shop::new([Step::Refuse(Code::InvalidArgument), Step::Ok]);
    let mut grpc = client(&shop).await;

    let res = create(&mut grpc).await;
    let status = res.as_ref().unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let call = status
        .call_outcome()
        .expect("the status carries the outcome");
    assert_eq!(summary(&call), (Outcome::Failed, 1, StopReason::Final));
    assert_eq!(status.outcome(), Outcome::Failed);
    assert_eq!(res.outcome(), Outcome::Failed);
    // In the metadata, as documented, with the budget the call left (of its 10 s default).
    assert_eq!(
        written(status.metadata()),
        Some(format!(
            "failed; attempts=1; stop=final; left-ms={}",
            left_ms(&call)
        ))
    );
    assert_eq!(shop.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_retried_error_carries_every_attempt() {
    // Refused (with pushback) every time: retried until the attempts run out.
    let refuse = Step::Refuse(Code::Unavailable);
    let shop = Shop::new([refuse.clone(), refuse.clone(), refuse, Step::Ok]);
    let mut grpc = client(&shop).await;

    let status = create(&mut grpc).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let call = status.call_outcome().unwrap();
    assert_eq!(
        summary(&call),
        (Outcome::Failed, 3, StopReason::AttemptsExhausted)
    );
    assert_eq!(shop.seen().len(), 3);
    assert_eq!(shop.commits(), 0);

    // Refused once, then done: the reply carries the outcome in its extensions and metadata.
    *shop.script.lock().unwrap() = [Step::Refuse(Code::Unavailable), Step::Ok].into();
    let res = create(&mut grpc).await;
    let reply = res.as_ref().unwrap();
    let call = reply.call_outcome().unwrap();
    assert_eq!(summary(&call), (Outcome::Succeeded, 2, StopReason::Success));
    assert_eq!(reply.extensions().get::<CallOutcome>(), Some(&call));
    assert_eq!(res.outcome(), Outcome::Succeeded);
    assert_eq!(
        written(reply.metadata()),
        Some(format!(
            "succeeded; attempts=2; stop=success; left-ms={}",
            left_ms(&call)
        ))
    );
}

#[tokio::test(start_paused = true)]
async fn an_unknown_write_is_unknown_and_sent_once() {
    // `INTERNAL` after the order was written: a non-idempotent `Create` may have committed.
    let shop = Shop::new([Step::CommitThen(Code::Internal), Step::Ok]);
    let mut grpc = client(&shop).await;

    let status = create(&mut grpc).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    let call = status.call_outcome().unwrap();
    assert_eq!(summary(&call), (Outcome::Unknown, 1, StopReason::Unknown));
    assert_eq!(status.outcome(), Outcome::Unknown);
    assert_eq!((shop.seen().len(), shop.commits()), (1, 1));
}

/// An attempt cut short after it was sent ends with the stack's own error, which tonic keeps as
/// the status's source: the outcome is read from there.
#[tokio::test(start_paused = true)]
async fn a_write_timed_out_after_send_is_unknown_from_the_stacks_error() {
    let shop = Shop::new([Step::Slow(Duration::from_secs(10)), Step::Ok]);
    let mut grpc = client(&shop).await;

    let status = create(&mut grpc).await.unwrap_err();
    assert!(written(status.metadata()).is_none());
    let call = status
        .call_outcome()
        .expect("read from the status's source");
    assert_eq!(call.outcome(), Outcome::Unknown);
    assert_eq!(call.attempts(), 1);
    assert_eq!(
        shop.seen().len(),
        1,
        "a maybe-committed write is not sent again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_server_cannot_forge_the_outcome() {
    // An error status with a forged `surely-outcome` in its (trailers-only) headers.
    let shop = Shop::new([Step::Forge(Code::InvalidArgument), Step::Forge(Code::Ok)]);
    let mut grpc = client(&shop).await;
    let status = create(&mut grpc).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let call = status.call_outcome().unwrap();
    assert_eq!(summary(&call), (Outcome::Failed, 1, StopReason::Final));
    assert_eq!(
        status.metadata().get_all("surely-outcome").iter().count(),
        1
    );

    // A reply with a forged one: the stack's own replaces it.
    let reply = create(&mut grpc).await.unwrap();
    let values: Vec<_> = reply.metadata().get_all("surely-outcome").iter().collect();
    let call = reply.call_outcome().unwrap();
    let own = format!(
        "succeeded; attempts=1; stop=success; left-ms={}",
        left_ms(&call)
    );
    assert_eq!(values, [own.as_str()]);
    assert_ne!(values[0], FORGED);

    // A stream: forged in its head, and in the trailers that end it with an error.
    *shop.script.lock().unwrap() = [Step::Forge(Code::Internal)].into();
    let mut req = order();
    req.extensions_mut().insert(surely::Semantics::Safe);
    grpc.ready().await.unwrap();
    let res = grpc
        .server_streaming(req, PathAndQuery::from_static(WATCH), Utf8Codec)
        .await
        .unwrap();
    let call = res.call_outcome().unwrap();
    assert_eq!(summary(&call), (Outcome::Succeeded, 1, StopReason::Success));
    assert_eq!(
        written(res.metadata()),
        Some(format!(
            "succeeded; attempts=1; stop=success; left-ms={}",
            left_ms(&call)
        ))
    );
    let mut updates = res.into_inner();
    assert_eq!(updates.message().await.unwrap().unwrap(), "o-1 packed");
    let status = updates.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    // A status from the trailers came after the call was decided: it carries no outcome, and
    // the server's forged one is gone.
    assert!(written(status.metadata()).is_none());
    assert_eq!(status.call_outcome(), None);
    assert_eq!(status.outcome(), Outcome::Unknown);
}

/// The transport alone (no layer above that hands an outcome back) writes none, and still
/// removes the server's.
#[tokio::test(start_paused = true)]
async fn the_transport_alone_passes_no_forged_outcome_on() {
    let shop = Shop::new([Step::Forge(Code::InvalidArgument)]);
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let mut grpc = tonic::client::Grpc::new(GrpcTransport::new(channel(base).await));
    let status = create(&mut grpc).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(written(status.metadata()).is_none());
    assert_eq!(status.call_outcome(), None);
}
