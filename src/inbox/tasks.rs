//! The person's side of the tasks: one trait over the inboxes that keep them, for the admin,
//! the command line and a host's own tools.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use super::{InboxError, MemoryInbox, Reason, Task, TaskState};

/// How many tasks are in one state for one reason, and how long the oldest of them has waited
/// (since its first wait, or a person's last retry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskCount {
    /// Waiting, or in the manual queue.
    pub state: TaskState,
    /// Why they waited last.
    pub reason: Reason,
    /// How many.
    pub tasks: u64,
    /// The oldest one's age.
    pub oldest: Duration,
}

/// The tasks an inbox keeps, counted by state and reason: what the metrics export.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskStats {
    /// One count per state and reason that has tasks, in state then reason order.
    pub counts: Vec<TaskCount>,
    /// Tasks whose stored reason this version does not know: held, counted here.
    pub unknown: u64,
}

impl TaskStats {
    /// The count of `state` and `reason`, if there are such tasks.
    pub fn get(&self, state: TaskState, reason: Reason) -> Option<&TaskCount> {
        self.counts
            .iter()
            .find(|c| c.state == state && c.reason == reason)
    }

    /// How many tasks are in `state`, whatever their reason.
    pub fn total(&self, state: TaskState) -> u64 {
        self.counts
            .iter()
            .filter(|c| c.state == state)
            .map(|c| c.tasks)
            .sum()
    }

    /// Counts `tasks` more of `state` and `reason`, the oldest of them `oldest` old.
    pub(crate) fn add(&mut self, state: TaskState, reason: Reason, tasks: u64, oldest: Duration) {
        match self
            .counts
            .iter_mut()
            .find(|c| c.state == state && c.reason == reason)
        {
            Some(c) => {
                c.tasks = c.tasks.saturating_add(tasks);
                c.oldest = c.oldest.max(oldest);
            }
            None => self.counts.push(TaskCount {
                state,
                reason,
                tasks,
                oldest,
            }),
        }
        self.counts
            .sort_by_key(|c| (c.state == TaskState::Manual, c.reason));
    }
}

/// Where tasks that wait, and tasks a person must decide, are kept: [`MemoryInbox`] and
/// [`PostgresInbox`][super::PostgresInbox] implement it. The admin
/// ([`AdminBuilder::tasks`][crate::admin::AdminBuilder::tasks], feature `admin`) and the
/// `surely tasks` command work through it.
///
/// ```
/// use surely::inbox::{Consumer, MemoryInbox, Processed, Reason, TaskState, TaskStore, Wait};
/// use surely::outbox::{Event, EventId};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let inbox = MemoryInbox::new();
/// let payments = Consumer::builder("payments").build().unwrap();
/// let charge = Event::new(EventId::derive("order o-9", "Charge"), "order o-9", 1, "Charge",
///     "12 000 EUR").unwrap();
/// let refused = inbox
///     .process_task(&payments, &charge, || async {
///         Err(Wait::person("limit rule", "over the 10 000 EUR a card may be charged"))
///     })
///     .await
///     .unwrap();
/// assert_eq!(refused, Processed::Manual { reason: Reason::Person });
///
/// let stats = TaskStore::stats(&inbox).await.unwrap();
/// assert_eq!(stats.total(TaskState::Manual), 1);
/// TaskStore::discard(&inbox, "payments", charge.id().as_str(), "ana", "the customer paid by transfer")
///     .await
///     .unwrap();
/// assert_eq!(TaskStore::stats(&inbox).await.unwrap().total(TaskState::Manual), 0);
/// # }
/// ```
#[cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "super::PostgresInbox",
    )
)]
#[cfg_attr(
    not(feature = "admin"),
    doc = crate::docs::links::to_features!(
        "crate::admin::AdminBuilder::tasks",
    )
)]
pub trait TaskStore: Send + Sync + 'static {
    /// The tasks of `consumer` (every consumer's if `None`) in `state` (both states if `None`),
    /// the oldest first, at most `limit`; without their steps.
    fn list(
        &self,
        consumer: Option<&str>,
        state: Option<TaskState>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Task>, InboxError>> + Send;

    /// One task, with its steps.
    fn get(
        &self,
        consumer: &str,
        event_id: &str,
    ) -> impl Future<Output = Result<Option<Task>, InboxError>> + Send;

    /// A person sends a task in the manual queue back to its handler (who, and why).
    fn retry(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> impl Future<Output = Result<(), InboxError>> + Send;

    /// A person discards a task in the manual queue (who, and why); returns the result its
    /// record keeps.
    fn discard(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> impl Future<Output = Result<Bytes, InboxError>> + Send;

    /// The tasks counted by state and reason, with the oldest's age.
    fn stats(&self) -> impl Future<Output = Result<TaskStats, InboxError>> + Send;
}

impl TaskStore for MemoryInbox {
    async fn list(
        &self,
        consumer: Option<&str>,
        state: Option<TaskState>,
        limit: usize,
    ) -> Result<Vec<Task>, InboxError> {
        Ok(self.tasks(consumer, state, limit))
    }

    async fn get(&self, consumer: &str, event_id: &str) -> Result<Option<Task>, InboxError> {
        Ok(self.task(consumer, event_id))
    }

    async fn retry(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<(), InboxError> {
        self.retry_task(consumer, event_id, who, why)
    }

    async fn discard(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<Bytes, InboxError> {
        self.discard_task(consumer, event_id, who, why)
    }

    async fn stats(&self) -> Result<TaskStats, InboxError> {
        Ok(self.task_stats())
    }
}

#[cfg(feature = "postgres")]
impl TaskStore for super::PostgresInbox {
    async fn list(
        &self,
        consumer: Option<&str>,
        state: Option<TaskState>,
        limit: usize,
    ) -> Result<Vec<Task>, InboxError> {
        self.tasks(consumer, state, limit).await
    }

    async fn get(&self, consumer: &str, event_id: &str) -> Result<Option<Task>, InboxError> {
        self.task(consumer, event_id).await
    }

    async fn retry(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<(), InboxError> {
        self.retry_task(consumer, event_id, who, why).await
    }

    async fn discard(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<Bytes, InboxError> {
        self.discard_task(consumer, event_id, who, why).await
    }

    async fn stats(&self) -> Result<TaskStats, InboxError> {
        self.task_stats().await
    }
}
