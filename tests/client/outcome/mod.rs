//! The outcome on the return path: every call hands its outcome back with its response or its
//! error, whatever the recorder, and it is the outcome its record says (paused time, in-memory
//! transports; `keys.rs` has the real-hyper cases of the key rule in `surely::docs::keys`).

mod keys;
mod records;

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use surely::breaker::CircuitBreaker;
use surely::deadline::{Deadline, SetDeadlineLayer};
use surely::headers::IDEMPOTENCY_KEY;
use surely::headers::KEY_IN_FLIGHT;
use surely::hedge::{HedgeDelay, HedgeLayer};
use surely::record::{InMemoryRecorder, RecordCallLayer};
use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;
use surely::{CallOutcome, Error, ErrorKind, Outcome, OutcomeExt, Semantics, StopReason};
use tower::{service_fn, Layer, Service, ServiceBuilder};

use crate::support::call;
use crate::support::time::ms;

type Res = Response<String>;

fn reply(status: u16) -> Res {
    Response::builder()
        .status(status)
        .body(String::new())
        .unwrap()
}

fn post() -> Request<String> {
    Request::post("/payments")
        .body("42 EUR".to_owned())
        .unwrap()
}

fn get() -> Request<String> {
    Request::get("/payments/p-1").body(String::new()).unwrap()
}

/// A transport that answers `status` to every attempt, and counts them.
fn answers(
    status: u16,
    count: &Arc<AtomicU32>,
) -> impl Service<
    Request<String>,
    Response = Res,
    Error = std::io::Error,
    Future = impl Future<Output = Result<Res, std::io::Error>> + Send + use<>,
> + Clone
       + use<> {
    let count = count.clone();
    service_fn(move |_req: Request<String>| {
        count.fetch_add(1, Ordering::SeqCst);
        async move { Ok(reply(status)) }
    })
}

// ---- an HTTP response is not a verdict ------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_500_on_an_unkeyed_post_is_the_servers_response_with_outcome_unknown() {
    let count = Arc::new(AtomicU32::new(0));
    // The default client, told nothing about its server: its generated key promises nothing.
    let mut client = surely::client().build(answers(500, &count)).unwrap();
    let res = call(&mut client, post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(res.outcome(), Outcome::Unknown);
    let call = res.call_outcome().unwrap();
    assert_eq!(call.attempts(), 1);
    assert_eq!(call.stop_reason(), StopReason::Unknown);
    assert!(
        call.idempotency_key().is_some(),
        "the generated key is named"
    );
    assert!(!call.is_replayed());
    assert_eq!(count.load(Ordering::SeqCst), 1, "not sent again");
}

#[tokio::test(start_paused = true)]
async fn a_400_is_failed_and_a_read_that_failed_is_failed() {
    let count = Arc::new(AtomicU32::new(0));
    let mut client = surely::client().build(answers(400, &count)).unwrap();
    let res = call(&mut client, post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(res.outcome(), Outcome::Failed);
    assert_eq!(res.call_outcome().unwrap().stop_reason(), StopReason::Final);

    // A read has no effect to lose track of: a 502 after every retry is a failure.
    let count = Arc::new(AtomicU32::new(0));
    let mut client = surely::client()
        .retry(|r| r.backoff(Backoff::none()))
        .build(answers(502, &count))
        .unwrap();
    let res = call(&mut client, get()).await.unwrap();
    assert_eq!(res.outcome(), Outcome::Failed);
    let call = res.call_outcome().unwrap();
    assert_eq!(call.attempts(), 3);
    assert_eq!(call.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_that_ends_on_key_in_flight_at_the_deadline_is_unknown() {
    // The first attempt commits and never answers; every retry finds the key still in flight.
    let count = Arc::new(AtomicU32::new(0));
    let seen = count.clone();
    let transport = service_fn(move |_req: Request<String>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                std::future::pending::<()>().await;
            }
            Ok::<_, std::io::Error>(
                Response::builder()
                    .status(409)
                    .header(KEY_IN_FLIGHT, "true")
                    .header(http::header::RETRY_AFTER, "1")
                    .body(String::new())
                    .unwrap(),
            )
        }
    });
    let mut client = surely::client()
        .timeout(Duration::from_secs(2))
        .per_try_timeout(ms(300))
        .retry(|r| r.max_attempts(10))
        .build(transport)
        .unwrap();
    let mut req = post();
    req.headers_mut()
        .insert(IDEMPOTENCY_KEY, HeaderValue::from_static("pay-p-1"));
    let res = call(&mut client, req).await.unwrap();
    // The caller gets the server's last answer, and the truth about it.
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(res.outcome(), Outcome::Unknown);
    let call = res.call_outcome().unwrap();
    // The last 409 asked for a second the deadline did not have: its pushback stopped the call.
    assert_eq!(call.stop_reason(), StopReason::PushbackStop);
    assert_eq!(call.attempts(), count.load(Ordering::SeqCst));
    assert!(call.attempts() >= 2);
    assert_eq!(call.idempotency_key().unwrap(), "pay-p-1");
    assert!(call.budget_left().unwrap() < Duration::from_secs(1));
}

// ---- errors say what the call came to ----------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_transport_error_after_three_attempts_says_so() {
    let count = Arc::new(AtomicU32::new(0));
    let seen = count.clone();
    let refused = service_fn(move |_req: Request<String>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async { Err::<Res, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) }
    });
    let mut client = surely::client()
        .retry(|r| r.backoff(Backoff::none()))
        .build(refused)
        .unwrap();
    let err = call(&mut client, post()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "failed after 3 attempts (not sent): connection refused"
    );
    assert_eq!(err.outcome(), Outcome::Failed);
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.stop_reason(), Some(StopReason::AttemptsExhausted));
    assert!(
        matches!(err.kind(), ErrorKind::Transport(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
    );
    // The whole result reads the same.
    let result: Result<Res, _> = Err(err);
    assert_eq!(result.outcome(), Outcome::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_reset_after_send_on_an_unkeyed_post_is_unknown_after_one_attempt() {
    let count = Arc::new(AtomicU32::new(0));
    let seen = count.clone();
    let reset = service_fn(move |_req: Request<String>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async { Err::<Res, _>(std::io::Error::from(std::io::ErrorKind::ConnectionReset)) }
    });
    let mut client = surely::client().build(reset).unwrap();
    let err = call(&mut client, post()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown after 1 attempt (sent): connection reset"
    );
    assert_eq!(err.stop_reason(), Some(StopReason::Unknown));
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn calls_refused_before_any_attempt_made_none() {
    let count = Arc::new(AtomicU32::new(0));
    let mut client = surely::client().build(answers(200, &count)).unwrap();

    // A spent deadline.
    let mut late = post();
    late.extensions_mut()
        .insert(Deadline::after(Duration::ZERO));
    tokio::time::advance(ms(1)).await;
    let err = call(&mut client, late).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::DeadlineExceeded(d) if d.is_refused()));
    assert_eq!(
        (err.outcome(), err.attempts(), err.stop_reason()),
        (Outcome::Failed, 0, Some(StopReason::Deadline))
    );
    assert!(err.to_string().starts_with("failed before any attempt: "));

    // An invalid key.
    let mut bad = post();
    bad.headers_mut()
        .insert(IDEMPOTENCY_KEY, HeaderValue::from_static("two words"));
    let err = call(&mut client, bad).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidKey(_)));
    assert_eq!(
        (err.outcome(), err.attempts(), err.stop_reason()),
        (Outcome::Failed, 0, Some(StopReason::Final))
    );
    assert_eq!(count.load(Ordering::SeqCst), 0);

    // An open breaker whose break outlasts the call's deadline.
    let breaker = CircuitBreaker::builder()
        .min_throughput(2)
        .break_duration(Duration::from_secs(60))
        .jitter(0.0)
        .build()
        .unwrap();
    let failing = Arc::new(AtomicU32::new(0));
    let mut down = surely::client()
        .timeout(Duration::from_secs(2))
        .breaker(breaker.clone())
        .retry(|r| r.backoff(Backoff::none()))
        .build(answers(503, &failing))
        .unwrap();
    // Two failures open it; the third try is refused and did not go out.
    let err = call(&mut down, get()).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::CircuitOpen(_)));
    assert_eq!((err.outcome(), err.attempts()), (Outcome::Failed, 2));
    let before = failing.load(Ordering::SeqCst);
    assert_eq!(before, 2);
    let err = call(&mut down, get()).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::CircuitOpen(_)));
    assert_eq!((err.outcome(), err.attempts()), (Outcome::Failed, 0));
    assert_eq!(failing.load(Ordering::SeqCst), before, "nothing went out");
}

// ---- any stack, any recorder ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_record_call_layer_alone_hands_the_outcome_back_with_no_recorder() {
    let count = Arc::new(AtomicU32::new(0));
    let mut svc = RecordCallLayer::new(()).layer(answers(502, &count));
    let res = call(&mut svc, post()).await.unwrap();
    assert_eq!(res.outcome(), Outcome::Unknown);
    let res = call(&mut svc, get()).await.unwrap();
    assert_eq!(res.outcome(), Outcome::Failed);
    let handed = res.call_outcome().unwrap();
    assert_eq!(
        (handed.attempts(), handed.stop_reason()),
        (1, StopReason::NotRetried)
    );

    // An error with nothing inside to hand its outcome back.
    let reset = service_fn(|_req: Request<String>| async {
        Err::<Res, _>(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    });
    let mut svc = RecordCallLayer::new(()).layer(reset);
    let err = call(&mut svc, post()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown after 1 attempt (sent): connection reset"
    );
}

#[tokio::test(start_paused = true)]
async fn the_outcome_handed_back_is_the_one_the_record_says() {
    // A mix: success, final, unknown, failed after retries, refused.
    let cases: Vec<(u16, Request<String>)> = vec![
        (200, post()),
        (400, post()),
        (500, post()),
        (503, get()),
        (502, get()),
    ];
    for (status, req) in cases {
        let count = Arc::new(AtomicU32::new(0));
        let records = InMemoryRecorder::new();
        let mut client = surely::client()
            .retry(|r| r.backoff(Backoff::none()))
            .recorder(records.clone())
            .build(answers(status, &count))
            .unwrap();
        let res = call(&mut client, req).await.unwrap();
        let handed = res.call_outcome().unwrap();
        let record = &records.calls()[0];
        assert_eq!(
            (handed.outcome(), handed.attempts(), handed.stop_reason()),
            (record.outcome, record.attempts, record.stop),
            "{status}"
        );
        assert_eq!(handed.attempts(), count.load(Ordering::SeqCst), "{status}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_deadline_that_cuts_a_retrying_call_short_hands_back_what_its_attempts_came_to() {
    // No attempt timeout inside: the deadline layer's own timer ends the call, dropping the
    // retry layer's future with its second attempt in flight.
    for (req, semantics, outcome) in [
        (post(), Semantics::NonIdempotent, Outcome::Unknown),
        (get(), Semantics::Safe, Outcome::Failed),
    ] {
        let count = Arc::new(AtomicU32::new(0));
        let seen = count.clone();
        let transport = service_fn(move |_req: Request<String>| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    // Refused: retried for any request.
                    return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
                }
                std::future::pending::<()>().await;
                Ok::<Res, _>(reply(200))
            }
        });
        let records = InMemoryRecorder::new();
        let mut client = ServiceBuilder::new()
            .layer(RecordCallLayer::new(records.clone()))
            .layer(SetDeadlineLayer::new(Duration::from_secs(1)))
            .layer(
                RetryLayer::builder()
                    .backoff(Backoff::none())
                    .build()
                    .unwrap(),
            )
            .service(transport);
        let err = call(&mut client, req).await.unwrap_err();
        assert!(err.is_deadline_exceeded(), "{semantics:?}: {err}");
        let handed = err.call_outcome().unwrap();
        assert_eq!(handed.outcome(), outcome, "{semantics:?}");
        assert_eq!(handed.attempts(), 2, "{semantics:?}");
        assert_eq!(handed.stop_reason(), StopReason::Deadline, "{semantics:?}");
        assert_eq!(handed.budget_left(), Some(Duration::ZERO));
        let record = &records.calls()[0];
        assert_eq!(record.outcome, outcome, "{semantics:?}");
        assert_eq!(record.stop, StopReason::Deadline, "{semantics:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_hedged_read_counts_every_copy_it_sent() {
    let count = Arc::new(AtomicU32::new(0));
    let seen = count.clone();
    let slow_first = service_fn(move |_req: Request<String>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                tokio::time::sleep(ms(300)).await;
            }
            Ok::<_, std::io::Error>(reply(200))
        }
    });
    let mut client = surely::client()
        .hedge(HedgeLayer::builder().delay(HedgeDelay::fixed(ms(50))))
        .build(slow_first)
        .unwrap();
    let res = call(&mut client, get()).await.unwrap();
    let handed = res.call_outcome().unwrap();
    assert_eq!(handed.outcome(), Outcome::Succeeded);
    assert_eq!(handed.attempts(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_budget_left_and_the_replay_mark() {
    let replayed = service_fn(|_req: Request<String>| async {
        tokio::time::sleep(ms(400)).await;
        Ok::<_, std::io::Error>(
            Response::builder()
                .status(201)
                .header("idempotent-replayed", "true")
                .body(String::new())
                .unwrap(),
        )
    });
    let mut client = surely::client()
        .timeout(Duration::from_secs(2))
        .build(replayed)
        .unwrap();
    let res = call(&mut client, post()).await.unwrap();
    assert!(res.is_replayed());
    assert_eq!(
        res.call_outcome().unwrap().budget_left(),
        Some(Duration::from_millis(1600))
    );

    // A call that answers at once never started its clock: it has all of its budget.
    let count = Arc::new(AtomicU32::new(0));
    let mut client = surely::client()
        .timeout(Duration::from_secs(2))
        .build(answers(200, &count))
        .unwrap();
    let res = call(&mut client, get()).await.unwrap();
    assert_eq!(
        res.call_outcome().unwrap().budget_left(),
        Some(Duration::from_secs(2))
    );
    assert!(!res.is_replayed());
}

#[test]
fn an_error_no_call_layer_saw_says_what_it_alone_proves() {
    let reset: Error<std::io::Error> = Error::transport(std::io::ErrorKind::ConnectionReset.into());
    assert_eq!(reset.to_string(), "connection reset");
    assert_eq!(reset.call_outcome(), None);
    assert_eq!(reset.stop_reason(), None);
    assert_eq!((reset.outcome(), reset.attempts()), (Outcome::Unknown, 1));
    let refused: Error<std::io::Error> = surely::deadline::DeadlineExceeded::refused().into();
    assert_eq!(
        (refused.outcome(), refused.attempts()),
        (Outcome::Failed, 0)
    );
    // A response nobody vouched for says unknown.
    assert_eq!(reply(200).outcome(), Outcome::Unknown);
    assert_eq!(reply(200).call_outcome(), None);
    // An SDK's tests can make one.
    let mut res = reply(500);
    res.extensions_mut()
        .insert(CallOutcome::new(Outcome::Unknown, StopReason::Unknown, 1));
    assert_eq!(res.outcome(), Outcome::Unknown);
}
