//! An owner that dies after its checkpoint is recovered from facts, never run again blindly
//! (`surely::docs::server_states`: a lease that passes says who may push a record forward, not
//! whether the previous owner's payment happened). On real hyper servers over 127.0.0.1.
//!
//! A payment service runs behind surely's `IdempotencyLayer` and charges a payment channel (a
//! fake in the process that counts the charges per channel request id; it is not idempotent).
//! Its handler reuses the channel request id an earlier owner recorded (or makes `ch-{key}`),
//! records it with `ticket.checkpoint("charge", id)` before it calls the channel, charges, and
//! answers `201 paid {id}`.
//!
//! In each act, instance A runs on a tokio runtime of its own, with its own store handle; its
//! handler dies at a chosen point, and the runtime is shut down: A's server, its connection and
//! its handler are dropped, and nothing is released. Instance B serves on another port, over
//! the same store. The client (`surely::client::http()`, told that the server honours keys, a
//! 10 s deadline, a constant 200 ms backoff) reaches whichever instance is alive through a
//! small balancer; its retries carry the same `Idempotency-Key`. B answers `409` (with
//! `Retry-After`) until A's 2 s lease passes, and the retry after that takes the record over:
//!
//! 1. **pay-1**, A dies after the charge; B has a recovery hook, which asks the channel about
//!    the recorded request id, finds it charged, and answers `201 paid ch-pay-1` without
//!    running the handler. The client gets it as a replay.
//! 2. **pay-2**, A dies between the checkpoint and the charge; the hook finds nothing charged
//!    and resumes: the handler runs on B with the recorded id, and charges once.
//! 3. **pay-3**, A dies after the charge; B has no hook. The record has a checkpoint, so it is
//!    not run again: it becomes `UNKNOWN`, and B answers `202` with `idempotency-error:
//!    IDEMPOTENCY_OUTCOME_UNKNOWN`, which the client reads as maybe committed and not to be
//!    retried: the call ends unknown. The ledger's reconciler (`Reconciler::settle_server`) asks
//!    the channel through its resolver, completes the record, and the client's next request
//!    with the key gets the replayed `201`.
//!
//! Every act prints its steps; the run ends with one line per invariant (one charge per key,
//! no blind rerun after a takeover, every unknown settled or in the manual queue), then
//! `invariants: ok`, or says what failed and exits with 1.
//!
//! Two modes:
//!
//! ```sh
//! # one MemoryStore, cloned to both instances (clones share their records)
//! cargo run --release --example takeover
//!
//! # PostgreSQL: a PostgresStore (and its pool) per runtime, in a table of the run's own,
//! # dropped at the end
//! SURELY_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --release --features postgres --example takeover
//! ```
//!
//! (`--postgres URL` on the command line does the same as the variable.) A URL that does not
//! answer ends the run with an error; there is no fallback to memory.

#[path = "support/checks.rs"]
mod checks;
#[path = "support/http_client.rs"]
mod http_client;
use checks::Checks;
use http_client::HttpClient;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use surely::headers::{IDEMPOTENCY_ERROR, IDEMPOTENCY_KEY, NOT_PROCESSED};
use surely::ledger::{MemoryLedger, Reconciler};
use surely::record::{
    BusinessKey, InMemoryRecorder, RecoveryVerdict, ServerEvent, ServerEventKind,
};
use surely::retry::backoff::Backoff;
use surely::retry::{Query, ReplayBody, Resolution};
use surely::server::idempotency::{IdempotencyLayer, Recovery, Takeover, Ticket};
use surely::server::store::{Checkpoint, IdempotencyStore, MemoryStore, UnknownRecord};
use surely::{CallOutcome, Outcome, OutcomeExt};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::sync::Notify;
use tower::{service_fn, Layer, Service, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

// ----- the figures ------------------------------------------------------------------------------

/// How long an owner holds its record before a request with the same key may take it over.
const LEASE: Duration = Duration::from_secs(2);
/// The client's budget per call: long enough to outlast the lease.
const DEADLINE: Duration = Duration::from_secs(10);
/// The client's wait before a retry when the server says nothing (a `409` says `Retry-After`).
const BACKOFF: Duration = Duration::from_millis(200);
/// At most this many attempts per call, the first included; the deadline bounds them too.
const MAX_ATTEMPTS: u32 = 10;
/// How long the main thread waits for instance A's handler to reach the point where it dies.
const DEATH_WAIT: Duration = Duration::from_secs(10);
/// The limit on one query of the resolver that settles unknown records.
const QUERY_TIMEOUT: Duration = Duration::from_secs(1);
/// The client sends to this name; the balancer puts the live instance's address in its place.
const SERVICE_URI: &str = "http://payments/payments";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
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

// ----- the payment channel ----------------------------------------------------------------------

/// A payment channel in the process: it charges every request it gets (it is not idempotent),
/// and answers whether a channel request id was charged.
#[derive(Clone, Default)]
struct Channel(Arc<Mutex<HashMap<String, u32>>>);

impl Channel {
    fn charge(&self, id: &str) {
        *lock(&self.0).entry(id.to_owned()).or_default() += 1;
    }

    fn charged(&self, id: &str) -> bool {
        lock(&self.0).contains_key(id)
    }

    fn charges_of(&self, id: &str) -> u32 {
        lock(&self.0).get(id).copied().unwrap_or(0)
    }

    fn charges(&self) -> u32 {
        lock(&self.0).values().sum()
    }
}

/// The channel request id of a payment's first owner.
fn request_id(key: &str) -> String {
    format!("ch-{key}")
}

// ----- the payment service -----------------------------------------------------------------------

/// Where instance A's handler dies.
#[derive(Clone, Copy, Debug)]
enum Death {
    /// After the channel charged: the answer is never sent.
    AfterCharge,
    /// After the checkpoint, before the channel was called.
    BeforeCharge,
}

impl Death {
    fn describe(self) -> &'static str {
        match self {
            Death::AfterCharge => "after the charge, before it answers",
            Death::BeforeCharge => "after its checkpoint, before the charge",
        }
    }
}

/// Which instance ran the handler, for which key: every run, in order.
type Runs = Arc<Mutex<Vec<(&'static str, String)>>>;

/// One instance's payment handler.
#[derive(Clone)]
struct Payments {
    instance: &'static str,
    channel: Channel,
    runs: Runs,
    /// Where the handler dies, and whom it tells first (instance A only).
    death: Option<(Death, Arc<Notify>)>,
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(body.into()));
    *res.status_mut() = status;
    res
}

/// The handler: reuses the channel request id an earlier owner recorded, records it before it
/// calls the channel, charges, and answers `201 paid {id}`. On instance A it dies where told: it
/// says so, then waits forever, until its runtime is shut down under it.
async fn pay(p: Payments, req: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let who = p.instance;
    // The layer requires a key on POST: every request that reaches here has a ticket.
    let Some(ticket) = req.extensions().get::<Ticket>().cloned() else {
        return Ok(reply(
            StatusCode::BAD_REQUEST,
            "an Idempotency-Key is required",
        ));
    };
    let key = ticket.record_key().key().as_str().to_owned();
    let fence = ticket.fence().get();
    lock(&p.runs).push((who, key.clone()));
    let (id, whose) = match ticket.recorded("charge") {
        Some(id) => (id.to_owned(), "the id an earlier owner recorded"),
        None => (request_id(&key), "a new id"),
    };
    if let Err(e) = ticket.checkpoint("charge", &id).await {
        // Nothing was charged: the answer says so, and the key is released for the next
        // attempt (or, when another owner took the record over, left to it).
        println!("  {who:<10} handler {key} (fence {fence}): checkpoint refused, not charged: {e}");
        let status = if e.is_rejected() {
            StatusCode::UNPROCESSABLE_ENTITY
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        let mut res = reply(status, e.to_string());
        res.headers_mut()
            .insert(NOT_PROCESSED, HeaderValue::from_static("true"));
        return Ok(res);
    }
    println!("  {who:<10} handler {key} (fence {fence}): checkpoint charge={id} ({whose})");
    if let Some((Death::BeforeCharge, dead)) = &p.death {
        println!("  {who:<10} dies {}", Death::BeforeCharge.describe());
        dead.notify_one();
        std::future::pending::<()>().await;
    }
    p.channel.charge(&id);
    println!("  {who:<10} channel charged {id}");
    if let Some((Death::AfterCharge, dead)) = &p.death {
        println!("  {who:<10} dies {}", Death::AfterCharge.describe());
        dead.notify_one();
        std::future::pending::<()>().await;
    }
    Ok(reply(StatusCode::CREATED, format!("paid {id}")))
}

/// A 201 for a payment the channel charged: what the handler would have answered.
fn paid(id: &str) -> Response<Bytes> {
    let mut res = Response::new(Bytes::from(format!("paid {id}")));
    *res.status_mut() = StatusCode::CREATED;
    res
}

fn fmt_checkpoints(checkpoints: &[Checkpoint]) -> String {
    if checkpoints.is_empty() {
        return "none".to_owned();
    }
    checkpoints
        .iter()
        .map(|c| format!("{}={}", c.name(), c.value()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Instance B's recovery hook: asks the channel about the request id the dead owner recorded.
async fn ask_channel(channel: Channel, t: Takeover) -> Recovery {
    let key = t.key.key().as_str().to_owned();
    let (recovery, said) = match t.checkpoint("charge") {
        // The owner died before it recorded anything: it never reached the channel.
        None => (Recovery::Resume, "no charge recorded: resume".to_owned()),
        Some(id) if channel.charged(id) => (
            Recovery::Completed(paid(id)),
            format!("the channel charged {id}: completed, 201 paid {id}"),
        ),
        // Recorded, not charged: run the handler again, with the same request id.
        Some(id) => (
            Recovery::Resume,
            format!("the channel has no charge {id}: resume"),
        ),
    };
    println!(
        "  B          hook: took over {key} (fence {}, {} past the lease; checkpoints {}): {said}",
        t.fence.get(),
        ms(t.overdue),
        fmt_checkpoints(&t.checkpoints)
    );
    recovery
}

/// Serves `svc` on a fresh port of 127.0.0.1 over HTTP/1, on the current runtime, until the
/// runtime is shut down; returns the port's address.
async fn serve<S>(svc: S) -> Result<SocketAddr, BoxError>
where
    S: Service<Request<Incoming>, Response = Response<Full<Bytes>>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                // A connection that breaks ends here; the client sees it.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// Serves `payments` behind `layer`.
async fn serve_payments<St>(
    layer: &IdempotencyLayer<St>,
    payments: Payments,
) -> Result<SocketAddr, BoxError>
where
    St: IdempotencyStore + Clone + Send + Sync + 'static,
{
    let svc = layer.layer(service_fn(move |req| pay(payments.clone(), req)));
    serve(svc).await
}

// ----- the balancer and the client -----------------------------------------------------------------

/// The instance the balancer sends to.
#[derive(Clone, Copy)]
struct Live {
    name: &'static str,
    addr: SocketAddr,
}

/// The client's transport: hyper-util's client, with every request sent to the live instance
/// (the request's authority replaced by its address). Says what each attempt got.
#[derive(Clone)]
struct Balancer {
    client: Client<HttpConnector, ReplayBody<Full<Bytes>>>,
    live: Arc<Mutex<Live>>,
}

impl Service<Request<ReplayBody<Full<Bytes>>>> for Balancer {
    type Response = Response<Incoming>;
    type Error = hyper_util::client::legacy::Error;
    type Future = BoxFuture<Result<Response<Incoming>, hyper_util::client::legacy::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper-util's client is always ready: it waits for a connection in its future.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
        let live = *lock(&self.live);
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        // An address and a path from a valid URI always make a URI; were it refused, the
        // request would go where it was sent, and fail to connect.
        if let Ok(uri) = Uri::builder()
            .scheme("http")
            .authority(live.addr.to_string())
            .path_and_query(path)
            .build()
        {
            *req.uri_mut() = uri;
        }
        let sent = self.client.request(req);
        Box::pin(async move {
            let res = sent.await;
            let got = match &res {
                Ok(res) => {
                    let retry_after = res
                        .headers()
                        .get(http::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .map_or(String::new(), |v| format!(", retry-after {v}"));
                    let error = res
                        .headers()
                        .get(IDEMPOTENCY_ERROR)
                        .and_then(|v| v.to_str().ok())
                        .map_or(String::new(), |v| format!(", idempotency-error {v}"));
                    format!("{}{retry_after}{error}", res.status())
                }
                Err(e) => format!("no answer: {}", chain(e)),
            };
            println!(
                "  client     attempt via the balancer to {} ({}): {got}",
                live.name, live.addr
            );
            res
        })
    }
}

/// A payment of 42 EUR with `key` as its `Idempotency-Key` (and its business key, for the
/// records).
fn payment(key: &str) -> Result<Request<Full<Bytes>>, BoxError> {
    let mut req = Request::post(SERVICE_URI)
        .header(IDEMPOTENCY_KEY, key)
        .body(Full::new(Bytes::from_static(b"42 EUR")))?;
    req.extensions_mut().insert(BusinessKey::new(key));
    Ok(req)
}

/// What a call came to: the outcome handed back, and the answer read to its end (reading it
/// settles the attempt's record) or the error.
struct Answer {
    outcome: Option<CallOutcome>,
    got: Result<Got, String>,
}

struct Got {
    status: StatusCode,
    replayed: bool,
    /// The `idempotency-error` header, if any.
    error: Option<String>,
    body: String,
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
            let replayed = res.is_replayed();
            let error = res
                .headers()
                .get(IDEMPOTENCY_ERROR)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            match res.into_body().collect().await {
                Ok(b) => Ok(Got {
                    status,
                    replayed,
                    error,
                    body: String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                }),
                Err(e) => Err(format!("{status}, then the body broke: {e}")),
            }
        }
        Err(e) => Err(chain(&e)),
    };
    Answer { outcome, got }
}

impl Answer {
    fn outcome(&self) -> Option<Outcome> {
        self.outcome.as_ref().map(CallOutcome::outcome)
    }

    fn print(&self) {
        match &self.got {
            Ok(g) => {
                let replayed = if g.replayed { ", replayed" } else { "" };
                let error = g
                    .error
                    .as_ref()
                    .map_or(String::new(), |e| format!(", idempotency-error {e}"));
                println!(
                    "  client     got {}{replayed}{error}, body {:?}",
                    g.status, g.body
                );
            }
            Err(e) => println!("  client     got an error: {e}"),
        }
        match &self.outcome {
            Some(o) => println!("  client     handed back: {o}"),
            None => println!("  client     handed back no outcome"),
        }
    }

    /// Whether the answer is `status` with `body`, replayed or not.
    fn is(&self, status: StatusCode, replayed: bool, body: &str) -> bool {
        matches!(&self.got, Ok(g) if g.status == status && g.replayed == replayed && g.body == body)
    }
}

/// Prints the attempts of the last call with `key`.
fn print_attempts(records: &InMemoryRecorder, key: &str) {
    let Some(call) = records
        .calls()
        .into_iter()
        .rev()
        .find(|c| c.key.as_ref().is_some_and(|k| k.as_str() == key))
    else {
        println!("    no call recorded for {key}");
        return;
    };
    let mut attempts = records.attempts_of(call.call);
    attempts.sort_by_key(|a| a.attempt);
    for a in &attempts {
        println!(
            "    attempt {}: {} ({}), took {}",
            a.attempt,
            a.class().as_str(),
            a.phase().as_str(),
            ms(a.duration())
        );
    }
    println!(
        "    call {key}: {} after {} attempt(s), stop: {}, in {}",
        call.outcome.as_str(),
        call.attempts,
        call.stop.as_str(),
        ms(call.duration())
    );
}

fn fmt_event(kind: &ServerEventKind) -> String {
    match kind {
        ServerEventKind::InFlight { lease_left } => {
            format!("in_flight (lease left {})", ms(*lease_left))
        }
        ServerEventKind::LeaseTakeover { fence, overdue } => format!(
            "lease_takeover (fence {}, {} past the lease)",
            fence.get(),
            ms(*overdue)
        ),
        ServerEventKind::Recovered { fence, verdict } => {
            format!("recovered (fence {}, {})", fence.get(), verdict.as_str())
        }
        ServerEventKind::Replayed { status } => format!("replayed ({})", status.as_u16()),
        ServerEventKind::Settled { fence, happened } => format!(
            "settled (fence {}, {})",
            fence.get(),
            if *happened {
                "it happened"
            } else {
                "it did not"
            }
        ),
        other => other.as_str().to_owned(),
    }
}

// ----- the story ---------------------------------------------------------------------------------

/// Everything the acts share. `make` makes a store handle for the runtime it is called on (a
/// pool belongs to the runtime it was made on); `store` is the main runtime's.
struct Story<'r, St, F> {
    rt: &'r Runtime,
    make: F,
    store: St,
    channel: Channel,
    runs: Runs,
    /// Instance B's events, from every B.
    events: InMemoryRecorder,
    /// The client's calls and attempts.
    records: InMemoryRecorder,
    live: Arc<Mutex<Live>>,
    checks: Checks,
    /// The unknown records the settling round left: the manual queue.
    manual: Vec<UnknownRecord>,
}

/// What an act leaves for what follows: B's layer, and the call's answer.
struct Act<St> {
    layer: IdempotencyLayer<St>,
    answer: Answer,
}

impl<St, F> Story<'_, St, F>
where
    St: IdempotencyStore + Clone + Send + Sync + 'static,
    F: Fn() -> Result<St, BoxError>,
{
    fn route(&self, name: &'static str, addr: SocketAddr) {
        *lock(&self.live) = Live { name, addr };
    }

    fn client(&self) -> Result<impl HttpClient + use<St, F>, BoxError> {
        let balancer = Balancer {
            client: Client::builder(TokioExecutor::new()).build_http(),
            live: self.live.clone(),
        };
        Ok(surely::client::http()
            .server_honours_keys()
            .timeout(DEADLINE)
            .retry(|r| {
                r.backoff(Backoff::constant(BACKOFF))
                    .max_attempts(MAX_ATTEMPTS)
            })
            .recorder(self.records.clone())
            .build(balancer)?)
    }

    /// Instance B's layer over the main runtime's store handle, with the recovery hook or
    /// without one.
    fn b_layer(&self, with_hook: bool) -> Result<IdempotencyLayer<St>, BoxError> {
        let builder = IdempotencyLayer::builder(self.store.clone())
            .lease(LEASE)
            .require_key_for([Method::POST])
            .recorder(self.events.clone());
        let builder = if with_hook {
            let channel = self.channel.clone();
            builder.recover(move |t: Takeover| ask_channel(channel.clone(), t))
        } else {
            builder
        };
        Ok(builder.build()?)
    }

    fn payments(&self, instance: &'static str, death: Option<(Death, Arc<Notify>)>) -> Payments {
        Payments {
            instance,
            channel: self.channel.clone(),
            runs: self.runs.clone(),
            death,
        }
    }

    /// B's events about `key`, oldest first.
    fn events_of(&self, key: &str) -> Vec<ServerEvent> {
        self.events
            .server_events()
            .into_iter()
            .filter(|e| e.key() == Some(key))
            .collect()
    }

    /// B's events about `key` from the `from`-th on, on one line.
    fn print_events(&self, key: &str, from: usize) {
        let new: Vec<String> = self
            .events_of(key)
            .iter()
            .skip(from)
            .map(|e| fmt_event(&e.kind))
            .collect();
        if !new.is_empty() {
            println!("  B events   {}", new.join(", "));
        }
    }

    /// One takeover: A serves the payment `key` and dies at `death`; its runtime is shut down;
    /// the client's retries reach B (with the hook or without), which takes over after the lease.
    fn takeover(&mut self, key: &str, death: Death, with_hook: bool) -> Result<Act<St>, BoxError> {
        // Instance A: a runtime of its own (one worker thread), and a store handle made on it.
        let a_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("instance-a")
            .enable_all()
            .build()?;
        let dead = Arc::new(Notify::new());
        let a_payments = self.payments("A", Some((death, dead.clone())));
        let make = &self.make;
        let a = a_rt.block_on(async {
            let layer = IdempotencyLayer::builder(make()?)
                .lease(LEASE)
                .require_key_for([Method::POST])
                .build()?;
            serve_payments(&layer, a_payments).await
        })?;
        // Instance B, on the main runtime, over the same store; it serves until the run ends.
        let layer = self.b_layer(with_hook)?;
        let b = self
            .rt
            .block_on(serve_payments(&layer, self.payments("B", None)))?;
        println!(
            "  instances  A at {} (its own runtime), B at {} ({}); the balancer sends to A",
            a,
            b,
            if with_hook {
                "with the recovery hook"
            } else {
                "without a recovery hook"
            }
        );
        self.route("A", a);

        let client = self.client()?;
        let req = payment(key)?;
        let call = self
            .rt
            .spawn(async move { answer(client.oneshot(req).await).await });

        // A's handler signals when it reaches the point where it dies; then A's process goes:
        // its runtime is dropped here, with its server, its connection and the handler.
        let reached = self
            .rt
            .block_on(async { tokio::time::timeout(DEATH_WAIT, dead.notified()).await });
        if reached.is_err() {
            return Err(format!(
                "instance A's handler did not reach its death within {}",
                ms(DEATH_WAIT)
            )
            .into());
        }
        self.route("B", b);
        drop(a_rt);
        println!(
            "  main       A's runtime shut down: its server, connection and handler dropped, nothing \
             released; channel charges for {}: {}; the balancer now sends to B",
            request_id(key),
            self.channel.charges_of(&request_id(key))
        );
        let answer = self.rt.block_on(call)?;
        answer.print();
        print_attempts(&self.records, key);
        self.print_events(key, 0);
        Ok(Act { layer, answer })
    }

    /// Act 1: the hook finds the charge; the answer is rebuilt, stored and replayed.
    fn act_one(&mut self) -> Result<(), BoxError> {
        println!("1. pay-1: A charges, then dies before it answers; B has a recovery hook.");
        println!("   Expect: 409 from B until A's lease ({}) passes; the retry takes over; the hook finds", ms(LEASE));
        println!("   ch-pay-1 charged and answers 201 without running the handler; the client gets it replayed.");
        let act = self.takeover("pay-1", Death::AfterCharge, true)?;
        println!(
            "  channel    ch-pay-1 charged {} time(s)",
            self.channel.charges_of("ch-pay-1")
        );
        self.checks.check(
            act.answer.outcome() == Some(Outcome::Succeeded)
                && act.answer.is(StatusCode::CREATED, true, "paid ch-pay-1"),
            "act 1: the client got 201 paid ch-pay-1, replayed, and succeeded",
        );
        Ok(())
    }

    /// Act 2: the hook finds no charge and resumes; the handler charges once, on B.
    fn act_two(&mut self) -> Result<(), BoxError> {
        println!();
        println!(
            "2. pay-2: A records its checkpoint, then dies before the charge; B has the hook."
        );
        println!("   Expect: the hook finds no charge ch-pay-2 and resumes; the handler runs on B with the");
        println!("   recorded id and charges once; the client gets 201.");
        let act = self.takeover("pay-2", Death::BeforeCharge, true)?;
        println!(
            "  channel    ch-pay-2 charged {} time(s)",
            self.channel.charges_of("ch-pay-2")
        );
        self.checks.check(
            act.answer.outcome() == Some(Outcome::Succeeded)
                && act.answer.is(StatusCode::CREATED, false, "paid ch-pay-2"),
            "act 2: the client got 201 paid ch-pay-2 from B's handler, and succeeded",
        );
        Ok(())
    }

    /// Act 3: no hook; the record becomes unknown, is settled from the channel, and replayed.
    fn act_three(&mut self) -> Result<(), BoxError> {
        println!();
        println!("3. pay-3: A charges, then dies before it answers; B has no recovery hook.");
        println!(
            "   Expect: the record has a checkpoint, so it is not run again: UNKNOWN, 202 with"
        );
        println!("   IDEMPOTENCY_OUTCOME_UNKNOWN, the call ends unknown and is not retried; settling asks the");
        println!(
            "   channel and completes the record; the client's next request gets the replayed 201."
        );
        let key = "pay-3";
        let act = self.takeover(key, Death::AfterCharge, false)?;
        let unknown_answer = matches!(
            &act.answer.got,
            Ok(g) if g.status == StatusCode::ACCEPTED
                && g.error.as_deref() == Some("IDEMPOTENCY_OUTCOME_UNKNOWN")
        );
        self.checks.check(
            unknown_answer && act.answer.outcome() == Some(Outcome::Unknown),
            "act 3: B answered 202 IDEMPOTENCY_OUTCOME_UNKNOWN and the call ended unknown",
        );
        // The events printed so far; the later ones are printed after the settling.
        let seen = self.events_of(key).len();

        let layer = act.layer;
        let unknowns = self.rt.block_on(layer.store().unknowns(10))?;
        for u in &unknowns {
            println!(
                "  store      unknown: {} (fence {}, unknown for {}; checkpoints {}): {}",
                u.key.key().as_str(),
                u.fence.get(),
                ms(u.age),
                fmt_checkpoints(&u.checkpoints),
                u.evidence
            );
        }
        self.checks.check(
            unknowns.len() == 1
                && unknowns.first().is_some_and(|u| {
                    u.key.key().as_str() == key && u.checkpoint("charge") == Some("ch-pay-3")
                }),
            "act 3: the store lists pay-3 unknown, with its checkpoint charge=ch-pay-3",
        );

        // The resolver asks the channel by the request id the first owner makes from the key.
        let channel = self.channel.clone();
        let resolver = move |q: Query| {
            let channel = channel.clone();
            async move {
                let Some(key) = q.key else {
                    return Resolution::Unknown;
                };
                let id = request_id(key.as_str());
                let charged = channel.charged(&id);
                println!(
                    "  resolver   asks the channel about {id}: {}",
                    if charged { "charged" } else { "no charge" }
                );
                if charged {
                    Resolution::Succeeded(paid(&id))
                } else {
                    Resolution::Failed
                }
            }
        };
        // The ledger's reconciler (the one that works down the client's unknown calls) works
        // down the server's unknown records too, with the same Resolve hook.
        let reconciler = Reconciler::builder(MemoryLedger::new(), resolver)
            .query_timeout(QUERY_TIMEOUT)
            .build()?;
        let round = self.rt.block_on(reconciler.settle_server(&layer))?;
        println!("  settle     {round}");
        self.checks.check(
            round.seen == 1 && round.completed == 1,
            format!("act 3: the settling round completed pay-3 ({round})"),
        );
        self.manual = self.rt.block_on(layer.store().unknowns(100))?;
        if self.manual.is_empty() {
            println!("  store      no unknown record left: the manual queue is empty");
        }
        for u in &self.manual {
            println!(
                "  manual queue: {} (fence {}, checkpoints {}): {}",
                u.key.key().as_str(),
                u.fence.get(),
                fmt_checkpoints(&u.checkpoints),
                u.evidence
            );
        }

        println!("   The client sends pay-3 again, with the same key.");
        let client = self.client()?;
        let req = payment(key)?;
        let again = self
            .rt
            .block_on(async { answer(client.oneshot(req).await).await });
        again.print();
        print_attempts(&self.records, key);
        self.print_events(key, seen);
        println!(
            "  channel    ch-pay-3 charged {} time(s)",
            self.channel.charges_of("ch-pay-3")
        );
        self.checks.check(
            again.outcome() == Some(Outcome::Succeeded)
                && again.is(StatusCode::CREATED, true, "paid ch-pay-3"),
            "act 3: after settling, the client got 201 paid ch-pay-3, replayed",
        );
        Ok(())
    }

    /// The invariants, over the whole run: one line each.
    fn invariants(&mut self) {
        println!();
        println!("Invariants:");
        let keys = ["pay-1", "pay-2", "pay-3"];

        // One charge per key.
        let charges: Vec<(String, u32)> = keys
            .iter()
            .map(|k| {
                let id = request_id(k);
                let n = self.channel.charges_of(&id);
                (id, n)
            })
            .collect();
        let total = self.channel.charges();
        self.checks.invariant(
            charges.iter().all(|(_, n)| *n == 1) && total == 3,
            format!(
                "one charge per key: {} ({total} charges in all)",
                charges
                    .iter()
                    .map(|(id, n)| format!("{id} x{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );

        // No blind rerun: every takeover went through recovery, and B's handler ran after a
        // takeover only where recovery said resume.
        let events = self.events.server_events();
        let mut ok = true;
        let mut told = Vec::new();
        let mut takeovers = 0;
        let mut recoveries = 0;
        for key in keys {
            let of_key: Vec<&ServerEvent> =
                events.iter().filter(|e| e.key() == Some(key)).collect();
            let taken = of_key
                .iter()
                .filter(|e| matches!(e.kind, ServerEventKind::LeaseTakeover { .. }))
                .count();
            let verdicts: Vec<RecoveryVerdict> = of_key
                .iter()
                .filter_map(|e| match e.kind {
                    ServerEventKind::Recovered { verdict, .. } => Some(verdict),
                    _ => None,
                })
                .collect();
            let resumed = verdicts
                .iter()
                .filter(|v| **v == RecoveryVerdict::Resumed)
                .count();
            let ran_on_b = lock(&self.runs)
                .iter()
                .filter(|(who, k)| *who == "B" && k == key)
                .count();
            takeovers += taken;
            recoveries += verdicts.len();
            ok &= taken == 1 && verdicts.len() == taken && ran_on_b == resumed;
            let verdicts: Vec<&str> = verdicts.iter().map(|v| v.as_str()).collect();
            told.push(format!(
                "{key} {} -> B's handler ran x{ran_on_b}",
                verdicts.join("+")
            ));
        }
        self.checks.invariant(
            ok,
            format!(
                "no blind rerun: {takeovers} takeovers, {recoveries} recoveries; {}",
                told.join(", ")
            ),
        );

        // Every unknown settled, or in the manual queue.
        let unknown: Vec<&str> = events
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    ServerEventKind::Recovered {
                        verdict: RecoveryVerdict::Unknown,
                        ..
                    }
                )
            })
            .filter_map(ServerEvent::key)
            .collect();
        let settled: Vec<&str> = events
            .iter()
            .filter(|e| matches!(e.kind, ServerEventKind::Settled { .. }))
            .filter_map(ServerEvent::key)
            .collect();
        let queued: Vec<&str> = self.manual.iter().map(|u| u.key.key().as_str()).collect();
        self.checks.invariant(
            !unknown.is_empty()
                && unknown
                    .iter()
                    .all(|k| settled.contains(k) || queued.contains(k)),
            format!(
                "every unknown settled or in the manual queue: {} unknown ({}), {} settled, {} in the manual queue{}",
                unknown.len(),
                unknown.join(", "),
                settled.len(),
                queued.len(),
                if queued.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", queued.join(", "))
                }
            ),
        );
    }
}

/// Runs the three acts over the stores `make` makes, one for each runtime; `store` is the
/// main runtime's.
fn story<St, F>(rt: &Runtime, describe: &str, make: F, store: St) -> Result<bool, BoxError>
where
    St: IdempotencyStore + Clone + Send + Sync + 'static,
    F: Fn() -> Result<St, BoxError>,
{
    println!("Mode: {describe}");
    println!(
        "Lease {}; the client: deadline {}, constant backoff {}, at most {MAX_ATTEMPTS} attempts, keys honoured by the server.",
        ms(LEASE),
        ms(DEADLINE),
        ms(BACKOFF)
    );
    println!();
    let started = std::time::Instant::now();
    let mut story = Story {
        rt,
        make,
        store,
        channel: Channel::default(),
        runs: Runs::default(),
        events: InMemoryRecorder::new(),
        records: InMemoryRecorder::new(),
        live: Arc::new(Mutex::new(Live {
            name: "none",
            addr: SocketAddr::from(([127, 0, 0, 1], 9)),
        })),
        checks: Checks::default(),
        manual: Vec::new(),
    };
    story.act_one()?;
    story.act_two()?;
    story.act_three()?;
    println!();
    println!(
        "{} calls recorded, {} charges, in {}.",
        story.records.calls().len(),
        story.channel.charges(),
        ms(started.elapsed())
    );
    story.invariants();
    Ok(story.checks.verdict())
}

// ----- the modes -----------------------------------------------------------------------------------

/// Where the records are kept: memory, or PostgreSQL at this URL.
enum Mode {
    Memory,
    Postgres(String),
}

fn mode() -> Result<Mode, BoxError> {
    let mut postgres = std::env::var("SURELY_POSTGRES_URL")
        .ok()
        .filter(|v| !v.is_empty());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--postgres" => postgres = Some(args.next().ok_or("--postgres needs a URL")?),
            other => {
                return Err(format!(
                    "unknown argument {other:?} (expected --postgres URL, or none)"
                )
                .into())
            }
        }
    }
    Ok(postgres.map_or(Mode::Memory, Mode::Postgres))
}

fn memory(rt: &Runtime) -> Result<bool, BoxError> {
    let store = MemoryStore::new();
    let shared = store.clone();
    story(
        rt,
        "memory: one MemoryStore, cloned to both instances (clones share their records)",
        move || Ok(shared.clone()),
        store,
    )
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &Runtime, _: &str) -> Result<bool, BoxError> {
    Err(
        "a PostgreSQL URL was given, but this build lacks the cargo feature `postgres`: run \
         `cargo run --release --features postgres --example takeover` (or `--all-features`)"
            .into(),
    )
}

#[cfg(feature = "postgres")]
fn postgres(rt: &Runtime, url: &str) -> Result<bool, BoxError> {
    use std::time::{SystemTime, UNIX_EPOCH};
    use surely::server::store::PostgresStore;

    /// How long the first contact with PostgreSQL may take.
    const CONNECT: Duration = Duration::from_secs(5);

    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.subsec_nanos();
    let table = format!("surely_takeover_{}_{nanos}", std::process::id());
    let make = {
        let (url, table) = (url.to_owned(), table.clone());
        move || -> Result<PostgresStore, BoxError> {
            Ok(PostgresStore::connect(&url)?.with_table(&table)?)
        }
    };
    let store = make()?;
    rt.block_on(async {
        tokio::time::timeout(CONNECT, store.migrate())
            .await
            .map_err(|_| format!("PostgreSQL at {url} did not answer within {}", ms(CONNECT)))?
            .map_err(|e| format!("PostgreSQL at {url} did not answer: {}", chain(&e)))
    })?;
    let describe = format!(
        "PostgreSQL at {url}: a PostgresStore with a pool of its own per runtime, table {table}"
    );
    let ran = story(rt, &describe, make, store.clone());
    // The table and its migration records go, whatever the story came to.
    let cleaned = rt.block_on(async {
        let client = store.pool().get().await?;
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table}; DROP FUNCTION IF EXISTS {table}_acquire"
            ))
            .await?;
        client
            .execute("DELETE FROM surely_migrations WHERE target = $1", &[&table])
            .await?;
        Ok::<_, BoxError>(())
    });
    match cleaned {
        Ok(()) => eprintln!("takeover: dropped the table {table} and its migration records"),
        Err(e) => eprintln!("takeover: could not drop the table {table}: {}", chain(&*e)),
    }
    ran
}

fn run() -> Result<bool, BoxError> {
    let mode = mode()?;
    // The main runtime: instance B, the balancer and the client. Instance A gets its own.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    match mode {
        Mode::Memory => memory(&rt),
        Mode::Postgres(url) => postgres(&rt, &url),
    }
}

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("takeover: {}", chain(&*e));
            std::process::exit(1);
        }
    }
}
