//! Settling unknown outcomes with a resolver, and the learned minimum attempt time.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use surely::classify::AttemptClass;
use surely::deadline::SetDeadlineLayer;
use surely::fault::{Fault, InjectFaultLayer, Schedule};
use surely::record::{BusinessKey, InMemoryRecorder, RecordAttemptLayer, RecordCallLayer};
use surely::retry::backoff::Backoff;
use surely::retry::{Query, Resolution, Resolve, RetryLayer};
use surely::timeout::AttemptTimeoutLayer;
use surely::Outcome;
use surely::StopReason;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

use super::support::{ms, Probe, Req, Res, PER_TRY};

/// A resolver that looks the business key up in `orders` and remembers what it was asked.
#[derive(Clone, Default)]
struct Lookup {
    orders: Arc<Mutex<Vec<String>>>,
    asked: Arc<Mutex<Vec<Query>>>,
    down: bool,
}

impl Lookup {
    fn holding(orders: &[&str]) -> Self {
        Lookup {
            orders: Arc::new(Mutex::new(orders.iter().map(|o| o.to_string()).collect())),
            ..Lookup::default()
        }
    }

    fn asked(&self) -> Vec<Query> {
        self.asked.lock().unwrap().clone()
    }
}

impl Resolve<Res> for Lookup {
    fn resolve(&self, query: Query) -> Option<surely::retry::Resolving<Res>> {
        self.asked.lock().unwrap().push(query.clone());
        let key = query.key?;
        let found = self
            .orders
            .lock()
            .unwrap()
            .contains(&key.as_str().to_owned());
        let down = self.down;
        Some(surely::retry::Resolving::new(async move {
            // The query takes a round trip of its own.
            tokio::time::sleep(ms(5)).await;
            match (down, found) {
                (true, _) => Resolution::Unknown,
                (false, true) => Resolution::Succeeded(Response::new(format!("found {key}"))),
                (false, false) => Resolution::Failed,
            }
        }))
    }
}

fn post(key: Option<&str>) -> Req {
    let mut req = Request::post("/orders").body(String::from("o-2")).unwrap();
    if let Some(key) = key {
        req.extensions_mut().insert(BusinessKey::new(key));
    }
    req
}

async fn call_with<Z>(
    resolver: Z,
    faults: Schedule,
    req: Req,
    probe: &Probe,
) -> (Result<Res, surely::Error<io::Error>>, InMemoryRecorder)
where
    Z: Resolve<Res> + Send + Sync + 'static,
{
    let recorder = InMemoryRecorder::new();
    let retry = RetryLayer::builder()
        .backoff(Backoff::none())
        .no_budget()
        .resolver(resolver)
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(RecordCallLayer::new(recorder.clone()))
        .layer(SetDeadlineLayer::new(Duration::from_secs(5)))
        .layer(retry)
        .layer(RecordAttemptLayer::new(recorder.clone()))
        .layer(AttemptTimeoutLayer::new(PER_TRY))
        .layer(InjectFaultLayer::new(faults))
        .service(probe.service());
    let out = svc.ready().await.unwrap().call(req).await;
    (out, recorder)
}

#[tokio::test(start_paused = true)]
async fn an_unknown_post_is_settled_as_succeeded_by_looking_up_its_key() {
    let probe = Probe::new();
    let lookup = Lookup::holding(&["o-2"]);
    let (out, recorder) = call_with(
        lookup.clone(),
        Schedule::new().at(0, Fault::ResetAfterSend),
        post(Some("o-2")),
        &probe,
    )
    .await;

    // The reply was lost after the commit: not retried, then found by the query.
    assert_eq!(out.unwrap().body(), "found o-2");
    assert_eq!(probe.calls(), 1);
    let asked = lookup.asked();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].key.as_ref().unwrap().as_str(), "o-2");
    assert_eq!(asked[0].attempts, 1);
    assert_eq!(asked[0].last.class(), AttemptClass::MaybeCommitted);
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Succeeded);
    assert_eq!(call.stop, StopReason::Unknown);
    let query = call.resolution.expect("the record shows the query");
    assert_eq!(query.answer, Outcome::Succeeded);
    assert_eq!(query.ended - query.started, ms(5));
    assert!(call.to_string().contains("resolved=succeeded"), "{call}");
}

#[tokio::test(start_paused = true)]
async fn a_query_that_finds_nothing_makes_the_call_failed_with_the_last_error() {
    let probe = Probe::new();
    let (out, recorder) = call_with(
        Lookup::holding(&[]),
        Schedule::new().at(0, Fault::ResetAfterSend),
        post(Some("o-2")),
        &probe,
    )
    .await;

    assert!(out.unwrap_err().injected().is_some());
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Failed);
    assert_eq!(call.resolution.unwrap().answer, Outcome::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_query_that_cannot_tell_leaves_the_call_unknown() {
    let probe = Probe::new();
    let mut lookup = Lookup::holding(&["o-2"]);
    lookup.down = true;
    let (out, recorder) = call_with(
        lookup,
        Schedule::new().at(0, Fault::ResetAfterSend),
        post(Some("o-2")),
        &probe,
    )
    .await;

    assert!(out.is_err());
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Unknown);
    assert_eq!(call.resolution.unwrap().answer, Outcome::Unknown);
}

#[tokio::test(start_paused = true)]
async fn a_resolver_may_decline_a_call_without_a_key() {
    let probe = Probe::new();
    let lookup = Lookup::holding(&["o-2"]);
    let (out, recorder) = call_with(
        lookup.clone(),
        Schedule::new().at(0, Fault::ResetAfterSend),
        post(None),
        &probe,
    )
    .await;

    assert!(out.is_err());
    assert_eq!(lookup.asked().len(), 1, "asked, and declined");
    let call = &recorder.calls()[0];
    assert_eq!(call.outcome, Outcome::Unknown);
    assert!(call.resolution.is_none());
}

#[tokio::test(start_paused = true)]
async fn known_outcomes_are_not_queried() {
    let lookup = Lookup::holding(&["o-2"]);
    // A success, a final answer, a refused POST (failed: nothing happened), and a GET whose
    // resets ran out of attempts (failed: a read has no effect).
    let cases: Vec<(Schedule, Req)> = vec![
        (Schedule::new(), post(Some("o-2"))),
        (
            Schedule::new().at(0, Fault::Respond(StatusCode::BAD_REQUEST.into())),
            post(Some("o-2")),
        ),
        (
            Schedule::new().otherwise(Fault::RefuseBeforeSend),
            post(Some("o-2")),
        ),
        (
            Schedule::new().otherwise(Fault::ResetAfterSend),
            Request::get("/orders/o-2").body(String::new()).unwrap(),
        ),
    ];
    for (faults, req) in cases {
        let probe = Probe::new();
        let (_, recorder) = call_with(lookup.clone(), faults, req, &probe).await;
        assert_ne!(recorder.calls()[0].outcome, Outcome::Unknown);
    }
    assert!(lookup.asked().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_is_settled_by_its_retry_not_by_the_resolver() {
    let probe = Probe::new();
    let lookup = Lookup::holding(&["o-2"]);
    let mut req = post(Some("o-2"));
    req.headers_mut()
        .insert(surely::headers::IDEMPOTENCY_KEY, "k-2".parse().unwrap());
    let (out, recorder) = call_with(
        lookup.clone(),
        Schedule::new().at(0, Fault::ResetAfterSend),
        req,
        &probe,
    )
    .await;

    assert_eq!(out.unwrap().body(), "ok");
    assert_eq!(probe.calls(), 2);
    assert!(lookup.asked().is_empty());
    assert_eq!(recorder.calls()[0].outcome, Outcome::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn a_closure_resolves_too() {
    let probe = Probe::new();
    let resolver = |q: Query| async move {
        match q.key {
            Some(_) => Resolution::Succeeded(Response::new(String::from("settled"))),
            None => Resolution::Unknown,
        }
    };
    let (out, _) = call_with(
        resolver,
        Schedule::new().at(0, Fault::ResetAfterSend),
        post(Some("o-9")),
        &probe,
    )
    .await;
    assert_eq!(out.unwrap().body(), "settled");
}

#[tokio::test(start_paused = true)]
async fn the_query_is_bounded_by_the_call_deadline() {
    let probe = Probe::new();
    let hangs = |_: Query| async {
        std::future::pending::<()>().await;
        Resolution::<Res>::Unknown
    };
    let start = tokio::time::Instant::now();
    let (out, recorder) = call_with(
        hangs,
        Schedule::new().at(0, Fault::ResetAfterSend),
        post(Some("o-2")),
        &probe,
    )
    .await;
    assert!(out.unwrap_err().is_deadline_exceeded());
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(recorder.calls()[0].outcome, Outcome::Unknown);
}

// ---- learned minimum attempt time ------------------------------------------------------------

/// A transport whose every answer takes 300 ms: 200 until `fail_from`, then 503 (no pushback).
fn slow_transport(
    calls: Arc<AtomicUsize>,
    fail_from: usize,
) -> impl Service<Req, Response = Res, Error = io::Error> + Clone {
    service_fn(move |_req: Req| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(ms(300)).await;
            let mut res = Response::new(String::from("ok"));
            if n >= fail_from {
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            Ok::<_, io::Error>(res)
        }
    })
}

async fn attempts_of_a_tight_call(retry: RetryLayer) -> (u32, StopReason) {
    let calls = Arc::new(AtomicUsize::new(0));
    let recorder = InMemoryRecorder::new();
    let mut svc = ServiceBuilder::new()
        .layer(RecordCallLayer::new(recorder.clone()))
        .layer(retry)
        .layer(RecordAttemptLayer::new(recorder.clone()))
        .service(slow_transport(calls, 8));
    // Eight calls teach the layer that an attempt takes 300 ms.
    for _ in 0..8 {
        let req = Request::get("/orders/o-1").body(String::new()).unwrap();
        svc.ready().await.unwrap().call(req).await.unwrap();
    }
    // Then a call with 500 ms whose first attempt is rejected after 300 ms.
    let mut req = Request::get("/orders/o-1").body(String::new()).unwrap();
    let deadline = surely::deadline::Deadline::after(ms(500));
    req.extensions_mut().insert(deadline);
    let _ = svc.ready().await.unwrap().call(req).await;
    let call = recorder.calls().pop().unwrap();
    (call.attempts, call.stop)
}

fn tight_retry() -> surely::retry::RetryLayerBuilder {
    RetryLayer::builder()
        .backoff(Backoff::none())
        .no_budget()
        .min_attempt_time(ms(10))
}

#[tokio::test(start_paused = true)]
async fn a_learned_attempt_time_refuses_a_retry_that_cannot_finish() {
    // With 200 ms left, a fixed 10 ms minimum starts a retry that the deadline then cuts.
    let (attempts, _) = attempts_of_a_tight_call(tight_retry().build().unwrap()).await;
    assert_eq!(attempts, 2);

    // Having seen attempts take 300 ms, the layer does not start one with 200 ms left.
    let learned = tight_retry().learn_min_attempt_time(0.9).build().unwrap();
    let (attempts, stop) = attempts_of_a_tight_call(learned).await;
    assert_eq!(attempts, 1);
    assert_eq!(stop, StopReason::Deadline);
}

#[test]
fn a_learned_quantile_outside_zero_to_one_is_refused() {
    for q in [0.0, -0.5, 1.5, f64::NAN] {
        let err = RetryLayer::builder()
            .learn_min_attempt_time(q)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("quantile"), "{err}");
    }
    assert!(RetryLayer::builder()
        .learn_min_attempt_time(1.0)
        .build()
        .is_ok());
}
