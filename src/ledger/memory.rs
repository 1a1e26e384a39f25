//! The in-memory ledger.

use std::collections::HashMap;
use std::fmt;
use std::future::{ready, Future};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    Claim, Entry, EntryId, EntryState, Evidence, Filter, Ledger, LedgerError, LedgerStats, Settled,
    Settlement,
};

/// The embedded ledger: entries in memory, for one process, and for tests. Its entries do not
/// outlive the process: a service with more than one instance, or that must not lose an
/// unknown call to a restart, uses `PostgresLedger`.
///
/// Time is [`tokio::time::Instant`], so tests can pause and advance it. Clones share the
/// entries.
#[derive(Clone, Default)]
pub struct MemoryLedger {
    inner: Arc<Mutex<Rows>>,
}

#[derive(Default)]
struct Rows {
    next: u64,
    by_id: HashMap<EntryId, Row>,
}

struct Row {
    seq: u64,
    evidence: Evidence,
    state: EntryState,
    fence: u64,
    /// Open or in doubt: claimable from then; claimed: the lease's end.
    until: Option<Instant>,
    tries: u32,
    note: Option<String>,
    settlement: Option<Settlement>,
    recorded: Instant,
    settled: Option<Instant>,
}

impl Row {
    fn entry(&self, now: Instant) -> Entry {
        Entry::new(
            self.evidence.clone(),
            self.state,
            self.tries,
            self.note.clone(),
            self.settlement.clone(),
            now.saturating_duration_since(self.recorded),
        )
    }
}

impl MemoryLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    fn rows(&self) -> MutexGuard<'_, Rows> {
        // Every critical section leaves the rows whole before anything that could panic.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record_now(&self, evidence: &Evidence) -> bool {
        self.insert(evidence, EntryState::Open, None)
    }

    fn insert(&self, evidence: &Evidence, state: EntryState, until: Option<Instant>) -> bool {
        let mut rows = self.rows();
        if let Some(row) = rows.by_id.get_mut(&evidence.id) {
            if state == EntryState::Open && row.state == EntryState::InDoubt {
                // The journaled call ended unknown: its intent becomes the entry.
                let mut evidence = evidence.clone();
                evidence.digest = evidence.digest.or_else(|| row.evidence.digest.take());
                evidence.deadline = evidence.deadline.or(row.evidence.deadline);
                row.evidence = evidence;
                row.state = EntryState::Open;
                row.until = None;
                return true;
            }
            return false;
        }
        rows.next += 1;
        let seq = rows.next;
        rows.by_id.insert(
            evidence.id.clone(),
            Row {
                seq,
                evidence: evidence.clone(),
                state,
                fence: 0,
                until,
                tries: 0,
                note: None,
                settlement: None,
                recorded: Instant::now(),
                settled: None,
            },
        );
        true
    }

    fn claim_now(&self, max: usize, lease: Duration) -> Vec<Claim> {
        let now = Instant::now();
        let mut rows = self.rows();
        let mut due: Vec<(u64, EntryId)> = rows
            .by_id
            .values()
            .filter(|r| match r.state {
                EntryState::InDoubt | EntryState::Open | EntryState::Claimed => {
                    r.until.is_none_or(|t| t <= now)
                }
                EntryState::Manual | EntryState::Settled => false,
            })
            .map(|r| (r.seq, r.evidence.id.clone()))
            .collect();
        due.sort_unstable();
        due.truncate(max);
        due.into_iter()
            .filter_map(|(_, id)| {
                let row = rows.by_id.get_mut(&id)?;
                row.state = EntryState::Claimed;
                row.fence += 1;
                row.until = Some(now + lease);
                Some(Claim::new(row.entry(now), row.fence))
            })
            .collect()
    }

    /// The row a claim holds, or why not.
    fn held<'a>(rows: &'a mut Rows, claim: &Claim) -> Result<&'a mut Row, LedgerError> {
        let id = &claim.entry.evidence.id;
        let row = rows
            .by_id
            .get_mut(id)
            .ok_or_else(|| LedgerError::not_found(id))?;
        if row.state != EntryState::Claimed || row.fence != claim.fence() {
            return Err(LedgerError::stale());
        }
        Ok(row)
    }

    fn settle_now(&self, claim: &Claim, settlement: &Settlement) -> Result<Settled, LedgerError> {
        let mut rows = self.rows();
        let id = &claim.entry.evidence.id;
        if let Some(done) = rows.by_id.get(id).and_then(|r| r.settlement.clone()) {
            return Ok(Settled::Already(done));
        }
        let row = Self::held(&mut rows, claim)?;
        Ok(settle_row(row, settlement))
    }

    fn release_now(
        &self,
        claim: &Claim,
        note: &str,
        state: EntryState,
        after: Duration,
    ) -> Result<(), LedgerError> {
        let mut rows = self.rows();
        let row = Self::held(&mut rows, claim)?;
        row.state = state;
        row.tries += 1;
        row.note = Some(super::truncate(note, super::MAX_TEXT).to_owned());
        row.until = (state == EntryState::Open).then(|| Instant::now() + after);
        Ok(())
    }

    fn settle_manually_now(
        &self,
        id: &EntryId,
        settlement: &Settlement,
    ) -> Result<Settled, LedgerError> {
        let mut rows = self.rows();
        let row = rows
            .by_id
            .get_mut(id)
            .ok_or_else(|| LedgerError::not_found(id))?;
        if let Some(done) = &row.settlement {
            return Ok(Settled::Already(done.clone()));
        }
        Ok(settle_row(row, settlement))
    }

    fn retry_now_now(&self, id: &EntryId, note: &str) -> Result<(), LedgerError> {
        let mut rows = self.rows();
        let row = rows
            .by_id
            .get_mut(id)
            .ok_or_else(|| LedgerError::not_found(id))?;
        if !matches!(row.state, EntryState::Open | EntryState::Manual) {
            return Err(LedgerError::conflict(id, row.state));
        }
        row.state = EntryState::Open;
        row.fence += 1;
        row.until = None;
        row.note = Some(super::truncate(note, super::MAX_TEXT).to_owned());
        Ok(())
    }

    fn list_now(&self, filter: &Filter) -> Vec<Entry> {
        let now = Instant::now();
        let rows = self.rows();
        let mut found: Vec<(u64, Entry)> = rows
            .by_id
            .values()
            .map(|r| (r.seq, r.entry(now)))
            .filter(|(_, e)| filter.matches(e))
            .collect();
        found.sort_unstable_by_key(|(seq, _)| *seq);
        found
            .into_iter()
            .take(filter.limit)
            .map(|(_, e)| e)
            .collect()
    }

    /// The ledger's counts, at once (the [`Ledger::stats`] of a store that cannot fail).
    pub fn stats_now(&self) -> LedgerStats {
        let now = Instant::now();
        let rows = self.rows();
        let mut stats = LedgerStats::default();
        for row in rows.by_id.values() {
            match row.state {
                EntryState::InDoubt => stats.in_doubt += 1,
                EntryState::Open => stats.open += 1,
                EntryState::Claimed => stats.claimed += 1,
                EntryState::Manual => stats.manual += 1,
                EntryState::Settled => stats.settled += 1,
            }
            if row.state.is_unsettled() {
                let age = now.saturating_duration_since(row.recorded);
                stats.oldest_unsettled = stats.oldest_unsettled.max(Some(age));
            }
        }
        stats
    }

    fn sweep_now(&self, retention: Duration) -> u64 {
        let now = Instant::now();
        let mut rows = self.rows();
        let before = rows.by_id.len();
        rows.by_id.retain(|_, r| {
            r.settled
                .is_none_or(|at| now.saturating_duration_since(at) < retention)
        });
        (before - rows.by_id.len()) as u64
    }
}

fn settle_row(row: &mut Row, settlement: &Settlement) -> Settled {
    row.state = EntryState::Settled;
    row.until = None;
    row.settlement = Some(settlement.clone());
    row.settled = Some(Instant::now());
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
        ready(Ok(self.record_now(evidence)))
    }

    fn record_in_doubt(
        &self,
        evidence: &Evidence,
        hold: Duration,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send {
        let until = Instant::now() + hold;
        ready(Ok(self.insert(evidence, EntryState::InDoubt, Some(until))))
    }

    fn forget_in_doubt(
        &self,
        ids: &[EntryId],
    ) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        let mut rows = self.rows();
        let mut forgotten = 0;
        for id in ids {
            if rows
                .by_id
                .get(id)
                .is_some_and(|r| r.state == EntryState::InDoubt)
            {
                rows.by_id.remove(id);
                forgotten += 1;
            }
        }
        ready(Ok(forgotten))
    }

    fn claim(
        &self,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Claim>, LedgerError>> + Send {
        ready(Ok(self.claim_now(max, lease)))
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
        ready(self.release_now(claim, note, EntryState::Open, after))
    }

    fn to_manual(
        &self,
        claim: &Claim,
        reason: &str,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        ready(self.release_now(claim, reason, EntryState::Manual, Duration::ZERO))
    }

    fn settle_manually(
        &self,
        id: &EntryId,
        settlement: &Settlement,
    ) -> impl Future<Output = Result<Settled, LedgerError>> + Send {
        ready(self.settle_manually_now(id, settlement))
    }

    fn get(&self, id: &EntryId) -> impl Future<Output = Result<Option<Entry>, LedgerError>> + Send {
        let now = Instant::now();
        ready(Ok(self.rows().by_id.get(id).map(|r| r.entry(now))))
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
        ready(Ok(self.sweep_now(retention)))
    }
}
