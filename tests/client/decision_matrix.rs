//! The retry decision matrix over real hyper on 127.0.0.1, driven by the fault layer: for each
//! way an attempt can fail and each kind of request, the call's outcome, the exact number of
//! attempts, and the side effects the server committed. Paused time throughout.
//!
//! | fault | GET | PUT | POST + key | POST |
//! | --- | --- | --- | --- | --- |
//! | refused before send | retried | retried | retried | retried |
//! | reset after send (not committed) | retried | retried | retried | **unknown**, 1 attempt |
//! | reply lost after commit | retried | retried | retried | **unknown**, 1 attempt, 1 commit |
//! | slow past the per-try timeout | retried | retried | retried | **unknown**, 1 attempt, 1 commit |
//! | 503 + `Retry-After` | retried after the wait | ← | ← | ← |
//! | 429 + `Retry-After` | retried after the wait | ← | ← | ← |
//! | 400 | failed, 1 attempt | ← | ← | ← |
//! | 409 | failed (conflict), 1 attempt | ← | ← | ← |
//!
//! A keyed POST whose first attempt committed commits twice against a server that ignores keys
//! (the matrix's plain server); against one with surely's `IdempotencyLayer` it commits once and
//! the retry gets the stored result (the last two tests).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::deadline::SetDeadlineLayer;
use surely::fault::{Fault, InjectFaultLayer, NoResponse, Reply, Schedule};
use surely::headers::IDEMPOTENCY_KEY;
use surely::record::{InMemoryRecorder, RecordAttemptLayer, RecordCallLayer};
use surely::retry::backoff::Backoff;
use surely::retry::{ReplayLayer, RetryLayer};
use surely::timeout::AttemptTimeoutLayer;
use surely::Outcome;
use surely::StopReason;
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

use crate::support::serve::serve;

const PER_TRY: Duration = Duration::from_secs(1);
const WAIT: Duration = Duration::from_secs(2);

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
    ResetAfterSend,
    LostAfterCommit,
    SlowPastPerTry,
    Unavailable,
    TooManyRequests,
    BadRequest,
    Conflict,
}

/// Where the fault layer sits for a failure, and what it injects into the first request there.
fn faults(failure: Failure) -> (Schedule, Schedule) {
    let client = Schedule::new();
    let server = Schedule::new();
    let pushback = |status| Fault::Respond(Reply::new(status).retry_after(WAIT));
    match failure {
        // The client's transport refuses: nothing leaves the process.
        Failure::RefusedBeforeSend => (client.at(0, Fault::RefuseBeforeSend), server),
        // The server reads the request and drops the connection without running the handler.
        Failure::ResetAfterSend => (client, server.at(0, Fault::RefuseBeforeSend)),
        // The handler commits, then the connection drops before the reply.
        Failure::LostAfterCommit => (client, server.at(0, Fault::ResetAfterSend)),
        // The handler commits at once; the reply comes after the per-try timeout.
        Failure::SlowPastPerTry => (client, server.at(0, Fault::DelayReply(PER_TRY * 3))),
        Failure::Unavailable => (
            client,
            server.at(0, pushback(StatusCode::SERVICE_UNAVAILABLE)),
        ),
        Failure::TooManyRequests => (
            client,
            server.at(0, pushback(StatusCode::TOO_MANY_REQUESTS)),
        ),
        Failure::BadRequest => (
            client,
            server.at(0, Fault::Respond(StatusCode::BAD_REQUEST.into())),
        ),
        Failure::Conflict => (
            client,
            server.at(0, Fault::Respond(StatusCode::CONFLICT.into())),
        ),
    }
}

/// What a cell must show.
#[derive(Debug, PartialEq, Eq)]
struct Expect {
    outcome: Outcome,
    attempts: u32,
    /// Handler runs for PUT and POST: the side effects committed.
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
    let failed = Expect {
        outcome: Outcome::Failed,
        attempts: 1,
        commits: 0,
    };
    match (failure, kind) {
        (Failure::RefusedBeforeSend, _) => retried(1),
        (Failure::ResetAfterSend, Kind::Post) => unknown(0),
        (Failure::ResetAfterSend, _) => retried(1),
        // The first attempt committed too. A keyed POST commits twice against this server,
        // which does not honour keys; the server idempotency layer is what makes that once.
        (Failure::LostAfterCommit | Failure::SlowPastPerTry, Kind::Post) => unknown(1),
        (Failure::LostAfterCommit | Failure::SlowPastPerTry, _) => retried(2),
        (Failure::Unavailable | Failure::TooManyRequests, _) => retried(1),
        (Failure::BadRequest | Failure::Conflict, _) => failed,
    }
}

fn request(kind: Kind, base: &str) -> Request<Full<Bytes>> {
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
    builder.body(Full::new(Bytes::from_static(b"o-1"))).unwrap()
}

/// The client of every cell: call record → deadline (30 s) → replayable bodies → retry (50 ms
/// apart, no budget) → attempt record → attempt timeout (1 s) → the client's fault script →
/// hyper-util's client.
fn client(
    client_faults: Schedule,
    recorder: &InMemoryRecorder,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<Incoming>,
    Error = surely::Error<hyper_util::client::legacy::Error>,
> + use<> {
    ServiceBuilder::new()
        .layer(RecordCallLayer::new(recorder.clone()))
        .layer(SetDeadlineLayer::new(Duration::from_secs(30)))
        .layer(ReplayLayer::new())
        .layer(
            RetryLayer::builder()
                .backoff(Backoff::constant(Duration::from_millis(50)))
                .no_budget()
                .build()
                .unwrap(),
        )
        .layer(RecordAttemptLayer::new(recorder.clone()))
        .layer(AttemptTimeoutLayer::new(PER_TRY))
        .layer(InjectFaultLayer::new(client_faults).responses(NoResponse))
        .service(Client::builder(TokioExecutor::new()).build_http())
}

/// What one call did.
#[derive(Debug)]
struct Run {
    outcome: Outcome,
    attempts: u32,
    commits: usize,
    stop: StopReason,
    took: Duration,
    /// Every body the handler read, to check that retries send the same bytes.
    bodies: Vec<Bytes>,
    /// Records made, against requests that left the client's transport.
    attempt_records: usize,
}

async fn run(failure: Failure, kind: Kind) -> Run {
    let (client_faults, server_faults) = faults(failure);

    let commits = Arc::new(AtomicUsize::new(0));
    let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (counted, read) = (commits.clone(), bodies.clone());
    let handler = service_fn(move |req: Request<Incoming>| {
        let (counted, read) = (counted.clone(), read.clone());
        async move {
            let write = req.method() != Method::GET;
            let body = req.into_body().collect().await?.to_bytes();
            read.lock().unwrap().push(body);
            if write {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let server = ServiceBuilder::new()
        .layer(InjectFaultLayer::new(server_faults))
        .service(handler);
    let addr = serve(server).await;

    let recorder = InMemoryRecorder::new();
    let mut client = client(client_faults, &recorder);

    let start = Instant::now();
    let req = request(kind, &format!("http://{addr}"));
    let _ = client.ready().await.unwrap().call(req).await;
    let took = start.elapsed();

    let calls = recorder.calls();
    assert_eq!(calls.len(), 1, "{failure:?} {kind:?}: one call record");
    let call = &calls[0];
    let bodies = bodies.lock().unwrap().clone();
    Run {
        outcome: call.outcome,
        attempts: call.attempts,
        commits: commits.load(Ordering::SeqCst),
        stop: call.stop,
        took,
        bodies,
        attempt_records: recorder.attempts().len(),
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
        // Never more than one side effect for a POST without a key.
        if kind == Kind::Post {
            assert!(got.commits <= 1, "{failure:?}: {got:?}");
        }
        assert_eq!(got.attempt_records as u32, got.attempts, "{got:?}");
        // Every attempt that reached the handler sent the same bytes.
        assert!(got.bodies.iter().all(|b| b == "o-1"), "{got:?}");
        // Why it stopped follows from the outcome.
        let stop = match got.outcome {
            Outcome::Succeeded => StopReason::Success,
            Outcome::Unknown => StopReason::Unknown,
            Outcome::Failed if failure == Failure::Conflict => StopReason::Conflict,
            Outcome::Failed => StopReason::Final,
        };
        assert_eq!(got.stop, stop, "{failure:?} × {kind:?}");
        // A pushback wait is honoured before the retry.
        if matches!(failure, Failure::Unavailable | Failure::TooManyRequests) {
            assert!(got.took >= WAIT, "{failure:?} × {kind:?}: {got:?}");
        }
        // An unknown POST gives up at once: no wait, no second attempt.
        if got.outcome == Outcome::Unknown {
            assert!(got.took <= PER_TRY, "{got:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn refused_before_send() {
    row(Failure::RefusedBeforeSend).await;
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
async fn unavailable_with_retry_after() {
    row(Failure::Unavailable).await;
}

#[tokio::test(start_paused = true)]
async fn too_many_requests_with_retry_after() {
    row(Failure::TooManyRequests).await;
}

#[tokio::test(start_paused = true)]
async fn bad_request() {
    row(Failure::BadRequest).await;
}

#[tokio::test(start_paused = true)]
async fn conflict() {
    row(Failure::Conflict).await;
}

// ---- the keyed POST against a server that honours keys ------------------------------------------

/// The keyed POST cells where the first attempt committed (reply lost; slow past the per-try
/// timeout), against a server with surely's `IdempotencyLayer`: the retry is answered from the
/// stored result, and the order is committed once.
async fn keyed_against_an_idempotent_server(failure: Failure) -> (Outcome, u32, usize, bool) {
    use surely::server::idempotency::IdempotencyLayer;
    use surely::server::store::MemoryStore;

    let (client_faults, server_faults) = faults(failure);
    let commits = Arc::new(AtomicUsize::new(0));
    let counted = commits.clone();
    let handler = service_fn(move |_req: Request<Full<Bytes>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"o-1")))) }
    });
    let server = ServiceBuilder::new()
        .layer(InjectFaultLayer::new(server_faults))
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(handler);
    let addr = serve(server).await;

    let recorder = InMemoryRecorder::new();
    let mut client = client(client_faults, &recorder);
    let req = request(Kind::PostKeyed, &format!("http://{addr}"));
    let res = client.ready().await.unwrap().call(req).await.unwrap();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let call = &recorder.calls()[0];
    (
        call.outcome,
        call.attempts,
        commits.load(Ordering::SeqCst),
        replayed,
    )
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_whose_reply_was_lost_commits_once_with_a_server_that_honours_keys() {
    let got = keyed_against_an_idempotent_server(Failure::LostAfterCommit).await;
    assert_eq!(got, (Outcome::Succeeded, 2, 1, true));
}

#[tokio::test(start_paused = true)]
async fn a_slow_keyed_post_commits_once_with_a_server_that_honours_keys() {
    let got = keyed_against_an_idempotent_server(Failure::SlowPastPerTry).await;
    assert_eq!(got, (Outcome::Succeeded, 2, 1, true));
}
