//! The defaults and numbers the guide states about the client half (`docs::architecture`'s
//! layer order, `docs::overload`'s `surely-default`, `docs::retries`' internal headers), checked
//! through what a call does under paused time where that can show them.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::Full;
use surely::breaker::{Breaker, BreakerLayer, BreakerState, CircuitBreaker};
use surely::deadline::{AttemptTimers, SetDeadline, SetDeadlineLayer};
use surely::headers::{DEFAULT_HEADER, GRPC_PREVIOUS_RPC_ATTEMPTS, GRPC_TIMEOUT, RETRY_OWNER};
use surely::hedge::{Hedge, HedgeLayer};
use surely::idempotency::SetIdempotencyKey;
use surely::record::{RecordAttempt, RecordCall, WatchTrailers};
use surely::retry::{Replay, ReplayBody, Retry};
use surely::timeout::{AttemptTimeout, AttemptTimeoutLayer};
use surely::{OutcomeExt, Semantics, StopReason};
use tokio::time::{advance, Instant};
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

use crate::support::time::{ms, secs};

/// A transport that answers every request with `status` and keeps each request's headers.
#[allow(clippy::type_complexity)]
fn answering(
    status: u16,
) -> (
    impl Service<
            Request<String>,
            Response = Response<String>,
            Error = std::io::Error,
            Future = impl Send,
        > + Clone,
    Arc<Mutex<Vec<HeaderMap>>>,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let transport = service_fn(move |req: Request<String>| {
        log.lock().unwrap().push(req.headers().clone());
        async move {
            Ok::<_, std::io::Error>(
                Response::builder()
                    .status(status)
                    .body(String::new())
                    .unwrap(),
            )
        }
    });
    (transport, seen)
}

fn get() -> Request<String> {
    Request::get("/stock/sku-1").body(String::new()).unwrap()
}

/// `docs::architecture`, "Layer order", and the README's `client::http()`: outer to inner,
/// call record, deadline, key, replayable bodies, retry, hedge, breaker, attempt record,
/// attempt timeout. The types say it: this fails to compile if a layer moves.
#[tokio::test(start_paused = true)]
#[allow(clippy::type_complexity)] // the nested types are what the test checks
async fn the_stack_is_in_the_documented_layer_order() {
    let transport = || {
        service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
            Ok::<_, std::io::Error>(Response::new(Full::new(Bytes::new())))
        })
    };
    // With a hedge, the breaker is a layer under it.
    let _: RecordCall<
        SetDeadline<
            SetIdempotencyKey<
                Replay<
                    Retry<
                        Hedge<Breaker<RecordAttempt<AttemptTimeout<WatchTrailers<_>>, _, _>, _>, _>,
                        _,
                        _,
                    >,
                >,
                _,
            >,
            AttemptTimers,
        >,
        _,
        _,
    > = surely::client::http()
        .recorder(())
        .hedge(HedgeLayer::builder())
        .build(transport())
        .unwrap();
    // Without one (the preset's default), the retry layer keeps the breaker: the README's chain.
    let _: RecordCall<
        SetDeadline<
            SetIdempotencyKey<
                Replay<Retry<RecordAttempt<AttemptTimeout<WatchTrailers<_>>, _, _>, _, _>>,
                _,
            >,
            AttemptTimers,
        >,
        _,
        _,
    > = surely::client::http()
        .recorder(())
        .build(transport())
        .unwrap();
}

/// `docs::overload`'s `surely-default` (`surely::client()`, every setting default): the
/// deadline on the wire (10 s unless `timeout` says otherwise), the retry owner's marker, and
/// 3 attempts.
#[tokio::test(start_paused = true)]
async fn the_default_client_writes_its_deadline_and_marker_and_makes_three_attempts() {
    let (transport, seen) = answering(502);
    let client = surely::client().build(transport).unwrap();
    // A 502 is the server's answer, handed back with the call's outcome.
    let res = client.oneshot(get()).await.unwrap();
    let call = res.call_outcome().unwrap();
    assert_eq!(call.attempts(), 3);
    assert_eq!(call.stop_reason(), StopReason::AttemptsExhausted);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for headers in seen.iter() {
        assert!(headers.contains_key(RETRY_OWNER), "{headers:?}");
    }
    // The first attempt leaves at once: it carries the whole 10 s, less the 1 ms reserve.
    let millis: u64 = seen[0][DEFAULT_HEADER].to_str().unwrap().parse().unwrap();
    assert!((9_990..=10_000).contains(&millis), "{millis}");
}

/// `docs::overload`: "a 10% `RatioBudget`" (the README's "10% of first attempts, or a reserve",
/// `docs::how_we_know`'s reserve of `min_per_sec × ttl` = 100, a floor and not an addition).
/// Calls that all fail at once get 100 retries between them while a tenth of their first
/// attempts is less than that, and a tenth of them past it.
#[tokio::test(start_paused = true)]
async fn the_default_budget_is_a_tenth_of_first_attempts_or_a_reserve_of_a_hundred() {
    for (calls, retries) in [(300, 100), (2_000, 200)] {
        let (transport, seen) = answering(502);
        // The breaker left out: it would stop the calls first.
        let client = surely::client().no_breaker().build(transport).unwrap();
        let mut all = tokio::task::JoinSet::new();
        for _ in 0..calls {
            all.spawn(client.clone().oneshot(get()));
        }
        let results = all.join_all().await;
        assert_eq!(seen.lock().unwrap().len(), calls + retries, "{calls} calls");
        let refused = results
            .iter()
            .map(|r| r.as_ref().unwrap().call_outcome().unwrap().stop_reason())
            .filter(|stop| *stop == StopReason::BudgetExhausted)
            .count();
        assert!(refused > 0, "the budget refused retries");
    }
}

/// A breaker service over a backend that fails (503, no `Retry-After`) while `failing` is set.
fn guarded(
    breaker: &CircuitBreaker,
    failing: Arc<AtomicU32>,
) -> impl Service<Request<String>, Response = Response<String>, Error = surely::Error<std::io::Error>>
       + Clone
       + use<> {
    BreakerLayer::new(breaker.clone()).layer(service_fn(move |_: Request<String>| {
        let status = if failing.load(Ordering::SeqCst) > 0 {
            503
        } else {
            200
        };
        async move {
            Ok::<_, std::io::Error>(
                Response::builder()
                    .status(status)
                    .body(String::new())
                    .unwrap(),
            )
        }
    }))
}

/// The breaker's defaults (`breaker`'s module docs, `docs::overload`'s "first break (5 s)"): it
/// opens at a failure ratio of 0.5 once the window holds 20 calls, and its first break is 5 s
/// (±10% jitter).
#[tokio::test(start_paused = true)]
async fn the_default_breaker_opens_at_half_of_twenty_calls_for_a_five_second_break() {
    // Nineteen failures are not enough calls; the twentieth opens it.
    let failing = Arc::new(AtomicU32::new(1));
    let breaker = CircuitBreaker::new();
    let mut svc = guarded(&breaker, failing.clone());
    for _ in 0..19 {
        assert_eq!(
            svc.ready()
                .await
                .unwrap()
                .call(get())
                .await
                .unwrap()
                .status(),
            503
        );
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(breaker.state(), BreakerState::Open);

    // Half of twenty opens it; nine of twenty does not.
    for (failures, state) in [(9, BreakerState::Closed), (10, BreakerState::Open)] {
        let breaker = CircuitBreaker::new();
        let failing = Arc::new(AtomicU32::new(0));
        let mut svc = guarded(&breaker, failing.clone());
        for i in 0..20 {
            failing.store(u32::from(i >= 20 - failures), Ordering::SeqCst);
            svc.ready().await.unwrap().call(get()).await.unwrap();
        }
        assert_eq!(breaker.state(), state, "{failures} failures of 20");
    }

    // The break: still refused at 4.4 s, a probe at 5.6 s, whose success closes it.
    failing.store(0, Ordering::SeqCst);
    advance(ms(4_400)).await;
    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    let left = err.circuit_open().unwrap().retry_after().unwrap();
    assert!(left > Duration::ZERO && left <= ms(1_100), "{left:?}");
    advance(ms(1_200)).await;
    assert_eq!(
        svc.ready()
            .await
            .unwrap()
            .call(get())
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(breaker.state(), BreakerState::Closed);
}

/// `docs::overload`: a timeout the call's deadline set counts against the default breaker only
/// if the attempt was given at least 100 ms (`min_timeout_evidence`).
#[tokio::test(start_paused = true)]
async fn the_default_breaker_counts_a_deadlines_timeout_only_after_100_ms() {
    let breaker = CircuitBreaker::new();
    let slow = service_fn(|_: Request<String>| async {
        tokio::time::sleep(secs(1)).await;
        Ok::<_, std::io::Error>(Response::new(String::new()))
    });
    for (budget, counted) in [(ms(90), 0), (ms(110), 1)] {
        let svc = ServiceBuilder::new()
            .layer(SetDeadlineLayer::new(budget))
            .layer(BreakerLayer::new(breaker.clone()))
            .layer(AttemptTimeoutLayer::deadline_only())
            .service(slow);
        let err = svc.oneshot(get()).await.unwrap_err();
        assert!(err.elapsed().is_some_and(|e| e.is_deadline()), "{err:?}");
        assert_eq!(breaker.window().calls, counted, "given {budget:?}");
    }
}

/// `docs::overload` ("a `surely` client gives its single attempt the whole budget unless told
/// otherwise") and `docs::architecture` (with no per-try timeout, the attempt timeout ends the
/// attempt at the deadline).
#[tokio::test(start_paused = true)]
async fn without_a_per_try_timeout_an_attempt_has_the_whole_budget() {
    let slow = |answer_after: Duration| {
        service_fn(move |_: Request<String>| async move {
            tokio::time::sleep(answer_after).await;
            Ok::<_, std::io::Error>(Response::new(String::new()))
        })
    };
    let client = surely::client()
        .timeout(secs(2))
        .build(slow(ms(1_900)))
        .unwrap();
    let res = client.oneshot(get()).await.unwrap();
    assert_eq!(res.call_outcome().unwrap().attempts(), 1);

    let start = Instant::now();
    let client = surely::client()
        .timeout(secs(2))
        .build(slow(secs(60)))
        .unwrap();
    let err = client.oneshot(get()).await.unwrap_err();
    assert!(err.elapsed().is_some_and(|e| e.is_deadline()), "{err:?}");
    assert_eq!(err.attempts(), 1);
    assert!(start.elapsed() <= secs(2), "{:?}", start.elapsed());
}

/// `docs::retries`: `no_internal_headers` drops the marker, the attempt counter and the
/// millisecond deadline header; gRPC's own `grpc-timeout` and `grpc-previous-rpc-attempts` stay.
#[tokio::test(start_paused = true)]
async fn without_internal_headers_grpcs_own_stay() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    // Trailers-only `UNAVAILABLE` with the server's word that it did nothing: retried.
    let transport = service_fn(move |req: Request<ReplayBody<String>>| {
        log.lock().unwrap().push(req.headers().clone());
        async {
            Ok::<_, std::io::Error>(
                Response::builder()
                    .header(http::header::CONTENT_TYPE, "application/grpc")
                    .header("grpc-status", "14")
                    .header("grpc-retry-pushback-ms", "0")
                    .body(String::new())
                    .unwrap(),
            )
        }
    });
    let client = surely::client::grpc()
        .no_internal_headers()
        .build(transport)
        .unwrap();
    let mut call = Request::post("/shop.Orders/GetOrder")
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .body(String::new())
        .unwrap();
    call.extensions_mut().insert(Semantics::Safe);
    let _ = client.oneshot(call).await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    for (i, headers) in seen.iter().enumerate() {
        assert!(headers.contains_key(GRPC_TIMEOUT), "{headers:?}");
        assert!(!headers.contains_key(DEFAULT_HEADER), "{headers:?}");
        assert!(!headers.contains_key(RETRY_OWNER), "{headers:?}");
        let previous = headers.get(GRPC_PREVIOUS_RPC_ATTEMPTS);
        assert_eq!(
            previous.map(|v| v.to_str().unwrap().to_owned()),
            (i > 0).then(|| i.to_string())
        );
    }
}

/// The presets' replayable bodies (`client`'s module docs, `ReplayLayer`): buffered up to
/// 64 KiB. A body of 64 KiB is sent again after a refusal; one byte more is sent once.
#[tokio::test(start_paused = true)]
async fn the_http_preset_replays_bodies_up_to_64_kib() {
    for (len, attempts) in [(64 * 1024, 2), (64 * 1024 + 1, 1)] {
        let sent = Arc::new(AtomicU32::new(0));
        let count = sent.clone();
        // Refused first, with the server's word that it did nothing: any request may go again.
        let transport = service_fn(move |_: Request<ReplayBody<Full<Bytes>>>| {
            let first = count.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                let status = if first { 503 } else { 200 };
                Ok::<_, std::io::Error>(
                    Response::builder()
                        .status(status)
                        .header(http::header::RETRY_AFTER, "0")
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                )
            }
        });
        let client = surely::client::http().build(transport).unwrap();
        let order = Request::post("/orders")
            .body(Full::new(Bytes::from(vec![b'o'; len])))
            .unwrap();
        let res = client.oneshot(order).await.unwrap();
        let call = res.call_outcome().unwrap();
        assert_eq!(call.attempts(), attempts, "{len} bytes");
        assert_eq!(sent.load(Ordering::SeqCst), attempts, "{len} bytes");
        if attempts == 1 {
            assert_eq!(call.stop_reason(), StopReason::NotReplayable);
        }
    }
}
