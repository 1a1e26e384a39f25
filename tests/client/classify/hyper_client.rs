//! A real hyper-util client against 127.0.0.1: a refused connection is *not sent*, a
//! connection closed after the request was read is *maybe committed*.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, Error as ClientError};
use hyper_util::rt::{TokioExecutor, TokioIo};
use surely::classify::{
    AttemptClass, BoxError, Classify, ClassifyError, DeliveryPhase, HttpClassifier, MakeClassifier,
};
use surely::headers::IDEMPOTENCY_KEY;
use surely::Outcome;
use surely::{Envelope, IntoError, Semantics};

use super::support::{outcome_of, SEMANTICS};
use crate::support::serve::closed_port;

/// Every network step is bounded: a hung test fails instead of hanging.
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .expect("network I/O on 127.0.0.1 took more than 5s")
}

fn request(port: u16, semantics: Semantics) -> http::Request<Full<Bytes>> {
    let uri = format!("http://127.0.0.1:{port}/orders");
    let builder = match semantics {
        Semantics::Safe => http::Request::get(uri),
        Semantics::Idempotent => http::Request::put(uri),
        Semantics::Keyed => http::Request::post(uri).header(IDEMPOTENCY_KEY, "order-o-1"),
        Semantics::NonIdempotent => http::Request::post(uri),
    };
    let req = builder
        .body(Full::new(Bytes::from_static(b"order o-1")))
        .unwrap();
    assert_eq!(req.semantics(), semantics);
    req
}

/// Classifies a client error for `req` every way a layer might: directly, through the HTTP
/// classifier, as a surely transport error, and boxed. All must agree.
fn classify(
    req: &http::Request<Full<Bytes>>,
    err: ClientError,
) -> surely::classify::Classification {
    let direct = err.classify_error(DeliveryPhase::Sent);
    let classifier = HttpClassifier::new().make_classifier(req);
    let via_http = Classify::<http::Response<()>, ClientError>::classify_error(
        classifier,
        &err,
        DeliveryPhase::Sent,
    );
    assert_eq!(direct, via_http);
    let boxed: BoxError = Box::new(err);
    assert_eq!(boxed.classify_error(DeliveryPhase::Sent), direct, "boxed");
    let err = *boxed.downcast::<ClientError>().unwrap();
    let surely_err: surely::Error<ClientError> = err.into_error();
    assert_eq!(surely_err.classify_error(DeliveryPhase::Sent), direct);
    direct
}

#[tokio::test]
async fn refused_connection_is_rejected_not_sent() {
    let port = closed_port().port();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    for semantics in SEMANTICS {
        let req = request(port, semantics);
        let err = bounded(client.request(request(port, semantics)))
            .await
            .expect_err("nothing listens on the port");
        assert!(err.is_connect(), "{err:?}");
        let c = classify(&req, err);
        assert_eq!(c.class(), AttemptClass::Rejected, "{semantics:?}");
        assert_eq!(c.phase(), DeliveryPhase::NotSent, "{semantics:?}");
        assert!(c.is_retryable(semantics), "{semantics:?}");
        assert_eq!(outcome_of(semantics, &[c.class()]), Some(Outcome::Failed));
    }
}

#[tokio::test]
async fn dns_failure_is_rejected_not_sent() {
    let resolver = tower::service_fn(|_name: Name| async {
        Err::<std::vec::IntoIter<SocketAddr>, _>(io::Error::other("no such host"))
    });
    let client = Client::builder(TokioExecutor::new())
        .build::<_, Full<Bytes>>(HttpConnector::new_with_resolver(resolver));
    let req = http::Request::post("http://orders.invalid/orders")
        .body(Full::new(Bytes::from_static(b"order o-1")))
        .unwrap();
    let err = bounded(client.request(req.clone())).await.unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    let c = classify(&req, err);
    assert_eq!(c.class(), AttemptClass::Rejected);
    assert_eq!(c.phase(), DeliveryPhase::NotSent);
    assert!(c.is_retryable(Semantics::NonIdempotent));
}

/// A hyper server that reads the whole request, then fails its service: hyper closes the
/// connection without writing a response. The client's request was written and read.
async fn serve_then_hang_up() -> (u16, tokio::task::JoinHandle<usize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let mut served = 0;
        for _ in SEMANTICS {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper::service::service_fn(
                |req: http::Request<hyper::body::Incoming>| async move {
                    let body = req.into_body().collect().await.map(|b| b.to_bytes());
                    assert_eq!(body.ok().as_deref(), Some(&b"order o-1"[..]));
                    Err::<http::Response<Full<Bytes>>, _>(io::Error::other(
                        "committed the order, then crashed",
                    ))
                },
            );
            let result = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
            assert!(
                result.is_err(),
                "the service failed, so must the connection"
            );
            served += 1;
        }
        served
    });
    (port, server)
}

#[tokio::test]
async fn connection_closed_after_the_request_was_read_is_maybe_committed() {
    let (port, server) = serve_then_hang_up().await;
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Full<Bytes>>();
    for semantics in SEMANTICS {
        let req = request(port, semantics);
        let err = bounded(client.request(request(port, semantics)))
            .await
            .expect_err("the server hung up without answering");
        assert!(!err.is_connect(), "{err:?}");
        let c = classify(&req, err);
        assert_eq!(c.class(), AttemptClass::MaybeCommitted, "{semantics:?}");
        assert_eq!(c.phase(), DeliveryPhase::Sent, "{semantics:?}");
        assert_eq!(
            c.is_retryable(semantics),
            semantics != Semantics::NonIdempotent,
            "{semantics:?}"
        );
        let expected = if semantics == Semantics::Safe {
            Outcome::Failed
        } else {
            Outcome::Unknown
        };
        assert_eq!(outcome_of(semantics, &[c.class()]), Some(expected));
    }
    assert_eq!(bounded(server).await.unwrap(), SEMANTICS.len());
}
