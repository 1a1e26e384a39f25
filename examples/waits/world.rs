//! Where things are kept: the inbox, the business state and the broker, behind one trait.

use std::time::Duration;

use bytes::Bytes;
use surely::inbox::{Consumer, InboxStats, Processed, Task, TaskState};
use surely::outbox::Event;

use crate::handlers::Ctx;
use crate::{BoxError, CHARGE};

/// The business state after the run.
pub(crate) struct Snapshot {
    pub(crate) stock: i64,
    /// (order, quantity)
    pub(crate) reservations: Vec<(String, i64)>,
    /// (order, amount)
    pub(crate) charges: Vec<(String, i64)>,
}

/// The inbox, the business state and the broker, in memory or in PostgreSQL with JetStream.
/// The story is the same for both.
pub(crate) trait World {
    /// A delivery from the broker.
    type Delivery;

    /// One line on where things are kept.
    fn describe(&self) -> String;
    /// The stock of `SKU` and the orders, each at version 1.
    async fn open(&self) -> Result<(), BoxError>;
    /// Hands `event` to the broker.
    async fn publish(&self, event: Event) -> Result<(), BoxError>;
    /// The deliveries due now, waiting at most `wait` for one.
    async fn fetch(&self, wait: Duration) -> Result<Vec<Self::Delivery>, BoxError>;
    /// Processes a delivery as `consumer`'s task and answers the broker: acknowledged, or
    /// acknowledged negatively with the delay the inbox gave.
    async fn process(
        &self,
        consumers: &[Consumer; 2],
        delivery: Self::Delivery,
        ctx: &Ctx,
    ) -> Result<(Consumer, Event, Processed), BoxError>;
    /// Processes `event` outside the broker: a task a person retried, or a redelivery.
    async fn process_event(
        &self,
        consumer: &Consumer,
        event: &Event,
        ctx: &Ctx,
    ) -> Result<Processed, BoxError>;
    /// The person's side of the inbox, as `MemoryInbox` and `PostgresInbox` have it.
    async fn tasks(&self, consumer: &str, state: Option<TaskState>) -> Result<Vec<Task>, BoxError>;
    async fn task(&self, consumer: &str, event_id: &str) -> Result<Option<Task>, BoxError>;
    async fn retry_task(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<(), BoxError>;
    async fn discard_task(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<Bytes, BoxError>;
    /// The tasks of `consumer` a person retried, handed to this process.
    async fn take_retried(&self, consumer: &str) -> Result<Vec<Event>, BoxError>;
    fn stats(&self) -> InboxStats;
    /// The order moves on: version 2, cancelled. Returns the new version.
    async fn cancel(&self, order: &str) -> Result<i64, BoxError>;
    /// The supplier's delivery: what is in stock after it.
    async fn replenish(&self, qty: i64) -> Result<i64, BoxError>;
    /// A person approves a charge over the limit for `order`.
    async fn approve(&self, order: &str) -> Result<(), BoxError>;
    /// The stock, the reservations and the charges.
    async fn snapshot(&self) -> Result<Snapshot, BoxError>;
}

/// The consumer of a task's kind.
pub(crate) fn consumer_for<'c>(consumers: &'c [Consumer; 2], event: &Event) -> &'c Consumer {
    match event.kind() {
        CHARGE => &consumers[1],
        _ => &consumers[0],
    }
}
