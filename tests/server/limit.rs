//! The adaptive limit: refusals and their headers, criticality and partitions, how each
//! algorithm moves the limit, the start check, the records, bad settings, and a real hyper
//! server whose refused requests never reach the handler.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use surely::deadline::Deadline;
use surely::record::{InMemoryRecorder, LimitEventKind, RefusalReason};
use surely::server::deadline::{can_finish, RecheckLayer};
use surely::server::limit::{AdaptiveLimitLayer, Aimd, Gradient};
use surely::{Criticality, Envelope};
use tokio::sync::Semaphore;
use tower::{service_fn, Layer, Service, ServiceExt};

type Res = Response<String>;

/// A handler that counts its calls and holds each until the test lets it go (`open`), then
/// answers `status` after `takes`.
#[derive(Clone)]
struct Held {
    calls: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    status: Arc<std::sync::Mutex<StatusCode>>,
    takes: Arc<std::sync::Mutex<Duration>>,
}

impl Held {
    fn new() -> Self {
        Held {
            calls: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
            status: Arc::new(std::sync::Mutex::new(StatusCode::OK)),
            takes: Arc::default(),
        }
    }

    /// A handler that never waits for the gate.
    fn open() -> Self {
        let held = Held::new();
        held.gate.add_permits(Semaphore::MAX_PERMITS / 2);
        held
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }

    fn answer(&self, status: StatusCode, takes: Duration) {
        *self.status.lock().unwrap() = status;
        *self.takes.lock().unwrap() = takes;
    }

    fn service<B: Send + 'static>(
        &self,
    ) -> impl Service<Request<B>, Response = Res, Error = Infallible, Future: Send> + Clone + use<B>
    {
        let this = self.clone();
        service_fn(move |_req: Request<B>| {
            let this = this.clone();
            async move {
                this.calls.fetch_add(1, Ordering::SeqCst);
                this.gate.acquire().await.unwrap().forget();
                let (status, takes) = (*this.status.lock().unwrap(), *this.takes.lock().unwrap());
                tokio::time::sleep(takes).await;
                let mut res = Response::new(String::from("done"));
                *res.status_mut() = status;
                Ok::<_, Infallible>(res)
            }
        })
    }
}

fn fixed(limit: u32) -> surely::server::limit::AdaptiveLimitLayerBuilder {
    AdaptiveLimitLayer::builder()
        .initial(limit)
        .min(limit)
        .max(limit)
}

/// Starts `n` requests through `svc` and lets them reach the handler.
async fn start<S, T>(svc: &S, reqs: Vec<Request<()>>) -> Vec<tokio::task::JoinHandle<T>>
where
    S: Service<Request<()>, Response = T, Error = Infallible> + Clone + Send + 'static,
    T: Send + 'static,
    S::Future: Send,
{
    let mut out = Vec::new();
    for req in reqs {
        let svc = svc.clone();
        out.push(tokio::spawn(async move { svc.oneshot(req).await.unwrap() }));
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    out
}

fn get() -> Request<()> {
    Request::get("/").body(()).unwrap()
}

fn with_criticality(c: &str) -> Request<()> {
    Request::get("/")
        .header("surely-criticality", c)
        .body(())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn over_the_limit_is_refused_at_once_and_never_reaches_the_handler() {
    let held = Held::new();
    let limit = fixed(2).build().unwrap();
    let svc = limit.layer(held.service());
    let running = start(&svc, vec![get(), get()]).await;
    assert_eq!(limit.in_flight(), 2);

    let refused = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(refused.headers()["surely-not-processed"], "overload");
    assert_eq!(
        held.calls(),
        2,
        "the refused request never reached the handler"
    );
    assert_eq!(limit.refused(RefusalReason::Limit), 1);

    // A gRPC request is refused as gRPC: UNAVAILABLE, pushback in milliseconds.
    let grpc = Request::post("/pkg.Svc/Do")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let refused = svc.clone().oneshot(grpc).await.unwrap();
    assert_eq!(refused.status(), StatusCode::OK);
    assert_eq!(refused.headers()["grpc-status"], "14");
    assert_eq!(refused.headers()["grpc-retry-pushback-ms"], "1000");
    assert_eq!(refused.headers()["surely-not-processed"], "overload");

    held.release(2);
    for r in running {
        assert_eq!(r.await.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(limit.in_flight(), 0);
    // Room again.
    held.release(1);
    assert_eq!(svc.oneshot(get()).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_rounded_up_to_whole_seconds() {
    let held = Held::new();
    let limit = fixed(1)
        .retry_after(Duration::from_millis(1500))
        .build()
        .unwrap();
    let svc = limit.layer(held.service());
    let _running = start(&svc, vec![get()]).await;
    let refused = svc.oneshot(get()).await.unwrap();
    assert_eq!(refused.headers()["retry-after"], "2");
}

#[tokio::test(start_paused = true)]
async fn a_request_dropped_before_its_answer_gives_its_place_back() {
    let held = Held::new();
    let limit = fixed(1).build().unwrap();
    let svc = limit.layer(held.service());
    let running = start(&svc, vec![get()]).await;
    assert_eq!(limit.in_flight(), 1);
    running[0].abort();
    let _ = tokio::time::timeout(Duration::from_millis(1), async {}).await;
    tokio::task::yield_now().await;
    assert_eq!(limit.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_least_critical_is_shed_first() {
    let held = Held::new();
    // A limit of 10: sheddable may fill 8, sheddable-plus 9, critical 10, critical-plus 11.
    let limit = fixed(10).build().unwrap();
    let svc = limit.layer(held.service());
    let _running = start(&svc, (0..8).map(|_| get()).collect()).await;

    let shed = svc
        .clone()
        .oneshot(with_criticality("sheddable"))
        .await
        .unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(limit.refused(RefusalReason::Shed), 1);

    let _more = start(&svc, vec![with_criticality("SHEDDABLE_PLUS")]).await;
    assert_eq!(limit.in_flight(), 9);
    let _more = start(&svc, vec![get()]).await;
    assert_eq!(limit.in_flight(), 10);
    // Full for critical work too; the refusal now says "limit".
    let refused = svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(limit.refused(RefusalReason::Limit), 1);

    // The host's extension is trusted: critical-plus gets the 11th place.
    let mut vip = get();
    vip.extensions_mut().insert(Criticality::CriticalPlus);
    let _more = start(&svc, vec![vip]).await;
    assert_eq!(limit.in_flight(), 11);
    assert_eq!(held.calls(), 11);
}

#[tokio::test(start_paused = true)]
async fn an_untrusted_header_may_lower_criticality_never_raise_it() {
    let held = Held::new();
    let untrusted = fixed(10).build().unwrap();
    let svc = untrusted.layer(held.service());
    let _running = start(&svc, (0..10).map(|_| get()).collect()).await;
    // Claims critical-plus: treated as critical, refused at the limit.
    let res = svc
        .clone()
        .oneshot(with_criticality("critical-plus"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Hostile or unknown values are ignored (critical), never a panic or a 400.
    for hostile in ["", "critical-plus-plus", "\u{7f}", "<script>"] {
        let mut req = get();
        if let Ok(v) = http::HeaderValue::from_str(hostile) {
            req.headers_mut().insert("surely-criticality", v);
        }
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE, "{hostile:?}");
    }
    let huge = "x".repeat(64 * 1024);
    let res = svc.clone().oneshot(with_criticality(&huge)).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);

    // A trusted caller's header is honoured.
    let trusted = fixed(10)
        .trust_criticality(|req: &dyn Envelope| {
            req.headers()
                .is_some_and(|h| h.get("x-internal").is_some_and(|v| v == "1"))
        })
        .build()
        .unwrap();
    let svc = trusted.layer(held.service());
    let _running = start(&svc, (0..10).map(|_| get()).collect()).await;
    let mut req = with_criticality("critical-plus");
    req.headers_mut()
        .insert("x-internal", http::HeaderValue::from_static("1"));
    let _vip = start(&svc, vec![req]).await;
    assert_eq!(trusted.in_flight(), 11);
}

#[tokio::test(start_paused = true)]
async fn a_partition_keeps_its_reserved_share_when_others_fill_the_limit() {
    let held = Held::new();
    let limit = fixed(10)
        .partition("checkout", 0.3, |req: &dyn Envelope| {
            req.uri().is_some_and(|u| u.path().starts_with("/checkout"))
        })
        .build()
        .unwrap();
    let svc = limit.layer(held.service());
    let browse = || Request::get("/browse").body(()).unwrap();
    let checkout = || Request::post("/checkout").body(()).unwrap();
    // Browsing fills the whole limit.
    let _running = start(&svc, (0..10).map(|_| browse()).collect()).await;
    let res = svc.clone().oneshot(browse()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Checkout still has its three places (30 % of 10)...
    let _checkout = start(&svc, (0..3).map(|_| checkout()).collect()).await;
    assert_eq!(limit.in_flight(), 13);
    // ...and no more.
    let res = svc.clone().oneshot(checkout()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(held.calls(), 13);
}

#[tokio::test(start_paused = true)]
async fn aimd_cuts_once_per_overload_and_grows_while_in_use() {
    let held = Held::open();
    let recorder = InMemoryRecorder::new();
    let limit = AdaptiveLimitLayer::builder()
        .algorithm(Aimd::new().backoff(0.5))
        .initial(20)
        .max(100)
        .recorder(recorder.clone())
        .build()
        .unwrap();
    let svc = limit.layer(held.service());

    // The handler says it is overloaded: ten 503s admitted under one limit cut it once.
    held.answer(StatusCode::SERVICE_UNAVAILABLE, Duration::from_millis(10));
    let running = start(&svc, (0..10).map(|_| get()).collect()).await;
    for r in running {
        r.await.unwrap();
    }
    assert_eq!(limit.limit(), 10);
    // The next overload cuts it again.
    let running = start(&svc, (0..6).map(|_| get()).collect()).await;
    for r in running {
        r.await.unwrap();
    }
    assert_eq!(limit.limit(), 5);

    // Healthy answers while the limit is in use grow it, one per limit's worth.
    held.answer(StatusCode::OK, Duration::from_millis(10));
    for _ in 0..20 {
        let running = start(&svc, (0..limit.limit()).map(|_| get()).collect()).await;
        for r in running {
            r.await.unwrap();
        }
    }
    assert!(limit.limit() > 15, "limit {}", limit.limit());

    // A limit nobody uses does not grow.
    let before = limit.limit();
    for _ in 0..50 {
        svc.clone().oneshot(get()).await.unwrap();
    }
    assert_eq!(limit.limit(), before);

    let changes: Vec<_> = recorder
        .limit_events()
        .into_iter()
        .filter(|e| matches!(e.kind, LimitEventKind::Changed { .. }))
        .collect();
    assert!(changes.len() >= 3, "{changes:?}");
    assert!(matches!(
        changes[0].kind,
        LimitEventKind::Changed { from: 20 }
    ));
    assert_eq!(changes[0].limit, 10);
}

#[tokio::test(start_paused = true)]
async fn aimd_counts_a_missed_deadline_and_a_slow_answer_as_drops() {
    let held = Held::open();
    let limit = AdaptiveLimitLayer::builder()
        .algorithm(Aimd::new().latency_target(Duration::from_millis(100)))
        .initial(20)
        .build()
        .unwrap();
    let svc = limit.layer(held.service());

    // Finished after its caller's deadline: the work was for nobody.
    held.answer(StatusCode::OK, Duration::from_millis(50));
    let mut req = get();
    req.extensions_mut()
        .insert(Deadline::after(Duration::from_millis(20)));
    svc.clone().oneshot(req).await.unwrap();
    assert_eq!(limit.limit(), 18);

    // Slower than the latency target.
    held.answer(StatusCode::OK, Duration::from_millis(150));
    svc.clone().oneshot(get()).await.unwrap();
    assert_eq!(limit.limit(), 16);
}

#[tokio::test(start_paused = true)]
async fn gradient_shrinks_when_latency_rises_and_grows_back_when_it_falls() {
    let held = Held::open();
    let limit = AdaptiveLimitLayer::builder()
        .algorithm(Gradient::new().window(10).sample_every(1))
        .initial(20)
        .max(200)
        .build()
        .unwrap();
    let svc = limit.layer(held.service());

    // Steady at 10 ms with the limit in use: the limit grows.
    held.answer(StatusCode::OK, Duration::from_millis(10));
    for _ in 0..30 {
        let n = limit.limit();
        let running = start(&svc, (0..n).map(|_| get()).collect()).await;
        for r in running {
            r.await.unwrap();
        }
    }
    let grown = limit.limit();
    assert!(grown > 20, "limit {grown}");

    // Latency four times the long-run level: requests are queueing; the limit shrinks.
    held.answer(StatusCode::OK, Duration::from_millis(40));
    for _ in 0..10 {
        let n = limit.limit().min(20);
        let running = start(&svc, (0..n).map(|_| get()).collect()).await;
        for r in running {
            r.await.unwrap();
        }
    }
    let shrunk = limit.limit();
    assert!(shrunk < grown * 3 / 4, "from {grown} to {shrunk}");

    // Fast again: it grows back.
    held.answer(StatusCode::OK, Duration::from_millis(10));
    for _ in 0..30 {
        let n = limit.limit();
        let running = start(&svc, (0..n).map(|_| get()).collect()).await;
        for r in running {
            r.await.unwrap();
        }
    }
    assert!(limit.limit() > shrunk, "{} after {shrunk}", limit.limit());
}

#[tokio::test(start_paused = true)]
async fn refusals_and_snapshots_reach_the_recorder() {
    let held = Held::new();
    let recorder = InMemoryRecorder::new();
    let limit = fixed(1)
        .partition("all", 0.5, |_: &dyn Envelope| true)
        .recorder(recorder.clone())
        .build()
        .unwrap();
    let svc = limit.layer(held.service());
    let _running = start(&svc, vec![get()]).await;
    svc.clone()
        .oneshot(with_criticality("sheddable"))
        .await
        .unwrap();
    limit.report();
    let events = recorder.limit_events();
    assert_eq!(events.len(), 2, "{events:?}");
    match &events[0].kind {
        LimitEventKind::Refused {
            reason,
            criticality,
            partition,
        } => {
            assert_eq!(*reason, RefusalReason::Limit);
            assert_eq!(*criticality, Criticality::Sheddable);
            assert_eq!(partition.as_deref(), Some("all"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!((events[0].limit, events[0].in_flight), (1, 1));
    assert_eq!(events[1].kind, LimitEventKind::Snapshot);
    assert_eq!(
        events[0].to_string(),
        "limit refused reason=limit criticality=sheddable partition=\"all\" limit=1 in-flight=1"
    );
}

#[tokio::test(start_paused = true)]
async fn the_start_check_refuses_work_that_cannot_finish_in_time() {
    let held = Held::open();
    let limit = AdaptiveLimitLayer::new();
    let svc = RecheckLayer::new(Duration::from_millis(100))
        .count_in(&limit)
        .layer(held.service());

    let mut late = get();
    late.extensions_mut()
        .insert(Deadline::after(Duration::from_millis(99)));
    let res = svc.clone().oneshot(late).await.unwrap();
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(res.headers()["surely-not-processed"], "deadline");
    assert_eq!(held.calls(), 0);
    assert_eq!(limit.refused(RefusalReason::Deadline), 1);

    let mut in_time = get();
    in_time
        .extensions_mut()
        .insert(Deadline::after(Duration::from_millis(100)));
    assert_eq!(svc.clone().oneshot(in_time).await.unwrap().status(), 200);
    assert_eq!(svc.clone().oneshot(get()).await.unwrap().status(), 200);
    assert_eq!(held.calls(), 2);

    // The current deadline counts too: the handler of a call made inside another.
    let outer = Deadline::after(Duration::from_millis(10));
    let res = surely::deadline::scope(outer, svc.clone().oneshot(get()))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);

    assert!(!can_finish(
        Some(Deadline::after(Duration::ZERO)),
        Duration::ZERO + Duration::from_nanos(1)
    ));
}

#[test]
fn bad_settings_are_typed_errors() {
    let err = |b: surely::server::limit::AdaptiveLimitLayerBuilder| b.build().unwrap_err();
    let cases = [
        (err(AdaptiveLimitLayer::builder().min(0)), "limit minimum"),
        (
            err(AdaptiveLimitLayer::builder().min(5).max(4)),
            "limit maximum",
        ),
        (
            err(AdaptiveLimitLayer::builder().initial(2000)),
            "initial limit",
        ),
        (
            err(AdaptiveLimitLayer::builder().retry_after(Duration::ZERO)),
            "limit retry-after",
        ),
        (
            err(AdaptiveLimitLayer::builder().criticality_share(Criticality::Sheddable, f64::NAN)),
            "criticality shares",
        ),
        (
            err(AdaptiveLimitLayer::builder().criticality_share(Criticality::Critical, 0.5)),
            "criticality shares",
        ),
        (
            err(AdaptiveLimitLayer::builder().criticality_share(Criticality::Sheddable, 1.2)),
            "criticality shares",
        ),
        (
            err(AdaptiveLimitLayer::builder().partition("", 0.1, |_: &dyn Envelope| true)),
            "limit partition",
        ),
        (
            err(AdaptiveLimitLayer::builder()
                .partition("a", 0.1, |_: &dyn Envelope| true)
                .partition("a", 0.1, |_: &dyn Envelope| true)),
            "limit partition",
        ),
        (
            err(AdaptiveLimitLayer::builder().partition("a", -1.0, |_: &dyn Envelope| true)),
            "limit partition share",
        ),
        (
            err(AdaptiveLimitLayer::builder()
                .partition("a", 0.6, |_: &dyn Envelope| true)
                .partition("b", 0.6, |_: &dyn Envelope| true)),
            "limit partition shares",
        ),
        (
            err(AdaptiveLimitLayer::builder().algorithm(Aimd::new().backoff(1.0))),
            "aimd backoff",
        ),
        (
            err(AdaptiveLimitLayer::builder().algorithm(Aimd::new().latency_target(Duration::ZERO))),
            "aimd latency target",
        ),
        (
            err(AdaptiveLimitLayer::builder().algorithm(Gradient::new().tolerance(0.9))),
            "gradient tolerance",
        ),
        (
            err(AdaptiveLimitLayer::builder().algorithm(Gradient::new().smoothing(0.0))),
            "gradient smoothing",
        ),
        (
            err(AdaptiveLimitLayer::builder().algorithm(Gradient::new().window(0))),
            "gradient window",
        ),
        (
            err(AdaptiveLimitLayer::builder().algorithm(Gradient::new().long_window(0))),
            "gradient long window",
        ),
        (
            err(AdaptiveLimitLayer::builder().algorithm(Gradient::new().sample_every(0))),
            "gradient sampling",
        ),
    ];
    for (e, setting) in cases {
        assert_eq!(e.setting(), setting, "{e}");
        assert!(e.to_string().starts_with("invalid "), "{e}");
    }
}

/// A surely client reads the refusal as "not processed": even a POST without a key is sent
/// again, after the server's `Retry-After`, and the handler runs once.
#[tokio::test(start_paused = true)]
async fn a_surely_client_retries_a_refused_post_after_the_pushback() {
    let held = Held::new();
    let limit = fixed(1).build().unwrap();
    let server = limit.layer(held.service());
    let _running = start(&server, vec![get()]).await;
    let opened = held.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        opened.release(2);
    });
    let mut client = surely::client()
        .timeout(Duration::from_secs(10))
        .no_breaker()
        .build(server.clone())
        .unwrap();
    let began = tokio::time::Instant::now();
    let post = Request::post("/orders").body(()).unwrap();
    let res = client.ready().await.unwrap().call(post).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "{:?}",
        began.elapsed()
    );
    // The held GET and the POST's second attempt.
    assert_eq!(held.calls(), 2);
    assert_eq!(limit.refused(RefusalReason::Limit), 1);
}

/// Over a real hyper server on 127.0.0.1: with two requests held in the handler, the third
/// connection's request is refused with 503 and never reaches the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_hyper_a_refused_request_never_reaches_the_handler() {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let calls = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let (counted, held) = (calls.clone(), gate.clone());
    let handler = service_fn(move |_req: Request<hyper::body::Incoming>| {
        let (counted, held) = (counted.clone(), held.clone());
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            held.acquire().await.unwrap().forget();
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let limit = fixed(2).build().unwrap();
    let addr = crate::support::serve::serve(limit.layer(handler)).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let url: http::Uri = format!("http://{addr}/").parse().unwrap();
    let send = |client: &Client<_, Full<Bytes>>| {
        client.request(
            Request::get(url.clone())
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
    };
    let first = tokio::spawn(send(&client));
    let second = tokio::spawn(send(&client));
    // Bounded wait for both to reach the handler.
    for _ in 0..500 {
        if calls.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let refused = send(&client).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["surely-not-processed"], "overload");
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    gate.add_permits(2);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(second.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(limit.in_flight(), 0);
}

/// The client classifies a refusal by the limit as rejected, not processed, and as nothing
/// about the server's health: a breaker in front of a server that sheds every request stays
/// closed, and every call still reaches the server (which refuses it cheaply), instead of the
/// breaker cutting off the capacity the server kept.
#[tokio::test(start_paused = true)]
async fn an_overload_refusal_is_not_a_health_failure() {
    use surely::classify::{AttemptClass, Classified, Classify, HttpClassifier, MakeClassifier};

    let held = Held::new();
    let limit = fixed(1).build().unwrap();
    let server = limit.layer(held.service());
    let _running = start(&server, vec![get()]).await;

    let refusal = server.clone().oneshot(get()).await.unwrap();
    let classifier = HttpClassifier::new().make_classifier(&get());
    let Classified::Ready(c) =
        Classify::<_, surely::Error<std::io::Error>>::classify_response(classifier, &refusal)
    else {
        panic!("an HTTP response is classified from its head")
    };
    assert_eq!(c.class(), AttemptClass::Rejected);
    assert!(c.is_overload_refusal());
    assert!(!c.is_health_failure());

    let mut client = surely::client()
        .timeout(Duration::from_millis(100))
        .no_retry()
        .build(server.clone())
        .unwrap();
    for _ in 0..50 {
        let res = client.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    // All 50 reached the server: the breaker never opened.
    assert_eq!(limit.refused(RefusalReason::Limit), 51);
}

/// Four threads hammering one limit of 2 through their own clones: the handler never sees more
/// than 2 requests at once (the count in flight may read one too many in a race, never one too
/// few), and when all is done nothing is left in flight.
#[test]
fn four_threads_never_get_more_than_the_limit_in() {
    use std::future::Future;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Poll, Waker};

    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let limit = fixed(2).build().unwrap();
    let admitted = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let (now, most, admitted) = (now.clone(), most.clone(), admitted.clone());
            let mut svc = limit.layer(service_fn(move |_req: Request<()>| {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                std::hint::spin_loop();
                now.fetch_sub(1, Ordering::SeqCst);
                std::future::ready(Ok::<_, Infallible>(Response::new(String::new())))
            }));
            scope.spawn(move || {
                let mut cx = Context::from_waker(Waker::noop());
                for _ in 0..20_000 {
                    assert!(svc.poll_ready(&mut cx).is_ready());
                    let mut fut = std::pin::pin!(svc.call(Request::new(())));
                    let Poll::Ready(Ok(res)) = fut.as_mut().poll(&mut cx) else {
                        panic!("ready at once")
                    };
                    if res.status() == StatusCode::OK {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert!(
        most.load(Ordering::SeqCst) <= 2,
        "{}",
        most.load(Ordering::SeqCst)
    );
    assert_eq!(limit.in_flight(), 0);
    assert!(admitted.load(Ordering::Relaxed) > 0);
    assert_eq!(
        admitted.load(Ordering::Relaxed) as u64 + limit.refused(RefusalReason::Limit),
        80_000
    );
}

/// A client request's `Criticality` extension travels as the header the next hop's limit
/// reads; a header the caller set is kept; with internal headers off, nothing is written.
#[tokio::test(start_paused = true)]
async fn the_client_writes_a_requests_criticality_for_the_next_hop() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let saw = seen.clone();
    let transport = service_fn(move |req: Request<()>| {
        saw.lock().unwrap().push(
            req.headers()
                .get("surely-criticality")
                .map(|v| v.to_str().unwrap().to_owned()),
        );
        std::future::ready(Ok::<_, std::io::Error>(Response::new(String::new())))
    });
    let mut client = surely::client().build(transport.clone()).unwrap();
    let mut batch = get();
    batch.extensions_mut().insert(Criticality::Sheddable);
    client.ready().await.unwrap().call(batch).await.unwrap();
    let mut own = with_criticality("sheddable-plus");
    own.extensions_mut().insert(Criticality::Sheddable);
    client.ready().await.unwrap().call(own).await.unwrap();
    client.ready().await.unwrap().call(get()).await.unwrap();
    let mut quiet = surely::client()
        .no_internal_headers()
        .build(transport)
        .unwrap();
    let mut batch = get();
    batch.extensions_mut().insert(Criticality::Sheddable);
    quiet.ready().await.unwrap().call(batch).await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            Some("sheddable".to_owned()),
            Some("sheddable-plus".to_owned()),
            None,
            None
        ]
    );
}
