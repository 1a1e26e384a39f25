//! The copy of an inner service that a layer's calls share, from which each attempt after the
//! first (a retry, a hedge) clones the service it is sent through. The design is in
//! [`docs::retries`](crate::docs::retries).
//!
//! A call's future holds the copy's `Arc`, not a clone of the inner service, so a transport as
//! large as hyper-util's client is neither cloned nor moved with every call. The copy is behind
//! a lock taken only to clone it, so that a call's future is `Send` whenever the inner service
//! is, `Sync` or not (tower's `BoxCloneService` is not).

use std::sync::{Arc, Mutex, PoisonError};

/// The shared copy of an inner service.
pub(crate) struct Spare<S>(Mutex<S>);

impl<S: Clone> Spare<S> {
    /// A copy of `service`.
    pub(crate) fn of(service: &S) -> Self {
        Spare(Mutex::new(service.clone()))
    }

    /// A clone of the copy: a service of the attempt's own, to make ready and call. A clone that
    /// panicked under the lock left the copy as it was, so a poisoned lock is taken as it is.
    pub(crate) fn service(&self) -> S {
        S::clone(&self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// What a layer's service shares with its calls' futures (one `Arc` a call): the layer's
/// settings `C`, and the copy of the inner service each later attempt is cloned from.
pub(crate) struct Shared<S, C> {
    pub(crate) service: Spare<S>,
    pub(crate) config: Arc<C>,
}

#[cfg(test)]
mod tests {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A service whose next clone panics while `panic_next` is set.
    struct Fragile {
        panic_next: Arc<AtomicBool>,
        label: u32,
    }

    impl Clone for Fragile {
        fn clone(&self) -> Self {
            assert!(
                !self.panic_next.swap(false, Ordering::SeqCst),
                "the clone fails"
            );
            Fragile {
                panic_next: self.panic_next.clone(),
                label: self.label,
            }
        }
    }

    #[test]
    fn a_clone_that_panicked_under_the_lock_leaves_the_copy_usable() {
        let panic_next = Arc::new(AtomicBool::new(false));
        let spare = Spare::of(&Fragile {
            panic_next: panic_next.clone(),
            label: 7,
        });
        panic_next.store(true, Ordering::SeqCst);
        assert!(catch_unwind(AssertUnwindSafe(|| spare.service())).is_err());
        // The lock is poisoned; the copy is as it was, and the next attempt gets its clone.
        assert!(spare.0.is_poisoned());
        assert_eq!(spare.service().label, 7);
    }
}
