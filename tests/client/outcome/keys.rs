//! The key rule (`surely::docs::keys`, its table) over real hyper on 127.0.0.1: the server
//! commits a POST, then the connection is dropped before the reply. Only a client that knows
//! its server honours keys sends the POST again.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::fault::{Fault, InjectFaultLayer, Schedule};
use surely::headers::IDEMPOTENCY_KEY;
use surely::record::InMemoryRecorder;
use surely::retry::backoff::Backoff;
use surely::retry::ReplayBody;
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::MemoryStore;
use surely::{Outcome, OutcomeExt, Semantics, StopReason};
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

use crate::support::serve::serve;

type Transport = Client<HttpConnector, ReplayBody<Full<Bytes>>>;

fn transport() -> Transport {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A handler that commits an order on every request it runs, counted.
fn orders<B: Send + 'static>(
    commits: &Arc<AtomicU32>,
) -> impl Service<
    Request<B>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + use<B>,
>
       + Clone
       + Send
       + 'static
       + use<B> {
    let commits = commits.clone();
    service_fn(move |_req: Request<B>| {
        let commits = commits.clone();
        async move {
            let n = commits.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(Response::builder()
                .status(201)
                .body(Full::new(Bytes::from(format!("order {n}"))))
                .unwrap())
        }
    })
}

/// A server that ignores idempotency keys, and drops the connection after its first commit.
async fn ignoring_keys(commits: &Arc<AtomicU32>) -> String {
    let app = ServiceBuilder::new()
        .layer(InjectFaultLayer::new(
            Schedule::new().at(0, Fault::ResetAfterSend),
        ))
        .service(orders::<Incoming>(commits));
    format!("http://{}/orders", serve(app).await)
}

/// A server that honours them (surely's idempotency layer), and drops the connection after its
/// first commit.
async fn honouring_keys(commits: &Arc<AtomicU32>) -> String {
    let idem = IdempotencyLayer::builder(MemoryStore::new())
        .build()
        .unwrap()
        .layer(orders::<Full<Bytes>>(commits));
    let app = ServiceBuilder::new()
        .layer(InjectFaultLayer::new(
            Schedule::new().at(0, Fault::ResetAfterSend),
        ))
        .service(idem);
    format!("http://{}/orders", serve(app).await)
}

fn order(url: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .body(Full::new(Bytes::from_static(b"o-1")))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_default_client_does_not_resend_a_post_to_a_server_that_may_ignore_its_key() {
    let commits = Arc::new(AtomicU32::new(0));
    let url = ignoring_keys(&commits).await;
    let records = InMemoryRecorder::new();
    let mut client = surely::client::http()
        .timeout(Duration::from_secs(5))
        .retry(|r| r.backoff(Backoff::none()))
        .recorder(records.clone())
        .build(transport())
        .unwrap();
    let err = client
        .ready()
        .await
        .unwrap()
        .call(order(&url))
        .await
        .unwrap_err();
    assert_eq!(commits.load(Ordering::SeqCst), 1, "one order, not two");
    assert_eq!(err.outcome(), Outcome::Unknown);
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.stop_reason(), Some(StopReason::Unknown));
    assert!(
        err.to_string()
            .starts_with("unknown after 1 attempt (connection closed, sent): "),
        "{err}"
    );
    // The key went out all the same, and the record says what the request was.
    let call = &records.calls()[0];
    assert!(call.key.is_some());
    assert_eq!(call.semantics, Semantics::NonIdempotent);
    assert_eq!((call.outcome, call.attempts), (Outcome::Unknown, 1));
}

#[tokio::test(start_paused = true)]
async fn a_client_told_its_server_honours_keys_gets_the_stored_result() {
    let commits = Arc::new(AtomicU32::new(0));
    let url = honouring_keys(&commits).await;
    let mut client = surely::client::http()
        .timeout(Duration::from_secs(5))
        .server_honours_keys()
        .retry(|r| r.backoff(Backoff::none()))
        .build(transport())
        .unwrap();
    let res = client
        .ready()
        .await
        .unwrap()
        .call(order(&url))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(commits.load(Ordering::SeqCst), 1, "one order, not two");
    assert_eq!(res.outcome(), Outcome::Succeeded);
    let call = res.call_outcome().unwrap();
    assert_eq!(call.attempts(), 2);
    assert!(
        call.is_replayed(),
        "the second attempt got the stored result"
    );
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "order 1");
}

#[tokio::test(start_paused = true)]
async fn a_key_the_caller_set_makes_the_post_keyed_without_the_declaration() {
    let commits = Arc::new(AtomicU32::new(0));
    let url = honouring_keys(&commits).await;
    let records = InMemoryRecorder::new();
    let mut client = surely::client::http()
        .timeout(Duration::from_secs(5))
        .retry(|r| r.backoff(Backoff::none()))
        .recorder(records.clone())
        .build(transport())
        .unwrap();
    let mut req = order(&url);
    req.headers_mut()
        .insert(IDEMPOTENCY_KEY, HeaderValue::from_static("order-o-1"));
    let res = client.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(commits.load(Ordering::SeqCst), 1);
    assert_eq!(res.outcome(), Outcome::Succeeded);
    let call = res.call_outcome().unwrap();
    assert_eq!(call.attempts(), 2);
    assert_eq!(call.idempotency_key().unwrap(), "order-o-1");
    // The http() preset records an attempt, and then its call, when the body ends.
    assert!(records.calls().is_empty());
    res.into_body().collect().await.unwrap();
    assert_eq!(records.calls()[0].semantics, Semantics::Keyed);
}
