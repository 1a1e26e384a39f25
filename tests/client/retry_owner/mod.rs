//! One retry owner per chain: a request marked with `surely-retry-owner` makes the retry layers
//! of the handler's own clients leave retries to the caller, but for attempts provably not sent.
//! In process (paused time) and over two real hyper hops on 127.0.0.1.

mod support;
mod trust;

use std::convert::Infallible;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::headers::RETRY_OWNER;
use surely::record::{InMemoryRecorder, RecordAttemptLayer, RecordCallLayer};
use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;
use surely::server::deadline::ServerDeadlineLayer;
use surely::server::ResponseBody;
use surely::StopReason;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

use self::support::{retry, serve, Counter};

type Req = Request<String>;
type Res = Response<String>;

// ---- in process -------------------------------------------------------------------------------

/// What the downstream of the handler does, every time.
#[derive(Clone, Copy, Debug)]
enum Down {
    /// Answers 500: failed, maybe committed.
    Status500,
    /// Fails with `ConnectionRefused`: rejected, not sent.
    Refused,
}

/// A transport that counts its calls and always does `down`.
fn downstream(
    down: Down,
    calls: Counter,
) -> impl Service<Req, Response = Res, Error = io::Error> + Clone {
    service_fn(move |_req: Req| {
        let calls = calls.clone();
        async move {
            calls.hit();
            match down {
                Down::Status500 => Ok(Response::builder()
                    .status(StatusCode::INTERNAL_SERVER_ERROR)
                    .body(String::new())
                    .unwrap()),
                Down::Refused => Err(io::Error::from(io::ErrorKind::ConnectionRefused)),
            }
        }
    })
}

/// A server: `ServerDeadlineLayer` around a handler that GETs from `down` through
/// `RecordCallLayer → RetryLayer (3 attempts, no backoff, no budget) →
/// RecordAttemptLayer`, answering 200 on a 2xx and
/// 502 otherwise. `handled` counts the handler's invocations.
fn server(
    down: Down,
    handled: Counter,
    calls: Counter,
    recorder: InMemoryRecorder,
) -> impl Service<Req, Response = Response<ResponseBody<String>>, Error = Infallible> + Clone {
    server_behind(internal(), down, handled, calls, recorder)
}

/// The same server behind `layer`, whose handler also keeps the headers it was given.
fn server_behind(
    layer: ServerDeadlineLayer,
    down: Down,
    handled: Counter,
    calls: Counter,
    recorder: InMemoryRecorder,
) -> impl Service<Req, Response = Response<ResponseBody<String>>, Error = Infallible> + Clone {
    let handler = service_fn(move |req: Req| {
        let owner = req.headers().contains_key(RETRY_OWNER);
        handled.hit();
        let mut client = ServiceBuilder::new()
            .layer(RecordCallLayer::new(recorder.clone()))
            .layer(retry(true))
            .layer(RecordAttemptLayer::new(recorder.clone()))
            .service(downstream(down, calls.clone()));
        async move {
            let req = Request::get("/down").body(String::new()).unwrap();
            let out = match client.ready().await {
                Ok(svc) => svc.call(req).await,
                Err(e) => Err(e),
            };
            let status = match out {
                Ok(res) if res.status().is_success() => StatusCode::OK,
                _ => StatusCode::BAD_GATEWAY,
            };
            // The body says whether the handler saw the caller's marker.
            let body = if owner { "marked" } else { "" };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .body(body.to_owned())
                    .unwrap(),
            )
        }
    });
    layer.layer(handler)
}

/// The server deadline layer of a service whose callers are all our own: it trusts their retry
/// signals.
fn internal() -> ServerDeadlineLayer {
    ServerDeadlineLayer::builder()
        .trust_retry_signals(|_: &dyn surely::Envelope| true)
        .build()
        .unwrap()
}

async fn send<S, B>(svc: &mut S, req: Req) -> Result<Response<B>, S::Error>
where
    S: Service<Req, Response = Response<B>>,
{
    svc.ready().await?.call(req).await
}

fn get(owner: bool) -> Req {
    let mut b = Request::get("/up");
    if owner {
        b = b.header(RETRY_OWNER, "1");
    }
    b.body(String::new()).unwrap()
}

/// Calls the server once with or without the mark; returns (downstream calls, the downstream
/// call's attempts and stop reason, the server's status).
async fn serve_once(down: Down, owner: bool) -> (usize, u32, StopReason, StatusCode) {
    let (handled, calls, recorder) = (
        Counter::default(),
        Counter::default(),
        InMemoryRecorder::new(),
    );
    let mut svc = server(down, handled.clone(), calls.clone(), recorder.clone());
    let res = send(&mut svc, get(owner)).await.unwrap();
    assert_eq!(handled.get(), 1);
    let records = recorder.calls();
    assert_eq!(records.len(), 1, "one downstream call record");
    (
        calls.get(),
        records[0].attempts,
        records[0].stop,
        res.status(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_marked_request_leaves_a_maybe_committed_failure_to_the_caller() {
    let (calls, attempts, stop, status) = serve_once(Down::Status500, true).await;
    assert_eq!(
        calls, 1,
        "the handler's retry layer left the retry upstream"
    );
    assert_eq!(attempts, 1);
    assert_eq!(stop, StopReason::UpstreamOwnsRetries);
    assert_eq!(status, StatusCode::BAD_GATEWAY);
}

#[tokio::test(start_paused = true)]
async fn a_marked_request_still_retries_what_was_provably_not_sent() {
    let (calls, attempts, stop, status) = serve_once(Down::Refused, true).await;
    assert_eq!(
        calls, 3,
        "refused attempts cost the chain nothing: still retried"
    );
    assert_eq!(attempts, 3);
    assert_eq!(stop, StopReason::AttemptsExhausted);
    assert_eq!(status, StatusCode::BAD_GATEWAY);
}

#[tokio::test(start_paused = true)]
async fn an_unmarked_request_lets_the_handler_retry_a_get() {
    let (calls, attempts, stop, status) = serve_once(Down::Status500, false).await;
    assert_eq!(calls, 3);
    assert_eq!(attempts, 3);
    assert_eq!(stop, StopReason::AttemptsExhausted);
    assert_eq!(status, StatusCode::BAD_GATEWAY);

    let (calls, attempts, stop, _) = serve_once(Down::Refused, false).await;
    assert_eq!(
        (calls, attempts, stop),
        (3, 3, StopReason::AttemptsExhausted)
    );
}

#[tokio::test(start_paused = true)]
async fn the_mark_does_not_leak_out_of_the_handler_or_into_the_next_request() {
    // A marked request, then an unmarked one, on the same server: the second is retried below.
    let (handled, calls, recorder) = (
        Counter::default(),
        Counter::default(),
        InMemoryRecorder::new(),
    );
    let mut svc = server(
        Down::Status500,
        handled.clone(),
        calls.clone(),
        recorder.clone(),
    );
    send(&mut svc, get(true)).await.unwrap();
    assert_eq!(calls.get(), 1);
    send(&mut svc, get(false)).await.unwrap();
    assert_eq!(calls.get(), 4);
    let stops: Vec<_> = recorder.calls().iter().map(|c| c.stop).collect();
    assert_eq!(
        stops,
        [
            StopReason::UpstreamOwnsRetries,
            StopReason::AttemptsExhausted
        ]
    );

    // A client outside any handler, after the marked call, still retries.
    let probe = Counter::default();
    let mut client = retry(true).layer(downstream(Down::Status500, probe.clone()));
    let _ = send(&mut client, get(false)).await;
    assert_eq!(probe.get(), 3);
}

/// A transport that records the headers of every request and answers 500.
fn capture(
    seen: Arc<Mutex<Vec<HeaderMap>>>,
) -> impl Service<Req, Response = Res, Error = io::Error> + Clone {
    service_fn(move |req: Req| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(req.headers().clone());
            Ok(Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .body(String::new())
                .unwrap())
        }
    })
}

#[tokio::test(start_paused = true)]
async fn the_retry_layer_marks_every_attempt_unless_told_not_to() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut client = retry(true).layer(capture(seen.clone()));
    let _ = send(&mut client, get(false)).await;
    let marks: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|h| h.get_all(RETRY_OWNER).iter().cloned().collect::<Vec<_>>())
        .collect();
    assert_eq!(marks.len(), 3);
    for m in &marks {
        assert_eq!(m, &["1"], "exactly one mark, `1`, on every attempt");
    }

    // A request that already carries a mark (e.g. forwarded) still goes out with exactly one.
    seen.lock().unwrap().clear();
    let _ = send(&mut client, get(true)).await;
    for h in seen.lock().unwrap().iter() {
        assert_eq!(h.get_all(RETRY_OWNER).iter().count(), 1);
    }

    seen.lock().unwrap().clear();
    let mut client = retry(false).layer(capture(seen.clone()));
    let _ = send(&mut client, get(false)).await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|h| !h.contains_key(RETRY_OWNER)));
}

/// Top `RetryLayer` → server (`ServerDeadlineLayer` → handler → `RetryLayer` → 500), in process.
/// Returns (handler invocations, downstream calls).
async fn two_hops_in_process(mark_owner: bool) -> (usize, usize) {
    let (handled, calls) = (Counter::default(), Counter::default());
    let server = server(
        Down::Status500,
        handled.clone(),
        calls.clone(),
        InMemoryRecorder::new(),
    );
    let mut top = retry(mark_owner).layer(server);
    let res = send(&mut top, get(false)).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    (handled.get(), calls.get())
}

#[tokio::test(start_paused = true)]
async fn retries_happen_once_at_the_top_in_process() {
    assert_eq!(
        two_hops_in_process(true).await,
        (3, 3),
        "3 attempts, not 3 × 3"
    );
    assert_eq!(
        two_hops_in_process(false).await,
        (3, 9),
        "without the mark: 3 × 3"
    );
}

// ---- over two hyper hops on 127.0.0.1 ---------------------------------------------------------

const N: usize = 50;

/// Guard for anything that touches the network.
const GUARD: Duration = Duration::from_secs(10);

fn full(status: StatusCode) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn http_get(addr: std::net::SocketAddr) -> Request<Empty<Bytes>> {
    Request::get(format!("http://{addr}/"))
        .body(Empty::new())
        .unwrap()
}

/// What a two-hop run counted.
#[derive(Debug)]
struct Counts {
    top_attempts: usize,
    middle: usize,
    bottom: usize,
}

/// Top client (`RecordCallLayer → RetryLayer (default budget) → RecordAttemptLayer → hyper
/// client`) → middle server (`ServerDeadlineLayer → handler → RetryLayer → hyper client`) →
/// bottom server (always 500). `N` top-level GETs.
async fn two_hops_over_hyper(mark_owner: bool) -> Counts {
    let bottom = Counter::default();
    let counted = bottom.clone();
    let bottom_addr = serve(service_fn(move |_req: Request<Incoming>| {
        counted.hit();
        async { Ok::<_, Infallible>(full(StatusCode::INTERNAL_SERVER_ERROR)) }
    }))
    .await;

    let middle = Counter::default();
    let counted = middle.clone();
    let transport = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let handler = service_fn(move |_req: Request<Incoming>| {
        counted.hit();
        let mut client = retry(true).layer(transport.clone());
        async move {
            let out = match client.ready().await {
                Ok(svc) => svc.call(http_get(bottom_addr)).await,
                Err(e) => Err(e),
            };
            let status = match out {
                Ok(res) if res.status().is_success() => StatusCode::OK,
                _ => StatusCode::BAD_GATEWAY,
            };
            Ok::<_, Infallible>(full(status))
        }
    });
    let middle_addr = serve(internal().layer(handler)).await;

    let recorder = InMemoryRecorder::new();
    let top_retry = RetryLayer::builder()
        .backoff(Backoff::none())
        .mark_owner(mark_owner)
        .build()
        .unwrap();
    let transport = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut top = ServiceBuilder::new()
        .layer(RecordCallLayer::new(recorder.clone()))
        .layer(top_retry)
        .layer(RecordAttemptLayer::new(recorder.clone()))
        .service(transport);
    for _ in 0..N {
        let res = tokio::time::timeout(GUARD, async {
            top.ready().await?.call(http_get(middle_addr)).await
        })
        .await
        .expect("a top-level call took over 10 s")
        .expect("the middle answers");
        assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    }
    assert_eq!(recorder.calls().len(), N);
    Counts {
        top_attempts: recorder.attempts().len(),
        middle: middle.get(),
        bottom: bottom.get(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_hyper_the_bottom_is_called_once_per_top_attempt() {
    let c = two_hops_over_hyper(true).await;
    eprintln!("marked: {c:?}");
    // Every top attempt reached the middle once, and every middle invocation the bottom once.
    assert_eq!(c.middle, c.top_attempts, "{c:?}");
    assert_eq!(
        c.bottom, c.middle,
        "{c:?}: the middle retried although the top owns retries"
    );
    assert!(c.top_attempts >= N && c.top_attempts <= 3 * N, "{c:?}");
    assert!(c.bottom <= 3 * N, "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_hyper_without_the_mark_retries_multiply() {
    let c = two_hops_over_hyper(false).await;
    eprintln!("unmarked: {c:?}");
    assert_eq!(c.middle, c.top_attempts, "{c:?}");
    assert_eq!(
        c.bottom,
        3 * c.middle,
        "{c:?}: every middle invocation retried 3 times"
    );
    assert!(c.bottom > 3 * N, "{c:?}: the top retried too");
}
