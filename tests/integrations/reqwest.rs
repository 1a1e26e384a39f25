//! The retry decision matrix over reqwest (feature `reqwest`): the same cells as
//! `tests/client/decision_matrix.rs`, with a `reqwest::Client` as the transport of the
//! `surely::client::http()` stack, against a real hyper server on 127.0.0.1 with the fault
//! layer. Paused time: every socket is on loopback in this one thread, so the clock moves only
//! when nothing can run, and a timeout fires only when it is due.
//!
//! | fault | GET | PUT | POST + key | POST |
//! | --- | --- | --- | --- | --- |
//! | refused before send (fault layer) | retried | retried | retried | retried |
//! | nothing listening (a real refused connection) | failed, 3 attempts | ← | ← | ← |
//! | reset after send (not committed) | retried | retried | retried | **unknown**, 1 attempt |
//! | reply lost after commit | retried | retried | retried | **unknown**, 1 attempt, 1 commit |
//! | slow past the per-try timeout | retried | retried | retried | **unknown**, 1 attempt, 1 commit |
//! | slow past reqwest's own `timeout` | retried | retried | retried | **unknown**, 1 attempt, 1 commit |
//! | 503 + `Retry-After` | retried after the wait | ← | ← | ← |
//! | 400 | failed, 1 attempt | ← | ← | ← |
//!
//! Then: a PUT's retried body is the same bytes (a streamed one too), a body over the replay
//! limit is sent once, bad input gives a typed error and no panic, and reqwest's errors are
//! classified the same when they come boxed.
#![cfg(feature = "reqwest")]

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use surely::classify::{AttemptClass, BoxError, Cause, ClassifyError, DeliveryPhase};
use surely::fault::{Fault, InjectFaultLayer, NoResponse, Reply, Schedule};
use surely::headers::IDEMPOTENCY_KEY;
use surely::record::InMemoryRecorder;
use surely::retry::backoff::Backoff;
use surely::StopReason;
use surely::{Outcome, OutcomeExt};
use tokio::time::Instant;
use tower::{service_fn, Layer, ServiceBuilder, ServiceExt};

use crate::support::serve::serve;

const PER_TRY: Duration = Duration::from_secs(1);
const WAIT: Duration = Duration::from_secs(2);
const BODY: &str = "o-1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Get,
    Put,
    PostKeyed,
    Post,
}

const KINDS: [Kind; 4] = [Kind::Get, Kind::Put, Kind::PostKeyed, Kind::Post];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    RefusedBeforeSend,
    NothingListening,
    ResetAfterSend,
    LostAfterCommit,
    SlowPastPerTry,
    SlowPastReqwestTimeout,
    Unavailable,
    BadRequest,
}

/// The client's and the server's fault schedules for a failure.
fn faults(failure: Failure) -> (Schedule, Schedule) {
    let client = Schedule::new();
    let server = Schedule::new();
    match failure {
        Failure::RefusedBeforeSend => (client.at(0, Fault::RefuseBeforeSend), server),
        Failure::NothingListening => (client, server),
        // The server reads the request and drops the connection without running the handler.
        Failure::ResetAfterSend => (client, server.at(0, Fault::RefuseBeforeSend)),
        // The handler commits, then the connection drops before the reply.
        Failure::LostAfterCommit => (client, server.at(0, Fault::ResetAfterSend)),
        // The handler commits at once; the reply comes after the timeout.
        Failure::SlowPastPerTry | Failure::SlowPastReqwestTimeout => {
            (client, server.at(0, Fault::DelayReply(PER_TRY * 3)))
        }
        Failure::Unavailable => (
            client,
            server.at(
                0,
                Fault::Respond(Reply::new(StatusCode::SERVICE_UNAVAILABLE).retry_after(WAIT)),
            ),
        ),
        Failure::BadRequest => (
            client,
            server.at(0, Fault::Respond(StatusCode::BAD_REQUEST.into())),
        ),
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Expect {
    outcome: Outcome,
    attempts: u32,
    commits: usize,
}

fn expect(failure: Failure, kind: Kind) -> Expect {
    let writes = |n: usize| if kind == Kind::Get { 0 } else { n };
    let retried = |commits: usize| Expect {
        outcome: Outcome::Succeeded,
        attempts: 2,
        commits: writes(commits),
    };
    let unknown = |commits: usize| Expect {
        outcome: Outcome::Unknown,
        attempts: 1,
        commits,
    };
    match (failure, kind) {
        (Failure::RefusedBeforeSend, _) => retried(1),
        (Failure::NothingListening, _) => Expect {
            outcome: Outcome::Failed,
            attempts: 3,
            commits: 0,
        },
        (Failure::ResetAfterSend, Kind::Post) => unknown(0),
        (Failure::ResetAfterSend, _) => retried(1),
        (
            Failure::LostAfterCommit | Failure::SlowPastPerTry | Failure::SlowPastReqwestTimeout,
            Kind::Post,
        ) => unknown(1),
        (
            Failure::LostAfterCommit | Failure::SlowPastPerTry | Failure::SlowPastReqwestTimeout,
            _,
        ) => retried(2),
        (Failure::Unavailable, _) => retried(1),
        (Failure::BadRequest, _) => Expect {
            outcome: Outcome::Failed,
            attempts: 1,
            commits: 0,
        },
    }
}

fn request<B>(kind: Kind, base: &str, body: B) -> Request<B> {
    let (method, path) = match kind {
        Kind::Get => (Method::GET, "/orders/o-1"),
        Kind::Put => (Method::PUT, "/orders/o-1"),
        Kind::PostKeyed | Kind::Post => (Method::POST, "/orders"),
    };
    let mut builder = Request::builder()
        .method(method)
        .uri(format!("{base}{path}"));
    if kind == Kind::PostKeyed {
        builder = builder.header(IDEMPOTENCY_KEY, "k-1");
    }
    builder.body(body).unwrap()
}

/// A reqwest client that ignores any proxy of the environment.
fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// The stack of every cell: `client::http()` (call record, deadline 30 s, keys, replayable
/// bodies, retry 50 ms apart without a budget, breaker, attempt record, per-try timeout) →
/// the client's fault script → reqwest.
macro_rules! stack {
    ($faults:expr, $recorder:expr, $reqwest:expr, $per_try:expr) => {{
        let builder = surely::client::http()
            .timeout(Duration::from_secs(30))
            .no_budget()
            .retry(|r| r.backoff(Backoff::constant(Duration::from_millis(50))))
            .recorder($recorder.clone());
        let builder = match $per_try {
            Some(per_try) => builder.per_try_timeout(per_try),
            None => builder,
        };
        let transport = InjectFaultLayer::new($faults)
            .responses(NoResponse)
            .layer(surely::reqwest::transport($reqwest));
        builder.build(transport).unwrap()
    }};
}

/// The server's side: how many writes the handler committed, and every body it read.
#[derive(Clone, Default)]
struct Server {
    commits: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

impl Server {
    /// Serves the handler behind the server's fault script; returns its base URL.
    async fn start(&self, faults: Schedule) -> String {
        let (commits, bodies) = (self.commits.clone(), self.bodies.clone());
        let handler = service_fn(move |req: Request<Incoming>| {
            let (commits, bodies) = (commits.clone(), bodies.clone());
            async move {
                let write = req.method() != Method::GET;
                let body = req.into_body().collect().await?.to_bytes();
                bodies.lock().unwrap().push(body);
                if write {
                    commits.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            }
        });
        let server = ServiceBuilder::new()
            .layer(InjectFaultLayer::new(faults))
            .service(handler);
        format!("http://{}", serve(server).await)
    }

    fn commits(&self) -> usize {
        self.commits.load(Ordering::SeqCst)
    }

    fn bodies(&self) -> Vec<Bytes> {
        self.bodies.lock().unwrap().clone()
    }
}

/// A base URL where nothing listens: a port that was just free.
fn nothing_listening() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

#[derive(Debug)]
struct Run {
    outcome: Outcome,
    /// What the caller was handed back, on the response or the error.
    handed_back: Outcome,
    attempts: u32,
    commits: usize,
    stop: StopReason,
    took: Duration,
    bodies: Vec<Bytes>,
    attempt_records: usize,
    error: Option<surely::Error<reqwest::Error>>,
}

async fn run(failure: Failure, kind: Kind) -> Run {
    let (client_faults, server_faults) = faults(failure);
    let server = Server::default();
    let base = match failure {
        Failure::NothingListening => nothing_listening(),
        _ => server.start(server_faults).await,
    };
    let recorder = InMemoryRecorder::new();
    let client = match failure {
        // reqwest's own timeout instead of the stack's per-try one.
        Failure::SlowPastReqwestTimeout => {
            let reqwest = reqwest::Client::builder()
                .no_proxy()
                .timeout(PER_TRY)
                .build()
                .unwrap();
            stack!(client_faults, recorder, reqwest, None::<Duration>)
        }
        _ => stack!(client_faults, recorder, reqwest_client(), Some(PER_TRY)),
    };

    let start = Instant::now();
    let req = request(kind, &base, Full::new(Bytes::from_static(BODY.as_bytes())));
    let result = client.oneshot(req).await;
    let took = start.elapsed();
    let handed_back = result.outcome();
    // The stack records an attempt, and so its call, when the response body ends.
    let error = match result {
        Ok(res) => {
            res.into_body().collect().await.unwrap();
            None
        }
        Err(e) => Some(e),
    };

    let calls = recorder.calls();
    assert_eq!(calls.len(), 1, "{failure:?} {kind:?}: one call record");
    let call = &calls[0];
    Run {
        outcome: call.outcome,
        handed_back,
        attempts: call.attempts,
        commits: server.commits(),
        stop: call.stop,
        took,
        bodies: server.bodies(),
        attempt_records: recorder.attempts().len(),
        error,
    }
}

async fn row(failure: Failure) {
    for kind in KINDS {
        let got = run(failure, kind).await;
        let want = expect(failure, kind);
        assert_eq!(
            Expect {
                outcome: got.outcome,
                attempts: got.attempts,
                commits: got.commits,
            },
            want,
            "{failure:?} × {kind:?}: {got:?}"
        );
        // The caller is handed the outcome the record says.
        assert_eq!(got.handed_back, got.outcome, "{failure:?} × {kind:?}");
        if kind == Kind::Post {
            assert!(got.commits <= 1, "{failure:?}: {got:?}");
        }
        assert_eq!(got.attempt_records as u32, got.attempts, "{got:?}");
        // Every attempt that reached the handler sent the same bytes.
        assert!(got.bodies.iter().all(|b| b == BODY), "{got:?}");
        let stop = match (got.outcome, failure) {
            (Outcome::Succeeded, _) => StopReason::Success,
            (Outcome::Unknown, _) => StopReason::Unknown,
            (Outcome::Failed, Failure::NothingListening) => StopReason::AttemptsExhausted,
            (Outcome::Failed, _) => StopReason::Final,
        };
        assert_eq!(got.stop, stop, "{failure:?} × {kind:?}");
        if failure == Failure::Unavailable {
            assert!(got.took >= WAIT, "{failure:?} × {kind:?}: {got:?}");
        }
        if got.outcome == Outcome::Unknown {
            assert!(got.took <= PER_TRY, "{got:?}");
            // The error is reqwest's, kept as it is, or the stack's own timeout.
            let err = got
                .error
                .as_ref()
                .expect("an unknown call ends in an error");
            assert_eq!(err.attempts(), 1);
            match failure {
                Failure::SlowPastPerTry => assert!(err.is_elapsed(), "{err:?}"),
                Failure::SlowPastReqwestTimeout => {
                    assert!(err.transport_ref().unwrap().is_timeout(), "{err:?}");
                    // The message names the cause and the phase, without a walk of the
                    // error's sources.
                    assert_eq!(err.cause(), Some(Cause::TimedOut));
                    assert!(
                        err.to_string()
                            .starts_with("unknown after 1 attempt (timed out, sent): "),
                        "{err}"
                    );
                }
                _ => {
                    assert!(err.transport_ref().unwrap().is_request(), "{err:?}");
                    let cause = err.cause().expect("a reset or a closed connection");
                    assert!(matches!(cause, Cause::Reset | Cause::Closed), "{err:?}");
                    assert!(
                        err.to_string()
                            .starts_with(&format!("unknown after 1 attempt ({cause}, sent): ")),
                        "{err}"
                    );
                }
            }
        }
        if failure == Failure::NothingListening {
            let err = got.error.as_ref().unwrap();
            assert!(err.transport_ref().unwrap().is_connect(), "{err:?}");
            assert_eq!(err.attempts(), 3);
            assert_eq!(err.cause(), Some(Cause::Refused));
            assert!(
                err.to_string().starts_with(
                    "failed after 3 attempts (connection refused, not sent): error sending request"
                ),
                "{err}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn refused_before_send() {
    row(Failure::RefusedBeforeSend).await;
}

#[tokio::test(start_paused = true)]
async fn nothing_listening_is_not_sent_and_retried_even_for_a_post() {
    row(Failure::NothingListening).await;
}

#[tokio::test(start_paused = true)]
async fn reset_after_send() {
    row(Failure::ResetAfterSend).await;
}

#[tokio::test(start_paused = true)]
async fn reply_lost_after_commit() {
    row(Failure::LostAfterCommit).await;
}

#[tokio::test(start_paused = true)]
async fn slow_past_the_per_try_timeout() {
    row(Failure::SlowPastPerTry).await;
}

#[tokio::test(start_paused = true)]
async fn slow_past_reqwests_own_timeout() {
    row(Failure::SlowPastReqwestTimeout).await;
}

#[tokio::test(start_paused = true)]
async fn unavailable_with_retry_after() {
    row(Failure::Unavailable).await;
}

#[tokio::test(start_paused = true)]
async fn bad_request() {
    row(Failure::BadRequest).await;
}

// ---- the one-call preset --------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_preset_answers_with_the_outcome_and_a_body_reqwest_can_read() {
    let server = Server::default();
    let base = server.start(Schedule::new()).await;
    let client = surely::reqwest::client(reqwest_client());

    let req = request(Kind::Post, &base, String::from(BODY));
    let res = client.clone().oneshot(req).await.unwrap();
    assert_eq!(res.outcome(), Outcome::Succeeded);
    let call = res.call_outcome().unwrap();
    assert_eq!(call.attempts(), 1);
    // The preset adds a key to a POST (sent, but the call stays unkeyed: the server's word is
    // missing).
    assert!(call.idempotency_key().is_some());
    let res = reqwest::Response::from(res.map(reqwest::Body::wrap));
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.text().await.unwrap(), "ok");
    assert_eq!(server.commits(), 1);
    assert_eq!(server.bodies(), vec![Bytes::from_static(BODY.as_bytes())]);
}

// ---- bodies ---------------------------------------------------------------------------------

/// A streamed request body: frames from an iterator, no exact size.
type Streamed =
    StreamBody<tokio_stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// A body of `n` frames of `size` bytes each, distinct, and all its bytes.
fn streamed(n: usize, size: usize) -> (Streamed, Bytes) {
    let chunks: Vec<Bytes> = (0..n)
        .map(|i| Bytes::from(vec![b'a' + (i % 26) as u8; size]))
        .collect();
    let all = Bytes::from(chunks.concat());
    let frames: Vec<_> = chunks.into_iter().map(|c| Ok(Frame::data(c))).collect();
    (StreamBody::new(tokio_stream::iter(frames)), all)
}

#[tokio::test(start_paused = true)]
async fn a_retried_put_sends_the_same_streamed_bytes() {
    let server = Server::default();
    let base = server
        .start(Schedule::new().at(0, Fault::ResetAfterSend))
        .await;
    let recorder = InMemoryRecorder::new();
    let client = stack!(Schedule::new(), recorder, reqwest_client(), Some(PER_TRY));

    let (body, sent) = streamed(40, 1000);
    let res = client
        .oneshot(request(Kind::Put, &base, body))
        .await
        .unwrap();
    assert_eq!(res.outcome(), Outcome::Succeeded);
    assert_eq!(res.call_outcome().unwrap().attempts(), 2);
    assert_eq!(server.commits(), 2);
    assert_eq!(server.bodies(), vec![sent.clone(), sent]);
}

#[tokio::test(start_paused = true)]
async fn a_body_over_the_replay_limit_is_sent_once() {
    let server = Server::default();
    let base = server
        .start(Schedule::new().at(0, Fault::ResetAfterSend))
        .await;
    let recorder = InMemoryRecorder::new();
    let client = stack!(Schedule::new(), recorder, reqwest_client(), Some(PER_TRY));

    // 100 KB, over the 64 KiB the stack buffers: a PUT whose reply was lost is not resent.
    let (body, sent) = streamed(100, 1000);
    let err = client
        .oneshot(request(Kind::Put, &base, body))
        .await
        .unwrap_err();
    assert_eq!(err.outcome(), Outcome::Unknown);
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.stop_reason(), Some(StopReason::NotReplayable));
    assert_eq!(server.commits(), 1);
    assert_eq!(server.bodies(), vec![sent]);
}

// ---- bad input ------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_relative_or_non_http_uri_fails_typed_and_final() {
    for uri in ["/orders", "ftp://127.0.0.1/orders"] {
        let recorder = InMemoryRecorder::new();
        let client = stack!(Schedule::new(), recorder, reqwest_client(), Some(PER_TRY));
        let req = Request::post(uri).body(String::from(BODY)).unwrap();
        let err = client.oneshot(req).await.unwrap_err();
        let reqwest = err.transport_ref().expect("reqwest's own error");
        assert!(reqwest.is_builder(), "{uri}: {err:?}");
        // Nothing was sent, and sending it again would not help.
        assert_eq!(err.outcome(), Outcome::Failed, "{uri}");
        assert_eq!(err.attempts(), 1, "{uri}");
        assert_eq!(err.stop_reason(), Some(StopReason::Final), "{uri}");
        assert_eq!(recorder.calls()[0].outcome, Outcome::Failed);
    }
}

/// A request body that fails as soon as it is read.
struct Broken;

impl http_body::Body for Broken {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(Some(Err(std::io::Error::other(
            "the order file is unreadable",
        ))))
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_that_fails_gives_a_typed_error_and_is_not_resent() {
    for kind in [Kind::Put, Kind::Post] {
        let server = Server::default();
        let base = server.start(Schedule::new()).await;
        let recorder = InMemoryRecorder::new();
        let client = stack!(Schedule::new(), recorder, reqwest_client(), Some(PER_TRY));
        let err = client
            .oneshot(request(kind, &base, Broken))
            .await
            .unwrap_err();
        let reqwest = err.transport_ref().expect("reqwest's own error");
        assert!(reqwest.is_request() || reqwest.is_body(), "{err:?}");
        // The body is gone: one attempt, whatever the request.
        assert_eq!(err.attempts(), 1, "{kind:?}");
        assert_eq!(server.commits(), 0, "{kind:?}");
        // The head may have left before the body failed: nobody can say the server saw
        // nothing, so the write's outcome is unknown, and the record says why it stopped.
        assert_eq!(err.outcome(), Outcome::Unknown, "{kind:?}");
        let stop = match kind {
            Kind::Put => StopReason::NotReplayable,
            _ => StopReason::Unknown,
        };
        assert_eq!(err.stop_reason(), Some(stop), "{kind:?}");
        assert_eq!(recorder.calls()[0].outcome, Outcome::Unknown);
    }
}

// ---- classification of reqwest's errors -------------------------------------------------------

async fn error_of(req: Request<String>, reqwest: reqwest::Client) -> reqwest::Error {
    surely::reqwest::transport(reqwest)
        .oneshot(req)
        .await
        .unwrap_err()
}

#[tokio::test(start_paused = true)]
async fn reqwests_errors_are_classified_alone_and_boxed() {
    let server = Server::default();
    let base = server
        .start(Schedule::new().otherwise(Fault::DelayReply(PER_TRY * 3)))
        .await;
    let slow = reqwest::Client::builder()
        .no_proxy()
        .timeout(PER_TRY)
        .build()
        .unwrap();
    let get = |base: &str| {
        Request::get(format!("{base}/orders/o-1"))
            .body(String::new())
            .unwrap()
    };

    let cases = [
        (
            "builder",
            error_of(
                Request::get("/x").body(String::new()).unwrap(),
                reqwest_client(),
            )
            .await,
            AttemptClass::Final,
            DeliveryPhase::NotSent,
        ),
        (
            "connect",
            error_of(get(&nothing_listening()), reqwest_client()).await,
            AttemptClass::Rejected,
            DeliveryPhase::NotSent,
        ),
        (
            "timeout",
            error_of(get(&base), slow).await,
            AttemptClass::MaybeCommitted,
            DeliveryPhase::Sent,
        ),
    ];
    for (name, err, class, phase) in cases {
        let c = err.classify_error(DeliveryPhase::Sent);
        assert_eq!((c.class(), c.phase()), (class, phase), "{name}: {err:?}");
        // Boxed, as tower's layers hand it on, and inside the crate's error, boxed.
        let boxed: BoxError = Box::new(err);
        let c = boxed.classify_error(DeliveryPhase::Sent);
        assert_eq!((c.class(), c.phase()), (class, phase), "{name}, boxed");
        let reqwest = *boxed.downcast::<reqwest::Error>().unwrap();
        let wrapped: BoxError = Box::new(surely::Error::transport(reqwest));
        let c = wrapped.classify_error(DeliveryPhase::Sent);
        assert_eq!(
            (c.class(), c.phase()),
            (class, phase),
            "{name}, in surely::Error"
        );
    }
}

// ---- progress: a timeout while connecting is "not sent" -----------------------------------------

/// A listener whose accept queue is full: the kernel drops further SYNs, so a connection to it
/// never completes.
fn full_listener() -> (tokio::net::TcpListener, Vec<std::net::TcpStream>, String) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut queued = Vec::new();
    while let Ok(stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
        queued.push(stream);
        assert!(queued.len() < 64, "the accept queue never filled");
    }
    (listener, queued, format!("http://{addr}"))
}

#[tokio::test(start_paused = true)]
async fn a_post_whose_attempts_timed_out_while_connecting_failed_for_sure_with_progress() {
    let (_listener, _queued, base) = full_listener();
    for with_progress in [true, false] {
        let recorder = InMemoryRecorder::new();
        let client = stack!(Schedule::new(), recorder, reqwest_client(), Some(PER_TRY));
        let mut req = request(Kind::Post, &base, String::from(BODY));
        if with_progress {
            req.extensions_mut()
                .insert(surely::delivery::Progress::new());
        }
        let err = client.oneshot(req).await.unwrap_err();
        assert!(err.is_elapsed(), "{err:?}");
        if with_progress {
            // The transport never touched the body: not sent, so retried, and failed for sure.
            assert_eq!(err.elapsed().unwrap().phase(), DeliveryPhase::NotSent);
            assert_eq!((err.outcome(), err.attempts()), (Outcome::Failed, 3));
        } else {
            // Without the handle, a timeout proves nothing: a POST is not sent again.
            assert_eq!((err.outcome(), err.attempts()), (Outcome::Unknown, 1));
        }
    }
}

// ---- the stack as an SDK holds it -----------------------------------------------------------

/// An SDK's client struct: the stack is nameable, `Clone + Send + Sync`, and its futures are
/// `Send`, so it boxes into tower's `BoxCloneService`.
#[derive(Clone)]
struct OrdersSdk {
    http: surely::reqwest::ClientStack,
}

#[test]
fn the_stack_is_nameable_send_sync_and_boxes() {
    fn send_sync<T: Clone + Send + Sync + 'static>(_: &T) {}
    let sdk = OrdersSdk {
        http: surely::reqwest::client(reqwest_client()),
    };
    send_sync(&sdk.http);
    let boxed: tower::util::BoxCloneService<
        Request<Full<Bytes>>,
        Response<surely::record::WatchedBody<reqwest::Body>>,
        surely::Error<reqwest::Error>,
    > = tower::util::BoxCloneService::new(sdk.http.clone());
    drop(boxed);
}
