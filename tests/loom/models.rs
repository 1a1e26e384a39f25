//! Models of the state that calls share, checked by loom under every interleaving of their
//! threads (up to a bound on preemptions), rather than sampled by running threads and hoping.
//!
//! Built only with `RUSTFLAGS="--cfg surely_loom"`, where the crate takes its atomics, its
//! mutex and its clock from loom (`src/sync.rs`): `scripts/loom.sh` builds and runs this target
//! in `target/loom`, so the normal build's cache is left alone.
//!
//! Every model below says what it checks and its bounds: how many threads, how many operations
//! each, and the preemption bound. The bound is [`PREEMPTIONS`] unless `LOOM_MAX_PREEMPTIONS`
//! says otherwise: loom's own guidance is that 2 or 3 finds nearly every bug, and each step up
//! multiplies the time. The models keep the data small (a window of two calls, a bucket of two
//! tokens, one shard) so that the interleavings, not the arithmetic, are what is explored.
//!
//! Each model has a twin, `mutation_*`, that runs the same model with one guarantee broken on
//! purpose in the library (`SURELY_LOOM_MUTATION=name`, a switch that exists only in this
//! build) and passes only if loom finds the counterexample. They are `#[ignore]`d here, since
//! each needs its switch set for the whole process; the script runs them one by one.
//!
//! What the models record for their own assertions (calls in flight, events seen) is kept in
//! `std` atomics and mutexes where it must not add interleavings of its own: it is the test's
//! notebook, not part of what is checked. loom runs a model's threads one at a time, so a `std`
//! lock is never contended.
#![cfg(surely_loom)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Mutex as StdMutex;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use loom::future::block_on;
use loom::sync::atomic::AtomicUsize;
use loom::sync::Arc;
use loom::thread;
use surely::breaker::{Breaker, BreakerLayer, BreakerState, CircuitBreaker, SlidingWindow};
use surely::budget::{RatioBudget, RetryBudget, TokenBucket};
use surely::classify::AttemptClass;
use surely::idempotency::IdempotencyKey;
use surely::record::{
    AttemptRecord, BreakerEvent, BreakerEventKind, CallRecord, Recorder, TransitionReason,
};
use surely::server::store::{
    Acquire, Fence, IdempotencyStore, MemoryStore, RecordKey, RequestDigest, StoredResponse,
};
use tower::{Layer, Service};

/// The preemption bound when `LOOM_MAX_PREEMPTIONS` is not set.
const PREEMPTIONS: usize = 3;

/// Runs `f` under loom with the bound above, and says (with `--nocapture`) how many
/// interleavings it explored.
fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(PREEMPTIONS);
    }
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    builder.check(move || {
        counted.fetch_add(1, SeqCst);
        f();
    });
    let name = thread_name();
    println!("{name}: {} interleavings", runs.load(SeqCst));
}

/// The test's name, which the test harness gives its thread.
fn thread_name() -> String {
    std::thread::current().name().unwrap_or("model").to_owned()
}

/// Runs the model `f` with the mutation `name` switched on, and passes only if loom finds a
/// counterexample that breaks one of the model's own assertions, one whose message contains a
/// line of `broken`: a model that cannot tell the broken code from the right one checks nothing, and
/// one that fails for another reason (a panic in the set-up, loom giving up) proves nothing.
fn assert_counterexample(name: &str, broken: &[&str], f: fn()) {
    let on = std::env::var("SURELY_LOOM_MUTATION").ok();
    assert_eq!(
        on.as_deref(),
        Some(name),
        "run with SURELY_LOOM_MUTATION={name} (scripts/loom.sh does)"
    );
    // loom reports a counterexample by panicking out of `check` with the failed assertion's
    // payload; the panic hook has printed it, with the test's name, above.
    let Err(payload) = std::panic::catch_unwind(f) else {
        panic!("loom found no counterexample with the mutation {name} on: the model misses it");
    };
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("");
    assert!(
        broken.iter().any(|b| message.contains(b)),
        "with the mutation {name} on, the model failed, but not on {broken:?}: {message}"
    );
    println!("{name}: counterexample found: {message}");
}

// --- The circuit breaker ---------------------------------------------------------------------

/// What a breaker model's recorder saw, in order.
#[derive(Default)]
struct Seen {
    transitions: StdMutex<Vec<(BreakerState, BreakerState, TransitionReason)>>,
    /// Probe calls that answered 200, counted by the dependency when it answers.
    successes: std::sync::atomic::AtomicUsize,
    /// The probes the breaker was built with.
    probes: usize,
}

/// Records the breaker's transitions, and checks on each close that as many probes as the
/// breaker needs had really succeeded by then: a probe counted twice closes it early.
#[derive(Clone)]
struct Notebook(std::sync::Arc<Seen>);

impl Recorder for Notebook {
    fn record_attempt(&self, _: &AttemptRecord) {}

    fn record_call(&self, _: &CallRecord) {}

    fn record_breaker(&self, event: &BreakerEvent) {
        if let BreakerEventKind::Transition {
            from, to, reason, ..
        } = event.kind
        {
            if reason == TransitionReason::ProbesSucceeded {
                let done = self.0.successes.load(SeqCst);
                assert!(
                    done >= self.0.probes,
                    "closed after {done} successful probes of {}",
                    self.0.probes
                );
            }
            self.0.transitions.lock().unwrap().push((from, to, reason));
        }
    }
}

impl Notebook {
    fn count(&self, f: impl Fn(&(BreakerState, BreakerState, TransitionReason)) -> bool) -> usize {
        self.0
            .transitions
            .lock()
            .unwrap()
            .iter()
            .filter(|t| f(t))
            .count()
    }
}

/// A dependency that answers at once, 503 while `down` and 200 otherwise, and counts the calls
/// in flight: `in_flight` is a loom atomic, so that a call's time in flight is a window in
/// which the other threads may run.
#[derive(Clone)]
struct Dependency {
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    in_flight: Arc<AtomicUsize>,
    /// The most calls that may be in flight at once.
    limit: usize,
    seen: std::sync::Arc<Seen>,
}

struct Answer {
    status: StatusCode,
    dep: Dependency,
}

impl Future for Answer {
    type Output = Result<Response<()>, std::io::Error>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        self.dep.in_flight.fetch_sub(1, SeqCst);
        if self.status == StatusCode::OK {
            self.dep.seen.successes.fetch_add(1, SeqCst);
        }
        let mut res = Response::new(());
        *res.status_mut() = self.status;
        Poll::Ready(Ok(res))
    }
}

impl Service<Request<()>> for Dependency {
    type Response = Response<()>;
    type Error = std::io::Error;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Answer {
        let before = self.in_flight.fetch_add(1, SeqCst);
        assert!(
            before < self.limit,
            "{} calls in flight, at most {} allowed",
            before + 1,
            self.limit
        );
        let status = if self.down.load(SeqCst) {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        };
        Answer {
            status,
            dep: self.clone(),
        }
    }
}

/// A breaker with no jitter and a break of one second, over a count window of `window` calls
/// that opens when `ratio` of them failed once `window` calls are in it; the dependency behind
/// it starts down and allows `limit` calls in flight.
fn breaker(
    window: u32,
    ratio: f64,
    probes: u32,
    limit: usize,
) -> (Breaker<Dependency>, CircuitBreaker, Notebook, Dependency) {
    let seen = std::sync::Arc::new(Seen {
        probes: probes as usize,
        ..Seen::default()
    });
    let notebook = Notebook(seen.clone());
    let cb = CircuitBreaker::builder()
        .window(SlidingWindow::Count(window))
        .min_throughput(window)
        .failure_ratio(ratio)
        .break_duration(Duration::from_secs(1))
        .jitter(0.0)
        .seed(1)
        .half_open_probes(probes)
        .recorder(notebook.clone())
        .build()
        .unwrap();
    let dep = Dependency {
        down: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
        in_flight: Arc::new(AtomicUsize::new(0)),
        limit,
        seen,
    };
    let svc = BreakerLayer::new(cb.clone()).layer(dep.clone());
    (svc, cb, notebook, dep)
}

/// One call through the breaker, to its end: whether it passed.
fn call(svc: &mut Breaker<Dependency>) -> bool {
    let future = svc.call(Request::new(()));
    match block_on(future) {
        Ok(_) => true,
        Err(e) => {
            assert!(e.is_circuit_open(), "only the breaker refuses here: {e}");
            false
        }
    }
}

/// Checks: two calls that fail at the same time trip a closed breaker open, exactly once (one
/// transition, one break), and leave it open. The breaker opens at a ratio of 1 over a window
/// of 2: whichever call counts the window last must see both calls and both failures, on any
/// memory ordering the window's atomics allow (both may see them: then one transition wins).
///
/// Bounds: 2 threads, 1 failing call each (admit, the window's record and count, the
/// transition under the breaker's lock), over a count window of 2 calls; the default preemption
/// bound.
fn breaker_trips_once() {
    model(|| {
        let (svc, cb, notebook, _dep) = breaker(2, 1.0, 1, usize::MAX);
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let mut svc = svc.clone();
                thread::spawn(move || assert!(call(&mut svc)))
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(cb.state(), BreakerState::Open);
        let opened = notebook.count(|t| t.1 == BreakerState::Open);
        assert_eq!(opened, 1, "the breaker opened {opened} times");
    });
}

#[test]
fn breaker_trips_open_exactly_once() {
    breaker_trips_once();
}

#[test]
#[ignore = "needs SURELY_LOOM_MUTATION=breaker_no_generation_check"]
fn mutation_breaker_no_generation_check() {
    assert_counterexample(
        "breaker_no_generation_check",
        &["opened 2 times"],
        breaker_trips_once,
    );
}

/// Opens the breaker from the model's own thread (one failing call into a window of one),
/// moves the clock past the break and heals the dependency, then makes `threads` threads call
/// once each: returns how many calls passed.
fn after_break(probes: u32, threads: usize) -> (usize, CircuitBreaker, Notebook) {
    let (mut svc, cb, notebook, dep) = breaker(1, 0.5, probes, probes as usize);
    assert!(call(&mut svc));
    assert_eq!(cb.state(), BreakerState::Open);
    surely::__loom::advance_clock(Duration::from_secs(2));
    dep.down.store(false, SeqCst);
    let threads: Vec<_> = (0..threads)
        .map(|_| {
            let mut svc = svc.clone();
            thread::spawn(move || call(&mut svc))
        })
        .collect();
    let passed = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .filter(|p| *p)
        .count();
    (passed, cb, notebook)
}

/// Checks: when a break ends, a half-open breaker of one probe lets one call be in flight
/// (the dependency asserts it on every call: a second caller that read the same count of
/// probes must not pass), turns half-open once, closes once when the probe succeeds, and ends
/// closed; the other call is refused or comes after the close.
///
/// Bounds: the set-up runs in the model's thread; then 2 threads, 1 successful call each,
/// against a breaker of 1 probe. The default preemption bound.
fn breaker_probe_admission() {
    model(|| {
        let (passed, cb, notebook) = after_break(1, 2);
        assert!(passed >= 1, "no call passed");
        assert_eq!(cb.state(), BreakerState::Closed);
        let half_open = notebook.count(|t| t.2 == TransitionReason::BreakEnded);
        let closed = notebook.count(|t| t.2 == TransitionReason::ProbesSucceeded);
        assert_eq!(
            (half_open, closed),
            (1, 1),
            "turned half-open {half_open} times and closed {closed} times"
        );
    });
}

#[test]
fn breaker_half_open_admits_at_most_its_probes() {
    breaker_probe_admission();
}

#[test]
#[ignore = "needs SURELY_LOOM_MUTATION=breaker_probe_admit_racy"]
fn mutation_breaker_probe_admit_racy() {
    assert_counterexample(
        "breaker_probe_admit_racy",
        &["calls in flight", "closed 2 times"],
        breaker_probe_admission,
    );
}

/// Checks: a half-open breaker of two probes closes only once both have succeeded (the
/// recorder asserts it on the close: a probe counted twice would close it after one), once,
/// and ends closed with both calls passed.
///
/// Bounds: the set-up runs in the model's thread; then 2 threads, 1 successful call each,
/// against a breaker of 2 probes. The default preemption bound.
fn breaker_probe_counting() {
    model(|| {
        let (passed, cb, notebook) = after_break(2, 2);
        assert_eq!(passed, 2);
        assert_eq!(cb.state(), BreakerState::Closed);
        let closed = notebook.count(|t| t.2 == TransitionReason::ProbesSucceeded);
        assert_eq!(closed, 1);
    });
}

#[test]
fn breaker_half_open_counts_each_probe_once() {
    breaker_probe_counting();
}

#[test]
#[ignore = "needs SURELY_LOOM_MUTATION=breaker_probe_counted_twice"]
fn mutation_breaker_probe_counted_twice() {
    assert_counterexample(
        "breaker_probe_counted_twice",
        &["closed after 1"],
        breaker_probe_counting,
    );
}

// --- The ratio budget ------------------------------------------------------------------------

/// Checks: withdrawals that race never take more retries than the deposits earned, and what
/// they leave adds up: the retries still available plus those granted equal the deposits (a
/// refused withdrawal gives back what it wrote).
///
/// Bounds: one retry earned by a deposit from the model's thread (ratio 1, no reserve), then
/// 2 threads withdraw once each; the clock stands still, so every amount is in one slot. The
/// default preemption bound.
fn ratio_withdrawals() {
    model(|| {
        let budget = Arc::new(
            RatioBudget::builder()
                .ratio(1.0)
                .min_per_sec(0.0)
                .build()
                .unwrap(),
        );
        budget.deposit();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let budget = budget.clone();
                thread::spawn(move || budget.withdraw().is_ok())
            })
            .collect();
        let granted = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|g| *g)
            .count() as u64;
        assert!(granted <= 1, "{granted} retries granted for 1 earned");
        assert_eq!(budget.available() + granted, 1);
    });
}

#[test]
fn ratio_budget_withdrawals_never_overdraw() {
    ratio_withdrawals();
}

#[test]
#[ignore = "needs SURELY_LOOM_MUTATION=ratio_no_recheck"]
fn mutation_ratio_no_recheck() {
    assert_counterexample(
        "ratio_no_recheck",
        &["2 retries granted"],
        ratio_withdrawals,
    );
}

/// Checks: a deposit that races with two withdrawals is counted once, whoever moves it into
/// its slot: at most one retry is granted, and afterwards the retries available plus those
/// granted equal the one deposit (none lost, none doubled). A withdrawal may miss a deposit
/// another thread is moving into its slot at that moment; that is allowed (it refuses), an
/// overdraft is not.
///
/// Bounds: 3 threads (1 deposit; 1 withdrawal each for the other two), ratio 1, no reserve,
/// the clock still. The default preemption bound.
fn ratio_deposit_and_withdrawals() {
    model(|| {
        let budget = Arc::new(
            RatioBudget::builder()
                .ratio(1.0)
                .min_per_sec(0.0)
                .build()
                .unwrap(),
        );
        let depositor = {
            let budget = budget.clone();
            thread::spawn(move || budget.deposit())
        };
        let withdrawers: Vec<_> = (0..2)
            .map(|_| {
                let budget = budget.clone();
                thread::spawn(move || budget.withdraw().is_ok())
            })
            .collect();
        depositor.join().unwrap();
        let granted = withdrawers
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|g| *g)
            .count() as u64;
        assert!(granted <= 1, "{granted} retries granted for 1 earned");
        assert_eq!(budget.available() + granted, 1);
    });
}

#[test]
fn ratio_budget_deposit_racing_withdrawals() {
    ratio_deposit_and_withdrawals();
}

#[test]
#[ignore = "needs SURELY_LOOM_MUTATION=ratio_no_recheck"]
fn mutation_ratio_no_recheck_with_deposit() {
    assert_counterexample(
        "ratio_no_recheck",
        &["2 retries granted"],
        ratio_deposit_and_withdrawals,
    );
}

/// Checks: under steady traffic the budget counts deposits in batches (after 16 in one tenth
/// of its window, a deposit is one atomic add, and the 16th of a batch or a withdrawal moves
/// the batch into its slot). A deposit into a batch racing two withdrawals still never lets
/// them take more than was earned, and afterwards the retries available plus those granted
/// are what the deposits earned: the batch was moved once, whoever moved it.
///
/// Bounds: 16 deposits from the model's thread at a ratio of 0.1 (1.6 retries, and batch mode
/// on), then 3 threads: 1 deposit (1.7 retries in all), 1 withdrawal each for the other two.
/// No reserve; the clock still. The default preemption bound.
fn ratio_batched() {
    model(|| {
        let budget = Arc::new(
            RatioBudget::builder()
                .ratio(0.1)
                .min_per_sec(0.0)
                .build()
                .unwrap(),
        );
        for _ in 0..16 {
            budget.deposit();
        }
        let depositor = {
            let budget = budget.clone();
            thread::spawn(move || budget.deposit())
        };
        let withdrawers: Vec<_> = (0..2)
            .map(|_| {
                let budget = budget.clone();
                thread::spawn(move || budget.withdraw().is_ok())
            })
            .collect();
        depositor.join().unwrap();
        let granted = withdrawers
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|g| *g)
            .count() as u64;
        assert!(granted <= 1, "{granted} retries granted for 1.7 earned");
        assert_eq!(budget.available() + granted, 1);
    });
}

#[test]
fn ratio_budget_batched_deposits_never_overdraw() {
    ratio_batched();
}

#[test]
#[ignore = "needs SURELY_LOOM_MUTATION=ratio_no_recheck"]
fn mutation_ratio_no_recheck_batched() {
    assert_counterexample("ratio_no_recheck", &["2 retries granted"], ratio_batched);
}

/// Checks: the reserve (retries allowed whatever the traffic) is never overdrawn by racing
/// withdrawals either: its own re-check, against the retries spent, holds.
///
/// Bounds: a reserve of one retry (1 a second over 1 s), no deposits, 2 threads withdraw once
/// each. The default preemption bound.
fn ratio_reserve() {
    model(|| {
        let budget = Arc::new(
            RatioBudget::builder()
                .ratio(0.0)
                .ttl(Duration::from_secs(1))
                .min_per_sec(1.0)
                .build()
                .unwrap(),
        );
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let budget = budget.clone();
                thread::spawn(move || budget.withdraw().is_ok())
            })
            .collect();
        let granted = threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .filter(|g| *g)
            .count() as u64;
        assert!(
            granted <= 1,
            "{granted} retries granted from a reserve of 1"
        );
        assert_eq!(budget.available() + granted, 1);
    });
}

#[test]
fn ratio_budget_reserve_never_overdrawn() {
    ratio_reserve();
}

#[test]
#[ignore = "needs SURELY_LOOM_MUTATION=ratio_no_recheck"]
fn mutation_ratio_no_recheck_reserve() {
    assert_counterexample("ratio_no_recheck", &["2 retries granted"], ratio_reserve);
}

// --- The token bucket ------------------------------------------------------------------------

/// The tokens, in thousandths, that `outcomes` leave in a bucket of `max` thousandths that
/// starts full, taken one at a time in this order, as `TokenBucket` documents them.
fn sequential(max: u64, ratio: u64, outcomes: &[AttemptClass]) -> u64 {
    outcomes.iter().fold(max, |t, c| match c {
        AttemptClass::Success => (t + ratio).min(max),
        _ => t.saturating_sub(1000),
    })
}

/// Checks: outcomes counted at the same time all count, as if one at a time in some order:
/// the tokens left are those of one of the orders, so a lost update (which would leave tokens
/// that no failure paid for, and so allow retries) is found. Every reading, during and after,
/// is within `[0, max_tokens]`: the bucket never holds, and so never grants on, more than its
/// capacity.
///
/// Bounds: a bucket of 2 tokens refilled by 1 per success (retries allowed above 1); 3 threads:
/// two count a health failure, one a success; each then reads the tokens and asks to
/// withdraw. The default preemption bound.
fn token_bucket_outcomes() {
    model(|| {
        let bucket = Arc::new(
            TokenBucket::builder()
                .max_tokens(2)
                .token_ratio(1.0)
                .build()
                .unwrap(),
        );
        let outcomes = [
            AttemptClass::Rejected,
            AttemptClass::MaybeCommitted,
            AttemptClass::Success,
        ];
        let threads: Vec<_> = outcomes
            .iter()
            .map(|&class| {
                let bucket = bucket.clone();
                thread::spawn(move || {
                    bucket.record_outcome(class);
                    let tokens = bucket.tokens();
                    assert!(
                        (0.0..=2.0).contains(&tokens),
                        "{tokens} tokens in a bucket of 2"
                    );
                    let _ = bucket.withdraw();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let left = (bucket.tokens() * 1000.0).round() as u64;
        let orders = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        let possible: Vec<u64> = orders
            .iter()
            .map(|o| sequential(2000, 1000, &o.map(|i| outcomes[i])))
            .collect();
        assert!(
            possible.contains(&left),
            "{left} milli-tokens left; one at a time, the outcomes leave one of {possible:?}"
        );
        // Withdrawing takes nothing, and is allowed exactly when more than half is left.
        assert_eq!(bucket.withdraw().is_ok(), left > 1000);
    });
}

#[test]
fn token_bucket_counts_every_outcome_within_capacity() {
    token_bucket_outcomes();
}

#[test]
#[ignore = "needs SURELY_LOOM_MUTATION=token_bucket_lost_update"]
fn mutation_token_bucket_lost_update() {
    assert_counterexample(
        "token_bucket_lost_update",
        &["milli-tokens left"],
        token_bucket_outcomes,
    );
}

// --- The memory idempotency store ------------------------------------------------------------

fn key() -> RecordKey {
    RecordKey::new("t", "POST /orders", IdempotencyKey::new("k-1").unwrap())
}

fn response() -> StoredResponse {
    StoredResponse::new(
        StatusCode::CREATED,
        &HeaderMap::new(),
        Bytes::from_static(b"o-1"),
    )
}

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

/// Checks: two requests with the same key, acquiring at once, get exactly one owner (fence 1);
/// the other finds it in flight.
///
/// Bounds: one store of one shard, 2 threads, 1 acquire each. The default preemption bound.
fn store_acquires() {
    model(|| {
        let store = MemoryStore::with_shards(1);
        let digest = RequestDigest::of(b"o-1");
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let store = store.clone();
                thread::spawn(move || block_on(store.acquire(&key(), &digest, LEASE)).unwrap())
            })
            .collect();
        let results: Vec<Acquire> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let owners: Vec<Fence> = results
            .iter()
            .filter_map(|a| match a {
                Acquire::Owner(f) => Some(Fence::new(f.get())),
                _ => None,
            })
            .collect();
        assert_eq!(owners, [Fence::new(1)], "owners: {owners:?}");
        let in_flight = results
            .iter()
            .filter(|a| matches!(a, Acquire::InFlight { .. }))
            .count();
        assert_eq!(in_flight, 1);
    });
}

#[test]
fn store_concurrent_acquires_have_one_owner() {
    store_acquires();
}

#[test]
#[ignore = "needs SURELY_LOOM_MUTATION=store_acquire_split"]
fn mutation_store_acquire_split() {
    assert_counterexample(
        "store_acquire_split",
        &["owners: [Fence(1), Fence(1)]"],
        store_acquires,
    );
}

/// Checks: an owner whose lease has passed races a duplicate that takes the record over.
/// Either the owner completes first (and the duplicate then gets its stored response), or the
/// duplicate takes over first (with fence 2) and the old owner's completion, under the stale
/// fence 1, is refused: never both. The record afterwards says the same.
///
/// Bounds: the record is acquired with a lease of zero from the model's thread (so it has
/// passed at once on the still clock); then 2 threads: the owner completes with fence 1, the
/// duplicate acquires. One shard. The default preemption bound.
fn store_takeover() {
    model(|| {
        let store = MemoryStore::with_shards(1);
        let digest = RequestDigest::of(b"o-1");
        let first = block_on(store.acquire(&key(), &digest, Duration::ZERO)).unwrap();
        assert!(
            matches!(first, Acquire::Owner(f) if f == Fence::new(1)),
            "{first:?}"
        );
        let owner = {
            let store = store.clone();
            thread::spawn(move || {
                block_on(store.complete(&key(), Fence::new(1), &response(), RETENTION))
            })
        };
        let duplicate = {
            let store = store.clone();
            thread::spawn(move || block_on(store.acquire(&key(), &digest, LEASE)).unwrap())
        };
        let completed = owner.join().unwrap();
        let taken = duplicate.join().unwrap();
        match (&completed, &taken) {
            (Ok(()), Acquire::Completed(stored)) => assert_eq!(&stored.body()[..], b"o-1"),
            (Err(e), Acquire::TakenOver { fence, .. }) => {
                assert!(e.is_stale(), "{e}");
                assert_eq!(fence.get(), 2);
            }
            _ => panic!("the completion {completed:?} and the takeover {taken:?} both stood"),
        }
        // The record agrees with whichever won.
        let after = block_on(store.acquire(&key(), &digest, LEASE)).unwrap();
        match completed {
            Ok(()) => assert!(matches!(after, Acquire::Completed(_)), "{after:?}"),
            Err(_) => assert!(matches!(after, Acquire::InFlight { .. }), "{after:?}"),
        }
    });
}

#[test]
fn store_stale_fence_after_takeover_is_refused() {
    store_takeover();
}

#[test]
#[ignore = "needs SURELY_LOOM_MUTATION=store_no_fence"]
fn mutation_store_no_fence() {
    assert_counterexample("store_no_fence", &["both stood"], store_takeover);
}

/// Checks: the owner's completion racing its own release (a handler that answered while the
/// request was being dropped) ends with exactly one of them done and the record consistent
/// with it: completed (a duplicate gets the response) or released (a duplicate becomes the
/// next owner, with fence 2).
///
/// Bounds: the record acquired from the model's thread, then 2 threads: one completes, one
/// releases, both with fence 1. One shard. The default preemption bound.
fn store_release_and_complete() {
    model(|| {
        let store = MemoryStore::with_shards(1);
        let digest = RequestDigest::of(b"o-1");
        let first = block_on(store.acquire(&key(), &digest, LEASE)).unwrap();
        assert!(
            matches!(first, Acquire::Owner(f) if f == Fence::new(1)),
            "{first:?}"
        );
        let completer = {
            let store = store.clone();
            thread::spawn(move || {
                block_on(store.complete(&key(), Fence::new(1), &response(), RETENTION))
            })
        };
        let releaser = {
            let store = store.clone();
            thread::spawn(move || block_on(store.release(&key(), Fence::new(1))))
        };
        let completed = completer.join().unwrap().is_ok();
        let released = releaser.join().unwrap().is_ok();
        assert!(
            completed != released,
            "completed: {completed}, released: {released}; exactly one must stand"
        );
        let after = block_on(store.acquire(&key(), &digest, LEASE)).unwrap();
        if completed {
            assert!(matches!(after, Acquire::Completed(_)), "{after:?}");
        } else {
            assert!(
                matches!(after, Acquire::Owner(f) if f == Fence::new(2)),
                "{after:?}"
            );
        }
    });
}

#[test]
fn store_release_racing_complete_leaves_one_outcome() {
    store_release_and_complete();
}

#[test]
#[ignore = "needs SURELY_LOOM_MUTATION=store_finish_any_state"]
fn mutation_store_finish_any_state() {
    assert_counterexample(
        "store_finish_any_state",
        &["exactly one must stand"],
        store_release_and_complete,
    );
}
