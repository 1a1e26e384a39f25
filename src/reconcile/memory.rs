//! The differences in memory.

use std::collections::BTreeMap;
use std::fmt;
use std::future::{ready, Future};
use std::time::Duration;

use super::{
    check_person, cut, Difference, DifferenceStats, DifferenceStore, Item, ItemState, Marked,
    ReconcileError, RepairClaim, RepairId, MAX_TEXT,
};
use crate::queue::{self, MemoryQueue};

/// The embedded store of differences: in memory, for one process and for tests. Its items do
/// not outlive the process; a service with more than one instance uses `PostgresDifferences`
/// (feature `postgres`).
///
/// Time is [`tokio::time::Instant`], so tests can pause and advance it. Clones share the items.
///
/// # Memory
///
/// At most [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) differences (100 000), in every state:
/// repaired and resolved ones among them, which this store keeps for the process's life (it
/// has no sweep); [`with_capacity`](Self::with_capacity) sets another bound. At the bound none is dropped to
/// make room: [`record`](DifferenceStore::record) of a new one fails with
/// [`ReconcileError::is_full`], and so does the reconciler's run that found it.
#[derive(Clone, Default)]
pub struct MemoryDifferences {
    queue: MemoryQueue<RepairId, ItemState, Row>,
}

/// What the store keeps of a difference beside the queue's part.
struct Row {
    difference: Difference,
    note: Option<String>,
    who: Option<String>,
}

type Queued = queue::Item<ItemState, Row>;

fn item(queued: &Queued) -> Item {
    let row = &queued.value;
    Item::new(
        row.difference.clone(),
        queued.state(),
        queued.tries(),
        row.note.clone(),
        row.who.clone(),
        queued.age(),
    )
}

/// Why a claim's change was refused.
fn refused(why: queue::Refused, id: &RepairId) -> ReconcileError {
    match why {
        queue::Refused::Missing => ReconcileError::not_found(id),
        queue::Refused::Stale => ReconcileError::stale(),
    }
}

fn done(state: ItemState) -> bool {
    matches!(state, ItemState::Repaired | ItemState::Resolved)
}

impl MemoryDifferences {
    /// The differences a store takes unless [`with_capacity`](Self::with_capacity) says
    /// otherwise.
    pub const DEFAULT_CAPACITY: usize = queue::DEFAULT_CAPACITY;

    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same store, taking at most `differences` (at least 1) in every state; past them a
    /// new one is refused with [`ReconcileError::is_full`] (see "Memory" above). Clones share
    /// the bound. Nothing is allocated ahead.
    ///
    /// ```
    /// use surely::reconcile::MemoryDifferences;
    ///
    /// let store = MemoryDifferences::new().with_capacity(10_000);
    /// assert_eq!(store.capacity(), 10_000);
    /// ```
    #[must_use]
    pub fn with_capacity(self, differences: usize) -> Self {
        self.queue.lock().set_capacity(differences);
        self
    }

    /// The most differences it takes ([`with_capacity`](Self::with_capacity)).
    pub fn capacity(&self) -> usize {
        self.queue.lock().capacity()
    }

    fn record_now(&self, d: &Difference) -> Result<bool, ReconcileError> {
        let manual = d.action.is_none();
        let (state, note, who) = if manual {
            (
                ItemState::Manual,
                Some(super::NO_REPAIR.to_owned()),
                Some(super::RULES.to_owned()),
            )
        } else {
            (ItemState::Open, None, None)
        };
        let row = Row {
            difference: d.clone(),
            note,
            who,
        };
        self.queue
            .lock()
            .insert(d.id.clone(), state, None, row)
            .map_err(|queue::Full(capacity)| ReconcileError::full(capacity))
    }

    fn mark_now(&self, claim: &RepairClaim, note: &str) -> Result<Marked, ReconcileError> {
        let mut items = self.queue.lock();
        let id = &claim.item.difference.id;
        if items.get(id).is_some_and(|i| done(i.state())) {
            return Ok(Marked::Already);
        }
        let queued = items.held(id, claim.fence()).map_err(|r| refused(r, id))?;
        queued.settle(ItemState::Repaired);
        queued.value.note = Some(cut(note, MAX_TEXT).to_owned());
        Ok(Marked::Now)
    }

    fn release_now(
        &self,
        claim: &RepairClaim,
        after: Option<Duration>,
        who: Option<&str>,
        note: &str,
    ) -> Result<(), ReconcileError> {
        let mut items = self.queue.lock();
        let id = &claim.item.difference.id;
        let queued = items.held(id, claim.fence()).map_err(|r| refused(r, id))?;
        match after {
            Some(after) => queued.retry_later(ItemState::Open, after),
            None => queued.park(ItemState::Manual),
        }
        let row = &mut queued.value;
        row.note = Some(cut(note, MAX_TEXT).to_owned());
        if let Some(who) = who {
            row.who = Some(cut(who, super::MAX_WHO).to_owned());
        }
        Ok(())
    }

    fn resolve_now(&self, id: &RepairId, who: &str, why: &str) -> Result<Marked, ReconcileError> {
        check_person(who, why)?;
        let mut items = self.queue.lock();
        let queued = items
            .get_mut(id)
            .ok_or_else(|| ReconcileError::not_found(id))?;
        if done(queued.state()) {
            return Ok(Marked::Already);
        }
        queued.settle(ItemState::Resolved);
        queued.value.who = Some(who.to_owned());
        queued.value.note = Some(why.to_owned());
        Ok(Marked::Now)
    }

    fn list_now(&self, state: Option<ItemState>, limit: usize) -> Vec<Item> {
        self.queue
            .lock()
            .iter()
            .filter(|q| state.is_none_or(|s| q.state() == s))
            .take(limit)
            .map(item)
            .collect()
    }

    /// The store's counts, at once (the [`DifferenceStore::stats`] of a store that cannot
    /// fail).
    pub fn stats_now(&self) -> DifferenceStats {
        let items = self.queue.lock();
        let mut by_rule: BTreeMap<&str, u64> = BTreeMap::new();
        let mut stats = DifferenceStats::default();
        for queued in items.iter() {
            let count = match queued.state() {
                ItemState::Repaired => &mut stats.repaired,
                ItemState::Resolved => &mut stats.resolved,
                open => {
                    if open == ItemState::Manual {
                        stats.manual = stats.manual.saturating_add(1);
                    }
                    stats.oldest_open = stats.oldest_open.max(Some(queued.age()));
                    by_rule.entry(&queued.value.difference.rule).or_default()
                }
            };
            *count = count.saturating_add(1);
        }
        stats.open_by_rule = by_rule
            .into_iter()
            .map(|(r, n)| (r.to_owned(), n))
            .collect();
        stats
    }
}

impl fmt::Debug for MemoryDifferences {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryDifferences")
            .field("stats", &self.stats_now())
            .finish()
    }
}

impl DifferenceStore for MemoryDifferences {
    fn record(
        &self,
        difference: &Difference,
    ) -> impl Future<Output = Result<bool, ReconcileError>> + Send {
        ready(self.record_now(difference))
    }

    fn claim(
        &self,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<RepairClaim>, ReconcileError>> + Send {
        let claims = self
            .queue
            .lock()
            .claim(max, lease, |q| RepairClaim::new(item(q), q.fence()));
        ready(Ok(claims))
    }

    fn mark_repaired(
        &self,
        claim: &RepairClaim,
        note: &str,
    ) -> impl Future<Output = Result<Marked, ReconcileError>> + Send {
        ready(self.mark_now(claim, note))
    }

    fn retry_later(
        &self,
        claim: &RepairClaim,
        note: &str,
        after: Duration,
    ) -> impl Future<Output = Result<(), ReconcileError>> + Send {
        ready(self.release_now(claim, Some(after), None, note))
    }

    fn to_manual(
        &self,
        claim: &RepairClaim,
        who: &str,
        why: &str,
    ) -> impl Future<Output = Result<(), ReconcileError>> + Send {
        ready(self.release_now(claim, None, Some(who), why))
    }

    fn resolve_manually(
        &self,
        id: &RepairId,
        who: &str,
        why: &str,
    ) -> impl Future<Output = Result<Marked, ReconcileError>> + Send {
        ready(self.resolve_now(id, who, why))
    }

    fn get(
        &self,
        id: &RepairId,
    ) -> impl Future<Output = Result<Option<Item>, ReconcileError>> + Send {
        ready(Ok(self.queue.lock().get(id).map(item)))
    }

    fn list(
        &self,
        state: Option<ItemState>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Item>, ReconcileError>> + Send {
        ready(Ok(self.list_now(state, limit)))
    }

    fn stats(&self) -> impl Future<Output = Result<DifferenceStats, ReconcileError>> + Send {
        ready(Ok(self.stats_now()))
    }

    fn sweep_batch(
        &self,
        retention: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, ReconcileError>> + Send {
        ready(Ok(self.queue.lock().sweep(retention, limit)))
    }
}
