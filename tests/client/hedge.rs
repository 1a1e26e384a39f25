//! The hedge layer through the public API, with paused time: when a hedge is sent, which answer
//! wins, what happens to the losers, and what bounds the hedges (semantics, attempt limit,
//! budget, deadline).

#[path = "../../examples/hedging/sim.rs"]
mod experiment;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use surely::budget::{BudgetExhausted, RatioBudget, RetryBudget};
use surely::classify::AttemptClass;
use surely::deadline::{Deadline, SetDeadlineLayer};
use surely::headers::IDEMPOTENCY_KEY;
use surely::hedge::{HedgeDelay, HedgeLayer, HedgeLayerBuilder};
use surely::record::{InMemoryRecorder, RecordAttemptLayer, RecordCallLayer};
use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;
use surely::Outcome;
use surely::Semantics;
use surely::StopReason;
use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

use crate::support::gated::Gated;
use crate::support::time::ms;

type Req = Request<()>;
type Res = Response<()>;

// ---- a scripted server ------------------------------------------------------------------------

/// A server whose n-th attempt answers after the n-th scripted latency with the n-th status
/// (the last entry repeats), and counts its calls and the attempts dropped before they answered.
#[derive(Clone, Default)]
struct Server {
    script: Arc<Mutex<VecDeque<(u64, u16)>>>,
    calls: Arc<AtomicU32>,
    dropped: Arc<AtomicU32>,
}

impl Server {
    fn new(script: &[(u64, u16)]) -> Self {
        Server {
            script: Arc::new(Mutex::new(script.iter().copied().collect())),
            ..Server::default()
        }
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    fn dropped(&self) -> u32 {
        self.dropped.load(Ordering::SeqCst)
    }

    fn service(
        &self,
    ) -> impl Service<
        Req,
        Response = Res,
        Error = std::io::Error,
        Future = impl Future<Output = Result<Res, std::io::Error>> + use<>,
    > + Clone
           + use<> {
        let server = self.clone();
        service_fn(move |_req: Req| {
            server.calls.fetch_add(1, Ordering::SeqCst);
            let (latency, status) = {
                let mut script = server.script.lock().unwrap();
                if script.len() > 1 {
                    script.pop_front().unwrap()
                } else {
                    *script.front().expect("a script")
                }
            };
            let guard = DropGuard(Some(server.dropped.clone()));
            async move {
                let mut guard = guard;
                tokio::time::sleep(ms(latency)).await;
                guard.0 = None;
                let mut res = Response::builder().status(status);
                if status == 503 {
                    res = res.header(http::header::RETRY_AFTER, "1");
                }
                Ok(res.body(()).unwrap())
            }
        })
    }
}

/// Counts a drop before the answer.
struct DropGuard(Option<Arc<AtomicU32>>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn get() -> Req {
    Request::get("/orders/o-1").body(()).unwrap()
}

/// A hedge layer with a fixed delay of 50 ms and no budget.
fn hedge() -> HedgeLayerBuilder {
    HedgeLayer::builder()
        .delay(HedgeDelay::fixed(ms(50)))
        .no_budget()
}

/// Call record, hedge, attempt record, server.
async fn call_recorded(
    layer: HedgeLayer,
    server: &Server,
    req: Req,
) -> (
    Result<Res, surely::Error<std::io::Error>>,
    Duration,
    InMemoryRecorder,
) {
    let records = InMemoryRecorder::new();
    let mut svc = ServiceBuilder::new()
        .layer(RecordCallLayer::new(records.clone()))
        .layer(layer)
        .layer(RecordAttemptLayer::new(records.clone()))
        .service(server.service());
    let start = Instant::now();
    let out = svc.ready().await.unwrap().call(req).await;
    (out, start.elapsed(), records)
}

async fn call(
    layer: HedgeLayer,
    server: &Server,
    req: Req,
) -> (Result<Res, surely::Error<std::io::Error>>, Duration) {
    let mut svc = layer.layer(server.service());
    let start = Instant::now();
    let out = svc.ready().await.unwrap().call(req).await;
    (out, start.elapsed())
}

// ---- when a hedge is sent, and who wins -------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_hedge_fires_after_the_delay_and_the_first_good_answer_wins() {
    let server = Server::new(&[(1000, 200), (10, 200)]);
    let (out, took, records) = call_recorded(hedge().build().unwrap(), &server, get()).await;
    assert_eq!(out.unwrap().status(), StatusCode::OK);
    assert_eq!(took, ms(60), "the hedge sent at 50 ms answered 10 ms later");
    assert_eq!(server.calls(), 2);
    assert_eq!(server.dropped(), 1, "the slow first attempt was dropped");

    let mut attempts = records.attempts();
    attempts.sort_by_key(|a| a.attempt);
    assert_eq!(attempts.len(), 2);
    assert!(
        !attempts[0].hedge && attempts[0].cancelled,
        "{}",
        attempts[0]
    );
    assert!(
        attempts[1].hedge && !attempts[1].cancelled,
        "{}",
        attempts[1]
    );
    assert_eq!(attempts[1].class(), AttemptClass::Success);
    let call = &records.calls()[0];
    assert_eq!(call.outcome, Outcome::Succeeded);
    assert_eq!(call.attempts, 2);
    assert_eq!(
        call.stop,
        StopReason::Success,
        "the loser is not the call's last attempt"
    );
}

#[tokio::test(start_paused = true)]
async fn no_hedge_when_the_first_attempt_answers_in_time() {
    let server = Server::new(&[(49, 200)]);
    let (out, took) = call(hedge().build().unwrap(), &server, get()).await;
    assert!(out.is_ok());
    assert_eq!(took, ms(49));
    assert_eq!(server.calls(), 1);
    // The timer ended with the call: nothing is sent later.
    tokio::time::sleep(ms(1000)).await;
    assert_eq!(server.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_first_attempt_can_beat_its_hedge_which_is_recorded_as_a_cancelled_hedge() {
    let server = Server::new(&[(80, 200), (100, 200)]);
    let (out, took, records) = call_recorded(hedge().build().unwrap(), &server, get()).await;
    assert!(out.is_ok());
    assert_eq!(took, ms(80));
    assert_eq!(server.calls(), 2);
    assert_eq!(server.dropped(), 1);
    let hedge = records
        .attempts()
        .into_iter()
        .find(|a| a.attempt == 2)
        .expect("the hedge's record");
    assert!(hedge.hedge && hedge.cancelled, "{hedge}");
    assert!(hedge.to_string().contains("hedge cancelled"), "{hedge}");
}

#[tokio::test(start_paused = true)]
async fn a_final_answer_wins_too() {
    // A 404 is the server's answer: the hedge does not wait for a better one.
    let server = Server::new(&[(1000, 200), (10, 404)]);
    let (out, took) = call(hedge().build().unwrap(), &server, get()).await;
    assert_eq!(out.unwrap().status(), StatusCode::NOT_FOUND);
    assert_eq!(took, ms(60));
    assert_eq!(server.dropped(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_non_fatal_failure_sends_the_next_hedge_at_once() {
    let server = Server::new(&[(5, 502), (10, 200)]);
    let (out, took, records) = call_recorded(hedge().build().unwrap(), &server, get()).await;
    assert_eq!(out.unwrap().status(), StatusCode::OK);
    assert_eq!(took, ms(15), "the hedge went out at 5 ms, not at 50 ms");
    assert_eq!(server.calls(), 2);
    assert_eq!(server.dropped(), 0);
    let call = &records.calls()[0];
    assert_eq!((call.outcome, call.attempts), (Outcome::Succeeded, 2));
}

#[tokio::test(start_paused = true)]
async fn a_failure_while_a_hedge_runs_waits_for_the_hedge() {
    // The first fails at 70 ms, after the hedge was sent at 50 ms: no third attempt (limit 2),
    // and the hedge's answer wins.
    let server = Server::new(&[(70, 502), (30, 200)]);
    let (out, took) = call(hedge().build().unwrap(), &server, get()).await;
    assert_eq!(out.unwrap().status(), StatusCode::OK);
    assert_eq!(took, ms(80));
    assert_eq!(server.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_servers_pushback_delays_the_next_hedge() {
    // The first attempt is slow; its hedge, sent at 50 ms, gets a 503 with `Retry-After: 1` at
    // 55 ms: the next hedge waits a second, not the 50 ms delay, and the first answers before.
    let server = Server::new(&[(300, 200), (5, 503), (10, 200)]);
    let layer = hedge().max_attempts(3).build().unwrap();
    let (out, took) = call(layer, &server, get()).await;
    assert_eq!(out.unwrap().status(), StatusCode::OK);
    assert_eq!(took, ms(300));
    assert_eq!(server.calls(), 2);

    // With nothing else in flight, a pushback ends the race: waiting is the retry layer's job.
    let server = Server::new(&[(5, 503), (10, 200)]);
    let (out, took) = call(hedge().build().unwrap(), &server, get()).await;
    assert_eq!(out.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(took, ms(5));
    assert_eq!(server.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn when_every_attempt_fails_the_last_failure_is_the_result() {
    let server = Server::new(&[(5, 502), (10, 500)]);
    let (out, took) = call(hedge().build().unwrap(), &server, get()).await;
    assert_eq!(out.unwrap().status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(took, ms(15));
    assert_eq!(server.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_attempt_limit_is_respected() {
    let server = Server::new(&[(1000, 200)]);
    let layer = hedge().max_attempts(3).build().unwrap();
    let (out, took) = call(layer, &server, get()).await;
    assert!(out.is_ok());
    // Sent at 0, 50 and 100 ms; the first answers at 1000 ms.
    assert_eq!(took, ms(1000));
    assert_eq!(server.calls(), 3);
    assert_eq!(server.dropped(), 2);

    // The default is one hedge.
    let server = Server::new(&[(1000, 200)]);
    let layer = HedgeLayer::builder()
        .delay(HedgeDelay::fixed(ms(50)))
        .no_budget()
        .build()
        .unwrap();
    let _ = call(layer, &server, get()).await;
    assert_eq!(server.calls(), 2);

    // One attempt: no hedging at all.
    let server = Server::new(&[(1000, 200)]);
    let _ = call(hedge().max_attempts(1).build().unwrap(), &server, get()).await;
    assert_eq!(server.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_call_drops_every_attempt_and_the_timer() {
    let server = Server::new(&[(1000, 200)]);
    let mut svc = hedge()
        .max_attempts(3)
        .build()
        .unwrap()
        .layer(server.service());
    let fut = svc.ready().await.unwrap().call(get());
    assert!(tokio::time::timeout(ms(75), fut).await.is_err());
    assert_eq!(server.calls(), 2);
    assert_eq!(server.dropped(), 2);
    tokio::time::sleep(ms(1000)).await;
    assert_eq!(server.calls(), 2, "no hedge after the call was dropped");
}

#[tokio::test(start_paused = true)]
async fn a_delay_beyond_the_clocks_range_never_fires_and_does_not_panic() {
    // Past ten years, the builder refuses it; ten years never fires within the call.
    let err = HedgeLayer::builder()
        .delay(HedgeDelay::fixed(Duration::MAX))
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "hedge delay");
    let server = Server::new(&[(1000, 200), (1, 200)]);
    let layer = HedgeLayer::builder()
        .delay(HedgeDelay::fixed(surely::MAX_DURATION))
        .no_budget()
        .build()
        .unwrap();
    let (out, took) = call(layer, &server, get()).await;
    assert!(out.is_ok());
    assert_eq!(took, ms(1000));
    assert_eq!(server.calls(), 1);
}

// ---- what may be hedged -----------------------------------------------------------------------

/// Every option that could make a hedge more likely.
fn eager() -> HedgeLayer {
    HedgeLayer::builder()
        .delay(HedgeDelay::fixed(Duration::ZERO))
        .max_attempts(5)
        .hedge_idempotent(true)
        .no_budget()
        .min_attempt_time(Duration::ZERO)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn keyed_and_non_idempotent_requests_are_never_hedged() {
    let mut overridden = get();
    overridden.extensions_mut().insert(Semantics::Keyed);
    let mut non_idempotent = get();
    non_idempotent
        .extensions_mut()
        .insert(Semantics::NonIdempotent);
    let requests = [
        Request::post("/orders").body(()).unwrap(),
        Request::patch("/orders/o-1").body(()).unwrap(),
        Request::post("/orders")
            .header(IDEMPOTENCY_KEY, "k-1")
            .body(())
            .unwrap(),
        overridden,
        non_idempotent,
    ];
    for req in requests {
        let what = format!("{} {:?}", req.method(), surely::Envelope::semantics(&req));
        let server = Server::new(&[(1000, 200)]);
        let (out, took) = call(eager(), &server, req).await;
        assert!(out.is_ok(), "{what}");
        assert_eq!(took, ms(1000), "{what}");
        assert_eq!(server.calls(), 1, "{what} was hedged");
    }
    // Failures do not send hedges for them either.
    let server = Server::new(&[(5, 502), (10, 200)]);
    let post = Request::post("/orders").body(()).unwrap();
    let (out, _) = call(eager(), &server, post).await;
    assert_eq!(out.unwrap().status(), StatusCode::BAD_GATEWAY);
    assert_eq!(server.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn idempotent_requests_are_hedged_only_with_the_opt_in() {
    let put = || Request::put("/orders/o-1").body(()).unwrap();
    let server = Server::new(&[(1000, 200), (10, 200)]);
    let _ = call(hedge().build().unwrap(), &server, put()).await;
    assert_eq!(server.calls(), 1, "not hedged by default");

    let server = Server::new(&[(1000, 200), (10, 200)]);
    let (_, took) = call(
        hedge().hedge_idempotent(true).build().unwrap(),
        &server,
        put(),
    )
    .await;
    assert_eq!(server.calls(), 2);
    assert_eq!(took, ms(60));
}

// ---- the budget -------------------------------------------------------------------------------

/// Counts what a layer asks of its budget, and refuses withdrawals when told to.
#[derive(Debug, Default)]
struct Counting {
    deposits: AtomicU32,
    withdrawals: AtomicU32,
    outcomes: AtomicU32,
    refuse: bool,
}

impl RetryBudget for Counting {
    fn deposit(&self) {
        self.deposits.fetch_add(1, Ordering::SeqCst);
    }

    fn withdraw(&self) -> Result<(), BudgetExhausted> {
        self.withdrawals.fetch_add(1, Ordering::SeqCst);
        if self.refuse {
            let empty = RatioBudget::builder().min_per_sec(0.0).build().unwrap();
            return empty.withdraw();
        }
        Ok(())
    }

    fn record_outcome(&self, _: AttemptClass) {
        self.outcomes.fetch_add(1, Ordering::SeqCst);
    }
}

impl Counting {
    fn counts(&self) -> (u32, u32, u32) {
        (
            self.deposits.load(Ordering::SeqCst),
            self.withdrawals.load(Ordering::SeqCst),
            self.outcomes.load(Ordering::SeqCst),
        )
    }
}

#[tokio::test(start_paused = true)]
async fn no_hedge_when_the_budget_refuses() {
    let budget = Arc::new(Counting {
        refuse: true,
        ..Counting::default()
    });
    let server = Server::new(&[(1000, 200), (10, 200)]);
    let layer = hedge().budget(budget.clone()).build().unwrap();
    let (out, took) = call(layer, &server, get()).await;
    assert!(out.is_ok());
    assert_eq!(took, ms(1000));
    assert_eq!(server.calls(), 1);
    assert_eq!(budget.counts().1, 1, "asked once, refused");

    // A real budget: a ratio budget with no reserve and no first attempts has nothing.
    let empty: Arc<dyn RetryBudget> =
        Arc::new(RatioBudget::builder().min_per_sec(0.0).build().unwrap());
    let server = Server::new(&[(5, 502), (10, 200)]);
    let (out, _) = call(hedge().budget(empty).build().unwrap(), &server, get()).await;
    assert_eq!(out.unwrap().status(), StatusCode::BAD_GATEWAY);
    assert_eq!(server.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_shared_budget_is_only_withdrawn_from_and_an_own_one_is_also_deposited_to() {
    // Shared with a retry layer outside: one withdrawal per hedge, no deposit; the outcome of
    // the attempt returned is the retry layer's to record, the loser's was never known.
    let shared = Arc::new(Counting::default());
    let server = Server::new(&[(1000, 200), (10, 200)]);
    let _ = call(
        hedge().budget(shared.clone()).build().unwrap(),
        &server,
        get(),
    )
    .await;
    assert_eq!(shared.counts(), (0, 1, 0));

    // A failure that is not returned is recorded.
    let shared = Arc::new(Counting::default());
    let server = Server::new(&[(5, 502), (10, 200)]);
    let _ = call(
        hedge().budget(shared.clone()).build().unwrap(),
        &server,
        get(),
    )
    .await;
    assert_eq!(shared.counts(), (0, 1, 1));

    // Its own: a deposit per hedgeable call, and every finished attempt's outcome.
    let own = Arc::new(Counting::default());
    let server = Server::new(&[(5, 502), (10, 200)]);
    let _ = call(
        hedge().own_budget(own.clone()).build().unwrap(),
        &server,
        get(),
    )
    .await;
    assert_eq!(own.counts(), (1, 1, 2));
    // A call that may not be hedged leaves it alone.
    let post = Request::post("/orders").body(()).unwrap();
    let _ = call(
        hedge().own_budget(own.clone()).build().unwrap(),
        &server,
        post,
    )
    .await;
    assert_eq!(own.counts(), (1, 1, 2));
}

#[tokio::test(start_paused = true)]
async fn the_default_budget_bounds_hedges_to_a_share_of_calls() {
    // 1000 slow calls at once: without a budget each would be hedged. The default budget
    // allows 10% of calls plus a reserve of 10 a second over its 10 s window: at most 200.
    let server = Server::new(&[(100, 200)]);
    let svc = HedgeLayer::builder()
        .delay(HedgeDelay::fixed(ms(50)))
        .build()
        .unwrap()
        .layer(server.service());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..1000 {
        let mut svc = svc.clone();
        tasks.spawn(async move { svc.ready().await.unwrap().call(get()).await.unwrap() });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let hedges = server.calls() - 1000;
    assert!((100..=200).contains(&hedges), "{hedges}");
}

/// A hand-built retry layer over a hedge layer given no budget: the retry layer lends the call
/// its budget, and hedges and retries drain that one budget.
#[tokio::test(start_paused = true)]
async fn a_retry_layer_outside_lends_its_budget_to_a_hedge_given_none() {
    // Attempt 1 is slow, its hedge (attempt 2) fails at once with a 502, so the hedge layer
    // returns that failure when attempt 1 fails too; the retry layer then retries (attempt 3).
    let server = Server::new(&[(100, 502), (10, 502), (10, 200)]);
    let budget = Arc::new(Counting::default());
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::builder()
                .backoff(Backoff::none())
                .budget(budget.clone())
                .build()
                .unwrap(),
        )
        .layer(
            HedgeLayer::builder()
                .delay(HedgeDelay::fixed(ms(50)))
                .build()
                .unwrap(),
        )
        .service(server.service());
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(server.calls(), 3);
    // One deposit (the retry layer's, for the call), two withdrawals from the one budget: the
    // hedge and the retry. The hedge layer kept no budget of its own for this call.
    let (deposits, withdrawals, _) = budget.counts();
    assert_eq!((deposits, withdrawals), (1, 2));

    // A lent budget that refuses stops the hedges too: the hedge layer's own default budget
    // would have let this one through.
    let refusing = Arc::new(Counting {
        refuse: true,
        ..Counting::default()
    });
    let server = Server::new(&[(1000, 200), (10, 200)]);
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::builder()
                .budget(refusing.clone())
                .build()
                .unwrap(),
        )
        .layer(
            HedgeLayer::builder()
                .delay(HedgeDelay::fixed(ms(50)))
                .build()
                .unwrap(),
        )
        .service(server.service());
    let start = Instant::now();
    svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(start.elapsed(), ms(1000));
    assert_eq!(server.calls(), 1, "no hedge: the lent budget refused");
    assert_eq!(refusing.counts().1, 1);

    // A hedge given a budget of its own keeps it.
    let own = Arc::new(Counting::default());
    let outer = Arc::new(Counting::default());
    let server = Server::new(&[(1000, 200), (10, 200)]);
    let mut svc = ServiceBuilder::new()
        .layer(RetryLayer::builder().budget(outer.clone()).build().unwrap())
        .layer(hedge().own_budget(own.clone()).build().unwrap())
        .service(server.service());
    svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(server.calls(), 2);
    assert_eq!(own.counts().1, 1);
    assert_eq!(outer.counts().1, 0);
}

/// `docs::retries`: a hedge layer called from another task (behind a `tower::buffer::Buffer`)
/// is lent nothing, and pays from a `RatioBudget` of its own, whose reserve lets this hedge
/// through where the retry layer's refusing budget would not have.
#[tokio::test(start_paused = true)]
async fn behind_a_buffer_a_hedge_given_no_budget_keeps_its_own() {
    let refusing = Arc::new(Counting {
        refuse: true,
        ..Counting::default()
    });
    let server = Server::new(&[(1000, 200), (10, 200)]);
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::builder()
                .budget(refusing.clone())
                .build()
                .unwrap(),
        )
        .buffer(8)
        .layer(
            HedgeLayer::builder()
                .delay(HedgeDelay::fixed(ms(50)))
                .build()
                .unwrap(),
        )
        .service(server.service());
    let start = Instant::now();
    svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(start.elapsed(), ms(60), "the hedge answered");
    assert_eq!(server.calls(), 2);
    assert_eq!(
        refusing.counts().1,
        0,
        "the retry layer's budget was not asked"
    );
}

// ---- the deadline -----------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn no_hedge_that_the_deadline_leaves_no_time_for() {
    // The request's own deadline: at 50 ms only 5 ms would be left, less than the 10 ms a hedge
    // needs.
    let server = Server::new(&[(1000, 200), (1, 200)]);
    let mut req = get();
    req.extensions_mut().insert(Deadline::after(ms(55)));
    let (_, took) = call(hedge().build().unwrap(), &server, req).await;
    assert_eq!(took, ms(1000));
    assert_eq!(server.calls(), 1);

    // With room, the hedge goes.
    let server = Server::new(&[(1000, 200), (1, 200)]);
    let mut req = get();
    req.extensions_mut().insert(Deadline::after(ms(61)));
    let (_, took) = call(hedge().build().unwrap(), &server, req).await;
    assert_eq!(took, ms(51));
    assert_eq!(server.calls(), 2);

    // The call's deadline, from a deadline layer outside: the call ends at 55 ms, unhedged.
    let server = Server::new(&[(1000, 200), (1, 200)]);
    let mut svc = ServiceBuilder::new()
        .layer(SetDeadlineLayer::new(ms(55)))
        .layer(hedge().build().unwrap())
        .service(server.service());
    let start = Instant::now();
    let err = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err}");
    assert_eq!(start.elapsed(), ms(55));
    assert_eq!(server.calls(), 1);

    // A failure does not send a hedge the deadline leaves no time for either.
    let server = Server::new(&[(50, 502), (1, 200)]);
    let mut req = get();
    req.extensions_mut().insert(Deadline::after(ms(55)));
    let (out, _) = call(hedge().build().unwrap(), &server, req).await;
    assert_eq!(out.unwrap().status(), StatusCode::BAD_GATEWAY);
    assert_eq!(server.calls(), 1);
}

// ---- the learned delay ------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_learned_delay_converges_to_the_percentile_and_follows_a_change() {
    let layer = HedgeLayer::builder()
        .delay(
            HedgeDelay::percentile(90.0)
                .fallback(Duration::from_secs(10))
                .min_samples(20)
                .window(100),
        )
        .no_budget()
        .build()
        .unwrap();
    assert_eq!(
        layer.current_delay(),
        Duration::from_secs(10),
        "the fallback"
    );
    // 1..=20 ms: the 90th percentile is 18 ms.
    let script: Vec<(u64, u16)> = (1..=20).rev().map(|l| (l, 200)).collect();
    let server = Server::new(&script);
    let mut svc = layer.layer(server.service());
    for _ in 0..20 {
        svc.ready().await.unwrap().call(get()).await.unwrap();
    }
    assert_eq!(server.calls(), 20, "no hedge while learning");
    let d = layer.current_delay();
    assert!(d >= ms(18) && d <= ms(18) + ms(18) / 100, "{d:?}");

    // The service slows down to 50 ms: the delay follows within a window. Hedges go out at
    // ~18 ms meanwhile, and lose to the first attempts.
    let server = Server::new(&[(50, 200)]);
    let mut svc = layer.layer(server.service());
    for _ in 0..100 {
        svc.ready().await.unwrap().call(get()).await.unwrap();
    }
    let d = layer.current_delay();
    assert!(d >= ms(50) && d <= ms(51), "{d:?}");
    // Now no more hedges.
    let before = server.calls();
    for _ in 0..10 {
        svc.ready().await.unwrap().call(get()).await.unwrap();
    }
    assert_eq!(server.calls() - before, 10);
}

// ---- configuration ----------------------------------------------------------------------------

#[test]
fn bad_configuration_is_a_config_error() {
    let cases: Vec<(HedgeLayerBuilder, &str)> = vec![
        (HedgeLayer::builder().max_attempts(0), "hedge attempt limit"),
        (
            HedgeLayer::builder().delay(HedgeDelay::percentile(0.0)),
            "hedge delay percentile",
        ),
        (
            HedgeLayer::builder().delay(HedgeDelay::percentile(100.5)),
            "hedge delay percentile",
        ),
        (
            HedgeLayer::builder().delay(HedgeDelay::percentile(f64::NAN)),
            "hedge delay percentile",
        ),
        (
            HedgeLayer::builder().delay(HedgeDelay::percentile(95.0).window(0)),
            "hedge delay window",
        ),
        (
            // One over the documented largest window, 2^20.
            HedgeLayer::builder().delay(HedgeDelay::percentile(95.0).window((1 << 20) + 1)),
            "hedge delay window",
        ),
        (
            HedgeLayer::builder().delay(HedgeDelay::percentile(95.0).min_samples(0)),
            "hedge delay minimum samples",
        ),
        (
            HedgeLayer::builder().delay(HedgeDelay::percentile(95.0).min_samples(2000)),
            "hedge delay minimum samples",
        ),
    ];
    for (builder, setting) in cases {
        let err = builder.build().unwrap_err();
        assert_eq!(err.setting(), setting);
        assert!(!err.to_string().is_empty());
    }
    assert!(HedgeLayer::builder()
        .delay(HedgeDelay::percentile(100.0).min_samples(1).window(1))
        .build()
        .is_ok());
}

// ---- composition ------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn composes_with_retry_outside_and_the_attempt_record_inside() {
    // Attempt 1 fails at 10 ms; its hedge (attempt 2) is sent at once and fails too; the hedge
    // layer returns the last failure, the retry layer retries (attempt 3), which answers.
    let server = Server::new(&[(10, 502), (10, 502), (10, 200)]);
    let budget: Arc<dyn RetryBudget> = Arc::new(RatioBudget::default());
    let records = InMemoryRecorder::new();
    let mut svc = ServiceBuilder::new()
        .layer(RecordCallLayer::new(records.clone()))
        .layer(SetDeadlineLayer::new(Duration::from_secs(2)))
        .layer(
            RetryLayer::builder()
                .backoff(Backoff::none())
                .budget(budget.clone())
                .build()
                .unwrap(),
        )
        .layer(hedge().budget(budget).build().unwrap())
        .layer(RecordAttemptLayer::new(records.clone()))
        .service(server.service());
    let start = Instant::now();
    let res = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), ms(30));
    let mut attempts = records.attempts();
    attempts.sort_by_key(|a| a.attempt);
    let shape: Vec<(u32, bool, AttemptClass)> = attempts
        .iter()
        .map(|a| (a.attempt, a.hedge, a.class()))
        .collect();
    assert_eq!(
        shape,
        [
            (1, false, AttemptClass::MaybeCommitted),
            (2, true, AttemptClass::MaybeCommitted),
            (3, false, AttemptClass::Success),
        ]
    );
    let call = &records.calls()[0];
    assert_eq!(
        (call.outcome, call.attempts, call.stop),
        (Outcome::Succeeded, 3, StopReason::Success)
    );
}

// ---- the tail-latency experiment --------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn hedging_cuts_the_tail_within_five_percent_of_extra_load() {
    let report = experiment::run(4000, 7).await;
    let none = &report.none;
    let surely = &report.surely;
    // Without hedging, the 2% of slow replies make the tail.
    assert!(none.p99 >= ms(200), "{report}");
    assert_eq!(none.extra_load, 0.0);
    // surely's hedge: p99 at most 3 × p50, at most 5% more attempts.
    assert!(surely.p99 <= surely.p50 * 3, "{report}");
    assert!(surely.extra_load <= 0.05, "{report}");
}

// ---- what each hedge is sent through ----------------------------------------------------------

/// A service whose calls' first attempts (even calls) answer after 200 ms, their hedges (odd
/// calls) at once.
fn gated(label: u32) -> Gated<()> {
    Gated::new(label, |n| {
        Box::pin(async move {
            if n.is_multiple_of(2) {
                tokio::time::sleep(ms(200)).await;
            }
            Ok(Response::new(()))
        })
    })
}

#[tokio::test(start_paused = true)]
async fn each_hedge_goes_through_a_clone_made_ready_and_the_hedges_see_get_mut() {
    let inner = gated(1);
    let labels = inner.labels();
    let mut svc = hedge().build().unwrap().layer(inner);
    // The first attempt is slow: a hedge is sent after 50 ms, through a clone made ready.
    let start = Instant::now();
    svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(start.elapsed(), ms(50));
    assert_eq!(*labels.lock().unwrap(), vec![1, 1]);
    // A change through `get_mut` reaches the first attempt and the hedge after it.
    svc.get_mut().label = 2;
    svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(*labels.lock().unwrap(), vec![1, 1, 2, 2]);
    // A clone of the layer's service hedges through the same inner settings.
    let mut other = svc.clone();
    other.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(*labels.lock().unwrap(), vec![1, 1, 2, 2, 2, 2]);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_whose_service_fails_its_readiness_is_not_sent_and_the_first_attempt_answers() {
    let inner = gated(1);
    let (labels, gate) = (inner.labels(), inner.clone());
    let mut svc = hedge().max_attempts(3).build().unwrap().layer(inner);
    // The first attempt goes through the service made ready here; the hedge's clone fails its
    // readiness at 50 ms: no hedge is sent then or later, and the slow first attempt answers.
    let ready = svc.ready().await.unwrap();
    gate.fail_readiness(1);
    let start = Instant::now();
    ready.call(get()).await.unwrap();
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(gate.readiness_failures_left(), 0);
    assert_eq!(*labels.lock().unwrap(), vec![1]);
    // The next calls hedge again, through fresh clones, which are ready: call 1 answers at
    // once; call 2 is slow, and its hedge (call 3) answers at 50 ms.
    svc.ready().await.unwrap().call(get()).await.unwrap();
    let start = Instant::now();
    svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(start.elapsed(), ms(50));
    assert_eq!(*labels.lock().unwrap(), vec![1, 1, 1, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_hedged_call_over_an_inner_that_is_send_but_not_sync_can_be_spawned() {
    // tower's `BoxCloneService` is `Send` and not `Sync`: the hedged call's future must still
    // be `Send`, as it was when it held a clone of the inner service.
    let inner = gated(7);
    let labels = inner.labels();
    let mut svc = hedge()
        .build()
        .unwrap()
        .layer(tower::util::BoxCloneService::new(inner));
    let call = svc.ready().await.unwrap().call(get());
    tokio::spawn(call).await.unwrap().unwrap();
    assert_eq!(*labels.lock().unwrap(), vec![7, 7]);
}
