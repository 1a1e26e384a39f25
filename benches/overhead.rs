//! What surely's client layers cost per call, next to the bare service, to tower's layers and
//! to seatbelt's, all measured in the same run, the same way.
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
//! * `surely_deadline`: `SetDeadlineLayer::new(1 s)`;
//! * `surely_attempt_timeout`: `AttemptTimeoutLayer::new(1 s)`;
//! * `surely_stack`: `SetDeadlineLayer` → `RecordAttemptLayer::new(())` → `AttemptTimeoutLayer`,
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
//! `surely_full`, `SetDeadlineLayer` (`enforce_in_attempts`) → `SetIdempotencyKeyLayer` (a pass-through
//! for `plain`) → `RetryLayer` → `RecordAttemptLayer::new(())` → `AttemptTimeoutLayer`.
//!
//! The record family (`record_body/http`) measures what records cost over HTTP, with a
//! recorder that is on and keeps nothing, at the head and at the end of each response's body
//! (the `http()` preset's way), and what the preset's body wrapper costs when no record layer
//! asks it to watch (the `()` recorder). No target; shown.
//!
//! The breaker family (`breaker_success/plain`, and `breaker_success/large` over the client
//! family's `large` shape below) compares circuit breakers in the closed state on the success
//! path, over the `plain` request and the `ready` service: `bare`; `failsafe`,
//! failsafe's `StateMachine` at its default `Config` wrapping the inner future with its
//! futures-aware `CircuitBreaker::call`; `surely_breaker`, `BreakerLayer` over
//! `CircuitBreaker::new()` (its default window, the last 100 calls) with the bench's
//! classifier; `surely_breaker_time`, the same with a time window (10 s in 10 buckets),
//! which reads the clock on every call; and `seatbelt_breaker`, seatbelt's `Breaker` at its
//! defaults (a failure ratio of 0.1 over 30 s, at least 100 calls, a 5 s break), every error a
//! failure, shown beside surely's. The target: surely's overhead over `bare` at most 0.5 ×
//! failsafe's, with 0 allocations per call.
//!
//! The hedge family (`hedge_ready/safe`, `hedge_pending_once/safe`, and the same over the `large`
//! shape: `hedge_ready/large`, `hedge_pending_once/large`) compares hedge layers on
//! the success path when the hedge does not fire, over `Safe`, a request type like `plain`
//! whose [`Envelope`] says it is safe (so that surely's layer does hedge it): the inner future
//! answers on its first poll (`ready`) or after one `Pending` (`pending_once`). Its cases:
//! `bare`; `tower_hedge`, tower's `Hedge` (every request hedgeable, 95th percentile, 10 data
//! points, 10 s period); `seatbelt_hedging`, seatbelt's `Hedging` (one hedge at most, its
//! default, after 1 s, every error retried; shown beside surely's); `surely_hedge`,
//! `HedgeLayer::new()` (learned 95th percentile, a `RatioBudget` of its own) with the bench's
//! classifier. Target: surely's overhead over `bare` ≤ 0.5 × tower's, and 0 allocations per
//! call.
//!
//! The client family compares the stack users build, `surely::client()`, with the nearest
//! stacks of tower and of seatbelt, over the `plain` request and two shapes of inner service.
//! The shapes differ only in their error type: every layer moves the inner service's `Result`,
//! and its own error around it, through its futures, so the error's size is part of the cost.
//!
//! * `…/small`: `std::io::Error`, one pointer wide, built from its kind (no allocation);
//! * `…/large`: `BigError`, an enum of the bench's own whose refusal carries 64 bytes of detail
//!   inline (`Refused([u8; 64])`, `Other(io::ErrorKind)`). It is classified as the `io::Error`
//!   of its kind, so its refusal is `ConnectionRefused`'s: *rejected*, not sent, retried.
//!
//! Its groups: `client_ready/…` (the inner answers at once), `client_fail_once/…` (the inner
//! refuses each call's first attempt and answers its retry, as in `retry_fail_once`),
//! `client_pending_once/…` (the inner waits once), `client_http/…` (below) and
//! `deadline_ready/…` (timeouts alone, the inner answering at once). The cases of the first
//! three:
//!
//! * `bare`: the inner answers alone (both of them on `fail_once`);
//! * `tower_retry_tps_timeout`: as in the retry family, the reference;
//! * `seatbelt_retry_timeout`: seatbelt's `Retry` over its `Timeout` (1 s) in a
//!   `tower::ServiceBuilder`, on tick's tokio clock, set up as the tower policy: every error
//!   retried, at most 2 retries (3 attempts), a clone of the request for each attempt, and no
//!   wait between attempts (a zero base delay, which seatbelt turns into a zero delay that is
//!   ready at once). seatbelt has no retry budget, so it does less work than tower and surely
//!   here; its tower services box their futures;
//! * `surely_client`: `surely::client().no_breaker()`, its defaults otherwise, with the bench's
//!   classifier (`Res` a success, each error by its `ClassifyError`: what the default
//!   `HttpClassifier` does with an answer that has no HTTP status), `Backoff::none()`
//!   and a budget given with `.budget(…)`: `RatioBudget::default()` (the client's own default),
//!   one retry per first attempt on `fail_once` (as in the retry family). The recorder is the
//!   default one; the stack is made by `build`;
//! * `surely_client_breaker`: the same with the client's default breaker (which the retry layer
//!   keeps: no hedge, so no breaker layer; see `client::BreakerPart`). On `fail_once` half
//!   the attempts are refused, and the default breaker, which opens at a failure ratio of 0.5,
//!   would open and make the calls wait out its break: there it opens at 0.75 and is the default
//!   otherwise (the work per call is the same whatever the ratio);
//! * `surely_client_no_records`: the stack `surely_client` builds, assembled by hand without its
//!   record layers, in the order `ClientLayer` builds it: `SetDeadlineLayer` (the client's 10 s,
//!   `enforce_in_attempts`) → `SetIdempotencyKeyLayer` → `RetryLayer` (the same classifier, backoff
//!   and budget) → `AttemptTimeoutLayer::deadline_only()`. `surely_client` less this case is
//!   what the record layers cost with the default recorder.
//!
//! `client_http/…` is the client family's ready path over HTTP: a GET (`http_body_util::Empty`
//! body, one header) whose inner service (of the `small` or `large` shape) answers 200 with a
//! whole `Full` body at once. Its cases: `bare`; `tower_retry_tps_timeout` and
//! `seatbelt_retry_timeout`, as above (each clones the request for its attempt);
//! `surely_client_http`, the `client::http()` preset with its defaults (replayable bodies, the
//! body watch, the breaker, the deadline written on the wire, the retry owner marker, the
//! outcome handed back in the response's extensions), the bench's budget and no backoff;
//! `surely_client_http_no_breaker`; and `floor` (`benches/shared/floor.rs`): what any stack doing
//! the preset's work on the wire and the return path must do at the least, by hand, with no
//! layer (the two headers written, the look for a key, the request's copy, the outcome in the
//! extensions). The summary shows their ratios and allocations; the preset's target,
//! `surely_client_http` ≤ 1.2 × `tower_retry_tps_timeout` on both shapes, is judged on the
//! paired ratio (below), beside the floor's own ratio to tower's stack and the preset's to the
//! floor.
//! `client_http_parts/small` takes the preset's parts away one at a time (the headers it writes
//! for the next hop, the body watch, the replayable body), to show where its time goes.
//!
//! The cases of `deadline_ready/…`: `bare`; `tower_timeout` (1 s); `seatbelt_timeout`,
//! seatbelt's `Timeout` (1 s) on tick's tokio clock; `surely_deadline_attempt`, `SetDeadlineLayer`
//! (`enforce_in_attempts`) → `AttemptTimeoutLayer`, as in `surely_stack` but without a record.
//!
//! seatbelt's clock spawns a task on the runtime that drives its timers, so the cases are made
//! inside the runtime (`main` enters it). tick's timeout polls the inner future before it
//! registers a timer, so on `ready` no timer is registered; on `pending_once` each call
//! registers one in tick's timer set and wakes that task, which arms a tokio timer.
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
//!   one per header written for `http` requests, plus those of handing the outcome back, plus,
//!   with a retry layer, those of the request's copy that tower's `Retry` makes too.
//!
//! For the client family the summary prints its own table: each case's median ns per call, its
//! overhead over `bare`, its ratio to the tower reference (`tower_retry_tps_timeout`;
//! `tower_timeout` in `deadline_ready`) and its ratio to the seatbelt one
//! (`seatbelt_retry_timeout`; `seatbelt_timeout`). Its targets, on both shapes:
//!
//! * `surely_client` ≤ 0.6 × `tower_retry_tps_timeout` and ≤ 1.0 × `seatbelt_retry_timeout` on
//!   `client_ready`, ≤ 0.75 × `tower_retry_tps_timeout` on `client_fail_once`;
//!   `surely_client_breaker` ≤ 0.75 × `tower_retry_tps_timeout` on `client_ready`;
//! * `surely_deadline_attempt` ≤ 0.6 × `tower_timeout` and ≤ 1.0 × `seatbelt_timeout`;
//! * `surely_client_http` ≤ 1.2 × `tower_retry_tps_timeout` on `client_http` (paired only;
//!   `floor` is judged against the same limit, to show whether the target is above the floor);
//! * what the records cost: `surely_client` − `surely_client_no_records` ≤ 3 ns, in every
//!   client group;
//! * the shapes' spread: for `surely_client` (in each client group) and
//!   `surely_deadline_attempt`, the larger per-call time of the two shapes ≤ 1.3 × the smaller;
//! * `surely_client` and `surely_client_breaker` add 0 allocations per call over `bare`, in
//!   every client group.
//!
//! `client_records/small` shows what records cost when a recorder is on: `bare`,
//! `surely_client` (as in `client_ready/small`, no recorder), `surely_client_unit_recorder` (the
//! same with `.recorder(())`: the two record layers in the stack, recording nothing),
//! `surely_client_tracing` (the same with a `TracingRecorder` and no `tracing` subscriber
//! listening), `surely_client_discard` (a recorder that is on and throws every record away:
//! what building the records costs, before any recorder does anything with them) and, with the
//! `opentelemetry` feature (`cargo bench --bench overhead --features opentelemetry --
//! client_records`), `surely_client_otel` (an `OtelRecorder` on the OpenTelemetry SDK's meter
//! provider, exporting to memory once a minute). Shown, no target: the per-call time, and the
//! time and allocations over `surely_client`.
//!
//! The ratio targets are then measured again, paired: the case and its reference, made afresh,
//! take turns for 41 rounds of 5 ms a side, and the median of the rounds' ratios is printed
//! with its interquartile range. On a VM whose speed drifts between criterion's cases (seconds
//! apart), a round's two sides run at the same speed, so the drift cancels out of each round's
//! ratio. From run to run this ratio still moves (each run makes its stacks afresh, at other
//! addresses): judge it, like the criterion ratios above it, from several runs.
//!
//! `client_pending_once` has no ratio target; its ratios are shown, and its records cost,
//! spread and allocations are judged as on the other paths.
//!
//! The time targets are judged on `plain` only, where both sides do the same work. On `http`
//! surely's deadline layer also writes `x-request-timeout-ms`, which no tower layer here does,
//! and one `HeaderMap::insert` of that name costs more than the whole stack does on `plain`; the
//! summary shows those ratios ("shown") without a verdict.
//!
//! Run it with `cargo bench --bench overhead` (about five minutes); one group with e.g.
//! `cargo bench --bench overhead -- ready/plain`, the retry family with `-- retry`, the breaker
//! family with `-- breaker`, the client groups with `-- client`, the timeouts with
//! `-- deadline_ready`, and the whole client family with `-- 'client|deadline_ready'` (the
//! filter is a regular expression). The allocation table always covers every case. The machine
//! is noisy: compare ratios from one run, not absolute times across runs or machines.

#[path = "shared/floor.rs"]
mod floor;

use std::alloc::System;
use std::cell::Cell;
use std::fmt::{self, Debug};
use std::future::{ready, Future, Ready};
use std::hint::black_box;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use criterion::Criterion;
use floor::Floor;
use http::header::{HeaderValue, ACCEPT, CONTENT_TYPE};
use seatbelt::{RecoveryInfo, ResilienceContext};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use surely::breaker::{BreakerLayer, CircuitBreaker, SlidingWindow};
use surely::budget::{RatioBudget, RetryBudget};
use surely::classify::{
    self, Attempted, Classification, ClassifyError, DeliveryPhase, HttpClassifier,
};
use surely::deadline::{AttemptTimers, SetDeadlineLayer};
use surely::hedge::HedgeLayer;
use surely::idempotency::SetIdempotencyKeyLayer;
use surely::record::{Record, RecordAttemptLayer, RecordCallLayer, WatchTrailersLayer};
use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;
use surely::timeout::AttemptTimeoutLayer;
use surely::{Envelope, IntoError, Semantics};
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
const BREAKER_SUCCESS_LARGE: &str = "breaker_success/large";
const FAILSAFE: &str = "failsafe";
/// The hedge family's groups and its reference.
const HEDGE_READY: &str = "hedge_ready/safe";
const HEDGE_PENDING: &str = "hedge_pending_once/safe";
const HEDGE_READY_LARGE: &str = "hedge_ready/large";
const HEDGE_PENDING_LARGE: &str = "hedge_pending_once/large";
const TOWER_HEDGE: &str = "tower_hedge";
const SURELY_HEDGE: &str = "surely_hedge";
/// The client family: its seatbelt references and surely's cases.
const SEATBELT_RETRY: &str = "seatbelt_retry_timeout";
const SEATBELT_TIMEOUT: &str = "seatbelt_timeout";
const SEATBELT_BREAKER: &str = "seatbelt_breaker";
const SEATBELT_HEDGING: &str = "seatbelt_hedging";
const CLIENT: &str = "surely_client";
const CLIENT_BREAKER: &str = "surely_client_breaker";
const CLIENT_NO_RECORDS: &str = "surely_client_no_records";
/// The records group: the default client with a recorder on, and its cases.
const CLIENT_RECORDS: &str = "client_records/small";
const CLIENT_HTTP_FAMILY: &str = "client_http";
const CLIENT_HTTP: &str = "surely_client_http";
const CLIENT_HTTP_NO_BREAKER: &str = "surely_client_http_no_breaker";
/// The `client::http()` preset's floor on a GET (`benches/shared/floor.rs`).
const HTTP_FLOOR: &str = "floor";
const CLIENT_UNIT: &str = "surely_client_unit_recorder";
const CLIENT_TRACING: &str = "surely_client_tracing";
const CLIENT_DISCARD: &str = "surely_client_discard";
const CLIENT_OTEL: &str = "surely_client_otel";
const DEADLINE_ATTEMPT: &str = "surely_deadline_attempt";
/// The client family's groups are `family/shape`.
const CLIENT_FAMILIES: [&str; 3] = ["client_ready", "client_fail_once", "client_pending_once"];
const DEADLINE_FAMILY: &str = "deadline_ready";
const SHAPES: [&str; 2] = ["small", "large"];
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

fn safe_ready<S: Shape>(_: Safe) -> Ready<Result<Res, S::Error>> {
    ready(Ok(Res))
}

fn safe_pending<S: Shape>(_: Safe) -> PendingOnce<Result<Res, S::Error>> {
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

/// The client family's HTTP request: a GET with an empty body and one header, as a client
/// sends it.
fn http_get(_: u64) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    let mut req = http::Request::new(http_body_util::Empty::new());
    req.headers_mut()
        .insert(ACCEPT, HeaderValue::from_static("application/json"));
    req
}

/// A 200 with a whole body, at once, from an inner service of the shape `S` over any request
/// body (the `http()` preset's transport gets `ReplayBody`s).
fn http_shape_ready<S: Shape, B>(
    _: http::Request<B>,
) -> Ready<Result<http::Response<http_body_util::Full<bytes::Bytes>>, S::Error>> {
    ready(Ok(http::Response::new(http_body_util::Full::new(
        bytes::Bytes::from_static(b"{}"),
    ))))
}

/// The error type of an inner service in the client family, and the two errors it fails with.
/// Every layer moves the inner service's `Result` (and its own error wrapping it) through its
/// futures, so the error's size is part of what a layer costs.
trait Shape: 'static {
    type Error: std::error::Error
        + ClassifyError
        + IntoError<Transport = Self::Error>
        + Send
        + Sync
        + 'static;

    /// The connection was refused: nothing was sent, so any request may be retried.
    fn refused() -> Self::Error;

    /// What a seatbelt timeout answers when it fires (never here, but its layer needs one).
    fn timed_out() -> Self::Error;
}

/// The `small` shape: `std::io::Error`, one pointer wide, built from its kind (no allocation).
enum Small {}

impl Shape for Small {
    type Error = io::Error;

    fn refused() -> io::Error {
        io::ErrorKind::ConnectionRefused.into()
    }

    fn timed_out() -> io::Error {
        io::ErrorKind::TimedOut.into()
    }
}

/// The `large` shape: `BigError`, an error that keeps 64 bytes of detail inline.
enum Large {}

impl Shape for Large {
    type Error = BigError;

    fn refused() -> BigError {
        BigError::Refused([0; 64])
    }

    fn timed_out() -> BigError {
        BigError::Other(io::ErrorKind::TimedOut)
    }
}

/// A transport error as some clients define theirs: an enum whose largest variant carries its
/// details (an address, a reason) inline rather than behind a pointer.
#[derive(Debug)]
enum BigError {
    /// The peer refused the connection, with 64 bytes of detail.
    Refused([u8; 64]),
    /// Any other failure, by its kind.
    Other(io::ErrorKind),
}

impl BigError {
    /// The `io::ErrorKind` this error stands for: a refusal is `ConnectionRefused`.
    fn kind(&self) -> io::ErrorKind {
        match self {
            BigError::Refused(_) => io::ErrorKind::ConnectionRefused,
            BigError::Other(kind) => *kind,
        }
    }
}

impl fmt::Display for BigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BigError::Refused(detail) => {
                write!(f, "connection refused ({} bytes of detail)", detail.len())
            }
            BigError::Other(kind) => write!(f, "{kind}"),
        }
    }
}

impl std::error::Error for BigError {}

/// What every surely layer asks of a transport error: to become the transport error inside
/// `surely::Error`.
impl IntoError for BigError {
    type Transport = BigError;

    fn into_error(self) -> surely::Error<BigError> {
        surely::Error::transport(self)
    }
}

/// Classified as the `io::Error` of the same kind: a refusal is *rejected, not sent*, as
/// `ConnectionRefused` is. The `io::Error` is made from its kind, which does not allocate.
impl ClassifyError for BigError {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        io::Error::from(self.kind()).classify_error(phase)
    }
}

/// surely's error over a shape's error: what the client family's classifier sees.
type ShapeError<S> = surely::Error<<S as Shape>::Error>;

fn shape_ready<S: Shape>(_: Req) -> Ready<Result<Res, S::Error>> {
    ready(Ok(Res))
}

fn shape_pending<S: Shape>(_: Req) -> PendingOnce<Result<Res, S::Error>> {
    PendingOnce::new(Ok(Res))
}

fn shape_fail_once<S: Shape>(_: Req) -> Ready<Result<Res, S::Error>> {
    ready(fail_once_answer_of::<S>())
}

/// The `fail_once` baseline of a shape: both inner answers of a call.
fn shape_fail_once_twice<S: Shape>(_: Req) -> Ready<Result<Res, S::Error>> {
    ready(fail_once_answer_of::<S>().or_else(|_| fail_once_answer_of::<S>()))
}

/// The client family's classifier: `classify_plain` for any error that classifies itself.
fn classify_shape<E: ClassifyError>(
    attempt: Attempted<'_, Res, E>,
    _: Semantics,
) -> Classification {
    match attempt {
        Attempted::Response(_) => Classification::success(),
        Attempted::Error(e, phase) => e.classify_error(phase),
    }
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
/// call starts on an even one. The error is the shape's refusal, which does not allocate.
fn fail_once_answer_of<S: Shape>() -> Result<Res, S::Error> {
    let n = INNER_CALLS.with(|c| c.replace(c.get() + 1));
    if n.is_multiple_of(2) {
        Err(S::refused())
    } else {
        Ok(Res)
    }
}

/// The `fail_once` pattern with an `io::Error` made from its kind.
fn fail_once_answer() -> io::Result<Res> {
    fail_once_answer_of::<Small>()
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

fn deadline() -> SetDeadlineLayer {
    SetDeadlineLayer::new(BUDGET)
}

/// The deadline layer of a stack with an attempt timeout inside: that timeout ends each
/// attempt by the deadline, so the deadline layer keeps no timer of its own
/// (`surely::deadline::AttemptTimers`), as the canonical stack does.
fn stack_deadline() -> SetDeadlineLayer<AttemptTimers> {
    SetDeadlineLayer::builder()
        .timeout(BUDGET)
        .enforce_in_attempts()
        .build()
        .expect("a valid deadline")
}

fn attempt_timeout() -> AttemptTimeoutLayer {
    AttemptTimeoutLayer::new(BUDGET)
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
                        .layer(SetIdempotencyKeyLayer::new())
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

/// The client family's budgets for surely, given to the client and to the same stack built by
/// hand: the client's own default (`RatioBudget::default()`), and one retry per first attempt on
/// `fail_once`.
fn ratio_client_default() -> Arc<dyn RetryBudget> {
    Arc::new(RatioBudget::default())
}

fn ratio_client_one_per_call() -> Arc<dyn RetryBudget> {
    ratio_one_per_call().expect("a budget")
}

/// The breaker of `surely_client_breaker` on `fail_once`. Half the attempts there are refused,
/// and the default breaker opens at a failure ratio of 0.5 (counted per attempt, inside the
/// retry layer), so it would open and the calls would wait out its break. This one opens at
/// 0.75 and is the default otherwise; the work per call is the same whatever the ratio, as with
/// the budgets.
fn breaker_above_half() -> CircuitBreaker {
    CircuitBreaker::builder()
        .failure_ratio(0.75)
        .build()
        .expect("a valid breaker")
}

/// The deadline layer `surely::client()` builds by default: its 10 s budget, enforced by the
/// attempt timeout inside.
fn client_deadline() -> SetDeadlineLayer<AttemptTimers> {
    SetDeadlineLayer::builder()
        // `ClientBuilder::timeout`'s documented default.
        .timeout(Duration::from_secs(10))
        .enforce_in_attempts()
        .build()
        .expect("a valid deadline")
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

/// The client family's classifier over the shape `S`, as a function pointer.
type ShapeClassifier<S> = fn(Attempted<'_, Res, ShapeError<S>>, Semantics) -> Classification;

/// surely's breaker with the classifier of the shape `S`, over `breaker`.
fn surely_breaker<S: Shape>(
    breaker: CircuitBreaker,
) -> BreakerLayer<classify::ClassifyFn<ShapeClassifier<S>>> {
    BreakerLayer::new(breaker).classifier(classify::from_fn(
        classify_shape::<ShapeError<S>> as ShapeClassifier<S>,
    ))
}

// ---- seatbelt ------------------------------------------------------------------------------

/// A seatbelt context over tick's tokio clock, whose timers a task on the bench's runtime
/// drives. One per case, as an application makes one per pipeline. Must be made inside the
/// runtime (`main` enters it).
fn seatbelt_context<Rq, O>() -> ResilienceContext<Rq, O> {
    ResilienceContext::new(tick::Clock::new_tokio())
}

/// seatbelt's recovery rule for every case: any error is worth another attempt, no response
/// is (the rule of the bench's tower policy).
fn seatbelt_recovery<T, E>(out: &Result<T, E>) -> RecoveryInfo {
    match out {
        Ok(_) => RecoveryInfo::never(),
        Err(_) => RecoveryInfo::retry(),
    }
}

/// seatbelt's timeout (`BUDGET`), answering the shape's timeout error if it fires.
fn seatbelt_timeout<Rq, T, S: Shape>(
    ctx: &ResilienceContext<Rq, Result<T, S::Error>>,
) -> seatbelt::timeout::TimeoutLayer<Rq, Result<T, S::Error>> {
    seatbelt::timeout::Timeout::layer("timeout", ctx)
        .timeout(BUDGET)
        .timeout_error(|_| S::timed_out())
}

/// seatbelt's retry set up as the other retry layers here: every error retried, at most
/// `TOWER_RETRIES` retries (3 attempts), each with a clone of the request, and no wait between
/// attempts (a zero base delay: seatbelt then waits `Duration::ZERO` whatever the backoff, and
/// its delay of zero is ready at once, with no timer). seatbelt has no retry budget.
fn seatbelt_retry<Rq: Clone, T, S: Shape>(
    ctx: &ResilienceContext<Rq, Result<T, S::Error>>,
) -> seatbelt::retry::RetryLayer<Rq, Result<T, S::Error>> {
    seatbelt::retry::Retry::layer("retry", ctx)
        .clone_input()
        .recovery_with(|out, _| seatbelt_recovery(out))
        .max_retry_attempts(TOWER_RETRIES)
        .backoff(seatbelt::retry::Backoff::Constant)
        .base_delay(Duration::ZERO)
        .use_jitter(false)
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
    /// `http::Response` (`surely::docs::outcomes`, "The outcome is the caller's"): the boxed
    /// outcome, and for a response with no extensions
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
                        .layer(SetIdempotencyKeyLayer::new())
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

/// The five cases of one breaker group: closed breakers on the success path, over the `plain`
/// request and the shape `$shape`.
macro_rules! breaker_group {
    ($group:expr, $shape:ty) => {
        [
            Case {
                group: $group,
                name: BARE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || driver(service_fn(shape_ready::<$shape>), plain_req),
            },
            Case {
                group: $group,
                name: FAILSAFE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let svc = Failsafe {
                        inner: service_fn(shape_ready::<$shape>),
                        breaker: failsafe::Config::new().build(),
                    };
                    driver(svc, plain_req)
                },
            },
            Case {
                group: $group,
                name: SEATBELT_BREAKER,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    // Its defaults (a failure ratio of 0.1 over 30 s, at least 100 calls, a 5 s
                    // break); every error counts as a failure, as failsafe's `Any` counts them.
                    let ctx = seatbelt_context();
                    let layer = seatbelt::breaker::Breaker::layer("breaker", &ctx)
                        .recovery_with(|out, _| seatbelt_recovery(out))
                        .rejected_input_error(|_, _| <$shape as Shape>::refused());
                    driver(layer.layer(service_fn(shape_ready::<$shape>)), plain_req)
                },
            },
            Case {
                group: $group,
                name: "surely_breaker",
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let layer = surely_breaker::<$shape>(CircuitBreaker::new());
                    driver(layer.layer(service_fn(shape_ready::<$shape>)), plain_req)
                },
            },
            Case {
                group: $group,
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
                        surely_breaker::<$shape>(breaker).layer(service_fn(shape_ready::<$shape>)),
                        plain_req,
                    )
                },
            },
        ]
    };
}

/// The four cases of one hedge group over `Safe` and the shape `$shape`, the inner service
/// `$svc`.
macro_rules! hedge_group {
    ($group:expr, $shape:ty, $svc:expr) => {
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
                name: SEATBELT_HEDGING,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    // One hedge at most (its default, as tower's), after `BUDGET`: it never
                    // fires within a call here.
                    let ctx = seatbelt_context();
                    let layer = seatbelt::hedging::Hedging::layer("hedging", &ctx)
                        .clone_input()
                        .recovery_with(|out, _| seatbelt_recovery(out))
                        .hedging_delay(BUDGET);
                    driver(layer.layer(service_fn($svc)), safe_req)
                },
            },
            Case {
                group: $group,
                name: SURELY_HEDGE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let layer = HedgeLayer::builder()
                        .classifier(classify::from_fn(classify_shape::<ShapeError<$shape>>))
                        .build()
                        .expect("a valid hedge layer");
                    driver(layer.layer(service_fn($svc)), safe_req)
                },
            },
        ]
    };
}

/// The six cases of one client group over the `plain` request and the shape `$shape`: the inner
/// service `$svc`, the baseline `$bare` (the same inner answers without any layer), tower's
/// budget `$tps`, surely's `$budget`, and the breaker of `surely_client_breaker` (`None`: the
/// client's default one).
macro_rules! client_group {
    ($group:literal, $shape:ty, $svc:ident, $bare:ident, $tps:expr, $budget:expr, $breaker:expr) => {
        [
            Case {
                group: $group,
                name: BARE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    reset_inner_calls();
                    driver(service_fn($bare::<$shape>), plain_req)
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
                        Timeout::new(service_fn($svc::<$shape>), BUDGET),
                    );
                    driver(svc, plain_req)
                },
            },
            Case {
                group: $group,
                name: SEATBELT_RETRY,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    reset_inner_calls();
                    let ctx = seatbelt_context();
                    let svc = ServiceBuilder::new()
                        .layer(seatbelt_retry::<Req, Res, $shape>(&ctx))
                        .layer(seatbelt_timeout::<Req, Res, $shape>(&ctx))
                        .service(service_fn($svc::<$shape>));
                    driver(svc, plain_req)
                },
            },
            Case {
                group: $group,
                name: CLIENT,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    reset_inner_calls();
                    let svc = surely::client()
                        .no_breaker()
                        .classifier(classify::from_fn(classify_shape::<ShapeError<$shape>>))
                        .retry(|r| r.backoff(Backoff::none()))
                        .budget($budget)
                        .build(service_fn($svc::<$shape>))
                        .expect("a valid client");
                    driver(svc, plain_req)
                },
            },
            Case {
                group: $group,
                name: CLIENT_BREAKER,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    reset_inner_calls();
                    let builder = surely::client()
                        .classifier(classify::from_fn(classify_shape::<ShapeError<$shape>>))
                        .retry(|r| r.backoff(Backoff::none()))
                        .budget($budget);
                    let builder = match $breaker {
                        Some(breaker) => builder.breaker(breaker),
                        None => builder,
                    };
                    let svc = builder
                        .build(service_fn($svc::<$shape>))
                        .expect("a valid client");
                    driver(svc, plain_req)
                },
            },
            Case {
                group: $group,
                name: CLIENT_NO_RECORDS,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    reset_inner_calls();
                    let classifier = classify::from_fn(classify_shape::<ShapeError<$shape>>);
                    let svc = ServiceBuilder::new()
                        .layer(client_deadline())
                        .layer(SetIdempotencyKeyLayer::new())
                        .layer(retry(classifier, Some($budget)))
                        .layer(AttemptTimeoutLayer::deadline_only())
                        .service(service_fn($svc::<$shape>));
                    driver(svc, plain_req)
                },
            },
        ]
    };
}

/// The cases of one `client_http` group: the client family's ready path over `http_get`
/// requests, the inner service of the shape `$shape` answering 200 at once with a whole body.
/// tower's and seatbelt's retries clone the request for each attempt (as their policies must);
/// surely's `client::http()` preset (its defaults: replayable bodies, the body watch, the
/// breaker, the bench's budget and no backoff) and the same without its breaker.
macro_rules! client_http_group {
    ($group:literal, $shape:ty) => {
        [
            Case {
                group: $group,
                name: BARE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || driver(service_fn(http_shape_ready::<$shape, _>), http_get),
            },
            Case {
                group: $group,
                name: TOWER_RETRY,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let svc = Retry::new(
                        TowerPolicy::new(tps_default()),
                        Timeout::new(service_fn(http_shape_ready::<$shape, _>), BUDGET),
                    );
                    driver(svc, http_get)
                },
            },
            Case {
                group: $group,
                name: SEATBELT_RETRY,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let ctx = seatbelt_context();
                    let svc = ServiceBuilder::new()
                        .layer(seatbelt_retry::<_, _, $shape>(&ctx))
                        .layer(seatbelt_timeout::<_, _, $shape>(&ctx))
                        .service(service_fn(http_shape_ready::<$shape, _>));
                    driver(svc, http_get)
                },
            },
            Case {
                group: $group,
                name: HTTP_FLOOR,
                headers_written: 0,
                outcome_allocs: 0,
                make: || driver(Floor(service_fn(http_shape_ready::<$shape, _>)), http_get),
            },
            Case {
                group: $group,
                name: CLIENT_HTTP,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let svc = surely::client::http()
                        .retry(|r| r.backoff(Backoff::none()))
                        .budget(ratio_client_default())
                        .build(service_fn(http_shape_ready::<$shape, _>))
                        .expect("a valid client");
                    driver(svc, http_get)
                },
            },
            Case {
                group: $group,
                name: CLIENT_HTTP_NO_BREAKER,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let svc = surely::client::http()
                        .no_breaker()
                        .retry(|r| r.backoff(Backoff::none()))
                        .budget(ratio_client_default())
                        .build(service_fn(http_shape_ready::<$shape, _>))
                        .expect("a valid client");
                    driver(svc, http_get)
                },
            },
        ]
    };
}

/// `client_http_parts/small`: where the `http()` preset's time goes over HTTP, by taking its
/// parts away one at a time (the inner service as in `client_http/small`): the preset
/// (`surely_client_http`); without the headers it writes for the next hop
/// (`no_internal_headers`: deadline, retry owner); without the body watch (`no_body_watch`);
/// without the replayable body (`no_replay`: `Empty` is `Clone`, so the retry layer copies
/// the request as it is); and without all three. No target: a breakdown.
fn client_http_parts_group() -> [Case; 6] {
    const GROUP: &str = "client_http_parts/small";
    fn preset() -> surely::client::HttpClientBuilder {
        surely::client::http()
            .retry(|r| r.backoff(Backoff::none()))
            .budget(ratio_client_default())
    }
    let case = |name, make| Case {
        group: GROUP,
        name,
        headers_written: 0,
        outcome_allocs: 0,
        make,
    };
    [
        case(BARE, || {
            driver(service_fn(http_shape_ready::<Small, _>), http_get)
        }),
        case(CLIENT_HTTP, || {
            let svc = preset().build(service_fn(http_shape_ready::<Small, _>));
            driver(svc.expect("a valid client"), http_get)
        }),
        case("no_internal_headers", || {
            let svc = preset()
                .no_internal_headers()
                .build(service_fn(http_shape_ready::<Small, _>));
            driver(svc.expect("a valid client"), http_get)
        }),
        case("no_body_watch", || {
            let svc = preset()
                .no_body_watch()
                .build(service_fn(http_shape_ready::<Small, _>));
            driver(svc.expect("a valid client"), http_get)
        }),
        case("no_replay", || {
            let svc = preset()
                .no_replay()
                .build(service_fn(http_shape_ready::<Small, _>));
            driver(svc.expect("a valid client"), http_get)
        }),
        case("none_of_the_three", || {
            let svc = preset()
                .no_internal_headers()
                .no_body_watch()
                .no_replay()
                .build(service_fn(http_shape_ready::<Small, _>));
            driver(svc.expect("a valid client"), http_get)
        }),
    ]
}

/// The four cases of one `deadline_ready` group: timeouts alone over the shape `$shape`, whose
/// inner service answers at once.
macro_rules! deadline_group {
    ($group:literal, $shape:ty) => {
        [
            Case {
                group: $group,
                name: BARE,
                headers_written: 0,
                outcome_allocs: 0,
                make: || driver(service_fn(shape_ready::<$shape>), plain_req),
            },
            Case {
                group: $group,
                name: TOWER,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let svc = Timeout::new(service_fn(shape_ready::<$shape>), BUDGET);
                    driver(svc, plain_req)
                },
            },
            Case {
                group: $group,
                name: SEATBELT_TIMEOUT,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let layer = seatbelt_timeout::<Req, Res, $shape>(&seatbelt_context());
                    driver(layer.layer(service_fn(shape_ready::<$shape>)), plain_req)
                },
            },
            Case {
                group: $group,
                name: DEADLINE_ATTEMPT,
                headers_written: 0,
                outcome_allocs: 0,
                make: || {
                    let svc = ServiceBuilder::new()
                        .layer(stack_deadline())
                        .layer(attempt_timeout())
                        .service(service_fn(shape_ready::<$shape>));
                    driver(svc, plain_req)
                },
            },
        ]
    };
}

/// The default client (`client_ready/small`'s `surely_client`) with a recorder on: a
/// `TracingRecorder` with no subscriber listening, and (feature `opentelemetry`) an
/// `OtelRecorder` on the OpenTelemetry SDK's meter provider.
fn client_records_group() -> Vec<Case> {
    fn client<R: surely::record::Recorder + Clone + Send + Sync + 'static>(
        recorder: R,
    ) -> Box<dyn Drive> {
        reset_inner_calls();
        let svc = surely::client()
            .no_breaker()
            .classifier(classify::from_fn(classify_shape::<ShapeError<Small>>))
            .retry(|r| r.backoff(Backoff::none()))
            .budget(ratio_client_default())
            .recorder(recorder)
            .build(service_fn(shape_ready::<Small>))
            .expect("a valid client");
        driver(svc, plain_req)
    }
    #[allow(unused_mut)]
    let mut cases = vec![
        Case {
            group: CLIENT_RECORDS,
            name: BARE,
            headers_written: 0,
            outcome_allocs: 0,
            make: || driver(service_fn(shape_ready::<Small>), plain_req),
        },
        Case {
            group: CLIENT_RECORDS,
            name: CLIENT,
            headers_written: 0,
            outcome_allocs: 0,
            make: || {
                reset_inner_calls();
                let svc = surely::client()
                    .no_breaker()
                    .classifier(classify::from_fn(classify_shape::<ShapeError<Small>>))
                    .retry(|r| r.backoff(Backoff::none()))
                    .budget(ratio_client_default())
                    .build(service_fn(shape_ready::<Small>))
                    .expect("a valid client");
                driver(svc, plain_req)
            },
        },
        Case {
            group: CLIENT_RECORDS,
            name: CLIENT_UNIT,
            headers_written: 0,
            outcome_allocs: 0,
            make: || client(()),
        },
        Case {
            group: CLIENT_RECORDS,
            name: CLIENT_TRACING,
            headers_written: 0,
            outcome_allocs: 0,
            make: || client(surely::record::TracingRecorder::new()),
        },
        Case {
            group: CLIENT_RECORDS,
            name: CLIENT_DISCARD,
            headers_written: 0,
            outcome_allocs: 0,
            make: || client(discard as fn(Record<'_>)),
        },
    ];
    #[cfg(feature = "opentelemetry")]
    cases.push(Case {
        group: CLIENT_RECORDS,
        name: CLIENT_OTEL,
        headers_written: 0,
        outcome_allocs: 0,
        make: || {
            use opentelemetry::metrics::MeterProvider as _;
            // One provider for the process: dropping it would shut its instruments down.
            static PROVIDER: std::sync::OnceLock<opentelemetry_sdk::metrics::SdkMeterProvider> =
                std::sync::OnceLock::new();
            let provider = PROVIDER.get_or_init(|| {
                opentelemetry_sdk::metrics::SdkMeterProvider::builder()
                    .with_periodic_exporter(
                        opentelemetry_sdk::metrics::InMemoryMetricExporter::default(),
                    )
                    .build()
            });
            client(surely::record::OtelRecorder::new(&provider.meter("bench")))
        },
    });
    cases
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
    .chain(breaker_group!(BREAKER_SUCCESS, Small))
    .chain(breaker_group!(BREAKER_SUCCESS_LARGE, Large))
    .chain(hedge_group!(HEDGE_READY, Small, safe_ready::<Small>))
    .chain(hedge_group!(HEDGE_READY_LARGE, Large, safe_ready::<Large>))
    .chain(hedge_group!(HEDGE_PENDING, Small, safe_pending::<Small>))
    .chain(hedge_group!(
        HEDGE_PENDING_LARGE,
        Large,
        safe_pending::<Large>
    ))
    .chain(client_records_group())
    .chain(client_group!(
        "client_ready/small",
        Small,
        shape_ready,
        shape_ready,
        tps_default(),
        ratio_client_default(),
        None
    ))
    .chain(client_group!(
        "client_ready/large",
        Large,
        shape_ready,
        shape_ready,
        tps_default(),
        ratio_client_default(),
        None
    ))
    .chain(client_group!(
        "client_fail_once/small",
        Small,
        shape_fail_once,
        shape_fail_once_twice,
        tps_one_per_call(),
        ratio_client_one_per_call(),
        Some(breaker_above_half())
    ))
    .chain(client_group!(
        "client_fail_once/large",
        Large,
        shape_fail_once,
        shape_fail_once_twice,
        tps_one_per_call(),
        ratio_client_one_per_call(),
        Some(breaker_above_half())
    ))
    .chain(client_group!(
        "client_pending_once/small",
        Small,
        shape_pending,
        shape_pending,
        tps_default(),
        ratio_client_default(),
        None
    ))
    .chain(client_group!(
        "client_pending_once/large",
        Large,
        shape_pending,
        shape_pending,
        tps_default(),
        ratio_client_default(),
        None
    ))
    .chain(client_http_group!("client_http/small", Small))
    .chain(client_http_group!("client_http/large", Large))
    .chain(client_http_parts_group())
    .chain(deadline_group!("deadline_ready/small", Small))
    .chain(deadline_group!("deadline_ready/large", Large))
    .collect()
}

/// The tower case a group's cases are compared with.
fn reference(group: &str) -> &'static str {
    if group.starts_with("retry_") || group.starts_with("client_") {
        TOWER_RETRY
    } else if group.starts_with("breaker_") {
        FAILSAFE
    } else if group.starts_with("hedge_") {
        TOWER_HEDGE
    } else {
        TOWER
    }
}

/// The seatbelt case a client-family group's cases are compared with.
fn seatbelt_reference(group: &str) -> &'static str {
    if group.starts_with("client_") {
        SEATBELT_RETRY
    } else {
        SEATBELT_TIMEOUT
    }
}

/// Whether `group` belongs to the client family (`client_*/…`, `deadline_ready/…`).
fn in_client_family(group: &str) -> bool {
    group.starts_with("client_") || group.starts_with(DEADLINE_FAMILY)
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
        "{:<25} {:<24} {:>7} {:>11} {:>8} {:>8}  target",
        "group", "case", "total", "over bare", "headers", "outcome"
    );
    for (i, case) in cases.iter().enumerate() {
        let bare = find(cases, case.group, BARE).map_or(0.0, |b| allocs[b]);
        let added = allocs[i] - bare;
        // Over an `http::Request`, a retry layer keeps a copy of the request, whose `HeaderMap`
        // it clones: tower's `Retry` does the same, and those allocations are allowed too.
        let copy = match (
            case.group.contains("/http"),
            find(cases, case.group, TOWER_RETRY),
        ) {
            (true, Some(t)) if case.name != TOWER_RETRY => allocs[t] - bare,
            _ => 0.0,
        };
        let verdict = if case.name == BARE
            || case.group == RECORD_BODY
            || case.group == CLIENT_RECORDS
            || case.group.starts_with(CLIENT_HTTP_FAMILY)
            || case.name == TIMER_FLOOR
            || case.name.starts_with("tower")
            || case.name.starts_with("seatbelt")
            || case.name == FAILSAFE
        {
            "-"
        } else if added <= f64::from(case.headers_written + case.outcome_allocs) + copy {
            "met"
        } else {
            "MISSED"
        };
        println!(
            "{:<25} {:<24} {:>7.2} {:>11.2} {:>8} {:>8}  {verdict}",
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

/// The summary of the groups criterion measured: the layers' groups, then the client family's.
fn print_summary(cases: &[Case], medians: &[Option<f64>], allocs: &[f64]) {
    let measured = |client: bool| {
        cases
            .iter()
            .zip(medians)
            .any(|(c, m)| in_client_family(c.group) == client && m.is_some())
    };
    if measured(false) {
        print_layer_summary(cases, medians);
    }
    if measured(true) {
        print_client_summary(cases, medians, allocs);
    }
}

fn print_layer_summary(cases: &[Case], medians: &[Option<f64>]) {
    println!();
    println!("median ns per call (same run)");
    println!(
        "{:<25} {:<24} {:>8} {:>9} {:>10} {:>12}",
        "group", "case", "ns/call", "overhead", "÷ tower", "overhead ÷"
    );
    println!(
        "(÷ tower: ÷ {TOWER}, ÷ {TOWER_RETRY} in the retry groups, ÷ {FAILSAFE} in the \
         breaker groups, ÷ {TOWER_HEDGE} in the hedge groups)"
    );
    let at = |group: &str, name: &str| find(cases, group, name).and_then(|i| medians[i]);
    for (i, case) in cases.iter().enumerate() {
        if in_client_family(case.group) {
            continue;
        }
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
            "{:<25} {:<24} {:>8.1} {:>9} {:>10} {:>12}",
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
    for group in [BREAKER_SUCCESS, BREAKER_SUCCESS_LARGE] {
        for case in ["surely_breaker", "surely_breaker_time"] {
            let (Some(b), Some(s), Some(fs)) =
                (at(group, BARE), at(group, case), at(group, FAILSAFE))
            else {
                continue;
            };
            let ratio = (s - b) / (fs - b);
            let verdict = if ratio <= 0.5 { "met" } else { "MISSED" };
            println!(
                "  {group:<24} {case} overhead {:.1} ns ÷ {FAILSAFE} {:.1} ns = {ratio:.2} \
                 (≤ 0.50) {verdict}",
                s - b,
                fs - b,
            );
        }
    }
    println!("targets: {SURELY_HEDGE} overhead over {BARE} ÷ {TOWER_HEDGE}'s");
    for group in [
        HEDGE_READY,
        HEDGE_READY_LARGE,
        HEDGE_PENDING,
        HEDGE_PENDING_LARGE,
    ] {
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
    // seatbelt's breaker and hedge beside surely's: shown, no target.
    for (group, surely, seatbelt) in [
        (BREAKER_SUCCESS, "surely_breaker", SEATBELT_BREAKER),
        (BREAKER_SUCCESS_LARGE, "surely_breaker", SEATBELT_BREAKER),
        (HEDGE_READY, SURELY_HEDGE, SEATBELT_HEDGING),
        (HEDGE_READY_LARGE, SURELY_HEDGE, SEATBELT_HEDGING),
        (HEDGE_PENDING, SURELY_HEDGE, SEATBELT_HEDGING),
        (HEDGE_PENDING_LARGE, SURELY_HEDGE, SEATBELT_HEDGING),
    ] {
        let (Some(b), Some(s), Some(sb)) =
            (at(group, BARE), at(group, surely), at(group, seatbelt))
        else {
            continue;
        };
        println!(
            "  {group:<24} {surely} ÷ {seatbelt}: per call {:.2}, overheads {:.2} (shown)",
            s / sb,
            (s - b) / (sb - b),
        );
    }
}

/// A verdict: whether `value` is within `limit`.
fn verdict(value: f64, limit: f64) -> &'static str {
    if value <= limit {
        "met"
    } else {
        "MISSED"
    }
}

/// A ratio's verdict against its limit; an infinite limit is a ratio shown, not a target.
fn judged(ratio: f64, limit: f64) -> String {
    if limit.is_finite() {
        format!("(≤ {limit:.2}) {}", verdict(ratio, limit))
    } else {
        "(shown)".to_owned()
    }
}

/// The client family's part of the summary: its table and its targets.
fn print_client_summary(cases: &[Case], medians: &[Option<f64>], allocs: &[f64]) {
    let at = |group: &str, name: &str| find(cases, group, name).and_then(|i| medians[i]);
    println!();
    println!("client family: median ns per call (same run)");
    println!(
        "{:<25} {:<24} {:>8} {:>9} {:>8} {:>10}",
        "group", "case", "ns/call", "overhead", "÷ tower", "÷ seatbelt"
    );
    println!(
        "(÷ tower: ÷ {TOWER_RETRY}, ÷ {TOWER} in {DEADLINE_FAMILY}; ÷ seatbelt: ÷ \
         {SEATBELT_RETRY}, ÷ {SEATBELT_TIMEOUT} in {DEADLINE_FAMILY}; overhead over {BARE})"
    );
    let cell =
        |v: Option<f64>, prec: usize| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.prec$}"));
    for (i, case) in cases.iter().enumerate() {
        if !in_client_family(case.group) {
            continue;
        }
        let Some(t) = medians[i] else { continue };
        let bare = at(case.group, BARE);
        let tower = at(case.group, reference(case.group));
        let seatbelt = at(case.group, seatbelt_reference(case.group));
        println!(
            "{:<25} {:<24} {:>8.1} {:>9} {:>8} {:>10}",
            case.group,
            case.name,
            t,
            cell(bare.map(|b| t - b), 1),
            cell(tower.map(|tw| t / tw), 2),
            cell(seatbelt.map(|sb| t / sb), 2),
        );
    }

    println!();
    println!("targets (client family, per-call times):");
    for (group, case, against, limit) in &ratio_targets() {
        let (Some(s), Some(r)) = (at(group, case), at(group, against)) else {
            continue;
        };
        let ratio = s / r;
        let judged = judged(ratio, *limit);
        println!("  {group:<25} {case:<24} ÷ {against:<23} {ratio:>5.2} {judged}");
    }

    println!("records cost: {CLIENT} − {CLIENT_NO_RECORDS} (≤ 3.0 ns)");
    for family in CLIENT_FAMILIES {
        for shape in SHAPES {
            let group = format!("{family}/{shape}");
            let (Some(c), Some(n)) = (at(&group, CLIENT), at(&group, CLIENT_NO_RECORDS)) else {
                continue;
            };
            let cost = c - n;
            println!("  {group:<25} {cost:>6.1} ns {}", verdict(cost, 3.0));
        }
    }

    println!("shape spread: max ÷ min over {SHAPES:?} of the per-call time (≤ 1.30)");
    let spreads = CLIENT_FAMILIES
        .iter()
        .map(|family| (*family, CLIENT))
        .chain([(DEADLINE_FAMILY, DEADLINE_ATTEMPT)]);
    for (family, case) in spreads {
        let times: Option<Vec<f64>> = SHAPES
            .iter()
            .map(|shape| at(&format!("{family}/{shape}"), case))
            .collect();
        let Some(times) = times else { continue };
        let max = times.iter().copied().fold(f64::MIN, f64::max);
        let min = times.iter().copied().fold(f64::MAX, f64::min);
        let spread = max / min;
        println!(
            "  {family:<25} {case:<24} {spread:.2} ({}) {}",
            times
                .iter()
                .map(|t| format!("{t:.1}"))
                .collect::<Vec<_>>()
                .join(" / "),
            verdict(spread, 1.3)
        );
    }

    println!("allocations per call over {BARE} (= 0)");
    for family in CLIENT_FAMILIES {
        for shape in SHAPES {
            let group = format!("{family}/{shape}");
            for case in [CLIENT, CLIENT_BREAKER] {
                let (Some(c), Some(b)) = (find(cases, &group, case), find(cases, &group, BARE))
                else {
                    continue;
                };
                let added = allocs[c] - allocs[b];
                println!(
                    "  {group:<25} {case:<24} {added:>5.2} {}",
                    verdict(added, 0.0)
                );
            }
        }
    }

    println!(
        "over HTTP ({CLIENT_HTTP_FAMILY}/…; shown): ÷ {TOWER_RETRY}, ÷ {SEATBELT_RETRY}, \
         allocations over {BARE}"
    );
    for shape in SHAPES {
        let group = format!("{CLIENT_HTTP_FAMILY}/{shape}");
        for case in [CLIENT_HTTP, CLIENT_HTTP_NO_BREAKER] {
            let (Some(t), Some(tw), Some(sb), Some(c), Some(b)) = (
                at(&group, case),
                at(&group, TOWER_RETRY),
                at(&group, SEATBELT_RETRY),
                find(cases, &group, case),
                find(cases, &group, BARE),
            ) else {
                continue;
            };
            println!(
                "  {group:<25} {case:<30} {:>5.2} {:>5.2} {:>5.2}",
                t / tw,
                t / sb,
                allocs[c] - allocs[b]
            );
        }
    }

    println!("what a recorder that is on costs, over {CLIENT} ({CLIENT_RECORDS}; shown)");
    let base = at(CLIENT_RECORDS, CLIENT);
    for case in [CLIENT_UNIT, CLIENT_TRACING, CLIENT_DISCARD, CLIENT_OTEL] {
        let (Some(t), Some(b), Some(i), Some(ib)) = (
            at(CLIENT_RECORDS, case),
            base,
            find(cases, CLIENT_RECORDS, case),
            find(cases, CLIENT_RECORDS, CLIENT),
        ) else {
            continue;
        };
        println!(
            "  {case:<24} {t:>8.1} ns/call  +{:.1} ns  +{:.2} allocations",
            t - b,
            allocs[i] - allocs[ib]
        );
    }
}

fn main() {
    let rt = runtime();
    // seatbelt's clock spawns the task that drives its timers when it is made, so the cases are
    // made inside the runtime.
    let _entered = rt.enter();
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
    print_summary(&cases, &medians, &allocs);
    print_paired_targets(&rt, &cases, &medians);
}

/// The client family's ratio targets: group, case, reference, and the largest ratio allowed.
fn ratio_targets() -> Vec<(String, &'static str, &'static str, f64)> {
    SHAPES
        .iter()
        .flat_map(|shape| {
            let ready = format!("client_ready/{shape}");
            let fail_once = format!("client_fail_once/{shape}");
            let deadline = format!("{DEADLINE_FAMILY}/{shape}");
            let http = format!("{CLIENT_HTTP_FAMILY}/{shape}");
            [
                (ready.clone(), CLIENT, TOWER_RETRY, 0.6),
                (ready.clone(), CLIENT, SEATBELT_RETRY, 1.0),
                (fail_once, CLIENT, TOWER_RETRY, 0.75),
                (ready, CLIENT_BREAKER, TOWER_RETRY, 0.75),
                (deadline.clone(), DEADLINE_ATTEMPT, TOWER, 0.6),
                (deadline, DEADLINE_ATTEMPT, SEATBELT_TIMEOUT, 1.0),
                (http.clone(), CLIENT_HTTP, TOWER_RETRY, 1.2),
                // Not a target: whether the preset's floor itself is under the target.
                (http.clone(), HTTP_FLOOR, TOWER_RETRY, 1.2),
                (http, CLIENT_HTTP, HTTP_FLOOR, f64::INFINITY),
            ]
        })
        .collect()
}

/// Rounds of a paired measurement.
const PAIRED_ROUNDS: usize = 41;
/// How long one side of one round runs.
const PAIRED_CHUNK: Duration = Duration::from_millis(5);

/// The client family's ratio targets, each measured again as a paired comparison: the case and
/// its reference, made afresh, take turns (which one goes first alternates) for
/// [`PAIRED_ROUNDS`] rounds of [`PAIRED_CHUNK`] each, and the ratio is taken within each round.
/// A VM's speed drifts by a quarter over the seconds between two criterion cases; within a
/// round both sides run at the same speed, so the median of the rounds' ratios moves far less
/// from run to run than the ratio of two criterion medians. Shown with its interquartile range.
fn print_paired_targets(rt: &Runtime, cases: &[Case], medians: &[Option<f64>]) {
    let mut header = false;
    for (group, case, against, limit) in ratio_targets() {
        let (Some(i), Some(j)) = (find(cases, &group, case), find(cases, &group, against)) else {
            continue;
        };
        // Only what criterion measured in this run (not filtered out, not `--test`).
        let (Some(ns_case), Some(ns_ref)) = (medians[i], medians[j]) else {
            continue;
        };
        if !header {
            println!(
                "paired ratios ({PAIRED_ROUNDS} rounds of {PAIRED_CHUNK:?} a side, taking turns): \
                 median [25th–75th percentile]"
            );
            header = true;
        }
        let (mut a, mut b) = ((cases[i].make)(), (cases[j].make)());
        let calls = |ns: f64| (PAIRED_CHUNK.as_nanos() as f64 / ns.max(1.0)).ceil() as u64;
        let (n_a, n_b) = (calls(ns_case), calls(ns_ref));
        // Warm both up.
        a.run(rt, n_a);
        b.run(rt, n_b);
        let mut ratios = Vec::with_capacity(PAIRED_ROUNDS);
        for round in 0..PAIRED_ROUNDS {
            let per_call =
                |d: &mut Box<dyn Drive>, n: u64| d.run(rt, n).as_nanos() as f64 / n as f64;
            let (t_a, t_b) = if round % 2 == 0 {
                let t_a = per_call(&mut a, n_a);
                (t_a, per_call(&mut b, n_b))
            } else {
                let t_b = per_call(&mut b, n_b);
                (per_call(&mut a, n_a), t_b)
            };
            ratios.push(t_a / t_b);
        }
        ratios.sort_by(f64::total_cmp);
        let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
        let ratio = median(&ratios);
        let judged = judged(ratio, limit);
        println!(
            "  {group:<25} {case:<24} ÷ {against:<23} {ratio:>5.2} [{:.2}–{:.2}] {judged}",
            at(0.25),
            at(0.75),
        );
    }
}
