//! The client `SetDeadlineLayer`, under paused time.

use std::io;
use std::time::Duration;

use http::{HeaderName, Request, Response};
use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
use surely::deadline::{Deadline, SetDeadlineLayer};
use surely::headers::DEFAULT_HEADER;
use surely::headers::GRPC_TIMEOUT;
use surely::Envelope;
use tokio::time::Instant;
use tower::{service_fn, Layer};

use super::support::{call, counter, get, hanging, ms, recording, secs, Log};

fn req() -> Request<()> {
    Request::get("/").body(()).unwrap()
}

fn with_deadline(deadline: Deadline) -> Request<()> {
    let mut r = req();
    r.extensions_mut().insert(deadline);
    r
}

fn grpc_req() -> Request<()> {
    Request::post("/pkg.Svc/Method")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap()
}

fn assert_refused<E: ClassifyError + std::fmt::Display>(err: &surely::Error<E>) {
    assert!(err.is_deadline_exceeded(), "not a deadline error");
    let exceeded = err.deadline_exceeded().unwrap();
    assert!(exceeded.is_refused());
    assert_eq!(exceeded.phase(), DeliveryPhase::NotSent);
    assert_eq!(err.local_phase(), Some(DeliveryPhase::NotSent));
    let c = err.classify_error(DeliveryPhase::Sent);
    assert_eq!(c.class(), AttemptClass::Rejected);
    assert_eq!(c.phase(), DeliveryPhase::NotSent);
    // The refusal hands the call's outcome back: nothing went out.
    assert_eq!(
        err.to_string(),
        "failed before any attempt: deadline exceeded: refused before sending, no budget left"
    );
    assert_eq!(err.outcome(), surely::Outcome::Failed);
    assert_eq!(err.attempts(), 0);
    assert_eq!(err.stop_reason(), Some(surely::StopReason::Deadline));
}

// ---- refusal ------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn refuses_a_request_whose_extension_deadline_has_passed() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(recording(log.clone()));
    let deadline = Deadline::after(ms(100));
    tokio::time::advance(ms(150)).await;

    let err = call(&mut svc, with_deadline(deadline)).await.unwrap_err();
    assert_refused(&err);
    assert_eq!(log.count(), 0, "the inner service must not be called");
}

#[tokio::test(start_paused = true)]
async fn refuses_a_request_exactly_at_its_deadline() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::inherit().layer(recording(log.clone()));
    let deadline = Deadline::after(ms(100));
    tokio::time::advance(ms(100)).await;
    assert!(deadline.is_expired());

    let err = call(&mut svc, with_deadline(deadline)).await.unwrap_err();
    assert_refused(&err);
    assert_eq!(log.count(), 0);
}

#[tokio::test(start_paused = true)]
async fn refuses_inside_a_spent_scope() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(recording(log.clone()));
    let spent = Deadline::after(ms(10));
    tokio::time::advance(ms(10)).await;

    let err = surely::deadline::scope(spent, call(&mut svc, req()))
        .await
        .unwrap_err();
    assert_refused(&err);
    assert_eq!(log.count(), 0);
}

#[tokio::test(start_paused = true)]
async fn refuses_when_no_more_than_the_reserve_is_left() {
    let log = Log::default();
    let layer = SetDeadlineLayer::builder().reserve(ms(5)).build().unwrap();
    let mut svc = layer.layer(recording(log.clone()));

    let err = call(&mut svc, with_deadline(Deadline::after(ms(5))))
        .await
        .unwrap_err();
    assert_refused(&err);
    assert_eq!(log.count(), 0);

    // One millisecond more than the reserve goes through, carrying exactly that millisecond.
    call(&mut svc, with_deadline(Deadline::after(ms(6))))
        .await
        .unwrap();
    assert_eq!(log.header("x-request-timeout-ms").as_deref(), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn a_refused_call_keeps_the_service_usable() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(secs(1)).layer(recording(log.clone()));
    let spent = Deadline::after(ms(1));
    tokio::time::advance(ms(1)).await;
    call(&mut svc, with_deadline(spent)).await.unwrap_err();
    call(&mut svc, req()).await.unwrap();
    assert_eq!(log.header("x-request-timeout-ms").as_deref(), Some("999"));
}

// ---- what is written on the wire ----------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn writes_the_remaining_budget_less_the_reserve() {
    let log = Log::default();
    let layer = SetDeadlineLayer::builder()
        .timeout(secs(2))
        .reserve(ms(5))
        .build()
        .unwrap();
    let mut svc = layer.layer(recording(log.clone()));
    call(&mut svc, req()).await.unwrap();
    assert_eq!(log.header("x-request-timeout-ms").as_deref(), Some("1995"));
    assert_eq!(log.header("grpc-timeout"), None);
}

#[tokio::test(start_paused = true)]
async fn the_default_reserve_is_one_millisecond() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(recording(log.clone()));
    call(&mut svc, req()).await.unwrap();
    assert_eq!(log.header(DEFAULT_HEADER.as_str()).as_deref(), Some("1999"));
}

#[tokio::test(start_paused = true)]
async fn replaces_a_budget_header_the_caller_set() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(recording(log.clone()));
    let r = Request::get("/")
        .header("x-request-timeout-ms", "999999")
        .body(())
        .unwrap();
    call(&mut svc, r).await.unwrap();
    let seen = log.only();
    let values: Vec<_> = seen
        .headers
        .get_all("x-request-timeout-ms")
        .iter()
        .collect();
    assert_eq!(values, ["1999"]);
}

#[tokio::test(start_paused = true)]
async fn writes_grpc_timeout_for_grpc_requests_and_not_the_ms_header() {
    let log = Log::default();
    let layer = SetDeadlineLayer::builder()
        .timeout(secs(2))
        .reserve(ms(5))
        .build()
        .unwrap();
    let mut svc = layer.layer(recording(log.clone()));
    call(&mut svc, grpc_req()).await.unwrap();
    // 1.995 s is ten digits of nanoseconds: the finest unit that fits is microseconds.
    assert_eq!(log.header("grpc-timeout").as_deref(), Some("1995000u"));
    assert_eq!(log.header("x-request-timeout-ms"), None);
}

#[tokio::test(start_paused = true)]
async fn grpc_with_a_subtype_content_type_is_grpc_too() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(ms(500)).layer(recording(log.clone()));
    let r = Request::post("/pkg.Svc/Method")
        .header("content-type", "application/grpc+proto")
        .body(())
        .unwrap();
    call(&mut svc, r).await.unwrap();
    assert_eq!(
        log.header(GRPC_TIMEOUT.as_str()).as_deref(),
        Some("499000u")
    );
    assert_eq!(log.header("x-request-timeout-ms"), None);
}

#[tokio::test(start_paused = true)]
async fn grpc_timeout_can_be_turned_off() {
    let log = Log::default();
    let layer = SetDeadlineLayer::builder()
        .timeout(secs(2))
        .grpc_timeout(false)
        .build()
        .unwrap();
    let mut svc = layer.layer(recording(log.clone()));
    call(&mut svc, grpc_req()).await.unwrap();
    assert_eq!(log.header("grpc-timeout"), None);
    // Nor the millisecond header: it means nothing to a gRPC server.
    assert_eq!(log.header("x-request-timeout-ms"), None);
}

#[tokio::test(start_paused = true)]
async fn writes_a_custom_header() {
    let log = Log::default();
    let layer = SetDeadlineLayer::builder()
        .timeout(secs(2))
        .reserve(ms(5))
        .http_header(Some(HeaderName::from_static("x-budget-ms")))
        .build()
        .unwrap();
    let mut svc = layer.layer(recording(log.clone()));
    call(&mut svc, req()).await.unwrap();
    assert_eq!(log.header("x-budget-ms").as_deref(), Some("1995"));
    assert_eq!(log.header("x-request-timeout-ms"), None);
    assert_eq!(log.header("grpc-timeout"), None);
}

#[tokio::test(start_paused = true)]
async fn http_header_none_writes_nothing_but_still_enforces() {
    let log = Log::default();
    let layer = SetDeadlineLayer::builder()
        .timeout(secs(2))
        .http_header(None)
        .build()
        .unwrap();
    let mut svc = layer.layer(recording(log.clone()));
    let start = Instant::now();
    call(&mut svc, req()).await.unwrap();
    let seen = log.only();
    assert!(seen.headers.is_empty(), "{:?}", seen.headers);
    assert_eq!(seen.current_at_call, Some(Deadline::at(start + secs(2))));

    let calls = counter();
    let mut svc = layer.layer(hanging(calls.clone()));
    let err = call(&mut svc, req()).await.unwrap_err();
    assert!(err.is_deadline_exceeded());
    assert_eq!(Instant::now() - start, secs(2));
    assert_eq!(get(&calls), 1);
}

// ---- which deadline wins ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn own_timeout_wins_when_earliest() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(secs(1)).layer(recording(log.clone()));
    let start = Instant::now();
    let r = with_deadline(Deadline::after(secs(2)));
    surely::deadline::scope(Deadline::after(secs(3)), call(&mut svc, r))
        .await
        .unwrap();
    assert_eq!(log.header("x-request-timeout-ms").as_deref(), Some("999"));
    assert_eq!(
        log.only().current_at_call,
        Some(Deadline::at(start + secs(1)))
    );
}

#[tokio::test(start_paused = true)]
async fn request_extension_wins_when_earliest() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(recording(log.clone()));
    let start = Instant::now();
    let r = with_deadline(Deadline::after(ms(700)));
    surely::deadline::scope(Deadline::after(secs(3)), call(&mut svc, r))
        .await
        .unwrap();
    assert_eq!(log.header("x-request-timeout-ms").as_deref(), Some("699"));
    assert_eq!(
        log.only().current_at_call,
        Some(Deadline::at(start + ms(700)))
    );
}

#[tokio::test(start_paused = true)]
async fn current_deadline_wins_when_earliest() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(recording(log.clone()));
    let start = Instant::now();
    let r = with_deadline(Deadline::after(secs(3)));
    surely::deadline::scope(Deadline::after(ms(400)), call(&mut svc, r))
        .await
        .unwrap();
    assert_eq!(log.header("x-request-timeout-ms").as_deref(), Some("399"));
    assert_eq!(
        log.only().current_at_call,
        Some(Deadline::at(start + ms(400)))
    );
}

#[tokio::test(start_paused = true)]
async fn an_inherited_deadline_counts_from_when_it_was_set() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(secs(10)).layer(recording(log.clone()));
    let parent = Deadline::after(secs(3));
    surely::deadline::scope(parent, async {
        tokio::time::advance(ms(1250)).await;
        call(&mut svc, req()).await
    })
    .await
    .unwrap();
    assert_eq!(log.header("x-request-timeout-ms").as_deref(), Some("1749"));
    assert_eq!(log.only().current_at_call, Some(parent));
}

#[tokio::test(start_paused = true)]
async fn a_nested_scope_never_lengthens_the_outer_one() {
    use surely::deadline::{current, scope};
    let outer = Deadline::after(secs(1));
    let seen = scope(outer, scope(Deadline::after(secs(5)), async { current() })).await;
    assert_eq!(seen, Some(outer));

    let shorter = Deadline::after(ms(300));
    let seen = scope(outer, scope(shorter, async { current() })).await;
    assert_eq!(seen, Some(shorter));

    // And a layer inside both writes the earliest.
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(secs(10)).layer(recording(log.clone()));
    scope(
        outer,
        scope(Deadline::after(secs(5)), call(&mut svc, req())),
    )
    .await
    .unwrap();
    assert_eq!(log.header("x-request-timeout-ms").as_deref(), Some("999"));
    assert_eq!(current(), None);
}

#[tokio::test(start_paused = true)]
async fn nested_layers_never_lengthen_the_outer_budget() {
    // Outer 1 s, inner 5 s: the inner layer inherits the outer deadline and writes it again.
    let log = Log::default();
    let inner = SetDeadlineLayer::new(secs(5)).layer(recording(log.clone()));
    let mut svc = SetDeadlineLayer::new(secs(1)).layer(inner);
    call(&mut svc, req()).await.unwrap();
    assert_eq!(log.header("x-request-timeout-ms").as_deref(), Some("999"));

    // Outer 1 s, inner 300 ms: the inner one is shorter and wins.
    let log = Log::default();
    let inner = SetDeadlineLayer::new(ms(300)).layer(recording(log.clone()));
    let mut svc = SetDeadlineLayer::new(secs(1)).layer(inner);
    call(&mut svc, req()).await.unwrap();
    assert_eq!(log.header("x-request-timeout-ms").as_deref(), Some("299"));
}

#[tokio::test(start_paused = true)]
async fn inherit_without_any_deadline_does_nothing() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::inherit().layer(recording(log.clone()));
    call(&mut svc, req()).await.unwrap();
    let seen = log.only();
    assert!(seen.headers.is_empty());
    assert_eq!(seen.current_at_call, None);
    assert_eq!(seen.current_at_poll, None);

    // And a slow call is not cut short.
    let calls = counter();
    let mut svc = SetDeadlineLayer::inherit().layer(hanging(calls.clone()));
    let out = tokio::time::timeout(secs(3600), call(&mut svc, req())).await;
    assert!(out.is_err(), "the call must still be pending after an hour");
    assert_eq!(get(&calls), 1);
}

// ---- the deadline inside the call -----------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn inner_layers_see_the_current_deadline() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(recording(log.clone()));
    let start = Instant::now();
    assert_eq!(surely::deadline::current(), None);
    call(&mut svc, req()).await.unwrap();
    let seen = log.only();
    let expected = Some(Deadline::at(start + secs(2)));
    assert_eq!(seen.current_at_call, expected);
    assert_eq!(seen.current_at_poll, expected);
    // The layer does not put its own deadline in the request; it is task-local.
    assert_eq!(seen.extension, None);
    // And it does not leak out of the call.
    assert_eq!(surely::deadline::current(), None);
}

#[tokio::test(start_paused = true)]
async fn the_current_deadline_holds_across_polls() {
    let start = Instant::now();
    let inner = service_fn(|_req: Request<()>| async {
        let before = surely::deadline::current();
        tokio::time::sleep(ms(300)).await;
        let after = surely::deadline::current();
        Ok::<_, io::Error>((before, after))
    });
    let mut svc = SetDeadlineLayer::new(secs(1)).layer(inner);
    let (before, after) = call(&mut svc, req()).await.unwrap();
    assert_eq!(before, Some(Deadline::at(start + secs(1))));
    assert_eq!(after, before);
}

#[tokio::test(start_paused = true)]
async fn a_call_pending_at_the_deadline_ends_in_flight() {
    let calls = counter();
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(hanging(calls.clone()));
    let start = Instant::now();
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(Instant::now() - start, secs(2));
    assert_eq!(get(&calls), 1);

    let exceeded = err.deadline_exceeded().expect("a deadline error");
    assert!(!exceeded.is_refused());
    assert_eq!(exceeded.phase(), DeliveryPhase::Sent);
    assert_eq!(err.local_phase(), Some(DeliveryPhase::Sent));
    assert_eq!(
        err.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::MaybeCommitted
    );
    assert_eq!(
        err.to_string(),
        "deadline exceeded while the call was in flight"
    );
}

#[tokio::test(start_paused = true)]
async fn a_call_answering_before_the_deadline_passes_through() {
    let inner = service_fn(|_req: Request<()>| async {
        tokio::time::sleep(ms(1999)).await;
        Ok::<_, io::Error>(Response::builder().status(201).body("made").unwrap())
    });
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(inner);
    let res = call(&mut svc, req()).await.unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(*res.body(), "made");
}

#[tokio::test(start_paused = true)]
async fn transport_errors_are_kept_as_they_are() {
    let inner = service_fn(|_req: Request<()>| async {
        Err::<(), _>(io::Error::new(io::ErrorKind::ConnectionRefused, "nope"))
    });
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(inner);
    let err = call(&mut svc, req()).await.unwrap_err();
    assert!(err.is_transport());
    assert!(!err.is_deadline_exceeded());
    assert_eq!(err.local_phase(), None);
    let io = err.into_transport().unwrap();
    assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);
    assert_eq!(io.to_string(), "nope");
}

// ---- configuration ------------------------------------------------------------------------

#[test]
fn zero_timeout_is_a_config_error() {
    let err = SetDeadlineLayer::builder()
        .timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "deadline timeout");
    assert_eq!(
        err.to_string(),
        "invalid deadline timeout: must be greater than zero"
    );
}

/// `new` never fails: a zero timeout counts as the shortest the builder accepts (the 1 ms
/// reserve and a millisecond on the wire), one past ten years as ten years.
#[tokio::test(start_paused = true)]
async fn new_clamps_its_timeout_into_what_the_builder_accepts() {
    let layer = SetDeadlineLayer::new(Duration::ZERO);
    assert_eq!(layer.timeout(), Some(ms(2)));
    let log = Log::default();
    let mut svc = layer.layer(recording(log.clone()));
    call(&mut svc, req()).await.unwrap();
    assert_eq!(log.header(DEFAULT_HEADER.as_str()).as_deref(), Some("1"));

    let layer = SetDeadlineLayer::new(Duration::MAX);
    assert_eq!(layer.timeout(), Some(surely::MAX_DURATION));
    let log = Log::default();
    let mut svc = layer.layer(recording(log.clone()));
    call(&mut svc, req()).await.unwrap();
    assert_eq!(log.count(), 1);
    assert!(SetDeadlineLayer::builder()
        .timeout(Duration::MAX)
        .build()
        .is_err());
}

#[test]
fn reserve_not_below_timeout_is_a_config_error() {
    for reserve in [ms(100), ms(101), secs(5)] {
        let err = SetDeadlineLayer::builder()
            .timeout(ms(100))
            .reserve(reserve)
            .build()
            .unwrap_err();
        assert_eq!(err.setting(), "deadline reserve");
        assert_eq!(
            err.to_string(),
            "invalid deadline reserve: must be less than the timeout, or every call would be refused"
        );
    }
    assert!(SetDeadlineLayer::builder()
        .timeout(ms(100))
        .reserve(ms(99))
        .build()
        .is_ok());
}

// ---- request types without headers --------------------------------------------------------

/// A request type of a non-HTTP service: no headers, no extensions.
struct Rpc;

impl Envelope for Rpc {}

#[tokio::test(start_paused = true)]
async fn a_non_http_request_gets_the_deadline_without_headers() {
    let inner = service_fn(|_req: Rpc| async { Ok::<_, io::Error>(surely::deadline::current()) });
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(inner);
    let start = Instant::now();
    let seen = call(&mut svc, Rpc).await.unwrap();
    assert_eq!(seen, Some(Deadline::at(start + secs(2))));
}

#[tokio::test(start_paused = true)]
async fn a_non_http_request_is_refused_and_timed_out() {
    let calls = counter();
    let counted = calls.clone();
    let inner = service_fn(move |_req: Rpc| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async {
            std::future::pending::<()>().await;
            Ok::<(), io::Error>(())
        }
    });
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(inner);

    let spent = Deadline::after(ms(3));
    tokio::time::advance(ms(3)).await;
    let err = surely::deadline::scope(spent, call(&mut svc, Rpc))
        .await
        .unwrap_err();
    assert_refused(&err);
    assert_eq!(get(&calls), 0);

    let start = Instant::now();
    let err = call(&mut svc, Rpc).await.unwrap_err();
    assert_eq!(Instant::now() - start, secs(2));
    assert_eq!(
        err.deadline_exceeded().unwrap().phase(),
        DeliveryPhase::Sent
    );
    assert_eq!(get(&calls), 1);
}

// ---- budgets that cannot be written ------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_budget_that_would_be_written_as_zero_is_refused_locally() {
    let log = Log::default();
    let mut svc = SetDeadlineLayer::inherit().layer(recording(log.clone()));
    // 1.5 ms left, 1 ms reserve: 0.5 ms to send, which truncates to "0" on the wire.
    let deadline = Deadline::at(Instant::now() + Duration::from_micros(1500));
    let err = call(&mut svc, with_deadline(deadline)).await.unwrap_err();
    assert_refused(&err);
    assert_eq!(log.count(), 0, "sent {:?}", log.all()[0].headers);
}

// ---- how the deadline is enforced -----------------------------------------------------------

/// A deadline layer that counts on attempt timeouts still ends a call whose inner service has
/// none: it falls back to a timer of its own.
#[tokio::test(start_paused = true)]
async fn attempt_timers_enforcement_falls_back_to_its_own_timer() {
    let calls = counter();
    let layer = SetDeadlineLayer::builder()
        .timeout(secs(2))
        .enforce_in_attempts()
        .build()
        .unwrap();
    let mut svc = layer.layer(hanging(calls.clone()));
    let start = Instant::now();
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(Instant::now() - start, secs(2));
    assert!(err.deadline_exceeded().is_some_and(|d| !d.is_refused()));
    assert_eq!(get(&calls), 1);
}

/// With an attempt timeout inside, the attempt ends at the call's deadline, and says so: the
/// error is the attempt timeout's, fired by the deadline, whichever enforcement the deadline
/// layer uses.
#[tokio::test(start_paused = true)]
async fn the_attempt_timeout_inside_ends_the_call_at_its_deadline() {
    use surely::timeout::AttemptTimeoutLayer;
    use tower::ServiceBuilder;

    for enforce_in_attempts in [false, true] {
        let calls = counter();
        let builder = SetDeadlineLayer::builder().timeout(secs(2));
        let start = Instant::now();
        let err = if enforce_in_attempts {
            let mut svc = ServiceBuilder::new()
                .layer(builder.enforce_in_attempts().build().unwrap())
                .layer(AttemptTimeoutLayer::new(secs(10)))
                .service(hanging(calls.clone()));
            call(&mut svc, req()).await.unwrap_err()
        } else {
            let mut svc = ServiceBuilder::new()
                .layer(builder.build().unwrap())
                .layer(AttemptTimeoutLayer::new(secs(10)))
                .service(hanging(calls.clone()));
            call(&mut svc, req()).await.unwrap_err()
        };
        assert_eq!(Instant::now() - start, secs(2));
        let elapsed = err.elapsed().expect("the attempt timeout fired");
        assert!(elapsed.is_deadline());
        assert_eq!(elapsed.phase(), DeliveryPhase::Sent);
    }
}

/// The budget of a deadline layer is handed down as a budget: a nested layer with a longer
/// budget of its own writes the outer one's, less its reserve.
#[tokio::test(start_paused = true)]
async fn a_nested_layer_inherits_the_outer_budget() {
    let log = Log::default();
    let outer = SetDeadlineLayer::builder()
        .timeout(secs(1))
        .reserve(ms(5))
        .build()
        .unwrap();
    let inner = SetDeadlineLayer::builder()
        .timeout(secs(30))
        .reserve(ms(10))
        .build()
        .unwrap();
    let mut svc = outer.layer(inner.layer(recording(log.clone())));
    call(&mut svc, req()).await.unwrap();
    assert_eq!(log.header("x-request-timeout-ms").as_deref(), Some("990"));
    let seen = &log.all()[0];
    assert_eq!(
        seen.current_at_poll.map(|d| d.remaining()),
        Some(secs(1)),
        "the handler sees the outer budget as its deadline"
    );
}

#[test]
fn a_reserve_that_leaves_less_than_a_millisecond_on_the_wire_is_a_config_error() {
    let err = SetDeadlineLayer::builder()
        .timeout(Duration::from_micros(1500))
        .reserve(ms(1))
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "deadline reserve");
    // Without the millisecond header there is nothing to write, and the budget is fine.
    SetDeadlineLayer::builder()
        .timeout(Duration::from_micros(1500))
        .reserve(ms(1))
        .http_header(None)
        .build()
        .unwrap();
}
