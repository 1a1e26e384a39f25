//! The in-memory outbox.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::{ready, Future};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::record::OutboxStats;

use super::{Claimed, Event, EventId, Failed, OutboxError, OutboxStore, Quarantined, Wakeup};

/// The embedded outbox: events in memory, for one process, and for tests.
///
/// There is no transaction to join: [`enqueue`](Self::enqueue) adds the event at once. Use it
/// where the business state is in memory too (or in tests); a service whose state is in
/// PostgreSQL uses [`PostgresOutbox`](super::PostgresOutbox), whose events commit with it.
///
/// Time is [`tokio::time::Instant`], so tests can pause and advance it. Clones share the
/// events.
#[derive(Clone, Default)]
pub struct MemoryOutbox {
    inner: Arc<Mutex<Rows>>,
    wakeup: Wakeup,
}

#[derive(Default)]
struct Rows {
    next: u64,
    by_seq: BTreeMap<u64, Row>,
    by_id: HashMap<EventId, u64>,
}

struct Row {
    event: Event,
    state: State,
    claim: u64,
    claimed_until: Option<Instant>,
    failures: u32,
    last_error: Option<String>,
    enqueued_at: Instant,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    Published(Instant),
    Quarantined,
}

impl MemoryOutbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    fn rows(&self) -> MutexGuard<'_, Rows> {
        // Every critical section leaves the rows whole before anything that could panic.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The [`Wakeup`] this outbox's enqueues wake: give it to
    /// [`RelayBuilder::wake_on`](super::RelayBuilder::wake_on) and an idle relay publishes a new
    /// event at once, not at its next poll.
    pub fn wakeup(&self) -> Wakeup {
        self.wakeup.clone()
    }

    /// Adds `event`; returns false (and changes nothing) if an event with its id is already
    /// here, published or not: one id, one event.
    pub fn enqueue(&self, event: Event) -> bool {
        let added = self.add(event);
        if added {
            self.wakeup.wake();
        }
        added
    }

    fn add(&self, event: Event) -> bool {
        let mut rows = self.rows();
        if rows.by_id.contains_key(event.id()) {
            return false;
        }
        let seq = rows.next;
        rows.next += 1;
        rows.by_id.insert(event.id().clone(), seq);
        rows.by_seq.insert(
            seq,
            Row {
                event,
                state: State::Pending,
                claim: 0,
                claimed_until: None,
                failures: 0,
                last_error: None,
                enqueued_at: Instant::now(),
            },
        );
        true
    }

    /// The stats now ([`OutboxStore::stats`] without the future).
    pub fn stats_now(&self) -> OutboxStats {
        let now = Instant::now();
        let rows = self.rows();
        let mut stats = OutboxStats::default();
        for row in rows.by_seq.values() {
            match row.state {
                State::Pending => {
                    stats.backlog += 1;
                    if stats.oldest.is_none() {
                        stats.oldest = Some(now.saturating_duration_since(row.enqueued_at));
                    }
                }
                State::Quarantined => stats.quarantined += 1,
                State::Published(_) => {}
            }
        }
        stats
    }

    /// The last error of a quarantined or failing event.
    pub fn last_error(&self, id: &EventId) -> Option<String> {
        let rows = self.rows();
        let seq = rows.by_id.get(id)?;
        rows.by_seq.get(seq)?.last_error.clone()
    }

    fn claim_now(&self, max: usize, lease: Duration) -> Vec<Claimed> {
        let now = Instant::now();
        let mut rows = self.rows();
        let mut claimed = Vec::new();
        for row in rows.by_seq.values_mut() {
            if claimed.len() >= max {
                break;
            }
            let free = row.claimed_until.is_none_or(|until| until <= now);
            if row.state == State::Pending && free {
                row.claim += 1;
                row.claimed_until = Some(now + lease);
                claimed.push(Claimed::new(row.event.clone(), row.failures, row.claim));
            }
        }
        claimed
    }

    /// The quarantined events, oldest first, at most `limit` ([`OutboxStore::quarantined`]
    /// without the future).
    pub fn quarantined_now(&self, limit: usize) -> Vec<Quarantined> {
        let now = Instant::now();
        self.rows()
            .by_seq
            .values()
            .filter(|row| row.state == State::Quarantined)
            .take(limit)
            .map(|row| row.quarantined(now))
            .collect()
    }

    /// The quarantined row with this id.
    fn quarantined_row<'a>(
        rows: &'a mut Rows,
        id: &EventId,
    ) -> Result<(u64, &'a mut Row), OutboxError> {
        let seq = *rows
            .by_id
            .get(id)
            .ok_or_else(|| OutboxError::not_found(id))?;
        match rows.by_seq.get_mut(&seq) {
            Some(row) if row.state == State::Quarantined => Ok((seq, row)),
            _ => Err(OutboxError::not_found(id)),
        }
    }

    /// The row of a claim still held, or stale.
    fn held<'a>(rows: &'a mut Rows, claimed: &Claimed) -> Result<&'a mut Row, OutboxError> {
        let seq = *rows
            .by_id
            .get(claimed.event.id())
            .ok_or_else(OutboxError::stale)?;
        match rows.by_seq.get_mut(&seq) {
            Some(row) if row.claim == claimed.claim() && row.state == State::Pending => Ok(row),
            _ => Err(OutboxError::stale()),
        }
    }
}

impl Row {
    fn quarantined(&self, now: Instant) -> Quarantined {
        Quarantined::new(
            self.event.clone(),
            self.failures,
            self.last_error.clone(),
            now.saturating_duration_since(self.enqueued_at),
        )
    }
}

impl fmt::Debug for MemoryOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryOutbox")
            .field("events", &self.rows().by_seq.len())
            .finish()
    }
}

impl OutboxStore for MemoryOutbox {
    fn claim(
        &self,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Claimed>, OutboxError>> + Send {
        ready(Ok(self.claim_now(max, lease)))
    }

    fn published(&self, claimed: &Claimed) -> impl Future<Output = Result<(), OutboxError>> + Send {
        let mut rows = self.rows();
        let out = Self::held(&mut rows, claimed).map(|row| {
            row.state = State::Published(Instant::now());
            row.claimed_until = None;
        });
        ready(out)
    }

    fn failed(
        &self,
        claimed: &Claimed,
        error: &str,
        retry_after: Duration,
        quarantine_after: u32,
    ) -> impl Future<Output = Result<Failed, OutboxError>> + Send {
        let mut rows = self.rows();
        let out = Self::held(&mut rows, claimed).map(|row| {
            row.failures += 1;
            row.last_error = Some(error.to_owned());
            if row.failures >= quarantine_after {
                row.state = State::Quarantined;
                row.claimed_until = None;
                Failed::Quarantined
            } else {
                row.claimed_until = Some(Instant::now() + retry_after);
                Failed::Retry
            }
        });
        ready(out)
    }

    fn sweep(&self, retention: Duration) -> impl Future<Output = Result<u64, OutboxError>> + Send {
        let now = Instant::now();
        let mut rows = self.rows();
        let gone: Vec<(u64, EventId)> = rows
            .by_seq
            .iter()
            .filter_map(|(seq, row)| match row.state {
                State::Published(at) if now.saturating_duration_since(at) >= retention => {
                    Some((*seq, row.event.id().clone()))
                }
                _ => None,
            })
            .collect();
        for (seq, id) in &gone {
            rows.by_seq.remove(seq);
            rows.by_id.remove(id);
        }
        ready(Ok(gone.len() as u64))
    }

    fn stats(&self) -> impl Future<Output = Result<OutboxStats, OutboxError>> + Send {
        ready(Ok(self.stats_now()))
    }

    fn quarantined(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Quarantined>, OutboxError>> + Send {
        ready(Ok(self.quarantined_now(limit)))
    }

    fn quarantined_event(
        &self,
        id: &EventId,
    ) -> impl Future<Output = Result<Option<Quarantined>, OutboxError>> + Send {
        let now = Instant::now();
        let mut rows = self.rows();
        let found = Self::quarantined_row(&mut rows, id)
            .ok()
            .map(|(_, row)| row.quarantined(now));
        ready(Ok(found))
    }

    fn requeue(&self, id: &EventId) -> impl Future<Output = Result<(), OutboxError>> + Send {
        let out = {
            let mut rows = self.rows();
            Self::quarantined_row(&mut rows, id).map(|(_, row)| {
                row.state = State::Pending;
                row.failures = 0;
                row.claim += 1;
                row.claimed_until = None;
            })
        };
        if out.is_ok() {
            self.wakeup.wake();
        }
        ready(out)
    }

    fn discard(&self, id: &EventId) -> impl Future<Output = Result<Event, OutboxError>> + Send {
        let mut rows = self.rows();
        let out = Self::quarantined_row(&mut rows, id)
            .map(|(seq, _)| seq)
            .map(|seq| {
                rows.by_id.remove(id);
                rows.by_seq.remove(&seq).map(|row| row.event)
            });
        ready(out.and_then(|e| e.ok_or_else(|| OutboxError::not_found(id))))
    }
}
