//! The call context: what outer layers tell inner ones, and what inner layers report back,
//! without touching the request.
//!
//! Inward, a deadline layer, a call record layer and the server deadline layer set a [`Context`]
//! while their inner service's `call` and each poll of its future run. Inner layers, and client
//! stacks called inside a server handler, read it.
//!
//! Outward, during one poll, timing layers leave a [`Report`]: the clock reading they took (so
//! that an outer layer need not read the clock again) and the instant by which they will end
//! the call themselves (so that an outer deadline layer need not arm a second timer).
//!
//! Both live in thread-local cells that are set and restored around synchronous code only (a
//! `call`, a `poll`), so a value never outlives the poll that set it, whatever thread the task
//! runs on next. This costs no allocation and works for any request type.

use std::cell::{Cell, RefCell};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

use crate::ids::CallId;
use crate::outcome::CallOutcome;
use crate::time::Deadline;

mod tally;

pub(crate) use self::tally::CallTally;

thread_local! {
    // The inward context and the outward report, one scalar per cell: they are read and written
    // around every poll of several layers, and whole-word loads and stores of scalars are what
    // the processor forwards best.
    /// [`Context::deadline`], packed.
    static DEADLINE: Cell<u64> = const { Cell::new(0) };
    /// [`Context::call`], 0 for none.
    static CALL: Cell<u64> = const { Cell::new(0) };
    /// [`Report::now`].
    static NOW: Cell<u64> = const { Cell::new(0) };
    /// [`Report::ends_by`].
    static ENDS_BY: Cell<u64> = const { Cell::new(0) };
}

/// Puts a context in the cells and returns the one it replaced.
#[inline]
fn swap_context(ctx: Context) -> Context {
    Context {
        deadline: DEADLINE.with(|c| c.replace(ctx.deadline)),
        call: CallId::from_raw(CALL.with(|c| c.replace(ctx.call.map_or(0, CallId::get)))),
    }
}

/// Puts a report in the cells and returns the one it replaced.
#[inline]
fn swap_report(report: Report) -> Report {
    Report {
        now: NOW.with(|c| c.replace(report.now)),
        ends_by: ENDS_BY.with(|c| c.replace(report.ends_by)),
    }
}

/// A call's deadline as the layers pass it on: an instant, or a budget whose clock has not been
/// read yet.
///
/// A deadline layer with a budget of its own does not read the clock when it is called: most
/// calls answer on their first poll, and for them the instant never matters. The first layer
/// that needs the instant (an attempt timeout arming its timer, the deadline layer itself when
/// the call first waits, a nested client) anchors the budget at the time it reads the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallDeadline {
    /// A fixed instant.
    At(Deadline),
    /// This much budget from now; "now" is read when first needed.
    Budget(Duration),
}

impl CallDeadline {
    /// The instant, taking `now` as the start of an unanchored budget.
    pub(crate) fn anchor(self, now: Instant) -> Deadline {
        match self {
            CallDeadline::At(d) => d,
            CallDeadline::Budget(b) => Deadline::after_from(now, b),
        }
    }

    /// The fixed instant, if the budget has been anchored.
    pub(crate) fn fixed(self) -> Option<Deadline> {
        match self {
            CallDeadline::At(d) => Some(d),
            CallDeadline::Budget(_) => None,
        }
    }
}

/// Puts a context back when dropped, also on unwind.
struct RestoreContext(Context);

impl Drop for RestoreContext {
    #[inline]
    fn drop(&mut self) {
        swap_context(self.0);
    }
}

/// Puts a context back when dropped, also on unwind, and merges the report made meanwhile
/// into the one made before (kept here): the first clock reading, the earliest end.
struct RestoreMerging(Context, Report);

impl Drop for RestoreMerging {
    #[inline]
    fn drop(&mut self) {
        swap_context(self.0);
        let before = self.1;
        if before.now != 0 {
            NOW.with(|c| c.set(before.now));
        }
        ENDS_BY.with(|c| c.set(earliest_packed(before.ends_by, c.get())));
    }
}

/// What is known about the call being made on this thread's current poll.
///
/// Kept to 16 bytes (the deadline packed into a `u64`), because it is copied in and out of its
/// cell around every poll of every layer that sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Context {
    /// The call's deadline, packed (see [`pack_deadline`]).
    deadline: u64,
    /// The logical call the code running now belongs to.
    pub(crate) call: Option<CallId>,
}

impl Context {
    #[cfg(any(test, feature = "server"))]
    const EMPTY: Context = Context {
        deadline: 0,
        call: None,
    };

    /// The call's deadline.
    #[inline]
    pub(crate) fn deadline(&self) -> Option<CallDeadline> {
        unpack_deadline(self.deadline & !OWNED)
    }

    /// Whether there is a deadline, without unpacking it.
    #[inline]
    pub(crate) fn has_deadline(&self) -> bool {
        self.deadline & !OWNED != 0
    }

    /// Sets the call's deadline.
    #[inline]
    pub(crate) fn set_deadline(&mut self, deadline: Option<CallDeadline>) {
        self.deadline = pack_deadline(deadline) | (self.deadline & OWNED);
    }

    /// Anchors an unanchored budget at `now`, both packed, and returns the packed instant of the
    /// deadline (`None` without one). Packing is linear in time, so this is an addition.
    #[inline]
    pub(crate) fn anchor_packed(&mut self, now: u64) -> Option<u64> {
        let owned = self.deadline & OWNED;
        match self.deadline & !OWNED {
            0 => None,
            p if p & BUDGET != 0 => {
                let at = now.saturating_add(p & !BUDGET).min(OWNED - 1);
                self.deadline = at | owned;
                Some(at)
            }
            p => Some(p),
        }
    }

    /// Whether a retry layer upstream (in the client that sent the request this code serves)
    /// owns retries for this call.
    #[inline]
    pub(crate) fn retry_owned(&self) -> bool {
        self.deadline & OWNED != 0
    }

    /// Marks that a retry layer upstream owns retries for this call.
    #[inline]
    #[cfg(feature = "server")]
    pub(crate) fn set_retry_owned(&mut self, owned: bool) {
        if owned {
            self.deadline |= OWNED;
        } else {
            self.deadline &= !OWNED;
        }
    }

    /// The current context, or the empty one.
    #[inline]
    pub(crate) fn current() -> Context {
        Context {
            deadline: DEADLINE.with(Cell::get),
            call: CallId::from_raw(CALL.with(Cell::get)),
        }
    }

    /// Runs `f` with this context as the current one. What the layers inside `f` report goes
    /// on outward, as if this scope were not there.
    #[inline]
    pub(crate) fn scope<R>(self, f: impl FnOnce() -> R) -> R {
        let _restore = RestoreContext(swap_context(self));
        f()
    }

    /// Runs `f` with this context as the current one and an empty report, and returns what
    /// the layers inside `f` reported. Their report also goes on outward, merged into the
    /// report of the layers around, as through [`scope`](Self::scope).
    #[inline]
    pub(crate) fn scope_collect<R>(self, f: impl FnOnce() -> R) -> (R, Report) {
        let restore = RestoreMerging(swap_context(self), swap_report(Report::EMPTY));
        let out = f();
        let inside = Report {
            now: NOW.with(Cell::get),
            ends_by: ENDS_BY.with(Cell::get),
        };
        drop(restore);
        (out, inside)
    }

    #[cfg(feature = "server")]
    /// An empty context with this deadline.
    pub(crate) fn fresh(deadline: Option<CallDeadline>) -> Context {
        Context {
            deadline: pack_deadline(deadline),
            ..Context::EMPTY
        }
    }
}

/// What the layers inside left for the layers outside during one poll: instants packed as in
/// [`pack_instant`], zero for none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    now: u64,
    ends_by: u64,
}

impl Report {
    const EMPTY: Report = Report { now: 0, ends_by: 0 };

    /// A report: a clock reading taken during this poll, and the earliest instant by which a
    /// layer inside will end the call (return) by itself.
    #[inline]
    pub(crate) fn new(now: Option<Instant>, ends_by: Option<Instant>) -> Report {
        Report {
            now: now.map_or(0, pack_instant),
            ends_by: ends_by.map_or(0, pack_instant),
        }
    }

    /// A report of a clock reading `now` and a layer that ends the call `after` it, packing the
    /// clock once.
    #[inline]
    pub(crate) fn after(now: Instant, after: Duration) -> Report {
        let now_packed = pack_instant(now);
        Report {
            now: now_packed,
            ends_by: now_packed
                .saturating_add(saturating_nanos(after))
                .min(OWNED - 1),
        }
    }

    /// The clock reading and the end, packed, when a layer inside reported both.
    #[inline]
    pub(crate) fn packed(&self) -> Option<(u64, u64)> {
        (self.now != 0 && self.ends_by != 0).then_some((self.now, self.ends_by))
    }

    /// The clock reading, if a layer inside took one.
    #[inline]
    pub(crate) fn now(&self) -> Option<Instant> {
        (self.now != 0).then(|| unpack_instant(self.now))
    }

    /// When a layer inside will end the call by itself, if one will.
    #[inline]
    pub(crate) fn ends_by(&self) -> Option<Instant> {
        (self.ends_by != 0).then(|| unpack_instant(self.ends_by))
    }

    /// Adds to the current poll's report: the first clock reading is kept, the earliest end.
    #[inline]
    pub(crate) fn publish(report: Report) {
        if report == Report::EMPTY {
            return;
        }
        NOW.with(|c| {
            if c.get() == 0 {
                c.set(report.now);
            }
        });
        ENDS_BY.with(|c| c.set(earliest_packed(c.get(), report.ends_by)));
    }
}

/// The earlier of two packed instants, 0 meaning none.
#[inline]
fn earliest_packed(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, b) => b,
        (a, 0) => a,
        (a, b) => a.min(b),
    }
}

/// The flag of a packed deadline that is a budget, not an instant.
const BUDGET: u64 = 1 << 63;

/// The flag, beside the packed deadline, that a retry layer upstream owns retries. Packed values
/// stay below it.
const OWNED: u64 = 1 << 62;

/// Packs a deadline into a `u64`: 0 for none, a budget in nanoseconds with the top bit set, an
/// instant as [`pack_instant`] does; the bit below the top one is left for [`OWNED`]. Budgets and instants are clamped far beyond any deadline the
/// crate makes (about 30 years).
#[inline]
fn pack_deadline(deadline: Option<CallDeadline>) -> u64 {
    match deadline {
        None => 0,
        Some(CallDeadline::Budget(b)) => BUDGET | saturating_nanos(b).min(OWNED - 1),
        Some(CallDeadline::At(d)) => pack_instant(d.instant()),
    }
}

#[inline]
fn unpack_deadline(packed: u64) -> Option<CallDeadline> {
    match packed {
        0 => None,
        p if p & BUDGET != 0 => Some(CallDeadline::Budget(Duration::from_nanos(p & !BUDGET))),
        p => Some(CallDeadline::At(Deadline::at(unpack_instant(p)))),
    }
}

/// The instants of this process are counted in nanoseconds from an epoch a day before the first
/// one was packed; an instant before the epoch is packed as the epoch (only deadlines long past
/// are that old, and the past is the past).
#[inline]
fn epoch() -> std::time::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let now = std::time::Instant::now();
        now.checked_sub(Duration::from_secs(24 * 3600))
            .unwrap_or(now)
    })
}

/// The latest instant packed: a century after the epoch, far beyond any deadline.
const CENTURY_NANOS: u64 = 100 * 365 * 24 * 3600 * 1_000_000_000;

/// Packs an instant as 1 + nanoseconds since the epoch (never 0, never the budget flag).
#[inline]
fn pack_instant(at: Instant) -> u64 {
    let since = at.into_std().saturating_duration_since(epoch());
    saturating_nanos(since).min(CENTURY_NANOS).saturating_add(1)
}

#[inline]
fn unpack_instant(packed: u64) -> Instant {
    let (epoch, since) = (
        Instant::from_std(epoch()),
        Duration::from_nanos(packed.saturating_sub(1)),
    );
    // At most a century after the epoch (`pack_instant` clamps), which the clock holds; were
    // it not to, the far future of `time::later` still lies ahead.
    epoch
        .checked_add(since)
        .unwrap_or_else(|| crate::time::later(epoch, since))
}

#[inline]
fn saturating_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_pack_and_unpack() {
        let now = Instant::now();
        let cases = [
            None,
            Some(CallDeadline::Budget(Duration::ZERO)),
            Some(CallDeadline::Budget(Duration::from_millis(1500))),
            Some(CallDeadline::At(Deadline::at(now))),
            Some(CallDeadline::At(Deadline::after_from(
                now,
                Duration::from_secs(3600),
            ))),
        ];
        for d in cases {
            assert_eq!(unpack_deadline(pack_deadline(d)), d, "{d:?}");
        }
    }

    #[test]
    fn extremes_are_clamped_not_wrapped() {
        // A budget beyond the packed range stays a budget, and a huge one.
        let huge = unpack_deadline(pack_deadline(Some(CallDeadline::Budget(Duration::MAX))));
        assert!(
            matches!(huge, Some(CallDeadline::Budget(b)) if b > Duration::from_secs(100 * 365 * 24 * 3600))
        );
        // An instant long before the epoch is packed as the epoch: still in the past.
        let now = Instant::now();
        let long_ago = now
            .checked_sub(Duration::from_secs(7 * 24 * 3600))
            .unwrap_or(now);
        let packed = unpack_deadline(pack_deadline(Some(CallDeadline::At(Deadline::at(
            long_ago,
        )))));
        assert!(matches!(packed, Some(CallDeadline::At(d)) if d.instant() <= now));
    }

    #[test]
    fn reports_merge_the_first_reading_and_the_earliest_end_on_their_way_out() {
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        let (_, report) = Context::current().scope_collect(|| {
            Report::publish(Report::new(Some(now), Some(later)));
            Report::publish(Report::new(Some(later), Some(now)));
        });
        assert_eq!(report.now(), Some(now));
        assert_eq!(report.ends_by(), Some(now));
        // A scope inside lets reports through.
        let (_, through) = Context::current().scope_collect(|| {
            Context::fresh(None).scope(|| Report::publish(Report::new(Some(later), Some(later))));
        });
        assert_eq!(through.ends_by(), Some(later));
        // A collecting scope inside sees only what is reported inside it, and passes it on
        // outward, merged: the first reading, the earliest end.
        let (inner, outer) = Context::current().scope_collect(|| {
            Report::publish(Report::new(Some(now), Some(later)));
            let ((), inner) = Context::current().scope_collect(|| {
                Report::publish(Report::new(Some(later), Some(now)));
            });
            inner
        });
        assert_eq!((inner.now(), inner.ends_by()), (Some(later), Some(now)));
        assert_eq!((outer.now(), outer.ends_by()), (Some(now), Some(now)));
        // A collecting scope starts empty, whatever was reported before it.
        let (_, fresh) = Context::current().scope_collect(|| ());
        assert_eq!(fresh, Report::EMPTY);
    }

    #[test]
    fn the_owner_flag_survives_deadline_changes() {
        let mut ctx = Context::fresh(Some(CallDeadline::Budget(Duration::from_secs(1))));
        ctx.set_retry_owned(true);
        assert_eq!(
            ctx.deadline(),
            Some(CallDeadline::Budget(Duration::from_secs(1)))
        );
        let now = pack_instant(Instant::now());
        let at = ctx.anchor_packed(now).unwrap();
        assert!(ctx.retry_owned());
        assert_eq!(at, now + 1_000_000_000);
        ctx.set_deadline(None);
        assert!(ctx.retry_owned());
        assert_eq!(ctx.deadline(), None);
        ctx.set_retry_owned(false);
        assert_eq!(ctx, Context::EMPTY);
    }

    #[test]
    fn scopes_restore_on_unwind() {
        let ctx = Context::fresh(Some(CallDeadline::Budget(Duration::from_secs(1))));
        let result = std::panic::catch_unwind(|| ctx.scope(|| panic!("inside")));
        assert!(result.is_err());
        assert_eq!(Context::current(), Context::EMPTY);
    }
}

pin_project_lite::pin_project! {
    /// A future that keeps the call context and the `tracing` span it was made in, whatever
    /// task polls it: for work moved onto a task of its own (a handler that must outlive its
    /// caller), which would otherwise lose the deadline its caller gave it.
    pub(crate) struct InContext<F> {
        #[pin]
        inner: F,
        ctx: Context,
        span: tracing::Span,
    }
}

impl<F> InContext<F> {
    #[cfg(feature = "server")]
    /// `inner`, in `ctx` and `span`.
    pub(crate) fn with(inner: F, ctx: Context, span: tracing::Span) -> Self {
        InContext { inner, ctx, span }
    }
}

impl<F: std::future::Future> std::future::Future for InContext<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        let (ctx, inner) = (*this.ctx, this.inner);
        CallTally::isolate(|| ctx.scope(|| inner.poll(cx)))
    }
}

thread_local! {
    /// The hedge mark, call-scoped state of the hedge layer read by the attempt record layer:
    /// set while the hedge layer calls its inner service for a hedge, so that an attempt record
    /// layer inside marks the attempt. Works for any request type and allocates nothing.
    static HEDGE_MARK: Cell<bool> = const { Cell::new(false) };
}

/// Whether the inner `call` running now is a hedge; clears the mark, so that a client nested
/// inside the attempt does not see it.
pub(crate) fn take_hedge_mark() -> bool {
    HEDGE_MARK.with(|m| m.replace(false))
}

/// Runs `f` (an inner `call`) marked as a hedge.
pub(crate) fn as_hedge<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = self.0;
            HEDGE_MARK.with(|m| m.set(old));
        }
    }
    let _restore = Restore(HEDGE_MARK.with(|m| m.replace(true)));
    f()
}

thread_local! {
    /// The lender of the attempt being made: the id of the retry budget of the retry layer
    /// whose inner `call` runs now (0 for none), so that a hedge layer inside that was given no
    /// budget of its own pays from the retry layer's. An id, not the budget, so that lending
    /// costs a retry layer two stores and no reference count.
    static LENDER: Cell<u64> = const { Cell::new(0) };
}

/// Lends the budget registered as `lender` to the inner `call`s made while the returned guard
/// lives; the lender before is back when it is dropped.
#[inline]
pub(crate) fn lend(lender: u64) -> Lending {
    Lending(LENDER.with(|c| c.replace(lender)))
}

/// The lender before a [`lend`], put back when dropped (also on unwind).
pub(crate) struct Lending(u64);

impl Drop for Lending {
    #[inline]
    fn drop(&mut self) {
        let before = self.0;
        LENDER.with(|c| c.set(before));
    }
}

/// The id of the budget a retry layer around the `call` running now lends its attempts; 0 for
/// none. Taken: a client nested inside the attempt does not see it.
#[inline]
pub(crate) fn take_lender() -> u64 {
    LENDER.with(|c| c.replace(0))
}

thread_local! {
    /// The outcome of a call future dropped before it ended, left for the layer that dropped
    /// it (a deadline layer that cut the call short) to hand back with its own error. Set and
    /// taken around synchronous code only: the drop runs inside the dropping layer's poll.
    static LEFT_BEHIND: RefCell<Option<CallOutcome>> = const { RefCell::new(None) };
}

/// Leaves the outcome of a call dropped before it ended, unless one is there already: drop
/// order runs an outer future's drop before those of the futures it owns, so the first one
/// left is the outermost call's.
pub(crate) fn leave_behind(f: impl FnOnce() -> CallOutcome) {
    LEFT_BEHIND.with(|cell| {
        if let Ok(mut slot) = cell.try_borrow_mut()
            && slot.is_none()
        {
            *slot = Some(f());
        }
    });
}

/// Takes the outcome a dropped call left behind, if any.
pub(crate) fn take_left_behind() -> Option<CallOutcome> {
    LEFT_BEHIND.with(|cell| cell.try_borrow_mut().ok().and_then(|mut slot| slot.take()))
}

/// What is left of the current call's deadline: all of a budget whose clock has not started,
/// the time to an instant otherwise.
pub(crate) fn budget_left_now() -> Option<Duration> {
    match Context::current().deadline()? {
        CallDeadline::Budget(b) => Some(b),
        CallDeadline::At(d) => Some(d.remaining_at(Instant::now())),
    }
}
