//! The leased work queue (private): the claim, the lease, the fence, the waits, the manual state
//! and the sweep that the [UNKNOWN ledger](crate::ledger), the
//! [reconciliation differences](crate::reconcile) and the [outbox](crate::outbox) share,
//! written once, in memory ([`MemoryQueue`]) and on PostgreSQL (`Table`, feature `postgres`).
//!
//! Each of those components keeps work that someone must finish: an unknown call to settle, a
//! difference to repair, an event to publish. Several workers may run over one store (one per
//! instance), any of them may pause or die holding work, and the store must still hand each
//! item to one worker at a time and keep a late worker from undoing a newer one's work. That is
//! this module's protocol; the component supplies what differs: its [states](States), its
//! payload (memory) or its columns and their order (PostgreSQL), and what a worker writes.
//!
//! What the queue promises, in memory and on PostgreSQL alike:
//!
//! * **One holder per item at a time.** A claim takes the oldest due items (in the
//!   component's order), moves each to its claimed state, raises its **fence** by one and
//!   gives the claimer that number. On PostgreSQL the claim locks the rows it takes with
//!   `FOR UPDATE SKIP LOCKED`: two claims never wait on each other nor take the same item.
//! * **A lease that passes.** A claimed item is held until its lease ends; after that it is
//!   due again, and the next claim takes it, with a higher fence. A worker that died gives its
//!   items back this way.
//! * **A fence that refuses a late holder.** Every write a holder makes (settle, retry later,
//!   park in the manual state) applies only while the item is in the claimed state with the
//!   holder's fence: once the item was claimed again, released, or settled, the write changes
//!   nothing, and the component says why (stale, already settled, gone). A write by a person
//!   ([`Item::reopen`], a manual settlement) is not fenced, and a reopening raises the fence, so
//!   that it refuses any holder from before it.
//! * **Waits.** An item may wait before it is first due (an intent's hold), and a holder may
//!   put it back to wait (retry later): either way it is not claimed before its time.
//! * **The manual state is never claimed.** A holder that gives up parks the item there (or the
//!   component records it there): only a person takes it out.
//! * **The sweep deletes only what is settled, and older than the retention**, a bounded
//!   batch at a time, the longest settled first. Nothing unsettled is ever deleted by it. On
//!   PostgreSQL a batch is one statement that locks the rows it deletes with
//!   `FOR UPDATE SKIP LOCKED`: two batches at once delete disjoint rows.
//!
//! Every duration the queue is given (a lease, a wait, a retention) counts as at most
//! [`MAX_DURATION`](crate::MAX_DURATION): in memory an instant is moved on through
//! [`time::later`](crate::time), and on PostgreSQL a duration is sent in microseconds, so that
//! no duration, `Duration::MAX` included, panics or takes the database out of a timestamp's
//! range. A component documents this on the methods that take one.
//!
//! The protocol is modelled in `tests/protocols` (the `queue` model: holders that pause past
//! their lease, a person's reopening and settlement, the sweep), with mutations that the
//! checker catches; see [`docs::how_we_know`](crate::docs::how_we_know).
//!
//! ```ignore
//! // A component's states: the ledger's entries.
//! impl queue::States for EntryState {
//!     const ALL: &'static [Self] = &[InDoubt, Open, Claimed, Manual, Settled];
//!     const CLAIMED: Self = Claimed;
//!     fn claimable(self) -> bool { matches!(self, InDoubt | Open | Claimed) }
//!     fn settled(self) -> bool { self == Settled }
//! }
//! let queue = MemoryQueue::<EntryId, EntryState, Evidence>::default();
//! let mut items = queue.lock();
//! items.insert(id, EntryState::Open, None, evidence);
//! let claims = items.claim(16, lease, |item| (item.fence(), item.value.clone()));
//! items.held(&id, fence)?.settle(EntryState::Settled);
//! ```
//!
//! (Not compiled: the module is private; its tests are in `tests.rs`.)

use std::fmt;
use std::time::Duration;

mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(test)]
mod tests;
pub(crate) mod worker;

pub(crate) use self::memory::{Full, Item, MemoryQueue, DEFAULT_CAPACITY};
#[cfg(feature = "postgres")]
pub(crate) use self::postgres::{fence, fence_of, later, Columns, SqlStates, Table};
#[cfg(feature = "postgres")]
pub(crate) use crate::storage::micros;

/// A component's states, as the queue sees them.
///
/// Every state is one of: due when its time comes ([`claimable`](Self::claimable): waiting,
/// or claimed and its lease passed), settled ([`settled`](Self::settled)), or neither, which is
/// a manual state: never claimed, never swept.
pub(crate) trait States: Copy + Eq + fmt::Debug + Send + Sync + 'static {
    /// Every state, for the statements that name a set of them.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    const ALL: &'static [Self];
    /// The state a claim moves an item to, and the one a holder's write needs the item in
    /// (with the holder's fence). It must be [claimable](Self::claimable): a claimed item
    /// whose lease passed is due again. (The outbox's pending state is both its waiting and
    /// its claimed one: a claim only sets the lease.)
    const CLAIMED: Self;

    /// Whether an item in this state is claimed once its time has come (at once, without one).
    fn claimable(self) -> bool;

    /// Whether an item in this state is done: never claimed again, and swept once its
    /// retention has passed.
    fn settled(self) -> bool;

    /// Whether an item in this state is in a manual state: neither claimable nor settled.
    fn manual(self) -> bool {
        !self.claimable() && !self.settled()
    }
}

/// Why a holder's write changed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No item has the key (never recorded, or swept or deleted since).
    Missing,
    /// The item is not held by this claim: claimed again since (a higher fence), released,
    /// reopened, parked or settled.
    Stale,
}

/// The batch in which a component's unbounded sweep (the relay's, the reconciler's) deletes
/// its rows, one statement (or one hold of the lock) at a time.
pub(crate) const SWEEP_BATCH: usize = 1000;

/// `d`, at most [`MAX_DURATION`](crate::MAX_DURATION): every duration the queue is given.
pub(crate) fn bounded(d: Duration) -> Duration {
    d.min(crate::MAX_DURATION)
}

/// Asserts what the queue needs of a component's states: its claimed state is claimable, no
/// state is both claimable and settled, and there is a manual state. Each component's tests
/// call it with its own.
#[cfg(test)]
pub(crate) fn check_states<T: States>() {
    assert!(T::CLAIMED.claimable(), "{:?}", T::CLAIMED);
    for s in T::ALL {
        assert!(!(s.claimable() && s.settled()), "{s:?}");
    }
    assert!(T::ALL.iter().any(|s| s.manual()));
}
