//! The client stack as a user assembles it, next to tower's and seatbelt's, all measured in the
//! same run, the same way (issue 32).
//!
//! `benches/overhead.rs` measures each layer over the bench's own types, each call awaited
//! straight in the measuring loop. A user's code differs in ways that move the figures: their
//! request type says what it is, the call is awaited inside a small `async fn` of theirs (a
//! method of their client wrapper, a handler), and seatbelt is used through its own API, not
//! through its tower adapter. This bench is that assembly:
//!
//! * the request is `Get(u64)`, a type of the bench's own whose [`Envelope`] says
//!   [`Semantics::Safe`] (a read); the response is `Page`;
//! * the inner service answers on its first poll (`std::future::ready`), with one of two
//!   errors: `…/small`, `std::io::Error` (one pointer wide, made from its kind, no allocation),
//!   or `…/large`, `FetchError`, a struct of the bench's own that keeps 64 bytes of detail
//!   inline;
//! * every call is awaited inside `get(&mut svc, n)`, an `async fn` that waits for readiness
//!   and awaits the call (for seatbelt, `fetch(&svc, n)`, which awaits `execute`); the loop
//!   awaits that, on a current-thread tokio runtime (time driver only), under criterion's
//!   `iter_custom`: one criterion iteration is one call.
//!
//! Groups (`family/shape`):
//!
//! * `ready/…`: the inner service answers every call at once;
//! * `fail_once/…`: it refuses each call's first attempt (even inner calls, counted per thread)
//!   and answers its retry;
//! * `deadline/…`: timeouts alone, the inner answering at once.
//!
//! Shapes (`…/shape`): `small` and `large` are inner functions that capture nothing, failing
//! with a small or a large error; the other three are inner services shaped like real
//! transports (`benches/shared/user.rs`), answering `Page` or `io::Error` from what they hold,
//! the same inner under every stack of a group (`ready` and `deadline` only):
//!
//! * `arc`: an `Arc` to shared state, read on every call, as hyper-util's client, tonic's
//!   `Channel` and reqwest's `Client` hold theirs; every retry layer clones it per call;
//! * `captured`: a flag captured by value, the answer depending on it;
//! * `hyper_sized`: an `Arc` and settings inline, as large as hyper-util's legacy client (the
//!   bench prints both sizes).
//!
//! Cases of `ready` and `fail_once`:
//!
//! * `bare`: the inner service alone, through `get` (both of its answers on `fail_once`);
//! * `tower_retry_tps_timeout`: tower's `Retry` over its `Timeout` (1 s), with a policy of the
//!   bench's own as a user writes one from tower's docs: every error retried, at most two
//!   retries, a `TpsBudget` (its default on `ready`; one retry per call, ratio 1.0, on
//!   `fail_once`), a clone of the request for each attempt;
//! * `seatbelt_retry_timeout`: seatbelt's `Retry` over its `Timeout` (1 s) through seatbelt's own
//!   API, as its crate docs show it: a `layered` stack of the two layers and an `Execute` around
//!   the inner function, `into_service()`, each call `execute(req).await`. Every error is
//!   retried, at most two retries, a clone of the request for each attempt, no wait between
//!   attempts. No budget (seatbelt has none);
//! * `seatbelt_retry_timeout_tower`: the same layers through seatbelt's tower adapter
//!   (`tower::ServiceBuilder`), as `benches/overhead.rs` builds them. Shown, no target: each of
//!   seatbelt's tower services boxes its future, which its own API does not;
//! * `surely_client`: `surely::client().no_breaker()` with a `classify::from_fn` classifier
//!   (every response a success, every error a failure at the phase the layer saw it: retried,
//!   since `Get` is safe), `Backoff::none()`, and a `RatioBudget` given as
//!   `Arc<dyn RetryBudget>` (its default on `ready`, ratio 1.0 on `fail_once`), made by `build`.
//!
//! Cases of `deadline`: `bare`; `tower_timeout` (1 s); `seatbelt_timeout` (1 s) through
//! seatbelt's own API; `seatbelt_timeout_tower`, the same through its tower adapter (shown);
//! `surely_deadline_attempt`: `SetDeadlineLayer` (1 s, `enforce_in_attempts`) →
//! `AttemptTimeoutLayer` (1 s).
//!
//! seatbelt's clock (tick's, on tokio) spawns the task that drives its timers, so the cases are
//! made inside the runtime.
//!
//! Before criterion starts the bench prints each case's future sizes (the call's future, and
//! the future of the caller's `async fn` around it) and its heap allocations per call (10 000
//! calls counted by a `stats_alloc` global allocator), in total and over `bare`. After
//! criterion it prints the median ns per call of each case, its ratios to the tower and the
//! seatbelt reference, then the targets, measured again paired (the case and its reference,
//! made afresh, take turns for 41 rounds of 5 ms a side; the median of the rounds' ratios, with
//! its interquartile range). The targets (issue 15's), on both shapes:
//!
//! * `surely_client` ≤ 0.6 × `tower_retry_tps_timeout` and ≤ 1.0 × `seatbelt_retry_timeout` on
//!   `ready`; ≤ 0.75 × `tower_retry_tps_timeout` on `fail_once`;
//! * `surely_deadline_attempt` ≤ 0.6 × `tower_timeout` and ≤ 1.0 × `seatbelt_timeout`;
//! * `surely_client` and `surely_deadline_attempt` add 0 allocations per call over `bare`.
//!
//! Run it with `cargo bench --bench assembly` (about two minutes); one family with e.g.
//! `cargo bench --bench assembly -- ready`. The machine is noisy: judge the paired ratios, from
//! more than one run. The user's code (types, inner services, the caller's `async fn`, the
//! stacks of tower and surely) is `benches/shared/user.rs`, which `benches/instructions` counts
//! the instructions of.

use std::alloc::System;
use std::fmt::Debug;
use std::hint::black_box;
use std::mem::size_of_val;
use std::time::{Duration, Instant};

use criterion::Criterion;
use layered::{Execute, Stack};
use seatbelt::{RecoveryInfo, ResilienceContext};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::runtime::Runtime;
use tower::timeout::Timeout;
use tower::{service_fn, Layer, Service, ServiceBuilder};

/// Counts every allocation of the process; the bench reads it around loops of calls.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Criterion's settings: short, for a 2-core machine.
const WARM_UP: Duration = Duration::from_secs(1);
const MEASUREMENT: Duration = Duration::from_secs(2);
const SAMPLE_SIZE: usize = 50;
/// Calls counted per case for allocations, after `ALLOC_WARM_UP` uncounted ones.
const ALLOC_CALLS: u64 = 10_000;
const ALLOC_WARM_UP: u64 = 100;
/// Paired rounds, and how long one side of a round runs.
const ROUNDS: usize = 41;
const ROUND_SIDE: Duration = Duration::from_millis(5);

const BARE: &str = "bare";
const TOWER_RETRY: &str = "tower_retry_tps_timeout";
const TOWER_TIMEOUT: &str = "tower_timeout";
const SEATBELT_RETRY: &str = "seatbelt_retry_timeout";
const SEATBELT_RETRY_TOWER: &str = "seatbelt_retry_timeout_tower";
const SEATBELT_TIMEOUT: &str = "seatbelt_timeout";
const SEATBELT_TIMEOUT_TOWER: &str = "seatbelt_timeout_tower";
const CLIENT: &str = "surely_client";
const DEADLINE_ATTEMPT: &str = "surely_deadline_attempt";

// ---- the user's code, shared with the instruction counts' crate --------------------------

#[path = "shared/user.rs"]
mod user;
use user::*;

// ---- seatbelt --------------------------------------------------------------------------------

/// How the user calls a seatbelt service through seatbelt's own API.
async fn fetch<S: layered::Service<Get>>(svc: &S, n: u64) -> S::Out {
    svc.execute(Get(n)).await
}

/// seatbelt's context, on tick's tokio clock (made inside the runtime).
fn seatbelt_ctx<S: Shape>() -> ResilienceContext<Get, Result<Page, S::Error>> {
    ResilienceContext::new(tick::Clock::new_tokio())
}

fn seatbelt_retry<S: Shape>(
    ctx: &ResilienceContext<Get, Result<Page, S::Error>>,
) -> seatbelt::retry::RetryLayer<Get, Result<Page, S::Error>> {
    seatbelt::retry::Retry::layer("retry", ctx)
        .clone_input()
        .recovery_with(|out: &Result<Page, S::Error>, _| match out {
            Ok(_) => RecoveryInfo::never(),
            Err(_) => RecoveryInfo::retry(),
        })
        .max_retry_attempts(RETRIES)
        .backoff(seatbelt::retry::Backoff::Constant)
        .base_delay(Duration::ZERO)
        .use_jitter(false)
}

fn seatbelt_timeout<S: Shape>(
    ctx: &ResilienceContext<Get, Result<Page, S::Error>>,
) -> seatbelt::timeout::TimeoutLayer<Get, Result<Page, S::Error>> {
    seatbelt::timeout::Timeout::layer("timeout", ctx)
        .timeout(LIMIT)
        .timeout_error(|_| S::timed_out())
}

// ---- driving them ---------------------------------------------------------------------------

/// A case behind one object-safe method, so that cases of different types fit in one list.
trait Drive {
    /// Makes `n` calls on `rt` and returns how long they took.
    fn run(&mut self, rt: &Runtime, n: u64) -> Duration;
    /// The size of the call's future, and of the caller's `async fn` future around it.
    fn sizes(&mut self) -> (usize, usize);
}

/// A tower service, called through `get`.
struct TowerSide<S>(S);

impl<S> Drive for TowerSide<S>
where
    S: Service<Get>,
    S::Error: Debug,
{
    fn run(&mut self, rt: &Runtime, n: u64) -> Duration {
        let svc = &mut self.0;
        rt.block_on(async {
            let start = Instant::now();
            for i in 0..n {
                black_box(get(svc, i).await.expect("every call succeeds"));
            }
            start.elapsed()
        })
    }

    fn sizes(&mut self) -> (usize, usize) {
        (size_of::<S::Future>(), size_of_val(&get(&mut self.0, 0)))
    }
}

/// A seatbelt service, called through `fetch`.
struct SeatbeltSide<S>(S);

impl<S, T, E: Debug> Drive for SeatbeltSide<S>
where
    S: layered::Service<Get, Out = Result<T, E>>,
{
    fn run(&mut self, rt: &Runtime, n: u64) -> Duration {
        let svc = &self.0;
        rt.block_on(async {
            let start = Instant::now();
            for i in 0..n {
                black_box(fetch(svc, i).await.expect("every call succeeds"));
            }
            start.elapsed()
        })
    }

    fn sizes(&mut self) -> (usize, usize) {
        let call = size_of_val(&self.0.execute(Get(0)));
        (call, size_of_val(&fetch(&self.0, 0)))
    }
}

fn tower_side<S>(svc: S) -> Box<dyn Drive>
where
    S: Service<Get> + 'static,
    S::Error: Debug,
{
    Box::new(TowerSide(svc))
}

fn seatbelt_side<S, T, E: Debug>(svc: S) -> Box<dyn Drive>
where
    S: layered::Service<Get, Out = Result<T, E>> + 'static,
{
    Box::new(SeatbeltSide(svc))
}

struct Case {
    group: &'static str,
    name: &'static str,
    make: fn() -> Box<dyn Drive>,
}

/// The cases of a `ready` (`$fail = false`) or `fail_once` (`$fail = true`) group over the
/// inner function `$inner`, its baseline `$bare`, and the shape `$shape`.
macro_rules! retry_group {
    ($group:literal, $shape:ty, $inner:ident, $bare:ident, $fail:literal) => {
        [
            Case {
                group: $group,
                name: BARE,
                make: || tower_side(service_fn($bare::<$shape>)),
            },
            Case {
                group: $group,
                name: TOWER_RETRY,
                make: || tower_side(tower_retry!(service_fn($inner::<$shape>), $fail)),
            },
            Case {
                group: $group,
                name: SEATBELT_RETRY,
                make: || {
                    let ctx = seatbelt_ctx::<$shape>();
                    let stack = (
                        seatbelt_retry::<$shape>(&ctx),
                        seatbelt_timeout::<$shape>(&ctx),
                        Execute::new($inner::<$shape>),
                    );
                    seatbelt_side(stack.into_service())
                },
            },
            Case {
                group: $group,
                name: SEATBELT_RETRY_TOWER,
                make: || {
                    let ctx = seatbelt_ctx::<$shape>();
                    let svc = ServiceBuilder::new()
                        .layer(seatbelt_retry::<$shape>(&ctx))
                        .layer(seatbelt_timeout::<$shape>(&ctx))
                        .service(service_fn($inner::<$shape>));
                    tower_side(svc)
                },
            },
            Case {
                group: $group,
                name: CLIENT,
                make: || {
                    tower_side(surely_client!(
                        service_fn($inner::<$shape>),
                        <$shape as Shape>::Error,
                        $fail
                    ))
                },
            },
        ]
    };
}

/// The cases of a `deadline` group over the shape `$shape`.
macro_rules! deadline_group {
    ($group:literal, $shape:ty) => {
        [
            Case {
                group: $group,
                name: BARE,
                make: || tower_side(service_fn(answer::<$shape>)),
            },
            Case {
                group: $group,
                name: TOWER_TIMEOUT,
                make: || tower_side(Timeout::new(service_fn(answer::<$shape>), LIMIT)),
            },
            Case {
                group: $group,
                name: SEATBELT_TIMEOUT,
                make: || {
                    let ctx = seatbelt_ctx::<$shape>();
                    let stack = (
                        seatbelt_timeout::<$shape>(&ctx),
                        Execute::new(answer::<$shape>),
                    );
                    seatbelt_side(stack.into_service())
                },
            },
            Case {
                group: $group,
                name: SEATBELT_TIMEOUT_TOWER,
                make: || {
                    let layer = seatbelt_timeout::<$shape>(&seatbelt_ctx::<$shape>());
                    tower_side(layer.layer(service_fn(answer::<$shape>)))
                },
            },
            Case {
                group: $group,
                name: DEADLINE_ATTEMPT,
                make: || tower_side(surely_deadline_attempt!(service_fn(answer::<$shape>))),
            },
        ]
    };
}

/// The cases of a `ready` group and of a `deadline` group over the inner service `$inner` (a
/// type of `benches/shared/user.rs` shaped like a real transport), the same inner under every
/// stack: bare, tower's, seatbelt's through its own API (`Execute` calls the inner by
/// reference, as a closure over the user's client does), surely's.
macro_rules! transport_groups {
    ($ready:literal, $deadline:literal, $inner:ty) => {
        [
            Case {
                group: $ready,
                name: BARE,
                make: || tower_side(<$inner>::new()),
            },
            Case {
                group: $ready,
                name: TOWER_RETRY,
                make: || tower_side(tower_retry!(<$inner>::new(), false)),
            },
            Case {
                group: $ready,
                name: SEATBELT_RETRY,
                make: || {
                    let ctx = seatbelt_ctx::<Small>();
                    let inner = <$inner>::new();
                    let stack = (
                        seatbelt_retry::<Small>(&ctx),
                        seatbelt_timeout::<Small>(&ctx),
                        Execute::new(move |req| inner.answer(req)),
                    );
                    seatbelt_side(stack.into_service())
                },
            },
            Case {
                group: $ready,
                name: CLIENT,
                make: || tower_side(surely_client!(<$inner>::new(), std::io::Error, false)),
            },
            Case {
                group: $deadline,
                name: BARE,
                make: || tower_side(<$inner>::new()),
            },
            Case {
                group: $deadline,
                name: TOWER_TIMEOUT,
                make: || tower_side(Timeout::new(<$inner>::new(), LIMIT)),
            },
            Case {
                group: $deadline,
                name: SEATBELT_TIMEOUT,
                make: || {
                    let ctx = seatbelt_ctx::<Small>();
                    let inner = <$inner>::new();
                    let stack = (
                        seatbelt_timeout::<Small>(&ctx),
                        Execute::new(move |req| inner.answer(req)),
                    );
                    seatbelt_side(stack.into_service())
                },
            },
            Case {
                group: $deadline,
                name: DEADLINE_ATTEMPT,
                make: || tower_side(surely_deadline_attempt!(<$inner>::new())),
            },
        ]
    };
}

fn cases() -> Vec<Case> {
    [
        retry_group!("ready/small", Small, answer, answer, false),
        retry_group!("ready/large", Large, answer, answer, false),
        retry_group!(
            "fail_once/small",
            Small,
            refuse_first,
            refuse_first_bare,
            true
        ),
        retry_group!(
            "fail_once/large",
            Large,
            refuse_first,
            refuse_first_bare,
            true
        ),
    ]
    .into_iter()
    .flatten()
    .chain(deadline_group!("deadline/small", Small))
    .chain(deadline_group!("deadline/large", Large))
    .chain(transport_groups!("ready/arc", "deadline/arc", ArcInner))
    .chain(transport_groups!(
        "ready/captured",
        "deadline/captured",
        CapturedInner
    ))
    .chain(transport_groups!(
        "ready/hyper_sized",
        "deadline/hyper_sized",
        HyperSizedInner
    ))
    .collect()
}

/// The targets: group, case, reference, the largest ratio allowed.
fn targets() -> Vec<(String, &'static str, &'static str, f64)> {
    ["small", "large", "arc", "captured", "hyper_sized"]
        .iter()
        .flat_map(|shape| {
            [
                (format!("ready/{shape}"), CLIENT, TOWER_RETRY, 0.6),
                (format!("ready/{shape}"), CLIENT, SEATBELT_RETRY, 1.0),
                (format!("fail_once/{shape}"), CLIENT, TOWER_RETRY, 0.75),
                (
                    format!("deadline/{shape}"),
                    DEADLINE_ATTEMPT,
                    TOWER_TIMEOUT,
                    0.6,
                ),
                (
                    format!("deadline/{shape}"),
                    DEADLINE_ATTEMPT,
                    SEATBELT_TIMEOUT,
                    1.0,
                ),
            ]
        })
        .collect()
}

fn position(cases: &[Case], group: &str, name: &str) -> Option<usize> {
    cases
        .iter()
        .position(|c| c.group == group && c.name == name)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n.is_multiple_of(2) {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    } else {
        values[n / 2]
    }
}

/// Each case's future sizes and allocations per call (total, and over its group's `bare`).
fn print_sizes_and_allocations(rt: &Runtime, cases: &[Case]) {
    let allocs: Vec<f64> = cases
        .iter()
        .map(|case| {
            let mut drive = (case.make)();
            drive.run(rt, ALLOC_WARM_UP);
            let region = Region::new(GLOBAL);
            drive.run(rt, ALLOC_CALLS);
            let change = region.change();
            (change.allocations + change.reallocations) as f64 / ALLOC_CALLS as f64
        })
        .collect();
    println!("future sizes (bytes) and heap allocations per call ({ALLOC_CALLS} calls)");
    println!(
        "{:<17} {:<30} {:>6} {:>7} {:>7} {:>10}",
        "group", "case", "call", "caller", "allocs", "over bare"
    );
    for (i, case) in cases.iter().enumerate() {
        let (call, caller) = (case.make)().sizes();
        let bare = position(cases, case.group, BARE).map_or(0.0, |b| allocs[b]);
        let added = allocs[i] - bare;
        let verdict = match case.name {
            CLIENT | DEADLINE_ATTEMPT if added > 0.0 => "MISSED (= 0)",
            CLIENT | DEADLINE_ATTEMPT => "met (= 0)",
            _ => "",
        };
        println!(
            "{:<17} {:<30} {call:>6} {caller:>7} {:>7.2} {added:>10.2}  {verdict}",
            case.group, case.name, allocs[i]
        );
    }
    println!();
}

/// Runs every case under criterion; each one's median ns per call, if it was measured.
fn bench(c: &mut Criterion, rt: &Runtime, cases: &[Case]) -> Vec<Option<f64>> {
    let mut medians = vec![None; cases.len()];
    for (i, case) in cases.iter().enumerate() {
        let mut group = c.benchmark_group(case.group);
        let mut drive = (case.make)();
        let mut per_call = Vec::new();
        group.bench_function(case.name, |b| {
            b.iter_custom(|iters| {
                let took = drive.run(rt, iters);
                per_call.push(took.as_nanos() as f64 / iters as f64);
                took
            })
        });
        group.finish();
        // Criterion's measured samples are its last; the ones before are its warm-up.
        if per_call.len() >= SAMPLE_SIZE {
            let first = per_call.len() - SAMPLE_SIZE;
            medians[i] = Some(median(&mut per_call[first..]));
        }
    }
    medians
}

fn print_medians(cases: &[Case], medians: &[Option<f64>]) {
    let at = |group: &str, name: &str| position(cases, group, name).and_then(|i| medians[i]);
    println!();
    println!("median ns per call (same run; ÷ tower, ÷ seatbelt: the group's references)");
    println!(
        "{:<17} {:<30} {:>8} {:>8} {:>10}",
        "group", "case", "ns/call", "÷ tower", "÷ seatbelt"
    );
    for (i, case) in cases.iter().enumerate() {
        let Some(t) = medians[i] else { continue };
        let deadline = case.group.starts_with("deadline");
        let (tower, seatbelt) = if deadline {
            (TOWER_TIMEOUT, SEATBELT_TIMEOUT)
        } else {
            (TOWER_RETRY, SEATBELT_RETRY)
        };
        let ratio =
            |name| at(case.group, name).map_or_else(|| "-".to_owned(), |r| format!("{:.2}", t / r));
        println!(
            "{:<17} {:<30} {t:>8.1} {:>8} {:>10}",
            case.group,
            case.name,
            ratio(tower),
            ratio(seatbelt)
        );
    }
    println!();
}

/// The targets, each measured paired: the case and its reference, made afresh, take turns
/// (which goes first alternates) for `ROUNDS` rounds of `ROUND_SIDE` a side; the ratio is taken
/// within each round, where both sides run at the machine's speed of the moment.
fn print_paired(rt: &Runtime, cases: &[Case], medians: &[Option<f64>]) {
    println!(
        "targets, paired ({ROUNDS} rounds of {ROUND_SIDE:?} a side): median [25th–75th \
         percentile]"
    );
    for (group, case, against, limit) in targets() {
        let (Some(i), Some(j)) = (
            position(cases, &group, case),
            position(cases, &group, against),
        ) else {
            continue;
        };
        let (Some(ns_i), Some(ns_j)) = (medians[i], medians[j]) else {
            continue;
        };
        let calls = |ns: f64| (ROUND_SIDE.as_nanos() as f64 / ns.max(1.0)).ceil() as u64;
        let sides = [
            ((cases[i].make)(), calls(ns_i)),
            ((cases[j].make)(), calls(ns_j)),
        ];
        let mut sides = sides.map(|(mut drive, n)| {
            drive.run(rt, n);
            (drive, n)
        });
        let mut per_call = |k: usize| {
            let (drive, n) = &mut sides[k];
            drive.run(rt, *n).as_nanos() as f64 / *n as f64
        };
        let mut ratios: Vec<f64> = (0..ROUNDS)
            .map(|round| {
                let (a, b) = if round % 2 == 0 {
                    let a = per_call(0);
                    (a, per_call(1))
                } else {
                    let b = per_call(1);
                    (per_call(0), b)
                };
                a / b
            })
            .collect();
        let ratio = median(&mut ratios);
        let quartile = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
        let verdict = if ratio <= limit { "met" } else { "MISSED" };
        println!(
            "  {group:<17} {case:<24} ÷ {against:<24} {ratio:>5.2} [{:.2}–{:.2}] (≤ {limit:.2}) \
             {verdict}",
            quartile(0.25),
            quartile(0.75),
        );
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
    // seatbelt's clock spawns the task that drives its timers when it is made.
    let _entered = rt.enter();
    let cases = cases();
    println!(
        "hyper-util's legacy Client<HttpConnector, Empty<Bytes>>: {} bytes; the bench's \
         HyperSizedInner: {} bytes",
        size_of::<
            hyper_util::client::legacy::Client<
                hyper_util::client::legacy::connect::HttpConnector,
                http_body_util::Empty<bytes::Bytes>,
            >,
        >(),
        size_of::<HyperSizedInner>()
    );
    print_sizes_and_allocations(&rt, &cases);
    let mut c = Criterion::default()
        .warm_up_time(WARM_UP)
        .measurement_time(MEASUREMENT)
        .sample_size(SAMPLE_SIZE)
        .configure_from_args();
    let medians = bench(&mut c, &rt, &cases);
    c.final_summary();
    print_medians(&cases, &medians);
    print_paired(&rt, &cases, &medians);
}
