//! How the cost of a call grows with the callers: `cargo bench --bench scaling`.
//!
//! Issue 32's fifth question: does a call cost the same when 64 tasks call at once as when one
//! does? Each case runs on a multi-thread tokio runtime (one worker per core), with 1, 4, 16
//! and 64 tasks calling at once, each through its own clone of one stack (one shared retry
//! budget, one shared breaker, one shared store), each task awaiting its calls one after the
//! other:
//!
//! * `bare_ready`: the inner service alone, answering at once (the baseline of the client cases);
//! * `client_ready`: `surely::client()` with its defaults (deadline, key layer, retry with the
//!   default breaker and ratio budget, attempt timeout) around that service;
//! * `bare_pending` and `client_pending`: the same, the inner service yielding to the scheduler
//!   once per call, so that every call is a task switch, as over a network;
//! * `store_acquire_complete`: one keyed request's work in the memory idempotency store (a new
//!   key each call: `acquire`, then `complete`);
//! * `store_replay`: `acquire` of a completed key (the duplicate's path), each task its own
//!   key.
//!
//! **What is measured**: the CPU time per call, of every thread of the process together (Linux's
//! per-thread scheduler statistics, in nanoseconds), so that neither queueing nor another
//! process on the machine counts: what grows with the callers is what they contend for
//! (atomics, locks, cache lines) and the scheduler's work. (Where those statistics cannot be
//! read, the wall time × the workers that had work.)
//!
//! Criterion times each case at each number of callers (`scaling/<case>/<callers>`, CPU time
//! per call). After it,
//! the summary times every case again in 15 rounds that take the numbers of callers in turn
//! (so that a noisy machine's drift falls on all alike), prints each one's median and its ratio
//! to one caller. The target: with 4, 16 or 64 callers a call costs at most 1.5 × what it costs
//! with one (the *growth*; the spread, the largest over the smallest, is shown beside it). For
//! the store, its cost per call; for the client, its cost over `bare` at the same number of
//! callers, its own: with one caller the runtime parks and wakes a worker at every task switch,
//! which more callers spare it, so the pending cases' totals *fall* as callers are added, bare
//! and client alike.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::Criterion;
use http::{HeaderMap, StatusCode};
use surely::idempotency::IdempotencyKey;
use surely::server::store::{
    Acquire, IdempotencyStore, MemoryStore, RecordKey, RequestDigest, StoredResponse,
};
use tokio::runtime::Runtime;
use tower::{service_fn, Service, ServiceExt};

const CALLERS: [u64; 4] = [1, 4, 16, 64];
const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);
/// Calls per round of the summary, per case (split between the callers).
const ROUND_CALLS: u64 = 32_768;
const ROUNDS: usize = 15;
/// How much more a call may cost with more callers than with one.
const TARGET: f64 = 1.5;

const CASES: [&str; 6] = [
    "bare_ready",
    "client_ready",
    "bare_pending",
    "client_pending",
    "store_acquire_complete",
    "store_replay",
];

fn workers() -> u64 {
    std::thread::available_parallelism().map_or(2, |n| n.get() as u64)
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers() as usize)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The inner service: answers a `u64` with itself, at once or after yielding once.
async fn ready(n: u64) -> Result<u64, std::io::Error> {
    Ok(n)
}

async fn pending(n: u64) -> Result<u64, std::io::Error> {
    tokio::task::yield_now().await;
    Ok(n)
}

/// Runs `calls` calls split between `callers` tasks: each task gets its state from `each` and
/// makes its share of the calls with `calls_of` (numbered from its first); returns the CPU
/// time per call, in nanoseconds.
async fn spread<S, F, Fut>(callers: u64, calls: u64, each: impl Fn(u64) -> S, calls_of: F) -> f64
where
    S: Send + 'static,
    F: Fn(S, std::ops::Range<u64>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let per_task = calls.div_ceil(callers).max(1);
    let work: Vec<Fut> = (0..callers)
        .map(|t| calls_of(each(t), t * per_task..(t + 1) * per_task))
        .collect();
    let (wall, cpu) = (Instant::now(), cpu_time());
    let tasks: Vec<_> = work.into_iter().map(tokio::spawn).collect();
    for task in tasks {
        task.await.expect("a caller panicked");
    }
    let spent = match (cpu, cpu_time()) {
        (Some(before), Some(after)) => after.saturating_sub(before),
        // No per-thread CPU times: the wall time of the workers that had work.
        _ => wall.elapsed() * callers.min(workers()) as u32,
    };
    spent.as_secs_f64() * 1e9 / (per_task * callers) as f64
}

/// The CPU time every thread of the process has run so far (Linux's per-thread scheduler
/// statistics, in nanoseconds), or `None` where they cannot be read.
fn cpu_time() -> Option<Duration> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        let Ok(stat) = std::fs::read_to_string(path) else {
            // A thread that ended between the listing and the read.
            continue;
        };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(Duration::from_nanos(total))
}

/// Calls `svc` with each number of `range`, one after the other.
async fn call_each<S>(mut svc: S, range: std::ops::Range<u64>)
where
    S: Service<u64, Response = u64>,
    S::Error: std::fmt::Debug,
{
    for n in range {
        through(&mut svc, n).await;
    }
}

/// One call through `svc`, whose answer must be `n`.
async fn through<S>(svc: &mut S, n: u64)
where
    S: Service<u64, Response = u64>,
    S::Error: std::fmt::Debug,
{
    let answer = svc
        .ready()
        .await
        .expect("ready")
        .call(n)
        .await
        .expect("answered");
    assert_eq!(answer, n);
}

fn key(n: u64) -> RecordKey {
    let key = IdempotencyKey::new(format!("k-{n}")).expect("a valid key");
    RecordKey::new("tenant", "POST /orders", key)
}

fn stored() -> StoredResponse {
    StoredResponse::new(
        StatusCode::CREATED,
        &HeaderMap::new(),
        Bytes::from_static(b"{\"id\":\"o-1\"}"),
    )
}

/// One case at `callers` callers over `calls` calls: the CPU time per call, in nanoseconds.
async fn run(case: &str, callers: u64, calls: u64) -> f64 {
    /// Keys never used before, across rounds.
    static NEXT_KEY: AtomicU64 = AtomicU64::new(0);
    let digest = RequestDigest::of(b"{\"amount\":1}");
    match case {
        "bare_ready" => {
            let svc = service_fn(ready);
            spread(callers, calls, |_| svc, call_each).await
        }
        "bare_pending" => {
            let svc = service_fn(pending);
            spread(callers, calls, |_| svc, call_each).await
        }
        "client_ready" => {
            let svc = surely::client()
                .build(service_fn(ready))
                .expect("a valid client");
            spread(callers, calls, |_| svc.clone(), call_each).await
        }
        "client_pending" => {
            let svc = surely::client()
                .build(service_fn(pending))
                .expect("a valid client");
            spread(callers, calls, |_| svc.clone(), call_each).await
        }
        "store_acquire_complete" => {
            let store = MemoryStore::new();
            let first = NEXT_KEY.fetch_add(calls + callers * 2, Ordering::Relaxed);
            let each = |_| (store.clone(), digest, stored());
            spread(
                callers,
                calls,
                each,
                move |(store, digest, res), range| async move {
                    for n in range {
                        let key = key(first + n);
                        match store.acquire(&key, &digest, LEASE).await {
                            Ok(Acquire::Owner(fence)) => {
                                let done = store.complete(&key, fence, &res, RETENTION).await;
                                assert!(done.is_ok(), "complete failed: {done:?}");
                            }
                            other => panic!("not the owner of a new key: {other:?}"),
                        }
                    }
                },
            )
            .await
        }
        "store_replay" => {
            let store = MemoryStore::new();
            let first = NEXT_KEY.fetch_add(callers, Ordering::Relaxed);
            let mut keys = Vec::new();
            for t in 0..callers {
                let key = key(first + t);
                let Ok(Acquire::Owner(fence)) = store.acquire(&key, &digest, LEASE).await else {
                    panic!("a new key has no owner");
                };
                store
                    .complete(&key, fence, &stored(), RETENTION)
                    .await
                    .expect("completed");
                keys.push(Arc::new(key));
            }
            let each = |t: u64| (store.clone(), digest, keys[t as usize].clone());
            spread(
                callers,
                calls,
                each,
                |(store, digest, key), range| async move {
                    for _ in range {
                        match store.acquire(&key, &digest, LEASE).await {
                            Ok(Acquire::Completed(r)) => {
                                assert_eq!(r.status(), StatusCode::CREATED)
                            }
                            other => panic!("not a replay: {other:?}"),
                        }
                    }
                },
            )
            .await
        }
        other => unreachable!("no case {other}"),
    }
}

fn bench(c: &mut Criterion, rt: &Runtime) {
    for case in CASES {
        let mut group = c.benchmark_group(format!("scaling/{case}"));
        for callers in CALLERS {
            group.bench_function(callers.to_string(), |b| {
                b.iter_custom(|n| {
                    let ns = rt.block_on(run(case, callers, n.max(callers)));
                    Duration::from_secs_f64(ns * n as f64 / 1e9)
                })
            });
        }
        group.finish();
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The summary: every case at every number of callers, in turns, `ROUNDS` times.
fn summary(rt: &Runtime) -> bool {
    let mut met = true;
    let mut medians = std::collections::HashMap::new();
    for case in CASES {
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); CALLERS.len()];
        for _ in 0..ROUNDS {
            for (i, callers) in CALLERS.into_iter().enumerate() {
                times[i].push(rt.block_on(run(case, callers, ROUND_CALLS)));
            }
        }
        let ns: Vec<f64> = times.into_iter().map(median).collect();
        medians.insert(case, ns);
    }
    println!();
    println!(
        "CPU ns per call ({} workers), median of {ROUNDS} rounds; (× one caller)",
        workers()
    );
    let spread = |xs: &[f64]| {
        xs.iter().copied().fold(f64::MIN, f64::max) / xs.iter().copied().fold(f64::MAX, f64::min)
    };
    // How much more a call costs with more callers than with one.
    let growth = |xs: &[f64]| xs.iter().map(|x| x / xs[0]).fold(f64::MIN, f64::max);
    let mut verdict = |xs: &[f64]| {
        let (g, s) = (growth(xs), spread(xs));
        if g <= TARGET {
            format!("growth {g:.2} <= {TARGET}: met (spread {s:.2})")
        } else {
            met = false;
            format!("growth {g:.2} > {TARGET}: MISSED (spread {s:.2})")
        }
    };
    for case in CASES {
        let ns = &medians[case];
        let row: Vec<String> = CALLERS
            .iter()
            .zip(ns)
            .map(|(c, t)| format!("{c:>2}: {t:>7.1} ({:.2}×)", t / ns[0]))
            .collect();
        let bare = case
            .strip_prefix("client_")
            .map(|path| &medians[format!("bare_{path}").as_str()]);
        let judged = if case.starts_with("bare") {
            "baseline".to_owned()
        } else if bare.is_some() {
            format!("growth {:.2}, shown", growth(ns))
        } else {
            verdict(ns)
        };
        println!("  {case:<24} {}   {judged}", row.join("  "));
        if let Some(bare) = bare {
            // The client's own cost: the runtime's (the bare case's) taken away.
            let over: Vec<f64> = ns.iter().zip(bare).map(|(t, b)| t - b).collect();
            let row: Vec<String> = CALLERS
                .iter()
                .zip(&over)
                .map(|(c, o)| format!("{c:>2}: {o:>+7.1}        "))
                .collect();
            println!(
                "  {:<24} {}   {}",
                "  over bare",
                row.join("  "),
                verdict(&over)
            );
        }
    }
    met
}

fn main() {
    let rt = runtime();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
        .configure_from_args();
    bench(&mut c, &rt);
    c.final_summary();
    let met = summary(&rt);
    println!(
        "targets (a call costs at most {TARGET}× with 4, 16 and 64 callers what it costs with one): {}",
        if met { "met" } else { "MISSED" }
    );
}
