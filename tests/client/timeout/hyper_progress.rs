//! `TrackBody` and `Progress` with hyper-util's legacy client, against real sockets on 127.0.0.1.

use std::convert::Infallible;
use std::io;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
use surely::delivery::{Progress, TrackBody};
use surely::timeout::AttemptTimeoutLayer;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower::{service_fn, Layer};

use super::support::{call, closed_port, ms, secs, serve};

type Body = TrackBody<Full<Bytes>>;

fn tracked(uri: String, progress: &Progress) -> Request<Body> {
    let body = TrackBody::new(Full::new(Bytes::from("order o-1")), progress.clone());
    let mut req = Request::post(uri).body(body).unwrap();
    req.extensions_mut().insert(progress.clone());
    req
}

#[tokio::test]
async fn a_tracked_body_is_marked_sent_when_hyper_sends_it() {
    let handler = service_fn(|req: Request<Incoming>| async move {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        Ok::<_, Infallible>(Response::new(Full::new(body)))
    });
    let addr = serve(handler).await;

    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let mut svc = AttemptTimeoutLayer::new(secs(60)).layer(client);
    let progress = Progress::new();
    let req = tracked(format!("http://{addr}/orders"), &progress);
    assert_eq!(progress.phase(), DeliveryPhase::NotSent);

    let res = call(&mut svc, req).await.unwrap();
    assert_eq!(progress.phase(), DeliveryPhase::Sent);
    assert_eq!(res.status(), StatusCode::OK);
    let echoed = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(echoed, "order o-1");
}

#[tokio::test]
async fn a_refused_connection_leaves_the_body_untouched() {
    let addr = closed_port();
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let mut svc = AttemptTimeoutLayer::new(secs(60)).layer(client);
    let progress = Progress::new();

    let err = call(
        &mut svc,
        tracked(format!("http://{addr}/orders"), &progress),
    )
    .await
    .unwrap_err();
    assert_eq!(progress.phase(), DeliveryPhase::NotSent);
    assert!(err.transport_ref().expect("a transport error").is_connect());
    let c = err.classify_error(DeliveryPhase::Sent);
    assert_eq!(c.class(), AttemptClass::Rejected);
    assert_eq!(c.phase(), DeliveryPhase::NotSent);
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_never_opens_times_out_as_not_sent() {
    // A connector that never connects: the pool is waiting, nothing was written.
    let connector =
        service_fn(|_uri: Uri| std::future::pending::<io::Result<TokioIo<TcpStream>>>());
    let client = Client::builder(TokioExecutor::new()).build::<_, Body>(connector);
    let mut svc = AttemptTimeoutLayer::new(ms(250)).layer(client);
    let progress = Progress::new();

    let start = Instant::now();
    let err = call(
        &mut svc,
        tracked("http://orders.test/".to_owned(), &progress),
    )
    .await
    .unwrap_err();
    assert_eq!(Instant::now() - start, ms(250));
    assert_eq!(progress.phase(), DeliveryPhase::NotSent);
    let elapsed = err.elapsed().expect("the attempt timed out");
    assert_eq!(elapsed.phase(), DeliveryPhase::NotSent);
    assert!(!elapsed.is_deadline());
    assert_eq!(
        err.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::Rejected
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_as_maybe_committed() {
    // Real time until the server has the request, then paused time to fire the timeout.
    let (arrived, mut arrivals) = mpsc::unbounded_channel::<()>();
    let handler = service_fn(move |_req: Request<Incoming>| {
        let arrived = arrived.clone();
        async move {
            arrived.send(()).unwrap();
            std::future::pending::<()>().await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    });
    let addr = serve(handler).await;

    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let mut svc = AttemptTimeoutLayer::new(secs(3600)).layer(client);
    let progress = Progress::new();
    let req = tracked(format!("http://{addr}/orders"), &progress);
    let attempt = tokio::spawn(async move { call(&mut svc, req).await });

    arrivals.recv().await.unwrap();
    assert_eq!(progress.phase(), DeliveryPhase::Sent);
    tokio::time::pause();
    tokio::time::advance(secs(3600)).await;

    let err = attempt.await.unwrap().unwrap_err();
    let elapsed = err.elapsed().expect("the attempt timed out");
    assert_eq!(elapsed.phase(), DeliveryPhase::Sent);
    assert!(!elapsed.is_deadline());
    assert_eq!(
        err.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::MaybeCommitted
    );
}
