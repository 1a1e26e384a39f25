//! The record layers through the public API: what the attempt and call records say, for every
//! way a call can end, with each kind of recorder.

mod bodies;
mod support;
mod tracing_recorder;
mod trailers;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Request, Response};
use surely::classify::{AttemptClass, Classification, DeliveryPhase};
use surely::deadline::{Deadline, SetDeadlineLayer};
use surely::record::{
    BusinessKey, InMemoryRecorder, Record, RecordAttemptLayer, RecordCallLayer, Recorder,
};
use surely::timeout::AttemptTimeoutLayer;
use surely::timeout::Elapsed;
use surely::Outcome;
use surely::StopReason;
use surely::{Error, Semantics};
use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

use self::support::{call, canonical, get, ms, post, secs, Req, Res, Script};

// ---- the canonical stack ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_canonical_stack_records_a_success() {
    let records = InMemoryRecorder::new();
    let script = Script::new();
    let transport = script.answer(201, &[("x-request-id", "req-42")], ms(30));
    let mut client = canonical(&records, secs(2), ms(500), transport);

    let start = Instant::now();
    let res = call(&mut client, post("/orders")).await.unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(res.body(), "status 201");
    assert_eq!(script.calls(), 1);

    let calls = records.calls();
    let attempts = records.attempts();
    assert_eq!((calls.len(), attempts.len()), (1, 1));
    let (c, a) = (&calls[0], &attempts[0]);

    assert_eq!(a.call, Some(c.call));
    assert_eq!(records.attempts_of(c.call).len(), 1);
    assert_eq!(a.attempt, 1);
    assert_eq!(a.key, None);
    assert_eq!(a.started, start);
    assert_eq!(a.ended, start + ms(30));
    assert_eq!(a.duration(), ms(30));
    assert_eq!(a.deadline_left, Some(secs(2)));
    assert_eq!(a.classification, Classification::success());
    assert_eq!(a.phase(), DeliveryPhase::ResponseStarted);
    assert_eq!(a.class(), AttemptClass::Success);
    assert_eq!(a.timeout, None);
    assert!(!a.cancelled);
    assert_eq!(a.request_id, Some(HeaderValue::from_static("req-42")));

    assert_eq!(c.key, None);
    assert_eq!(c.semantics, Semantics::NonIdempotent);
    assert_eq!(c.attempts, 1);
    assert_eq!(c.outcome, Outcome::Succeeded);
    assert_eq!(c.stop, StopReason::Success);
    assert_eq!(c.last, Some(Classification::success()));
    assert_eq!(c.started, start);
    assert_eq!(c.duration(), ms(30));
}

#[tokio::test(start_paused = true)]
async fn a_post_timed_out_after_send_is_unknown() {
    let records = InMemoryRecorder::new();
    let script = Script::new();
    let mut client = canonical(&records, secs(2), ms(500), script.hang());

    let start = Instant::now();
    let err = call(&mut client, post("/orders")).await.unwrap_err();
    assert_eq!(Instant::now() - start, ms(500));
    assert!(err.is_elapsed());

    let a = &records.attempts()[0];
    assert_eq!(
        a.timeout,
        Some(Elapsed::new(DeliveryPhase::Sent, false).with_given(ms(500)))
    );
    assert_eq!(
        a.classification,
        Classification::new(AttemptClass::MaybeCommitted, DeliveryPhase::Sent)
    );
    assert_eq!(a.duration(), ms(500));
    assert_eq!(a.deadline_left, Some(secs(2)));
    assert!(!a.cancelled);
    assert_eq!(a.request_id, None);

    let c = &records.calls()[0];
    assert_eq!(a.call, Some(c.call));
    assert_eq!(c.outcome, Outcome::Unknown);
    assert_eq!(c.stop, StopReason::Unknown);
    assert_eq!(c.attempts, 1);
    assert_eq!(c.last, Some(a.classification));
    assert_eq!(c.duration(), ms(500));
}

#[tokio::test(start_paused = true)]
async fn a_get_timed_out_after_send_failed() {
    let records = InMemoryRecorder::new();
    let mut client = canonical(&records, secs(2), ms(500), Script::new().hang());
    call(&mut client, get("/orders/o-1")).await.unwrap_err();

    let a = &records.attempts()[0];
    assert_eq!(a.class(), AttemptClass::MaybeCommitted);
    assert!(a.timeout.is_some());
    let c = &records.calls()[0];
    assert_eq!(c.semantics, Semantics::Safe);
    assert_eq!(c.outcome, Outcome::Failed);
    assert_eq!(c.attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_timed_out_after_send_is_unknown() {
    let records = InMemoryRecorder::new();
    let mut client = canonical(&records, secs(2), ms(500), Script::new().hang());
    let req = Request::post("/orders")
        .header("idempotency-key", "k-7")
        .body(String::new())
        .unwrap();
    call(&mut client, req).await.unwrap_err();
    let c = &records.calls()[0];
    assert_eq!(c.semantics, Semantics::Keyed);
    assert_eq!(c.outcome, Outcome::Unknown);
}

#[tokio::test(start_paused = true)]
async fn the_call_deadline_ending_the_attempt_stops_with_deadline() {
    let records = InMemoryRecorder::new();
    let mut client = canonical(&records, secs(1), secs(5), Script::new().hang());
    let start = Instant::now();
    call(&mut client, post("/orders")).await.unwrap_err();
    assert_eq!(Instant::now() - start, secs(1));

    let a = &records.attempts()[0];
    assert_eq!(
        a.timeout,
        Some(Elapsed::new(DeliveryPhase::Sent, true).with_given(secs(1)))
    );
    let c = &records.calls()[0];
    assert_eq!(c.stop, StopReason::Deadline);
    assert_eq!(c.outcome, Outcome::Unknown);
    assert_eq!(c.attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn a_refused_call_has_no_attempt_and_stops_with_deadline() {
    let records = InMemoryRecorder::new();
    let script = Script::new();
    let mut client = canonical(&records, secs(2), ms(500), script.answer(200, &[], ms(0)));
    let spent = Deadline::after(ms(10));
    tokio::time::advance(ms(10)).await;
    let mut req = post("/orders");
    req.extensions_mut().insert(spent);

    let err = call(&mut client, req).await.unwrap_err();
    assert!(err.deadline_exceeded().unwrap().is_refused());
    assert_eq!(script.calls(), 0);
    assert!(records.attempts().is_empty());

    let c = &records.calls()[0];
    assert_eq!(c.attempts, 0);
    assert_eq!(c.stop, StopReason::Deadline);
    assert_eq!(c.outcome, Outcome::Failed);
    assert_eq!(c.last, None);
    assert_eq!(c.deadline_left, Some(std::time::Duration::ZERO));
}

#[tokio::test(start_paused = true)]
async fn final_and_conflict_answers_stop_accordingly() {
    let cases = [
        (404, Outcome::Failed, StopReason::Final, AttemptClass::Final),
        (
            409,
            Outcome::Failed,
            StopReason::Conflict,
            AttemptClass::Conflict,
        ),
        (
            429,
            Outcome::Failed,
            StopReason::NotRetried,
            AttemptClass::Rejected,
        ),
        (
            502,
            Outcome::Unknown,
            StopReason::Unknown,
            AttemptClass::MaybeCommitted,
        ),
    ];
    for (status, outcome, stop, class) in cases {
        let records = InMemoryRecorder::new();
        let transport = Script::new().answer(status, &[], ms(0));
        let mut client = canonical(&records, secs(2), ms(500), transport);
        let res = call(&mut client, post("/orders")).await.unwrap();
        assert_eq!(res.status(), status);
        let a = &records.attempts()[0];
        assert_eq!(a.class(), class, "{status}");
        assert_eq!(a.phase(), DeliveryPhase::ResponseStarted, "{status}");
        let c = &records.calls()[0];
        assert_eq!((c.outcome, c.stop), (outcome, stop), "{status}");
    }
}

// ---- keys, budget, request ids ------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_key_comes_from_the_idempotency_key_header() {
    let records = InMemoryRecorder::new();
    let mut client = canonical(
        &records,
        secs(2),
        ms(500),
        Script::new().answer(200, &[], ms(0)),
    );
    let req = Request::post("/orders")
        .header("idempotency-key", "k-1")
        .body(String::new())
        .unwrap();
    call(&mut client, req).await.unwrap();
    assert_eq!(records.attempts()[0].key, Some(BusinessKey::new("k-1")));
    assert_eq!(records.calls()[0].key, Some(BusinessKey::new("k-1")));
    assert_eq!(records.calls()[0].semantics, Semantics::Keyed);
}

#[tokio::test(start_paused = true)]
async fn a_business_key_extension_wins_over_the_header() {
    let records = InMemoryRecorder::new();
    let mut client = canonical(
        &records,
        secs(2),
        ms(500),
        Script::new().answer(200, &[], ms(0)),
    );
    let mut req = Request::post("/orders")
        .header("idempotency-key", "k-1")
        .body(String::new())
        .unwrap();
    req.extensions_mut().insert(BusinessKey::new("order o-1"));
    call(&mut client, req).await.unwrap();
    assert_eq!(
        records.attempts()[0].key.as_ref().map(BusinessKey::as_str),
        Some("order o-1")
    );
    assert_eq!(records.calls()[0].key, Some(BusinessKey::new("order o-1")));
}

#[tokio::test(start_paused = true)]
async fn deadline_left_is_exact() {
    let records = InMemoryRecorder::new();
    let mut client = canonical(
        &records,
        secs(10),
        ms(500),
        Script::new().answer(200, &[], ms(0)),
    );
    let mut req = post("/orders");
    req.extensions_mut().insert(Deadline::after(secs(3)));
    tokio::time::advance(ms(500)).await;
    call(&mut client, req).await.unwrap();
    assert_eq!(records.attempts()[0].deadline_left, Some(ms(2500)));
    // The call layer sees the request's own deadline too.
    assert_eq!(records.calls()[0].deadline_left, Some(ms(2500)));
}

#[tokio::test(start_paused = true)]
async fn deadline_left_is_none_without_a_deadline() {
    let records = InMemoryRecorder::new();
    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(records.clone()))
        .layer(RecordAttemptLayer::new(records.clone()))
        .service(Script::new().answer(200, &[], ms(0)));
    call(&mut client, post("/orders")).await.unwrap();
    assert_eq!(records.attempts()[0].deadline_left, None);
    assert_eq!(records.calls()[0].deadline_left, None);
}

#[tokio::test(start_paused = true)]
async fn the_request_id_comes_from_a_custom_header() {
    let records = InMemoryRecorder::new();
    let transport = Script::new().answer(
        200,
        &[("x-request-id", "generic"), ("x-amzn-requestid", "amzn-9")],
        ms(0),
    );
    let mut client = RecordAttemptLayer::new(records.clone())
        .request_id_header(HeaderName::from_static("x-amzn-requestid"))
        .layer(transport);
    call(&mut client, post("/orders")).await.unwrap();
    assert_eq!(
        records.attempts()[0].request_id,
        Some(HeaderValue::from_static("amzn-9"))
    );
}

#[tokio::test(start_paused = true)]
async fn no_request_id_header_means_none() {
    let records = InMemoryRecorder::new();
    let mut client =
        RecordAttemptLayer::new(records.clone()).layer(Script::new().answer(200, &[], ms(0)));
    call(&mut client, post("/orders")).await.unwrap();
    let a = &records.attempts()[0];
    assert_eq!(a.request_id, None);
    // Without a call layer outside, an attempt has no call and is number 1.
    assert_eq!(a.call, None);
    assert_eq!(a.attempt, 1);
    assert!(records.calls().is_empty());
}

// ---- cancellation -------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_call_dropped_in_flight_is_recorded_as_cancelled() {
    let records = InMemoryRecorder::new();
    let mut client = canonical(&records, secs(2), ms(500), Script::new().hang());
    let start = Instant::now();
    let out = tokio::time::timeout(ms(100), call(&mut client, post("/orders"))).await;
    assert!(out.is_err(), "the caller gave up first");
    assert_eq!(Instant::now() - start, ms(100));

    let a = &records.attempts()[0];
    assert!(a.cancelled);
    assert_eq!(a.attempt, 1);
    assert_eq!(a.timeout, None);
    assert_eq!(
        a.classification,
        Classification::new(AttemptClass::MaybeCommitted, DeliveryPhase::Sent)
    );
    assert_eq!(a.duration(), ms(100));

    let c = &records.calls()[0];
    assert_eq!(a.call, Some(c.call));
    assert_eq!(c.stop, StopReason::Cancelled);
    assert_eq!(c.outcome, Outcome::Unknown);
    assert_eq!(c.attempts, 1);
    assert_eq!(c.duration(), ms(100));
}

#[tokio::test(start_paused = true)]
async fn a_safe_call_dropped_in_flight_failed() {
    let records = InMemoryRecorder::new();
    let mut client = canonical(&records, secs(2), ms(500), Script::new().hang());
    let out = tokio::time::timeout(ms(100), call(&mut client, get("/orders/o-1"))).await;
    assert!(out.is_err());
    assert!(records.attempts()[0].cancelled);
    let c = &records.calls()[0];
    assert_eq!(c.stop, StopReason::Cancelled);
    assert_eq!(c.outcome, Outcome::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_finished_call_is_recorded_once() {
    let records = InMemoryRecorder::new();
    let mut client = canonical(
        &records,
        secs(2),
        ms(500),
        Script::new().answer(200, &[], ms(5)),
    );
    let fut = client.ready().await.unwrap().call(post("/orders"));
    fut.await.unwrap();
    // The future is dropped after it finished: no cancelled record follows.
    drop(client);
    assert_eq!(records.calls().len(), 1);
    assert_eq!(records.attempts().len(), 1);
    assert!(!records.attempts()[0].cancelled);
    assert_eq!(records.calls()[0].stop, StopReason::Success);
}

// ---- several attempts, several calls --------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn attempts_of_one_call_are_numbered_and_folded() {
    // A hand-rolled retry between the call layer and the attempt layer: 502, then 200.
    let records = InMemoryRecorder::new();
    let script = Script::new();
    let count = script.calls.clone();
    let transport = service_fn(move |_req: Req| {
        let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let status = if n == 0 { 502 } else { 200 };
        async move {
            tokio::time::sleep(ms(10)).await;
            Ok::<_, io::Error>(
                Response::builder()
                    .status(status)
                    .body(String::new())
                    .unwrap(),
            )
        }
    });
    let attempt_layer = RecordAttemptLayer::new(records.clone()).layer(transport);
    let retry = service_fn(move |req: Req| {
        let mut attempts = attempt_layer.clone();
        async move {
            let again = Request::put(req.uri().clone())
                .body(req.body().clone())
                .unwrap();
            let first = attempts.ready().await?.call(req).await?;
            assert_eq!(first.status(), 502);
            attempts.ready().await?.call(again).await
        }
    });
    let mut client = RecordCallLayer::new(records.clone()).layer(retry);
    let req = Request::put("/orders/o-1").body(String::new()).unwrap();
    let res = call(&mut client, req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(script.calls(), 2);

    let c = &records.calls()[0];
    let attempts = records.attempts_of(c.call);
    assert_eq!(attempts.len(), 2);
    assert_eq!(
        attempts.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(attempts[0].class(), AttemptClass::MaybeCommitted);
    assert_eq!(attempts[1].class(), AttemptClass::Success);
    assert_eq!(attempts[1].started, attempts[0].ended);
    assert_eq!(c.attempts, 2);
    assert_eq!(c.outcome, Outcome::Succeeded);
    assert_eq!(c.stop, StopReason::Success);
    assert_eq!(c.semantics, Semantics::Idempotent);
    assert_eq!(c.duration(), ms(20));
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_keep_their_own_records() {
    let records = InMemoryRecorder::new();
    let slow = canonical(
        &records,
        secs(2),
        ms(500),
        Script::new().answer(200, &[("x-request-id", "slow")], ms(100)),
    );
    let fast = canonical(
        &records,
        secs(1),
        ms(500),
        Script::new().answer(503, &[("x-request-id", "fast")], ms(50)),
    );
    let mut slow_req = post("/slow");
    slow_req.extensions_mut().insert(BusinessKey::new("slow"));
    let mut fast_req = post("/fast");
    fast_req.extensions_mut().insert(BusinessKey::new("fast"));

    let (mut slow, mut fast) = (slow, fast);
    let (a, b) = tokio::join!(call(&mut slow, slow_req), call(&mut fast, fast_req));
    assert_eq!(a.unwrap().status(), 200);
    assert_eq!(b.unwrap().status(), 503);

    let calls = records.calls();
    assert_eq!(calls.len(), 2);
    for c in &calls {
        let attempts = records.attempts_of(c.call);
        assert_eq!(attempts.len(), 1);
        let a = &attempts[0];
        assert_eq!(a.key, c.key);
        assert_eq!(a.attempt, 1);
        let key = c.key.as_ref().unwrap().as_str();
        assert_eq!(a.request_id.as_ref().unwrap(), key);
        match key {
            "slow" => {
                assert_eq!(c.outcome, Outcome::Succeeded);
                assert_eq!(a.deadline_left, Some(secs(2)));
                assert_eq!(a.duration(), ms(100));
            }
            "fast" => {
                assert_eq!(c.outcome, Outcome::Unknown);
                assert_eq!(a.deadline_left, Some(secs(1)));
                assert_eq!(a.duration(), ms(50));
            }
            other => panic!("unexpected key {other}"),
        }
    }
    assert_ne!(calls[0].call, calls[1].call);
}

#[tokio::test(start_paused = true)]
async fn a_call_layer_alone_classifies_the_result_as_one_attempt() {
    let cases = [
        (200, Outcome::Succeeded, StopReason::Success),
        (500, Outcome::Unknown, StopReason::Unknown),
        (400, Outcome::Failed, StopReason::Final),
    ];
    for (status, outcome, stop) in cases {
        let records = InMemoryRecorder::new();
        let mut client =
            RecordCallLayer::new(records.clone()).layer(Script::new().answer(status, &[], ms(0)));
        call(&mut client, post("/orders")).await.unwrap();
        let c = &records.calls()[0];
        assert_eq!(c.attempts, 1, "{status}");
        assert_eq!((c.outcome, c.stop), (outcome, stop), "{status}");
        assert_eq!(
            c.last.map(|l| l.phase()),
            Some(DeliveryPhase::ResponseStarted)
        );
    }

    // A transport error, without any attempt layer.
    let records = InMemoryRecorder::new();
    let refused = service_fn(|_req: Req| async {
        Err::<Res, _>(io::Error::from(io::ErrorKind::ConnectionRefused))
    });
    let mut client = RecordCallLayer::new(records.clone()).layer(refused);
    let err: Error<io::Error> = call(&mut client, post("/orders")).await.unwrap_err();
    assert!(err.is_transport());
    let c = &records.calls()[0];
    assert_eq!(c.attempts, 1);
    assert_eq!(
        c.last,
        Some(
            Classification::new(AttemptClass::Rejected, DeliveryPhase::NotSent)
                .with_cause(Some(surely::classify::Cause::Refused))
        )
    );
    assert_eq!(
        (c.outcome, c.stop),
        (Outcome::Failed, StopReason::NotRetried)
    );
}

#[tokio::test(start_paused = true)]
async fn a_nested_client_inside_the_transport_does_not_join_the_call() {
    // The transport fetches a token through its own instrumented client, then answers 500.
    let records = InMemoryRecorder::new();
    let side_records = InMemoryRecorder::new();
    let side_client =
        RecordAttemptLayer::new(side_records.clone()).layer(Script::new().answer(200, &[], ms(0)));
    let transport = service_fn(move |_req: Req| {
        let mut side_client = side_client.clone();
        async move {
            call(&mut side_client, post("/token")).await?;
            Ok::<_, Error<io::Error>>(Response::builder().status(500).body(String::new()).unwrap())
        }
    });
    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(records.clone()))
        .layer(RecordAttemptLayer::new(records.clone()))
        .service(transport);
    call(&mut client, post("/orders")).await.unwrap();

    // Today: the token fetch is recorded as attempt 2 of the order call, and its 200 makes the
    // order "succeeded" although the order itself got a 500.
    assert_eq!(side_records.attempts()[0].attempt, 1);
    let c = &records.calls()[0];
    assert_eq!(c.attempts, 1);
    assert_eq!(c.outcome, Outcome::Unknown);
}

// ---- recorders ----------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_unit_recorder_records_nothing_and_passes_responses_through() {
    let script = Script::new();
    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(()))
        .layer(SetDeadlineLayer::new(secs(2)))
        .layer(RecordAttemptLayer::new(()))
        .layer(AttemptTimeoutLayer::new(ms(500)))
        .service(script.answer(201, &[("x-request-id", "r-1")], ms(0)));
    let res = call(&mut client, post("/orders")).await.unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(res.headers()["x-request-id"], "r-1");
    assert_eq!(res.body(), "status 201");

    // Errors pass through too.
    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(()))
        .layer(RecordAttemptLayer::new(()))
        .layer(AttemptTimeoutLayer::new(ms(500)))
        .service(script.hang());
    let err = call(&mut client, post("/orders")).await.unwrap_err();
    assert!(err.is_elapsed());
    assert_eq!(script.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_unit_call_recorder_gives_no_call_to_its_attempts() {
    // With `()`, the call layer does nothing at all: attempts inside see no call.
    let records = InMemoryRecorder::new();
    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(()))
        .layer(RecordAttemptLayer::new(records.clone()))
        .service(Script::new().answer(200, &[], ms(0)));
    call(&mut client, post("/orders")).await.unwrap();
    assert!(records.calls().is_empty());
    let a = &records.attempts()[0];
    assert_eq!(a.call, None);
    assert_eq!(a.attempt, 1);
}

#[tokio::test(start_paused = true)]
async fn a_closure_recorder_gets_every_record_in_order() {
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let recorder = move |record: Record<'_>| {
        let line = match record {
            Record::Attempt(a) => format!("attempt {} {}", a.attempt, a.class().as_str()),
            Record::Call(c) => format!("call {} {}", c.attempts, c.outcome.as_str()),
            _ => String::from("other"),
        };
        sink.lock().unwrap().push(line);
    };
    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(recorder.clone()))
        .layer(SetDeadlineLayer::new(secs(2)))
        .layer(RecordAttemptLayer::new(recorder))
        .service(Script::new().answer(503, &[], ms(0)));
    call(&mut client, post("/orders")).await.unwrap();
    assert_eq!(
        *lines.lock().unwrap(),
        ["attempt 1 maybe committed", "call 1 unknown"]
    );
}

#[tokio::test(start_paused = true)]
async fn the_in_memory_recorder_can_be_cleared() {
    let records = InMemoryRecorder::new();
    let mut client = canonical(
        &records,
        secs(2),
        ms(500),
        Script::new().answer(200, &[], ms(0)),
    );
    call(&mut client, post("/orders")).await.unwrap();
    assert_eq!((records.calls().len(), records.attempts().len()), (1, 1));
    records.clear();
    assert!(records.calls().is_empty() && records.attempts().is_empty());
}

// ---- Display ------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn records_display_as_readable_lines() {
    let records = InMemoryRecorder::new();
    let mut client = canonical(&records, secs(2), ms(500), Script::new().hang());
    let mut req = post("/orders");
    req.extensions_mut().insert(BusinessKey::new("o-1"));
    call(&mut client, req).await.unwrap_err();

    let c = &records.calls()[0];
    let id = c.call.get();
    assert_eq!(c.call.to_string(), format!("call-{id}"));

    let line = records.attempts()[0].to_string();
    for part in [
        &*format!("call-{id} attempt 1 "),
        "key=o-1",
        "left=2000ms",
        "took=500ms",
        "phase=sent",
        "class=maybe committed",
        "timeout=\"attempt timed out after the request was sent\"",
    ] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
    assert!(!line.contains("cancelled"), "{line:?}");

    let line = c.to_string();
    for part in [
        &*format!("call-{id} "),
        "key=o-1",
        "semantics=NonIdempotent",
        "attempts=1",
        "took=500ms",
        "outcome=unknown",
        "stop=unknown",
    ] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn display_shows_cancellation_request_id_and_missing_parts() {
    let records = InMemoryRecorder::new();
    let mut client = RecordAttemptLayer::new(records.clone()).layer(Script::new().hang());
    let _ = tokio::time::timeout(ms(40), call(&mut client, post("/orders"))).await;
    let line = records.attempts()[0].to_string();
    for part in [
        "call-? attempt 1 ",
        "key=-",
        "left=none",
        "took=40ms",
        "cancelled",
    ] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }

    let records = InMemoryRecorder::new();
    let mut client = RecordAttemptLayer::new(records.clone()).layer(Script::new().answer(
        200,
        &[("x-request-id", "req-42")],
        ms(0),
    ));
    call(&mut client, post("/orders")).await.unwrap();
    let line = records.attempts()[0].to_string();
    assert!(line.contains("request-id=req-42"), "{line:?}");
    assert!(line.contains("phase=response started"), "{line:?}");
    assert!(line.contains("class=success"), "{line:?}");
}

// ---- composition --------------------------------------------------------------------------

/// The canonical order compiles with `ServiceBuilder` and behaves: the transport sees the
/// budget header, the records agree, a response passes through untouched.
#[tokio::test(start_paused = true)]
async fn the_canonical_order_composes_with_service_builder() {
    let records = InMemoryRecorder::new();
    let seen = Arc::new(Mutex::new(None::<String>));
    let seen_by_transport = seen.clone();
    let transport = service_fn(move |req: Req| {
        let header = req.headers()["x-request-timeout-ms"]
            .to_str()
            .unwrap()
            .to_owned();
        *seen_by_transport.lock().unwrap() = Some(header);
        let current = surely::deadline::current();
        async move {
            Ok::<_, io::Error>(
                Response::builder()
                    .header("x-request-id", "r-1")
                    .body(format!("{current:?}"))
                    .unwrap(),
            )
        }
    });
    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(records.clone()))
        .layer(SetDeadlineLayer::new(secs(2)))
        .layer(RecordAttemptLayer::new(records.clone()))
        .layer(AttemptTimeoutLayer::new(ms(500)))
        .service(transport);
    let start = Instant::now();
    let res: Res = call(&mut client, post("/orders")).await.unwrap();
    assert_eq!(
        *res.body(),
        format!("{:?}", Some(Deadline::at(start + secs(2))))
    );
    assert_eq!(seen.lock().unwrap().as_deref(), Some("1999"));
    let (c, a) = (&records.calls()[0], &records.attempts()[0]);
    assert_eq!(a.call, Some(c.call));
    assert_eq!(c.outcome, Outcome::Succeeded);
    assert_eq!(a.request_id.as_ref().unwrap(), "r-1");

    // The stack is a plain tower service: it can be boxed and cloned.
    let boxed = tower::util::BoxCloneService::new(client);
    let mut again = boxed.clone();
    call(&mut again, post("/orders")).await.unwrap();
    assert_eq!(records.calls().len(), 2);
}

// ---- the deadline layer's own timer, and the call's budget ---------------------------------

/// Without an attempt timeout, the deadline layer's timer ends the attempt: the attempt is
/// recorded as timed out by the deadline (not as cancelled), before the call record, and the
/// call record knows the budget the deadline layer set.
#[tokio::test(start_paused = true)]
async fn the_deadline_layers_timer_ends_the_attempt_before_the_call_record() {
    let records = InMemoryRecorder::new();
    let script = Script::new();
    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = order.clone();
    let both = {
        let records = records.clone();
        move |r: Record<'_>| match r {
            Record::Attempt(a) => {
                seen.lock().unwrap().push("attempt");
                Recorder::record_attempt(&records, a)
            }
            Record::Call(c) => {
                seen.lock().unwrap().push("call");
                Recorder::record_call(&records, c)
            }
            _ => {}
        }
    };
    let mut svc = ServiceBuilder::new()
        .layer(RecordCallLayer::new(both.clone()))
        .layer(SetDeadlineLayer::new(secs(1)))
        .layer(RecordAttemptLayer::new(both))
        .service(script.hang());

    let err = call(&mut svc, post("/orders")).await.unwrap_err();
    assert!(err.is_deadline_exceeded());
    assert_eq!(*order.lock().unwrap(), ["attempt", "call"]);

    let attempt = &records.attempts()[0];
    assert!(!attempt.cancelled);
    assert!(attempt.timeout.is_some_and(|t| t.is_deadline()));
    assert_eq!(attempt.deadline_left, Some(secs(1)));

    let c = &records.calls()[0];
    assert_eq!((c.attempts, c.outcome), (1, Outcome::Unknown));
    assert_eq!(c.stop, StopReason::Deadline);
    // The call layer is outside the deadline layer and still knows the budget.
    assert_eq!(c.deadline_left, Some(secs(1)));
}

/// The stop reason follows the request's semantics: a GET whose attempt may have committed
/// could be retried, a POST without a key could not.
#[tokio::test(start_paused = true)]
async fn the_stop_reason_of_a_lost_reply_depends_on_the_semantics() {
    let records = InMemoryRecorder::new();
    let script = Script::new();
    let mut svc = canonical(&records, secs(5), ms(100), script.hang());
    let _ = call(&mut svc, get("/orders/o-1")).await.unwrap_err();
    let _ = call(&mut svc, post("/orders")).await.unwrap_err();
    let calls = records.calls();
    assert_eq!(
        (calls[0].outcome, calls[0].stop),
        (Outcome::Failed, StopReason::NotRetried)
    );
    assert_eq!(
        (calls[1].outcome, calls[1].stop),
        (Outcome::Unknown, StopReason::Unknown)
    );
}

/// The call record lists the retries the retry layer decided: after which attempt, how long it
/// waited, and whether the server's pushback set the wait.
#[tokio::test(start_paused = true)]
async fn the_call_record_lists_each_retry_and_its_wait() {
    use surely::record::RetryRecord;
    use surely::retry::backoff::Backoff;
    use surely::retry::RetryLayer;

    let records = InMemoryRecorder::new();
    let script = Script::new();
    let count = script.calls.clone();
    // 503 with `Retry-After: 2`, then 502, then 200.
    let transport = service_fn(move |_req: Req| {
        let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let res = match n {
            0 => Response::builder()
                .status(503)
                .header("retry-after", "2")
                .body(String::new()),
            1 => Response::builder().status(502).body(String::new()),
            _ => Response::builder().status(200).body(String::new()),
        };
        async move { Ok::<_, io::Error>(res.unwrap()) }
    });
    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(records.clone()))
        .layer(SetDeadlineLayer::new(secs(30)))
        .layer(
            RetryLayer::builder()
                .backoff(Backoff::constant(ms(300)))
                .build()
                .unwrap(),
        )
        .layer(RecordAttemptLayer::new(records.clone()))
        .service(transport);
    let started = Instant::now();
    let res = call(&mut client, get("/orders/o-1")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(started.elapsed(), ms(2300));

    let c = &records.calls()[0];
    assert_eq!(c.attempts, 3);
    let waits: Vec<(u32, Duration, bool)> = c
        .retries
        .iter()
        .map(|r: &RetryRecord| (r.after, r.wait, r.pushback))
        .collect();
    assert_eq!(waits, [(1, secs(2), true), (2, ms(300), false)]);
    let line = c.to_string();
    assert!(
        line.contains("retries=1+2000ms(pushback),2+300ms"),
        "{line}"
    );
}
