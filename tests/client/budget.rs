//! Retry budgets through the public API: first attempts never blocked, the ratio and reserve
//! bounds, expiry over the window, the token bucket's threshold, classes that must not count,
//! concurrent use, validation that never panics, and property tests of the accounting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use proptest::prelude::*;
use surely::budget::{BudgetExhausted, RatioBudget, RetryBudget, TokenBucket};
use surely::classify::AttemptClass;
use tokio::time::advance;

use crate::support::time::secs;

fn ratio(ratio: f64, ttl: Duration, min_per_sec: f64) -> RatioBudget {
    RatioBudget::builder()
        .ratio(ratio)
        .ttl(ttl)
        .min_per_sec(min_per_sec)
        .build()
        .unwrap()
}

fn granted(budget: &dyn RetryBudget, asks: usize) -> usize {
    (0..asks).filter(|_| budget.withdraw().is_ok()).count()
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

// ---- the error ---------------------------------------------------------------------------

#[test]
fn exhausted_error_is_small_and_lower_case() {
    fn is_error<E: std::error::Error + Copy + Send + Sync + 'static>(_: E) {}
    let e = BudgetExhausted::new(None);
    is_error(e);
    assert_eq!(e.to_string(), "retry budget exhausted");
    assert_eq!(e.retry_after(), None);
    assert!(std::mem::size_of::<BudgetExhausted>() <= 16);
}

#[test]
fn budgets_are_object_safe_and_shareable() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Arc<dyn RetryBudget>>();
    send_sync::<RatioBudget>();
    send_sync::<TokenBucket>();
    let shared: Arc<dyn RetryBudget> = Arc::new(TokenBucket::default());
    let boxed: Box<dyn RetryBudget> = Box::new(Arc::clone(&shared));
    boxed.record_outcome(AttemptClass::Rejected);
    assert!(shared.withdraw().is_ok());
    assert!(format!("{shared:?}").contains("TokenBucket"));
}

// ---- ratio budget --------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn ratio_defaults() {
    let budget = RatioBudget::default();
    // The documented defaults: 10% of first attempts over 10 s, plus 10 retries a second.
    assert_eq!(budget.ratio(), 0.1);
    assert_eq!(budget.ttl(), secs(10));
    assert_eq!(budget.min_per_sec(), 10.0);
    // The builder starts from the same defaults.
    let built = RatioBudget::builder().build().unwrap();
    assert_eq!(
        (built.ratio(), built.ttl(), built.min_per_sec()),
        (0.1, secs(10), 10.0)
    );
    // The reserve: 10 a second for 10 s.
    assert_eq!(budget.available(), 100);
    assert!(format!("{budget:?}").contains("available: 100"));
}

#[tokio::test(start_paused = true)]
async fn ratio_first_attempts_are_never_blocked() {
    let budget = ratio(0.0, secs(1), 0.0);
    assert!(budget.withdraw().is_err());
    // `deposit` returns nothing to refuse with; it never blocks, however exhausted the budget.
    for _ in 0..10_000 {
        budget.deposit();
    }
    assert!(budget.withdraw().is_err());
}

#[tokio::test(start_paused = true)]
async fn ratio_allows_ratio_times_first_attempts_or_the_reserve_whichever_is_larger() {
    let budget = ratio(0.1, secs(10), 1.0);
    // Quiet: 50 first attempts earn 5 retries, but the reserve (1 a second for 10 s) is 10.
    for _ in 0..50 {
        budget.deposit();
    }
    assert_eq!(budget.available(), 10);
    // Busy: 1000 first attempts earn 100 retries, and the reserve adds nothing to that.
    for _ in 0..950 {
        budget.deposit();
    }
    assert_eq!(budget.available(), 100);
    assert_eq!(granted(&budget, 500), 100);
    assert!(budget.withdraw().is_err());
    // New first attempts buy new retries.
    for _ in 0..10 {
        budget.deposit();
    }
    assert_eq!(granted(&budget, 5), 1);
}

#[tokio::test(start_paused = true)]
async fn ratio_reserve_is_spent_by_retries_and_not_refilled_by_a_few_first_attempts() {
    let budget = ratio(0.1, secs(10), 1.0);
    assert_eq!(granted(&budget, 50), 10);
    // 20 first attempts earn 2 retries: still under the 10 already spent.
    for _ in 0..20 {
        budget.deposit();
    }
    assert_eq!(granted(&budget, 5), 0);
    // Enough first attempts to earn more than was spent.
    for _ in 0..100 {
        budget.deposit();
    }
    assert_eq!(granted(&budget, 5), 2);
}

#[tokio::test(start_paused = true)]
async fn ratio_above_one() {
    let budget = ratio(2.5, secs(1), 0.0);
    for _ in 0..4 {
        budget.deposit();
    }
    assert_eq!(granted(&budget, 100), 10);
}

#[tokio::test(start_paused = true)]
async fn ratio_keeps_three_decimals() {
    // 0.57 is 0.5699999... in binary; it must still mean 57 retries per 100 first attempts.
    let budget = ratio(0.57, secs(1), 0.0);
    for _ in 0..100 {
        budget.deposit();
    }
    assert_eq!(granted(&budget, 100), 57);
}

#[tokio::test(start_paused = true)]
async fn ratio_deposits_expire_after_ttl() {
    let budget = ratio(1.0, secs(1), 0.0);
    budget.deposit();
    budget.deposit();
    // Still inside the window.
    advance(Duration::from_millis(900)).await;
    assert!(budget.withdraw().is_ok());
    // The remaining deposit leaves the window within ttl × 1.1.
    advance(Duration::from_millis(200)).await;
    assert_eq!(budget.available(), 0);
    assert!(budget.withdraw().is_err());
}

#[tokio::test(start_paused = true)]
async fn ratio_deposits_count_for_at_least_ttl() {
    let budget = ratio(1.0, secs(10), 0.0);
    budget.deposit();
    advance(Duration::from_millis(9_999)).await;
    assert_eq!(budget.available(), 1);
    advance(secs(2)).await;
    assert_eq!(budget.available(), 0);
}

#[tokio::test(start_paused = true)]
async fn ratio_sliding_window() {
    let budget = ratio(0.5, secs(1), 0.0);
    budget.deposit();
    advance(Duration::from_millis(500)).await;
    budget.deposit();
    advance(Duration::from_millis(600)).await;
    // The first deposit has expired, the second has not: half a retry, not enough.
    assert!(budget.withdraw().is_err());
    budget.deposit();
    assert!(budget.withdraw().is_ok());
}

#[tokio::test(start_paused = true)]
async fn ratio_reserve_comes_back_as_retries_expire() {
    let budget = ratio(0.0, secs(1), 5.0);
    assert_eq!(granted(&budget, 10), 5);
    let err = budget.withdraw().unwrap_err();
    // The hint: when the withdrawals leave the window.
    let wait = err.retry_after().expect("a reserve comes back");
    assert!(
        wait > Duration::ZERO && wait <= Duration::from_millis(1100),
        "{wait:?}"
    );
    advance(wait).await;
    assert_eq!(granted(&budget, 10), 5);
}

#[tokio::test(start_paused = true)]
async fn ratio_retry_after_is_none_when_time_alone_cannot_help() {
    let budget = ratio(0.1, secs(1), 0.0);
    let err = budget.withdraw().unwrap_err();
    assert_eq!(err.retry_after(), None);
}

#[tokio::test(start_paused = true)]
async fn ratio_retry_after_points_at_the_oldest_withdrawal() {
    let budget = ratio(1.0, secs(10), 0.0);
    for _ in 0..2 {
        budget.deposit();
    }
    advance(secs(1)).await;
    for _ in 0..2 {
        budget.deposit();
    }
    assert_eq!(granted(&budget, 4), 4);
    // In a quiet period, deposits and withdrawals expire together; with more deposits than
    // withdrawals left, nothing comes back, and the hint is `None` or a wait until a slot of
    // withdrawals leaves. Either way it is never in the past.
    let err = budget.withdraw().unwrap_err();
    if let Some(wait) = err.retry_after() {
        assert!(wait > Duration::ZERO && wait <= secs(12));
    }
}

#[tokio::test(start_paused = true)]
async fn ratio_ignores_outcomes() {
    let budget = ratio(0.0, secs(1), 2.0);
    for class in [
        AttemptClass::Success,
        AttemptClass::Final,
        AttemptClass::Conflict,
        AttemptClass::Rejected,
        AttemptClass::MaybeCommitted,
    ] {
        for _ in 0..100 {
            budget.record_outcome(class);
        }
    }
    assert_eq!(budget.available(), 2);
}

#[tokio::test(start_paused = true)]
async fn ratio_shared_across_clones_of_an_arc() {
    let budget = Arc::new(ratio(0.5, secs(1), 0.0));
    let a: Arc<dyn RetryBudget> = budget.clone();
    let b: Arc<dyn RetryBudget> = budget.clone();
    a.deposit();
    b.deposit();
    assert!(a.withdraw().is_ok());
    assert!(b.withdraw().is_err());
    assert_eq!(budget.available(), 0);
}

#[test]
fn ratio_concurrent_withdrawals_never_exceed_the_bound() {
    // Real time here (threads), so use a long window: nothing expires during the test.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    for _ in 0..20 {
        let budget = Arc::new(ratio(0.1, secs(60), 0.0));
        for _ in 0..1000 {
            budget.deposit();
        }
        let threads = 8;
        let barrier = Arc::new(Barrier::new(threads));
        let total = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (budget, barrier, total) = (budget.clone(), barrier.clone(), total.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    for _ in 0..100 {
                        budget.deposit();
                        if budget.withdraw().is_ok() {
                            total.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        // 1000 + 800 first attempts at 10%.
        let total = total.load(Ordering::SeqCst);
        assert!(total <= 180, "granted {total}");
        // And the racing refusals do not lose much either.
        assert!(total >= 170, "granted only {total}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ratio_concurrent_tasks() {
    let budget = Arc::new(ratio(0.0, secs(60), 1.0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let budget = budget.clone();
            tokio::spawn(async move { granted(&*budget, 50) })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    // The reserve only: 1 a second for 60 s.
    assert!(total <= 60, "granted {total}");
}

// ---- ratio budget under steady traffic (deposits counted in batches of 16) ---------------

fn deposit_n(budget: &dyn RetryBudget, n: usize) {
    for _ in 0..n {
        budget.deposit();
    }
}

#[tokio::test(start_paused = true)]
async fn ratio_batches_count_every_deposit() {
    // 1000 first attempts in a burst: batch mode after the first 16, 1000 = 16 + 61 × 16 + 8,
    // so 8 are still pending when the withdrawals start and must be counted.
    let budget = ratio(0.1, secs(10), 1.0);
    deposit_n(&budget, 1000);
    assert_eq!(granted(&budget, 500), 100);
    assert!(budget.withdraw().is_err());
    // One deposit per ratio unit: every pending deposit shows, whatever the batch's fill.
    for n in [15, 16, 17, 31, 37, 100, 1003] {
        let budget = ratio(1.0, secs(10), 0.0);
        deposit_n(&budget, n);
        assert_eq!(budget.available(), n as u64, "{n} deposits");
        assert_eq!(granted(&budget, 2 * n), n, "{n} deposits");
    }
    // Batch mode, withdrawals in between, a batch that is never completed.
    let budget = ratio(1.0, secs(10), 0.0);
    deposit_n(&budget, 40);
    assert_eq!(granted(&budget, 25), 25);
    deposit_n(&budget, 5);
    assert_eq!(granted(&budget, 100), 20);
    // The reserve still wins when the deposits earn less.
    let budget = ratio(0.1, secs(10), 1.0);
    deposit_n(&budget, 50);
    assert_eq!(granted(&budget, 100), 10);
}

#[tokio::test(start_paused = true)]
async fn ratio_batched_deposits_expire() {
    let budget = ratio(1.0, secs(1), 0.0);
    // A burst at 0 ms, counted by a reading at 950 ms: all there.
    deposit_n(&budget, 1000);
    advance(Duration::from_millis(950)).await;
    assert_eq!(budget.available(), 1000);
    // Gone by ttl × 1.2 and a bit.
    advance(Duration::from_millis(300)).await;
    assert_eq!(budget.available(), 0);
    assert!(budget.withdraw().is_err());

    // Steady traffic for 2 s: 20 deposits every 10 ms, read only at the end.
    let budget = ratio(1.0, secs(1), 0.0);
    for _ in 0..200 {
        deposit_n(&budget, 20);
        advance(Duration::from_millis(10)).await;
    }
    // Now 2000 ms. The deposits of the last ttl (from 1000 ms: 100 rounds of 20) all count;
    // none from before 800 ms (ttl plus two slots) does.
    let available = budget.available();
    assert!((2000..=2400).contains(&available), "{available}");
    // The last deposits were made at 1990 ms; 1250 ms later they have all left.
    advance(Duration::from_millis(1240)).await;
    assert_eq!(budget.available(), 0);
}

#[tokio::test(start_paused = true)]
async fn ratio_thinning_traffic_counts_early_and_returns_to_exact() {
    // Slots of 100 ms.
    let budget = ratio(1.0, secs(1), 0.0);
    // A burst at 0 ms: batch mode, 100 = 16 + 5 × 16 + 4, so 4 pending from epoch 0.
    deposit_n(&budget, 100);
    // Five slots later, traffic has thinned out: three more deposits.
    advance(Duration::from_millis(550)).await;
    deposit_n(&budget, 3);
    // The reading at 550 ms finds a gap of five slots: the batch (4 + 3) counts from epoch 0.
    // All there for now.
    assert_eq!(budget.available(), 103);
    // At 1150 ms epoch 0 has left, and the 3 deposits of 550 ms with it: early, not late
    // (exactly, they would count until 1600 ms).
    advance(Duration::from_millis(600)).await;
    assert_eq!(budget.available(), 0);
    assert!(budget.withdraw().is_err());

    // Back in exact mode: a single deposit at 1150 ms (epoch 11) goes to its own slot, and
    // leaves the window when epoch 22 begins, at 2200 ms. In batch mode it would wait for the
    // reading at 1250 ms and count from epoch 12, until 2300 ms.
    budget.deposit();
    advance(Duration::from_millis(100)).await;
    assert_eq!(budget.available(), 1);
    advance(Duration::from_millis(900)).await;
    // 2150 ms: at least ttl.
    assert_eq!(budget.available(), 1);
    advance(Duration::from_millis(100)).await;
    // 2250 ms: gone.
    assert_eq!(budget.available(), 0);
}

#[tokio::test(start_paused = true)]
async fn ratio_dense_batches_count_for_at_least_ttl() {
    let budget = ratio(1.0, secs(1), 0.0);
    // Batch mode, then 20 deposits in each of the next 30 slots, read only at the end. Each
    // batch is flushed within a slot of the previous one, so it counts from the flush, never
    // earlier than it was made.
    deposit_n(&budget, 16);
    for _ in 0..30 {
        advance(Duration::from_millis(100)).await;
        deposit_n(&budget, 20);
    }
    // At 3000 ms (epoch 30): the deposits of epochs 20 to 30 all count, as they would exactly;
    // at most one slot's more (those of epoch 19 flushed in epoch 20).
    let available = budget.available();
    assert!((220..=240).contains(&available), "{available}");
}

#[test]
fn ratio_concurrent_deposits_in_batch_mode_add_up() {
    // Real time on plain threads (no runtime), with a 60 s window: slots of 6 s, and the test
    // takes milliseconds. Should it cross a slot, the batches still count (dense traffic).
    for _ in 0..20 {
        let budget = ratio(1.0, secs(60), 0.0);
        // Batch mode first.
        deposit_n(&budget, 16);
        let (threads, each) = (8, 10_003);
        let barrier = Barrier::new(threads);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    barrier.wait();
                    deposit_n(&budget, each);
                });
            }
        });
        assert_eq!(budget.available(), 16 + (threads * each) as u64);
        assert_eq!(granted(&budget, 100), 100);
        assert_eq!(budget.available(), 16 + (threads * each) as u64 - 100);
    }
}

#[test]
fn ratio_concurrent_deposits_and_withdrawals_never_lose_a_deposit() {
    // Deposits and withdrawals race; afterwards, what is left plus what was granted is exactly
    // what was deposited (ratio 1, no reserve).
    for _ in 0..20 {
        let budget = ratio(1.0, secs(60), 0.0);
        let (threads, each) = (8, 2_001);
        let total = AtomicU64::new(0);
        let barrier = Barrier::new(threads);
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (budget, total, barrier) = (&budget, &total, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    for i in 0..each {
                        budget.deposit();
                        if (i + t) % 7 == 0 && budget.withdraw().is_ok() {
                            total.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        let granted = total.load(Ordering::SeqCst);
        assert_eq!(
            budget.available() + granted,
            (threads * each) as u64,
            "granted {granted}"
        );
    }
}

#[test]
fn ratio_validation_never_panics() {
    let bad_ratios = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.1,
        1000.5,
        1e300,
    ];
    for r in bad_ratios {
        let err = RatioBudget::builder().ratio(r).build().unwrap_err();
        assert_eq!(err.setting(), "retry budget ratio");
    }
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_millis(60_001),
        Duration::MAX,
    ] {
        let err = RatioBudget::builder().ttl(ttl).build().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid retry budget ttl: must be between 1 and 60 seconds"
        );
    }
    for m in [f64::NAN, f64::INFINITY, -1.0, f64::NEG_INFINITY] {
        let err = RatioBudget::builder().min_per_sec(m).build().unwrap_err();
        assert_eq!(err.setting(), "retry budget min_per_sec");
    }
    // The edges are fine.
    let rt = paused_runtime();
    let _guard = rt.enter();
    for (r, ttl, m) in [
        (0.0, secs(1), 0.0),
        (1000.0, secs(60), 0.0),
        (0.0001, secs(1), 1e300),
        (-0.0, secs(1), f64::MAX),
    ] {
        let budget = ratio(r, ttl, m);
        budget.deposit();
        let _ = budget.withdraw();
        let _ = budget.available();
    }
}

#[tokio::test(start_paused = true)]
async fn ratio_huge_numbers_saturate_without_panicking() {
    let budget = ratio(1000.0, secs(1), f64::MAX);
    for _ in 0..100_000 {
        budget.deposit();
    }
    assert!(budget.withdraw().is_ok());
    assert!(budget.available() > 1_000_000);
    // Time far in the future.
    advance(Duration::from_secs(10 * 365 * 24 * 3600)).await;
    budget.deposit();
    assert!(budget.withdraw().is_ok());
}

// ---- token bucket ----------------------------------------------------------------------

#[test]
fn bucket_defaults() {
    let bucket = TokenBucket::default();
    // The documented defaults: 10 tokens, 0.1 per success.
    assert_eq!(bucket.max_tokens(), 10);
    assert_eq!(bucket.token_ratio(), 0.1);
    assert_eq!(bucket.tokens(), 10.0);
    assert!(format!("{bucket:?}").contains("tokens: 10.0"));
}

#[test]
fn bucket_first_attempts_are_never_blocked() {
    let bucket = TokenBucket::builder()
        .max_tokens(2)
        .token_ratio(0.5)
        .build()
        .unwrap();
    for _ in 0..10 {
        bucket.record_outcome(AttemptClass::Rejected);
    }
    assert!(bucket.withdraw().is_err());
    bucket.deposit();
    assert_eq!(bucket.tokens(), 0.0);
}

#[test]
fn bucket_threshold_is_more_than_half() {
    let bucket = TokenBucket::builder()
        .max_tokens(10)
        .token_ratio(0.1)
        .build()
        .unwrap();
    for n in 0..4 {
        bucket.record_outcome(AttemptClass::Rejected);
        assert!(bucket.withdraw().is_ok(), "after {} failures", n + 1);
    }
    // Five failures: 5 tokens, exactly half, which is not enough.
    bucket.record_outcome(AttemptClass::MaybeCommitted);
    assert_eq!(bucket.tokens(), 5.0);
    let err = bucket.withdraw().unwrap_err();
    assert_eq!(err.retry_after(), None);
    // Withdrawing takes nothing.
    assert_eq!(bucket.tokens(), 5.0);
    // One success: 5.1 tokens, over half.
    bucket.record_outcome(AttemptClass::Success);
    assert!((bucket.tokens() - 5.1).abs() < 1e-9);
    assert!(bucket.withdraw().is_ok());
}

#[test]
fn bucket_odd_max_threshold() {
    let bucket = TokenBucket::builder()
        .max_tokens(3)
        .token_ratio(1.0)
        .build()
        .unwrap();
    bucket.record_outcome(AttemptClass::Rejected);
    // 2 > 1.5
    assert!(bucket.withdraw().is_ok());
    bucket.record_outcome(AttemptClass::Rejected);
    // 1 <= 1.5
    assert!(bucket.withdraw().is_err());
}

#[test]
fn bucket_final_and_conflict_do_not_drain() {
    let bucket = TokenBucket::builder()
        .max_tokens(4)
        .token_ratio(1.0)
        .build()
        .unwrap();
    for _ in 0..1000 {
        bucket.record_outcome(AttemptClass::Final);
        bucket.record_outcome(AttemptClass::Conflict);
    }
    assert_eq!(bucket.tokens(), 4.0);
    assert!(bucket.withdraw().is_ok());
}

#[test]
fn bucket_stays_within_zero_and_max() {
    let bucket = TokenBucket::builder()
        .max_tokens(5)
        .token_ratio(2.0)
        .build()
        .unwrap();
    for _ in 0..100 {
        bucket.record_outcome(AttemptClass::Success);
    }
    assert_eq!(bucket.tokens(), 5.0);
    for _ in 0..100 {
        bucket.record_outcome(AttemptClass::Rejected);
    }
    assert_eq!(bucket.tokens(), 0.0);
    // Refill takes successes: from 0, three successes make 6, capped at 5.
    for _ in 0..3 {
        bucket.record_outcome(AttemptClass::Success);
    }
    assert_eq!(bucket.tokens(), 5.0);
}

#[test]
fn bucket_concurrent_updates_stay_in_bounds_and_add_up() {
    let bucket = Arc::new(
        TokenBucket::builder()
            .max_tokens(1000)
            .token_ratio(1.0)
            .build()
            .unwrap(),
    );
    // Drain to 500, then 8 threads each do 50 failures and 50 successes: net zero, never
    // touching a bound.
    for _ in 0..500 {
        bucket.record_outcome(AttemptClass::Rejected);
    }
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let bucket = bucket.clone();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    bucket.record_outcome(AttemptClass::MaybeCommitted);
                    bucket.record_outcome(AttemptClass::Success);
                    let t = bucket.tokens();
                    assert!((0.0..=1000.0).contains(&t));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(bucket.tokens(), 500.0);
    assert!(bucket.withdraw().is_err());
}

#[test]
fn bucket_validation_never_panics() {
    for max in [0, 1001, u32::MAX] {
        let err = TokenBucket::builder()
            .max_tokens(max)
            .token_ratio(0.1)
            .build()
            .unwrap_err();
        assert_eq!(err.setting(), "retry token bucket max_tokens");
    }
    for r in [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -1.0,
        0.0004,
        10.5,
        1e300,
    ] {
        let err = TokenBucket::builder()
            .max_tokens(10)
            .token_ratio(r)
            .build()
            .unwrap_err();
        assert_eq!(err.setting(), "retry token bucket token_ratio", "{r}");
    }
    // The edges are fine, and a ratio is kept to three decimals.
    assert_eq!(
        TokenBucket::builder()
            .max_tokens(1)
            .token_ratio(1.0)
            .build()
            .unwrap()
            .token_ratio(),
        1.0
    );
    assert_eq!(
        TokenBucket::builder()
            .max_tokens(1000)
            .token_ratio(1000.0)
            .build()
            .unwrap()
            .token_ratio(),
        1000.0
    );
    assert_eq!(
        TokenBucket::builder()
            .max_tokens(10)
            .token_ratio(0.001)
            .build()
            .unwrap()
            .token_ratio(),
        0.001
    );
    assert_eq!(
        TokenBucket::builder()
            .max_tokens(10)
            .token_ratio(0.1239)
            .build()
            .unwrap()
            .token_ratio(),
        0.123
    );
    assert_eq!(
        TokenBucket::builder()
            .max_tokens(10)
            .token_ratio(0.57)
            .build()
            .unwrap()
            .token_ratio(),
        0.57
    );
}

// ---- properties --------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Deposit,
    Withdraw,
    Wait(u64),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => Just(Op::Deposit),
            3 => Just(Op::Withdraw),
            1 => (0u64..200).prop_map(Op::Wait),
        ],
        0..400,
    )
}

proptest! {
    /// Within one window, retries granted never exceed ratio × first attempts + reserve, and
    /// first attempts always go through.
    #[test]
    fn ratio_never_grants_more_than_the_bound(
        ratio_milli in 0u64..3000,
        ttl_secs in 1u64..=60,
        min_per_sec_milli in 0u64..3000,
        ops in ops(),
    ) {
        let rt = paused_runtime();
        rt.block_on(async {
            let budget = ratio(
                ratio_milli as f64 / 1000.0,
                secs(ttl_secs),
                min_per_sec_milli as f64 / 1000.0,
            );
            let ttl_ms = ttl_secs * 1000;
            let (mut deposits, mut granted, mut elapsed) = (0u64, 0u64, 0u64);
            for op in ops {
                match op {
                    Op::Deposit => {
                        budget.deposit();
                        deposits += 1;
                    }
                    Op::Withdraw => {
                        if budget.withdraw().is_ok() {
                            granted += 1;
                        }
                    }
                    Op::Wait(ms) => {
                        // Stay within one window.
                        let ms = ms.min(ttl_ms - 1 - elapsed);
                        advance(Duration::from_millis(ms)).await;
                        elapsed += ms;
                    }
                }
                // In thousandths, exactly.
                let bound = ratio_milli * deposits + min_per_sec_milli * ttl_secs;
                prop_assert!(granted * 1000 <= bound, "granted {} > {}", granted, bound);
            }
            Ok(())
        })?;
    }

    /// Over any stretch of time, windows included: the balance never goes below what
    /// `available` says, and a grant always had a whole retry available.
    #[test]
    fn ratio_grants_match_available(ops in ops(), ratio_milli in 0u64..2000) {
        let rt = paused_runtime();
        rt.block_on(async {
            let budget = ratio(ratio_milli as f64 / 1000.0, secs(1), 2.0);
            for op in ops {
                match op {
                    Op::Deposit => budget.deposit(),
                    Op::Withdraw => {
                        let before = budget.available();
                        let ok = budget.withdraw().is_ok();
                        prop_assert_eq!(ok, before >= 1);
                        if ok {
                            prop_assert_eq!(budget.available(), before - 1);
                        }
                    }
                    Op::Wait(ms) => advance(Duration::from_millis(ms * 10)).await,
                }
            }
            Ok(())
        })?;
    }

    /// Under bursts and gaps (batch mode and back), a deposit never counts late: what is
    /// available never exceeds the deposits made in the last `ttl` plus two slots.
    #[test]
    fn ratio_batches_never_count_late(
        steps in prop::collection::vec((0usize..60, 0u64..400, any::<bool>()), 0..60),
    ) {
        let rt = paused_runtime();
        rt.block_on(async {
            // Slots of 100 ms.
            let budget = ratio(1.0, secs(1), 0.0);
            let mut made: Vec<(u64, usize)> = Vec::new();
            let mut now = 0u64;
            for (burst, wait, read) in steps {
                deposit_n(&budget, burst);
                made.push((now, burst));
                advance(Duration::from_millis(wait)).await;
                now += wait;
                if read {
                    let available = budget.available();
                    // Made within the last ttl plus two slots (1200 ms).
                    let recent: usize = made
                        .iter()
                        .filter(|(at, _)| at + 1200 > now)
                        .map(|(_, n)| n)
                        .sum();
                    prop_assert!(available <= recent as u64, "{} > {}", available, recent);
                }
            }
            Ok(())
        })?;
    }

    /// The token bucket never grants at or below half, and its tokens stay within [0, max].
    #[test]
    fn bucket_never_grants_at_or_below_half(
        max in 1u32..=1000,
        ratio_milli in 1u64..=1000,
        classes in prop::collection::vec(0u8..6, 0..500),
    ) {
        let token_ratio = (ratio_milli as f64 / 1000.0).min(f64::from(max));
        let bucket = TokenBucket::builder().max_tokens(max).token_ratio(token_ratio).build().unwrap();
        let half = f64::from(max) / 2.0;
        for c in classes {
            let class = match c {
                0 => AttemptClass::Success,
                1 => AttemptClass::Final,
                2 => AttemptClass::Conflict,
                3 => AttemptClass::Rejected,
                4 => AttemptClass::MaybeCommitted,
                _ => {
                    let tokens = bucket.tokens();
                    prop_assert_eq!(bucket.withdraw().is_ok(), tokens > half);
                    continue;
                }
            };
            let before = bucket.tokens();
            bucket.record_outcome(class);
            let after = bucket.tokens();
            prop_assert!((0.0..=f64::from(max)).contains(&after));
            if matches!(class, AttemptClass::Final | AttemptClass::Conflict) {
                prop_assert_eq!(before, after);
            }
            if after <= half {
                prop_assert!(bucket.withdraw().is_err());
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn ratio_deposit_at_counts_from_the_time_given() {
    let at_start = tokio::time::Instant::now();
    let given = ratio(1.0, secs(1), 0.0);
    let read = ratio(1.0, secs(1), 0.0);
    advance(Duration::from_millis(900)).await;
    // The same first attempt, told when it happened, or reading the clock itself.
    given.deposit_at(at_start);
    read.deposit();
    advance(Duration::from_millis(300)).await;
    assert!(given.withdraw().is_err(), "made at 0 ms, gone by 1.2 s");
    assert!(read.withdraw().is_ok(), "made at 900 ms, still counts");
}
