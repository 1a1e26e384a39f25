//! The one-call client stack around hyper-util's client, against a real hyper server on
//! 127.0.0.1 (paused time).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::fault::{Fault, InjectFaultLayer, Reply, Schedule};
use surely::headers::DEFAULT_HEADER;
use surely::headers::IDEMPOTENCY_KEY;
use surely::headers::RETRY_OWNER;
use surely::record::InMemoryRecorder;
use surely::retry::backoff::Backoff;
use surely::retry::ReplayBody;
use surely::Outcome;
use surely::StopReason;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

use crate::support::serve::serve;

type Body = ReplayBody<Full<Bytes>>;

/// A server that records each request's headers and body, behind a fault script.
async fn server(faults: Schedule) -> (String, Arc<Mutex<Vec<(HeaderMap, Bytes)>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let handler = service_fn(move |req: Request<Incoming>| {
        let log = log.clone();
        async move {
            let headers = req.headers().clone();
            let body = req.into_body().collect().await?.to_bytes();
            log.lock().unwrap().push((headers, body));
            Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"created"))))
        }
    });
    let addr = serve(
        ServiceBuilder::new()
            .layer(InjectFaultLayer::new(faults))
            .service(handler),
    )
    .await;
    (format!("http://{addr}"), seen)
}

fn transport() -> Client<hyper_util::client::legacy::connect::HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn order(base: &str) -> Request<Full<Bytes>> {
    Request::post(format!("{base}/orders"))
        .body(Full::new(Bytes::from_static(b"o-1")))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_lost_reply_is_retried_with_the_same_key_and_the_same_bytes() {
    let (base, seen) = server(Schedule::new().at(0, Fault::ResetAfterSend)).await;
    let recorder = InMemoryRecorder::new();
    // Told that the server honours keys: the generated key makes the POST keyed.
    let mut client = surely::client::http()
        .timeout(Duration::from_secs(5))
        .per_try_timeout(Duration::from_secs(1))
        .server_honours_keys()
        .retry(|r| r.backoff(Backoff::none()))
        .recorder(recorder.clone())
        .build(transport())
        .unwrap();

    let res = client
        .ready()
        .await
        .unwrap()
        .call(order(&base))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // The preset records the attempt when its body ends: read it.
    res.into_body().collect().await.unwrap();

    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        2,
        "the lost attempt and its retry reached the server"
    );
    let keys: Vec<_> = seen
        .iter()
        .map(|(h, _)| h[IDEMPOTENCY_KEY].clone())
        .collect();
    assert_eq!(keys[0], keys[1], "one key per call, on every attempt");
    assert!(seen.iter().all(|(_, body)| body == "o-1"));
    // The deadline and the retry owner travel with every attempt.
    for (headers, _) in &seen {
        let left: u64 = headers[DEFAULT_HEADER].to_str().unwrap().parse().unwrap();
        assert!(left > 0 && left < 5000, "{left}");
        assert!(headers.contains_key(RETRY_OWNER));
    }
    // Records: one call, two attempts, as many as reached the transport.
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Succeeded);
    assert_eq!(call.attempts, 2);
    assert_eq!(recorder.attempts().len(), 2);
    assert_eq!(
        call.key.as_ref().unwrap().as_str(),
        keys[0].to_str().unwrap()
    );
}

#[tokio::test(start_paused = true)]
async fn without_keys_a_lost_post_is_unknown_and_not_retried() {
    let (base, seen) = server(Schedule::new().at(0, Fault::ResetAfterSend)).await;
    let recorder = InMemoryRecorder::new();
    let mut client = surely::client::http()
        .no_idempotency_keys()
        .recorder(recorder.clone())
        .build(transport())
        .unwrap();

    let out = client.ready().await.unwrap().call(order(&base)).await;
    assert!(out.is_err());
    assert_eq!(seen.lock().unwrap().len(), 1);
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Unknown);
    assert_eq!(call.stop, StopReason::Unknown);
}

#[tokio::test(start_paused = true)]
async fn an_overloaded_server_is_retried_after_its_retry_after() {
    let busy = Reply::new(StatusCode::SERVICE_UNAVAILABLE).retry_after(Duration::from_secs(1));
    let (base, seen) = server(Schedule::new().at(0, Fault::Respond(busy))).await;
    let mut client = surely::client::http().build(transport()).unwrap();

    let start = tokio::time::Instant::now();
    let res = client
        .ready()
        .await
        .unwrap()
        .call(order(&base))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(start.elapsed() >= Duration::from_secs(1));
    // The 503 was answered by the fault layer: one request reached the handler.
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn one_layer_wraps_many_transports() {
    let (base, seen) = server(Schedule::new()).await;
    let layer = surely::client::http().into_layer().unwrap();
    for _ in 0..2 {
        let mut client = tower::Layer::layer(&layer, transport());
        client
            .ready()
            .await
            .unwrap()
            .call(order(&base))
            .await
            .unwrap();
    }
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[test]
fn bad_settings_are_refused_with_what_is_wrong() {
    let zero = Duration::ZERO;
    let errors = [
        surely::client().timeout(zero).into_layer().map(drop),
        surely::client()
            .per_try_timeout(zero)
            .into_layer()
            .map(drop),
        surely::client()
            .retry(|r| r.max_attempts(0))
            .into_layer()
            .map(drop),
    ];
    let messages: Vec<String> = errors
        .into_iter()
        .map(|e| e.unwrap_err().to_string())
        .collect();
    assert!(messages[0].contains("deadline"), "{messages:?}");
    assert!(messages[1].contains("timeout"), "{messages:?}");
    assert!(messages[2].contains("attempt"), "{messages:?}");
}

#[tokio::test(start_paused = true)]
async fn any_tower_service_can_be_the_transport() {
    let mut client = surely::client()
        .no_retry()
        .build(service_fn(|_req: Request<String>| async {
            Ok::<_, std::io::Error>(Response::new(String::from("ok")))
        }))
        .unwrap();
    let req = Request::get("/health").body(String::new()).unwrap();
    let res = client.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.body(), "ok");
}

/// A transport that answers 503 (no pushback) until `healthy` is set, counting its calls.
fn flaky(
    calls: Arc<std::sync::atomic::AtomicUsize>,
    healthy: Arc<std::sync::atomic::AtomicBool>,
) -> impl Service<
    Request<String>,
    Response = Response<String>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone {
    use std::sync::atomic::Ordering;
    service_fn(move |_req: Request<String>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let ok = healthy.load(Ordering::SeqCst);
        async move {
            let mut res = Response::new(String::new());
            if !ok {
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            Ok::<_, std::io::Error>(res)
        }
    })
}

#[tokio::test(start_paused = true)]
async fn the_default_breaker_opens_and_its_rejections_spend_nothing_downstream() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let healthy = Arc::new(AtomicBool::new(false));
    let breaker = surely::breaker::CircuitBreaker::builder()
        .min_throughput(5)
        .build()
        .unwrap();
    let mut client = surely::client()
        .no_retry()
        .breaker(breaker.clone())
        .build(flaky(calls.clone(), healthy.clone()))
        .unwrap();
    for _ in 0..5 {
        let req = Request::get("/stock").body(String::new()).unwrap();
        let res = client.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(breaker.state(), surely::breaker::BreakerState::Open);
    // Open: refused at once, not sent.
    let req = Request::get("/stock").body(String::new()).unwrap();
    let err = client.ready().await.unwrap().call(req).await.unwrap_err();
    assert!(err.is_circuit_open());
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    // After the break, a probe finds the server back and closes the breaker.
    healthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let req = Request::get("/stock").body(String::new()).unwrap();
    let res = client.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(breaker.state(), surely::breaker::BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_in_the_builder_gets_the_shared_classifier_and_budget() {
    use surely::hedge::{HedgeDelay, HedgeLayer};
    let recorder = InMemoryRecorder::new();
    let slow_first = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let transport = service_fn(move |_req: Request<String>| {
        let n = slow_first.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            if n == 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok::<_, std::io::Error>(Response::new(format!("answer {n}")))
        }
    });
    let mut client = surely::client()
        .hedge(HedgeLayer::builder().delay(HedgeDelay::fixed(Duration::from_millis(50))))
        .recorder(recorder.clone())
        .build(transport)
        .unwrap();
    let start = tokio::time::Instant::now();
    let req = Request::get("/orders/o-1").body(String::new()).unwrap();
    let res = client.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.body(), "answer 1");
    assert_eq!(start.elapsed(), Duration::from_millis(50));
    let attempts = recorder.attempts();
    assert_eq!(attempts.len(), 2);
    assert!(attempts.iter().any(|a| a.cancelled && !a.hedge));
    assert!(attempts.iter().any(|a| a.hedge && !a.cancelled));
    // A POST is never hedged, whatever the builder says.
    let req = Request::post("/orders").body(String::from("o-2")).unwrap();
    let start = tokio::time::Instant::now();
    client.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(recorder.attempts().len(), 3);
}

/// Over real hyper: the server commits the order, sends the head and half the body, then the
/// connection breaks. The preset's records say the attempt may have committed, and the call is
/// unknown; the caller, handed the head's outcome, learns of the break from its read.
#[tokio::test(start_paused = true)]
async fn a_response_body_cut_off_on_the_wire_makes_the_record_unknown() {
    use hyper_util::rt::TokioIo;
    use surely::OutcomeExt;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, std::io::Error>(Response::new(CutOff::default()))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let recorder = InMemoryRecorder::new();
    let mut client = surely::client::http()
        .recorder(recorder.clone())
        .build(transport())
        .unwrap();
    let res = client
        .ready()
        .await
        .unwrap()
        .call(order(&format!("http://{addr}")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.outcome(), Outcome::Succeeded, "what the head said");
    assert!(res.into_body().collect().await.is_err());
    let attempt = &recorder.attempts()[0];
    assert_eq!(
        attempt.class(),
        surely::classify::AttemptClass::MaybeCommitted
    );
    let call = &recorder.calls()[0];
    assert_eq!((call.outcome, call.attempts), (Outcome::Unknown, 1));
}

/// A response body that sends half an order, waits, then breaks: the head and the first chunk
/// are on the wire before the connection goes.
#[derive(Default)]
struct CutOff {
    sent: bool,
    wait: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for CutOff {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        if !self.sent {
            self.sent = true;
            let half = http_body::Frame::data(Bytes::from_static(b"{\"order\":"));
            return std::task::Poll::Ready(Some(Ok(half)));
        }
        let wait = self
            .wait
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(10))));
        std::task::ready!(std::future::Future::poll(wait.as_mut(), cx));
        std::task::Poll::Ready(Some(Err(std::io::ErrorKind::ConnectionReset.into())))
    }
}

/// The transport of the type-level tests: a plain function, so that its type has a name.
type FnTransport = tower::util::ServiceFn<
    fn(Request<String>) -> std::future::Ready<std::io::Result<Response<String>>>,
>;

fn answer(_: Request<String>) -> std::future::Ready<std::io::Result<Response<String>>> {
    std::future::ready(Ok(Response::new(String::from("ok"))))
}

#[tokio::test(start_paused = true)]
async fn without_a_recorder_the_stack_has_no_record_layers_and_still_hands_back_the_outcome() {
    use surely::deadline::{AttemptTimers, SetDeadline};
    use surely::idempotency::SetIdempotencyKey;
    use surely::retry::Retry;
    use surely::timeout::AttemptTimeout;
    use surely::OutcomeExt;

    // The default client is the stack with no record layer in it, as a type: this fails to
    // compile if a record layer (even a pass-through one) comes back into the default. Its
    // breaker is kept by the retry layer: no breaker layer either.
    type Bare = SetDeadline<SetIdempotencyKey<Retry<AttemptTimeout<FnTransport>>>, AttemptTimers>;
    let transport: FnTransport = service_fn(answer);
    let bare: Bare = surely::client().build(transport).unwrap();
    let named: surely::client::Client<FnTransport> = bare;

    let res = named
        .oneshot(Request::post("/orders").body(String::new()).unwrap())
        .await;
    let call = res.as_ref().unwrap().call_outcome().unwrap();
    assert_eq!(call.outcome(), Outcome::Succeeded);
    assert_eq!(call.attempts(), 1);
    assert!(call.idempotency_key().is_some());

    // A recorder, even `()`, brings the two record layers.
    let transport: FnTransport = service_fn(answer);
    let recorded = surely::client().recorder(()).build(transport).unwrap();
    let _: surely::record::RecordCall<_, (), _> = recorded;
}

#[tokio::test(start_paused = true)]
async fn the_breaker_is_kept_by_the_retry_layer_and_goes_under_a_hedge_when_there_is_one() {
    use surely::breaker::{BreakerState, CircuitBreaker};
    use surely::deadline::{AttemptTimers, SetDeadline};
    use surely::hedge::HedgeLayer;
    use surely::idempotency::SetIdempotencyKey;
    use surely::retry::Retry;
    use surely::timeout::AttemptTimeout;

    use surely::breaker::Breaker;
    use surely::hedge::Hedge;

    type Hedged = SetDeadline<
        SetIdempotencyKey<Retry<Hedge<Breaker<AttemptTimeout<FnTransport>>>>>,
        AttemptTimers,
    >;
    let breaker = CircuitBreaker::builder().min_throughput(1).build().unwrap();
    // With a hedge, a breaker layer under it counts each copy: the type says where it is.
    let transport: FnTransport = service_fn(answer);
    let _: Hedged = surely::client()
        .breaker(breaker.clone())
        .hedge(HedgeLayer::builder())
        .build(transport)
        .unwrap();
    // Without one, the retry layer keeps the breaker (no layer in the type) and still counts
    // every attempt with it: an isolated breaker refuses, and nothing is sent.
    let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = sent.clone();
    let transport = service_fn(move |_: Request<String>| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::future::ready(Ok::<_, std::io::Error>(Response::new(String::new())))
    });
    let client = surely::client()
        .breaker(breaker.clone())
        .build(transport)
        .unwrap();
    let get = || Request::get("/stock").body(String::new()).unwrap();
    let res = client.clone().oneshot(get()).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(breaker.window().calls, 1);
    breaker.isolate();
    let err = client.clone().oneshot(get()).await.unwrap_err();
    assert!(err.is_circuit_open(), "{err:?}");
    assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(breaker.state(), BreakerState::Isolated);
}

#[tokio::test]
async fn the_hyper_presets_are_named_and_send_the_replayable_body() {
    use surely::OutcomeExt;

    let (base, seen) = server(Schedule::new()).await;
    // The names an SDK struct holds.
    struct Shop {
        defaults: surely::hyper::Client<Full<Bytes>>,
        configured: surely::client::HttpClient<surely::hyper::Transport<Full<Bytes>>>,
    }
    let shop = Shop {
        defaults: surely::hyper::client(),
        configured: surely::client::http()
            .timeout(Duration::from_secs(2))
            .build(surely::hyper::transport())
            .unwrap(),
    };
    let res = shop.defaults.oneshot(order(&base)).await.unwrap();
    assert_eq!(res.outcome(), Outcome::Succeeded);
    let res = shop.configured.oneshot(order(&base)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|(_, body)| body == "o-1"));
}
