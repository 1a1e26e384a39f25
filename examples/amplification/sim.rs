//! The simulation core of the retry-amplification simulator, shared by the example
//! (`examples/amplification/main.rs`) and its test (`tests/models/amplification.rs`).
//!
//! A chain of `layers` retry layers, each in front of an in-process service built from
//! `tower::Service`s over `http::Request<()>` / `http::Response<()>`, so that headers travel
//! between hops as they would on the wire:
//!
//! ```text
//! caller → retry₁ → [ServerDeadlineLayer → handler₁] → retry₂ → … → retryₙ → bottom
//! ```
//!
//! Each handler sends a fresh `GET /` through the next hop's retry layer and answers 200 if that
//! succeeded and 503 otherwise; the bottom service fails per the [`Failure`] model with a 503
//! (no `Retry-After`) to a `GET`: a *maybe committed* failure of a *safe* request, which every
//! strategy retries, so the comparison is about amplification and not about classification.
//! Time is tokio's paused clock on a current-thread runtime, and every random draw comes from a
//! seeded generator, so a run is deterministic.

#[path = "../support/splitmix.rs"]
mod splitmix;

use std::convert::Infallible;
use std::fmt;
use std::future::{ready, Ready};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use splitmix::SplitMix;
use surely::budget::{RatioBudget, RetryBudget, TokenBucket};
use surely::retry::backoff::{Backoff, Jitter};
use surely::retry::RetryLayer;
use surely::server::deadline::ServerDeadlineLayer;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::retry::budget::{Budget, TpsBudget};
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};

/// A request, as every hop sees it.
pub(crate) type Req = Request<()>;
/// A response, as every hop sees it.
pub(crate) type Res = Response<()>;

/// A hop as its caller sees it: a server (or the bottom service). It never errs; failures are
/// statuses, as on the wire.
type Wire = BoxCloneService<Req, Res, io::Error>;
/// A hop's client stack: a retry strategy in front of a [`Wire`].
type Client = BoxCloneService<Req, Res, BoxError>;

/// The attempt limit of every strategy, the first attempt included.
pub(crate) const MAX_ATTEMPTS: u32 = 3;

/// A retry strategy, used by every layer of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// 3 attempts per layer, no budget, no backoff, no owner marker.
    Naive,
    /// tower's `Retry` with `TpsBudget::default()` (20% + 10/s over 10 s), 3 attempts, no
    /// backoff.
    TowerTps,
    /// `RetryLayer::new()`'s settings at every layer, the retry-owner marker on.
    SurelyDefault,
    /// `RetryLayer` with a default `RatioBudget`, without the owner marker.
    SurelyRatio,
    /// `RetryLayer` with a default `TokenBucket` (gRPC's 10 tokens, 0.1 per success), without
    /// the owner marker.
    SurelyBucket,
}

impl Strategy {
    /// Every strategy, in the order of the output.
    pub(crate) const ALL: [Strategy; 5] = [
        Strategy::Naive,
        Strategy::TowerTps,
        Strategy::SurelyDefault,
        Strategy::SurelyRatio,
        Strategy::SurelyBucket,
    ];

    /// The name in the output.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Strategy::Naive => "naive",
            Strategy::TowerTps => "tower-tps",
            Strategy::SurelyDefault => "surely-default",
            Strategy::SurelyRatio => "surely-ratio",
            Strategy::SurelyBucket => "surely-bucket",
        }
    }
}

/// How the bottom service fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// Every call fails.
    Always,
    /// Each call fails with probability 1%, independently (seeded).
    OnePercent,
    /// The bottom service serves at most its capacity (a token bucket refilled at `capacity`
    /// requests a second, holding at most a tenth of a second's worth) and fails the rest; the
    /// offered top-level load is 1.2 × capacity.
    Overload,
}

impl Failure {
    /// Every model, in the order of the output.
    pub(crate) const ALL: [Failure; 3] = [Failure::Always, Failure::OnePercent, Failure::Overload];

    /// The `failure` column: the failure probability, or `overload`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Failure::Always => "1.0",
            Failure::OnePercent => "0.01",
            Failure::Overload => "overload",
        }
    }
}

/// The offered load of the overload model, as a multiple of the bottom service's capacity.
pub(crate) const OVERLOAD_FACTOR: f64 = 1.2;

/// The settings of a run.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    /// Top-level calls per cell.
    pub(crate) calls: u64,
    /// Top-level calls per simulated second (Poisson arrivals).
    pub(crate) rate: f64,
    /// The seed of every random draw: arrivals, failures, jitter.
    pub(crate) seed: u64,
    /// How long the bottom service takes to answer, success or failure.
    pub(crate) latency: Duration,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            calls: 8_000,
            rate: 400.0,
            seed: 6,
            latency: Duration::from_millis(5),
        }
    }
}

/// The result of one (strategy, layers, failure) cell.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cell {
    /// The strategy of every layer.
    pub(crate) strategy: Strategy,
    /// The number of retry layers in the chain.
    pub(crate) layers: usize,
    /// The failure model of the bottom service.
    pub(crate) failure: Failure,
    /// Top-level calls made.
    pub(crate) calls: u64,
    /// Calls that reached the bottom service.
    pub(crate) bottom_calls: u64,
    /// Top-level calls that succeeded.
    pub(crate) successes: u64,
    /// Simulated time from the first arrival to the last answer.
    pub(crate) elapsed: Duration,
}

impl Cell {
    /// Bottom-service calls per top-level call.
    pub(crate) fn amplification(&self) -> f64 {
        self.bottom_calls as f64 / self.calls.max(1) as f64
    }

    /// The share of top-level calls that succeeded.
    pub(crate) fn success_rate(&self) -> f64 {
        self.successes as f64 / self.calls.max(1) as f64
    }
}

/// The `--csv` output: the header `strategy,layers,failure,amplification,success_rate`, then
/// one row per cell.
pub(crate) fn csv(cells: &[Cell]) -> String {
    let mut out = String::from("strategy,layers,failure,amplification,success_rate\n");
    for c in cells {
        out.push_str(&format!(
            "{},{},{},{:.4},{:.4}\n",
            c.strategy.name(),
            c.layers,
            c.failure.label(),
            c.amplification(),
            c.success_rate()
        ));
    }
    out
}

/// Runs one cell on a fresh current-thread runtime with paused time.
///
/// # Errors
///
/// If the runtime cannot be built.
pub(crate) fn run_cell(
    strategy: Strategy,
    layers: usize,
    failure: Failure,
    params: &Params,
) -> io::Result<Cell> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    Ok(runtime.block_on(simulate(strategy, layers, failure, params)))
}

async fn simulate(strategy: Strategy, layers: usize, failure: Failure, params: &Params) -> Cell {
    let bottom_calls = Arc::new(AtomicU64::new(0));
    let bottom = bottom(failure, params, bottom_calls.clone());
    let top = chain(strategy, layers.max(1), bottom, params.seed);

    let mut arrivals = SplitMix::new(params.seed ^ 0xA441_7A1F);
    let start = Instant::now();
    let mut at = 0.0_f64;
    let successes = Arc::new(AtomicU64::new(0));
    let mut calls = JoinSet::new();
    for _ in 0..params.calls {
        at += arrivals.exponential() / params.rate;
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        let mut top = top.clone();
        let successes = successes.clone();
        calls.spawn(async move {
            let ok = match top.ready().await {
                Ok(svc) => {
                    matches!(svc.call(Request::new(())).await, Ok(res) if res.status().is_success())
                }
                Err(_) => false,
            };
            if ok {
                successes.fetch_add(1, Ordering::SeqCst);
            }
        });
        // Keep the set small: drop what has finished.
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
    let successes = successes.load(Ordering::SeqCst);
    Cell {
        strategy,
        layers: layers.max(1),
        failure,
        calls: params.calls,
        bottom_calls: bottom_calls.load(Ordering::SeqCst),
        successes,
        elapsed: start.elapsed(),
    }
}

/// Builds the chain of `layers` retry layers over `bottom`, returning the top client.
fn chain(strategy: Strategy, layers: usize, bottom: Wire, seed: u64) -> Client {
    let mut wire = bottom;
    let mut hop = layers;
    loop {
        let client = client(strategy, hop, wire, seed);
        if hop == 1 {
            return client;
        }
        wire = server(client);
        hop -= 1;
    }
}

/// A hop's server: the deadline server layer (which carries the retry-owner marker into the
/// handler's context) around a handler that calls the next hop through `client`.
fn server(client: Client) -> Wire {
    let handler = service_fn(move |_req: Req| {
        let mut client = client.clone();
        async move {
            let ok = match client.ready().await {
                Ok(svc) => {
                    matches!(svc.call(Request::new(())).await, Ok(res) if res.status().is_success())
                }
                Err(_) => false,
            };
            Ok::<_, Infallible>(status(if ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            }))
        }
    });
    // Every hop of the chain is one of our own services: each trusts its caller's retry marker.
    let server = ServerDeadlineLayer::builder()
        .trust_retry_signals(|_: &dyn surely::Envelope| true)
        .build()
        .expect("a valid server deadline layer")
        .layer(handler)
        // The simulation's bodies are `()`: the layer's own answers are none of its business.
        .map_response(|res| res.map(|_| ()))
        .map_err(|never: Infallible| match never {});
    BoxCloneService::new(server)
}

fn status(status: StatusCode) -> Res {
    let mut res = Response::new(());
    *res.status_mut() = status;
    res
}

/// The bottom service: counts its calls, fails per `failure`, answers after the latency.
fn bottom(failure: Failure, params: &Params, calls: Arc<AtomicU64>) -> Wire {
    let fails = Arc::new(Mutex::new(Fails::new(failure, params)));
    let latency = params.latency;
    BoxCloneService::new(service_fn(move |_req: Req| {
        calls.fetch_add(1, Ordering::SeqCst);
        let fail = fails
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .next(Instant::now());
        async move {
            tokio::time::sleep(latency).await;
            Ok::<_, io::Error>(status(if fail {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            }))
        }
    }))
}

/// Whether the next bottom call fails.
enum Fails {
    Always,
    Random(SplitMix, f64),
    Capacity {
        per_sec: f64,
        burst: f64,
        tokens: f64,
        last: Instant,
    },
}

impl Fails {
    fn new(failure: Failure, params: &Params) -> Self {
        match failure {
            Failure::Always => Fails::Always,
            Failure::OnePercent => Fails::Random(SplitMix::new(params.seed ^ 0xFA11), 0.01),
            Failure::Overload => {
                let per_sec = params.rate / OVERLOAD_FACTOR;
                let burst = (per_sec / 10.0).max(1.0);
                Fails::Capacity {
                    per_sec,
                    burst,
                    tokens: burst,
                    last: Instant::now(),
                }
            }
        }
    }

    fn next(&mut self, now: Instant) -> bool {
        match self {
            Fails::Always => true,
            Fails::Random(rng, p) => rng.unit() < *p,
            Fails::Capacity {
                per_sec,
                burst,
                tokens,
                last,
            } => {
                let refill = now.saturating_duration_since(*last).as_secs_f64() * *per_sec;
                *tokens = (*tokens + refill).min(*burst);
                *last = now;
                if *tokens >= 1.0 {
                    *tokens -= 1.0;
                    false
                } else {
                    true
                }
            }
        }
    }
}

/// Hop `hop`'s client stack: `strategy` in front of `inner`. Each hop has its own budget,
/// shared by every call through it.
fn client(strategy: Strategy, hop: usize, inner: Wire, seed: u64) -> Client {
    match strategy {
        Strategy::Naive => {
            let layer = RetryLayer::builder()
                .max_attempts(MAX_ATTEMPTS)
                .backoff(Backoff::none())
                .no_budget()
                .mark_owner(false);
            match layer.build() {
                Ok(layer) => BoxCloneService::new(layer.layer(inner).map_err(BoxError::from)),
                Err(e) => failing(e.to_string()),
            }
        }
        Strategy::TowerTps => {
            let policy = TpsPolicy {
                budget: Arc::new(TpsBudget::default()),
                attempts: 1,
                deposited: false,
            };
            BoxCloneService::new(tower::retry::Retry::new(policy, inner).map_err(BoxError::from))
        }
        Strategy::SurelyDefault => {
            let budget = Arc::new(RatioBudget::default());
            per_call(hop, inner, seed, move |seed| {
                surely_default(budget.clone(), seed)
            })
        }
        Strategy::SurelyRatio | Strategy::SurelyBucket => {
            let budget: Arc<dyn RetryBudget> = if strategy == Strategy::SurelyRatio {
                Arc::new(RatioBudget::default())
            } else {
                Arc::new(TokenBucket::default())
            };
            per_call(hop, inner, seed, move |seed| {
                RetryLayer::builder()
                    .budget(budget.clone())
                    .backoff(default_backoff(seed))
                    .mark_owner(false)
                    .build()
            })
        }
    }
}

/// The `surely-default` strategy: `RetryLayer::new()`'s settings (3 attempts, a default
/// `RatioBudget`, exponential backoff from 100 ms with full jitter capped at 20 s, pushback up to
/// 30 s, the retry-owner marker on), with two differences a simulation needs: the budget is
/// passed in (one per hop, as `new()` makes one per layer) and the jitter is seeded.
///
/// The one place to switch to the crate's one-call client builder.
pub(crate) fn surely_default(
    budget: Arc<RatioBudget>,
    seed: u64,
) -> Result<RetryLayer, surely::ConfigError> {
    RetryLayer::builder()
        .budget(budget)
        .backoff(default_backoff(seed))
        .build()
}

/// `RetryLayer::new()`'s backoff (100 ms, doubling, full jitter, capped at 20 s), seeded.
fn default_backoff(seed: u64) -> Backoff {
    Backoff::exponential(Duration::from_millis(100))
        .jitter(Jitter::Full)
        .seed(seed)
        .build()
        .unwrap_or_else(|_| Backoff::constant(Duration::from_millis(100)))
}

/// A client that builds `make(seed)` for each call, around a clone of `inner`: a seeded
/// `Backoff` replays one sequence for every call, so each call gets a layer with its own seed
/// (and the hop's shared budget), like an unseeded `Backoff`'s distinct streams, but repeatable.
fn per_call<F>(hop: usize, inner: Wire, seed: u64, make: F) -> Client
where
    F: Fn(u64) -> Result<RetryLayer, surely::ConfigError> + Send + Sync + 'static,
{
    let counter = Arc::new(AtomicU64::new(0));
    let make = Arc::new(make);
    let hop_seed = SplitMix::new(seed ^ ((hop as u64) << 40)).next_u64();
    BoxCloneService::new(service_fn(move |req: Req| {
        let n = counter.fetch_add(1, Ordering::Relaxed);
        let layer = make(SplitMix::new(hop_seed ^ n).next_u64());
        let inner = inner.clone();
        async move {
            let mut svc = layer.map_err(BoxError::from)?.layer(inner);
            let res = svc.ready().await?.call(req).await?;
            Ok::<_, BoxError>(res)
        }
    }))
}

/// A client that refuses every call with `message` (an invalid configuration).
fn failing(message: String) -> Client {
    BoxCloneService::new(service_fn(move |_req: Req| {
        ready(Err::<Res, BoxError>(BoxError::from(message.clone())))
    }))
}

/// The `tower-tps` policy: retry a 5xx or an error, at most [`MAX_ATTEMPTS`] attempts, while
/// the budget allows. It deposits once per logical call (when its first attempt ends), as
/// Finagle does and as `TpsBudget`'s `retry_percent` ("of calls") means. Cloned per call by
/// tower's `Retry`, so `attempts` and `deposited` are per call.
#[derive(Clone)]
struct TpsPolicy {
    budget: Arc<TpsBudget>,
    attempts: u32,
    deposited: bool,
}

impl tower::retry::Policy<Req, Res, io::Error> for TpsPolicy {
    type Future = Ready<()>;

    fn retry(&mut self, _req: &mut Req, result: &mut Result<Res, io::Error>) -> Option<Ready<()>> {
        if !self.deposited {
            self.deposited = true;
            self.budget.deposit();
        }
        let failed = match result {
            Ok(res) => res.status().is_server_error(),
            Err(_) => true,
        };
        if !failed || self.attempts >= MAX_ATTEMPTS || !self.budget.withdraw() {
            return None;
        }
        self.attempts += 1;
        Some(ready(()))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

impl fmt::Debug for TpsPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TpsPolicy")
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}
