//! The in-memory ledger.

use std::fmt;
use std::future::{ready, Future};
use std::time::Duration;

use super::{
    Claim, Entry, EntryId, EntryState, Evidence, Filter, Ledger, LedgerError, LedgerStats, Settled,
    Settlement,
};
use crate::queue::{self, MemoryQueue};

/// The embedded ledger: entries in memory, for one process, and for tests. Its entries do not
/// outlive the process: a service with more than one instance, or that must not lose an
/// unknown call to a restart, uses `PostgresLedger`.
///
/// Time is [`tokio::time::Instant`], so tests can pause and advance it. Clones share the
/// entries.
///
/// # Memory
///
/// At most [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) entries (100 000), in every state
/// (intents in doubt, and settled entries until a [sweep](Ledger::sweep) deletes them);
/// [`with_capacity`](Self::with_capacity) sets another bound. At the bound no entry is dropped
/// to make room (an unknown call forgotten is the loss the ledger exists to prevent):
/// [`record`](Ledger::record) and [`record_in_doubt`](Ledger::record_in_doubt) of a new entry
/// fail with [`LedgerError::is_full`]. A journaled call whose intent is refused so is not sent
/// (it fails with a [`JournalError`](crate::journal::JournalError)); a
/// [`LedgerRecorder`](super::LedgerRecorder) tries an entry again, then keeps it for
/// [`take_failed`](super::LedgerRecorder::take_failed).
#[derive(Clone, Default)]
pub struct MemoryLedger {
    queue: MemoryQueue<EntryId, EntryState, Row>,
}

/// What the ledger keeps of an entry beside the queue's part.
struct Row {
    evidence: Evidence,
    note: Option<String>,
    settlement: Option<Settlement>,
}

type Item = queue::Item<EntryState, Row>;

fn entry(item: &Item) -> Entry {
    let row = &item.value;
    Entry::new(
        row.evidence.clone(),
        item.state(),
        item.tries(),
        row.note.clone(),
        row.settlement.clone(),
        item.age(),
    )
}

impl MemoryLedger {
    /// The entries a ledger takes unless [`with_capacity`](Self::with_capacity) says otherwise.
    pub const DEFAULT_CAPACITY: usize = queue::DEFAULT_CAPACITY;

    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same ledger, taking at most `entries` entries (at least 1) in every state; past
    /// them a new entry is refused with [`LedgerError::is_full`] (see "Memory" above). Clones
    /// share the bound. Nothing is allocated ahead.
    ///
    /// ```
    /// use surely::ledger::MemoryLedger;
    ///
    /// let ledger = MemoryLedger::new().with_capacity(10_000);
    /// assert_eq!(ledger.capacity(), 10_000);
    /// ```
    #[must_use]
    pub fn with_capacity(self, entries: usize) -> Self {
        self.queue.lock().set_capacity(entries);
        self
    }

    /// The most entries it takes ([`with_capacity`](Self::with_capacity)).
    pub fn capacity(&self) -> usize {
        self.queue.lock().capacity()
    }

    fn insert(
        &self,
        evidence: &Evidence,
        state: EntryState,
        hold: Option<Duration>,
    ) -> Result<bool, LedgerError> {
        let mut items = self.queue.lock();
        if let Some(item) = items.get_mut(&evidence.id) {
            if state == EntryState::Open && item.state() == EntryState::InDoubt {
                // The journaled call ended unknown: its intent becomes the entry.
                let row = &mut item.value;
                let mut evidence = evidence.clone();
                evidence.digest = evidence.digest.or_else(|| row.evidence.digest.take());
                evidence.deadline = evidence.deadline.or(row.evidence.deadline);
                row.evidence = evidence;
                item.set_due_now(EntryState::Open);
                return Ok(true);
            }
            return Ok(false);
        }
        let row = Row {
            evidence: evidence.clone(),
            note: None,
            settlement: None,
        };
        items
            .insert(evidence.id.clone(), state, hold, row)
            .map_err(|queue::Full(capacity)| LedgerError::full(capacity))
    }

    fn settle_now(&self, claim: &Claim, settlement: &Settlement) -> Result<Settled, LedgerError> {
        let mut items = self.queue.lock();
        let id = &claim.entry.evidence.id;
        if let Some(done) = items.get(id).and_then(|i| i.value.settlement.clone()) {
            return Ok(Settled::Already(done));
        }
        let item = items.held(id, claim.fence()).map_err(|r| refused(r, id))?;
        Ok(settle(item, settlement))
    }

    fn release_now(
        &self,
        claim: &Claim,
        note: &str,
        after: Option<Duration>,
    ) -> Result<(), LedgerError> {
        let mut items = self.queue.lock();
        let id = &claim.entry.evidence.id;
        let item = items.held(id, claim.fence()).map_err(|r| refused(r, id))?;
        match after {
            Some(after) => item.retry_later(EntryState::Open, after),
            None => item.park(EntryState::Manual),
        }
        item.value.note = Some(super::truncate(note, super::MAX_TEXT).to_owned());
        Ok(())
    }

    fn settle_manually_now(
        &self,
        id: &EntryId,
        settlement: &Settlement,
    ) -> Result<Settled, LedgerError> {
        let mut items = self.queue.lock();
        let item = items
            .get_mut(id)
            .ok_or_else(|| LedgerError::not_found(id))?;
        if let Some(done) = &item.value.settlement {
            return Ok(Settled::Already(done.clone()));
        }
        Ok(settle(item, settlement))
    }

    fn retry_now_now(&self, id: &EntryId, note: &str) -> Result<(), LedgerError> {
        let mut items = self.queue.lock();
        let item = items
            .get_mut(id)
            .ok_or_else(|| LedgerError::not_found(id))?;
        if !matches!(item.state(), EntryState::Open | EntryState::Manual) {
            return Err(LedgerError::conflict(id, item.state()));
        }
        item.reopen(EntryState::Open);
        item.value.note = Some(super::truncate(note, super::MAX_TEXT).to_owned());
        Ok(())
    }

    fn list_now(&self, filter: &Filter) -> Vec<Entry> {
        self.queue
            .lock()
            .iter()
            .map(entry)
            .filter(|e| filter.matches(e))
            .take(filter.limit)
            .collect()
    }

    /// The ledger's counts, at once (the [`Ledger::stats`] of a store that cannot fail).
    pub fn stats_now(&self) -> LedgerStats {
        let items = self.queue.lock();
        let mut stats = LedgerStats::default();
        for item in items.iter() {
            let count = match item.state() {
                EntryState::InDoubt => &mut stats.in_doubt,
                EntryState::Open => &mut stats.open,
                EntryState::Claimed => &mut stats.claimed,
                EntryState::Manual => &mut stats.manual,
                EntryState::Settled => &mut stats.settled,
            };
            *count = count.saturating_add(1);
            if item.state().is_unsettled() {
                stats.oldest_unsettled = stats.oldest_unsettled.max(Some(item.age()));
            }
        }
        stats
    }
}

/// Why a claim's change was refused.
fn refused(why: queue::Refused, id: &EntryId) -> LedgerError {
    match why {
        queue::Refused::Missing => LedgerError::not_found(id),
        queue::Refused::Stale => LedgerError::stale(),
    }
}

fn settle(item: &mut Item, settlement: &Settlement) -> Settled {
    item.settle(EntryState::Settled);
    item.value.settlement = Some(settlement.clone());
    Settled::Now(settlement.clone())
}

impl fmt::Debug for MemoryLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLedger")
            .field("stats", &self.stats_now())
            .finish()
    }
}

impl Ledger for MemoryLedger {
    fn record(
        &self,
        evidence: &Evidence,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send {
        ready(self.insert(evidence, EntryState::Open, None))
    }

    fn record_in_doubt(
        &self,
        evidence: &Evidence,
        hold: Duration,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send {
        ready(self.insert(evidence, EntryState::InDoubt, Some(hold)))
    }

    fn forget_in_doubt(
        &self,
        ids: &[EntryId],
    ) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        let mut items = self.queue.lock();
        let forgotten = ids
            .iter()
            .filter(|id| {
                items
                    .remove_if(*id, |i| i.state() == EntryState::InDoubt)
                    .is_some()
            })
            .count();
        ready(Ok(forgotten as u64))
    }

    fn claim(
        &self,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Claim>, LedgerError>> + Send {
        let claims = self
            .queue
            .lock()
            .claim(max, lease, |item| Claim::new(entry(item), item.fence()));
        ready(Ok(claims))
    }

    fn settle(
        &self,
        claim: &Claim,
        settlement: &Settlement,
    ) -> impl Future<Output = Result<Settled, LedgerError>> + Send {
        ready(self.settle_now(claim, settlement))
    }

    fn retry_later(
        &self,
        claim: &Claim,
        note: &str,
        after: Duration,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        ready(self.release_now(claim, note, Some(after)))
    }

    fn to_manual(
        &self,
        claim: &Claim,
        reason: &str,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        ready(self.release_now(claim, reason, None))
    }

    fn settle_manually(
        &self,
        id: &EntryId,
        settlement: &Settlement,
    ) -> impl Future<Output = Result<Settled, LedgerError>> + Send {
        ready(self.settle_manually_now(id, settlement))
    }

    fn get(&self, id: &EntryId) -> impl Future<Output = Result<Option<Entry>, LedgerError>> + Send {
        ready(Ok(self.queue.lock().get(id).map(entry)))
    }

    fn list(
        &self,
        filter: &Filter,
    ) -> impl Future<Output = Result<Vec<Entry>, LedgerError>> + Send {
        ready(Ok(self.list_now(filter)))
    }

    fn retry_now(
        &self,
        id: &EntryId,
        note: &str,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        ready(self.retry_now_now(id, note))
    }

    fn stats(&self) -> impl Future<Output = Result<LedgerStats, LedgerError>> + Send {
        ready(Ok(self.stats_now()))
    }

    fn sweep(&self, retention: Duration) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        ready(Ok(self.queue.sweep_all(retention)))
    }

    fn sweep_batch(
        &self,
        retention: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        ready(Ok(self.queue.lock().sweep(retention, limit)))
    }
}
