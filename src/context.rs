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

use std::cell::Cell;
use std::time::Duration;

use tokio::time::Instant;

use crate::deadline::Deadline;
use crate::record::CallId;

thread_local! {
    /// The inward context and the outward report, in one cell: a deadline layer sets the first
    /// and collects the second around each poll, in one go.
    static STATE: Cell<State> = const { Cell::new(State::EMPTY) };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    ctx: Context,
    report: Report,
}

impl State {
    const EMPTY: State = State {
        ctx: Context::EMPTY,
        report: Report::EMPTY,
    };
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

/// Restores a thread-local cell when dropped, also on unwind.
struct Restore<T: Copy + 'static> {
    key: &'static std::thread::LocalKey<Cell<T>>,
    old: T,
}

impl<T: Copy + 'static> Drop for Restore<T> {
    fn drop(&mut self) {
        let old = self.old;
        self.key.with(|c| c.set(old));
    }
}

#[inline]
fn scoped<T: Copy + 'static, R>(
    key: &'static std::thread::LocalKey<Cell<T>>,
    value: T,
    f: impl FnOnce() -> R,
) -> R {
    let old = key.with(|c| c.replace(value));
    let _restore = Restore { key, old };
    f()
}

/// What is known about the call being made on this thread's current poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Context {
    /// The call's deadline.
    pub(crate) deadline: Option<CallDeadline>,
    /// The logical call the code running now belongs to.
    pub(crate) call: Option<CallId>,
}

impl Context {
    const EMPTY: Context = Context {
        deadline: None,
        call: None,
    };

    /// The current context, or the empty one.
    #[inline]
    pub(crate) fn current() -> Context {
        STATE.with(|s| s.get().ctx)
    }

    /// Runs `f` with this context as the current one.
    #[inline]
    pub(crate) fn scope<R>(self, f: impl FnOnce() -> R) -> R {
        let old = STATE.with(|s| {
            let old = s.get();
            s.set(State { ctx: self, ..old });
            old
        });
        let _restore = Restore { key: &STATE, old };
        f()
    }

    /// Runs `f` with this context as the current one and an empty report, and returns what
    /// the layers inside `f` reported; the report of the layers around is left as it was.
    #[inline]
    pub(crate) fn scope_collect<R>(self, f: impl FnOnce() -> R) -> (R, Report) {
        scoped(
            &STATE,
            State {
                ctx: self,
                report: Report::EMPTY,
            },
            || {
                let out = f();
                (out, STATE.with(|s| s.get().report))
            },
        )
    }

    /// An empty context with this one's deadline.
    pub(crate) fn fresh(deadline: Option<CallDeadline>) -> Context {
        Context {
            deadline,
            ..Context::EMPTY
        }
    }
}

/// What the layers inside left for the layers outside during one poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    /// A clock reading taken during this poll.
    pub(crate) now: Option<Instant>,
    /// The earliest instant by which a layer inside will end the call (return) by itself.
    pub(crate) ends_by: Option<Instant>,
}

impl Report {
    const EMPTY: Report = Report {
        now: None,
        ends_by: None,
    };

    /// Adds to the current poll's report: the first clock reading is kept, the earliest end.
    #[inline]
    pub(crate) fn publish(report: Report) {
        if report == Report::EMPTY {
            return;
        }
        STATE.with(|c| {
            let mut state = c.get();
            let old = state.report;
            state.report = Report {
                now: old.now.or(report.now),
                ends_by: match (old.ends_by, report.ends_by) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
            };
            c.set(state);
        });
    }
}
