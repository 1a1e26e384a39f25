//! `SurelyMiddleware` in a `reqwest_middleware::ClientWithMiddleware` (feature
//! `reqwest-middleware`), against a real hyper server on 127.0.0.1 with the fault layer. Paused
//! time, as in `reqwest.rs`: every socket is on loopback in this one thread, so the clock moves
//! only when nothing can run, and a `Retry-After` wait costs no real time.
//!
//! A GET retried after a 503 with `Retry-After`; a POST not retried after a reset after send
//! (unknown); a refused connection retried (not sent); the outcome on the response, the error
//! and the call's extensions; a body reqwest cannot clone sent once; the middlewares after it run
//! once per attempt; the call's extensions reach the stack; an attempt past its timeout dropped;
//! a hedge's two attempts down the chain at once.
#![cfg(feature = "reqwest-middleware")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Extensions, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use surely::fault::{Fault, InjectFaultLayer, Reply, Schedule};
use surely::headers::IDEMPOTENCY_KEY;
use surely::hedge::{HedgeDelay, HedgeLayer};
use surely::reqwest::middleware::{surely_error, SurelyMiddleware};
use surely::{CallOutcome, Outcome, OutcomeExt, Semantics, StopReason};
use tokio::time::Instant;
use tower::{service_fn, ServiceBuilder};

use crate::support::serve::{closed_port, serve};

const WAIT: Duration = Duration::from_secs(2);

/// What the handler saw of a request: its idempotency key and its body.
type Seen = (Option<String>, Bytes);

/// The server's side: how many writes the handler committed, every request it saw.
#[derive(Clone, Default)]
struct Server {
    commits: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    /// Serves the handler behind the server's fault script; returns its base URL.
    async fn start(&self, faults: Schedule) -> String {
        let (commits, seen) = (self.commits.clone(), self.seen.clone());
        let handler = service_fn(move |req: Request<Incoming>| {
            let (commits, seen) = (commits.clone(), seen.clone());
            async move {
                let method = req.method().clone();
                let key = req
                    .headers()
                    .get(IDEMPOTENCY_KEY)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                let body = req.into_body().collect().await?.to_bytes();
                if method != Method::GET {
                    commits.fetch_add(1, Ordering::SeqCst);
                }
                seen.lock().unwrap().push((key, body));
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
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.1.clone())
            .collect()
    }

    fn keys(&self) -> Vec<Option<String>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.0.clone())
            .collect()
    }
}

/// A reqwest client that ignores any proxy of the environment.
fn reqwest_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// The middleware with the defaults, around a reqwest client, and a counter of the attempts
/// that went down the chain after it.
fn client() -> (ClientWithMiddleware, Arc<AtomicUsize>) {
    let below = Arc::new(AtomicUsize::new(0));
    let client = ClientBuilder::new(reqwest_client())
        .with(SurelyMiddleware::new())
        .with(Count(below.clone()))
        .build();
    (client, below)
}

/// A middleware that counts the requests it sees.
struct Count(Arc<AtomicUsize>);

#[async_trait::async_trait]
impl Middleware for Count {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0.fetch_add(1, Ordering::SeqCst);
        next.run(req, extensions).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_get_is_retried_after_a_503_with_retry_after() {
    let server = Server::default();
    let unavailable = Reply::new(StatusCode::SERVICE_UNAVAILABLE).retry_after(WAIT);
    let base = server
        .start(Schedule::new().at(0, Fault::Respond(unavailable)))
        .await;
    let (client, below) = client();

    let started = Instant::now();
    let res = client
        .get(format!("{base}/orders/o-1"))
        .send()
        .await
        .unwrap();
    assert!(started.elapsed() >= WAIT, "{:?}", started.elapsed());
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.outcome(), Outcome::Succeeded);
    let call = res.call_outcome().unwrap();
    assert_eq!(
        (call.attempts(), call.stop_reason()),
        (2, StopReason::Success)
    );
    // Each attempt went down the rest of the chain, and the response keeps its URL.
    assert_eq!(below.load(Ordering::SeqCst), 2);
    assert_eq!(res.url().as_str(), format!("{base}/orders/o-1"));
    assert_eq!(res.text().await.unwrap(), "ok");
}

#[tokio::test(start_paused = true)]
async fn a_post_reset_after_send_is_not_retried_and_unknown() {
    let server = Server::default();
    // The server reads the request and drops the connection: nobody can tell the client that
    // the handler did not run.
    let base = server
        .start(Schedule::new().at(0, Fault::RefuseBeforeSend))
        .await;
    let (client, below) = client();

    let result = client
        .post(format!("{base}/orders"))
        .body("o-1")
        .send()
        .await;
    assert_eq!(result.outcome(), Outcome::Unknown);
    let err = result.unwrap_err();
    assert_eq!(err.outcome(), Outcome::Unknown);
    let surely = surely_error(&err).expect("the stack's error");
    assert_eq!(surely.attempts(), 1);
    assert_eq!(surely.stop_reason(), Some(StopReason::Unknown));
    let chain = surely.transport_ref().expect("the chain's own error");
    assert!(chain.is_request(), "{chain:?}");
    assert!(
        err.to_string().starts_with("unknown after 1 attempt"),
        "{err}"
    );
    assert_eq!(below.load(Ordering::SeqCst), 1);
    assert_eq!(server.commits(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_retried_for_a_post_and_failed_for_sure() {
    let (client, below) = client();
    let err = client
        .post(format!("http://{}/orders", closed_port()))
        .body("o-1")
        .send()
        .await
        .unwrap_err();
    // Never sent: retried even for a POST without a key, and the call failed for sure.
    assert_eq!(err.outcome(), Outcome::Failed);
    let surely = surely_error(&err).unwrap();
    assert_eq!(surely.attempts(), 3);
    assert_eq!(surely.stop_reason(), Some(StopReason::AttemptsExhausted));
    assert!(surely.transport_ref().unwrap().is_connect(), "{err:?}");
    assert_eq!(below.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn the_outcome_is_on_the_response_the_error_and_the_calls_extensions() {
    let server = Server::default();
    let base = server
        .start(Schedule::new().at(1, Fault::RefuseBeforeSend))
        .await;
    let (client, _) = client();

    // A success: on the response, and in the extensions of `execute_with_extensions`.
    let req = client
        .post(format!("{base}/orders"))
        .body("o-1")
        .build()
        .unwrap();
    let mut extensions = Extensions::new();
    let res = client
        .execute_with_extensions(req, &mut extensions)
        .await
        .unwrap();
    let call = res.call_outcome().cloned().unwrap();
    assert_eq!(call.outcome(), Outcome::Succeeded);
    // The preset gives a POST a key, which the server saw.
    let key = call.idempotency_key().unwrap().to_str().unwrap().to_owned();
    assert_eq!(server.keys(), vec![Some(key)]);
    assert_eq!(extensions.get::<CallOutcome>(), Some(&call));

    // A failure: on the error, and in the extensions.
    let req = client
        .post(format!("{base}/orders"))
        .body("o-2")
        .build()
        .unwrap();
    let mut extensions = Extensions::new();
    let err = client
        .execute_with_extensions(req, &mut extensions)
        .await
        .unwrap_err();
    assert!(err.is_middleware());
    let call = err.call_outcome().unwrap();
    assert_eq!(call.outcome(), Outcome::Unknown);
    assert_eq!(extensions.get::<CallOutcome>(), Some(call));

    // An error that no `SurelyMiddleware` made proves nothing.
    let plain = reqwest_middleware::Error::middleware(std::io::Error::other("elsewhere"));
    assert!(plain.call_outcome().is_none());
    assert_eq!(plain.outcome(), Outcome::Unknown);
}

#[tokio::test(start_paused = true)]
async fn a_body_reqwest_cannot_clone_is_sent_once() {
    let server = Server::default();
    // The handler commits, then the connection drops before the reply.
    let base = server
        .start(Schedule::new().at(0, Fault::ResetAfterSend))
        .await;
    let (client, below) = client();

    // A PUT may be sent twice, but this body is a stream: it goes out once.
    let stream = reqwest::Body::wrap(Full::new(Bytes::from_static(b"qty=2")));
    let err = client
        .put(format!("{base}/orders/o-1"))
        .body(stream)
        .send()
        .await
        .unwrap_err();
    assert_eq!(err.outcome(), Outcome::Unknown);
    let surely = surely_error(&err).unwrap();
    assert_eq!(surely.attempts(), 1);
    assert_eq!(surely.stop_reason(), Some(StopReason::NotReplayable));
    assert_eq!(below.load(Ordering::SeqCst), 1);
    assert_eq!(server.commits(), 1);
    assert_eq!(server.bodies(), vec![Bytes::from_static(b"qty=2")]);
}

#[tokio::test(start_paused = true)]
async fn a_bytes_body_is_sent_again_the_same() {
    let server = Server::default();
    let base = server
        .start(Schedule::new().at(0, Fault::ResetAfterSend))
        .await;
    let (client, _) = client();

    let res = client
        .put(format!("{base}/orders/o-1"))
        .body("qty=2")
        .send()
        .await
        .unwrap();
    assert_eq!(res.outcome(), Outcome::Succeeded);
    assert_eq!(res.call_outcome().unwrap().attempts(), 2);
    assert_eq!(server.commits(), 2);
    let sent = Bytes::from_static(b"qty=2");
    assert_eq!(server.bodies(), vec![sent.clone(), sent]);
}

#[tokio::test(start_paused = true)]
async fn the_calls_extensions_reach_the_stack() {
    let server = Server::default();
    let base = server
        .start(Schedule::new().at(0, Fault::ResetAfterSend))
        .await;
    let (client, _) = client();

    // Marked idempotent by its caller: this POST may be sent again after a lost reply.
    let res = client
        .post(format!("{base}/orders/o-1/cancel"))
        .body("now")
        .with_extension(Semantics::Idempotent)
        .send()
        .await
        .unwrap();
    assert_eq!(res.outcome(), Outcome::Succeeded);
    assert_eq!(res.call_outcome().unwrap().attempts(), 2);
    assert_eq!(server.commits(), 2);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_past_the_per_try_timeout_is_dropped_and_retried() {
    let server = Server::default();
    let base = server
        .start(Schedule::new().at(0, Fault::DelayReply(Duration::from_secs(5))))
        .await;
    let below = Arc::new(AtomicUsize::new(0));
    let middleware = SurelyMiddleware::with_stack(|attempts| {
        surely::client::http()
            .no_replay()
            .timeout(Duration::from_secs(10))
            .per_try_timeout(Duration::from_secs(1))
            .build(attempts)
    })
    .unwrap();
    let client = ClientBuilder::new(reqwest_client())
        .with(middleware)
        .with(Count(below.clone()))
        .build();

    let started = Instant::now();
    let res = client
        .get(format!("{base}/orders/o-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.outcome(), Outcome::Succeeded);
    assert_eq!(res.call_outcome().unwrap().attempts(), 2);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(below.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_url_reqwest_cannot_take_fails_final_after_one_attempt() {
    let (client, below) = client();
    let err = client
        .get("ftp://127.0.0.1/orders")
        .send()
        .await
        .unwrap_err();
    // reqwest refuses it at the bottom of the chain: final, nothing sent, not tried again.
    assert_eq!(err.outcome(), Outcome::Failed);
    let surely = surely_error(&err).unwrap();
    assert!(surely.transport_ref().unwrap().is_builder(), "{err:?}");
    assert_eq!(surely.attempts(), 1);
    assert_eq!(surely.stop_reason(), Some(StopReason::Final));
    assert_eq!(below.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hedged_read_races_two_attempts_down_the_chain() {
    let server = Server::default();
    let base = server
        .start(Schedule::new().at(0, Fault::DelayReply(Duration::from_secs(5))))
        .await;
    let below = Arc::new(AtomicUsize::new(0));
    let middleware = SurelyMiddleware::with_stack(|attempts| {
        surely::client::http()
            .no_replay()
            .hedge(HedgeLayer::builder().delay(HedgeDelay::fixed(Duration::from_millis(100))))
            .build(attempts)
    })
    .unwrap();
    let client = ClientBuilder::new(reqwest_client())
        .with(middleware)
        .with(Count(below.clone()))
        .build();

    // The first attempt hangs; the copy sent 100 ms later answers, and the first is dropped.
    let started = Instant::now();
    let res = client
        .get(format!("{base}/orders/o-1"))
        .send()
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(res.outcome(), Outcome::Succeeded);
    assert_eq!(res.call_outcome().unwrap().attempts(), 2);
    assert_eq!(below.load(Ordering::SeqCst), 2);
    assert_eq!(res.text().await.unwrap(), "ok");
}
