//! The in-memory inbox.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;

use super::wait::{decide, Decision, Prior};
use super::{
    Consumer, Counters, InboxError, InboxStats, InboxSweeper, Processed, Reason, Step, Task,
    TaskState, Versions, Wait, Waiting,
};
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
                tasks: HashMap::new(),
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
    /// (consumer, event id) → a task that waits or is in the manual queue. Never swept; counts
    /// towards the capacity.
    tasks: HashMap<(String, String), MemoryTask>,
}

/// A task's schedule, in memory.
#[derive(Clone, Debug)]
struct MemoryTask {
    event: Event,
    state: TaskState,
    prior: Prior,
    first_at: tokio::time::Instant,
    next_at: tokio::time::Instant,
    why: String,
    steps: Vec<Step>,
    /// A person retried it: the inbox delivers it ([`MemoryInbox::take_retried`]) until it
    /// is applied, stale or back in the manual queue.
    retried: bool,
    /// Handed out by [`MemoryInbox::take_retried`] until then.
    handed_until: Option<tokio::time::Instant>,
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
    /// [`PostgresInbox::sweeper`][super::PostgresInbox::sweeper] and the
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
    /// As [`PostgresInbox::sweeper`][super::PostgresInbox::sweeper].
    #[cfg_attr(
        not(all(feature = "durable", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "super::PostgresInbox::sweeper",
        )
    )]
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
        if let Some(processed) = self.admit(consumer, event, versions, false)? {
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

    /// What a delivery of `event` comes to before its handler runs, if anything: processed
    /// before, in flight, stale or parked, and for a `task`, in the manual queue or come before
    /// its time. `None`: the event is now in flight, and the handler runs.
    fn admit<E>(
        &self,
        consumer: &str,
        event: &Event,
        versions: Versions,
        task: bool,
    ) -> Result<Option<Processed>, InboxError<E>> {
        let id = (consumer.to_owned(), event.id().as_str().to_owned());
        let aggregate = (consumer.to_owned(), event.aggregate().to_owned());
        let early = {
            let mut state = self.state();
            let now = tokio::time::Instant::now();
            let waiting = state.tasks.get(&id).filter(|_| task);
            let known = state.tasks.contains_key(&id);
            match (state.done.get(&id), waiting) {
                (Some(Some(result)), _) => Some(Processed::Duplicate(result.clone())),
                (Some(None), _) => Some(Processed::InFlight),
                (None, Some(t)) if t.state == TaskState::Manual => Some(Processed::Manual {
                    reason: t.prior.reason,
                }),
                (None, Some(t)) if t.next_at > now => Some(Processed::Waiting(Waiting {
                    reason: t.prior.reason,
                    attempts: t.prior.attempts,
                    delay: t.next_at - now,
                    clamped_from: None,
                    early: true,
                    why: t.why.clone(),
                })),
                (None, _)
                    if !known
                        && state.done.len().saturating_add(state.tasks.len()) >= state.capacity =>
                {
                    return Err(InboxError::Full(state.capacity));
                }
                (None, _) => {
                    let last = state.versions.get(&aggregate).copied();
                    let verdict = judge(versions, last, event.version());
                    match verdict {
                        Some(Processed::Stale { .. }) => {
                            state.tasks.remove(&id);
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
        if let Some(Processed::Parked { .. }) = early {
            tracing::warn!(
                consumer,
                event = event.id().as_str(),
                aggregate = event.aggregate(),
                version = event.version(),
                "inbox: event parked for a version gap"
            );
        }
        if let Some(processed) = &early {
            self.counters.count(processed);
        }
        Ok(early)
    }

    /// Processes a delivery of a task: `event` for `consumer`, whose `handler` may answer that
    /// the task must [wait](Wait), and why, instead of succeeding. The consumer's
    /// [policy](super::WaitPolicy) for the reason decides when it comes back, and when it goes
    /// to a person ([the reasons](crate::docs::boundary#why-a-task-waits)); the inbox keeps the
    /// task's schedule, so that a delivery that comes before the task's time does not run the
    /// handler.
    ///
    /// * `Ok`: applied, recorded as for [`process`](Self::process); the task's schedule is
    ///   forgotten.
    /// * A wait that comes back: [`Processed::Waiting`], with the delay; deliver the event
    ///   again after it (nothing is recorded as processed).
    /// * A wait that went to a person (refused, expired, out of attempts, or paced beyond the
    ///   policy): [`Processed::Manual`]; later deliveries answer the same without running the
    ///   handler, until a person retries or discards the task.
    /// * [Stale](Wait::stale): recorded as processed, as a no-op: [`Processed::Stale`] with
    ///   the business object's version; a redelivery is a duplicate.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::inbox::{Consumer, MemoryInbox, Processed, Wait};
    /// use surely::outbox::{Event, EventId};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let inbox = MemoryInbox::new();
    /// let consumer = Consumer::builder("inventory").build().unwrap();
    /// let reserve = Event::new(EventId::derive("order o-1", "Reserve"), "order o-1", 1,
    ///     "Reserve", "sku-42").unwrap();
    /// let mut in_stock = 0;
    /// let processed = inbox
    ///     .process_task(&consumer, &reserve, || async {
    ///         if in_stock == 0 {
    ///             return Err(Wait::business("sku-42 is out of stock"));
    ///         }
    ///         Ok(bytes::Bytes::from("reserved"))
    ///     })
    ///     .await
    ///     .unwrap();
    /// // The business policy rechecks in five minutes: not sooner.
    /// assert_eq!(processed.delay(), Some(Duration::from_secs(300)));
    ///
    /// in_stock = 5;
    /// tokio::time::advance(Duration::from_secs(60)).await;
    /// let early = inbox.process_task(&consumer, &reserve, || async { Ok(bytes::Bytes::new()) });
    /// assert!(matches!(early.await.unwrap(), Processed::Waiting(w) if w.early));
    ///
    /// tokio::time::advance(Duration::from_secs(240)).await;
    /// let processed = inbox.process_task(&consumer, &reserve, || async {
    ///     Ok(bytes::Bytes::from(format!("reserved 1 of {in_stock}")))
    /// });
    /// assert!(matches!(processed.await.unwrap(), Processed::Applied(_)));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`InboxError::Full`]: the event is new and the inbox holds its capacity (a waiting
    /// task counts as a record); the handler did not run, nothing is recorded.
    pub async fn process_task<F, Fut>(
        &self,
        consumer: &Consumer,
        event: &Event,
        handler: F,
    ) -> Result<Processed, InboxError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Bytes, Wait>>,
    {
        let (name, versions) = (consumer.name(), consumer.versions());
        if let Some(processed) = self.admit(name, event, versions, true)? {
            return Ok(processed);
        }
        let id = (name.to_owned(), event.id().as_str().to_owned());
        let answer = handler().await;
        let now = tokio::time::Instant::now();
        let mut state = self.state();
        let wait = match answer {
            Ok(result) => {
                state.tasks.remove(&id);
                state.record(id, result.clone());
                if versions != Versions::Any {
                    let key = (name.to_owned(), event.aggregate().to_owned());
                    let v = state.versions.entry(key).or_insert(event.version());
                    *v = (*v).max(event.version());
                }
                drop(state);
                let processed = Processed::Applied(result);
                self.counters.count(&processed);
                return Ok(processed);
            }
            Err(wait) => wait,
        };
        state.done.remove(&id);
        let task = state.tasks.get(&id);
        let prior = task.map(|t| t.prior);
        let age = task.map_or(Duration::ZERO, |t| {
            now.saturating_duration_since(t.first_at)
        });
        let decision = decide(consumer, prior, age, &wait);
        let step = decision.step(&wait);
        let processed = match decision {
            Decision::Stale { current, why } => {
                state.tasks.remove(&id);
                state.record(id, Bytes::from(stale_note(event.version(), current, &why)));
                Processed::Stale { applied: current }
            }
            Decision::Retry {
                reason,
                attempts,
                streak,
                delay,
                clamped_from,
            } => {
                let task = state
                    .tasks
                    .entry(id)
                    .or_insert_with(|| MemoryTask::new(event, now));
                task.state = TaskState::Waiting;
                task.prior = Prior {
                    reason,
                    attempts,
                    streak,
                };
                task.next_at = now + delay;
                task.handed_until = None;
                task.why = wait.why().to_owned();
                task.steps.extend(step);
                Processed::Waiting(Waiting {
                    reason,
                    attempts,
                    delay,
                    clamped_from,
                    early: false,
                    why: wait.why().to_owned(),
                })
            }
            Decision::Manual {
                reason,
                attempts,
                streak,
                why,
            } => {
                tracing::warn!(consumer = name, event = event.id().as_str(), %reason, why, "inbox: a task went to the manual queue");
                let task = state
                    .tasks
                    .entry(id)
                    .or_insert_with(|| MemoryTask::new(event, now));
                task.state = TaskState::Manual;
                task.prior = Prior {
                    reason,
                    attempts,
                    streak,
                };
                task.retried = false;
                task.handed_until = None;
                task.why = why;
                task.steps.extend(step);
                self.counters.to_manual();
                Processed::Manual { reason }
            }
        };
        drop(state);
        self.counters.count(&processed);
        Ok(processed)
    }
}

impl MemoryInbox {
    /// The tasks of `consumer` (every consumer's if `None`) that wait or are in the manual
    /// queue (only those in `state`, if given), the oldest first, at most `limit`.
    pub fn tasks(
        &self,
        consumer: Option<&str>,
        state: Option<TaskState>,
        limit: usize,
    ) -> Vec<Task> {
        let now = tokio::time::Instant::now();
        let inner = self.state();
        let mut tasks: Vec<Task> = inner
            .tasks
            .iter()
            .filter(|((c, _), t)| {
                consumer.is_none_or(|consumer| c == consumer) && state.is_none_or(|s| s == t.state)
            })
            .map(|((c, _), t)| t.view(c, now))
            .collect();
        tasks.sort_by_key(|t| std::cmp::Reverse(t.age));
        tasks.truncate(limit);
        tasks
    }

    /// The tasks it keeps, counted by state and reason ([`TaskStore::stats`](super::TaskStore::stats)).
    pub fn task_stats(&self) -> super::TaskStats {
        let now = tokio::time::Instant::now();
        let mut stats = super::TaskStats::default();
        for task in self.state().tasks.values() {
            let age = now.saturating_duration_since(task.first_at);
            stats.add(task.state, task.prior.reason, 1, age);
        }
        stats
    }

    /// The task of `consumer` for the event `event_id`, if it waits or is in the manual queue.
    pub fn task(&self, consumer: &str, event_id: &str) -> Option<Task> {
        let now = tokio::time::Instant::now();
        let id = (consumer.to_owned(), event_id.to_owned());
        self.state().tasks.get(&id).map(|t| t.view(consumer, now))
    }

    /// A person sends a task in the manual queue back to its handler: it is due at once, its
    /// expiry counts afresh from now, its attempts are kept, and `who` and `why` are its note.
    /// [`take_retried`](Self::take_retried) hands its event to the consumer.
    ///
    /// # Errors
    ///
    /// [`InboxError::Invalid`] for an empty `who` or `why`, one too long or with a control
    /// character; [`InboxError::NoSuchTask`] if the task is not in the manual queue.
    pub fn retry_task(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<(), InboxError> {
        check_person(who, why)?;
        let now = tokio::time::Instant::now();
        let id = (consumer.to_owned(), event_id.to_owned());
        let mut state = self.state();
        let task = state
            .tasks
            .get_mut(&id)
            .filter(|t| t.state == TaskState::Manual)
            .ok_or_else(|| no_such_task(consumer, event_id))?;
        task.state = TaskState::Waiting;
        task.prior.streak = 0;
        task.first_at = now;
        task.next_at = now;
        task.why = format!("retried by {who}: {why}");
        task.retried = true;
        task.handed_until = None;
        Ok(())
    }

    /// A person discards a task in the manual queue: it is recorded as processed, its result
    /// `discarded by <who>: <why>`, so that a redelivery is a duplicate and never runs the
    /// handler. Returns that result.
    ///
    /// # Errors
    ///
    /// As [`retry_task`](Self::retry_task).
    pub fn discard_task(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<Bytes, InboxError> {
        check_person(who, why)?;
        let id = (consumer.to_owned(), event_id.to_owned());
        let mut state = self.state();
        match state.tasks.get(&id) {
            Some(t) if t.state == TaskState::Manual => {}
            _ => return Err(no_such_task(consumer, event_id)),
        }
        state.tasks.remove(&id);
        let result = Bytes::from(format!("discarded by {who}: {why}"));
        state.record(id, result.clone());
        Ok(result)
    }

    /// The events of at most `limit` tasks of `consumer` that a person
    /// [retried](Self::retry_task) and that are due, each handed out for `lease`: process each
    /// with [`process_task`](Self::process_task), as a delivery, which ends the hand-out. The
    /// inbox delivers a retried task from then on: one that waits again is handed out again
    /// once its time comes, until it is applied, stale, or back in the manual queue. Call it
    /// on a timer.
    pub fn take_retried(&self, consumer: &str, limit: usize, lease: Duration) -> Vec<Event> {
        let now = tokio::time::Instant::now();
        let until = now + lease.min(crate::MAX_DURATION);
        let mut state = self.state();
        let mut events = Vec::new();
        for ((c, _), task) in state.tasks.iter_mut() {
            if events.len() >= limit {
                break;
            }
            let free = task.handed_until.is_none_or(|t| t <= now);
            if c == consumer
                && task.retried
                && task.state == TaskState::Waiting
                && task.next_at <= now
                && free
            {
                task.handed_until = Some(until);
                events.push(task.event.clone());
            }
        }
        events
    }
}

/// Checks a person's name and reason, as the ledger does.
pub(crate) fn check_person(who: &str, why: &str) -> Result<(), InboxError> {
    crate::ledger::check_text("who", who, 256, false).map_err(InboxError::Invalid)?;
    crate::ledger::check_text("why", why, 16 * 1024, true).map_err(InboxError::Invalid)
}

/// The error of a person's action on a task not in the manual queue.
pub(crate) fn no_such_task(consumer: &str, event_id: &str) -> InboxError {
    let cut = |s: &str| crate::ledger::truncate(s, 256).to_owned();
    InboxError::NoSuchTask(format!(
        "consumer `{}`, event `{}`",
        cut(consumer),
        cut(event_id)
    ))
}

impl MemoryTask {
    /// What a person reads of it, `now`.
    fn view(&self, consumer: &str, now: tokio::time::Instant) -> Task {
        Task {
            consumer: consumer.to_owned(),
            event: self.event.clone(),
            state: self.state,
            reason: self.prior.reason,
            attempts: self.prior.attempts,
            age: now.saturating_duration_since(self.first_at),
            due_in: (self.state == TaskState::Waiting)
                .then(|| self.next_at.saturating_duration_since(now)),
            why: self.why.clone(),
            steps: self.steps.clone(),
        }
    }

    /// A task's first wait, `now`.
    fn new(event: &Event, now: tokio::time::Instant) -> MemoryTask {
        MemoryTask {
            event: event.clone(),
            state: TaskState::Waiting,
            prior: Prior {
                reason: Reason::Transient,
                attempts: 0,
                streak: 0,
            },
            first_at: now,
            next_at: now,
            why: String::new(),
            steps: Vec::new(),
            retried: false,
            handed_until: None,
        }
    }
}

/// What a stale task's record says: the versions that made it stale, and why.
pub(crate) fn stale_note(task: i64, current: i64, why: &str) -> String {
    format!("stale: the task is for version {task}, the business object is at {current}: {why}")
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
