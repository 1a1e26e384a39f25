//! What a watched body and the record layers share: how the body ended, and the records
//! deferred to that end.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use http::{HeaderMap, Response};

use crate::classify::Classification;

/// How a watched body ended.
pub(crate) enum End<'a> {
    /// With these trailers, or with none.
    Trailers(Option<&'a HeaderMap>),
    /// With an error, after the response had started.
    Broken,
    /// Dropped by the caller before its end.
    Dropped,
}

impl End<'_> {
    fn to_owned(&self) -> OwnedEnd {
        match self {
            End::Trailers(t) => OwnedEnd::Trailers(t.cloned()),
            End::Broken => OwnedEnd::Broken,
            End::Dropped => OwnedEnd::Dropped,
        }
    }
}

/// An [`End`] kept for a deferral that comes after it.
enum OwnedEnd {
    Trailers(Option<HeaderMap>),
    Broken,
    Dropped,
}

impl OwnedEnd {
    fn borrow(&self) -> End<'_> {
        match self {
            OwnedEnd::Trailers(t) => End::Trailers(t.as_ref()),
            OwnedEnd::Broken => End::Broken,
            OwnedEnd::Dropped => End::Dropped,
        }
    }
}

/// How a deferred attempt settled: its number, its classification and whether the caller
/// dropped the body before its end.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settled {
    pub(crate) attempt: u32,
    pub(crate) classification: Classification,
    pub(crate) cancelled: bool,
}

type SettleAttempt = Box<dyn FnOnce(End<'_>) -> Settled + Send>;
type SettleCall = Box<dyn FnOnce(Settled) + Send>;

#[derive(Default)]
struct WatchState {
    /// The attempt record waiting for the end, and the call records to make after it.
    attempt: Option<SettleAttempt>,
    calls: Vec<SettleCall>,
    /// How the body ended, if it ended before the attempt deferred to it.
    ended: Option<OwnedEnd>,
    /// How the attempt settled, once it has.
    settled: Option<Settled>,
}

/// What a watched body and the record layers share: put in the response's extensions by the
/// transport, which keeps a clone in the body.
#[derive(Clone, Default)]
pub(crate) struct Watch(Arc<Mutex<WatchState>>);

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

/// Put in a request's extensions by an attempt record layer that would defer to the trailers:
/// the transport watches the response's body only when asked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WantsTrailers;

impl Watch {
    fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Defers an attempt record to the end of the body (at once if it has ended already).
    pub(crate) fn defer_attempt(&self, record: SettleAttempt) {
        let mut state = self.lock();
        match state.ended.take() {
            Some(end) => {
                drop(state);
                self.settle(record, end.borrow());
            }
            None => state.attempt = Some(record),
        }
    }

    /// Makes a call record after the deferred attempt's (at once if that has settled already).
    pub(crate) fn then_call(&self, record: SettleCall) {
        let mut state = self.lock();
        match state.settled {
            Some(settled) => {
                drop(state);
                record(settled);
            }
            None => state.calls.push(record),
        }
    }

    /// The body ended.
    pub(super) fn end(&self, end: End<'_>) {
        let mut state = self.lock();
        match state.attempt.take() {
            Some(record) => {
                drop(state);
                self.settle(record, end);
            }
            None if state.settled.is_none() && state.ended.is_none() => {
                state.ended = Some(end.to_owned());
            }
            None => {}
        }
    }

    /// Records the attempt, then its calls; the recorders run without the lock held.
    fn settle(&self, record: SettleAttempt, end: End<'_>) {
        let settled = record(end);
        let calls = {
            let mut state = self.lock();
            state.settled = Some(settled);
            std::mem::take(&mut state.calls)
        };
        for call in calls {
            call(settled);
        }
    }
}

/// Watches a response's body for its end when the request asked for it, and says so in the
/// response's extensions. `None` when not asked.
#[inline]
pub(crate) fn watch_response<B>(asked: bool, res: &mut Response<B>) -> Option<Watch> {
    if !asked {
        return None;
    }
    let watch = Watch::default();
    res.extensions_mut().insert(watch.clone());
    Some(watch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use crate::classify::AttemptClass;
    use http::HeaderMap;

    fn settled(attempt: u32, classification: Classification) -> Settled {
        Settled {
            attempt,
            classification,
            cancelled: false,
        }
    }

    #[test]
    fn an_end_before_the_deferral_settles_it_at_once() {
        let watch = Watch::default();
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("5"));
        watch.end(End::Trailers(Some(&trailers)));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        watch.defer_attempt(Box::new(move |end| {
            let status = match end {
                End::Trailers(Some(t)) => t["grpc-status"].to_str().unwrap().to_owned(),
                _ => "none".to_owned(),
            };
            s.lock().unwrap().push(status);
            settled(1, Classification::success())
        }));
        let s = seen.clone();
        watch.then_call(Box::new(move |settled| {
            s.lock()
                .unwrap()
                .push(format!("call after {}", settled.attempt));
        }));
        assert_eq!(*seen.lock().unwrap(), ["5", "call after 1"]);
    }

    #[test]
    fn the_first_end_counts_and_calls_follow_their_attempt() {
        let watch = Watch::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        let o = order.clone();
        watch.defer_attempt(Box::new(move |end| {
            o.lock().unwrap().push("attempt");
            assert!(matches!(end, End::Broken));
            settled(
                2,
                Classification::failure_at(crate::classify::DeliveryPhase::Sent),
            )
        }));
        let o = order.clone();
        watch.then_call(Box::new(move |settled| {
            assert_eq!(settled.classification.class(), AttemptClass::MaybeCommitted);
            o.lock().unwrap().push("call");
        }));
        watch.end(End::Broken);
        watch.end(End::Dropped);
        assert_eq!(*order.lock().unwrap(), ["attempt", "call"]);
    }
}
