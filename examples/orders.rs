//! The order story, end to end, on real hyper over 127.0.0.1.
//!
//! A shop's server runs surely's server side: the deadline layer (it reads the budget each
//! request brings), a fault layer (so that the demo can make the network fail on cue) and the
//! idempotency layer (it honours `Idempotency-Key`) in front of the handler. Clients call it
//! through the full client stack of `surely::client::http()`: call record, deadline, key,
//! body replay, retry (with its budget and a resolver), hedge, breaker, attempt record, attempt
//! timeout, and hyper-util's client underneath. Five stories:
//!
//! 1. `POST` order `o-1` with an idempotency key; the server commits it and the reply is lost.
//!    The order client was told that its server honours keys (`server_honours_keys()`), so it
//!    retries with the same key, and gets the stored result.
//! 2. The same without a key: the outcome is unknown and the client does **not** send it again;
//!    its resolver asks the server for the order by its business key and settles the outcome.
//! 3. An overloaded server answers 503 with `Retry-After`; the client waits as told, within its
//!    deadline. Then the stock service goes down: the breaker opens, and after its break a
//!    half-open probe finds the service back and closes it.
//! 4. A safe `GET` to a slow replica is hedged: the hedge answers first, the slow attempt is
//!    cancelled.
//! 5. A retry budget runs dry while the stock service is down: the call stops early and says
//!    why, long before its deadline.
//!
//! After each call the demo prints its attempts as a timeline, and the outcome the caller was
//! handed back with the response or the error (`res.outcome()`, `err.outcome()`), which must
//! be the one the record says. It checks its own invariants and ends with `invariants: ok`, or
//! says what failed and exits non-zero.
//!
//! Run with `cargo run --release --example orders`.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use surely::breaker::{BreakerState, CircuitBreaker, SlidingWindow};
use surely::budget::{RetryBudget, TokenBucket};
use surely::classify::AttemptClass;
use surely::client::HttpClientBuilder;
use surely::fault::{Fault, InjectFaultLayer, Reply};
use surely::headers::IDEMPOTENCY_KEY;
use surely::headers::IDEMPOTENT_REPLAYED;
use surely::hedge::{HedgeDelay, HedgeLayer};
use surely::record::BreakerEvent;
use surely::record::BreakerEventKind;
use surely::record::{
    AttemptRecord, BusinessKey, CallRecord, InMemoryRecorder, Recorder, WatchedBody,
};
use surely::retry::backoff::Backoff;
use surely::retry::{Query, ReplayBody, Resolution};
use surely::server::deadline::ServerDeadlineLayer;
use surely::server::idempotency::{IdempotencyLayer, Ticket};
use surely::server::store::MemoryStore;
use surely::Outcome;
use surely::StopReason;
use surely::{CallOutcome, OutcomeExt};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The demo asks the server for a fault with this header; a real outage needs no asking.
///
/// * `lose-reply`: the server does the work, then the connection is reset before the reply;
/// * `busy`: `503` with `Retry-After: 1`, before any work;
/// * `slow`: the answer comes 300 ms late;
/// * `down`: `503` without `Retry-After`, before any work.
///
/// The first three hit only the first request that carries them (per idempotency key, or per
/// method and path): a retry or a hedge carries the same header, and gets through. `down` hits
/// every request.
const DEMO_FAULT: &str = "x-demo-fault";

/// Every call's total budget.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// The slow replica's delay, and the hedge's.
const SLOW_REPLICA: Duration = Duration::from_millis(300);
const HEDGE_DELAY: Duration = Duration::from_millis(50);
/// How long the breaker stays open.
const BREAK: Duration = Duration::from_millis(300);

// ----- the server -------------------------------------------------------------------------------

/// The shop's state, as the server sees it.
#[derive(Default)]
struct Shop {
    /// Committed orders, in order, duplicates included (so that a duplicate would show).
    orders: Mutex<Vec<String>>,
    /// `POST`s without an `Idempotency-Key` that reached the server, counted at its door.
    unkeyed_posts: AtomicUsize,
    /// The once-only faults already injected, by request identity.
    faulted: Mutex<HashSet<String>>,
}

impl Shop {
    fn orders(&self) -> Vec<String> {
        self.orders.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// The fault for a request, at the server's door (outside the idempotency layer).
    fn fault(&self, req: &Request<Incoming>) -> Option<Fault> {
        let key = req
            .headers()
            .get(IDEMPOTENCY_KEY)
            .map(|k| k.to_str().unwrap_or("?"));
        let post = req.method() == Method::POST;
        if post && key.is_none() {
            self.unkeyed_posts.fetch_add(1, Ordering::SeqCst);
        }
        let fault = self.choose(req, key);
        // Every POST is logged at the door, with its key; other requests only when faulted.
        let door = match key {
            Some(key) => format!("key {}", short(key)),
            None => "no key".to_owned(),
        };
        match (&fault, post) {
            (Some((_, what)), true) => println!("  server   POST /orders ({door}): {what}"),
            (None, true) => println!("  server   POST /orders ({door})"),
            (Some((_, what)), false) => {
                println!("  server   {} {}: {what}", req.method(), req.uri().path())
            }
            (None, false) => {}
        }
        fault.map(|(fault, _)| fault)
    }

    /// The fault the demo asked for in [`DEMO_FAULT`], if this request gets it.
    fn choose(&self, req: &Request<Incoming>, key: Option<&str>) -> Option<(Fault, &'static str)> {
        let name = req.headers().get(DEMO_FAULT)?.to_str().ok()?;
        let chosen = match name {
            "lose-reply" => (
                Fault::ResetAfterSend,
                "will do the work, then lose the reply",
            ),
            "busy" => (
                Fault::Respond(
                    Reply::new(StatusCode::SERVICE_UNAVAILABLE).retry_after(Duration::from_secs(1)),
                ),
                "overloaded: 503, Retry-After: 1",
            ),
            "slow" => (Fault::Delay(SLOW_REPLICA), "slow replica: answers in 300ms"),
            "down" => (
                Fault::Respond(Reply::new(StatusCode::SERVICE_UNAVAILABLE)),
                "down: 503",
            ),
            _ => return None,
        };
        if name != "down" {
            let identity = match key {
                Some(key) => format!("{name} {key}"),
                None => format!("{name} {} {}", req.method(), req.uri().path()),
            };
            let first = self
                .faulted
                .lock()
                .map(|mut f| f.insert(identity))
                .unwrap_or(false);
            if !first {
                return None;
            }
        }
        Some(chosen)
    }
}

/// The start of an idempotency key, for the log.
fn short(key: &str) -> String {
    format!("{}…", key.chars().take(8).collect::<String>())
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(body.into()));
    *res.status_mut() = status;
    res
}

/// The shop's handler, behind the idempotency layer.
async fn handle(
    shop: Arc<Shop>,
    req: Request<Full<Bytes>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let budget = fmt_ms(surely::deadline::current().map(|d| d.remaining()));
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path();
    Ok(match (parts.method, path) {
        (Method::POST, "/orders") => {
            let id = String::from_utf8_lossy(&body).into_owned();
            let fence = match parts.extensions.get::<Ticket>() {
                Some(ticket) => format!("fence {}", ticket.fence().get()),
                None => "no key, no fence".to_owned(),
            };
            println!("  server   handler: committed order {id} ({fence}, budget left {budget})");
            if let Ok(mut orders) = shop.orders.lock() {
                orders.push(id.clone());
            }
            reply(StatusCode::CREATED, id)
        }
        (Method::GET, path) if path.starts_with("/orders/") => {
            let id = path.trim_start_matches("/orders/");
            if shop.orders().iter().any(|o| o == id) {
                reply(StatusCode::OK, id.to_owned())
            } else {
                reply(StatusCode::NOT_FOUND, "")
            }
        }
        (Method::GET, path) if path.starts_with("/stock/") => reply(StatusCode::OK, "12 in stock"),
        _ => reply(StatusCode::NOT_FOUND, ""),
    })
}

/// Serves the shop on a fresh port of 127.0.0.1 until the process ends:
/// deadline → fault → (a line for each replay) → idempotency → handler.
async fn serve(shop: Arc<Shop>) -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let deadlines = ServerDeadlineLayer::builder()
        .max(Duration::from_secs(10))
        .build()?;
    let idempotency = IdempotencyLayer::builder(MemoryStore::new()).build()?;
    let policy = {
        let shop = shop.clone();
        move |req: &Request<Incoming>| shop.fault(req)
    };
    let svc = ServiceBuilder::new()
        .layer(deadlines)
        .layer(InjectFaultLayer::new(policy))
        .map_response(|res: Response<Full<Bytes>>| {
            if res.headers().contains_key(IDEMPOTENT_REPLAYED) {
                println!(
                    "  server   idempotency layer: key already completed, stored {} replayed; the handler does not run",
                    res.status()
                );
            }
            res
        })
        .layer(idempotency)
        .service_fn(move |req| handle(shop.clone(), req));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    Ok(addr)
}

// ----- the client -------------------------------------------------------------------------------

/// The transport under every client stack: hyper-util's client, counting the requests it is
/// given, to compare with the attempt records.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    calls: Arc<AtomicUsize>,
}

impl<S: Service<R>, R> Service<R> for Counted<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> S::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.call(req)
    }
}

type Transport = Counted<Client<HttpConnector, ReplayBody<Full<Bytes>>>>;

/// Keeps every record for the timelines and the invariants, and prints the breakers' state
/// changes as they happen.
#[derive(Clone, Debug, Default)]
struct Log {
    records: InMemoryRecorder,
}

impl Recorder for Log {
    fn record_attempt(&self, record: &AttemptRecord) {
        self.records.record_attempt(record);
    }

    fn record_call(&self, record: &CallRecord) {
        self.records.record_call(record);
    }

    fn record_breaker(&self, event: &BreakerEvent) {
        println!("  breaker  {event}");
        self.records.record_breaker(event);
    }
}

/// What every client of the demo shares: a 3 s budget per call, 500 ms per attempt, retries
/// 50 ms apart (the server's pushback wins when it gives one), the records.
fn stack(log: &Log) -> HttpClientBuilder<Log> {
    surely::client::http()
        .timeout(CALL_TIMEOUT)
        .per_try_timeout(Duration::from_millis(500))
        .retry(|r| r.backoff(Backoff::constant(Duration::from_millis(50))))
        .recorder(log.clone())
}

/// A request with a business key for the records, and a demo fault if any.
fn request(
    method: Method,
    uri: String,
    body: &str,
    key: &str,
    fault: Option<&str>,
) -> Result<Request<Full<Bytes>>, BoxError> {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(fault) = fault {
        req = req.header(DEMO_FAULT, fault);
    }
    let mut req = req.body(Full::new(Bytes::from(body.to_owned())))?;
    req.extensions_mut().insert(BusinessKey::new(key));
    Ok(req)
}

async fn send<S, Req>(client: &mut S, req: Req) -> Result<S::Response, S::Error>
where
    S: Service<Req>,
{
    client.ready().await?.call(req).await
}

// ----- printing ---------------------------------------------------------------------------------

fn fmt_ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "none".to_owned(), |d| format!("{}ms", d.as_millis()))
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Prints the last call's attempts as a timeline, and its call line; returns the call and its
/// attempts in order.
fn timeline(records: &InMemoryRecorder) -> Option<(CallRecord, Vec<AttemptRecord>)> {
    let call = records.calls().last().cloned()?;
    let mut attempts = records.attempts_of(call.call);
    attempts.sort_by_key(|a| a.attempt);
    println!(
        "    {:<3} {:<7} {:>7} {:>6}  {:<16} {:<16} decision",
        "#", "key", "left", "took", "phase", "class"
    );
    for (i, a) in attempts.iter().enumerate() {
        let decision = match attempts.get(i + 1) {
            Some(next) if next.hedge => format!(
                "hedged after {}",
                ms(next.started.saturating_duration_since(a.started))
            ),
            Some(next) => match call.retries.iter().find(|r| r.after == a.attempt) {
                // What the retry layer decided: the wait, and who set it.
                Some(r) if r.pushback => format!("retried after {} (Retry-After)", ms(r.wait)),
                Some(r) => format!("retried after {} (backoff)", ms(r.wait)),
                None => format!(
                    "retried after {}",
                    ms(next.started.saturating_duration_since(a.ended))
                ),
            },
            None => format!("stop: {}", call.stop.as_str()),
        };
        let mut notes = String::new();
        if a.hedge {
            notes.push_str(" [hedge]");
        }
        if a.cancelled {
            notes.push_str(" [cancelled: lost the race]");
        }
        println!(
            "    {:<3} {:<7} {:>7} {:>6}  {:<16} {:<16} {decision}{notes}",
            a.attempt,
            a.key.as_ref().map_or("-", BusinessKey::as_str),
            fmt_ms(a.deadline_left),
            ms(a.duration()),
            a.phase().as_str(),
            a.class().as_str(),
        );
    }
    let resolution = match &call.resolution {
        Some(q) => format!(
            ", resolved by a query: {} (in {})",
            q.answer.as_str(),
            ms(q.ended.saturating_duration_since(q.started))
        ),
        None => String::new(),
    };
    println!(
        "    call: outcome {}, stop {}, {} attempt(s) in {} of its {}{resolution}",
        call.outcome.as_str(),
        call.stop.as_str(),
        call.attempts,
        ms(call.duration()),
        fmt_ms(call.deadline_left),
    );
    Some((call, attempts))
}

/// What a call came back with: the outcome handed back with it, and the response read to its
/// end (its status, whether it was replayed, its body) or the error. Reading the body is what
/// settles the attempt's record (the `http()` preset records an attempt when its body ends).
struct Answer {
    outcome: Option<CallOutcome>,
    got: Result<(StatusCode, bool, String), String>,
}

async fn answer<B, E>(res: Result<Response<B>, surely::Error<E>>) -> Answer
where
    B: http_body::Body,
    B::Error: std::fmt::Display,
    E: std::error::Error + 'static,
{
    let outcome = res.call_outcome().cloned();
    let got = match res {
        Ok(res) => {
            let status = res.status();
            let replayed = res
                .headers()
                .get(IDEMPOTENT_REPLAYED)
                .is_some_and(|v| v == "true");
            match res.into_body().collect().await {
                Ok(b) => Ok((
                    status,
                    replayed,
                    String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                )),
                Err(e) => Err(format!("{status}, then the body broke: {e}")),
            }
        }
        Err(e) => Err(chain(&e)),
    };
    Answer { outcome, got }
}

/// Prints what the caller got, and checks that the outcome it was handed is the record's.
fn handed(answer: &Answer, call: &CallRecord, step: &str, checks: &mut Checks) {
    match &answer.got {
        Ok((status, replayed, body)) => {
            let note = if *replayed {
                ", idempotent-replayed: true"
            } else {
                ""
            };
            println!("  client   {status}{note}, body {body:?}");
        }
        Err(e) => println!("  client   error: {e}"),
    }
    match &answer.outcome {
        Some(o) => println!("  client   handed back: {o}"),
        None => println!("  client   handed back no outcome"),
    }
    let got = answer.outcome.as_ref().map(|o| (o.outcome(), o.attempts()));
    checks.check(
        got == Some((call.outcome, call.attempts)),
        format!(
            "{step}: the caller was handed the record's outcome ({got:?}, the record says {} after {})",
            call.outcome.as_str(),
            call.attempts
        ),
    );
}

/// An error and its sources, on one line.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        out.push_str(": ");
        out.push_str(&e.to_string());
        next = e.source();
    }
    out
}

/// The failed checks.
#[derive(Default)]
struct Checks(Vec<String>);

impl Checks {
    fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.0.push(what.into());
        }
    }
}

// ----- the story --------------------------------------------------------------------------------

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let started = Instant::now();
    let shop = Arc::new(Shop::default());
    let addr = serve(shop.clone()).await?;
    let base = format!("http://{addr}");
    let log = Log::default();
    let records = log.records.clone();
    let calls = Arc::new(AtomicUsize::new(0));
    let transport: Transport = Counted {
        inner: Client::builder(TokioExecutor::new()).build_http(),
        calls: calls.clone(),
    };
    let mut checks = Checks::default();

    // One client for the order service: keys on POSTs, retries, its own breaker. The order
    // service runs surely's idempotency layer, and this client is told so: its generated keys
    // make POSTs keyed, so a lost reply may be retried.
    let mut orders = stack(&log).server_honours_keys().build(transport.clone())?;

    println!(
        "1. POST order o-1 with an idempotency key; the server commits it, the reply is lost."
    );
    println!(
        "   Expect: maybe committed -> retried with the same key -> the stored result, replayed."
    );
    let req = request(
        Method::POST,
        format!("{base}/orders"),
        "o-1",
        "o-1",
        Some("lose-reply"),
    )?;
    let got = answer(send(&mut orders, req).await).await;
    let (call, attempts) = timeline(&records).ok_or("no call record")?;
    handed(&got, &call, "step 1", &mut checks);
    checks.check(
        got.outcome.as_ref().is_some_and(CallOutcome::is_replayed),
        "step 1: the caller was told the answer was a replay",
    );
    match &got.got {
        Ok((status, replayed, body)) => {
            checks.check(
                *status == StatusCode::CREATED && body == "o-1",
                "step 1: the retry got the stored 201 for o-1",
            );
            checks.check(*replayed, "step 1: the retry's answer was replayed");
        }
        Err(e) => checks.check(false, format!("step 1: the keyed POST failed: {e}")),
    }
    checks.check(
        call.outcome == Outcome::Succeeded && attempts.len() == 2,
        "step 1: two attempts, and the call succeeded",
    );
    checks.check(
        attempts
            .first()
            .is_some_and(|a| a.class() == AttemptClass::MaybeCommitted),
        "step 1: the lost reply was maybe committed",
    );

    println!();
    println!("2. POST order o-2 without a key; the server commits it, the reply is lost.");
    println!("   Expect: unknown -> not sent again -> the resolver asks for o-2 and settles it.");
    let plain = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let lookup = move |q: Query| {
        let plain = plain.clone();
        let base = format!("http://{addr}");
        async move {
            let Some(order) = q.key else {
                return Resolution::Unknown;
            };
            println!("  resolver GET /orders/{order}: did it commit?");
            let Ok(req) = Request::get(format!("{base}/orders/{order}")).body(Full::default())
            else {
                return Resolution::Unknown;
            };
            match tokio::time::timeout(Duration::from_millis(500), plain.request(req)).await {
                Ok(Ok(res)) if res.status() == StatusCode::OK => {
                    Resolution::Succeeded(res.map(WatchedBody::new))
                }
                Ok(Ok(res)) if res.status() == StatusCode::NOT_FOUND => Resolution::Failed,
                _ => Resolution::Unknown,
            }
        }
    };
    let mut unkeyed = stack(&log)
        .no_idempotency_keys()
        .retry(|r| r.resolver(lookup))
        .build(transport.clone())?;
    let req = request(
        Method::POST,
        format!("{base}/orders"),
        "o-2",
        "o-2",
        Some("lose-reply"),
    )?;
    let got = answer(send(&mut unkeyed, req).await).await;
    let (call, attempts) = timeline(&records).ok_or("no call record")?;
    handed(&got, &call, "step 2", &mut checks);
    match &got.got {
        Ok((status, _, body)) => checks.check(
            *status == StatusCode::OK && body == "o-2",
            "step 2: the resolver's answer is the order o-2",
        ),
        Err(e) => checks.check(false, format!("step 2: the call failed: {e}")),
    }
    checks.check(
        call.attempts == 1 && attempts.len() == 1,
        "no retry of the unkeyed POST: exactly one attempt",
    );
    checks.check(
        shop.unkeyed_posts.load(Ordering::SeqCst) == 1,
        "no retry of the unkeyed POST: the server saw it once",
    );
    checks.check(
        call.resolution
            .is_some_and(|q| q.answer == Outcome::Succeeded)
            && call.outcome == Outcome::Succeeded,
        "step 2: the resolution settled the outcome as succeeded",
    );

    println!();
    println!("3a. POST order o-3 to an overloaded server: 503 with Retry-After: 1.");
    println!("    Expect: nothing was done -> the client waits the 1 s it was told, within its deadline.");
    let req = request(
        Method::POST,
        format!("{base}/orders"),
        "o-3",
        "o-3",
        Some("busy"),
    )?;
    let got = answer(send(&mut orders, req).await).await;
    let (call, attempts) = timeline(&records).ok_or("no call record")?;
    handed(&got, &call, "step 3a", &mut checks);
    match &got.got {
        Ok((status, _, _)) => {
            checks.check(*status == StatusCode::CREATED, "step 3: o-3 was created")
        }
        Err(e) => checks.check(false, format!("step 3: the POST failed: {e}")),
    }
    let waited = match attempts.as_slice() {
        [first, second] => second.started.saturating_duration_since(first.ended),
        _ => Duration::ZERO,
    };
    checks.check(
        attempts.len() == 2
            && attempts[0].class() == AttemptClass::Rejected
            && waited >= Duration::from_millis(950)
            && call.outcome == Outcome::Succeeded,
        format!("step 3: the 503 was retried after its Retry-After (waited {waited:?})"),
    );

    println!();
    println!("3b. The stock service goes down (503 without Retry-After) and comes back.");
    println!(
        "    Expect: three failures open its breaker; the next call is refused at once, waits"
    );
    println!("    the break, and goes through as the half-open probe, which closes the breaker.");
    let breaker = CircuitBreaker::builder()
        .name("stock")
        .window(SlidingWindow::Count(10))
        .min_throughput(3)
        .break_duration(BREAK)
        .jitter(0.0)
        .recorder(log.clone())
        .build()?;
    let mut stock = stack(&log)
        .breaker(breaker.clone())
        .build(transport.clone())?;
    let stock_uri = format!("{base}/stock/sku-42");
    let req = request(Method::GET, stock_uri.clone(), "", "sku-42", Some("down"))?;
    let got = answer(send(&mut stock, req).await).await;
    let (call, _) = timeline(&records).ok_or("no call record")?;
    handed(&got, &call, "step 3b", &mut checks);
    checks.check(
        breaker.state() == BreakerState::Open,
        "step 3: the breaker opened after repeated failures",
    );
    println!("  (the stock service is back)");
    let req = request(Method::GET, stock_uri.clone(), "", "sku-42", None)?;
    let got = answer(send(&mut stock, req).await).await;
    let (call, _) = timeline(&records).ok_or("no call record")?;
    handed(&got, &call, "step 3b, the probe", &mut checks);
    checks.check(
        call.outcome == Outcome::Succeeded && breaker.state() == BreakerState::Closed,
        "step 3: the probe succeeded and the breaker closed",
    );
    let transitions: Vec<(BreakerState, BreakerState)> = records
        .breaker_events()
        .iter()
        .filter_map(|e| match e.kind {
            BreakerEventKind::Transition { from, to, .. } => Some((from, to)),
            _ => None,
        })
        .collect();
    checks.check(
        transitions
            == [
                (BreakerState::Closed, BreakerState::Open),
                (BreakerState::Open, BreakerState::HalfOpen),
                (BreakerState::HalfOpen, BreakerState::Closed),
            ],
        format!("step 3: the breaker went closed -> open -> half-open -> closed ({transitions:?})"),
    );

    println!();
    println!("4. GET order o-1 from a slow replica (300 ms), hedged after 50 ms.");
    println!("   Expect: a GET is safe to send twice -> the hedge answers first, the slow attempt is cancelled.");
    let mut hedged = stack(&log)
        .hedge(HedgeLayer::builder().delay(HedgeDelay::fixed(HEDGE_DELAY)))
        .build(transport.clone())?;
    let req = request(
        Method::GET,
        format!("{base}/orders/o-1"),
        "",
        "o-1",
        Some("slow"),
    )?;
    let got = answer(send(&mut hedged, req).await).await;
    let (call, attempts) = timeline(&records).ok_or("no call record")?;
    handed(&got, &call, "step 4", &mut checks);
    match &got.got {
        Ok((status, _, body)) => checks.check(
            *status == StatusCode::OK && body == "o-1",
            "step 4: the hedged GET found o-1",
        ),
        Err(e) => checks.check(false, format!("step 4: the GET failed: {e}")),
    }
    checks.check(
        call.outcome == Outcome::Succeeded
            && attempts
                .iter()
                .any(|a| a.hedge && !a.cancelled && a.class() == AttemptClass::Success)
            && attempts.iter().any(|a| a.cancelled && !a.hedge),
        "step 4: the hedge won and the slow attempt was recorded as cancelled",
    );

    println!();
    println!(
        "5. The stock service is down again; this client's retry budget is a token bucket of 4"
    );
    println!("   (retries only above 2 tokens, each failure takes one), 5 attempts allowed.");
    println!(
        "   Expect: two failures drain it -> the call stops at once, long before its deadline."
    );
    let bucket: Arc<dyn RetryBudget> = Arc::new(
        TokenBucket::builder()
            .max_tokens(4)
            .token_ratio(0.1)
            .build()?,
    );
    let mut budgeted = stack(&log)
        .budget(bucket)
        .retry(|r| r.max_attempts(5))
        .build(transport.clone())?;
    let req = request(Method::GET, stock_uri, "", "sku-42", Some("down"))?;
    let got = answer(send(&mut budgeted, req).await).await;
    let (call, _) = timeline(&records).ok_or("no call record")?;
    handed(&got, &call, "step 5", &mut checks);
    let deadline = call.deadline_left.unwrap_or(Duration::ZERO);
    checks.check(
        call.stop == StopReason::BudgetExhausted && call.attempts < 5,
        "step 5: the call stopped with budget exhausted",
    );
    checks.check(
        call.duration() < deadline,
        "step 5: the call stopped before its deadline",
    );
    println!(
        "  client   stopped after {} with {} of its deadline unused",
        ms(call.duration()),
        ms(deadline.saturating_sub(call.duration()))
    );

    // ----- the invariants, over the whole run ----------------------------------------------
    println!();
    let held = shop.orders();
    println!("The server holds: {}", held.join(", "));
    for id in ["o-1", "o-2", "o-3"] {
        let n = held.iter().filter(|o| *o == id).count();
        checks.check(n == 1, format!("one order per key: {id} is held {n} times"));
    }
    checks.check(held.len() == 3, "the server holds exactly o-1, o-2, o-3");
    let all_calls = records.calls();
    let all_attempts = records.attempts();
    for a in &all_attempts {
        let deadline = all_calls
            .iter()
            .find(|c| Some(c.call) == a.call)
            .and_then(|c| c.deadline_left.map(|d| c.started + d));
        checks.check(
            deadline.is_some_and(|d| a.started <= d),
            format!(
                "no attempt after the deadline: {:?} attempt {}",
                a.call, a.attempt
            ),
        );
    }
    let sent = calls.load(Ordering::SeqCst);
    println!(
        "{} calls, {} attempt records, {sent} transport calls, in {}",
        all_calls.len(),
        all_attempts.len(),
        ms(started.elapsed())
    );
    checks.check(
        all_attempts.len() == sent,
        format!(
            "records == transport calls ({} attempt records, {sent} transport calls)",
            all_attempts.len()
        ),
    );

    if checks.0.is_empty() {
        println!("invariants: ok");
        Ok(())
    } else {
        for f in &checks.0 {
            println!("invariant failed: {f}");
        }
        std::process::exit(1);
    }
}
