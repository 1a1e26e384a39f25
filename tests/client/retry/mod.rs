//! The retry layer through the public API, in the canonical stack: what is retried for which
//! request, how many side effects that commits, how long it waits, and why a call stops.

mod pushback;
mod resolve;
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Request, StatusCode};
use surely::budget::{RatioBudget, RetryBudget, TokenBucket};
use surely::classify::AttemptClass;
use surely::deadline::Deadline;
use surely::fault::{Fault, Reply, Schedule};
use surely::headers::GRPC_PREVIOUS_RPC_ATTEMPTS;
use surely::headers::IDEMPOTENCY_KEY;
use surely::idempotency::IdempotencyKey;
use surely::record::InMemoryRecorder;
use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;
use surely::Outcome;
use surely::Semantics;
use surely::StopReason;
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::support::gated::Gated;

use self::support::{canonical, canonical_keyed, ms, secs, timed, Probe, Req, PER_TRY};

// ---- helpers ----------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Kind {
    Get,
    Put,
    PostKeyed,
    Post,
}

const KEY: &str = "k-1";

fn request(kind: Kind) -> Req {
    let builder = match kind {
        Kind::Get => Request::get("/orders/o-1"),
        Kind::Put => Request::put("/orders/o-1"),
        Kind::PostKeyed => Request::post("/orders").header(IDEMPOTENCY_KEY, KEY),
        Kind::Post => Request::post("/orders"),
    };
    builder.body(String::from("o-1")).unwrap()
}

fn grpc_request() -> Req {
    Request::post("/orders.Orders/Create")
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .body(String::new())
        .unwrap()
}

/// A retry layer with no budget and no backoff: only the attempt limit and pushback decide.
fn retry() -> RetryLayer {
    RetryLayer::builder()
        .backoff(Backoff::none())
        .no_budget()
        .build()
        .unwrap()
}

fn retry_with(max_attempts: u32, backoff: Backoff) -> RetryLayer {
    RetryLayer::builder()
        .max_attempts(max_attempts)
        .backoff(backoff)
        .no_budget()
        .build()
        .unwrap()
}

fn first(fault: Fault) -> Schedule {
    Schedule::new().at(0, fault)
}

fn always(fault: Fault) -> Schedule {
    Schedule::new().otherwise(fault)
}

fn reply(status: u16) -> Reply {
    Reply::new(StatusCode::from_u16(status).unwrap())
}

fn refuse() -> Fault {
    Fault::RefuseBeforeSend
}

fn reset() -> Fault {
    Fault::ResetAfterSend
}

/// Slower than the per-try timeout, after the transport committed.
fn slow() -> Fault {
    Fault::DelayReply(PER_TRY * 5)
}

fn unavailable() -> Fault {
    Fault::Respond(reply(503).retry_after(secs(1)))
}

fn too_many() -> Fault {
    Fault::Respond(reply(429).retry_after(secs(1)))
}

fn bad_request() -> Fault {
    Fault::Respond(reply(400))
}

fn conflict() -> Fault {
    Fault::Respond(reply(409))
}

/// A fault policy that logs when each request reached the fault layer (each attempt) and its
/// headers, and answers every request with `fault`.
#[derive(Clone)]
struct Log {
    at: Arc<Mutex<Vec<(Instant, http::HeaderMap)>>>,
}

impl Log {
    fn new() -> Self {
        Log {
            at: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn policy(&self, fault: Fault) -> impl Fn(&Req) -> Option<Fault> + Clone + use<> {
        let log = self.at.clone();
        move |req: &Req| {
            log.lock()
                .unwrap()
                .push((Instant::now(), req.headers().clone()));
            Some(fault.clone())
        }
    }

    fn times(&self, since: Instant) -> Vec<Duration> {
        self.at
            .lock()
            .unwrap()
            .iter()
            .map(|(t, _)| *t - since)
            .collect()
    }

    fn header(&self, name: &HeaderName) -> Vec<Option<HeaderValue>> {
        self.at
            .lock()
            .unwrap()
            .iter()
            .map(|(_, h)| h.get(name).cloned())
            .collect()
    }
}

// ---- 1. the decision matrix -------------------------------------------------------------------

struct Expect {
    /// Requests that reached the transport: committed side effects.
    calls: usize,
    attempts: u32,
    outcome: Outcome,
    stop: StopReason,
    elapsed: Duration,
}

async fn check(fault: Fault, kind: Kind, expect: Expect) {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), first(fault.clone()), None, &probe, &recorder);
    let (out, elapsed) = timed(&mut svc, request(kind)).await;
    let ctx = format!("{fault:?} on {kind:?}");

    assert_eq!(probe.calls(), expect.calls, "transport calls, {ctx}");
    assert_eq!(elapsed, expect.elapsed, "elapsed, {ctx}");

    let calls = recorder.calls();
    assert_eq!(calls.len(), 1, "{ctx}");
    let call = &calls[0];
    assert_eq!(call.attempts, expect.attempts, "call attempts, {ctx}");
    assert_eq!(call.outcome, expect.outcome, "outcome, {ctx}");
    assert_eq!(call.stop, expect.stop, "stop, {ctx}");

    let attempts = recorder.attempts_of(call.call);
    assert_eq!(
        attempts.len(),
        expect.attempts as usize,
        "attempt records, {ctx}"
    );
    assert_eq!(recorder.attempts().len(), attempts.len(), "{ctx}");
    for (i, a) in attempts.iter().enumerate() {
        assert_eq!(a.attempt as usize, i + 1, "{ctx}");
    }

    match expect.outcome {
        Outcome::Succeeded => {
            let res = out.unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_eq!(res.status(), 200, "{ctx}");
            assert_eq!(res.body(), "ok", "{ctx}");
        }
        _ => match expect.stop {
            // A final answer or a conflict comes back as the response.
            StopReason::Final | StopReason::Conflict => {
                assert!(out.unwrap().status().is_client_error(), "{ctx}")
            }
            _ => assert!(out.is_err(), "{ctx}"),
        },
    }

    // A keyed request carries its key on every attempt that reached the transport.
    if let Kind::PostKeyed = kind {
        for seen in probe.seen() {
            assert_eq!(seen.headers[IDEMPOTENCY_KEY], KEY, "{ctx}");
        }
    }
}

macro_rules! matrix {
    ($(
        $name:ident: $fault:ident, $kind:ident =>
            calls $calls:expr, attempts $attempts:expr, $outcome:ident, $stop:ident, after $elapsed:expr;
    )*) => {$(
        #[tokio::test(start_paused = true)]
        async fn $name() {
            check(
                $fault(),
                Kind::$kind,
                Expect {
                    calls: $calls,
                    attempts: $attempts,
                    outcome: Outcome::$outcome,
                    stop: StopReason::$stop,
                    elapsed: $elapsed,
                },
            )
            .await;
        }
    )*};
}

matrix! {
    // Refused before send: nothing happened, so everything is retried, a POST without a key too.
    refused_get_is_retried: refuse, Get => calls 1, attempts 2, Succeeded, Success, after ms(0);
    refused_put_is_retried: refuse, Put => calls 1, attempts 2, Succeeded, Success, after ms(0);
    refused_keyed_post_is_retried: refuse, PostKeyed => calls 1, attempts 2, Succeeded, Success, after ms(0);
    refused_post_is_retried: refuse, Post => calls 1, attempts 2, Succeeded, Success, after ms(0);

    // Reset after send: committed, reply lost. Only a repeatable request goes again.
    reset_get_is_retried: reset, Get => calls 2, attempts 2, Succeeded, Success, after ms(0);
    reset_put_is_retried: reset, Put => calls 2, attempts 2, Succeeded, Success, after ms(0);
    reset_keyed_post_is_retried: reset, PostKeyed => calls 2, attempts 2, Succeeded, Success, after ms(0);
    reset_post_is_not_retried_and_unknown: reset, Post => calls 1, attempts 1, Unknown, Unknown, after ms(0);

    // Slower than the per-try timeout, after commit: the same as a reset, a second later.
    slow_get_is_retried: slow, Get => calls 2, attempts 2, Succeeded, Success, after secs(1);
    slow_put_is_retried: slow, Put => calls 2, attempts 2, Succeeded, Success, after secs(1);
    slow_keyed_post_is_retried: slow, PostKeyed => calls 2, attempts 2, Succeeded, Success, after secs(1);
    slow_post_is_not_retried_and_unknown: slow, Post => calls 1, attempts 1, Unknown, Unknown, after secs(1);

    // 503 with Retry-After: not processed; retried for everything, after exactly the pushback.
    unavailable_get_waits_the_pushback: unavailable, Get => calls 1, attempts 2, Succeeded, Success, after secs(1);
    unavailable_put_waits_the_pushback: unavailable, Put => calls 1, attempts 2, Succeeded, Success, after secs(1);
    unavailable_keyed_post_waits_the_pushback: unavailable, PostKeyed => calls 1, attempts 2, Succeeded, Success, after secs(1);
    unavailable_post_waits_the_pushback: unavailable, Post => calls 1, attempts 2, Succeeded, Success, after secs(1);

    // 429 with Retry-After: the same.
    too_many_get_waits_the_pushback: too_many, Get => calls 1, attempts 2, Succeeded, Success, after secs(1);
    too_many_put_waits_the_pushback: too_many, Put => calls 1, attempts 2, Succeeded, Success, after secs(1);
    too_many_keyed_post_waits_the_pushback: too_many, PostKeyed => calls 1, attempts 2, Succeeded, Success, after secs(1);
    too_many_post_waits_the_pushback: too_many, Post => calls 1, attempts 2, Succeeded, Success, after secs(1);

    // 400: final, never retried.
    bad_request_get_is_final: bad_request, Get => calls 0, attempts 1, Failed, Final, after ms(0);
    bad_request_put_is_final: bad_request, Put => calls 0, attempts 1, Failed, Final, after ms(0);
    bad_request_keyed_post_is_final: bad_request, PostKeyed => calls 0, attempts 1, Failed, Final, after ms(0);
    bad_request_post_is_final: bad_request, Post => calls 0, attempts 1, Failed, Final, after ms(0);

    // 409 without Retry-After: a business conflict, never replayed; a keyed request included.
    conflict_get_is_not_retried: conflict, Get => calls 0, attempts 1, Failed, Conflict, after ms(0);
    conflict_put_is_not_retried: conflict, Put => calls 0, attempts 1, Failed, Conflict, after ms(0);
    conflict_keyed_post_is_not_retried: conflict, PostKeyed => calls 0, attempts 1, Failed, Conflict, after ms(0);
    conflict_post_is_not_retried: conflict, Post => calls 0, attempts 1, Failed, Conflict, after ms(0);
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_sends_the_same_key_after_a_reset() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), first(reset()), None, &probe, &recorder);
    let (out, _) = timed(&mut svc, request(Kind::PostKeyed)).await;
    assert_eq!(out.unwrap().body(), "ok");
    let seen = probe.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].headers[IDEMPOTENCY_KEY], KEY);
    assert_eq!(seen[1].headers[IDEMPOTENCY_KEY], KEY);
    let attempts = recorder.attempts();
    assert_eq!(attempts[0].class(), AttemptClass::MaybeCommitted);
    assert_eq!(attempts[0].key.as_ref().unwrap().as_str(), KEY);
    assert_eq!(attempts[1].class(), AttemptClass::Success);
    assert_eq!(attempts[1].key.as_ref().unwrap().as_str(), KEY);
}

#[tokio::test(start_paused = true)]
async fn the_pushback_wait_is_between_the_attempts() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), first(unavailable()), None, &probe, &recorder);
    let start = Instant::now();
    timed(&mut svc, request(Kind::Post)).await.0.unwrap();
    let attempts = recorder.attempts();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].started - start, ms(0));
    assert_eq!(attempts[0].ended - start, ms(0));
    assert_eq!(attempts[0].class(), AttemptClass::Rejected);
    assert_eq!(attempts[1].started - start, secs(1));
    assert_eq!(probe.seen()[0].at - start, secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_slow_attempt_records_its_timeout() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), first(slow()), None, &probe, &recorder);
    timed(&mut svc, request(Kind::Put)).await.0.unwrap();
    let attempts = recorder.attempts();
    assert_eq!(attempts.len(), 2);
    assert!(attempts[0].timeout.is_some());
    assert_eq!(attempts[0].duration(), PER_TRY);
    assert_eq!(attempts[0].class(), AttemptClass::MaybeCommitted);
    assert!(attempts[1].timeout.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_keyed_409_with_retry_after_is_in_flight_and_retried() {
    let in_flight = Fault::Respond(reply(409).retry_after(secs(1)));
    // Keyed: the key's first request is still running; come back with the same key.
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), first(in_flight.clone()), None, &probe, &recorder);
    let (out, elapsed) = timed(&mut svc, request(Kind::PostKeyed)).await;
    assert_eq!(out.unwrap().status(), 200);
    assert_eq!(elapsed, secs(1));
    assert_eq!(probe.calls(), 1);
    assert_eq!(recorder.calls()[0].attempts, 2);

    // Without a key, the same answer is a business conflict.
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), first(in_flight), None, &probe, &recorder);
    let (out, elapsed) = timed(&mut svc, request(Kind::Post)).await;
    assert_eq!(out.unwrap().status(), 409);
    assert_eq!(elapsed, ms(0));
    assert_eq!(probe.calls(), 0);
    let call = &recorder.calls()[0];
    assert_eq!((call.attempts, call.stop), (1, StopReason::Conflict));
}

#[tokio::test(start_paused = true)]
async fn a_502_after_commit_is_retried_for_a_put_only() {
    let gateway = Fault::RespondAfterSend(reply(502));
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), first(gateway.clone()), None, &probe, &recorder);
    assert_eq!(
        timed(&mut svc, request(Kind::Put))
            .await
            .0
            .unwrap()
            .status(),
        200
    );
    assert_eq!(probe.calls(), 2);

    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), first(gateway), None, &probe, &recorder);
    assert_eq!(
        timed(&mut svc, request(Kind::Post))
            .await
            .0
            .unwrap()
            .status(),
        502
    );
    assert_eq!(probe.calls(), 1);
    let call = &recorder.calls()[0];
    assert_eq!(
        (call.attempts, call.outcome, call.stop),
        (1, Outcome::Unknown, StopReason::Unknown)
    );
}

// ---- 2. the attempt limit ---------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn always_refused_stops_at_the_attempt_limit() {
    for max in [1, 2, 3, 5] {
        let probe = Probe::new();
        let recorder = InMemoryRecorder::new();
        let schedule = always(refuse());
        let mut svc = canonical(
            retry_with(max, Backoff::none()),
            schedule.clone(),
            None,
            &probe,
            &recorder,
        );
        let (out, elapsed) = timed(&mut svc, request(Kind::Post)).await;
        let err = out.unwrap_err();
        assert!(err.injected().is_some(), "max {max}");
        assert_eq!(schedule.seen(), u64::from(max), "max {max}");
        assert_eq!(probe.calls(), 0, "max {max}");
        assert_eq!(elapsed, ms(0));
        let call = &recorder.calls()[0];
        assert_eq!(call.attempts, max);
        assert_eq!(recorder.attempts().len(), max as usize);
        assert_eq!(call.stop, StopReason::AttemptsExhausted, "max {max}");
        // Nothing was ever sent: the call failed cleanly.
        assert_eq!(call.outcome, Outcome::Failed, "max {max}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_default_attempt_limit_is_three() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let schedule = always(refuse());
    let layer = RetryLayer::builder()
        .backoff(Backoff::none())
        .no_budget()
        .build()
        .unwrap();
    let mut svc = canonical(layer, schedule.clone(), None, &probe, &recorder);
    timed(&mut svc, request(Kind::Get)).await.0.unwrap_err();
    assert_eq!(schedule.seen(), 3);
    assert_eq!(recorder.calls()[0].stop, StopReason::AttemptsExhausted);
}

#[tokio::test(start_paused = true)]
async fn always_reset_put_exhausts_attempts_with_an_unknown_outcome() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), always(reset()), None, &probe, &recorder);
    timed(&mut svc, request(Kind::Put)).await.0.unwrap_err();
    // Three puts committed, no reply came back: the effect may have happened.
    assert_eq!(probe.calls(), 3);
    let call = &recorder.calls()[0];
    assert_eq!(call.attempts, 3);
    assert_eq!(call.stop, StopReason::AttemptsExhausted);
    assert_eq!(call.outcome, Outcome::Unknown);
}

#[tokio::test(start_paused = true)]
async fn always_reset_get_exhausts_attempts_and_fails() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), always(reset()), None, &probe, &recorder);
    timed(&mut svc, request(Kind::Get)).await.0.unwrap_err();
    assert_eq!(probe.calls(), 3);
    let call = &recorder.calls()[0];
    assert_eq!(call.stop, StopReason::AttemptsExhausted);
    // A safe request has no effect to lose track of.
    assert_eq!(call.outcome, Outcome::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_keyed_post_whose_retries_are_refused_stays_unknown() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let schedule = Schedule::new().at(0, reset()).otherwise(refuse());
    let mut svc = canonical(retry(), schedule, None, &probe, &recorder);
    timed(&mut svc, request(Kind::PostKeyed))
        .await
        .0
        .unwrap_err();
    assert_eq!(probe.calls(), 1);
    let call = &recorder.calls()[0];
    assert_eq!(call.attempts, 3);
    assert_eq!(call.stop, StopReason::AttemptsExhausted);
    assert_eq!(call.outcome, Outcome::Unknown);
}

#[tokio::test(start_paused = true)]
async fn a_seeded_backoff_waits_its_own_delays() {
    let backoff = Backoff::exponential(ms(100)).seed(7).build().unwrap();
    let expected: Vec<Duration> = backoff.iter().take(3).collect();
    let log = Log::new();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(
        retry_with(4, backoff),
        log.policy(refuse()),
        None,
        &probe,
        &recorder,
    );
    let start = Instant::now();
    let (_, elapsed) = timed(&mut svc, request(Kind::Get)).await;
    let times = log.times(start);
    assert_eq!(times.len(), 4);
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    // tokio's timer fires on whole milliseconds: each wait is its delay rounded up.
    let ceil = |d: &Duration| ms(d.as_nanos().div_ceil(1_000_000) as u64);
    assert_eq!(gaps, expected.iter().map(ceil).collect::<Vec<_>>());
    assert!(expected.iter().all(|d| *d > ms(0) && *d <= ms(400)));
    assert_eq!(elapsed, gaps.iter().sum::<Duration>());
}

#[tokio::test(start_paused = true)]
async fn a_constant_backoff_spaces_the_attempts() {
    let log = Log::new();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(
        retry_with(3, Backoff::constant(ms(250))),
        log.policy(refuse()),
        None,
        &probe,
        &recorder,
    );
    let start = Instant::now();
    let (_, elapsed) = timed(&mut svc, request(Kind::Post)).await;
    assert_eq!(log.times(start), vec![ms(0), ms(250), ms(500)]);
    assert_eq!(elapsed, ms(500));
}

// ---- 3. pushback ------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_pushback_over_the_cap_stops_the_call_instead_of_coming_back_sooner() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let layer = RetryLayer::builder()
        .backoff(Backoff::constant(ms(100)))
        .max_pushback(secs(10))
        .no_budget()
        .build()
        .unwrap();
    let fault = Fault::Respond(reply(503).retry_after(secs(60)));
    let mut svc = canonical(layer, first(fault), None, &probe, &recorder);
    let (out, elapsed) = timed(&mut svc, request(Kind::Post)).await;
    // The server's 503 comes back at once: it asked for a minute, and 100 ms would be sooner.
    assert_eq!(out.unwrap().status(), 503);
    assert_eq!(elapsed, ms(0));
    assert_eq!(probe.calls(), 0);
    let call = &recorder.calls()[0];
    assert_eq!((call.attempts, call.stop), (1, StopReason::PushbackStop));
    // Rejected before processing: nothing happened.
    assert_eq!(call.outcome, Outcome::Failed);
    assert!(call.retries.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_pushback_within_the_cap_wins_over_the_backoff() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let layer = RetryLayer::builder()
        .backoff(Backoff::constant(ms(100)))
        .max_pushback(secs(10))
        .no_budget()
        .build()
        .unwrap();
    let fault = Fault::Respond(reply(429).retry_after(secs(10)));
    let mut svc = canonical(layer, first(fault), None, &probe, &recorder);
    let (out, elapsed) = timed(&mut svc, request(Kind::Post)).await;
    assert_eq!(out.unwrap().status(), 200);
    assert_eq!(elapsed, secs(10));
}

fn grpc_unavailable(pushback: &'static str) -> Fault {
    Fault::Respond(
        reply(200)
            .header(
                HeaderName::from_static("grpc-status"),
                HeaderValue::from_static("14"),
            )
            .header(
                HeaderName::from_static("grpc-retry-pushback-ms"),
                HeaderValue::from_static(pushback),
            ),
    )
}

#[tokio::test(start_paused = true)]
async fn a_negative_grpc_pushback_stops_the_call() {
    for pushback in ["-1", "soon", ""] {
        let probe = Probe::new();
        let recorder = InMemoryRecorder::new();
        let schedule = first(grpc_unavailable(pushback));
        let mut svc = canonical(retry(), schedule.clone(), None, &probe, &recorder);
        let (out, elapsed) = timed(&mut svc, grpc_request()).await;
        let res = out.unwrap();
        assert_eq!(res.headers()["grpc-status"], "14", "{pushback:?}");
        assert_eq!(elapsed, ms(0));
        assert_eq!(schedule.seen(), 1, "{pushback:?}");
        assert_eq!(probe.calls(), 0);
        let call = &recorder.calls()[0];
        assert_eq!(call.attempts, 1);
        assert_eq!(call.stop, StopReason::PushbackStop, "{pushback:?}");
        // UNAVAILABLE before any header: not processed.
        assert_eq!(call.outcome, Outcome::Failed);
    }
}

#[tokio::test(start_paused = true)]
async fn a_grpc_pushback_in_ms_sets_the_wait() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(
        retry(),
        first(grpc_unavailable("250")),
        None,
        &probe,
        &recorder,
    );
    let (out, elapsed) = timed(&mut svc, grpc_request()).await;
    assert_eq!(out.unwrap().headers()["grpc-status"], "0");
    assert_eq!(elapsed, ms(250));
    assert_eq!(probe.calls(), 1);
    assert_eq!(recorder.calls()[0].stop, StopReason::Success);
}

// ---- 4. deadline admission --------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_pushback_past_the_deadline_is_not_waited() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let fault = Fault::Respond(reply(503).retry_after(secs(2)));
    let mut svc = canonical(retry(), first(fault), Some(secs(1)), &probe, &recorder);
    let (out, elapsed) = timed(&mut svc, request(Kind::Get)).await;
    // The 503 itself comes back, at once: no sleep was begun.
    assert_eq!(out.unwrap().status(), 503);
    assert_eq!(elapsed, ms(0));
    assert_eq!(probe.calls(), 0);
    let call = &recorder.calls()[0];
    assert_eq!(call.attempts, 1);
    // The pushback, never shortened, is what stopped it.
    assert_eq!(call.stop, StopReason::PushbackStop);
    assert_eq!(call.outcome, Outcome::Failed);
    assert_eq!(call.deadline_left, Some(secs(1)));
}

#[tokio::test(start_paused = true)]
async fn no_attempt_starts_after_the_deadline() {
    let log = Log::new();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(
        retry_with(10, Backoff::constant(ms(300))),
        log.policy(refuse()),
        Some(secs(1)),
        &probe,
        &recorder,
    );
    let start = Instant::now();
    let (out, elapsed) = timed(&mut svc, request(Kind::Post)).await;
    assert!(out.unwrap_err().injected().is_some());
    // At 900 ms, 300 ms of wait plus 10 ms of attempt do not fit in the 100 ms left.
    assert_eq!(log.times(start), vec![ms(0), ms(300), ms(600), ms(900)]);
    assert_eq!(elapsed, ms(900));
    let call = &recorder.calls()[0];
    assert_eq!(call.attempts, 4);
    assert_eq!(call.stop, StopReason::Deadline);
    assert_eq!(call.outcome, Outcome::Failed);
    for a in recorder.attempts() {
        assert!(a.started - start < secs(1));
        assert_eq!(a.deadline_left, Some(secs(1) - (a.started - start)));
    }
}

#[tokio::test(start_paused = true)]
async fn the_min_attempt_time_is_part_of_admission() {
    // Backoff 300 ms, deadline 1 s, min attempt 100 ms: at 600 ms, 300 + 100 > 400 - 0? no,
    // 400 = 400 fits; at 900 ms nothing fits.
    let log = Log::new();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let layer = RetryLayer::builder()
        .max_attempts(10)
        .backoff(Backoff::constant(ms(300)))
        .min_attempt_time(ms(101))
        .no_budget()
        .build()
        .unwrap();
    let mut svc = canonical(
        layer,
        log.policy(refuse()),
        Some(secs(1)),
        &probe,
        &recorder,
    );
    let start = Instant::now();
    timed(&mut svc, request(Kind::Post)).await.0.unwrap_err();
    // At 600 ms: 300 + 101 > 400 left.
    assert_eq!(log.times(start), vec![ms(0), ms(300), ms(600)]);
    assert_eq!(recorder.calls()[0].stop, StopReason::Deadline);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_attempt_ends_at_the_deadline_without_a_retry() {
    let log = Log::new();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(
        retry(),
        log.policy(Fault::DelayReply(secs(60))),
        Some(ms(700)),
        &probe,
        &recorder,
    );
    let (out, elapsed) = timed(&mut svc, request(Kind::Get)).await;
    let err = out.unwrap_err();
    assert!(err.elapsed().is_some_and(|e| e.is_deadline()), "{err}");
    assert_eq!(elapsed, ms(700));
    assert_eq!(log.times(Instant::now() - elapsed).len(), 1);
    let call = &recorder.calls()[0];
    assert_eq!(call.attempts, 1);
    assert_eq!(call.stop, StopReason::Deadline);
}

#[tokio::test(start_paused = true)]
async fn a_request_deadline_bounds_the_canonical_stack() {
    // The deadline layer only inherits: the caller's `Deadline` extension is the call's.
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let fault = Fault::Respond(reply(503).retry_after(secs(2)));
    let mut svc = canonical(retry(), first(fault), None, &probe, &recorder);
    let mut req = request(Kind::Get);
    req.extensions_mut().insert(Deadline::after(secs(1)));
    let (out, elapsed) = timed(&mut svc, req).await;
    assert_eq!(out.unwrap().status(), 503);
    assert_eq!(elapsed, ms(0));
    let call = &recorder.calls()[0];
    assert_eq!((call.attempts, call.stop), (1, StopReason::PushbackStop));
}

#[tokio::test(start_paused = true)]
async fn a_request_deadline_bounds_the_retry_layer_alone() {
    // No deadline layer: the caller's `Deadline` extension is the call's deadline.
    let schedule = first(Fault::Respond(reply(503).retry_after(secs(2))));
    let probe = Probe::new();
    let mut svc = ServiceBuilder::new()
        .layer(retry())
        .layer(surely::fault::InjectFaultLayer::new(schedule.clone()))
        .service(probe.service());
    let mut req = request(Kind::Get);
    req.extensions_mut().insert(Deadline::after(secs(1)));
    let start = Instant::now();
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(res.status(), 503);
    assert_eq!(start.elapsed(), ms(0));
    assert_eq!(schedule.seen(), 1);
}

// ---- 5. budgets -------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn an_empty_ratio_budget_lets_first_attempts_through_and_no_retry() {
    let budget = Arc::new(
        RatioBudget::builder()
            .ratio(0.0)
            .min_per_sec(0.0)
            .build()
            .unwrap(),
    );
    assert_eq!(budget.available(), 0);
    let layer = RetryLayer::builder()
        .backoff(Backoff::none())
        .budget(budget.clone())
        .build()
        .unwrap();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let schedule = always(refuse());
    let mut svc = canonical(layer, schedule.clone(), None, &probe, &recorder);
    for n in 1..=5u64 {
        timed(&mut svc, request(Kind::Get)).await.0.unwrap_err();
        assert_eq!(schedule.seen(), n);
    }
    let calls = recorder.calls();
    assert_eq!(calls.len(), 5);
    for call in calls {
        assert_eq!(call.attempts, 1);
        assert_eq!(call.stop, StopReason::BudgetExhausted);
        assert_eq!(call.outcome, Outcome::Failed);
    }
}

#[tokio::test(start_paused = true)]
async fn a_shared_ratio_budget_is_spent_across_services() {
    // A reserve of exactly one retry, shared by two stacks.
    let budget: Arc<dyn RetryBudget> = Arc::new(
        RatioBudget::builder()
            .ratio(0.0)
            .min_per_sec(0.1)
            .build()
            .unwrap(),
    );
    let layer = RetryLayer::builder()
        .backoff(Backoff::none())
        .budget(budget.clone())
        .build()
        .unwrap();
    let recorder = InMemoryRecorder::new();
    let (pa, pb) = (Probe::new(), Probe::new());
    let mut a = canonical(layer.clone(), first(refuse()), None, &pa, &recorder);
    let mut b = canonical(layer, first(refuse()), None, &pb, &recorder);
    timed(&mut a, request(Kind::Get)).await.0.unwrap();
    timed(&mut b, request(Kind::Get)).await.0.unwrap_err();
    let calls = recorder.calls();
    assert_eq!((calls[0].attempts, calls[0].stop), (2, StopReason::Success));
    assert_eq!(
        (calls[1].attempts, calls[1].stop),
        (1, StopReason::BudgetExhausted)
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_refused_for_another_reason_spends_no_budget() {
    let budget = Arc::new(
        RatioBudget::builder()
            .ratio(0.0)
            .min_per_sec(0.1)
            .build()
            .unwrap(),
    );
    assert_eq!(budget.available(), 1);
    let layer = RetryLayer::builder()
        .backoff(Backoff::none())
        .budget(budget.clone())
        .build()
        .unwrap();
    let recorder = InMemoryRecorder::new();
    // A final answer, a POST reset, and a pushback past the deadline: none asks the budget.
    let probe = Probe::new();
    let mut svc = canonical(layer.clone(), first(bad_request()), None, &probe, &recorder);
    timed(&mut svc, request(Kind::Get)).await.0.unwrap();
    let mut svc = canonical(layer.clone(), first(reset()), None, &probe, &recorder);
    timed(&mut svc, request(Kind::Post)).await.0.unwrap_err();
    let late = Fault::Respond(reply(503).retry_after(secs(5)));
    let mut svc = canonical(layer.clone(), first(late), Some(secs(1)), &probe, &recorder);
    timed(&mut svc, request(Kind::Get)).await.0.unwrap();
    assert_eq!(budget.available(), 1);
    // The one retry is still there.
    let mut svc = canonical(layer, first(refuse()), None, &probe, &recorder);
    timed(&mut svc, request(Kind::Get)).await.0.unwrap();
    assert_eq!(budget.available(), 0);
    let stops: Vec<StopReason> = recorder.calls().iter().map(|c| c.stop).collect();
    assert_eq!(
        stops,
        vec![
            StopReason::Final,
            StopReason::Unknown,
            StopReason::PushbackStop,
            StopReason::Success
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_drained_token_bucket_refuses_retries() {
    let bucket = Arc::new(
        TokenBucket::builder()
            .max_tokens(10)
            .token_ratio(0.1)
            .build()
            .unwrap(),
    );
    let layer = RetryLayer::builder()
        .backoff(Backoff::none())
        .budget(bucket.clone())
        .build()
        .unwrap();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(layer, always(refuse()), None, &probe, &recorder);
    for _ in 0..3 {
        timed(&mut svc, request(Kind::Get)).await.0.unwrap_err();
    }
    // Each refused attempt takes a token; retries need more than 5.
    // Call 1: 10 → 9 → 8 → 7 (attempt limit). Call 2: 6 → 5, refused. Call 3: 4, refused.
    let calls = recorder.calls();
    let summary: Vec<(u32, StopReason)> = calls.iter().map(|c| (c.attempts, c.stop)).collect();
    assert_eq!(
        summary,
        vec![
            (3, StopReason::AttemptsExhausted),
            (2, StopReason::BudgetExhausted),
            (1, StopReason::BudgetExhausted),
        ]
    );
    assert_eq!(bucket.tokens(), 4.0);
}

#[tokio::test(start_paused = true)]
async fn final_answers_do_not_drain_the_token_bucket() {
    let bucket = Arc::new(
        TokenBucket::builder()
            .max_tokens(2)
            .token_ratio(0.1)
            .build()
            .unwrap(),
    );
    let layer = RetryLayer::builder()
        .backoff(Backoff::none())
        .budget(bucket.clone())
        .build()
        .unwrap();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(layer, always(bad_request()), None, &probe, &recorder);
    for _ in 0..5 {
        timed(&mut svc, request(Kind::Get)).await.0.unwrap();
    }
    assert_eq!(bucket.tokens(), 2.0);
}

// ---- 6. the attempt header --------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn grpc_retries_say_how_many_attempts_came_before() {
    let log = Log::new();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), log.policy(refuse()), None, &probe, &recorder);
    timed(&mut svc, grpc_request()).await.0.unwrap_err();
    assert_eq!(
        log.header(&GRPC_PREVIOUS_RPC_ATTEMPTS),
        vec![
            None,
            Some(HeaderValue::from_static("1")),
            Some(HeaderValue::from_static("2"))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn http_retries_carry_no_attempt_header_by_default() {
    let log = Log::new();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), log.policy(refuse()), None, &probe, &recorder);
    timed(&mut svc, request(Kind::Get)).await.0.unwrap_err();
    assert_eq!(
        log.header(&GRPC_PREVIOUS_RPC_ATTEMPTS),
        vec![None, None, None]
    );
}

#[tokio::test(start_paused = true)]
async fn http_retries_carry_the_configured_attempt_header() {
    let name = HeaderName::from_static("x-attempt-count");
    let layer = RetryLayer::builder()
        .backoff(Backoff::none())
        .no_budget()
        .attempt_header(Some(name.clone()))
        .build()
        .unwrap();
    let log = Log::new();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(layer, log.policy(refuse()), None, &probe, &recorder);
    timed(&mut svc, request(Kind::Put)).await.0.unwrap_err();
    assert_eq!(
        log.header(&name),
        vec![
            None,
            Some(HeaderValue::from_static("1")),
            Some(HeaderValue::from_static("2"))
        ]
    );
    assert_eq!(
        log.header(&GRPC_PREVIOUS_RPC_ATTEMPTS),
        vec![None, None, None]
    );
}

// ---- 7. configuration -------------------------------------------------------------------------

#[test]
fn zero_attempts_is_a_config_error() {
    let err = RetryLayer::builder().max_attempts(0).build().unwrap_err();
    assert_eq!(err.setting(), "retry attempt limit");
    assert!(RetryLayer::builder().max_attempts(1).build().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_single_attempt_limit_never_retries() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(
        retry_with(1, Backoff::none()),
        first(refuse()),
        None,
        &probe,
        &recorder,
    );
    timed(&mut svc, request(Kind::Get)).await.0.unwrap_err();
    assert_eq!(probe.calls(), 0);
    let call = &recorder.calls()[0];
    assert_eq!(
        (call.attempts, call.stop),
        (1, StopReason::AttemptsExhausted)
    );
}

// ---- 8. with the idempotency-key layer outside ------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_generated_key_is_the_same_on_every_attempt() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical_keyed(retry(), first(reset()), &probe, &recorder);
    let (out, elapsed) = timed(&mut svc, request(Kind::Post)).await;
    assert_eq!(out.unwrap().body(), "ok");
    assert_eq!(elapsed, ms(0));
    // The reset attempt committed, and so did the retry: a server that honours the key
    // deduplicates them.
    let seen = probe.seen();
    assert_eq!(seen.len(), 2);
    let key = seen[0].headers[IDEMPOTENCY_KEY].clone();
    assert!(IdempotencyKey::from_header_value(&key).is_ok());
    assert_eq!(seen[1].headers[IDEMPOTENCY_KEY], key);
    let attempts = recorder.attempts();
    assert_eq!(attempts.len(), 2);
    for a in &attempts {
        assert_eq!(a.key.as_ref().unwrap().as_str(), key.to_str().unwrap());
    }
    let call = &recorder.calls()[0];
    assert_eq!(call.attempts, 2);
    assert_eq!(call.outcome, Outcome::Succeeded);
    assert_eq!(call.stop, StopReason::Success);
    // The call record sits outside the key layer and still says what the call was.
    assert_eq!(call.key.as_ref().unwrap().as_str(), key.to_str().unwrap());
    assert_eq!(call.semantics, Semantics::Keyed);
}

#[tokio::test(start_paused = true)]
async fn each_call_gets_its_own_key() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical_keyed(retry(), first(reset()), &probe, &recorder);
    timed(&mut svc, request(Kind::Post)).await.0.unwrap();
    timed(&mut svc, request(Kind::Post)).await.0.unwrap();
    let keys: Vec<HeaderValue> = probe
        .seen()
        .iter()
        .map(|s| s.headers[IDEMPOTENCY_KEY].clone())
        .collect();
    assert_eq!(keys.len(), 3);
    assert_eq!(keys[0], keys[1]);
    assert_ne!(keys[1], keys[2]);
}

#[tokio::test(start_paused = true)]
async fn a_callers_key_is_kept_on_every_attempt() {
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical_keyed(retry(), first(reset()), &probe, &recorder);
    timed(&mut svc, request(Kind::PostKeyed)).await.0.unwrap();
    let seen = probe.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.headers[IDEMPOTENCY_KEY] == KEY));
}

#[tokio::test(start_paused = true)]
async fn a_semantics_extension_overrides_the_method() {
    // A POST the caller marks idempotent is retried after a reset, without a key.
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), first(reset()), None, &probe, &recorder);
    let mut req = request(Kind::Post);
    req.extensions_mut().insert(Semantics::Idempotent);
    timed(&mut svc, req).await.0.unwrap();
    assert_eq!(probe.calls(), 2);
    assert_eq!(recorder.calls()[0].semantics, Semantics::Idempotent);
}

// ---- readiness and cloning --------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn retries_share_the_fault_schedule_across_clones() {
    // The retry layer clones the inner stack for retries; the schedule still counts globally.
    let counter = Arc::new(AtomicUsize::new(0));
    let c = counter.clone();
    let policy = move |_: &Req| {
        c.fetch_add(1, Ordering::SeqCst);
        None
    };
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    let mut svc = canonical(retry(), policy, None, &probe, &recorder);
    for _ in 0..3 {
        timed(&mut svc, request(Kind::Get)).await.0.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 3);
    assert_eq!(probe.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_retry_carries_the_budget_that_is_left_not_the_one_the_call_started_with() {
    let log = Log::new();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    // A 3 s call whose first attempt hangs for its whole 1 s per-try timeout.
    let mut svc = canonical(
        retry(),
        log.policy(Fault::Delay(secs(5))),
        Some(secs(3)),
        &probe,
        &recorder,
    );
    let _ = timed(&mut svc, request(Kind::Get)).await;
    let budgets: Vec<u64> = log
        .header(&surely::headers::DEFAULT_HEADER)
        .into_iter()
        .map(|v| v.unwrap().to_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(budgets.len(), 3);
    // 3 s less the 1 ms reserve; then what each retry had left.
    assert_eq!(budgets, vec![2999, 1999, 999]);
}

#[tokio::test(start_paused = true)]
async fn a_retry_lowers_the_budget_under_a_custom_header_name_too() {
    use surely::deadline::SetDeadlineLayer;
    use surely::fault::InjectFaultLayer;
    use surely::record::RecordAttemptLayer;
    use surely::timeout::AttemptTimeoutLayer;

    let name = HeaderName::from_static("x-deadline-ms");
    let log = Log::new();
    let probe = Probe::new();
    let recorder = InMemoryRecorder::new();
    // The canonical stack with a 3 s deadline written under a name of the caller's choosing,
    // whose first attempt hangs for its whole 1 s per-try timeout.
    let mut svc = ServiceBuilder::new()
        .layer(
            SetDeadlineLayer::builder()
                .timeout(secs(3))
                .http_header(Some(name.clone()))
                .build()
                .unwrap(),
        )
        .layer(retry())
        .layer(RecordAttemptLayer::new(recorder.clone()))
        .layer(AttemptTimeoutLayer::new(PER_TRY))
        .layer(InjectFaultLayer::new(log.policy(Fault::Delay(secs(5)))))
        .service(probe.service());
    let _ = timed(&mut svc, request(Kind::Get)).await;
    let budgets: Vec<u64> = log
        .header(&name)
        .into_iter()
        .map(|v| v.unwrap().to_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(budgets, vec![2999, 1999, 999]);
    // And the default header was not written alongside.
    let defaults = log.header(&surely::headers::DEFAULT_HEADER);
    assert!(defaults.iter().all(Option::is_none), "{defaults:?}");
}

/// A request that counts its copies, to see how many a call makes.
#[derive(Debug)]
struct Counted(Arc<AtomicUsize>);

impl Clone for Counted {
    fn clone(&self) -> Self {
        self.0.fetch_add(1, Ordering::SeqCst);
        Counted(self.0.clone())
    }
}

impl surely::Envelope for Counted {
    fn semantics(&self) -> Semantics {
        Semantics::Idempotent
    }
}

#[tokio::test(start_paused = true)]
async fn the_last_attempt_takes_the_kept_request_instead_of_a_copy() {
    use std::io;
    use surely::classify::{self, Attempted, Classification, ClassifyError};

    fn classify(a: Attempted<'_, (), surely::Error<io::Error>>, _: Semantics) -> Classification {
        match a {
            Attempted::Response(()) => Classification::success(),
            Attempted::Error(e, phase) => e.classify_error(phase),
        }
    }
    for (refusals, copies) in [(0, 1), (1, 2), (2, 2), (5, 2)] {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let inner = tower::service_fn(move |_: Counted| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < refusals {
                    Err(io::Error::from(io::ErrorKind::ConnectionRefused))
                } else {
                    Ok(())
                }
            }
        });
        let layer = RetryLayer::builder()
            .classifier(classify::from_fn(classify))
            .backoff(Backoff::none())
            .no_budget()
            .max_attempts(3)
            .build()
            .unwrap();
        let mut svc = ServiceBuilder::new().layer(layer).service(inner);
        let clones = Arc::new(AtomicUsize::new(0));
        let out = svc
            .ready()
            .await
            .unwrap()
            .call(Counted(clones.clone()))
            .await;
        assert_eq!(out.is_ok(), refusals < 3, "{refusals} refusals");
        assert_eq!(calls.load(Ordering::SeqCst), (refusals + 1).min(3));
        // One copy kept for a retry; the second attempt's copy; the third attempt takes the kept
        // one.
        assert_eq!(clones.load(Ordering::SeqCst), copies, "{refusals} refusals");
    }
}

/// A service that refuses its calls while `refuse` is above zero (counting it down), and
/// answers the others.
fn gated(label: u32, refuse: &Arc<AtomicUsize>) -> Gated<String> {
    let refuse = refuse.clone();
    Gated::new(label, move |_| {
        let refused = refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        Box::pin(std::future::ready(if refused {
            Err(std::io::ErrorKind::ConnectionRefused.into())
        } else {
            Ok(http::Response::new(()))
        }))
    })
}

#[tokio::test(start_paused = true)]
async fn each_attempt_goes_through_a_service_made_ready_and_the_retries_see_get_mut() {
    use tower::Layer as _;

    let refuse = Arc::new(AtomicUsize::new(0));
    let inner = gated(1, &refuse);
    let labels = inner.labels();
    let mut svc = RetryLayer::builder()
        .backoff(Backoff::none())
        .no_budget()
        .max_attempts(3)
        .build()
        .unwrap()
        .layer(inner);
    // Two refusals, then an answer: three attempts, each through a service made ready (the
    // retries' clones say `Pending` first).
    refuse.store(2, Ordering::SeqCst);
    crate::support::call(&mut svc, request(Kind::Get))
        .await
        .unwrap();
    assert_eq!(*labels.lock().unwrap(), vec![1, 1, 1]);
    // A change through `get_mut` reaches the first attempt and the retries after it.
    svc.get_mut().label = 2;
    refuse.store(1, Ordering::SeqCst);
    crate::support::call(&mut svc, request(Kind::Get))
        .await
        .unwrap();
    assert_eq!(*labels.lock().unwrap(), vec![1, 1, 1, 2, 2]);
    // A clone of the layer's service retries through the same inner settings.
    let mut other = svc.clone();
    refuse.store(1, Ordering::SeqCst);
    crate::support::call(&mut other, request(Kind::Get))
        .await
        .unwrap();
    assert_eq!(*labels.lock().unwrap(), vec![1, 1, 1, 2, 2, 2, 2]);
}

#[tokio::test(start_paused = true)]
async fn a_retry_whose_service_fails_its_readiness_ends_the_call_with_that_error() {
    use tower::Layer as _;

    let refuse = Arc::new(AtomicUsize::new(1));
    let inner = gated(1, &refuse);
    let (labels, gate) = (inner.labels(), inner.clone());
    let mut svc = RetryLayer::builder()
        .backoff(Backoff::none())
        .no_budget()
        .max_attempts(3)
        .build()
        .unwrap()
        .layer(inner);
    // The first attempt goes through the service made ready here, and is refused; the retry's
    // clone then fails its readiness: no second attempt, and the call ends with that error.
    let ready = svc.ready().await.unwrap();
    gate.fail_readiness(1);
    let err = ready.call(request(Kind::Get)).await.unwrap_err();
    match err.kind() {
        surely::ErrorKind::Transport(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotConnected),
        other => panic!("the readiness error, not {other:?}"),
    }
    assert_eq!(gate.readiness_failures_left(), 0);
    assert_eq!(*labels.lock().unwrap(), vec![1]);
    let call = err.call_outcome().expect("the retry hands its call back");
    assert_eq!(call.attempts(), 1);
    assert_eq!(call.stop_reason(), StopReason::NotRetried);
    // The next call retries through a fresh clone, which is ready.
    refuse.store(1, Ordering::SeqCst);
    crate::support::call(&mut svc, request(Kind::Get))
        .await
        .unwrap();
    assert_eq!(*labels.lock().unwrap(), vec![1, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_call_over_an_inner_that_is_send_but_not_sync_can_be_spawned() {
    use tower::Layer as _;

    // tower's `BoxCloneService` is `Send` and not `Sync`: the call's future must still be
    // `Send`, as it was when it held a clone of the inner service.
    let inner = gated(7, &Arc::new(AtomicUsize::new(1)));
    let labels = inner.labels();
    let inner = tower::util::BoxCloneService::new(inner);
    let mut svc = RetryLayer::builder()
        .backoff(Backoff::none())
        .no_budget()
        .build()
        .unwrap()
        .layer(inner);
    let call = svc.ready().await.unwrap().call(request(Kind::Get));
    tokio::spawn(call).await.unwrap().unwrap();
    assert_eq!(*labels.lock().unwrap(), vec![7, 7]);
}
