//! How attempt records report to their call: a task-local tally scoped by the call layer.

use std::cell::Cell;

use crate::classify::{Classification, OutcomeTally};
use crate::deadline::Deadline;
use crate::record::StopReason;
use crate::Semantics;

tokio::task_local! {
    /// `None` inside an attempt: a nested client there is not part of this call.
    static TALLY: Cell<Option<CallTally>>;
}

/// What the attempts of one call have shown so far.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallTally {
    /// Attempts started.
    pub(crate) started: u32,
    /// The highest attempt number that ended.
    pub(crate) ended: u32,
    pub(crate) outcome: OutcomeTally,
    pub(crate) last: Option<Classification>,
    /// Set by a layer that stopped the call for its own reason.
    pub(crate) stop: Option<StopReason>,
    /// The call's deadline, as the deadline layer inside the call layer set it.
    pub(crate) deadline: Option<Deadline>,
}

impl CallTally {
    pub(crate) fn new(semantics: Semantics) -> Self {
        CallTally {
            started: 0,
            ended: 0,
            outcome: OutcomeTally::new(semantics),
            last: None,
            stop: None,
            deadline: None,
        }
    }

    /// Runs `f` with this tally as the current one, and keeps what `f` added to it.
    pub(crate) fn scope<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let (out, after) = TALLY.sync_scope(Cell::new(Some(*self)), || {
            let out = f();
            (out, TALLY.with(Cell::get))
        });
        if let Some(after) = after {
            *self = after;
        }
        out
    }

    /// Runs `f` outside any call: what it records belongs to no call of this task's.
    pub(crate) fn isolate<R>(f: impl FnOnce() -> R) -> R {
        TALLY.sync_scope(Cell::new(None), f)
    }

    /// Updates the current call's tally, if a call layer is outside; returns what `f` returned.
    pub(crate) fn update<R>(f: impl FnOnce(&mut CallTally) -> R) -> Option<R> {
        TALLY
            .try_with(|cell| {
                let mut tally = cell.get()?;
                let out = f(&mut tally);
                cell.set(Some(tally));
                Some(out)
            })
            .ok()
            .flatten()
    }

    /// Adds an ended attempt.
    pub(crate) fn observe(&mut self, attempt: u32, classification: Classification) {
        self.ended = self.ended.max(attempt);
        self.outcome.observe(classification.class());
        self.last = Some(classification);
    }
}
