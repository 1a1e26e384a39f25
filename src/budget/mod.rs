//! Retry budgets: retries that cannot multiply the load of an outage.
//!
//! # Why a budget, not a retry count
//!
//! "Retry up to three times" looks harmless until the server is down. Then every call becomes
//! four, so a struggling server gets four times its normal load at the moment it can least take
//! it. Worse, limits multiply across layers: if a client, a gateway, and a service each retry
//! three times, one user request becomes 4 × 4 × 4 = 64 calls to the database. A fixed count
//! bounds the retries *per call*, and so bounds nothing about the load.
//!
//! A retry budget bounds the retries *as a share of the traffic*: with the default 10%, a
//! client never sends more than about 1.1 times its first attempts, outage or not. A few
//! failures among many successes are all retried; a total outage gets a trickle of retries
//! that is too small to hurt and enough to notice recovery. Pair it with a small per-call
//! attempt limit: the limit stops one call from looping, the budget stops the fleet from
//! stampeding.
//!
//! # Two forms
//!
//! - [`RatioBudget`] (Finagle's `RetryBudget`, tower's `TpsBudget`): over a sliding window
//!   (`ttl`, 10 s), retries may be at most `ratio` (10%) of first attempts, or a reserve of
//!   `min_per_sec` (10) retries a second when that is larger, so that a client with little
//!   traffic can still retry its rare failures while a busy one never exceeds its ratio. It counts attempts and ignores outcomes; it recovers with time.
//!   Choose it when you can say "at most this share of my traffic may be retries", and for
//!   hedging, whose extra requests are not failures at all.
//! - [`TokenBucket`] (gRPC's `retryThrottling`, the AWS SDKs' retry quota): health failures
//!   drain tokens, successes refill them, and retries stop while the bucket is at most half
//!   full. It has no clock and no window: it reacts to the *failure rate* and recovers only
//!   with successes. Choose it to match gRPC clients, or when bursts of first attempts should
//!   not buy bursts of retries.
//!
//! Only failures that say the server is unhealthy count: *rejected* and *maybe committed*
//! attempts ([`AttemptClass::is_health_failure`]). A final answer (a 400, a 404) or a business
//! conflict (a 409) is the server working as it should: the token bucket ignores it, and the
//! retry layer does not retry it, so it withdraws nothing from a ratio budget either. And the
//! first attempt of a call is never blocked: a budget only ever refuses *extra* attempts.
//!
//! # How the retry layer uses a budget
//!
//! For every logical call, the retry layer calls
//!
//! 1. [`deposit`](RetryBudget::deposit) once, for the first attempt;
//! 2. [`record_outcome`](RetryBudget::record_outcome) with the class of every attempt, first or
//!    not, once it is known;
//! 3. [`withdraw`](RetryBudget::withdraw) before every retry and every hedge, and gives up
//!    (reporting [`BudgetExhausted`]) if it is refused.
//!
//! ```
//! use surely::budget::{RatioBudget, RetryBudget};
//! use surely::classify::AttemptClass;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), surely::ConfigError> {
//! fn call(budget: &dyn RetryBudget, mut attempt: impl FnMut() -> AttemptClass) -> AttemptClass {
//!     budget.deposit();
//!     let mut class = attempt();
//!     budget.record_outcome(class);
//!     for _ in 0..3 {
//!         if !class.is_health_failure() || budget.withdraw().is_err() {
//!             break;
//!         }
//!         class = attempt();
//!         budget.record_outcome(class);
//!     }
//!     class
//! }
//!
//! // No reserve, so that only the ratio counts: 10% of first attempts.
//! let budget = RatioBudget::builder().min_per_sec(0.0).build()?;
//! // A total outage: 1000 calls, with up to three retries each, send 1100 attempts, not 4000.
//! let mut attempts = 0;
//! for _ in 0..1000 {
//!     call(&budget, || {
//!         attempts += 1;
//!         AttemptClass::Rejected
//!     });
//! }
//! assert_eq!(attempts, 1100);
//! # Ok(()) }
//! ```
//!
//! # Defaults
//!
//! - [`RatioBudget`]: ratio 0.1, window 10 s, reserve 10 retries a second: Finagle's defaults
//!   (tower's `TpsBudget::default` allows 20%). 10% keeps an outage's extra load small while
//!   still retrying every failure of a healthy service; ten seconds is long enough to smooth
//!   bursts and short enough to follow a change of traffic; the reserve lets a quiet client
//!   retry.
//! - [`TokenBucket`]: 10 tokens, 0.1 per success: the example of gRPC's retry design. Five
//!   health failures more than successes have paid for stop retries, and ten successes pay for
//!   one failure, the same 10%.
//!
//! # Sharing a budget
//!
//! A budget is shared state, used through `&self`; it is not `Clone`, because a clone would be
//! a second budget. Put it in an [`Arc`] and give a clone of the `Arc` to every
//! service (and every clone of a service) that should draw from it: one budget per downstream
//! is the usual choice, so that the retries to one backend are bounded by the traffic to it.
//! `Arc<B>`, `Box<B>` and `&B` are budgets themselves, and `Arc<dyn RetryBudget>` lets
//! services of different types share one.
//!
//! ```
//! use std::sync::Arc;
//! use surely::budget::{RatioBudget, RetryBudget, TokenBucket};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let shared: Arc<dyn RetryBudget> = Arc::new(RatioBudget::default());
//! let for_orders = Arc::clone(&shared);
//! let for_payments = Arc::clone(&shared);
//! for_orders.deposit();
//! assert!(for_payments.withdraw().is_ok());
//!
//! // Or keep the concrete type, to read its state.
//! let bucket = Arc::new(TokenBucket::default());
//! let handle: Arc<dyn RetryBudget> = bucket.clone();
//! assert!(handle.withdraw().is_ok());
//! assert_eq!(bucket.tokens(), 10.0);
//! # }
//! ```

use std::sync::Arc;

use crate::classify::AttemptClass;
use crate::review::BudgetSettings;

pub(crate) mod lend;
mod ratio;
mod token_bucket;

pub use self::ratio::{RatioBudget, RatioBudgetBuilder};
pub use self::token_bucket::{TokenBucket, TokenBucketBuilder};
pub use crate::error::BudgetExhausted;

/// Budgets keep amounts in thousandths of a retry (or a token).
const MILLI: i64 = 1000;

/// `x` in thousandths, rounded down, but exact for decimals with three places that `f64`
/// cannot hold exactly (`0.57 * 1000.0` is `569.99...`). For finite, non-negative `x`.
fn to_milli(x: f64) -> f64 {
    let scaled = x * MILLI as f64;
    let nearest = scaled.round();
    if (nearest - scaled).abs() < 1e-6 {
        nearest
    } else {
        scaled.floor()
    }
}

/// A retry budget: how many retries (and hedges) the recent traffic allows. See the
/// [module docs](self) for why, the two forms, and how the retry layer calls it.
///
/// Object-safe, and `Send + Sync`: share one as `Arc<dyn RetryBudget>` or `Arc<B>`. Every method
/// takes `&self` and must be cheap, as it runs on every call.
///
/// | method | [`RatioBudget`] | [`TokenBucket`] |
/// |---|---|---|
/// | [`deposit`](Self::deposit) | adds `ratio` retries, for `ttl` | nothing |
/// | [`withdraw`](Self::withdraw) | takes one retry, for `ttl`, if one is left | allowed while tokens > max / 2; takes nothing |
/// | [`record_outcome`](Self::record_outcome) | nothing | health failure −1 token, success +`token_ratio` |
pub trait RetryBudget: std::fmt::Debug + Send + Sync {
    /// Records a first attempt. Never blocks and never fails: the first attempt of a call is
    /// always allowed.
    fn deposit(&self);

    /// [`deposit`](Self::deposit), for a caller that has just read the clock: a budget that
    /// needs the time (a [`RatioBudget`]) uses `now` instead of reading it again. The default
    /// ignores `now`.
    fn deposit_at(&self, now: tokio::time::Instant) {
        let _ = now;
        self.deposit();
    }

    /// Asks to send one retry or hedge. `Ok` allows it (and, for a budget that counts retries,
    /// counts it); `Err` refuses it, with a hint of when to ask again if the budget knows.
    ///
    /// # Errors
    ///
    /// [`BudgetExhausted`] if the budget allows no more retries now.
    fn withdraw(&self) -> Result<(), BudgetExhausted>;

    /// Records the class of a finished attempt, first or retry. Only
    /// [health failures](AttemptClass::is_health_failure) and successes may change a budget;
    /// final answers and conflicts never do.
    fn record_outcome(&self, class: AttemptClass);

    /// How this budget bounds retries, for a [review](crate::review) of the stack that spends
    /// from it. The default says [`Custom`](BudgetSettings::Custom): a budget of your own that
    /// does not say.
    fn describe(&self) -> BudgetSettings {
        BudgetSettings::Custom
    }
}

macro_rules! forward {
    ($($ptr:ty),*) => {$(
        impl<B: RetryBudget + ?Sized> RetryBudget for $ptr {
            fn deposit(&self) {
                (**self).deposit()
            }

            fn deposit_at(&self, now: tokio::time::Instant) {
                (**self).deposit_at(now)
            }

            fn withdraw(&self) -> Result<(), BudgetExhausted> {
                (**self).withdraw()
            }

            fn record_outcome(&self, class: AttemptClass) {
                (**self).record_outcome(class)
            }

            fn describe(&self) -> BudgetSettings {
                (**self).describe()
            }
        }
    )*};
}

forward!(&B, Box<B>, Arc<B>);
