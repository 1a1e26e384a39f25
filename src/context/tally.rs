//! How attempt records report to their call: a tally the call layer sets around each poll.

use std::cell::RefCell;

use http::HeaderValue;

use crate::classify::{Classification, OutcomeTally};
use crate::context::CallDeadline;
use crate::evidence::{BusinessKey, ResolutionRecord, RetryRecord};
use crate::Semantics;
use crate::StopReason;

thread_local! {
    /// The tally of the call being polled on this thread; `None` outside any call, and inside an
    /// attempt (a nested client there is not part of the call). Set and restored around
    /// synchronous code only, like the [`Context`](crate::context::Context).
    static TALLY: RefCell<Option<CallTally>> = const { RefCell::new(None) };
}

/// What the attempts of one call have shown so far.
#[derive(Clone, Debug)]
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
    pub(crate) deadline: Option<CallDeadline>,
    /// What few calls have (a key, a resolution, retries), boxed when one has it: the tally
    /// moves into and out of its thread-local around every poll of every layer, and a small
    /// one moves in registers where a large one is copied byte by byte.
    cold: Option<Box<ColdTally>>,
    /// The attempt, if any, whose record waits for the end of its response's body (its
    /// status is in the trailers): the call is recorded after it.
    pub(crate) deferred: Option<u32>,
    /// What the deferred attempt's head said, when the head says it all unless the body breaks
    /// off (HTTP): the class that stands if the body is dropped unread.
    pub(crate) deferred_head: Option<Classification>,
}

/// The tally's rarely set parts.
#[derive(Clone, Debug, Default)]
pub(crate) struct ColdTally {
    /// The call's idempotency key, as the key layer inside the call layer set it.
    pub(crate) key: Option<BusinessKey>,
    /// The `Idempotency-Key` the call's attempts carry.
    pub(crate) idempotency_key: Option<HeaderValue>,
    pub(crate) resolution: Option<ResolutionRecord>,
    /// The retries the retry layer inside decided.
    pub(crate) retries: Vec<RetryRecord>,
}

impl CallTally {
    /// The rarely set parts, made on first use.
    pub(crate) fn cold(&mut self) -> &mut ColdTally {
        self.cold.get_or_insert_with(Box::default)
    }

    /// What the call's record takes: the resolution, the key and the retries (the
    /// `Idempotency-Key` stays, for handing the outcome back).
    pub(crate) fn take_for_record(
        &mut self,
    ) -> (
        Option<ResolutionRecord>,
        Option<BusinessKey>,
        Vec<RetryRecord>,
    ) {
        match self.cold.as_mut() {
            Some(c) => (
                c.resolution.take(),
                c.key.take(),
                std::mem::take(&mut c.retries),
            ),
            None => (None, None, Vec::new()),
        }
    }

    /// The `Idempotency-Key` the call's attempts carry, taken.
    pub(crate) fn take_idempotency_key(&mut self) -> Option<HeaderValue> {
        self.cold.as_mut().and_then(|c| c.idempotency_key.take())
    }

    pub(crate) fn new(semantics: Semantics) -> Self {
        CallTally {
            started: 0,
            ended: 0,
            outcome: OutcomeTally::new(semantics),
            last: None,
            stop: None,
            deadline: None,
            cold: None,
            deferred: None,
            deferred_head: None,
        }
    }

    /// A key layer inside gave the call an idempotency key: the call is keyed from its first
    /// attempt on.
    pub(crate) fn keyed(&mut self, key: BusinessKey, header: HeaderValue, semantics: Semantics) {
        let cold = self.cold();
        cold.key.get_or_insert(key);
        cold.idempotency_key.get_or_insert(header);
        if self.outcome.outcome().is_none() {
            self.outcome = OutcomeTally::new(semantics);
        }
    }

    /// Runs `f` with this tally as the current one, and keeps what `f` added to it.
    pub(crate) fn scope<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let placeholder = CallTally::new(self.outcome.semantics());
        let current = std::mem::replace(self, placeholder);
        let (out, after) = swapped(Some(current), || {
            let out = f();
            (out, TALLY.with(|t| t.borrow_mut().take()))
        });
        if let Some(after) = after {
            *self = after;
        }
        out
    }

    /// Runs `f` outside any call: what it records belongs to no call of this thread's.
    pub(crate) fn isolate<R>(f: impl FnOnce() -> R) -> R {
        // Outside any call already (a server's handler, most of the time): nothing to move.
        if TALLY.with(|t| t.borrow().is_none()) {
            return f();
        }
        swapped(None, f)
    }

    /// The tally as it stands if the call ends now, its deferred attempt's body dropped unread:
    /// an HTTP head then says it all (a `503` that asked to wait stays *rejected, not
    /// processed*), and only an attempt still in flight is unknown.
    pub(crate) fn if_dropped_now(&self) -> CallTally {
        let mut tally = self.clone();
        if let (Some(attempt), Some(head)) = (tally.deferred, tally.deferred_head) {
            tally.observe(attempt, head);
        }
        tally
    }

    /// Updates the current call's tally in place, if a call layer is outside; returns what `f`
    /// returned.
    #[inline]
    pub(crate) fn update<R>(f: impl FnOnce(&mut CallTally) -> R) -> Option<R> {
        TALLY.with(|t| t.borrow_mut().as_mut().map(f))
    }

    /// Adds an ended attempt.
    pub(crate) fn observe(&mut self, attempt: u32, classification: Classification) {
        if self.deferred == Some(attempt) {
            self.deferred = None;
            self.deferred_head = None;
        }
        self.ended = self.ended.max(attempt);
        self.outcome.observe(classification.class());
        self.last = Some(classification);
    }
}

/// Runs `f` with `tally` as the current one, restoring the one before afterwards (also on
/// unwind).
fn swapped<R>(tally: Option<CallTally>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<CallTally>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = self.0.take();
            TALLY.with(|t| *t.borrow_mut() = old);
        }
    }
    let old = TALLY.with(|t| t.replace(tally));
    let _restore = Restore(old);
    f()
}
