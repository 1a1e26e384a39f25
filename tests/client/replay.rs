//! Replayable request bodies: every attempt sends the same bytes; a body that cannot be buffered
//! makes the call single-attempt, and the record says so.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use surely::classify::BoxError;
use surely::fault::{Fault, InjectFaultLayer, Reply, Schedule};
use surely::record::{InMemoryRecorder, RecordAttemptLayer, RecordCallLayer};
use surely::retry::backoff::Backoff;
use surely::retry::{NotReplayable, ReplayBody, ReplayLayer, RetryLayer};
use surely::Outcome;
use surely::StopReason;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

/// A body of the given chunks (and optional trailers) whose size is unknown up front, like a
/// streaming upload; or one that fails after its chunks.
struct Chunks {
    chunks: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    fail: bool,
}

impl Chunks {
    fn new(chunks: &[&'static str]) -> Self {
        Chunks {
            chunks: chunks
                .iter()
                .map(|c| Bytes::from_static(c.as_bytes()))
                .collect(),
            trailers: None,
            fail: false,
        }
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        if let Some(chunk) = self.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if self.fail {
            self.fail = false;
            return Poll::Ready(Some(Err(io::ErrorKind::ConnectionReset.into())));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// What each attempt sent: its body bytes (or the error reading it) and its trailers.
type Seen = Arc<Mutex<Vec<Result<(Bytes, Option<HeaderMap>), String>>>>;

/// A client stack: call record, replay, retry (no wait, no budget), a fault script, and a
/// transport that reads the whole body of every attempt.
async fn send<B>(
    req: Request<B>,
    limit: usize,
    faults: Schedule,
) -> (Result<Response<()>, String>, Seen, InMemoryRecorder)
where
    B: Body + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
    B::Data: Send,
{
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let recorder = InMemoryRecorder::new();
    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(recorder.clone()))
        .layer(ReplayLayer::new().limit(limit))
        .layer(
            RetryLayer::builder()
                .backoff(Backoff::none())
                .no_budget()
                .build()
                .unwrap(),
        )
        .layer(RecordAttemptLayer::new(recorder.clone()))
        .layer(InjectFaultLayer::new(faults))
        .service(service_fn(move |req: Request<ReplayBody<B>>| {
            let log = log.clone();
            async move {
                let got = req.into_body().collect().await.map_err(|e| e.to_string());
                log.lock().unwrap().push(got.map(|c| {
                    let trailers = c.trailers().cloned();
                    (c.to_bytes(), trailers)
                }));
                Ok::<_, Infallible>(Response::new(()))
            }
        }));
    let res = client
        .ready()
        .await
        .unwrap()
        .call(req)
        .await
        .map_err(|e| e.to_string());
    (res, seen, recorder)
}

fn unavailable() -> Fault {
    Fault::Respond(Reply::new(StatusCode::SERVICE_UNAVAILABLE))
}

fn bodies(seen: &Seen) -> Vec<Bytes> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|s| s.as_ref().unwrap().0.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_streamed_body_is_sent_identically_on_every_attempt() {
    let mut body = Chunks::new(&["qty=", "1&", "sku=42"]);
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", HeaderValue::from_static("abc"));
    body.trailers = Some(trailers.clone());
    let req = Request::put("/orders/o-1").body(body).unwrap();
    let faults = Schedule::new().at(0, unavailable()).at(1, unavailable());

    let (res, seen, recorder) = send(req, 1024, faults).await;

    assert!(res.is_ok());
    let seen = seen.lock().unwrap().clone();
    // The fault layer answered the first two attempts without reading them; the third reached
    // the transport with every byte and the trailers.
    assert_eq!(seen.len(), 1);
    let (bytes, got_trailers) = seen[0].clone().unwrap();
    assert_eq!(bytes, "qty=1&sku=42");
    assert_eq!(got_trailers, Some(trailers));
    let call = &recorder.calls()[0];
    assert_eq!(call.attempts, 3);
    assert_eq!(call.outcome, Outcome::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn every_attempt_that_reaches_the_transport_reads_the_same_bytes() {
    let req = Request::put("/orders/o-1")
        .body(Chunks::new(&["a", "b", "c"]))
        .unwrap();
    // The first attempt is read by the transport, then its reply is lost.
    let (res, seen, recorder) = send(req, 1024, Schedule::new().at(0, Fault::ResetAfterSend)).await;

    assert!(res.is_ok());
    assert_eq!(bodies(&seen), vec![Bytes::from("abc"), Bytes::from("abc")]);
    assert_eq!(recorder.calls()[0].attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_body_over_the_limit_by_its_size_is_sent_once_unread() {
    let big = Bytes::from(vec![7u8; 100 * 1024]);
    let req = Request::put("/blobs/b-1")
        .body(Full::new(big.clone()))
        .unwrap();
    let (res, seen, recorder) =
        send(req, 64 * 1024, Schedule::new().at(0, Fault::ResetAfterSend)).await;

    // The PUT could have been retried, but its body could not be copied.
    assert!(res.is_err());
    assert_eq!(bodies(&seen), vec![big]);
    let call = &recorder.calls()[0];
    assert_eq!(call.attempts, 1);
    assert_eq!(call.stop, StopReason::NotReplayable);
}

#[tokio::test(start_paused = true)]
async fn a_stream_found_too_large_while_reading_is_sent_whole_once() {
    let req = Request::put("/blobs/b-1")
        .body(Chunks::new(&["0123", "4567", "89"]))
        .unwrap();
    let (res, seen, recorder) = send(req, 6, Schedule::new().at(0, unavailable())).await;

    // Even a "not processed" answer is not retried: there is nothing left to send again.
    assert_eq!(res.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(seen.lock().unwrap().is_empty());
    let call = &recorder.calls()[0];
    assert_eq!(call.attempts, 1);
    assert_eq!(call.stop, StopReason::NotReplayable);
}

#[tokio::test(start_paused = true)]
async fn the_prefix_read_ahead_and_the_rest_arrive_in_order() {
    let req = Request::put("/blobs/b-1")
        .body(Chunks::new(&["0123", "4567", "89"]))
        .unwrap();
    let (res, seen, recorder) = send(req, 6, Schedule::new()).await;

    assert!(res.is_ok());
    assert_eq!(bodies(&seen), vec![Bytes::from("0123456789")]);
    assert_eq!(recorder.calls()[0].stop, StopReason::Success);
}

#[tokio::test(start_paused = true)]
async fn a_body_that_fails_while_read_is_sent_once_and_fails_there() {
    let mut body = Chunks::new(&["par"]);
    body.fail = true;
    let req = Request::put("/orders/o-1").body(body).unwrap();
    let (res, seen, recorder) = send(req, 1024, Schedule::new()).await;

    assert!(res.is_ok(), "the transport answered");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].as_ref().unwrap_err().contains("reset"), "{seen:?}");
    assert_eq!(recorder.calls()[0].attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn an_empty_body_is_replayable() {
    let req = Request::get("/orders/o-1")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let (res, seen, recorder) = send(req, 0, Schedule::new().at(0, Fault::ResetAfterSend)).await;

    assert!(res.is_ok());
    assert_eq!(bodies(&seen), vec![Bytes::new(), Bytes::new()]);
    assert_eq!(recorder.calls()[0].attempts, 2);
}

/// A request as the transport under a `ReplayLayer` gets it.
type Replayed = Request<ReplayBody<Full<Bytes>>>;

#[tokio::test(start_paused = true)]
async fn an_ended_body_goes_on_with_its_request_and_every_copy_sends_nothing() {
    // A `Full` of nothing has ended before it is read, as an `Empty` has: the request goes on
    // as it came, with a body that replays as nothing, however often it is copied or read.
    let seen: Arc<Mutex<Option<Replayed>>> = Arc::default();
    let keep = seen.clone();
    let mut svc = ReplayLayer::new()
        .limit(0)
        .layer(service_fn(move |req: Replayed| {
            let keep = keep.clone();
            async move {
                *keep.lock().unwrap() = Some(req);
                Ok::<_, Infallible>(())
            }
        }));
    let mut req = Request::put("/orders/o-1")
        .header("x-order", "o-1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    req.extensions_mut().insert(7u8);
    svc.ready().await.unwrap().call(req).await.unwrap();

    let req = seen.lock().unwrap().take().unwrap();
    assert_eq!(req.method(), http::Method::PUT);
    assert_eq!(req.uri(), "/orders/o-1");
    assert_eq!(req.headers()["x-order"], "o-1");
    assert_eq!(req.extensions().get::<u8>(), Some(&7));
    assert!(req.extensions().get::<NotReplayable>().is_none());
    let body = req.into_body();
    assert!(body.is_replayable());
    assert!(body.is_end_stream());
    assert_eq!(body.size_hint().exact(), Some(0));
    assert_eq!(body.buffered_bytes().unwrap(), "");
    assert_eq!(format!("{body:?}"), "ReplayBody { buffered: 0 }");
    let copy = body.clone();
    assert!(copy.collect().await.unwrap().to_bytes().is_empty());
    let mut body = body;
    assert!(body.frame().await.is_none());
    assert!(body.frame().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn an_ended_body_is_sent_again_on_every_retry() {
    let req = Request::put("/orders/o-1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (res, seen, recorder) = send(
        req,
        1024,
        Schedule::new()
            .at(0, Fault::ResetAfterSend)
            .at(1, Fault::ResetAfterSend),
    )
    .await;

    // Each attempt reached the transport, which read the body whole.
    assert!(res.is_ok());
    assert_eq!(bodies(&seen), vec![Bytes::new(); 3]);
    assert_eq!(recorder.calls()[0].attempts, 3);
}

#[tokio::test]
async fn a_copy_of_a_body_sent_once_fails_instead_of_sending_nothing() {
    let seen: Arc<Mutex<Option<Request<ReplayBody<Chunks>>>>> = Arc::default();
    let keep = seen.clone();
    let mut svc =
        ReplayLayer::new()
            .limit(2)
            .layer(service_fn(move |req: Request<ReplayBody<Chunks>>| {
                let keep = keep.clone();
                async move {
                    *keep.lock().unwrap() = Some(req);
                    Ok::<_, Infallible>(())
                }
            }));
    let req = Request::post("/x").body(Chunks::new(&["abc"])).unwrap();
    svc.ready().await.unwrap().call(req).await.unwrap();

    let req = seen.lock().unwrap().take().unwrap();
    assert!(req.extensions().get::<NotReplayable>().is_some());
    assert!(!req.body().is_replayable());
    let copy = req.clone();
    let err = copy.into_body().collect().await.unwrap_err();
    assert!(err.to_string().contains("cannot be sent again"), "{err}");
    // The original still sends everything it read and the rest.
    let all = req.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(all, "abc");
}

#[tokio::test]
async fn a_replayable_body_reports_its_exact_size() {
    let body = ReplayBody::<Full<Bytes>>::from_bytes("hello");
    assert!(body.is_replayable());
    assert_eq!(body.size_hint().exact(), Some(5));
    assert_eq!(body.buffered_bytes().unwrap(), "hello");
    let copy = body.clone();
    assert_eq!(copy.collect().await.unwrap().to_bytes(), "hello");
    assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
}

/// A body whose chunks come over a channel, as an upload streamed by another task: it is not
/// all there when the call is made.
struct Channel(tokio::sync::mpsc::Receiver<Bytes>);

impl Body for Channel {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_still_coming_when_the_call_is_made_is_read_as_it_comes_then_replayed() {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(Bytes::from_static(b"qty=")).await.unwrap();
    // The rest comes later, from another task; the call waits for it, woken by the channel.
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        tx.send(Bytes::from_static(b"1&")).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        tx.send(Bytes::from_static(b"sku=42")).await.unwrap();
    });
    let req = Request::put("/orders/o-1").body(Channel(rx)).unwrap();
    let (res, seen, recorder) = send(req, 1024, Schedule::new().at(0, Fault::ResetAfterSend)).await;

    assert!(res.is_ok());
    assert_eq!(
        bodies(&seen),
        vec![Bytes::from("qty=1&sku=42"), Bytes::from("qty=1&sku=42")]
    );
    assert_eq!(recorder.calls()[0].attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_body_still_coming_that_grows_past_the_limit_is_sent_once_whole() {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        for chunk in ["0123", "4567", "89"] {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            tx.send(Bytes::from_static(chunk.as_bytes())).await.unwrap();
        }
    });
    let req = Request::put("/orders/o-1").body(Channel(rx)).unwrap();
    // Over the limit after the second chunk: sent as it comes, once, not retried.
    let (res, seen, recorder) = send(req, 6, Schedule::new().at(0, unavailable())).await;

    assert!(res.is_ok(), "the 503 is the call's answer: {res:?}");
    assert!(
        seen.lock().unwrap().is_empty(),
        "the fault answered without reading"
    );
    let call = &recorder.calls()[0];
    assert_eq!(call.attempts, 1);
    assert_eq!(call.stop, StopReason::NotReplayable);

    // And without a fault, the one attempt gets every byte, in order.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        for chunk in ["0123", "4567", "89"] {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            tx.send(Bytes::from_static(chunk.as_bytes())).await.unwrap();
        }
    });
    let req = Request::put("/orders/o-1").body(Channel(rx)).unwrap();
    let (res, seen, _) = send(req, 6, Schedule::new()).await;
    assert!(res.is_ok());
    assert_eq!(bodies(&seen), vec![Bytes::from("0123456789")]);
}
