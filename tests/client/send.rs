//! `send`: the typed call, and the outcome of any answer (`Reply`), through the public API only;
//! an error type of one's own in one trait (`TransportError`). Paused time.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use surely::classify::{self, AttemptClass, Attempted, Classification, DeliveryPhase};
use surely::record::InMemoryRecorder;
use surely::{Envelope, Outcome, OutcomeExt, Semantics, StopReason, TransportError};
use tower::service_fn;

/// A read: safe to send again.
#[derive(Clone, Debug)]
struct GetPrice(u64);

impl Envelope for GetPrice {
    fn semantics(&self) -> Semantics {
        Semantics::Safe
    }
}

/// A write with the default semantics: never sent again once it may have reached the server.
#[derive(Clone, Debug)]
struct PlaceOrder(u32);

impl Envelope for PlaceOrder {}

#[derive(Debug, PartialEq)]
struct Placed(u32);

impl Envelope for Placed {}

/// An error type of one's own, in one trait.
#[derive(Debug, PartialEq)]
enum ShopError {
    /// A business "no": the shop answered.
    OutOfStock,
    /// Never reached the shop.
    Unreachable,
    /// The connection was lost after the order went out.
    Lost,
}

impl TransportError for ShopError {
    fn classify(&self, phase: DeliveryPhase) -> Classification {
        match self {
            ShopError::OutOfStock => {
                Classification::new(AttemptClass::Final, DeliveryPhase::ResponseStarted)
            }
            ShopError::Unreachable => Classification::failure_at(DeliveryPhase::NotSent),
            ShopError::Lost => Classification::failure_at(phase),
        }
    }
}

/// An error type that says nothing of itself: the one-line impl.
#[derive(Debug)]
struct Opaque;

impl TransportError for Opaque {}

/// A shop that answers each attempt with the next of `answers` (the last one repeats; `Ok`
/// places the order), and counts the attempts.
fn shop(
    answers: Vec<Result<(), ShopError>>,
    attempts: &Arc<AtomicU32>,
) -> impl tower::Service<
    PlaceOrder,
    Response = Placed,
    Error = ShopError,
    Future = impl std::future::Future<Output = Result<Placed, ShopError>> + Send + use<>,
> + Clone
       + use<> {
    let attempts = attempts.clone();
    let answers = Arc::new(answers);
    service_fn(move |req: PlaceOrder| {
        let n = attempts.fetch_add(1, Ordering::SeqCst) as usize;
        let answers = answers.clone();
        async move {
            match &answers[n.min(answers.len() - 1)] {
                Ok(()) => Ok(Placed(req.0)),
                Err(ShopError::OutOfStock) => Err(ShopError::OutOfStock),
                Err(ShopError::Unreachable) => Err(ShopError::Unreachable),
                Err(ShopError::Lost) => Err(ShopError::Lost),
            }
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_plain_answer_comes_back_with_its_attempts() {
    let attempts = Arc::new(AtomicU32::new(0));
    let mut client = surely::client()
        .build(shop(vec![Err(ShopError::Unreachable), Ok(())], &attempts))
        .unwrap();
    let res = client.send(PlaceOrder(7)).await;
    assert_eq!(res.outcome(), Outcome::Succeeded);
    assert_eq!(res.attempts(), 2);
    let reply = res.unwrap();
    assert_eq!(
        reply.call_outcome().map(|c| c.stop_reason()),
        Some(StopReason::Success)
    );
    assert_eq!(*reply, Placed(7));
    assert_eq!(reply.into_inner(), Placed(7));
}

#[tokio::test(start_paused = true)]
async fn a_business_no_is_final_and_not_sent_again() {
    let attempts = Arc::new(AtomicU32::new(0));
    let mut client = surely::client()
        .build(shop(vec![Err(ShopError::OutOfStock)], &attempts))
        .unwrap();
    let res = client.send(PlaceOrder(1)).await;
    assert_eq!((res.outcome(), res.attempts()), (Outcome::Failed, 1));
    let err = res.unwrap_err();
    assert_eq!(err.transport_ref(), Some(&ShopError::OutOfStock));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_lost_write_is_unknown_and_not_sent_again() {
    let attempts = Arc::new(AtomicU32::new(0));
    let mut client = surely::client()
        .build(shop(vec![Err(ShopError::Lost), Ok(())], &attempts))
        .unwrap();
    let res = client.send(PlaceOrder(1)).await;
    assert_eq!((res.outcome(), res.attempts()), (Outcome::Unknown, 1));
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn the_one_line_impl_proves_nothing() {
    // A failure of an error type that says nothing counts as sent: a write ends unknown, a
    // read is tried again.
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let opaque = service_fn(move |_: GetPrice| {
        seen.fetch_add(1, Ordering::SeqCst);
        async { Err::<u64, _>(Opaque) }
    });
    let mut client = surely::client().build(opaque).unwrap();
    let res = client.send(GetPrice(1)).await;
    assert_eq!((res.outcome(), res.attempts()), (Outcome::Failed, 3));
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    let write = service_fn(|_: PlaceOrder| async { Err::<Placed, _>(Opaque) });
    let mut client = surely::client().build(write).unwrap();
    let res = client.send(PlaceOrder(1)).await;
    assert_eq!((res.outcome(), res.attempts()), (Outcome::Unknown, 1));
}

#[tokio::test(start_paused = true)]
async fn an_answer_the_classifier_refuses_is_a_failed_reply() {
    // A plain answer that says "busy" every time: the call fails after its attempts, and the
    // reply says so though the answer came back `Ok`.
    #[derive(Debug, PartialEq)]
    enum Quote {
        Busy,
    }
    impl Envelope for Quote {}
    let quotes = service_fn(|_: GetPrice| async { Ok::<_, io::Error>(Quote::Busy) });
    let mut client = surely::client()
        .classifier(classify::from_fn(
            |attempt: Attempted<'_, Quote, surely::Error<io::Error>>, _| match attempt {
                Attempted::Response(_) => {
                    Classification::new(AttemptClass::Rejected, DeliveryPhase::ResponseStarted)
                }
                Attempted::Error(..) => Classification::failure_at(DeliveryPhase::Sent),
            },
        ))
        .build(quotes)
        .unwrap();
    let res = client.send(GetPrice(1)).await;
    assert_eq!((res.outcome(), res.attempts()), (Outcome::Failed, 3));
    assert_eq!(*res.unwrap(), Quote::Busy);
}

#[tokio::test(start_paused = true)]
async fn a_nested_call_inside_an_attempt_does_not_lend_its_outcome() {
    // The transport itself calls another surely client, whose call takes three attempts; the
    // outer call took one.
    let inner_attempts = Arc::new(AtomicU32::new(0));
    let inner = surely::client()
        .build(shop(
            vec![
                Err(ShopError::Unreachable),
                Err(ShopError::Unreachable),
                Ok(()),
            ],
            &inner_attempts,
        ))
        .unwrap();
    let outer = service_fn(move |req: GetPrice| {
        let mut inner = inner.clone();
        async move {
            let placed = tower::ServiceExt::oneshot(&mut inner, PlaceOrder(req.0 as u32))
                .await
                .map_err(|_| io::Error::from(io::ErrorKind::Other))?;
            Ok::<_, io::Error>(u64::from(placed.0))
        }
    });
    let mut client = surely::client().build(outer).unwrap();
    let res = client.send(GetPrice(9)).await;
    assert_eq!((res.outcome(), res.attempts()), (Outcome::Succeeded, 1));
    assert_eq!(inner_attempts.load(Ordering::SeqCst), 3);
    assert_eq!(res.unwrap().into_inner(), 9);
}

#[tokio::test(start_paused = true)]
async fn an_http_reply_reads_the_outcome_from_its_response() {
    let recorder = InMemoryRecorder::new();
    let echo = service_fn(|req: http::Request<String>| async move {
        Ok::<_, io::Error>(http::Response::new(req.into_body()))
    });
    let mut client = surely::client()
        .recorder(recorder.clone())
        .build(echo)
        .unwrap();
    let req = http::Request::get("http://127.0.0.1/ping")
        .body("ping".to_owned())
        .unwrap();
    let res = client.send(req).await;
    assert_eq!((res.outcome(), res.attempts()), (Outcome::Succeeded, 1));
    let reply = res.unwrap();
    // The same outcome on the response itself.
    assert_eq!(reply.get_ref().outcome(), Outcome::Succeeded);
    assert_eq!(reply.body(), "ping");
    assert_eq!(recorder.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_layer_alone_vouches_for_nothing() {
    // No layer folds the attempts: the reply has no outcome to give.
    let mut alone = surely::deadline::SetDeadline::new(
        service_fn(|req: GetPrice| async move { Ok::<_, io::Error>(req.0) }),
        std::time::Duration::from_secs(1),
    );
    let res = alone.send(GetPrice(4)).await;
    assert_eq!(res.as_ref().unwrap().call_outcome(), None);
    assert_eq!((res.outcome(), res.attempts()), (Outcome::Unknown, 0));
    assert_eq!(res.unwrap().into_inner(), 4);
}
