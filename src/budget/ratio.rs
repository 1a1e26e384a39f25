//! The ratio form: retries are at most a fraction of recent first attempts, or a small reserve
//! when that is larger.

use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{to_milli, BudgetExhausted, RetryBudget, MILLI};
use crate::classify::AttemptClass;
#[cfg(surely_loom)]
use crate::sync::mutation;
use crate::sync::{now as clock, AtomicU64};
use crate::ConfigError;

/// The default [ratio](RatioBudgetBuilder::ratio): one retry per ten first attempts.
pub(crate) const DEFAULT_RATIO: f64 = 0.1;

/// The default [window](RatioBudgetBuilder::ttl): first attempts and retries count for ten
/// seconds, as in Finagle and tower.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// The default [reserve](RatioBudgetBuilder::min_per_sec): ten retries a second whatever the
/// traffic, as in Finagle and tower.
pub(crate) const DEFAULT_MIN_PER_SEC: f64 = 10.0;

/// The window is cut into this many slots; amounts expire a slot at a time.
const SLOTS_PER_TTL: u32 = 10;
/// The ring holds one slot more than the window, so that an amount counts for at least `ttl`.
const RING: u64 = SLOTS_PER_TTL as u64 + 1;

// Each slot is one `AtomicU64`: a 24-bit tag (the slot's epoch, wrapping) over a 40-bit signed
// balance in milli-retries. One compare-and-swap moves a slot to a new epoch and updates it.
const VALUE_BITS: u32 = 40;
const TAG_MASK: u64 = (1 << (64 - VALUE_BITS)) - 1;
const VALUE_MASK: u64 = (1 << VALUE_BITS) - 1;
const VALUE_MAX: i64 = (1 << (VALUE_BITS - 1)) - 1;
const VALUE_MIN: i64 = -(1 << (VALUE_BITS - 1));

fn pack(tag: u64, value: i64) -> u64 {
    (tag << VALUE_BITS) | (value as u64 & VALUE_MASK)
}

fn unpack(raw: u64) -> (u64, i64) {
    // Sign-extend the low 40 bits.
    let value = ((raw << (64 - VALUE_BITS)) as i64) >> (64 - VALUE_BITS);
    (raw >> VALUE_BITS, value)
}

/// Whether tag `a` is a later epoch than tag `b` (wrapping, like TCP sequence numbers).
fn is_newer(a: u64, b: u64) -> bool {
    let d = a.wrapping_sub(b) & TAG_MASK;
    d != 0 && d < (TAG_MASK >> 1)
}

// Deposits under steady traffic are counted in batches. `RatioBudget::pending` is one
// `AtomicU64`: the epoch of the last clock reading (36 bits, saturating), a batch-mode flag, the
// streak of deposits seen in that epoch (5 bits, exact mode only), and the deposits not yet in a
// slot (22 bits). A flush moves the deposits into a slot and resets the count in one
// compare-and-swap, so each deposit lands in a slot exactly once.

/// How many deposits in one epoch switch to batch mode, and how many a batch holds.
const BATCH: u64 = 16;
const COUNT_BITS: u32 = 22;
const STREAK_BITS: u32 = 5;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const STREAK_MASK: u64 = (1 << STREAK_BITS) - 1;
const BATCH_FLAG: u64 = 1 << (COUNT_BITS + STREAK_BITS);
const EPOCH_SHIFT: u32 = COUNT_BITS + STREAK_BITS + 1;
const EPOCH_MAX: u64 = (1 << (64 - EPOCH_SHIFT)) - 1;
// The streak counts up to a full batch.
const _: () = assert!(BATCH <= STREAK_MASK);

/// The state of the pending deposits, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pending {
    /// The epoch of the last clock reading (saturating at `EPOCH_MAX`).
    epoch: u64,
    /// Batch mode: deposits wait in `count` without reading the clock.
    batch: bool,
    /// Exact mode: the deposits seen in `epoch` so far (at most `BATCH`).
    streak: u64,
    /// The deposits not yet in a slot.
    count: u64,
}

impl Pending {
    fn pack(self) -> u64 {
        (self.epoch.min(EPOCH_MAX) << EPOCH_SHIFT)
            | if self.batch { BATCH_FLAG } else { 0 }
            | ((self.streak & STREAK_MASK) << COUNT_BITS)
            | (self.count & COUNT_MASK)
    }

    fn unpack(raw: u64) -> Self {
        Pending {
            epoch: raw >> EPOCH_SHIFT,
            batch: raw & BATCH_FLAG != 0,
            streak: (raw >> COUNT_BITS) & STREAK_MASK,
            count: raw & COUNT_MASK,
        }
    }
}

/// A retry budget of the ratio form (after Finagle's `RetryBudget` and tower's `TpsBudget`):
/// over a sliding window of `ttl`, retries may be at most `ratio` times the first attempts, or
/// the reserve of `min_per_sec` retries a second for low traffic, whichever is larger.
///
/// - [`deposit`](RetryBudget::deposit) (each first attempt) earns `ratio` retries;
/// - [`withdraw`](RetryBudget::withdraw) (each retry or hedge) spends one, and is refused if it
///   would exceed the allowance;
/// - [`record_outcome`](RetryBudget::record_outcome) does nothing: the ratio form counts
///   attempts, not their outcomes.
///
/// **The reserve is a floor, not an addition.** Finagle and tower add the reserve to what the
/// ratio earns; then a busy client in an outage sends `ratio` of its calls plus the reserve as
/// retries, and a chain's amplification is above `1 + ratio` at any traffic. Here the retries of
/// the window are at most `max(ratio × first attempts, min_per_sec × ttl)`: a busy client stays
/// within its ratio, and a quiet one (a few calls a minute, where 10% would be nothing) still
/// gets its reserve. The bound is never above the additive one, so every guarantee of the
/// additive form holds.
///
/// Each deposit and withdrawal stops counting between `ttl` and `ttl × 1.1` after it was made
/// (the window moves in tenths of `ttl`). The ratio and the reserve are kept to a thousandth of
/// a retry, rounding down, so the budget never grants more than the bound.
///
/// Under light traffic every deposit reads the clock and counts exactly. Under steady traffic
/// (16 deposits in one tenth of `ttl`) the budget reads the clock once per 16 deposits, so a
/// deposit counts for at least `ttl` and at most `ttl` plus two tenths. When traffic thins out,
/// the batch in progress counts from the previous reading: it may leave the window early, never
/// late. A withdrawal counts every deposit made before it, except a batch that another thread
/// is moving into its slot at that moment: that one shows a moment later.
///
/// Lock-free: under steady traffic a deposit is one atomic add; under light traffic it adds a
/// compare-and-swap. A withdrawal first moves the pending deposits into their slot, then takes
/// two compare-and-swaps and one atomic add. A refusal writes nothing beyond that move, so an
/// outage (when every caller is refused) causes little contention. Concurrent callers never get
/// more retries than the bound: a withdrawal that another one overtook looks at the window again
/// after writing, and one that raced below zero is undone and refused.
///
/// Time is [`tokio::time::Instant`], so tests with paused time control the window.
///
/// Not `Clone`, on purpose: a clone would be a second budget. Share one with
/// [`Arc`](std::sync::Arc), as the [module docs](super) show.
///
/// ```
/// use surely::budget::{RatioBudget, RetryBudget};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), surely::ConfigError> {
/// // 20% of first attempts, and no reserve: 100 first attempts pay for 20 retries.
/// let budget = RatioBudget::builder().ratio(0.2).min_per_sec(0.0).build()?;
/// for _ in 0..100 {
///     budget.deposit();
/// }
/// assert_eq!((0..50).filter(|_| budget.withdraw().is_ok()).count(), 20);
///
/// // With a reserve of 3 retries a second over 10 s: 30 retries, the larger of 30 and 20.
/// let budget = RatioBudget::builder().ratio(0.2).min_per_sec(3.0).build()?;
/// for _ in 0..100 {
///     budget.deposit();
/// }
/// assert_eq!((0..50).filter(|_| budget.withdraw().is_ok()).count(), 30);
/// # Ok(()) }
/// ```
pub struct RatioBudget {
    /// Per slot: what first attempts earned less what retries spent (milli-retries).
    slots: Box<[AtomicU64]>,
    /// Per slot: what retries spent (milli-retries), for the reserve.
    spent: Box<[AtomicU64]>,
    /// The deposits not yet in a slot, and the clock reading they count from (see [`Pending`]).
    pending: AtomicU64,
    /// How many withdrawals have written to the slots: a withdrawal that sees no other one
    /// write between its check and its own write need not check again.
    withdrawals: AtomicU64,
    start: Instant,
    /// The width of one slot, in nanoseconds; at least 100 ms.
    slot_nanos: u64,
    /// Milli-retries added by each deposit.
    deposit_amount: i64,
    /// Milli-retries that are always there.
    reserve: i64,
    ratio: f64,
    ttl: Duration,
    min_per_sec: f64,
}

impl RatioBudget {
    /// A budget with the defaults: 10% of first attempts over a 10 s window, plus a reserve of
    /// 10 retries a second (Finagle's and tower's window and reserve).
    pub fn new() -> Self {
        RatioBudget::from_valid(DEFAULT_RATIO, DEFAULT_TTL, DEFAULT_MIN_PER_SEC)
    }

    /// Starts a budget with [`new`](Self::new)'s settings: ratio 0.1 (10% of first attempts),
    /// window 10 s, reserve 10 retries a second.
    pub fn builder() -> RatioBudgetBuilder {
        RatioBudgetBuilder {
            ratio: DEFAULT_RATIO,
            ttl: DEFAULT_TTL,
            min_per_sec: DEFAULT_MIN_PER_SEC,
        }
    }

    /// The retries allowed per first attempt.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// How long a first attempt or a retry counts.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The retries a second allowed whatever the traffic.
    pub fn min_per_sec(&self) -> f64 {
        self.min_per_sec
    }

    /// How many retries the budget would grant now, if nobody else asked first.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::budget::RatioBudget;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), surely::ConfigError> {
    /// // The default reserve: 10 a second over a 10 s window.
    /// assert_eq!(RatioBudget::default().available(), 100);
    /// let budget = RatioBudget::builder().ttl(Duration::from_secs(2)).min_per_sec(1.5).build()?;
    /// assert_eq!(budget.available(), 3);
    /// # Ok(()) }
    /// ```
    pub fn available(&self) -> u64 {
        let epoch = self.epoch(clock());
        self.flush(epoch);
        let balance = self.balance(epoch);
        u64::try_from(balance / MILLI).unwrap_or(0)
    }

    fn from_valid(ratio: f64, ttl: Duration, min_per_sec: f64) -> Self {
        // `as` saturates; the inputs are validated to be finite and non-negative.
        let deposit_amount = to_milli(ratio) as i64;
        let reserve = to_milli(min_per_sec * ttl.as_secs_f64()) as i64;
        let slot_nanos = u64::try_from((ttl / SLOTS_PER_TTL).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        RatioBudget {
            slots: (0..RING).map(|_| AtomicU64::new(pack(0, 0))).collect(),
            spent: (0..RING).map(|_| AtomicU64::new(pack(0, 0))).collect(),
            pending: AtomicU64::new(
                Pending {
                    epoch: 0,
                    batch: false,
                    streak: 0,
                    count: 0,
                }
                .pack(),
            ),
            withdrawals: AtomicU64::new(0),
            start: clock(),
            slot_nanos,
            deposit_amount: deposit_amount.min(VALUE_MAX),
            reserve,
            ratio,
            ttl,
            min_per_sec,
        }
    }

    fn epoch(&self, now: Instant) -> u64 {
        // In u64 (a u128 division is a slow library call on the hot path); 2^64 ns is 584 years.
        let since = now.saturating_duration_since(self.start);
        let nanos = since
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(since.subsec_nanos()));
        nanos / self.slot_nanos
    }

    fn slot(ring: &[AtomicU64], epoch: u64) -> &AtomicU64 {
        // `epoch % RING` is less than the ring's length.
        &ring[(epoch % RING) as usize]
    }

    fn value_at(ring: &[AtomicU64], epoch: u64) -> i64 {
        let (tag, value) = unpack(Self::slot(ring, epoch).load(Ordering::SeqCst));
        if tag == epoch & TAG_MASK {
            value
        } else {
            0
        }
    }

    fn window(epoch: u64) -> impl Iterator<Item = u64> {
        (0..RING).map_while(move |k| epoch.checked_sub(k))
    }

    /// What the window allows beyond what it spent: the larger of the ratio's net and the
    /// reserve less the retries spent.
    fn balance(&self, epoch: u64) -> i64 {
        let (net, spent) = Self::window(epoch).fold((0i64, 0i64), |(net, spent), e| {
            (
                net.saturating_add(Self::value_at(&self.slots, e)),
                spent.saturating_add(Self::value_at(&self.spent, e)),
            )
        });
        net.max(self.reserve.saturating_sub(spent))
    }

    /// Adds `amount` to the slot of `epoch`. If the slot already holds a later epoch, the amount
    /// goes there when `into_newer`, and is dropped (`None`) otherwise.
    fn add(ring: &[AtomicU64], epoch: u64, amount: i64, into_newer: bool) -> Option<u64> {
        let want = epoch & TAG_MASK;
        let slot = Self::slot(ring, epoch);
        let mut current = slot.load(Ordering::SeqCst);
        loop {
            let (tag, value) = unpack(current);
            let (tag, base) = if tag == want {
                (tag, value)
            } else if is_newer(tag, want) {
                if !into_newer {
                    return None;
                }
                (tag, value)
            } else {
                (want, 0)
            };
            let next = base.saturating_add(amount);
            let next = if next < VALUE_MIN {
                return None;
            } else {
                next.min(VALUE_MAX)
            };
            match slot.compare_exchange_weak(
                current,
                pack(tag, next),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return Some(tag),
                Err(actual) => current = actual,
            }
        }
    }

    /// Takes `amount` back from a slot, if it still holds the epoch `tag` it was added under.
    fn undo(ring: &[AtomicU64], epoch: u64, tag: u64, amount: i64) {
        let slot = Self::slot(ring, epoch);
        let mut current = slot.load(Ordering::SeqCst);
        loop {
            let (now_tag, value) = unpack(current);
            if now_tag != tag {
                return;
            }
            let next = value.saturating_sub(amount).clamp(VALUE_MIN, VALUE_MAX);
            match slot.compare_exchange_weak(
                current,
                pack(tag, next),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Adds `count` deposits to the slot of `epoch`. A deposit is never refused; one that would
    /// overflow its slot saturates, and one whose slot has moved on to a later epoch is dropped,
    /// which only lowers the balance.
    fn add_deposits(&self, epoch: u64, count: u64) {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        let _ = Self::add(
            &self.slots,
            epoch,
            self.deposit_amount.saturating_mul(count),
            false,
        );
    }

    /// Moves the pending deposits into a slot, after a clock reading in epoch `now`, and
    /// switches between exact and batch mode.
    ///
    /// - Exact mode: the pending deposits are being made now (each depositor flushes its own),
    ///   so they go to `now`'s slot. The streak counts the deposits since the reading epoch last
    ///   changed; at `BATCH`, the budget switches to batch mode.
    /// - Batch mode, dense traffic (`now` at most one epoch after the last reading): the batch
    ///   goes to `now`'s slot. Its deposits were made since the last reading, so they count at
    ///   most one slot late.
    /// - Batch mode, thin traffic (a longer gap): the batch goes to the slot of the last
    ///   reading, or nowhere if that has left the window, and the budget switches back to exact
    ///   mode. Its deposits were made no earlier than that, so they may leave early, never late.
    ///
    /// The compare-and-swap takes the count and sets the new reading at once, so every deposit
    /// is moved exactly once, and the deposits after it were made after this reading.
    fn flush(&self, now: u64) {
        let mut current = self.pending.load(Ordering::SeqCst);
        loop {
            let last = Pending::unpack(current);
            let now_tag = now.min(EPOCH_MAX);
            // A racing reader may have stored a later reading than ours: count from that.
            let reading = now_tag.max(last.epoch);
            let (into, next) = if !last.batch {
                let streak = if now_tag == last.epoch {
                    last.streak
                } else {
                    0
                };
                let streak = streak.saturating_add(last.count).min(BATCH);
                let next = Pending {
                    epoch: reading,
                    batch: streak >= BATCH,
                    streak: if streak >= BATCH { 0 } else { streak },
                    count: 0,
                };
                (Some(now), next)
            } else if now_tag <= last.epoch.saturating_add(1) {
                let next = Pending {
                    epoch: reading,
                    batch: true,
                    streak: 0,
                    count: 0,
                };
                (Some(now.max(last.epoch)), next)
            } else {
                // `last.epoch < now_tag <= now`: it is the full epoch, not a saturated one.
                let into = (now.saturating_sub(last.epoch) < RING).then_some(last.epoch);
                let next = Pending {
                    epoch: now_tag,
                    batch: false,
                    streak: 0,
                    count: 0,
                };
                (into, next)
            };
            let next = next.pack();
            if next == current {
                return;
            }
            match self.pending.compare_exchange_weak(
                current,
                next,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    if let (Some(epoch), 1..) = (into, last.count) {
                        self.add_deposits(epoch, last.count);
                    }
                    return;
                }
                Err(actual) => current = actual,
            }
        }
    }

    fn exhausted(&self, now: Instant, epoch: u64) -> BudgetExhausted {
        // Let the oldest slots leave the window one by one, until what is left allows a retry.
        let mut net: i64 = Self::window(epoch)
            .map(|e| Self::value_at(&self.slots, e))
            .sum();
        let mut spent: i64 = Self::window(epoch)
            .map(|e| Self::value_at(&self.spent, e))
            .sum();
        let mut oldest_first: Vec<u64> = Self::window(epoch).collect();
        oldest_first.reverse();
        for e in oldest_first {
            net = net.saturating_sub(Self::value_at(&self.slots, e));
            spent = spent.saturating_sub(Self::value_at(&self.spent, e));
            if net.max(self.reserve.saturating_sub(spent)) >= MILLI {
                // The slot of epoch `e` leaves the window when epoch `e + RING` begins.
                let expiry = e
                    .checked_add(RING)
                    .and_then(|n| n.checked_mul(self.slot_nanos))
                    .and_then(|nanos| self.start.checked_add(Duration::from_nanos(nanos)));
                return BudgetExhausted::new(expiry.map(|at| at.saturating_duration_since(now)));
            }
        }
        BudgetExhausted::new(None)
    }
}

impl RetryBudget for RatioBudget {
    fn describe(&self) -> crate::review::BudgetSettings {
        crate::review::BudgetSettings::Ratio {
            ratio: self.ratio,
            ttl: self.ttl,
            min_per_sec: self.min_per_sec,
        }
    }

    /// Earns `ratio` retries, for `ttl`. Under steady traffic, one atomic add: see the
    /// [type's docs](RatioBudget).
    fn deposit(&self) {
        if self.deposit_amount == 0 {
            return;
        }
        let before = Pending::unpack(self.pending.fetch_add(1, Ordering::SeqCst));
        // In batch mode, the deposit that completes a batch flushes it; if that flusher is slow,
        // the next one flushes at twice the size, and so on, so the count stays small.
        if before.batch && !(before.count + 1).is_multiple_of(BATCH) {
            return;
        }
        self.flush(self.epoch(clock()));
    }

    /// [`deposit`](RetryBudget::deposit) at `now`, without reading the clock. Always exact:
    /// it flushes the pending deposits, then adds to the slot of `now`.
    fn deposit_at(&self, now: Instant) {
        if self.deposit_amount > 0 {
            let epoch = self.epoch(now);
            if self.pending.load(Ordering::SeqCst) & COUNT_MASK != 0 {
                self.flush(epoch);
            }
            self.add_deposits(epoch, 1);
        }
    }

    /// Spends one retry, for `ttl`, or refuses if the window allows no more. The refusal says
    /// when the oldest amounts leave the window far enough to allow one, if that would happen
    /// without new first attempts.
    fn withdraw(&self) -> Result<(), BudgetExhausted> {
        let now = clock();
        let epoch = self.epoch(now);
        // Count every deposit made before this withdrawal.
        self.flush(epoch);
        let seen = self.withdrawals.load(Ordering::SeqCst);
        if self.balance(epoch) < MILLI {
            return Err(self.exhausted(now, epoch));
        }
        let Some(tag) = Self::add(&self.slots, epoch, -MILLI, true) else {
            return Err(BudgetExhausted::new(None));
        };
        let Some(spent_tag) = Self::add(&self.spent, epoch, MILLI, true) else {
            Self::undo(&self.slots, epoch, tag, -MILLI);
            return Err(BudgetExhausted::new(None));
        };
        // Another caller may have withdrawn at the same time. Whichever of the racing
        // withdrawals came last sees all of them, so re-checking after writing keeps the total
        // within the bound. A withdrawal that no other one overtook between its check and its
        // write (the counter moved only by itself) had a balance that stood: no second look.
        let raced = self.withdrawals.fetch_add(1, Ordering::SeqCst) != seen;
        let overdrawn = raced && self.balance(epoch) < 0;
        #[cfg(surely_loom)]
        let overdrawn = overdrawn && !mutation("ratio_no_recheck");
        if overdrawn {
            Self::undo(&self.slots, epoch, tag, -MILLI);
            Self::undo(&self.spent, epoch, spent_tag, MILLI);
            return Err(self.exhausted(now, epoch));
        }
        Ok(())
    }

    /// Does nothing: the ratio form counts attempts, not outcomes.
    fn record_outcome(&self, _class: AttemptClass) {}
}

impl Default for RatioBudget {
    /// [`RatioBudget::new`]: 10% of first attempts over 10 s, plus 10 retries a second.
    fn default() -> Self {
        RatioBudget::new()
    }
}

impl fmt::Debug for RatioBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RatioBudget")
            .field("ratio", &self.ratio)
            .field("ttl", &self.ttl)
            .field("min_per_sec", &self.min_per_sec)
            .field("available", &self.available())
            .finish()
    }
}

/// Builds a [`RatioBudget`]; made by [`RatioBudget::builder`]. Nothing is checked until
/// [`build`](RatioBudgetBuilder::build), which returns an error rather than panicking.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RatioBudgetBuilder {
    ratio: f64,
    ttl: Duration,
    min_per_sec: f64,
}

impl RatioBudgetBuilder {
    /// Retries allowed per first attempt: finite, from 0 to 1000. Default: 0.1 (one retry per
    /// ten first attempts). Kept to three decimal places, rounding down.
    /// Zero leaves only the reserve.
    pub fn ratio(mut self, ratio: f64) -> Self {
        self.ratio = ratio;
        self
    }

    /// How long a first attempt or a retry counts: from 1 to 60 seconds. Default: 10 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Retries a second allowed whatever the traffic, so that a client with few calls can
    /// still retry: finite and not negative. Default: 10 a second. The reserve
    /// is `min_per_sec × ttl` retries, spent and restored over the window like the rest.
    pub fn min_per_sec(mut self, min_per_sec: f64) -> Self {
        self.min_per_sec = min_per_sec;
        self
    }

    /// Validates the configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if the ratio is not a number from 0 to 1000, the window is shorter
    /// than 1 s or longer than 60 s, or the reserve is not a finite, non-negative number.
    ///
    /// ```
    /// use surely::budget::RatioBudget;
    ///
    /// let err = RatioBudget::builder().ratio(f64::NAN).build().unwrap_err();
    /// assert_eq!(err.to_string(), "invalid retry budget ratio: must be a finite number");
    /// ```
    pub fn build(self) -> Result<RatioBudget, ConfigError> {
        const RATIO: &str = "retry budget ratio";
        const MIN_PER_SEC: &str = "retry budget min_per_sec";
        if !self.ratio.is_finite() {
            return Err(ConfigError::new(RATIO, "must be a finite number"));
        }
        if !(0.0..=1000.0).contains(&self.ratio) {
            return Err(ConfigError::new(RATIO, "must be between 0 and 1000"));
        }
        if self.ttl < Duration::from_secs(1) || self.ttl > Duration::from_secs(60) {
            return Err(ConfigError::new(
                "retry budget ttl",
                "must be between 1 and 60 seconds",
            ));
        }
        if !self.min_per_sec.is_finite() {
            return Err(ConfigError::new(MIN_PER_SEC, "must be a finite number"));
        }
        if self.min_per_sec < 0.0 {
            return Err(ConfigError::new(MIN_PER_SEC, "must not be negative"));
        }
        Ok(RatioBudget::from_valid(
            self.ratio,
            self.ttl,
            self.min_per_sec,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        for value in [0, 1, -1, 1000, -1000, VALUE_MAX, VALUE_MIN] {
            for tag in [0, 1, TAG_MASK] {
                assert_eq!(unpack(pack(tag, value)), (tag, value));
            }
        }
    }

    #[test]
    fn pending_round_trips() {
        for epoch in [0, 1, EPOCH_MAX] {
            for batch in [false, true] {
                for streak in [0, 1, BATCH] {
                    for count in [0, 1, BATCH, COUNT_MASK] {
                        let p = Pending {
                            epoch,
                            batch,
                            streak,
                            count,
                        };
                        assert_eq!(Pending::unpack(p.pack()), p);
                    }
                }
            }
        }
    }

    /// The defaults `new` assembles without checking are the ones `build` accepts.
    #[tokio::test(start_paused = true)]
    async fn the_defaults_build() {
        let built = RatioBudget::builder().build().unwrap();
        let new = RatioBudget::new();
        assert_eq!(
            (
                built.ratio(),
                built.ttl(),
                built.min_per_sec(),
                built.available()
            ),
            (new.ratio(), new.ttl(), new.min_per_sec(), new.available())
        );
    }

    #[test]
    fn newer_wraps() {
        assert!(is_newer(1, 0));
        assert!(!is_newer(0, 1));
        assert!(!is_newer(5, 5));
        assert!(is_newer(0, TAG_MASK));
    }
}
