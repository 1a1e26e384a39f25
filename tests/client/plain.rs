//! The client stack around a plain service: a `tower::service_fn` with a request type of its
//! own and a `u64` (or a response type of its own) for an answer, through the public API only,
//! as a new user writes it (paused time).

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use surely::classify::{
    self, AttemptClass, Attempted, Classification, Classified, Classify, ClassifyError,
    DeliveryPhase, HttpClassifier, MakeClassifier,
};
use surely::hedge::{HedgeDelay, HedgeLayer};
use surely::record::InMemoryRecorder;
use surely::retry::backoff::Backoff;
use surely::{Envelope, Outcome, Semantics, StopReason};
use tower::{service_fn, Service, ServiceExt};

use crate::support::call;
use crate::support::time::{ms, secs};

/// A read: safe to send again.
#[derive(Clone, Debug)]
struct GetPrice {
    id: u64,
}

impl Envelope for GetPrice {
    fn semantics(&self) -> Semantics {
        Semantics::Safe
    }
}

/// A write with the default semantics: non-idempotent, never sent again once it may have
/// reached the server.
#[derive(Clone, Debug)]
struct PlaceOrder;

impl Envelope for PlaceOrder {}

/// A service that fails its first `failures` attempts with `kind`, then answers `answer`, and
/// counts the attempts.
fn flaky<Req: Send + 'static, Res: Clone + Send + 'static>(
    failures: u32,
    kind: io::ErrorKind,
    answer: Res,
    attempts: &Arc<AtomicU32>,
) -> impl Service<
    Req,
    Response = Res,
    Error = io::Error,
    Future = impl std::future::Future<Output = io::Result<Res>> + Send + use<Req, Res>,
> + Clone
       + use<Req, Res> {
    let attempts = attempts.clone();
    service_fn(move |_req: Req| {
        let n = attempts.fetch_add(1, Ordering::SeqCst);
        let answer = answer.clone();
        async move {
            if n < failures {
                Err(io::Error::from(kind))
            } else {
                Ok(answer)
            }
        }
    })
}

#[tokio::test(start_paused = true)]
async fn the_default_client_wraps_a_plain_service_as_it_is() {
    let prices = service_fn(|req: GetPrice| async move { Ok::<u64, io::Error>(req.id * 100) });
    let mut client = surely::client().build(prices).unwrap();

    let price = client
        .ready()
        .await
        .unwrap()
        .call(GetPrice { id: 7 })
        .await
        .unwrap();
    assert_eq!(price, 700);
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_retried_for_a_safe_request() {
    let attempts = Arc::new(AtomicU32::new(0));
    let prices = flaky(1, io::ErrorKind::ConnectionRefused, 700_u64, &attempts);
    let recorder = InMemoryRecorder::new();
    let mut client = surely::client()
        .recorder(recorder.clone())
        .build(prices)
        .unwrap();

    assert_eq!(call(&mut client, GetPrice { id: 7 }).await.unwrap(), 700);
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    let record = &recorder.calls()[0];
    assert_eq!(record.outcome, Outcome::Succeeded);
    assert_eq!(record.attempts, 2);
    assert_eq!(record.semantics, Semantics::Safe);
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_retried_for_a_write_too_as_nothing_was_sent() {
    let attempts = Arc::new(AtomicU32::new(0));
    let orders = flaky(
        1,
        io::ErrorKind::ConnectionRefused,
        String::from("o-1"),
        &attempts,
    );
    let mut client = surely::client().build(orders).unwrap();

    assert_eq!(call(&mut client, PlaceOrder).await.unwrap(), "o-1");
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_write_is_not_sent_again_after_a_failure_once_sent_and_its_outcome_is_unknown() {
    let attempts = Arc::new(AtomicU32::new(0));
    let orders = flaky(
        1,
        io::ErrorKind::ConnectionReset,
        String::from("o-1"),
        &attempts,
    );
    let mut client = surely::client().build(orders).unwrap();

    let err = call(&mut client, PlaceOrder).await.unwrap_err();
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        1,
        "the order may have been placed"
    );
    assert_eq!(err.outcome(), Outcome::Unknown);
    assert_eq!(err.stop_reason(), Some(StopReason::Unknown));
    assert_eq!(err.attempts(), 1);
    assert_eq!(
        err.transport_ref().map(io::Error::kind),
        Some(io::ErrorKind::ConnectionReset)
    );
}

#[tokio::test(start_paused = true)]
async fn a_read_is_sent_again_after_a_failure_once_sent() {
    let attempts = Arc::new(AtomicU32::new(0));
    let prices = flaky(1, io::ErrorKind::ConnectionReset, 700_u64, &attempts);
    let mut client = surely::client().build(prices).unwrap();

    assert_eq!(call(&mut client, GetPrice { id: 7 }).await.unwrap(), 700);
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_write_that_hangs_past_its_attempt_timeout_is_unknown_and_not_sent_again() {
    let attempts = Arc::new(AtomicU32::new(0));
    let seen = attempts.clone();
    let orders = service_fn(move |_req: PlaceOrder| {
        seen.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<io::Result<u64>>()
    });
    let mut client = surely::client()
        .timeout(secs(5))
        .per_try_timeout(ms(500))
        .build(orders)
        .unwrap();

    let err = call(&mut client, PlaceOrder).await.unwrap_err();
    assert!(err.is_elapsed(), "{err}");
    assert_eq!(err.outcome(), Outcome::Unknown);
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_error_that_says_the_request_cannot_be_sent_is_final() {
    // `InvalidInput`: the request could not even be sent, and sending it again would not help.
    let attempts = Arc::new(AtomicU32::new(0));
    let prices = flaky(1, io::ErrorKind::InvalidInput, 700_u64, &attempts);
    let mut client = surely::client().build(prices).unwrap();

    let err = call(&mut client, GetPrice { id: 7 }).await.unwrap_err();
    assert_eq!(err.outcome(), Outcome::Failed);
    assert_eq!(err.stop_reason(), Some(StopReason::Final));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}

/// A response type of the service's own, whose answers can say "try later".
#[derive(Clone, Debug, PartialEq)]
enum Quote {
    Price(u64),
    Busy,
}

impl Envelope for Quote {}

#[tokio::test(start_paused = true)]
async fn a_response_type_of_your_own_is_a_success_by_default() {
    let quotes = service_fn(|_req: GetPrice| async { Ok::<_, io::Error>(Quote::Busy) });
    let mut client = surely::client().build(quotes).unwrap();

    // The default classifier cannot know what `Busy` means: the service answered.
    assert_eq!(
        call(&mut client, GetPrice { id: 7 }).await.unwrap(),
        Quote::Busy
    );
}

#[tokio::test(start_paused = true)]
async fn a_classifier_in_three_lines_retries_what_the_service_calls_busy() {
    let attempts = Arc::new(AtomicU32::new(0));
    let seen = attempts.clone();
    let quotes = service_fn(move |_req: GetPrice| {
        let busy = seen.fetch_add(1, Ordering::SeqCst) == 0;
        async move { Ok::<_, io::Error>(if busy { Quote::Busy } else { Quote::Price(700) }) }
    });
    let busy_is_rejected =
        |attempt: Attempted<'_, Quote, surely::Error<io::Error>>, _| match attempt {
            Attempted::Response(Quote::Busy) => {
                Classification::new(AttemptClass::Rejected, DeliveryPhase::ResponseStarted)
            }
            Attempted::Response(_) => Classification::success(),
            Attempted::Error(e, phase) => e.classify_error(phase),
        };
    let mut client = surely::client()
        .classifier(classify::from_fn(busy_is_rejected))
        .retry(|r| r.backoff(Backoff::none()))
        .build(quotes)
        .unwrap();

    assert_eq!(
        call(&mut client, GetPrice { id: 7 }).await.unwrap(),
        Quote::Price(700)
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_slow_read_of_a_plain_service_is_hedged() {
    let attempts = Arc::new(AtomicU32::new(0));
    let seen = attempts.clone();
    let prices = service_fn(move |req: GetPrice| {
        let first = seen.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                tokio::time::sleep(secs(1)).await;
            }
            Ok::<u64, io::Error>(req.id * 100)
        }
    });
    let mut client = surely::client()
        .hedge(HedgeLayer::builder().delay(HedgeDelay::fixed(ms(50))))
        .build(prices)
        .unwrap();

    let started = tokio::time::Instant::now();
    assert_eq!(call(&mut client, GetPrice { id: 7 }).await.unwrap(), 700);
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert_eq!(started.elapsed(), ms(50), "the hedge answered");
}

#[test]
fn the_default_classifier_takes_an_answer_without_a_status_as_a_success() {
    let classifier = HttpClassifier::new().make_classifier(&GetPrice { id: 7 });
    let Classified::Ready(c) =
        Classify::<u64, surely::Error<io::Error>>::classify_response(classifier, &700)
    else {
        panic!("a plain answer is classified at once");
    };
    assert_eq!(c.class(), AttemptClass::Success);
    assert_eq!(c.phase(), DeliveryPhase::ResponseStarted);
    assert_eq!(700_u64.status(), None);
    assert_eq!(
        Envelope::status(&http::Response::new(())),
        Some(http::StatusCode::OK)
    );
}
