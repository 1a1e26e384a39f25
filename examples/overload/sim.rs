//! The simulation core of the overload-and-recovery simulator, shared by the example
//! (`examples/overload/main.rs`) and its test (`tests/models/overload.rs`).
//!
//! ```text
//! Poisson arrivals → client stack (strategy) → "network" (a task of its own)
//!     → ServerDeadlineLayer → [AdaptiveLimitLayer] → handler → FIFO queue → N workers
//! ```
//!
//! * **The downstream** has `workers` workers taking jobs from one FIFO queue; a job costs a
//!   service time drawn around the scenario's current mean. A job whose caller has given up
//!   is **still served**: nothing tells a worker that the caller went away. The one exception
//!   is the propagated deadline: when the request carried one (the client wrote
//!   `x-request-timeout-ms`, and [`ServerDeadlineLayer`] turned it into a [`Deadline`] in the
//!   request's extensions), a worker that dequeues a job that can no longer finish in time
//!   ([`can_finish`]) drops it at once, without spending service time: what a handler does
//!   when its own calls inherit the spent deadline and refuse to start. Without propagation
//!   the server cannot tell.
//! * **The server's limit** (strategy `surely-limit` only): an [`AdaptiveLimitLayer`] with its
//!   default settings in front of the handler. It bounds the jobs queued or in service, learns
//!   the bound from their latency, and refuses the rest at once (`503`, `Retry-After: 1`,
//!   not processed), which the client stack retries within its budget.
//! * **The network** is a task per attempt: the server runs outside the caller's task, so
//!   it sees only what travels in headers (served in-process, `ServerDeadlineLayer` would read
//!   the caller's deadline from the task-local context, and every strategy would propagate).
//! * **The callers** offer an open-loop load: Poisson arrivals at `load` × the normal capacity,
//!   whatever happens to earlier calls. Each call is a `GET` (safe: every strategy may retry
//!   it) through a real client stack: tower's `Retry` and `Timeout` for `naive` and
//!   `tower-tps`, `surely::client()` for the `surely-*` strategies.
//! * **Time** is tokio's paused clock on a current-thread runtime, and every random draw comes
//!   from a seeded generator: a run is deterministic.

#[path = "../support/splitmix.rs"]
mod splitmix;

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::future::{ready, Ready};
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use splitmix::SplitMix;
use surely::breaker::CircuitBreaker;
use surely::budget::{RatioBudget, RetryBudget};
use surely::deadline::Deadline;
use surely::retry::backoff::{Backoff, Jitter};
use surely::server::deadline::{can_finish, ServerDeadlineLayer};
use surely::server::limit::AdaptiveLimitLayer;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower::retry::budget::{Budget, TpsBudget};
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};

/// A request, as the downstream sees it.
pub(crate) type Req = Request<()>;
/// A response, as the downstream sees it.
pub(crate) type Res = Response<()>;

/// The downstream as its callers see it; failures are statuses, as on the wire.
type Wire = BoxCloneService<Req, Res, io::Error>;
/// A caller's client stack.
type Client = BoxCloneService<Req, Res, BoxError>;

/// The header that tells the downstream which logical call an attempt belongs to, so that it
/// can tell first attempts from retries whatever the strategy.
const CALL_ID: &str = "x-sim-call";

/// The attempt limit of every retrying strategy, the first attempt included.
pub(crate) const MAX_ATTEMPTS: u32 = 3;
/// The per-attempt timeout of `naive` and `tower-tps`.
pub(crate) const PER_TRY: Duration = Duration::from_secs(1);
/// How long a caller waits in all: the timeout of `none`, the total budget of `surely-*`.
pub(crate) const PATIENCE: Duration = Duration::from_secs(2);
/// How many client stacks the `surely-*` callers spread their calls over (sharing one breaker
/// and one budget): a seeded `Backoff` replays one jitter sequence for every call of a stack,
/// so each stack gets its own seed.
const STACKS: u64 = 64;
/// The steady state before the trigger.
pub(crate) const WARMUP: Duration = Duration::from_secs(20);
/// How long the simulation keeps offering load after the trigger ends.
pub(crate) const AFTER: Duration = Duration::from_secs(60);
/// The success rate a 1 s bucket needs to count as recovered.
pub(crate) const RECOVERED: f64 = 0.99;
/// The window after the trigger in which the load spike is measured.
pub(crate) const SPIKE_WINDOW: usize = 5;

/// A client strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Strategy {
    /// One attempt, a 2 s timeout (tower `Timeout`).
    None,
    /// tower `Retry`, 3 attempts of at most 1 s each, no budget, no backoff.
    Naive,
    /// tower `Retry` + `TpsBudget::default()`, 3 attempts of at most 1 s, no backoff.
    TowerTps,
    /// `surely::client()` with a 2 s total budget and every other default.
    SurelyDefault,
    /// `surely-default` without the deadline on the wire.
    SurelyNoDeadline,
    /// `surely-default` without the circuit breaker.
    SurelyNoBreaker,
    /// `surely-default`, and the server's adaptive limit in front of the downstream.
    SurelyLimit,
}

impl Strategy {
    /// The strategy named `name`.
    pub(crate) fn from_name(name: &str) -> Option<Strategy> {
        Strategy::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Every strategy, in the order of the output.
    pub(crate) const ALL: [Strategy; 7] = [
        Strategy::None,
        Strategy::Naive,
        Strategy::TowerTps,
        Strategy::SurelyDefault,
        Strategy::SurelyNoDeadline,
        Strategy::SurelyNoBreaker,
        Strategy::SurelyLimit,
    ];

    /// The name in the output.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Strategy::None => "none",
            Strategy::Naive => "naive",
            Strategy::TowerTps => "tower-tps",
            Strategy::SurelyDefault => "surely-default",
            Strategy::SurelyNoDeadline => "surely-no-deadline",
            Strategy::SurelyNoBreaker => "surely-no-breaker",
            Strategy::SurelyLimit => "surely-limit",
        }
    }
}

/// What happens to the downstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Scenario {
    /// Capacity drops by 20% (service times × 1.25) for 30 s, then returns.
    Drop20,
    /// Service times ramp up linearly to 1.5 × over 60 s (capacity down to two thirds), then
    /// return to normal.
    Ramp,
    /// For 10 s every request fails fast (503 at once, queued ones too), then recovery.
    Outage,
    /// The offered load is twice the capacity for 30 s, then back to normal.
    Surge2x,
    /// Service times double (capacity halves) for 30 s, then return.
    Slowdown,
}

impl Scenario {
    /// The scenario named `name`.
    pub(crate) fn from_name(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Every scenario, in the order of the output.
    pub(crate) const ALL: [Scenario; 5] = [
        Scenario::Drop20,
        Scenario::Ramp,
        Scenario::Outage,
        Scenario::Surge2x,
        Scenario::Slowdown,
    ];

    /// The name in the output.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::Drop20 => "drop20",
            Scenario::Ramp => "ramp",
            Scenario::Outage => "outage",
            Scenario::Surge2x => "surge2x",
            Scenario::Slowdown => "slowdown",
        }
    }

    /// How long the trigger lasts.
    pub(crate) fn duration(self) -> Duration {
        match self {
            Scenario::Drop20 => Duration::from_secs(30),
            Scenario::Ramp => Duration::from_secs(60),
            Scenario::Outage => Duration::from_secs(10),
            Scenario::Surge2x | Scenario::Slowdown => Duration::from_secs(30),
        }
    }

    /// The service-time multiplier `t` after the trigger started (negative: before it).
    fn slowdown(self, t: f64) -> f64 {
        let len = self.duration().as_secs_f64();
        if !(0.0..len).contains(&t) {
            return 1.0;
        }
        match self {
            Scenario::Drop20 => 1.25,
            Scenario::Ramp => 1.0 + 0.5 * t / len,
            Scenario::Slowdown => 2.0,
            Scenario::Outage | Scenario::Surge2x => 1.0,
        }
    }

    /// The offered load `t` after the trigger started, as a share of the normal capacity, when
    /// it is `load` outside the trigger.
    pub(crate) fn load(self, t: f64, load: f64) -> f64 {
        let during = (0.0..self.duration().as_secs_f64()).contains(&t);
        if self == Scenario::Surge2x && during {
            2.0
        } else {
            load
        }
    }

    /// Whether the downstream fails every request `t` after the trigger started.
    fn down(self, t: f64) -> bool {
        self == Scenario::Outage && (0.0..self.duration().as_secs_f64()).contains(&t)
    }

    /// The share of the normal capacity available `t` after the trigger started.
    pub(crate) fn capacity_share(self, t: f64) -> f64 {
        if self.down(t) {
            0.0
        } else {
            1.0 / self.slowdown(t)
        }
    }
}

/// The settings of a run.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Params {
    /// Workers of the downstream.
    pub(crate) workers: usize,
    /// The mean service time in normal operation.
    pub(crate) service: Duration,
    /// The offered load, as a share of the normal capacity.
    pub(crate) load: f64,
    /// The least budget a worker needs left to start a job that carries a propagated
    /// deadline: the counterpart, at dequeue, of `ServerDeadlineLayer`'s `min` at admission.
    /// About the 99th percentile of the service time.
    pub(crate) server_min: Duration,
    /// The seed of every random draw.
    pub(crate) seed: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            workers: 16,
            service: Duration::from_millis(40),
            load: 0.9,
            server_min: Duration::from_millis(100),
            seed: 18,
        }
    }
}

impl Params {
    /// Requests a second the downstream serves in normal operation.
    pub(crate) fn capacity(&self) -> f64 {
        self.workers as f64 / self.service.as_secs_f64()
    }

    /// First attempts offered a second.
    pub(crate) fn rate(&self) -> f64 {
        self.load * self.capacity()
    }
}

/// One second of a run. Arrivals and attempts are counted in the second they happen, calls in
/// the second they end.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Bucket {
    /// Logical calls started (first attempts offered).
    pub(crate) offered: u64,
    /// Attempts that reached the downstream.
    pub(crate) attempts: u64,
    /// Of those, attempts after the first of their call.
    pub(crate) retries: u64,
    /// Calls that ended.
    pub(crate) ended: u64,
    /// Calls that ended with a success (the goodput).
    pub(crate) successes: u64,
    /// Jobs served whose caller was no longer waiting.
    pub(crate) wasted: u64,
    /// Jobs dropped at dequeue because their propagated deadline had passed.
    pub(crate) dropped: u64,
    /// Jobs in the downstream's queue at the end of the second.
    pub(crate) queue: u64,
    /// The server's adaptive limit at the end of the second (0 without one).
    pub(crate) limit: u64,
    /// The 99th percentile of the latency of the calls that ended, in seconds.
    pub(crate) p99: f64,
    latencies: Vec<f64>,
    /// The server's latencies of the attempts it served (answered 200), from the moment
    /// each reached it, by the second they ended.
    served: Vec<f64>,
}

impl Bucket {
    /// The share of the calls that ended in this second that succeeded; 0 when none ended.
    pub(crate) fn success_rate(&self) -> f64 {
        if self.ended == 0 {
            0.0
        } else {
            self.successes as f64 / self.ended as f64
        }
    }
}

/// The summary of one (strategy, scenario) run.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Summary {
    /// The strategy.
    pub(crate) strategy: Strategy,
    /// The scenario.
    pub(crate) scenario: Scenario,
    /// The largest ratio, over 1 s buckets, of attempts reaching the downstream to first
    /// attempts offered.
    pub(crate) amplification_peak: f64,
    /// Successful calls during the trigger, as a share of what the downstream could serve then
    /// (its capacity, or the offered load when that is lower); `None` for the outage, when
    /// it can serve nothing.
    pub(crate) goodput_share: Option<f64>,
    /// Seconds from the end of the trigger to the first second from which every second until
    /// the end of the run has a success rate ≥ 99%; `None` when that never happens.
    pub(crate) recovery_s: Option<u64>,
    /// The largest load on the downstream (attempts a second) in the 5 s after the trigger
    /// ended, relative to the steady state before it.
    pub(crate) spike_after_recovery: f64,
    /// Retries that reached the downstream, as a share of the first attempts, over the run.
    pub(crate) retry_share: f64,
    /// The share of calls that succeeded over the run.
    pub(crate) success_rate: f64,
    /// Jobs served for callers who had given up, as a share of jobs served, over the run.
    pub(crate) wasted_share: f64,
    /// The 99th percentile of the server's latency for the work it accepted and served during
    /// the trigger, over the same in the steady state before it; `None` if it served nothing
    /// during the trigger.
    pub(crate) accepted_p99_ratio: Option<f64>,
}

impl Summary {
    /// Whether the run recovered within the 60 s after the trigger.
    pub(crate) fn recovered(&self) -> bool {
        self.recovery_s.is_some()
    }
}

/// The `--csv` header, exactly as issue 18 asks.
/// followed by issue 27's `accepted_p99_ratio`.
pub(crate) const CSV_HEADER: &str =
    "strategy,scenario,amplification_peak,goodput_share,recovery_s,recovered,spike_after_recovery,retry_share,accepted_p99_ratio";

/// The `--csv` output: [`CSV_HEADER`], then one row per summary.
pub(crate) fn csv(summaries: &[Summary]) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    for s in summaries {
        out.push_str(&format!(
            "{},{},{:.3},{},{},{},{:.3},{:.4},{}\n",
            s.strategy.name(),
            s.scenario.name(),
            s.amplification_peak,
            s.goodput_share.map_or(String::new(), |g| format!("{g:.3}")),
            s.recovery_s.map_or(String::new(), |r| r.to_string()),
            s.recovered(),
            s.spike_after_recovery,
            s.retry_share,
            s.accepted_p99_ratio
                .map_or(String::new(), |r| format!("{r:.3}")),
        ));
    }
    out
}

/// A whole run: its buckets, from the first arrival.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Run {
    /// The strategy.
    pub(crate) strategy: Strategy,
    /// The scenario.
    pub(crate) scenario: Scenario,
    /// The settings.
    pub(crate) params: Params,
    /// One per second, from the start of the run to the end of the last call.
    pub(crate) buckets: Vec<Bucket>,
}

impl Run {
    /// The second the trigger starts.
    pub(crate) fn trigger_start(&self) -> usize {
        WARMUP.as_secs() as usize
    }

    /// The second the trigger ends.
    pub(crate) fn trigger_end(&self) -> usize {
        self.trigger_start() + self.scenario.duration().as_secs() as usize
    }

    /// The second the arrivals stop.
    pub(crate) fn end(&self) -> usize {
        self.trigger_end() + AFTER.as_secs() as usize
    }

    fn bucket(&self, i: usize) -> Bucket {
        self.buckets.get(i).cloned().unwrap_or_default()
    }

    /// Attempts a second on the downstream in the steady state (the warm-up's second half).
    pub(crate) fn steady_load(&self) -> f64 {
        let from = self.trigger_start() / 2;
        let to = self.trigger_start();
        let sum: u64 = (from..to).map(|i| self.bucket(i).attempts).sum();
        sum as f64 / (to - from).max(1) as f64
    }

    /// The summary.
    pub(crate) fn summary(&self) -> Summary {
        let (start, end, stop) = (self.trigger_start(), self.trigger_end(), self.end());
        let amplification_peak = (0..stop)
            .map(|i| self.bucket(i))
            .filter(|b| b.offered > 0)
            .map(|b| b.attempts as f64 / b.offered as f64)
            .fold(0.0, f64::max);
        let mut available = 0.0;
        let mut good = 0u64;
        for i in start..end {
            let t = (i - start) as f64 + 0.5;
            let capacity = self.params.capacity() * self.scenario.capacity_share(t);
            available += capacity.min(self.bucket(i).offered as f64);
            good += self.bucket(i).successes;
        }
        let goodput_share = (available > 0.0).then(|| good as f64 / available);
        let mut recovery_s = None;
        for from in (end..stop).rev() {
            if self.bucket(from).success_rate() >= RECOVERED {
                recovery_s = Some((from - end) as u64);
            } else {
                break;
            }
        }
        let steady = self.steady_load().max(1.0);
        let spike_after_recovery = (end..end + SPIKE_WINDOW)
            .map(|i| self.bucket(i).attempts as f64 / steady)
            .fold(0.0, f64::max);
        let served = |from: usize, to: usize| {
            let mut all: Vec<f64> = (from..to.min(self.buckets.len()))
                .flat_map(|i| self.buckets[i].served.iter().copied())
                .collect();
            (!all.is_empty()).then(|| percentile(&mut all, 0.99))
        };
        let accepted_p99_ratio = served(start, end)
            .zip(served(start / 2, start))
            .map(|(during, steady)| during / steady.max(1e-9));
        let total = |f: fn(&Bucket) -> u64| self.buckets.iter().map(f).sum::<u64>();
        let offered = total(|b| b.offered).max(1);
        let served_total = total(|b| b.attempts).max(1);
        Summary {
            strategy: self.strategy,
            scenario: self.scenario,
            amplification_peak,
            goodput_share,
            recovery_s,
            spike_after_recovery,
            retry_share: total(|b| b.retries) as f64 / offered as f64,
            success_rate: total(|b| b.successes) as f64 / offered as f64,
            wasted_share: total(|b| b.wasted) as f64 / served_total as f64,
            accepted_p99_ratio,
        }
    }
}

impl Run {
    /// One line per second: the time series behind the summary.
    pub(crate) fn series(&self) -> String {
        let mut out = String::from(
            "second,offered,attempts,retries,queue,ended,goodput,success_rate,p99_s,dropped,wasted,limit\n",
        );
        for (i, b) in self.buckets.iter().enumerate() {
            out.push_str(&format!(
                "{i},{},{},{},{},{},{},{:.3},{:.3},{},{},{}\n",
                b.offered,
                b.attempts,
                b.retries,
                b.queue,
                b.ended,
                b.successes,
                b.success_rate(),
                b.p99,
                b.dropped,
                b.wasted,
                b.limit
            ));
        }
        out
    }
}

/// Runs one (strategy, scenario) on a fresh current-thread runtime with paused time.
///
/// # Errors
///
/// If the runtime cannot be built, or a client stack's configuration is refused.
pub(crate) fn run(strategy: Strategy, scenario: Scenario, params: &Params) -> io::Result<Run> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()?;
    runtime.block_on(simulate(strategy, scenario, params))
}

/// What the run observes, shared by the callers, the network and the workers.
struct Metrics {
    start: Instant,
    buckets: Vec<Bucket>,
    /// Attempts seen per logical call.
    seen: HashMap<u64, u32>,
}

impl Metrics {
    fn at(&mut self, now: Instant) -> &mut Bucket {
        let i = now.saturating_duration_since(self.start).as_secs() as usize;
        if self.buckets.len() <= i {
            self.buckets.resize_with(i + 1, Bucket::default);
        }
        &mut self.buckets[i]
    }
}

type Shared = Arc<Mutex<Metrics>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn simulate(strategy: Strategy, scenario: Scenario, params: &Params) -> io::Result<Run> {
    let start = Instant::now();
    let metrics: Shared = Arc::new(Mutex::new(Metrics {
        start,
        buckets: Vec::new(),
        seen: HashMap::new(),
    }));
    let trigger = start + WARMUP;
    let downstream = Downstream::start(scenario, trigger, params, metrics.clone());
    let limit = (strategy == Strategy::SurelyLimit).then(AdaptiveLimitLayer::new);
    let clients = clients(
        strategy,
        network(downstream.clone(), metrics.clone(), limit.clone()),
        params.seed,
    )
    .map_err(|e| io::Error::other(e.to_string()))?;

    // The queue length at the end of every second.
    let sampler = {
        let (metrics, downstream) = (metrics.clone(), downstream.clone());
        let limit = limit.clone();
        tokio::spawn(async move {
            let mut tick = start;
            loop {
                tick += Duration::from_secs(1);
                tokio::time::sleep_until(tick).await;
                let queue = lock(&downstream.queue).len() as u64;
                let mut m = lock(&metrics);
                let b = m.at(tick - Duration::from_millis(1));
                b.queue = queue;
                b.limit = limit.as_ref().map_or(0, |l| u64::from(l.limit()));
            }
        })
    };

    let stop = WARMUP + scenario.duration() + AFTER;
    let mut arrivals = SplitMix::new(params.seed ^ 0xA441_7A1F);
    let mut at = 0.0_f64;
    let mut calls = JoinSet::new();
    for id in 0u64.. {
        let load = scenario.load(at - WARMUP.as_secs_f64(), params.load);
        at += arrivals.exponential() / (load * params.capacity());
        if at >= stop.as_secs_f64() {
            break;
        }
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        let mut client = clients[(id % clients.len() as u64) as usize].clone();
        let metrics = metrics.clone();
        calls.spawn(async move {
            let began = Instant::now();
            lock(&metrics).at(began).offered += 1;
            let req = Request::get("/")
                .header(CALL_ID, id)
                .body(())
                .expect("a valid request");
            let ok = match client.ready().await {
                Ok(svc) => matches!(svc.call(req).await, Ok(res) if res.status().is_success()),
                Err(_) => false,
            };
            let now = Instant::now();
            let mut m = lock(&metrics);
            let b = m.at(now);
            b.ended += 1;
            b.successes += u64::from(ok);
            b.latencies.push((now - began).as_secs_f64());
        });
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
    sampler.abort();

    let mut buckets = std::mem::take(&mut lock(&metrics).buckets);
    for b in &mut buckets {
        b.p99 = percentile(&mut b.latencies, 0.99);
        b.latencies = Vec::new();
    }
    Ok(Run {
        strategy,
        scenario,
        params: params.clone(),
        buckets,
    })
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let i = ((values.len() as f64 * p).ceil() as usize).clamp(1, values.len()) - 1;
    values[i]
}

/// A job in the downstream's queue.
struct Job {
    deadline: Option<Deadline>,
    reply: oneshot::Sender<StatusCode>,
}

/// The downstream: a FIFO queue and its workers.
#[derive(Clone)]
struct Downstream {
    queue: Arc<Mutex<VecDeque<Job>>>,
    ready: Arc<Notify>,
    scenario: Scenario,
    trigger: Instant,
}

impl Downstream {
    fn start(scenario: Scenario, trigger: Instant, params: &Params, metrics: Shared) -> Self {
        let this = Downstream {
            queue: Arc::new(Mutex::new(VecDeque::new())),
            ready: Arc::new(Notify::new()),
            scenario,
            trigger,
        };
        for w in 0..params.workers {
            let this = this.clone();
            let metrics = metrics.clone();
            let mut rng = SplitMix::new(params.seed ^ 0x5E4F ^ ((w as u64) << 32));
            let mean = params.service.as_secs_f64();
            let min = params.server_min;
            tokio::spawn(async move {
                loop {
                    let job = loop {
                        if let Some(job) = lock(&this.queue).pop_front() {
                            break job;
                        }
                        this.ready.notified().await;
                    };
                    let now = Instant::now();
                    if this.down(now) {
                        let _ = job.reply.send(StatusCode::SERVICE_UNAVAILABLE);
                        continue;
                    }
                    if !can_finish(job.deadline, min) {
                        lock(&metrics).at(now).dropped += 1;
                        let _ = job.reply.send(StatusCode::GATEWAY_TIMEOUT);
                        continue;
                    }
                    let t = this.since_trigger(now);
                    // Half the mean fixed, half exponential: mean `mean × slowdown`.
                    let service =
                        mean * this.scenario.slowdown(t) * (0.5 + 0.5 * rng.exponential());
                    tokio::time::sleep(Duration::from_secs_f64(service)).await;
                    if job.reply.send(StatusCode::OK).is_err() {
                        lock(&metrics).at(Instant::now()).wasted += 1;
                    }
                }
            });
        }
        this
    }

    fn since_trigger(&self, now: Instant) -> f64 {
        if now >= self.trigger {
            (now - self.trigger).as_secs_f64()
        } else {
            -(self.trigger - now).as_secs_f64()
        }
    }

    fn down(&self, now: Instant) -> bool {
        self.scenario.down(self.since_trigger(now))
    }

    /// The handler: a request enqueued as a job, answered when a worker is done with it.
    async fn handle(self, req: Req) -> StatusCode {
        if self.down(Instant::now()) {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        let (tx, rx) = oneshot::channel();
        lock(&self.queue).push_back(Job {
            deadline: req.extensions().get::<Deadline>().copied(),
            reply: tx,
        });
        self.ready.notify_one();
        rx.await.unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// The downstream as its callers reach it: each attempt is counted, then served on a task of
/// its own (so the server sees only the headers), behind the server deadline layer and, if
/// given, the adaptive limit.
fn network(downstream: Downstream, metrics: Shared, limit: Option<AdaptiveLimitLayer>) -> Wire {
    let handler = service_fn(move |req: Req| {
        let downstream = downstream.clone();
        async move {
            let mut res = Response::new(());
            *res.status_mut() = downstream.handle(req).await;
            if res.status() == StatusCode::GATEWAY_TIMEOUT {
                // Dropped at dequeue for its spent deadline: said as `ServerDeadlineLayer` says
                // it on arrival, so the caller knows the handler never ran, and why.
                res.headers_mut().insert(
                    surely::headers::NOT_PROCESSED,
                    http::HeaderValue::from_static("deadline"),
                );
            }
            Ok::<_, Infallible>(res)
        }
    });
    let server: BoxCloneService<Req, Res, Infallible> = match limit {
        // The simulation's bodies are `()`: the layers' own problem bodies are dropped.
        Some(limit) => BoxCloneService::new(
            ServerDeadlineLayer::new()
                .layer(limit.layer(handler))
                .map_response(|res| res.map(|_| ())),
        ),
        None => BoxCloneService::new(
            ServerDeadlineLayer::new()
                .layer(handler)
                .map_response(|res| res.map(|_| ())),
        ),
    };
    BoxCloneService::new(service_fn(move |req: Req| {
        let id = req
            .headers()
            .get(CALL_ID)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        {
            let mut m = lock(&metrics);
            let n = id.map_or(1, |id| {
                let n = m.seen.entry(id).or_insert(0);
                *n += 1;
                *n
            });
            let b = m.at(Instant::now());
            b.attempts += 1;
            b.retries += u64::from(n > 1);
        }
        // A caller that gives up closes its connection: the handler's future is dropped
        // (aborted), and the job it queued stays queued.
        let reached = Instant::now();
        let served = {
            let (server, metrics) = (server.clone(), metrics.clone());
            async move {
                let res = server.oneshot(req).await?;
                if res.status() == StatusCode::OK {
                    let now = Instant::now();
                    lock(&metrics)
                        .at(now)
                        .served
                        .push((now - reached).as_secs_f64());
                }
                Ok::<_, Infallible>(res)
            }
        };
        let mut exchange = Abort(tokio::spawn(served));
        async move {
            match (&mut exchange.0).await {
                Ok(Ok(res)) => Ok(res),
                Ok(Err(never)) => match never {},
                Err(e) => Err(io::Error::other(e)),
            }
        }
    }))
}

/// A task aborted when its handle is dropped.
struct Abort<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Abort<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The client stacks of `strategy` over `wire`: one for tower's strategies (cloned per call),
/// [`STACKS`] for surely's, which share one breaker and one retry budget (one client of one
/// dependency) and differ only in their backoff's seed.
fn clients(strategy: Strategy, wire: Wire, seed: u64) -> Result<Vec<Client>, surely::ConfigError> {
    let tower = |budget: Option<Arc<TpsBudget>>, attempts: u32, per_try: Duration| {
        let timeout = tower::timeout::Timeout::new(wire.clone(), per_try);
        let policy = Attempts {
            budget,
            attempts: 1,
            max: attempts,
            deposited: false,
        };
        vec![BoxCloneService::new(tower::retry::Retry::new(
            policy, timeout,
        ))]
    };
    Ok(match strategy {
        Strategy::None => tower(None, 1, PATIENCE),
        Strategy::Naive => tower(None, MAX_ATTEMPTS, PER_TRY),
        Strategy::TowerTps => tower(Some(Arc::new(TpsBudget::default())), MAX_ATTEMPTS, PER_TRY),
        Strategy::SurelyDefault
        | Strategy::SurelyNoDeadline
        | Strategy::SurelyNoBreaker
        | Strategy::SurelyLimit => {
            let budget: Arc<dyn RetryBudget> = Arc::new(RatioBudget::default());
            let breaker = CircuitBreaker::builder().seed(seed ^ 0xB4EA).build()?;
            let mut out = Vec::new();
            for n in 0..STACKS {
                let backoff = default_backoff(SplitMix::new(seed ^ (n << 20)).next_u64());
                let builder = surely::client()
                    .timeout(PATIENCE)
                    .budget(budget.clone())
                    .breaker(breaker.clone())
                    .retry(move |r| r.backoff(backoff));
                let builder = if strategy == Strategy::SurelyNoDeadline {
                    builder.deadline(|d| d.http_header(None))
                } else {
                    builder
                };
                out.push(if strategy == Strategy::SurelyNoBreaker {
                    BoxCloneService::new(
                        builder
                            .no_breaker()
                            .build(wire.clone())?
                            .map_err(BoxError::from),
                    )
                } else {
                    BoxCloneService::new(builder.build(wire.clone())?.map_err(BoxError::from))
                });
            }
            out
        }
    })
}

/// `RetryLayer::new()`'s backoff (100 ms, doubling, full jitter, capped at 20 s), seeded.
fn default_backoff(seed: u64) -> Backoff {
    Backoff::exponential(Duration::from_millis(100))
        .jitter(Jitter::Full)
        .seed(seed)
        .build()
        .unwrap_or_else(|_| Backoff::constant(Duration::from_millis(100)))
}

/// The tower policy of `none`, `naive` and `tower-tps`: retry an error (a timeout included)
/// or a 5xx, up to `max` attempts, while the budget (if any) allows. It deposits once per
/// logical call, as `TpsBudget`'s `retry_percent` ("of calls") means. Cloned per call by
/// tower's `Retry`.
#[derive(Clone)]
struct Attempts {
    budget: Option<Arc<TpsBudget>>,
    attempts: u32,
    max: u32,
    deposited: bool,
}

impl tower::retry::Policy<Req, Res, BoxError> for Attempts {
    type Future = Ready<()>;

    fn retry(&mut self, _req: &mut Req, result: &mut Result<Res, BoxError>) -> Option<Ready<()>> {
        if let (Some(budget), false) = (&self.budget, self.deposited) {
            self.deposited = true;
            budget.deposit();
        }
        let failed = match result {
            Ok(res) => res.status().is_server_error(),
            Err(_) => true,
        };
        if !failed || self.attempts >= self.max {
            return None;
        }
        if let Some(budget) = &self.budget
            && !budget.withdraw()
        {
            return None;
        }
        self.attempts += 1;
        Some(ready(()))
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        Some(req.clone())
    }
}

impl fmt::Debug for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempts")
            .field("attempts", &self.attempts)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}
