//! A timeout per phase, through the `http()` preset: connect (hyper-util's connector, over
//! real sockets on 127.0.0.1), the response head (the attempt timeout) and the body's idle
//! time (`body_idle_timeout`); each recorded with its phase.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::client::legacy::connect::HttpConnector;
use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
use surely::record::InMemoryRecorder;
use surely::retry::ReplayBody;
use surely::timeout::{BodyIdle, BodyIdleTimeoutLayer, Elapsed};
use surely::Outcome;
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, Sleep};
use tower::service_fn;

use super::support::{call, ms, secs};

type Sent = Request<ReplayBody<Full<Bytes>>>;
type Answer = BoxBody<Bytes, io::Error>;

fn post(uri: &str) -> Request<Full<Bytes>> {
    Request::post(uri)
        .body(Full::new(Bytes::from_static(b"o-1")))
        .unwrap()
}

fn get(uri: &str) -> Request<Full<Bytes>> {
    Request::get(uri).body(Full::default()).unwrap()
}

/// One frame, then silence.
fn stalls() -> Answer {
    let first = Ok(Frame::data(Bytes::from_static(b"[{\"id\":\"o-1\"},")));
    let frames =
        tokio_stream::StreamExt::chain(tokio_stream::iter([first]), tokio_stream::pending());
    StreamBody::new(frames).boxed()
}

/// `frames` frames, one every `every`, then the end.
struct Trickle {
    every: Duration,
    left: u32,
    sleep: Pin<Box<Sleep>>,
}

fn trickle(every: Duration, frames: u32) -> Answer {
    Trickle {
        every,
        left: frames,
        sleep: Box::pin(tokio::time::sleep(every)),
    }
    .boxed()
}

impl Body for Trickle {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        std::task::ready!(self.sleep.as_mut().poll(cx));
        self.left -= 1;
        let next = Instant::now() + self.every;
        self.sleep.as_mut().reset(next);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"item,")))))
    }
}

// ---- the head: the attempt timeout ---------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn no_head_in_time_is_recorded_sent_and_a_writes_call_is_unknown() {
    let records = InMemoryRecorder::new();
    let transport = service_fn(|_req: Sent| async {
        std::future::pending::<()>().await;
        Ok::<_, io::Error>(Response::new(stalls()))
    });
    let mut client = surely::client::http()
        .per_try_timeout(ms(300))
        .recorder(records.clone())
        .build(transport)
        .unwrap();

    let err = call(&mut client, post("http://shop/orders"))
        .await
        .unwrap_err();
    assert_eq!(err.outcome(), Outcome::Unknown);
    assert_eq!(
        err.elapsed(),
        Some(&Elapsed::new(DeliveryPhase::Sent, false).with_given(ms(300)))
    );
    let attempts = records.attempts();
    assert_eq!(
        attempts.len(),
        1,
        "a write that may have committed is not sent again"
    );
    assert_eq!(attempts[0].phase(), DeliveryPhase::Sent);
    assert_eq!(attempts[0].class(), AttemptClass::MaybeCommitted);
    assert_eq!(
        attempts[0].timeout.map(|t| t.phase()),
        Some(DeliveryPhase::Sent)
    );
    assert_eq!(records.calls()[0].outcome, Outcome::Unknown);

    // A read is retried, and fails for sure when every attempt times out.
    let err = call(&mut client, get("http://shop/orders"))
        .await
        .unwrap_err();
    assert_eq!((err.outcome(), err.attempts()), (Outcome::Failed, 3));
}

// ---- the body: the idle timeout ------------------------------------------------------------

fn body_client(
    records: &InMemoryRecorder,
    answer: fn() -> Answer,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<impl Body<Data = Bytes, Error = surely::classify::BoxError> + use<>>,
    Error = impl std::fmt::Debug + use<>,
> + use<> {
    let transport =
        service_fn(move |_req: Sent| async move { Ok::<_, io::Error>(Response::new(answer())) });
    surely::client::http()
        .per_try_timeout(secs(1))
        .recorder(records.clone())
        .body_idle_timeout(secs(5))
        .build(transport)
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_body_that_goes_quiet_fails_with_body_idle_and_a_writes_call_is_unknown() {
    let records = InMemoryRecorder::new();
    let mut client = body_client(&records, stalls);
    let res = call(&mut client, post("http://shop/orders")).await.unwrap();
    assert_eq!(res.status(), 200);
    let mut body = res.into_body();
    assert!(body.frame().await.unwrap().unwrap().is_data());

    let waited = Instant::now();
    let err = body.frame().await.unwrap().unwrap_err();
    assert_eq!(Instant::now() - waited, secs(5));
    assert_eq!(
        err.downcast_ref::<BodyIdle>(),
        Some(&BodyIdle::new(secs(5)))
    );
    assert!(
        body.frame().await.is_none(),
        "a body failed for idleness ends there"
    );

    let attempt = &records.attempts()[0];
    assert_eq!(attempt.phase(), DeliveryPhase::ResponseStarted);
    assert_eq!(attempt.class(), AttemptClass::MaybeCommitted);
    let call = &records.calls()[0];
    assert_eq!((call.outcome, call.attempts), (Outcome::Unknown, 1));
}

#[tokio::test(start_paused = true)]
async fn a_reads_body_that_goes_quiet_is_a_failed_call() {
    let records = InMemoryRecorder::new();
    let mut client = body_client(&records, stalls);
    let res = call(&mut client, get("http://shop/orders")).await.unwrap();
    let err = res.into_body().collect().await.unwrap_err();
    assert!(err.is::<BodyIdle>());
    // The boxed error classifies by the `BodyIdle` it holds.
    let c = err.classify_error(DeliveryPhase::Sent);
    assert_eq!(
        (c.class(), c.phase()),
        (AttemptClass::MaybeCommitted, DeliveryPhase::ResponseStarted)
    );
    assert_eq!(
        records.attempts()[0].phase(),
        DeliveryPhase::ResponseStarted
    );
    assert_eq!(records.calls()[0].outcome, Outcome::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_body_slower_than_the_call_budget_but_never_idle_for_long_is_read_whole() {
    let records = InMemoryRecorder::new();
    // Four seconds between frames (under the 5 s idle limit), 16 s in all: longer than the
    // call's 10 s budget and its 1 s per-try timeout, which end at the head.
    let mut client = body_client(&records, || trickle(secs(4), 4));
    let started = Instant::now();
    let res = call(&mut client, post("http://shop/orders")).await.unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "item,item,item,item,");
    assert_eq!(Instant::now() - started, secs(16));
    assert_eq!(records.attempts()[0].class(), AttemptClass::Success);
    assert_eq!(records.calls()[0].outcome, Outcome::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn the_idle_clock_runs_only_while_the_caller_waits_for_a_frame() {
    let records = InMemoryRecorder::new();
    let mut client = body_client(&records, stalls);
    let res = call(&mut client, get("http://shop/orders")).await.unwrap();
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    // The caller is busy for longer than the idle limit: not the server's silence.
    tokio::time::sleep(secs(30)).await;
    let waited = Instant::now();
    let err = body.frame().await.unwrap().unwrap_err();
    assert!(err.is::<BodyIdle>());
    assert_eq!(Instant::now() - waited, secs(5));
}

#[tokio::test(start_paused = true)]
async fn a_zero_idle_timeout_is_refused() {
    let err = BodyIdleTimeoutLayer::builder()
        .idle(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("body idle timeout"), "{err}");
    let err = BodyIdleTimeoutLayer::builder()
        .idle(Duration::MAX)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "body idle timeout");
    // `new` never fails: zero counts as a nanosecond, past ten years as ten years.
    assert_eq!(
        BodyIdleTimeoutLayer::new(Duration::ZERO).idle(),
        Duration::from_nanos(1)
    );
    assert_eq!(
        BodyIdleTimeoutLayer::new(Duration::MAX).idle(),
        surely::MAX_DURATION
    );
    let transport = service_fn(|_req: Sent| async { Ok::<_, io::Error>(Response::new(stalls())) });
    let built = surely::client::http()
        .body_idle_timeout(Duration::ZERO)
        .build(transport);
    assert!(built.is_err());
}

// ---- the connect: hyper-util's connect timeout, on real sockets ----------------------------

/// A listener on 127.0.0.1 whose accept queue is full: the kernel drops further SYNs, so a
/// connect to it neither completes nor fails. The streams that fill the queue are returned to
/// keep them open.
async fn full_backlog() -> (
    tokio::net::TcpListener,
    std::net::SocketAddr,
    Vec<TcpStream>,
) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut held = Vec::new();
    for _ in 0..16 {
        match tokio::time::timeout(ms(200), TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => held.push(stream),
            Ok(Err(e)) => panic!("connect to the listener failed: {e}"),
            Err(_) => return (listener, addr, held),
        }
    }
    panic!("the accept queue never filled");
}

#[tokio::test]
async fn a_connect_timeout_is_not_sent_and_a_post_is_retried() {
    let (_listener, addr, _held) = full_backlog().await;
    let records = InMemoryRecorder::new();
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(ms(100)));
    let mut client = surely::client::http()
        .timeout(secs(5))
        .retry(|r| r.backoff(surely::retry::backoff::Backoff::none()))
        .recorder(records.clone())
        .build(surely::hyper::transport_with(connector))
        .unwrap();

    let started = std::time::Instant::now();
    let err = tokio::time::timeout(
        secs(5),
        call(&mut client, post(&format!("http://{addr}/orders"))),
    )
    .await
    .expect("the connect timeout ends each attempt")
    .unwrap_err();
    assert!(started.elapsed() < secs(2), "{:?}", started.elapsed());

    // Never sent: the POST is retried, and the call failed for sure.
    assert_eq!((err.outcome(), err.attempts()), (Outcome::Failed, 3));
    let hyper_err = err.transport_ref().expect("hyper-util's error");
    assert!(hyper_err.is_connect());
    let mut source = std::error::Error::source(hyper_err);
    let mut timed_out = false;
    while let Some(e) = source {
        timed_out |= e
            .downcast_ref::<io::Error>()
            .is_some_and(|e| e.kind() == io::ErrorKind::TimedOut);
        source = e.source();
    }
    assert!(timed_out, "the connect timed out: {err:?}");
    for attempt in records.attempts() {
        assert_eq!(attempt.phase(), DeliveryPhase::NotSent);
        assert_eq!(attempt.class(), AttemptClass::Rejected);
    }
    assert_eq!(records.calls()[0].outcome, Outcome::Failed);
}
