//! What surely's client layers cost per call, next to the bare service and to tower's
//! `Timeout`, all measured in the same run, the same way.
//!
//! Every case drives an in-memory `tower::service_fn` on a current-thread tokio runtime (time
//! driver only): criterion's `iter_custom` runs one `block_on` of a loop of `iters` calls, each
//! `ready().await` then `call(req).await`, with the request built inside the loop. One criterion
//! iteration is therefore one call, and the runtime's `block_on` entry is amortised over the
//! whole loop.
//!
//! Groups (`family/request`):
//!
//! * `ready/…`: the inner future answers on its first poll (`std::future::ready`), the path of
//!   most calls. surely's layers start no timer here; tower's `Timeout` builds a `Sleep`.
//! * `pending_once/…`: the inner future wakes its task and returns `Pending` once, then answers,
//!   so every timeout layer has to arm its timer and disarm it when the answer comes.
//! * `…/plain`: a request type of the bench's own, `Req(u64)`, with the default [`Envelope`]
//!   (no headers, no extensions); the response is `Res` and the error `std::io::Error`.
//! * `…/http`: an `http::Request<()>` built with a `content-type` header (so its `HeaderMap`
//!   storage exists before any layer writes to it); the deadline layer writes
//!   `x-request-timeout-ms` into it. The response is a bare `http::Response<()>`;
//! * `retry_success/http_ext`: the same, but the response carries one extension before any
//!   layer sees it, as the responses of hyper-util's legacy client carry its `HttpInfo`.
//!
//! Cases (the layers of a stack listed outermost first, as a `ServiceBuilder` lists them):
//!
//! * `bare`: the service alone, the baseline;
//! * `tower_timeout`: `tower::timeout::Timeout` (1 s), the tower layer doing the nearest job;
//! * `timer_floor`: a layer of the bench's own that does only what every timeout must do, one
//!   tokio timer (1 s) armed when the inner future first waits and nothing else: no deadline,
//!   no record, no error of its own. On `pending_once` it is the floor of any layer built on
//!   tokio's timer, as `bare` is the floor of all;
//! * `surely_deadline`: `DeadlineLayer::new(1 s)`;
//! * `surely_attempt_timeout`: `AttemptTimeoutLayer::new(1 s)`;
//! * `surely_stack`: `DeadlineLayer` → `RecordAttemptLayer::new(())` → `AttemptTimeoutLayer`,
//!   the client stack of the crate docs without a call record. Its deadline layer counts on the
//!   attempt timeout inside to end attempts by the deadline (`enforce_in_attempts()`), as the
//!   canonical stack does, so it keeps no timer of its own;
//! * `surely_stack_call`: the same under `RecordCallLayer::new(())`, the full client stack.
//!
//! The retry family (`retry_success/plain`, `retry_fail_once/plain`) compares retry layers over
//! the `plain` request, with the error `io::ErrorKind::ConnectionRefused` (built from its kind,
//! so it does not allocate; classified *rejected*, so retried whatever the request):
//!
//! * `retry_success/…`: the inner service answers at once (`std::future::ready`);
//! * `retry_fail_once/…`: the inner service refuses the first attempt of every call and
//!   answers the retry (even inner calls fail, odd ones answer, counted per thread, so tower's
//!   and surely's cases see the same pattern). No backoff. Both budgets allow one retry per first
//!   attempt here (ratio 1.0, default window and reserve): at their defaults they would refuse
//!   after about a hundred calls.
//!
//! Its cases: `bare` (the inner answers alone: one on `success`, both on `fail_once`);
//! `tower_retry_tps`, tower's `Retry` with a policy as tower's budget docs write one (retry
//! every error, at most 2 retries, `TpsBudget`, default on `success`); `tower_retry_tps_timeout`,
//! the same over tower's `Timeout` (1 s), the reference of the family; `surely_retry`,
//! `RetryLayer` with the bench's classifier, `Backoff::none()` and its own `RatioBudget`; and
//! `surely_full`, `DeadlineLayer` (`enforce_in_attempts`) → `IdempotencyKeyLayer` (a pass-through
//! for `plain`) → `RetryLayer` → `RecordAttemptLayer::new(())` → `AttemptTimeoutLayer`.
//!
//! The record family (`record_body/http`) measures what records cost over HTTP, with a
//! recorder that is on and keeps nothing, at the head and at the end of each response's body
//! (the `http()` preset's way), and what the preset's body wrapper costs when no record layer
//! asks it to watch (the `()` recorder). No target; shown.
//!
//! The breaker family (`breaker_success/plain`) compares circuit breakers in the closed state on
//! the success path, over the `plain` request and the `ready` service: `bare`; `failsafe`,
//! failsafe's `StateMachine` at its default `Config` wrapping the inner future with its
//! futures-aware `CircuitBreaker::call`; `surely_breaker`, `CircuitBreakerLayer` over
//! `CircuitBreaker::new()` (its default window, the last 100 calls) with the bench's
//! classifier; and `surely_breaker_time`, the same with a time window (10 s in 10 buckets),
//! which reads the clock on every call. The target: surely's overhead over `bare` at most
//! 0.5 × failsafe's, with 0 allocations per call.
//!
//! The hedge family (`hedge_ready/safe`, `hedge_pending_once/safe`) compares hedge layers on
//! the success path when the hedge does not fire, over `Safe`, a request type like `plain`
//! whose [`Envelope`] says it is safe (so that surely's layer does hedge it): the inner future
//! answers on its first poll (`ready`) or after one `Pending` (`pending_once`). Its cases:
//! `bare`; `tower_hedge`, tower's `Hedge` (every request hedgeable, 95th percentile, 10 data
//! points, 10 s period); `surely_hedge`, `HedgeLayer::new()` (learned 95th percentile, a
//! `RatioBudget` of its own) with the bench's classifier. Target: surely's overhead over `bare`
//! ≤ 0.5 × tower's, and 0 allocations per call.
//!
//! Before criterion starts, the bench prints heap allocations per call for every case (10 000
//! calls counted by a `stats_alloc` global allocator, outside any timing), in total and over
//! `bare` (which includes building the request). After the last case it prints a summary: the
//! median ns per call of each case (the median of criterion's last `SAMPLE_SIZE` samples of the
//! case), its overhead over `bare`, its ratio to `tower_timeout` (`tower_retry_tps_timeout` in
//! the retry family) both as per-call times and as overheads, and whether the targets are met:
//!
//! * `surely_stack` per-call time ≤ 0.75 × `tower_timeout` on `ready/plain`, ≤ 1.0 × on
//!   `pending_once/plain` (the ratio of per-call times is the target; the ratio of overheads is
//!   shown too);
//! * `surely_full` per-call time ≤ 0.6 × `tower_retry_tps_timeout` on `retry_success/plain`,
//!   ≤ 0.75 × on `retry_fail_once/plain`;
//! * surely adds 0 allocations per call for `plain` requests (retries included), and at most
//!   one per header written for `http` requests.
//!
//! The time targets are judged on `plain` only, where both sides do the same work. On `http`
//! surely's deadline layer also writes `x-request-timeout-ms`, which no tower layer here does,
//! and one `HeaderMap::insert` of that name costs more than the whole stack does on `plain`; the
//! summary shows those ratios ("shown") without a verdict.
//!
//! Run it with `cargo bench --bench overhead` (about two minutes and a half); one group with
//! e.g. `cargo bench --bench overhead -- ready/plain`, the retry family with `-- retry`, the
//! breaker family with `-- breaker`. The machine is noisy: compare ratios from one
//! run, not absolute times across runs or machines.

use std::alloc::System;
use std::cell::Cell;
use std::fmt::Debug;
use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use criterion::Criterion;
use http::header::{HeaderValue, CONTENT_TYPE};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use surely::breaker::{CircuitBreaker, CircuitBreakerLayer, SlidingWindow};
use surely::budget::{RatioBudget, RetryBudget};
use surely::classify::{self, Attempted, Classification, ClassifyError, HttpClassifier};
use surely::deadline::{AttemptTimers, DeadlineLayer};
use surely::hedge::HedgeLayer;
use surely::idempotency::IdempotencyKeyLayer;
use surely::record::{Record, RecordAttemptLayer, RecordCallLayer, WatchTrailersLayer};
use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;
use surely::timeout::AttemptTimeoutLayer;
use surely::{Envelope, Semantics};
use tokio::runtime::Runtime;
use tower::retry::budget::{Budget, TpsBudget};
use tower::retry::{Policy, Retry};
use tower::timeout::Timeout;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

/// Counts every allocation of the process; the bench reads it around loops of calls.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The budget of every timeout and deadline: long enough never to fire.
const BUDGET: Duration = Duration::from_secs(1);
/// Criterion's settings: short, for a 2-core machine.
const WARM_UP: Duration = Duration::from_secs(1);
const MEASUREMENT: Duration = Duration::from_secs(2);
const SAMPLE_SIZE: usize = 50;
/// Calls counted per case in the allocation table, after `ALLOC_WARM_UP` uncounted ones.
const ALLOC_CALLS: u64 = 10_000;
const ALLOC_WARM_UP: u64 = 100;

const BARE: &str = "bare";
const TOWER: &str = "tower_timeout";
const TIMER_FLOOR: &str = "timer_floor";
const STACK: &str = "surely_stack";
const TOWER_RETRY: &str = "tower_retry_tps_timeout";
const FULL: &str = "surely_full";
/// The retry families' groups.
const RETRY_SUCCESS: &str = "retry_success/plain";
const RETRY_FAIL_ONCE: &str = "retry_fail_once/plain";
const RETRY_SUCCESS_HTTP: &str = "retry_success/http";
const RETRY_SUCCESS_HTTP_EXT: &str = "retry_success/http_ext";
/// What recording costs over HTTP, and settling each attempt at the end of its body.
const RECORD_BODY: &str = "record_body/http";
/// The breaker family's group and its reference.
const BREAKER_SUCCESS: &str = "breaker_success/plain";
const FAILSAFE: &str = "failsafe";
/// The hedge family's groups and its reference.
const HEDGE_READY: &str = "hedge_ready/safe";
const HEDGE_PENDING: &str = "hedge_pending_once/safe";
const TOWER_HEDGE: &str = "tower_hedge";
const SURELY_HEDGE: &str = "surely_hedge";
/// Retries allowed per call by the hand-written tower policy: surely's default attempt limit
/// (3, the first included) less the first.
const TOWER_RETRIES: u32 = 2;

// ---- the services -------------------------------------------------------------------------

/// A request type without headers or extensions. It carries an id, as a real request carries
/// data, which no layer reads.
#[allow(dead_code)]
#[derive(Clone)]
struct Req(u64);

impl Envelope for Req {}

/// Its response.
struct Res;

impl Envelope for Res {}

/// A request like `Req` that says it is safe (a read), so that a hedge layer may hedge it.
#[allow(dead_code)]
#[derive(Clone)]
struct Safe(u64);

impl Envelope for Safe {
    fn semantics(&self) -> Semantics {
        Semantics::Safe
    }
}

fn safe_req(i: u64) -> Safe {
    Safe(i)
}

fn safe_ready(_: Safe) -> Ready<io::Result<Res>> {
    ready(Ok(Res))
}

fn safe_pending(_: Safe) -> PendingOnce<io::Result<Res>> {
    PendingOnce::new(Ok(Res))
}

/// tower's hedge policy for `Safe`: every request may be hedged.
#[derive(Clone, Copy)]
struct TowerHedgeAll;

impl tower::hedge::Policy<Safe> for TowerHedgeAll {
    fn clone_request(&self, req: &Safe) -> Option<Safe> {
        Some(req.clone())
    }

    fn can_retry(&self, _: &Safe) -> bool {
        true
    }
}

fn plain_req(i: u64) -> Req {
    Req(i)
}

/// A GET with one header already in place, as a client would send.
fn http_req(_: u64) -> http::Request<()> {
    let mut req = http::Request::new(());
    req.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    req
}

fn plain_ready(_: Req) -> Ready<io::Result<Res>> {
    ready(Ok(Res))
}

fn plain_pending(_: Req) -> PendingOnce<io::Result<Res>> {
    PendingOnce::new(Ok(Res))
}

fn http_ready(_: http::Request<()>) -> Ready<io::Result<http::Response<()>>> {
    ready(Ok(http::Response::new(())))
}

/// What a connector leaves on its responses (hyper-util's `HttpInfo` is two addresses).
#[derive(Clone, Copy)]
struct ConnInfo {
    _remote: std::net::SocketAddr,
    _local: std::net::SocketAddr,
}

/// A response with one extension already in it, as hyper-util's legacy client returns them.
fn http_ext_ready(_: http::Request<()>) -> Ready<io::Result<http::Response<()>>> {
    let mut res = http::Response::new(());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 8080));
    res.extensions_mut().insert(ConnInfo {
        _remote: addr,
        _local: addr,
    });
    ready(Ok(res))
}

fn http_pending(_: http::Request<()>) -> PendingOnce<io::Result<http::Response<()>>> {
    PendingOnce::new(Ok(http::Response::new(())))
}

/// The classifier for `Res`: every response a success, every error as the error's kind says
/// (`surely::classify::ClassifyError`; a refused connection is *rejected*, so retried whatever
/// the request). The record layers never call it with the `()` recorder, but their bounds need
/// one; the retry layer calls it on every attempt.
fn classify_plain(
    attempt: Attempted<'_, Res, surely::Error<io::Error>>,
    _: Semantics,
) -> Classification {
    match attempt {
        Attempted::Response(_) => Classification::success(),
        Attempted::Error(e, phase) => e.classify_error(phase),
    }
}

thread_local! {
    /// The inner calls made by the `fail_once` service on this thread (the runtime's), so that
    /// every case, tower's and surely's, sees the same pattern.
    static INNER_CALLS: Cell<u64> = const { Cell::new(0) };
}

/// The `fail_once` pattern: the even inner calls (each call's first attempt) are refused,
/// the odd ones (its retry) answer. A call that retries once makes two inner calls, so every
/// call starts on an even one. The error is an `io::Error` made from its kind, which does not
/// allocate.
fn fail_once_answer() -> io::Result<Res> {
    let n = INNER_CALLS.with(|c| c.replace(c.get() + 1));
    if n.is_multiple_of(2) {
        Err(io::ErrorKind::ConnectionRefused.into())
    } else {
        Ok(Res)
    }
}

fn plain_fail_once(_: Req) -> Ready<io::Result<Res>> {
    ready(fail_once_answer())
}

/// The `fail_once` baseline: both inner answers of a call, with no layer deciding anything.
fn plain_fail_once_twice(_: Req) -> Ready<io::Result<Res>> {
    ready(fail_once_answer().or_else(|_| fail_once_answer()))
}

/// Starts a `fail_once` case on a call's first attempt.
fn reset_inner_calls() {
    INNER_CALLS.with(|c| c.set(0));
}

/// A future that is pending exactly once: its first poll wakes the task and returns `Pending`,
/// as a transport does when its answer is not there yet but is on its way.
struct PendingOnce<T> {
    value: Option<T>,
    polled: bool,
}

impl<T> PendingOnce<T> {
    fn new(value: T) -> Self {
        PendingOnce {
            value: Some(value),
            polled: false,
        }
    }
}

impl<T: Unpin> Future for PendingOnce<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        if !self.polled {
            self.polled = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(self.value.take().expect("polled after completion"))
    }
}

/// The `timer_floor` case: a timeout reduced to one tokio timer, armed on the inner future's
/// first `Pending` (never for a future that answers at once), polled after the inner future as
/// tower's `Timeout` polls its own.
#[derive(Clone)]
struct TimerOnly<S> {
    inner: S,
}

impl<S> TimerOnly<S> {
    fn new(inner: S) -> Self {
        TimerOnly { inner }
    }
}

impl<S, Rq> Service<Rq> for TimerOnly<S>
where
    S: Service<Rq, Error = io::Error>,
{
    type Response = S::Response;
    type Error = io::Error;
    type Future = TimerOnlyFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Rq) -> Self::Future {
        TimerOnlyFuture {
            inner: self.inner.call(req),
            sleep: None,
        }
    }
}

pin_project_lite::pin_project! {
    struct TimerOnlyFuture<F> {
        #[pin]
        inner: F,
        #[pin]
        sleep: Option<tokio::time::Sleep>,
    }
}

impl<F, T> Future for TimerOnlyFuture<F>
where
    F: Future<Output = io::Result<T>>,
{
    type Output = io::Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if let Poll::Ready(out) = this.inner.poll(cx) {
            return Poll::Ready(out);
        }
        if this.sleep.is_none() {
            this.sleep.set(Some(tokio::time::sleep(BUDGET)));
        }
        match this.sleep.as_pin_mut().map(|s| s.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(io::ErrorKind::TimedOut.into())),
            _ => Poll::Pending,
        }
    }
}

fn deadline() -> DeadlineLayer {
    DeadlineLayer::new(BUDGET).expect("a valid deadline")
}

/// The deadline layer of a stack with an attempt timeout inside: that timeout ends each
/// attempt by the deadline, so the deadline layer keeps no timer of its own
/// (`surely::deadline::AttemptTimers`), as the canonical stack does.
fn stack_deadline() -> DeadlineLayer<AttemptTimers> {
    DeadlineLayer::builder()
        .timeout(BUDGET)
        .enforce_in_attempts()
        .build()
        .expect("a valid deadline")
}

fn attempt_timeout() -> AttemptTimeoutLayer {
    AttemptTimeoutLayer::new(BUDGET).expect("a valid attempt timeout")
}

/// A tower retry policy as tower's budget docs write one: retry every error, up to
/// `TOWER_RETRIES` times a call, while the budget allows; deposit on success.
#[derive(Clone)]
struct TowerPolicy {
    budget: Arc<TpsBudget>,
    retries_left: u32,
}

impl TowerPolicy {
    fn new(budget: TpsBudget) -> Self {
        TowerPolicy {
            budget: Arc::new(budget),
            retries_left: TOWER_RETRIES,
        }
    }
}

impl<Rq: Clone, Res, E> Policy<Rq, Res, E> for TowerPolicy {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Rq, result: &mut Result<Res, E>) -> Option<Ready<()>> {
        match result {
            Ok(_) => {
                self.budget.deposit();
                None
            }
            Err(_) => {
                if self.retries_left == 0 || !self.budget.withdraw() {
                    return None;
                }
                self.retries_left -= 1;
                Some(ready(()))
            }
        }
    }

    fn clone_request(&mut self, req: &Rq) -> Option<Rq> {
        Some(req.clone())
    }
}

/// The retry family over `http::Request<()>` on the success path: what a retry layer costs,
/// and allocates, when the request is an HTTP request that it must be able to send again.
/// `$svc` answers with a bare response (`retry_success/http`) or one that carries an
/// extension already (`retry_success/http_ext`), as hyper-util's client responses carry its
/// `HttpInfo`; `$outcome` is what handing the outcome back allocates into that response.
macro_rules! retry_http_group {
    ($group:expr, $svc:expr, outcome = $outcome:literal) => {
        [
            Case {
                group: $group,
                name: BARE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || driver(service_fn($svc), http_req),
            },
            Case {
                group: $group,
                name: TOWER_RETRY,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let svc = Retry::new(
                        TowerPolicy::new(tps_default()),
                        Timeout::new(service_fn($svc), BUDGET),
                    );
                    driver(svc, http_req)
                },
            },
            Case {
                group: $group,
                name: FULL,
                headers_written: 1,
                outcome_allocs: $outcome,
                make: || {
                    let svc = ServiceBuilder::new()
                        .layer(stack_deadline())
                        .layer(IdempotencyKeyLayer::new())
                        .layer(retry(HttpClassifier::new(), ratio_default()))
                        .layer(RecordAttemptLayer::new(()))
                        .layer(attempt_timeout())
                        .service(service_fn($svc));
                    driver(svc, http_req)
                },
            },
        ]
    };
}

/// A response whose body is a whole message, as most HTTP answers are.
fn http_full_ready(
    _: http::Request<()>,
) -> Ready<io::Result<http::Response<http_body_util::Full<bytes::Bytes>>>> {
    ready(Ok(http::Response::new(http_body_util::Full::new(
        bytes::Bytes::from_static(b"created"),
    ))))
}

/// A recorder that is on and keeps nothing: the cost of making the records, not of storing
/// them.
fn discard(_: Record<'_>) {}

/// The record family over HTTP: `bare`; `surely_watch_unasked`, `WatchTrailersLayer` with no
/// record layer asking (the `http()` preset's transport wrapper with the `()` recorder);
/// `surely_record`, `RecordCallLayer` → `RecordAttemptLayer` with a recorder that is on and
/// keeps nothing, recording at the head; `surely_record_body_end`, the same recording each
/// attempt when its body ends (`at_body_end()` over `WatchTrailersLayer`, the `http()`
/// preset's way). The driver drops each response, which ends its body.
fn record_body_group() -> [Case; 4] {
    [
        Case {
            group: RECORD_BODY,
            name: BARE,
            headers_written: 0,
            outcome_allocs: 0,
            make: || driver(service_fn(http_full_ready), http_req),
        },
        Case {
            group: RECORD_BODY,
            name: "surely_watch_unasked",
            headers_written: 0,
            outcome_allocs: 0,
            make: || {
                let svc = WatchTrailersLayer::new().layer(service_fn(http_full_ready));
                driver(svc, http_req)
            },
        },
        Case {
            group: RECORD_BODY,
            name: "surely_record",
            headers_written: 0,
            outcome_allocs: 0,
            make: || {
                let rec = discard as fn(Record<'_>);
                let svc = ServiceBuilder::new()
                    .layer(RecordCallLayer::new(rec))
                    .layer(RecordAttemptLayer::new(rec))
                    .service(service_fn(http_full_ready));
                driver(svc, http_req)
            },
        },
        Case {
            group: RECORD_BODY,
            name: "surely_record_body_end",
            headers_written: 0,
            outcome_allocs: 0,
            make: || {
                let rec = discard as fn(Record<'_>);
                let svc = ServiceBuilder::new()
                    .layer(RecordCallLayer::new(rec))
                    .layer(RecordAttemptLayer::new(rec).at_body_end())
                    .layer(WatchTrailersLayer::new())
                    .service(service_fn(http_full_ready));
                driver(svc, http_req)
            },
        },
    ]
}

/// The budgets of the `success` path: tower's `TpsBudget` and surely's `RatioBudget` at their
/// defaults (20% and 10% of first attempts, plus a reserve of 10 retries a second).
fn tps_default() -> TpsBudget {
    TpsBudget::default()
}

fn ratio_default() -> Option<Arc<dyn RetryBudget>> {
    None
}

/// The budgets of the `fail_once` path, where every call retries once: at their defaults both
/// would refuse retries after about a hundred calls (the reserve), so both allow one retry per
/// first attempt (ratio 1.0), with the default window and reserve. The work per deposit and
/// withdrawal is the same whatever the ratio.
fn tps_one_per_call() -> TpsBudget {
    TpsBudget::new(Duration::from_secs(10), 10, 1.0)
}

fn ratio_one_per_call() -> Option<Arc<dyn RetryBudget>> {
    let budget = RatioBudget::builder()
        .ratio(1.0)
        .build()
        .expect("a valid budget");
    Some(Arc::new(budget))
}

/// surely's retry layer with `classifier`, no backoff, and its own default budget (`None`) or
/// the one given.
fn retry<M>(classifier: M, budget: Option<Arc<dyn RetryBudget>>) -> RetryLayer<M> {
    let builder = RetryLayer::builder()
        .classifier(classifier)
        .backoff(Backoff::none());
    match budget {
        Some(budget) => builder.budget(budget),
        None => builder,
    }
    .build()
    .expect("a valid retry layer")
}

/// failsafe's circuit breaker as a tower service: its futures-aware `CircuitBreaker::call`
/// around the inner service's future (failsafe asks for permission on the future's first poll
/// and counts the result when it ends).
struct Failsafe<S, B> {
    inner: S,
    breaker: B,
}

impl<S, B> Service<Req> for Failsafe<S, B>
where
    S: Service<Req>,
    B: failsafe::futures::CircuitBreaker,
{
    type Response = S::Response;
    type Error = failsafe::Error<S::Error>;
    type Future = failsafe::futures::ResponseFuture<
        S::Future,
        B::FailurePolicy,
        B::Instrument,
        failsafe::Any,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(failsafe::Error::Inner)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.breaker.call(self.inner.call(req))
    }
}

/// The bench's classifier, as a function pointer.
type PlainClassifier =
    fn(Attempted<'_, Res, surely::Error<io::Error>>, Semantics) -> Classification;

/// surely's breaker with the bench's classifier, over `breaker`.
fn surely_breaker(
    breaker: CircuitBreaker,
) -> CircuitBreakerLayer<classify::ClassifyFn<PlainClassifier>> {
    CircuitBreakerLayer::new(breaker)
        .classifier(classify::from_fn(classify_plain as PlainClassifier))
}

// ---- driving them -------------------------------------------------------------------------

/// A service and the requests to give it, behind one object-safe method so that the cases,
/// each a different type, fit in one list. The loop itself is monomorphic.
trait Drive {
    /// Makes `n` successful calls on `rt` and returns how long they took.
    fn run(&mut self, rt: &Runtime, n: u64) -> Duration;
}

struct Driver<S, F> {
    svc: S,
    make_req: F,
}

impl<S, F, Rq> Drive for Driver<S, F>
where
    S: Service<Rq>,
    S::Error: Debug,
    F: Fn(u64) -> Rq,
{
    fn run(&mut self, rt: &Runtime, n: u64) -> Duration {
        let Driver { svc, make_req } = self;
        rt.block_on(async {
            let start = Instant::now();
            for i in 0..n {
                let req = make_req(i);
                let svc = svc.ready().await.expect("always ready");
                black_box(svc.call(req).await.expect("the success path"));
            }
            start.elapsed()
        })
    }
}

fn driver<S, Rq>(svc: S, make_req: fn(u64) -> Rq) -> Box<dyn Drive>
where
    S: Service<Rq> + 'static,
    S::Error: Debug,
    Rq: 'static,
{
    Box::new(Driver { svc, make_req })
}

/// One benchmarked case: its group, its name, how many headers its layers write, what handing
/// the call's outcome back costs in allocations, and how to build it.
struct Case {
    group: &'static str,
    name: &'static str,
    headers_written: u32,
    /// The allocations of the one extension insert that hands the call's outcome back in an
    /// `http::Response` (DESIGN §1): the boxed outcome, and for a response with no extensions
    /// yet, the extension map and its table as well. 0 where the response has no extensions
    /// (`plain`) or no layer hands an outcome back.
    outcome_allocs: u32,
    make: fn() -> Box<dyn Drive>,
}

/// The seven cases of one group.
macro_rules! group {
    (
        $group:literal,
        $svc:expr,
        $req:expr,
        $classifier:expr,
        headers = $headers:literal,
        outcome = $outcome:literal
    ) => {
        [
            Case {
                group: $group,
                name: BARE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || driver(service_fn($svc), $req),
            },
            Case {
                group: $group,
                name: TOWER,
                headers_written: 0,
                outcome_allocs: 0,
                make: || driver(Timeout::new(service_fn($svc), BUDGET), $req),
            },
            Case {
                group: $group,
                name: TIMER_FLOOR,
                headers_written: 0,
                outcome_allocs: 0,
                make: || driver(TimerOnly::new(service_fn($svc)), $req),
            },
            Case {
                group: $group,
                name: "surely_deadline",
                headers_written: $headers,
                outcome_allocs: 0,
                make: || driver(deadline().layer(service_fn($svc)), $req),
            },
            Case {
                group: $group,
                name: "surely_attempt_timeout",
                headers_written: 0,
                outcome_allocs: 0,
                make: || driver(attempt_timeout().layer(service_fn($svc)), $req),
            },
            Case {
                group: $group,
                name: STACK,
                headers_written: $headers,
                outcome_allocs: 0,
                make: || {
                    let svc = ServiceBuilder::new()
                        .layer(stack_deadline())
                        .layer(RecordAttemptLayer::new(()).with_classifier($classifier))
                        .layer(attempt_timeout())
                        .service(service_fn($svc));
                    driver(svc, $req)
                },
            },
            Case {
                group: $group,
                name: "surely_stack_call",
                headers_written: $headers,
                outcome_allocs: $outcome,
                make: || {
                    let svc = ServiceBuilder::new()
                        .layer(RecordCallLayer::new(()).with_classifier($classifier))
                        .layer(stack_deadline())
                        .layer(RecordAttemptLayer::new(()).with_classifier($classifier))
                        .layer(attempt_timeout())
                        .service(service_fn($svc));
                    driver(svc, $req)
                },
            },
        ]
    };
}

/// The five cases of one retry group, all over the `plain` request: the inner service
/// `$svc`, the baseline `$bare` (the same inner answers without any layer), and the budgets
/// `$tps` (tower's) and `$ratio` (surely's).
macro_rules! retry_group {
    ($group:expr, $svc:expr, $bare:expr, $tps:expr, $ratio:expr) => {
        [
            Case {
                group: $group,
                name: BARE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    reset_inner_calls();
                    driver(service_fn($bare), plain_req)
                },
            },
            Case {
                group: $group,
                name: "tower_retry_tps",
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    reset_inner_calls();
                    driver(
                        Retry::new(TowerPolicy::new($tps), service_fn($svc)),
                        plain_req,
                    )
                },
            },
            Case {
                group: $group,
                name: TOWER_RETRY,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    reset_inner_calls();
                    let svc = Retry::new(
                        TowerPolicy::new($tps),
                        Timeout::new(service_fn($svc), BUDGET),
                    );
                    driver(svc, plain_req)
                },
            },
            Case {
                group: $group,
                name: "surely_retry",
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    reset_inner_calls();
                    let layer = retry(classify::from_fn(classify_plain), $ratio);
                    driver(layer.layer(service_fn($svc)), plain_req)
                },
            },
            Case {
                group: $group,
                name: FULL,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    reset_inner_calls();
                    let svc = ServiceBuilder::new()
                        .layer(stack_deadline())
                        .layer(IdempotencyKeyLayer::new())
                        .layer(retry(classify::from_fn(classify_plain), $ratio))
                        .layer(
                            RecordAttemptLayer::new(())
                                .with_classifier(classify::from_fn(classify_plain)),
                        )
                        .layer(attempt_timeout())
                        .service(service_fn($svc));
                    driver(svc, plain_req)
                },
            },
        ]
    };
}

/// The breaker family: closed breakers on the success path.
fn breaker_group() -> [Case; 4] {
    [
        Case {
            group: BREAKER_SUCCESS,
            name: BARE,
            headers_written: 0,
            outcome_allocs: 0,
            make: || driver(service_fn(plain_ready), plain_req),
        },
        Case {
            group: BREAKER_SUCCESS,
            name: FAILSAFE,
            headers_written: 0,
            outcome_allocs: 0,
            make: || {
                let svc = Failsafe {
                    inner: service_fn(plain_ready),
                    breaker: failsafe::Config::new().build(),
                };
                driver(svc, plain_req)
            },
        },
        Case {
            group: BREAKER_SUCCESS,
            name: "surely_breaker",
            headers_written: 0,
            outcome_allocs: 0,
            make: || {
                let layer = surely_breaker(CircuitBreaker::new());
                driver(layer.layer(service_fn(plain_ready)), plain_req)
            },
        },
        Case {
            group: BREAKER_SUCCESS,
            name: "surely_breaker_time",
            headers_written: 0,
            outcome_allocs: 0,
            make: || {
                let breaker = CircuitBreaker::builder()
                    .window(SlidingWindow::Time {
                        length: Duration::from_secs(10),
                        buckets: 10,
                    })
                    .build()
                    .expect("a valid breaker");
                driver(
                    surely_breaker(breaker).layer(service_fn(plain_ready)),
                    plain_req,
                )
            },
        },
    ]
}

/// The three cases of one hedge group over `Safe`, the inner service `$svc`.
macro_rules! hedge_group {
    ($group:expr, $svc:expr) => {
        [
            Case {
                group: $group,
                name: BARE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || driver(service_fn($svc), safe_req),
            },
            Case {
                group: $group,
                name: TOWER_HEDGE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let svc = tower::hedge::Hedge::new::<Safe>(
                        service_fn($svc),
                        TowerHedgeAll,
                        10,
                        0.95,
                        Duration::from_secs(10),
                    );
                    driver(svc, safe_req)
                },
            },
            Case {
                group: $group,
                name: SURELY_HEDGE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let layer = HedgeLayer::builder()
                        .classifier(classify::from_fn(classify_plain))
                        .build()
                        .expect("a valid hedge layer");
                    driver(layer.layer(service_fn($svc)), safe_req)
                },
            },
        ]
    };
}

fn cases() -> Vec<Case> {
    [
        group!(
            "ready/plain",
            plain_ready,
            plain_req,
            classify::from_fn(classify_plain),
            headers = 0,
            outcome = 0
        ),
        group!(
            "ready/http",
            http_ready,
            http_req,
            HttpClassifier::new(),
            headers = 1,
            outcome = 3
        ),
        group!(
            "pending_once/plain",
            plain_pending,
            plain_req,
            classify::from_fn(classify_plain),
            headers = 0,
            outcome = 0
        ),
        group!(
            "pending_once/http",
            http_pending,
            http_req,
            HttpClassifier::new(),
            headers = 1,
            outcome = 3
        ),
    ]
    .into_iter()
    .flatten()
    .chain(retry_group!(
        RETRY_SUCCESS,
        plain_ready,
        plain_ready,
        tps_default(),
        ratio_default()
    ))
    .chain(retry_group!(
        RETRY_FAIL_ONCE,
        plain_fail_once,
        plain_fail_once_twice,
        tps_one_per_call(),
        ratio_one_per_call()
    ))
    .chain(retry_http_group!(
        RETRY_SUCCESS_HTTP,
        http_ready,
        outcome = 3
    ))
    .chain(retry_http_group!(
        RETRY_SUCCESS_HTTP_EXT,
        http_ext_ready,
        outcome = 1
    ))
    .chain(record_body_group())
    .chain(breaker_group())
    .chain(hedge_group!(HEDGE_READY, safe_ready))
    .chain(hedge_group!(HEDGE_PENDING, safe_pending))
    .collect()
}

/// The tower case a group's cases are compared with.
fn reference(group: &str) -> &'static str {
    if group.starts_with("retry_") {
        TOWER_RETRY
    } else if group == BREAKER_SUCCESS {
        FAILSAFE
    } else if group.starts_with("hedge_") {
        TOWER_HEDGE
    } else {
        TOWER
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime")
}

// ---- allocations --------------------------------------------------------------------------

/// Allocations (and reallocations) per call of each case, in case order.
fn count_allocations(rt: &Runtime, cases: &[Case]) -> Vec<f64> {
    cases
        .iter()
        .map(|case| {
            let mut drive = (case.make)();
            drive.run(rt, ALLOC_WARM_UP);
            let region = Region::new(GLOBAL);
            drive.run(rt, ALLOC_CALLS);
            let change = region.change();
            (change.allocations + change.reallocations) as f64 / ALLOC_CALLS as f64
        })
        .collect()
}

/// The index of `name` in `group`.
fn find(cases: &[Case], group: &str, name: &str) -> Option<usize> {
    cases
        .iter()
        .position(|c| c.group == group && c.name == name)
}

fn print_allocations(cases: &[Case], allocs: &[f64]) {
    println!("heap allocations per successful call ({ALLOC_CALLS} calls per case)");
    println!(
        "{:<22} {:<24} {:>7} {:>11} {:>8} {:>8}  target",
        "group", "case", "total", "over bare", "headers", "outcome"
    );
    for (i, case) in cases.iter().enumerate() {
        let bare = find(cases, case.group, BARE).map_or(0.0, |b| allocs[b]);
        let added = allocs[i] - bare;
        let verdict = if case.name == BARE
            || case.group == RECORD_BODY
            || case.name == TIMER_FLOOR
            || case.name.starts_with("tower")
            || case.name == FAILSAFE
        {
            "-"
        } else if added <= f64::from(case.headers_written + case.outcome_allocs) {
            "met"
        } else {
            "MISSED"
        };
        println!(
            "{:<22} {:<24} {:>7.2} {:>11.2} {:>8} {:>8}  {verdict}",
            case.group, case.name, allocs[i], added, case.headers_written, case.outcome_allocs
        );
    }
    println!();
}

// ---- timing -------------------------------------------------------------------------------

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}

/// Runs every case under criterion and returns each one's median ns per call, if criterion
/// measured it (not filtered out, not in `--test` mode).
fn bench(c: &mut Criterion, rt: &Runtime, cases: &[Case]) -> Vec<Option<f64>> {
    let mut medians = vec![None; cases.len()];
    let mut i = 0;
    while i < cases.len() {
        let group_name = cases[i].group;
        let mut group = c.benchmark_group(group_name);
        while i < cases.len() && cases[i].group == group_name {
            let mut drive = (cases[i].make)();
            let mut per_call = Vec::new();
            group.bench_function(cases[i].name, |b| {
                b.iter_custom(|iters| {
                    let took = drive.run(rt, iters);
                    per_call.push(took.as_nanos() as f64 / iters as f64);
                    took
                })
            });
            // Criterion's measured samples are its last calls; the ones before are warm-up.
            if per_call.len() >= SAMPLE_SIZE {
                medians[i] = Some(median(&per_call[per_call.len() - SAMPLE_SIZE..]));
            }
            i += 1;
        }
        group.finish();
    }
    medians
}

fn print_summary(cases: &[Case], medians: &[Option<f64>]) {
    if medians.iter().all(Option::is_none) {
        return;
    }
    println!();
    println!("median ns per call (same run)");
    println!(
        "{:<22} {:<24} {:>8} {:>9} {:>10} {:>12}",
        "group", "case", "ns/call", "overhead", "÷ tower", "overhead ÷"
    );
    println!(
        "(÷ tower: ÷ {TOWER}, ÷ {TOWER_RETRY} in the retry groups, ÷ {FAILSAFE} in \
         {BREAKER_SUCCESS}, ÷ {TOWER_HEDGE} in the hedge groups)"
    );
    let at = |group: &str, name: &str| find(cases, group, name).and_then(|i| medians[i]);
    for (i, case) in cases.iter().enumerate() {
        let Some(t) = medians[i] else { continue };
        let bare = at(case.group, BARE);
        let tower = at(case.group, reference(case.group));
        let overhead = bare.map(|b| t - b);
        let cell = |v: Option<f64>, prec: usize| {
            v.map_or_else(|| "-".to_owned(), |v| format!("{v:.prec$}"))
        };
        let ratio = tower.map(|tw| t / tw);
        let overhead_ratio = match (overhead, bare, tower) {
            (Some(o), Some(b), Some(tw)) => Some(o / (tw - b)),
            _ => None,
        };
        println!(
            "{:<22} {:<24} {:>8.1} {:>9} {:>10} {:>12}",
            case.group,
            case.name,
            t,
            cell(overhead, 1),
            cell(ratio, 2),
            cell(overhead_ratio, 2),
        );
    }
    println!();
    println!(
        "targets: {STACK} ÷ {TOWER} and {FULL} ÷ {TOWER_RETRY}, per-call time (the target) and \
         overheads over {BARE}"
    );
    // The time targets compare like with like on `plain`, where neither side writes a header;
    // on `http` surely also writes the deadline header (tower's layers write none), so the
    // ratio is reported beside the limit it would have, not judged.
    for (group, case, limit) in [
        ("ready/plain", STACK, 0.75),
        ("ready/http", STACK, 0.75),
        ("pending_once/plain", STACK, 1.0),
        ("pending_once/http", STACK, 1.0),
        (RETRY_SUCCESS, FULL, 0.6),
        (RETRY_FAIL_ONCE, FULL, 0.75),
        (RETRY_SUCCESS_HTTP, FULL, 0.6),
        (RETRY_SUCCESS_HTTP_EXT, FULL, 0.6),
    ] {
        let (Some(b), Some(s), Some(tw)) = (
            at(group, BARE),
            at(group, case),
            at(group, reference(group)),
        ) else {
            continue;
        };
        let ratio = s / tw;
        let verdict = if group.contains("/http") {
            "shown"
        } else if ratio <= limit {
            "met"
        } else {
            "MISSED"
        };
        // No layer can be faster than the bare service: `bare ÷ tower` is the floor; on
        // `pending_once` no timeout can be faster than one tokio timer, `timer_floor ÷ tower`.
        let timer_floor = at(group, TIMER_FLOOR)
            .filter(|_| group.starts_with("pending_once"))
            .map(|t| format!("  timer floor {:.2}", t / tw))
            .unwrap_or_default();
        println!(
            "  {group:<24} per call {ratio:.2} (≤ {limit:.2}) {verdict:<6}  overheads {:.2}  \
             floor {:.2}{timer_floor}",
            (s - b) / (tw - b),
            b / tw,
        );
    }
    // The breaker's target is on overheads: surely's ≤ 0.5 × failsafe's.
    for case in ["surely_breaker", "surely_breaker_time"] {
        let (Some(b), Some(s), Some(fs)) = (
            at(BREAKER_SUCCESS, BARE),
            at(BREAKER_SUCCESS, case),
            at(BREAKER_SUCCESS, FAILSAFE),
        ) else {
            continue;
        };
        let ratio = (s - b) / (fs - b);
        let verdict = if ratio <= 0.5 { "met" } else { "MISSED" };
        println!(
            "  {BREAKER_SUCCESS:<24} {case} overhead {:.1} ns ÷ {FAILSAFE} {:.1} ns = {ratio:.2} \
             (≤ 0.50) {verdict}",
            s - b,
            fs - b,
        );
    }
    println!("targets: {SURELY_HEDGE} overhead over {BARE} ÷ {TOWER_HEDGE}'s");
    for group in [HEDGE_READY, HEDGE_PENDING] {
        let (Some(b), Some(s), Some(tw)) = (
            at(group, BARE),
            at(group, SURELY_HEDGE),
            at(group, TOWER_HEDGE),
        ) else {
            continue;
        };
        let ratio = (s - b) / (tw - b);
        let verdict = if ratio <= 0.5 { "met" } else { "MISSED" };
        println!(
            "  {group:<24} overheads {ratio:.2} (≤ 0.50) {verdict:<6}  per call {:.2}",
            s / tw
        );
    }
}

fn main() {
    let rt = runtime();
    let cases = cases();
    let allocs = count_allocations(&rt, &cases);
    print_allocations(&cases, &allocs);

    let mut c = Criterion::default()
        .warm_up_time(WARM_UP)
        .measurement_time(MEASUREMENT)
        .sample_size(SAMPLE_SIZE)
        .configure_from_args();
    let medians = bench(&mut c, &rt, &cases);
    c.final_summary();
    print_summary(&cases, &medians);
}
