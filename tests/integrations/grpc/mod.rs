//! The one-call gRPC stack (`surely::client::grpc().build_channel(..)`) around a tonic `Channel`,
//! against a tonic server on 127.0.0.1, driven by tonic's own client (`tonic::client::Grpc`).
//!
//! No protoc and no protobuf: messages are UTF-8 strings through a small hand-written
//! `tonic::codec::Codec`. Time is paused: the server, the channel and the client share the
//! test's runtime, and loopback I/O completes while the clock stands still.

#![cfg(feature = "tonic")]

mod chain;
mod outcome;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut};
use http::uri::PathAndQuery;
use http::HeaderMap;
use surely::classify::{AttemptClass, DeliveryPhase};
use surely::deadline::codec::parse_grpc_timeout_header;
use surely::grpc::MethodSemanticsLayer;
use surely::headers::GRPC_PREVIOUS_RPC_ATTEMPTS;
use surely::headers::GRPC_TIMEOUT;
use surely::headers::IDEMPOTENCY_KEY;
use surely::idempotency::SetIdempotencyKeyLayer;
use surely::record::InMemoryRecorder;
use surely::retry::backoff::Backoff;
use surely::server::deadline::ServerDeadlineLayer;
use surely::Outcome;
use surely::Semantics;
use surely::StopReason;
use tokio::net::TcpListener;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tower::{Layer, Service};

// ---------------------------------------------------------------------------------------------
// A codec of UTF-8 strings.

#[derive(Clone, Copy, Debug, Default)]
struct Utf8Codec;

#[derive(Clone, Copy, Debug, Default)]
struct Utf8;

impl Codec for Utf8Codec {
    type Encode = String;
    type Decode = String;
    type Encoder = Utf8;
    type Decoder = Utf8;

    fn encoder(&mut self) -> Utf8 {
        Utf8
    }

    fn decoder(&mut self) -> Utf8 {
        Utf8
    }
}

impl Encoder for Utf8 {
    type Item = String;
    type Error = Status;

    fn encode(&mut self, item: String, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(item.as_bytes());
        Ok(())
    }
}

impl Decoder for Utf8 {
    type Item = String;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<String>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

// ---------------------------------------------------------------------------------------------
// The server: `shop.Orders`, whose answers follow a script, and which logs what it saw.

/// What the server does with one request.
#[derive(Clone, Debug)]
enum Step {
    /// Does the work and answers OK.
    Ok,
    /// Does the work, then answers with this status (a trailers-only response): the work may
    /// have committed.
    CommitThen(Code),
    /// Refuses with this status without doing the work (a trailers-only response).
    Refuse(Code),
    /// Does the work for this long, then answers OK.
    Slow(Duration),
    /// (Server streaming) Does the work, sends one message, then ends with this status in the
    /// trailers, after the response headers.
    StreamThen(Code),
    /// Answers with this status (`OK`: a reply) without doing the work, and puts a forged
    /// `surely-outcome` in every place it can: the response headers (a unary reply or error is
    /// trailers-only), and for a stream the trailers too.
    Forge(Code),
}

/// The outcome a forging server claims: the best a caller could hope for.
const FORGED: &str = "succeeded; attempts=9; stop=success";

fn forged() -> tonic::metadata::MetadataMap {
    let mut metadata = tonic::metadata::MetadataMap::new();
    metadata.insert("surely-outcome", FORGED.parse().unwrap());
    metadata
}

/// What one request looked like when it reached the handler.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    headers: HeaderMap,
    /// The deadline the handler inherited (through `ServerDeadlineLayer`), as budget left.
    deadline_left: Option<Duration>,
}

#[derive(Clone, Default)]
struct Shop {
    script: Arc<Mutex<VecDeque<Step>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Work done to completion (orders written).
    commits: Arc<AtomicUsize>,
}

impl Shop {
    fn new(script: impl IntoIterator<Item = Step>) -> Self {
        Shop {
            script: Arc::new(Mutex::new(script.into_iter().collect())),
            ..Shop::default()
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn commits(&self) -> usize {
        self.commits.load(Ordering::SeqCst)
    }

    /// The values of `grpc-previous-rpc-attempts` the server saw, in order (`None`: absent).
    fn previous_attempts(&self) -> Vec<Option<u32>> {
        self.seen()
            .iter()
            .map(|s| {
                s.headers
                    .get(GRPC_PREVIOUS_RPC_ATTEMPTS)
                    .map(|v| v.to_str().unwrap().parse().unwrap())
            })
            .collect()
    }
}

/// A handler running one step of the script: unary (`Handler<String>`) or server streaming.
struct Handler<Out = String> {
    step: Step,
    commits: Arc<AtomicUsize>,
    _out: std::marker::PhantomData<fn() -> Out>,
}

impl<Out> Handler<Out> {
    fn new(step: Step, commits: Arc<AtomicUsize>) -> Self {
        Handler {
            step,
            commits,
            _out: std::marker::PhantomData,
        }
    }
}

impl Service<tonic::Request<String>> for Handler<String> {
    type Response = tonic::Response<String>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Status>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::Request<String>) -> Self::Future {
        let step = self.step.clone();
        let commits = self.commits.clone();
        Box::pin(async move {
            let order = req.into_inner();
            match step {
                // Refused before any work, and the server says so: come back at once.
                Step::Refuse(code) => {
                    let mut status = Status::new(code, "refused");
                    status
                        .metadata_mut()
                        .insert("grpc-retry-pushback-ms", "0".parse().unwrap());
                    return Err(status);
                }
                Step::Slow(d) => tokio::time::sleep(d).await,
                Step::Forge(Code::Ok) => {
                    let mut res = tonic::Response::new(format!("created {order}"));
                    *res.metadata_mut() = forged();
                    return Ok(res);
                }
                Step::Forge(code) => return Err(Status::with_metadata(code, "forged", forged())),
                Step::Ok | Step::CommitThen(_) | Step::StreamThen(_) => {}
            }
            commits.fetch_add(1, Ordering::SeqCst);
            match step {
                Step::CommitThen(code) => Err(Status::new(code, "committed, then failed")),
                _ => Ok(tonic::Response::new(format!("created {order}"))),
            }
        })
    }
}

type Updates = tokio_stream::Iter<std::vec::IntoIter<Result<String, Status>>>;

/// The server-streaming handler (`Watch`): a first update, then the step's status.
impl Service<tonic::Request<String>> for Handler<Updates> {
    type Response = tonic::Response<Updates>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Status>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::Request<String>) -> Self::Future {
        let step = self.step.clone();
        self.commits.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let order = req.into_inner();
            let mut updates = vec![Ok(format!("{order} packed"))];
            match step {
                Step::StreamThen(code) => {
                    updates.push(Err(Status::new(code, "lost the courier")));
                }
                Step::Forge(code) => {
                    updates.push(Err(Status::with_metadata(code, "forged", forged())));
                    let mut res = tonic::Response::new(tokio_stream::iter(updates));
                    *res.metadata_mut() = forged();
                    return Ok(res);
                }
                _ => {}
            }
            Ok(tonic::Response::new(tokio_stream::iter(updates)))
        })
    }
}

impl Service<http::Request<tonic::body::Body>> for Shop {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        self.seen.lock().unwrap().push(Seen {
            path: req.uri().path().to_owned(),
            headers: req.headers().clone(),
            deadline_left: surely::deadline::current().map(|d| d.remaining()),
        });
        let step = self.script.lock().unwrap().pop_front().unwrap_or(Step::Ok);
        let commits = self.commits.clone();
        let watch = req.uri().path() == WATCH;
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(Utf8Codec);
            if watch {
                let handler: Handler<Updates> = Handler::new(step, commits);
                Ok(grpc.server_streaming(handler, req).await)
            } else {
                let handler: Handler<String> = Handler::new(step, commits);
                Ok(grpc.unary(handler, req).await)
            }
        })
    }
}

/// Serves `shop` on 127.0.0.1 with tonic's server, behind surely's `ServerDeadlineLayer`.
async fn serve(shop: Shop, deadlines: ServerDeadlineLayer) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(deadlines)
            .serve_with_incoming(shop, TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

async fn channel(base: String) -> Channel {
    Endpoint::from_shared(base)
        .unwrap()
        .connect()
        .await
        .unwrap()
}

const CREATE: &str = "/shop.Orders/Create";
const SET_QUANTITY: &str = "/shop.Orders/SetQuantity";
const WATCH: &str = "/shop.Orders/Watch";

/// One unary call through tonic's client.
async fn unary<T>(
    grpc: &mut tonic::client::Grpc<T>,
    req: tonic::Request<String>,
    path: &'static str,
) -> Result<String, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.into().to_string()))?;
    grpc.unary(req, PathAndQuery::from_static(path), Utf8Codec)
        .await
        .map(tonic::Response::into_inner)
}

fn order() -> tonic::Request<String> {
    tonic::Request::new("o-1".to_owned())
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn unavailable_is_retried_with_grpc_previous_rpc_attempts_and_succeeds() {
    let shop = Shop::new([Step::Refuse(Code::Unavailable), Step::Ok]);
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let recorder = InMemoryRecorder::new();
    let stack = surely::client::grpc()
        .retry(|r| r.backoff(Backoff::none()))
        .recorder(recorder.clone())
        .build_channel(channel(base).await)
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(stack);

    let reply = unary(&mut grpc, order(), CREATE).await.unwrap();
    assert_eq!(reply, "created o-1");

    // The server saw two attempts; the retry said it was one.
    assert_eq!(shop.previous_attempts(), [None, Some(1)]);
    assert_eq!(shop.commits(), 1);
    assert!(shop.seen().iter().all(|s| s.path == CREATE));
    // The records match what the server saw.
    let attempts = recorder.attempts();
    assert_eq!(attempts.len(), 2);
    let numbers: Vec<u32> = attempts.iter().map(|a| a.attempt).collect();
    assert_eq!(numbers, [1, 2], "attempt n carries n - 1 previous attempts");
    assert_eq!(attempts[0].class(), AttemptClass::Rejected);
    assert_eq!(attempts[1].class(), AttemptClass::Success);
    let calls = recorder.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].outcome, Outcome::Succeeded);
    assert_eq!(calls[0].attempts, 2);
    assert_eq!(calls[0].semantics, Semantics::NonIdempotent);
}

#[tokio::test(start_paused = true)]
async fn invalid_argument_is_final_after_one_attempt() {
    let shop = Shop::new([Step::Refuse(Code::InvalidArgument), Step::Ok]);
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let recorder = InMemoryRecorder::new();
    let stack = surely::client::grpc()
        .retry(|r| r.backoff(Backoff::none()))
        .recorder(recorder.clone())
        .build_channel(channel(base).await)
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(stack);

    let status = unary(&mut grpc, order(), CREATE).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(shop.seen().len(), 1);
    assert_eq!(recorder.attempts().len(), 1);
    assert_eq!(recorder.attempts()[0].class(), AttemptClass::Final);
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Failed);
    assert_eq!(call.stop, StopReason::Final);
}

#[tokio::test(start_paused = true)]
async fn a_maybe_committed_attempt_is_retried_only_for_a_method_marked_idempotent() {
    // Not marked: `INTERNAL` after the work may have committed ends the call, unknown.
    let shop = Shop::new([Step::CommitThen(Code::Internal), Step::Ok]);
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let recorder = InMemoryRecorder::new();
    let layer = surely::client::grpc()
        .retry(|r| r.backoff(Backoff::none()))
        .recorder(recorder.clone())
        .into_layer()
        .unwrap();
    let ch = channel(base).await;
    let marks = MethodSemanticsLayer::builder()
        .method(SET_QUANTITY, Semantics::Idempotent)
        .build()
        .unwrap();
    let stack = marks.layer(layer.layer(surely::grpc::GrpcTransport::new(ch)));
    let mut grpc = tonic::client::Grpc::new(stack);

    let status = unary(&mut grpc, order(), CREATE).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(
        shop.seen().len(),
        1,
        "a maybe-committed CREATE is not sent again"
    );
    assert_eq!(shop.commits(), 1);
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Unknown);
    assert_eq!(call.stop, StopReason::Unknown);
    assert_eq!(call.attempts, 1);
    assert_eq!(recorder.attempts().len(), 1);
    assert_eq!(recorder.attempts()[0].class(), AttemptClass::MaybeCommitted);

    // Marked idempotent by the layer: the same failure is retried, and the retry succeeds.
    *shop.script.lock().unwrap() = VecDeque::from([Step::CommitThen(Code::Internal), Step::Ok]);
    let reply = unary(&mut grpc, order(), SET_QUANTITY).await.unwrap();
    assert_eq!(reply, "created o-1");
    let seen = shop.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[1].path, SET_QUANTITY);
    assert_eq!(shop.previous_attempts()[1..], [None, Some(1)]);
    let call = &recorder.calls()[1];
    assert_eq!(call.semantics, Semantics::Idempotent);
    assert_eq!(call.outcome, Outcome::Succeeded);
    assert_eq!(call.attempts, 2);

    // Marked per request with an extension on the tonic request: retried too.
    *shop.script.lock().unwrap() = VecDeque::from([Step::CommitThen(Code::Unknown), Step::Ok]);
    let mut req = order();
    req.extensions_mut().insert(Semantics::Idempotent);
    let reply = unary(&mut grpc, req, CREATE).await.unwrap();
    assert_eq!(reply, "created o-1");
    assert_eq!(shop.seen().len(), 5);
    assert_eq!(recorder.calls()[2].attempts, 2);

    // Records and server agree, attempt for attempt.
    assert_eq!(recorder.attempts().len(), shop.seen().len());
    let per_call: Vec<u32> = recorder.calls().iter().map(|c| c.attempts).collect();
    assert_eq!(per_call, [1, 2, 2]);
}

#[tokio::test(start_paused = true)]
async fn grpc_timeout_is_written_within_the_budget_and_the_server_honours_it() {
    let budget = Duration::from_secs(1);
    let shop = Shop::new([Step::Slow(Duration::from_secs(30))]);
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let recorder = InMemoryRecorder::new();
    let stack = surely::client::grpc()
        .timeout(budget)
        .retry(|r| r.backoff(Backoff::none()))
        .recorder(recorder.clone())
        .build_channel(channel(base).await)
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(stack);

    let start = tokio::time::Instant::now();
    let status = unary(&mut grpc, order(), CREATE).await.unwrap_err();
    let took = start.elapsed();

    // On the wire: a `grpc-timeout` within the budget, and the handler inherited it.
    let seen = shop.seen();
    assert_eq!(seen.len(), 1);
    let sent = parse_grpc_timeout_header(&seen[0].headers[GRPC_TIMEOUT]).unwrap();
    assert!(sent > Duration::ZERO && sent <= budget, "{sent:?}");
    let inherited = seen[0].deadline_left.expect("the handler had a deadline");
    assert!(inherited <= sent, "{inherited:?} > {sent:?}");

    // Honoured: the call ended by its deadline, with a status, and the slow work never finished.
    // tonic enforces the header at both ends (its server's `GrpcTimeout` and the `Channel`'s
    // own), at the same instant here, so the status is tonic's `CANCELLED` "Timeout expired";
    // surely's attempt timer would have ended the attempt 1 ms later (the reserve).
    assert!(took <= budget, "{took:?}");
    assert!(
        matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{status:?}"
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        shop.commits(),
        0,
        "the server dropped the work at the deadline"
    );

    // The non-idempotent call may have done something before the deadline: unknown, one attempt.
    let call = &recorder.calls()[0];
    assert_eq!(call.attempts, 1);
    assert_eq!(call.outcome, Outcome::Unknown);
    assert_eq!(recorder.attempts().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_budget_below_the_servers_minimum_is_refused_unprocessed_and_retried_within_the_deadline()
{
    let shop = Shop::new([]);
    // The server will not start work with less than 5 s left; the client has 1 s.
    let deadlines = ServerDeadlineLayer::builder()
        .min(Duration::from_secs(5))
        .build()
        .unwrap();
    let base = serve(shop.clone(), deadlines).await;
    let recorder = InMemoryRecorder::new();
    let stack = surely::client::grpc()
        .timeout(Duration::from_secs(1))
        .retry(|r| r.backoff(Backoff::none()))
        .recorder(recorder.clone())
        .build_channel(channel(base).await)
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(stack);

    let status = unary(&mut grpc, order(), CREATE).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    // Refused before the handler: nothing reached it, nothing was done, and the refusal was
    // known to be unprocessed, so even the non-idempotent call was retried.
    assert!(shop.seen().is_empty());
    assert_eq!(shop.commits(), 0);
    let attempts = recorder.attempts();
    assert_eq!(attempts.len(), 3);
    assert!(attempts.iter().all(|a| a.class() == AttemptClass::Rejected));
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Failed);
    assert_eq!(call.stop, StopReason::AttemptsExhausted);
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_not_sent_and_retried() {
    // A port that was just free: nothing listens there.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let ch = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let recorder = InMemoryRecorder::new();
    let stack = surely::client::grpc()
        .retry(|r| r.backoff(Backoff::none()))
        .recorder(recorder.clone())
        .build_channel(ch)
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(stack);

    let status = unary(&mut grpc, order(), CREATE).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let attempts = recorder.attempts();
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    for a in &attempts {
        assert_eq!(a.class(), AttemptClass::Rejected, "{a:?}");
        assert_eq!(a.phase(), DeliveryPhase::NotSent, "{a:?}");
    }
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Failed);
    assert_eq!(call.stop, StopReason::AttemptsExhausted);
    // tonic's `UNAVAILABLE` keeps the stack's error as its source, and the caller the outcome.
    use surely::grpc::StatusExt;
    let handed = status
        .call_outcome()
        .expect("the stack's error behind the status");
    assert_eq!(
        (handed.outcome(), handed.attempts(), handed.stop_reason()),
        (Outcome::Failed, 3, StopReason::AttemptsExhausted)
    );
}

/// Opens the `Watch` server stream for `order()`, a safe read, through the `grpc()` preset
/// (retries without backoff) recording to `recorder`. Returns the client, to keep alive, and
/// the stream once its head has arrived.
async fn watch(
    shop: &Shop,
    recorder: &InMemoryRecorder,
) -> (impl Sized + use<>, tonic::codec::Streaming<String>) {
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let stack = surely::client::grpc()
        .retry(|r| r.backoff(Backoff::none()))
        .recorder(recorder.clone())
        .build_channel(channel(base).await)
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(stack);
    let mut req = order();
    req.extensions_mut().insert(Semantics::Safe);
    grpc.ready().await.unwrap();
    let res = grpc
        .server_streaming(req, PathAndQuery::from_static(WATCH), Utf8Codec)
        .await
        .unwrap();
    (grpc, res.into_inner())
}

#[tokio::test(start_paused = true)]
async fn a_status_in_trailers_after_the_headers_is_not_retried() {
    // A server-streaming read: the first update, then `UNAVAILABLE` in the trailers.
    let shop = Shop::new([Step::StreamThen(Code::Unavailable), Step::Ok]);
    let recorder = InMemoryRecorder::new();
    let (_client, mut updates) = watch(&shop, &recorder).await;
    assert_eq!(updates.message().await.unwrap().unwrap(), "o-1 packed");
    let status = updates.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);

    // The retry layer decides at the head (HTTP 200, no `grpc-status`: the response started)
    // and hands the stream to the caller, who has read part of it: no second attempt.
    assert_eq!(shop.seen().len(), 1);
    assert_eq!(recorder.attempts().len(), 1);
    assert_eq!(recorder.calls()[0].attempts, 1);
}

/// The records, unlike the retry layer, wait for the trailers: the attempt is recorded when the
/// stream ends, from its `grpc-status`, and the call after it.
#[tokio::test(start_paused = true)]
async fn a_status_in_trailers_is_recorded() {
    let shop = Shop::new([Step::StreamThen(Code::Unavailable)]);
    let recorder = InMemoryRecorder::new();
    let (_client, mut updates) = watch(&shop, &recorder).await;
    // The head alone says nothing: nothing is recorded yet.
    assert!(recorder.attempts().is_empty());
    assert!(recorder.calls().is_empty());
    while updates
        .message()
        .await
        .transpose()
        .is_some_and(|m| m.is_ok())
    {}

    let attempt = &recorder.attempts()[0];
    assert_eq!(attempt.class(), AttemptClass::MaybeCommitted);
    assert!(!attempt.cancelled);
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Failed);
    assert_eq!(call.attempts, 1);
    assert_eq!(
        call.last.map(|c| c.class()),
        Some(AttemptClass::MaybeCommitted)
    );
}

/// A stream that ends with `OK` in its trailers is a success, recorded when it ends.
#[tokio::test(start_paused = true)]
async fn a_stream_that_ends_ok_is_recorded_when_it_ends() {
    let shop = Shop::new([Step::Ok]);
    let recorder = InMemoryRecorder::new();
    let (_client, mut updates) = watch(&shop, &recorder).await;
    assert_eq!(updates.message().await.unwrap().unwrap(), "o-1 packed");
    assert!(recorder.calls().is_empty());
    assert_eq!(updates.message().await.unwrap(), None);

    assert_eq!(recorder.attempts().len(), 1);
    assert_eq!(recorder.attempts()[0].class(), AttemptClass::Success);
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Succeeded);
    assert_eq!(call.stop, StopReason::Success);
}

/// A caller that stops reading a stream before its end: the attempt keeps what its head said
/// and is marked cancelled; the call stopped because the caller went away.
#[tokio::test(start_paused = true)]
async fn a_stream_dropped_before_its_end_is_recorded_as_cancelled() {
    let shop = Shop::new([Step::StreamThen(Code::Unavailable)]);
    let recorder = InMemoryRecorder::new();
    let (_client, mut updates) = watch(&shop, &recorder).await;
    assert_eq!(updates.message().await.unwrap().unwrap(), "o-1 packed");
    drop(updates);

    let attempt = &recorder.attempts()[0];
    assert!(attempt.cancelled);
    assert_eq!(attempt.class(), AttemptClass::Success);
    let call = &recorder.calls()[0];
    assert_eq!(call.stop, StopReason::Cancelled);
    assert_eq!(call.attempts, 1);
}

/// The deadline layer writes `grpc-timeout` once, outside the retry layer; a retry is a copy of
/// that request, and the retry layer lowers its budget to what is left of the call.
#[tokio::test(start_paused = true)]
async fn a_retry_sends_the_budget_that_is_left() {
    let shop = Shop::new([Step::Slow(Duration::from_secs(30)), Step::Ok]);
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let stack = surely::client::grpc()
        .timeout(Duration::from_secs(2))
        .per_try_timeout(Duration::from_millis(500))
        .retry(|r| r.backoff(Backoff::none()))
        .build_channel(channel(base).await)
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(stack);
    let mut req = order();
    req.extensions_mut().insert(Semantics::Idempotent);
    unary(&mut grpc, req, SET_QUANTITY).await.unwrap();

    let seen = shop.seen();
    assert_eq!(seen.len(), 2);
    let retry = parse_grpc_timeout_header(&seen[1].headers[GRPC_TIMEOUT]).unwrap();
    // The first attempt used 500 ms of the 2 s.
    assert!(retry <= Duration::from_millis(1500), "{retry:?}");
}

#[test]
fn a_failed_connection_is_not_sent_whatever_its_cause() {
    use surely::classify::{BoxError, ClassifyError};
    // A connect timeout: as an I/O error alone it could have been sent; inside tonic's
    // `ConnectError` it was not.
    let timed_out = std::io::Error::from(std::io::ErrorKind::TimedOut);
    let bare: BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut));
    assert_eq!(
        bare.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::MaybeCommitted
    );
    let connect: BoxError = Box::new(tonic::ConnectError(Box::new(timed_out)));
    let c = connect.classify_error(DeliveryPhase::Sent);
    assert_eq!(c.class(), AttemptClass::Rejected);
    assert_eq!(c.phase(), DeliveryPhase::NotSent);
}

#[tokio::test]
async fn method_marks_go_by_path_and_never_override_the_request() {
    use tower::{service_fn, ServiceExt};

    let marks = MethodSemanticsLayer::builder()
        .service("shop.Catalog", Semantics::Safe)
        .method("/shop.Catalog/Reindex", Semantics::NonIdempotent)
        .method(SET_QUANTITY, Semantics::Idempotent)
        .build()
        .unwrap();
    let svc = marks.layer(service_fn(|req: http::Request<()>| async move {
        Ok::<_, Infallible>(req.extensions().get::<Semantics>().copied())
    }));
    let mark_of = |path: &str, own: Option<Semantics>| {
        let mut req = http::Request::post(format!("http://shop{path}"))
            .body(())
            .unwrap();
        if let Some(s) = own {
            req.extensions_mut().insert(s);
        }
        svc.clone().oneshot(req)
    };
    assert_eq!(
        mark_of(SET_QUANTITY, None).await.unwrap(),
        Some(Semantics::Idempotent)
    );
    assert_eq!(
        mark_of("/shop.Catalog/List", None).await.unwrap(),
        Some(Semantics::Safe)
    );
    // The method's own entry wins over its service's.
    assert_eq!(
        mark_of("/shop.Catalog/Reindex", None).await.unwrap(),
        Some(Semantics::NonIdempotent)
    );
    assert_eq!(mark_of(CREATE, None).await.unwrap(), None);
    // A mark already on the request stays.
    assert_eq!(
        mark_of(SET_QUANTITY, Some(Semantics::NonIdempotent))
            .await
            .unwrap(),
        Some(Semantics::NonIdempotent)
    );
}

#[test]
fn malformed_method_and_service_names_are_refused() {
    let bad = [
        MethodSemanticsLayer::builder().method("shop.Orders/Create", Semantics::Safe),
        MethodSemanticsLayer::builder().method("/shop.Orders/", Semantics::Safe),
        MethodSemanticsLayer::builder().method("/shop.Orders/Create/x", Semantics::Safe),
        MethodSemanticsLayer::builder().service("", Semantics::Safe),
        MethodSemanticsLayer::builder().service("shop/Orders", Semantics::Safe),
    ];
    for builder in bad {
        let err = builder.build().unwrap_err();
        assert!(err.setting().starts_with("gRPC"), "{err}");
        assert!(err.to_string().contains("must be"), "{err}");
    }
}

#[tokio::test(start_paused = true)]
async fn with_keys_opted_in_a_maybe_committed_call_is_retried_with_the_same_key() {
    let shop = Shop::new([Step::CommitThen(Code::Internal), Step::Ok]);
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let recorder = InMemoryRecorder::new();
    let stack = surely::client::grpc()
        .idempotency_keys(SetIdempotencyKeyLayer::new().server_honours_keys())
        .retry(|r| r.backoff(Backoff::none()))
        .recorder(recorder.clone())
        .build_channel(channel(base).await)
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(stack);

    let reply = unary(&mut grpc, order(), CREATE).await.unwrap();
    assert_eq!(reply, "created o-1");
    let seen = shop.seen();
    assert_eq!(seen.len(), 2);
    let keys: Vec<_> = seen
        .iter()
        .map(|s| s.headers[IDEMPOTENCY_KEY].clone())
        .collect();
    assert_eq!(keys[0], keys[1], "one key per call, as gRPC metadata");
    // This plain tonic server ignores the key, so it did the work twice: keys are for servers
    // that honour them, which is why the preset adds none of its own.
    assert_eq!(shop.commits(), 2);
    let call = &recorder.calls()[0];
    assert_eq!(call.semantics, Semantics::Keyed);
    assert_eq!(call.attempts, 2);
    assert_eq!(
        call.key.as_ref().unwrap().as_str(),
        keys[0].to_str().unwrap()
    );
}

#[tokio::test(start_paused = true)]
async fn the_stacks_own_errors_reach_a_tonic_caller_as_the_status_source() {
    let shop = Shop::new([]);
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let recorder = InMemoryRecorder::new();
    let stack = surely::client::grpc()
        .recorder(recorder.clone())
        .build_channel(channel(base).await)
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(stack);

    // A call whose inherited budget is already spent is refused before anything is sent.
    let spent = surely::deadline::Deadline::after(Duration::ZERO);
    let status = surely::deadline::scope(spent, unary(&mut grpc, order(), CREATE))
        .await
        .unwrap_err();
    assert!(shop.seen().is_empty());
    // tonic knows nothing of surely's errors: the code is `UNKNOWN`, and the error itself is the
    // status's source.
    assert_eq!(status.code(), Code::Unknown);
    let err = std::error::Error::source(&status)
        .and_then(|e| e.downcast_ref::<surely::Error<tonic::transport::Error>>())
        .expect("surely's error is the source");
    assert!(err.is_deadline_exceeded());
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Failed);
    assert_eq!(call.stop, StopReason::Deadline);
}

/// The stack is what tonic's generated clients need in practice: `Clone` (one per task),
/// `Send + Sync + 'static`, and a call future that is `Send`, so that it runs under
/// `tokio::spawn` or inside a tonic handler.
#[tokio::test(start_paused = true)]
async fn the_stack_is_clone_and_its_calls_are_send() {
    fn assert_clone_send_sync<T: Clone + Send + Sync + 'static>(_: &T) {}
    fn assert_send<F: Future + Send>(f: F) -> F {
        f
    }

    let shop = Shop::new([]);
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let marks = MethodSemanticsLayer::builder()
        .method(SET_QUANTITY, Semantics::Idempotent)
        .build()
        .unwrap();
    let stack = marks.layer(
        surely::client::grpc()
            .recorder(InMemoryRecorder::new())
            .build_channel(channel(base).await)
            .unwrap(),
    );
    assert_clone_send_sync(&stack);
    let grpc = tonic::client::Grpc::new(stack);
    let calls: Vec<_> = (0..2)
        .map(|_| {
            let mut grpc = grpc.clone();
            tokio::spawn(assert_send(async move {
                unary(&mut grpc, order(), SET_QUANTITY).await
            }))
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), "created o-1");
    }
    assert_eq!(shop.seen().len(), 2);
}

/// A tonic server answers every unary error trailers-only, work done or not, so a trailers-only
/// `UNAVAILABLE` is "not processed" only with the server's pushback (gRPC's own status docs warn
/// that retrying `UNAVAILABLE` is not always safe for non-idempotent operations).
#[tokio::test(start_paused = true)]
async fn unavailable_after_the_work_is_not_retried_for_a_non_idempotent_method() {
    let shop = Shop::new([Step::CommitThen(Code::Unavailable), Step::Ok]);
    let base = serve(shop.clone(), ServerDeadlineLayer::new()).await;
    let stack = surely::client::grpc()
        .retry(|r| r.backoff(Backoff::none()))
        .build_channel(channel(base).await)
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(stack);
    let _ = unary(&mut grpc, order(), CREATE).await;
    assert_eq!(shop.commits(), 1, "the order was created twice");
}
