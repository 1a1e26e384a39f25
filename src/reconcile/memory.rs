//! The differences in memory.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::{ready, Future};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    check_person, cut, Difference, DifferenceStats, DifferenceStore, Item, ItemState, Marked,
    ReconcileError, RepairClaim, RepairId, MAX_TEXT,
};

/// The embedded store of differences: in memory, for one process and for tests. Its items do
/// not outlive the process; a service with more than one instance uses `PostgresDifferences`
/// (feature `postgres`).
///
/// Time is [`tokio::time::Instant`], so tests can pause and advance it. Clones share the items.
#[derive(Clone, Default)]
pub struct MemoryDifferences {
    inner: Arc<Mutex<Rows>>,
}

#[derive(Default)]
struct Rows {
    next: u64,
    by_id: HashMap<RepairId, Row>,
}

struct Row {
    seq: u64,
    difference: Difference,
    state: ItemState,
    fence: u64,
    /// Open: claimable from then; claimed: the lease's end.
    until: Option<Instant>,
    tries: u32,
    note: Option<String>,
    who: Option<String>,
    recorded: Instant,
}

impl Row {
    fn item(&self, now: Instant) -> Item {
        Item::new(
            self.difference.clone(),
            self.state,
            self.tries,
            self.note.clone(),
            self.who.clone(),
            now.saturating_duration_since(self.recorded),
        )
    }
}

impl MemoryDifferences {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn rows(&self) -> MutexGuard<'_, Rows> {
        // Every critical section leaves the rows whole before anything that could panic.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record_now(&self, d: &Difference) -> bool {
        let mut rows = self.rows();
        if rows.by_id.contains_key(&d.id) {
            return false;
        }
        rows.next += 1;
        let seq = rows.next;
        let manual = d.action.is_none();
        rows.by_id.insert(
            d.id.clone(),
            Row {
                seq,
                difference: d.clone(),
                state: if manual {
                    ItemState::Manual
                } else {
                    ItemState::Open
                },
                fence: 0,
                until: None,
                tries: 0,
                note: manual.then(|| super::NO_REPAIR.to_owned()),
                who: manual.then(|| super::RULES.to_owned()),
                recorded: Instant::now(),
            },
        );
        true
    }

    fn claim_now(&self, max: usize, lease: Duration) -> Vec<RepairClaim> {
        let now = Instant::now();
        let mut rows = self.rows();
        let mut due: Vec<(u64, RepairId)> = rows
            .by_id
            .values()
            .filter(|r| {
                matches!(r.state, ItemState::Open | ItemState::Claimed)
                    && r.until.is_none_or(|t| t <= now)
            })
            .map(|r| (r.seq, r.difference.id.clone()))
            .collect();
        due.sort_unstable();
        due.truncate(max);
        due.into_iter()
            .filter_map(|(_, id)| {
                let row = rows.by_id.get_mut(&id)?;
                row.state = ItemState::Claimed;
                row.fence += 1;
                row.until = Some(now + lease);
                Some(RepairClaim::new(row.item(now), row.fence))
            })
            .collect()
    }

    fn held<'a>(rows: &'a mut Rows, claim: &RepairClaim) -> Result<&'a mut Row, ReconcileError> {
        let id = &claim.item.difference.id;
        let row = rows
            .by_id
            .get_mut(id)
            .ok_or_else(|| ReconcileError::not_found(id))?;
        if row.state != ItemState::Claimed || row.fence != claim.fence() {
            return Err(ReconcileError::stale());
        }
        Ok(row)
    }

    fn mark_now(&self, claim: &RepairClaim, note: &str) -> Result<Marked, ReconcileError> {
        let mut rows = self.rows();
        let id = &claim.item.difference.id;
        if rows
            .by_id
            .get(id)
            .is_some_and(|r| matches!(r.state, ItemState::Repaired | ItemState::Resolved))
        {
            return Ok(Marked::Already);
        }
        let row = Self::held(&mut rows, claim)?;
        row.state = ItemState::Repaired;
        row.until = None;
        row.note = Some(cut(note, MAX_TEXT).to_owned());
        Ok(Marked::Now)
    }

    fn release_now(
        &self,
        claim: &RepairClaim,
        state: ItemState,
        who: Option<&str>,
        note: &str,
        after: Duration,
    ) -> Result<(), ReconcileError> {
        let mut rows = self.rows();
        let row = Self::held(&mut rows, claim)?;
        row.state = state;
        row.tries += 1;
        row.note = Some(cut(note, MAX_TEXT).to_owned());
        if let Some(who) = who {
            row.who = Some(cut(who, super::MAX_WHO).to_owned());
        }
        row.until = (state == ItemState::Open).then(|| Instant::now() + after);
        Ok(())
    }

    fn resolve_now(&self, id: &RepairId, who: &str, why: &str) -> Result<Marked, ReconcileError> {
        check_person(who, why)?;
        let mut rows = self.rows();
        let row = rows
            .by_id
            .get_mut(id)
            .ok_or_else(|| ReconcileError::not_found(id))?;
        if matches!(row.state, ItemState::Repaired | ItemState::Resolved) {
            return Ok(Marked::Already);
        }
        row.state = ItemState::Resolved;
        row.until = None;
        row.who = Some(who.to_owned());
        row.note = Some(why.to_owned());
        Ok(Marked::Now)
    }

    fn list_now(&self, state: Option<ItemState>, limit: usize) -> Vec<Item> {
        let now = Instant::now();
        let rows = self.rows();
        let mut found: Vec<&Row> = rows
            .by_id
            .values()
            .filter(|r| state.is_none_or(|s| r.state == s))
            .collect();
        found.sort_unstable_by_key(|r| r.seq);
        found.into_iter().take(limit).map(|r| r.item(now)).collect()
    }

    /// The store's counts, at once (the [`DifferenceStore::stats`] of a store that cannot
    /// fail).
    pub fn stats_now(&self) -> DifferenceStats {
        let now = Instant::now();
        let rows = self.rows();
        let mut by_rule: BTreeMap<&str, u64> = BTreeMap::new();
        let mut stats = DifferenceStats::default();
        for row in rows.by_id.values() {
            match row.state {
                ItemState::Repaired => stats.repaired += 1,
                ItemState::Resolved => stats.resolved += 1,
                open => {
                    if open == ItemState::Manual {
                        stats.manual += 1;
                    }
                    *by_rule.entry(&row.difference.rule).or_default() += 1;
                    let age = now.saturating_duration_since(row.recorded);
                    stats.oldest_open = stats.oldest_open.max(Some(age));
                }
            }
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
        ready(Ok(self.record_now(difference)))
    }

    fn claim(
        &self,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<RepairClaim>, ReconcileError>> + Send {
        ready(Ok(self.claim_now(max, lease)))
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
        ready(self.release_now(claim, ItemState::Open, None, note, after))
    }

    fn to_manual(
        &self,
        claim: &RepairClaim,
        who: &str,
        why: &str,
    ) -> impl Future<Output = Result<(), ReconcileError>> + Send {
        ready(self.release_now(claim, ItemState::Manual, Some(who), why, Duration::ZERO))
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
        let now = Instant::now();
        ready(Ok(self.rows().by_id.get(id).map(|r| r.item(now))))
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
}
