//! The in-memory inbox.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;

use super::{Counters, InboxError, InboxStats, InboxSweeper, Processed, Versions};
use crate::outbox::Event;

/// The embedded inbox: records in memory, for one process, and for tests. The handler runs
/// outside any lock; a second delivery of an event being processed gets
/// [`Processed::InFlight`]. Clones share the records.
///
/// # Memory
///
/// At most [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) records (1 000 000) of events
/// processed or in flight, each its consumer, id and result (the versions applied, one per
/// consumer and aggregate, are fewer); [`with_capacity`](Self::with_capacity) sets another
/// bound. It forgets none to make room (a record forgotten lets a redelivery run the handler
/// again), and keeps them until its sweep deletes those past their retention: past the bound an event new to it is refused
/// with [`InboxError::Full`], the handler not run and nothing recorded, while duplicates of the
/// events it holds are still answered. Give its [sweeper](Self::sweeper) to the
/// [maintenance](crate::maintenance::Maintenance) so that records past the retention make room,
/// size it for the events a process handles within that retention, or use the PostgreSQL inbox.
#[derive(Clone)]
pub struct MemoryInbox {
    inner: Arc<Mutex<State>>,
    counters: Arc<Counters>,
}

impl Default for MemoryInbox {
    fn default() -> Self {
        MemoryInbox {
            inner: Arc::new(Mutex::new(State {
                done: HashMap::new(),
                versions: HashMap::new(),
                capacity: Self::DEFAULT_CAPACITY,
                recorded: VecDeque::new(),
            })),
            counters: Arc::default(),
        }
    }
}

struct State {
    /// (consumer, event id) → the result, or `None` while in flight.
    done: HashMap<(String, String), Option<Bytes>>,
    /// (consumer, aggregate) → the last version applied. Never swept.
    versions: HashMap<(String, String), i64>,
    /// The most records `done` takes (`versions` has at most one per record applied).
    capacity: usize,
    /// The records of `done` that have a result, by when they were recorded: the oldest
    /// first (times only grow under the lock).
    recorded: VecDeque<(tokio::time::Instant, (String, String))>,
}

impl State {
    /// Records `id`'s result, and when.
    fn record(&mut self, id: (String, String), result: Bytes) {
        self.recorded
            .push_back((tokio::time::Instant::now(), id.clone()));
        self.done.insert(id, Some(result));
    }
}

impl MemoryInbox {
    /// The records an inbox takes unless [`with_capacity`](Self::with_capacity) says otherwise.
    pub const DEFAULT_CAPACITY: usize = 1_000_000;

    /// An empty inbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same inbox, taking at most `records` records (at least 1) of events processed or in
    /// flight; past them an event new to it is refused with [`InboxError::Full`] (see "Memory"
    /// above). Clones share the bound. Nothing is allocated ahead.
    ///
    /// ```
    /// use surely::inbox::MemoryInbox;
    ///
    /// let inbox = MemoryInbox::new().with_capacity(10_000);
    /// assert_eq!(inbox.capacity(), 10_000);
    /// ```
    #[must_use]
    pub fn with_capacity(self, records: usize) -> Self {
        self.state().capacity = records.max(1);
        self
    }

    /// The most records it takes ([`with_capacity`](Self::with_capacity)).
    pub fn capacity(&self) -> usize {
        self.state().capacity
    }

    /// The records held: events processed, or in flight.
    pub fn len(&self) -> usize {
        self.state().done.len()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counts since the inbox was made.
    pub fn stats(&self) -> InboxStats {
        self.counters.stats()
    }

    /// Deletes at most `limit` of the records made `retention` ago or more (at most
    /// [`MAX_DURATION`](crate::MAX_DURATION) counted), the oldest first; returns how many. A
    /// delivery in flight is not a record yet, and the versions are kept. What an
    /// [`InboxSweeper`] runs.
    pub(crate) fn sweep_batch(&self, retention: Duration, limit: usize) -> u64 {
        let now = tokio::time::Instant::now();
        let retention = retention.min(crate::MAX_DURATION);
        let mut state = self.state();
        let mut done = 0u64;
        while (done as usize) < limit {
            match state.recorded.front() {
                Some((at, _)) if now.saturating_duration_since(*at) >= retention => {}
                _ => break,
            }
            if let Some((_, id)) = state.recorded.pop_front() {
                state.done.remove(&id);
                done = done.saturating_add(1);
            }
        }
        done
    }

    /// The [chore](crate::maintenance::Chore) that deletes this inbox's records made
    /// `retention` ago or more ([`InboxSweeper`]), named `inbox memory <this process>`: each
    /// process sweeps its own memory. The versions are kept; `retention` must exceed the
    /// broker's `redelivery_window` (see
    /// [`PostgresInbox::sweeper`](super::PostgresInbox::sweeper) and the
    /// [module docs](super#retention)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::inbox::MemoryInbox;
    ///
    /// let inbox = MemoryInbox::new();
    /// let hour = Duration::from_secs(3600);
    /// assert!(inbox.sweeper(2 * hour, hour).is_ok());
    /// let err = inbox.sweeper(hour, 2 * hour).unwrap_err();
    /// assert_eq!(err.setting(), "inbox retention");
    /// ```
    ///
    /// # Errors
    ///
    /// As [`PostgresInbox::sweeper`](super::PostgresInbox::sweeper).
    pub fn sweeper(
        &self,
        retention: Duration,
        redelivery_window: Duration,
    ) -> Result<InboxSweeper, crate::ConfigError> {
        InboxSweeper::new(
            super::sweeper::Target::Memory(self.clone()),
            crate::maintenance::memory_chore_name("inbox"),
            retention,
            redelivery_window,
        )
    }

    /// Processes a delivery of `event` for `consumer`: runs `handler` unless the event was
    /// processed before, is stale, or is parked (see the [module docs](super)).
    ///
    /// # Errors
    ///
    /// The handler failed: nothing is recorded, and a redelivery runs it again. Or
    /// [`InboxError::Full`]: the event is new and the inbox holds its capacity; the handler
    /// did not run, nothing is recorded.
    pub async fn process<F, Fut, E>(
        &self,
        consumer: &str,
        event: &Event,
        versions: Versions,
        handler: F,
    ) -> Result<Processed, InboxError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Bytes, E>>,
    {
        let id = (consumer.to_owned(), event.id().as_str().to_owned());
        let aggregate = (consumer.to_owned(), event.aggregate().to_owned());
        let early = {
            let mut state = self.state();
            match state.done.get(&id) {
                Some(Some(result)) => Some(Processed::Duplicate(result.clone())),
                Some(None) => Some(Processed::InFlight),
                None if state.done.len() >= state.capacity => {
                    return Err(InboxError::Full(state.capacity));
                }
                None => {
                    let last = state.versions.get(&aggregate).copied();
                    let verdict = judge(versions, last, event.version());
                    match verdict {
                        Some(Processed::Stale { .. }) => {
                            state.record(id.clone(), Bytes::new());
                        }
                        Some(_) => {}
                        None => {
                            state.done.insert(id.clone(), None);
                        }
                    }
                    verdict
                }
            }
        };
        if let Some(processed) = early {
            if let Processed::Parked { .. } = processed {
                tracing::warn!(
                    consumer,
                    event = event.id().as_str(),
                    aggregate = event.aggregate(),
                    version = event.version(),
                    "inbox: event parked for a version gap"
                );
            }
            self.counters.count(&processed);
            return Ok(processed);
        }
        match handler().await {
            Ok(result) => {
                let mut state = self.state();
                state.record(id, result.clone());
                if versions != Versions::Any {
                    let v = state.versions.entry(aggregate).or_insert(event.version());
                    *v = (*v).max(event.version());
                }
                drop(state);
                let processed = Processed::Applied(result);
                self.counters.count(&processed);
                Ok(processed)
            }
            Err(e) => {
                self.state().done.remove(&id);
                Err(InboxError::Handler(e))
            }
        }
    }
}

/// What the versions say about an event of `version`, after `last`: `None` to apply it.
pub(crate) fn judge(versions: Versions, last: Option<i64>, version: i64) -> Option<Processed> {
    let last = last?;
    match versions {
        Versions::Any => None,
        _ if version <= last => Some(Processed::Stale { applied: last }),
        Versions::InOrder if version > last.saturating_add(1) => {
            Some(Processed::Parked { applied: last })
        }
        Versions::InOrder | Versions::Latest => None,
    }
}

impl fmt::Debug for MemoryInbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryInbox")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
