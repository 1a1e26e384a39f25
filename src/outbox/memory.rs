//! The in-memory outbox.

use std::fmt;
use std::future::{ready, Future};
use std::time::Duration;

use crate::queue::{self, MemoryQueue};
use crate::record::OutboxStats;

use super::{
    Claimed, Event, EventId, Failed, OutboxError, OutboxStore, Quarantined, State, Wakeup,
};

/// The embedded outbox: events in memory, for one process, and for tests.
///
/// There is no transaction to join: [`enqueue`](Self::enqueue) adds the event at once. Use it
/// where the business state is in memory too (or in tests); a service whose state is in
/// PostgreSQL uses [`PostgresOutbox`][super::PostgresOutbox], whose events commit with it.
///
/// Time is [`tokio::time::Instant`], so tests can pause and advance it. Clones share the
/// events.
///
/// # Memory
///
/// At most [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) events (100 000), in every state,
/// published ones among them until a [sweep](OutboxStore::sweep) deletes them;
/// [`with_capacity`](Self::with_capacity) sets another bound. At the bound no event is dropped
/// to make room: [`try_enqueue`](Self::try_enqueue) refuses a new one with
/// [`OutboxError::is_full`] (and [`enqueue`](Self::enqueue) returns false, and logs an error).
#[cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "super::PostgresOutbox",
    )
)]
#[derive(Clone, Default)]
pub struct MemoryOutbox {
    queue: MemoryQueue<EventId, State, Row>,
    wakeup: Wakeup,
}

/// What the outbox keeps of an event beside the queue's part (its failures are the queue's
/// tries).
struct Row {
    event: Event,
    last_error: Option<String>,
}

type Item = queue::Item<State, Row>;

fn quarantined(item: &Item) -> Quarantined {
    Quarantined::new(
        item.value.event.clone(),
        item.tries(),
        item.value.last_error.clone(),
        item.age(),
    )
}

impl MemoryOutbox {
    /// The events an outbox takes unless [`with_capacity`](Self::with_capacity) says
    /// otherwise.
    pub const DEFAULT_CAPACITY: usize = queue::DEFAULT_CAPACITY;

    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same outbox, taking at most `events` events (at least 1) in every state; past them a
    /// new event is refused (see "Memory" above). Clones share the bound. Nothing is allocated
    /// ahead.
    ///
    /// ```
    /// use surely::outbox::{Event, EventId, MemoryOutbox};
    ///
    /// let outbox = MemoryOutbox::new().with_capacity(1);
    /// let event = |n: u32| {
    ///     let id = EventId::derive(&format!("order o-{n}"), "OrderCreated");
    ///     Event::new(id, format!("order o-{n}"), 1, "OrderCreated", "{}").unwrap()
    /// };
    /// assert!(outbox.try_enqueue(event(1)).unwrap());
    /// assert!(outbox.try_enqueue(event(2)).unwrap_err().is_full());
    /// ```
    #[must_use]
    pub fn with_capacity(self, events: usize) -> Self {
        self.queue.lock().set_capacity(events);
        self
    }

    /// The most events it takes ([`with_capacity`](Self::with_capacity)).
    pub fn capacity(&self) -> usize {
        self.queue.lock().capacity()
    }

    /// The events held, in every state.
    pub fn len(&self) -> usize {
        self.queue.lock().len()
    }

    /// Whether it holds no event.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The [`Wakeup`] this outbox's enqueues wake: give it to
    /// [`RelayBuilder::wake_on`](super::RelayBuilder::wake_on) and an idle relay publishes a new
    /// event at once, not at its next poll.
    pub fn wakeup(&self) -> Wakeup {
        self.wakeup.clone()
    }

    /// Adds `event`; returns false (and changes nothing) if an event with its id is already
    /// here, published or not: one id, one event. Also false, with an error logged, when the
    /// outbox is full (see "Memory" above): [`try_enqueue`](Self::try_enqueue) tells the two
    /// apart.
    pub fn enqueue(&self, event: Event) -> bool {
        self.try_enqueue(event).unwrap_or_else(|e| {
            tracing::error!(
                error = &e as &dyn std::error::Error,
                "outbox event not added"
            );
            false
        })
    }

    /// Adds `event`, as [`enqueue`](Self::enqueue) does: `Ok(false)` (and nothing changed) if an
    /// event with its id is already here.
    ///
    /// # Errors
    ///
    /// [`OutboxError::is_full`]: a new event, and the outbox holds its capacity of events.
    /// Nothing was added; a sweep of published events makes room.
    pub fn try_enqueue(&self, event: Event) -> Result<bool, OutboxError> {
        let id = event.id().clone();
        let row = Row {
            event,
            last_error: None,
        };
        let added = self
            .queue
            .lock()
            .insert(id, State::Pending, None, row)
            .map_err(|queue::Full(capacity)| OutboxError::full(capacity))?;
        if added {
            self.wakeup.wake();
        }
        Ok(added)
    }

    /// The stats now ([`OutboxStore::stats`] without the future).
    pub fn stats_now(&self) -> OutboxStats {
        let items = self.queue.lock();
        let mut stats = OutboxStats::default();
        for item in items.iter() {
            match item.state() {
                State::Pending => {
                    stats.backlog = stats.backlog.saturating_add(1);
                    if stats.oldest.is_none() {
                        stats.oldest = Some(item.age());
                    }
                }
                State::Quarantined => stats.quarantined = stats.quarantined.saturating_add(1),
                State::Published => {}
            }
        }
        stats
    }

    /// The last error of a quarantined or failing event.
    pub fn last_error(&self, id: &EventId) -> Option<String> {
        self.queue.lock().get(id)?.value.last_error.clone()
    }

    /// The quarantined events, oldest first, at most `limit` ([`OutboxStore::quarantined`]
    /// without the future).
    pub fn quarantined_now(&self, limit: usize) -> Vec<Quarantined> {
        self.queue
            .lock()
            .iter()
            .filter(|item| item.state() == State::Quarantined)
            .take(limit)
            .map(quarantined)
            .collect()
    }
}

impl fmt::Debug for MemoryOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryOutbox")
            .field("events", &self.queue.lock().len())
            .finish()
    }
}

impl OutboxStore for MemoryOutbox {
    fn claim(
        &self,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Claimed>, OutboxError>> + Send {
        let claims = self.queue.lock().claim(max, lease, |item| {
            Claimed::new(item.value.event.clone(), item.tries(), item.fence())
        });
        ready(Ok(claims))
    }

    fn published(&self, claimed: &Claimed) -> impl Future<Output = Result<(), OutboxError>> + Send {
        let mut items = self.queue.lock();
        let out = items
            .held(claimed.event.id(), claimed.claim())
            .map(|item| item.settle(State::Published))
            // An event no longer here (discarded, swept) is no longer this claim's either.
            .map_err(|_| OutboxError::stale());
        ready(out)
    }

    fn failed(
        &self,
        claimed: &Claimed,
        error: &str,
        retry_after: Duration,
        quarantine_after: u32,
    ) -> impl Future<Output = Result<Failed, OutboxError>> + Send {
        let mut items = self.queue.lock();
        let out = items
            .held(claimed.event.id(), claimed.claim())
            .map(|item| {
                item.value.last_error = Some(error.to_owned());
                if item.tries().saturating_add(1) >= quarantine_after {
                    item.park(State::Quarantined);
                    Failed::Quarantined
                } else {
                    item.retry_later(State::Pending, retry_after);
                    Failed::Retry
                }
            })
            .map_err(|_| OutboxError::stale());
        ready(out)
    }

    fn sweep(&self, retention: Duration) -> impl Future<Output = Result<u64, OutboxError>> + Send {
        ready(Ok(self.queue.sweep_all(retention)))
    }

    fn sweep_batch(
        &self,
        retention: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, OutboxError>> + Send {
        ready(Ok(self.queue.lock().sweep(retention, limit)))
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
        let found = self
            .queue
            .lock()
            .get(id)
            .filter(|item| item.state() == State::Quarantined)
            .map(quarantined);
        ready(Ok(found))
    }

    fn requeue(&self, id: &EventId) -> impl Future<Output = Result<(), OutboxError>> + Send {
        let out = match self.queue.lock().get_mut(id) {
            Some(item) if item.state() == State::Quarantined => {
                item.reopen(State::Pending);
                item.reset_tries();
                Ok(())
            }
            _ => Err(OutboxError::not_found(id)),
        };
        if out.is_ok() {
            self.wakeup.wake();
        }
        ready(out)
    }

    fn discard(&self, id: &EventId) -> impl Future<Output = Result<Event, OutboxError>> + Send {
        let out = self
            .queue
            .lock()
            .remove_if(id, |item| item.state() == State::Quarantined)
            .map(|item| item.value.event)
            .ok_or_else(|| OutboxError::not_found(id));
        ready(out)
    }
}
