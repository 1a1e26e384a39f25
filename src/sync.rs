//! The primitives of the state that calls share, in one place, so that a model checker can
//! stand in for them.
//!
//! The breaker's state word and window, the budgets' counters and the memory store's shards
//! take their atomics, their mutex and their clock from here. In a normal build these are
//! `std`'s atomics and mutex and tokio's clock, re-exported as they are: the code compiles to
//! what it did before.
//!
//! Built with `RUSTFLAGS="--cfg surely_loom"` (only the `loom` test target is:
//! `scripts/loom.sh`), they are [loom](https://docs.rs/loom)'s, whose `loom::model` runs a test
//! under every interleaving of its threads that matters, and the clock is one the model moves
//! by hand ([`advance_clock`](model::advance_clock)), so that an execution replays exactly: a
//! real clock would let two runs of the same interleaving take different branches. tokio does
//! the same with its own `loom` module.
//!
//! The switch is `surely_loom`, not tokio's `loom`: `RUSTFLAGS` reach every crate of the build,
//! and tokio built with `cfg(loom)` leaves out `tokio::net`, which hyper-util (a
//! dev-dependency, so part of every test target) needs.

/// The server's memory store counts its records with it.
#[cfg(all(not(surely_loom), feature = "server"))]
pub(crate) use std::sync::atomic::AtomicUsize;
#[cfg(not(surely_loom))]
pub(crate) use std::sync::{
    atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicU8},
    Mutex, MutexGuard,
};

#[cfg(all(surely_loom, feature = "server"))]
pub(crate) use ::loom::sync::atomic::AtomicUsize;
#[cfg(surely_loom)]
pub(crate) use ::loom::sync::{
    atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicU8},
    Mutex, MutexGuard,
};

/// The time now: tokio's clock (which tests can pause and advance), or under `loom` the
/// model's.
#[cfg(not(surely_loom))]
#[inline]
pub(crate) fn now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

#[cfg(surely_loom)]
pub(crate) use self::model::now;

#[cfg(surely_loom)]
pub(crate) use self::model::mutation;

/// What only a `loom` build has: the model's clock and the mutation switch.
#[cfg(surely_loom)]
pub mod model {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::Duration;

    use tokio::time::Instant;

    /// A clock that stands still until the model moves it. One per execution of a model
    /// (loom's `lazy_static` starts it afresh each time), read through a `std` atomic: the
    /// clock is not part of what is checked, so reading it adds no interleaving. A model
    /// moves it between steps, from one thread, never in a race with its threads.
    struct Clock {
        start: Instant,
        elapsed_nanos: AtomicU64,
    }

    ::loom::lazy_static! {
        static ref CLOCK: Clock = Clock {
            start: Instant::from_std(std::time::Instant::now()),
            elapsed_nanos: AtomicU64::new(0),
        };
    }

    /// The model's time now.
    pub(crate) fn now() -> Instant {
        let clock = &*CLOCK;
        clock.start + Duration::from_nanos(clock.elapsed_nanos.load(Ordering::SeqCst))
    }

    /// Moves the model's clock forward by `by`. Call it inside `loom::model`, between steps.
    pub fn advance_clock(by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let clock = &*CLOCK;
        let _ = clock
            .elapsed_nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |e| {
                Some(e.saturating_add(nanos))
            });
    }

    /// Whether the deliberate mutation `name` is switched on: `SURELY_LOOM_MUTATION` names it
    /// (read once per process). A mutation breaks one guarantee on purpose, so that a test can
    /// show that the model of that guarantee finds the counterexample. Each mutation is code
    /// under `cfg(surely_loom)` beside what it breaks: a normal build has none of it.
    pub(crate) fn mutation(name: &str) -> bool {
        static ON: OnceLock<Option<String>> = OnceLock::new();
        ON.get_or_init(|| std::env::var("SURELY_LOOM_MUTATION").ok())
            .as_deref()
            == Some(name)
    }
}
