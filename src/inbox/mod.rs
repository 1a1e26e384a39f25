//! The inbox: a consumer applies each event's effect once, however often it is delivered
//! ([`docs::boundary`](crate::docs::boundary)).
//!
//! An outbox delivers at least once: a relay that crashed before marking an event publishes it
//! again, and a consumer that crashed after its write but before its acknowledgement gets it
//! again. The inbox makes the repeat harmless. It records `(consumer, event id)` in the **same
//! transaction** as the consumer's business write: the first delivery commits both; a later
//! one finds the record and gets the first one's result back, without running the handler.
//!
//! Per aggregate, events carry versions, and deliveries can come out of order. A consumer says
//! what it wants with [`Versions`]:
//!
//! * [`Any`](Versions::Any): no version check; each event is applied once.
//! * [`InOrder`](Versions::InOrder): an event not newer than the last applied version is a
//!   recorded no-op ([`Stale`](Processed::Stale)); one that skips a version is **parked**
//!   ([`Parked`](Processed::Parked)): not applied, not recorded, reported, so that its
//!   redelivery after the missing one is applied. For events that describe changes (stock
//!   decremented by 1).
//! * [`Latest`](Versions::Latest): an event not newer than the last applied version is a
//!   recorded no-op; any newer one applies over the older state. For events that carry the
//!   whole state (stock is now 12).
//!
//! [`PostgresInbox`] (feature `postgres`) writes in the consumer's transaction;
//! [`MemoryInbox`] is the embedded one, and the one for tests.
//!
//! # Tasks that wait
//!
//! An event that asks for work (reserve the stock, charge the card) is a **task**, and its
//! handler may answer why it cannot be done now instead of failing: a [`Wait`] with a
//! [`Reason`] (transient, paced, business, stale, person). A [`Consumer`] holds a
//! [`WaitPolicy`] per reason; the inbox keeps each waiting task's schedule, answers
//! [`Processed::Waiting`] with the delay (the JetStream consumer `nak`s with it), never runs a
//! task before its time, and sends one that expires, runs out of attempts or is refused to the
//! manual queue, where a person retries or discards it. See
//! [`MemoryInbox::process_task`] and
//! [`docs::boundary`](crate::docs::boundary#why-a-task-waits) for the reasons' table.
//!
//! # Retention
//!
//! The inbox keeps a record of every event it processed, and the latest version applied of
//! each aggregate. Without a sweeper it keeps them for ever. An [`InboxSweeper`]
//! ([`PostgresInbox::sweeper`], [`MemoryInbox::sweeper`]), run by a
//! [`Maintenance`](crate::maintenance::Maintenance), deletes the records of events processed
//! longer ago than its retention, in leased, bounded batches, and **never the versions**. What
//! a redelivery then gets depends on the consumer's [`Versions`]:
//!
//! * [`InOrder`](Versions::InOrder) and [`Latest`](Versions::Latest): an event whose record was
//!   swept is not newer than its aggregate's version, so its redelivery is
//!   [`Stale`](Processed::Stale) (recorded again, not applied), where before the sweep it was a
//!   [`Duplicate`](Processed::Duplicate) with the first result. However late it comes, it is
//!   not applied twice.
//! * [`Any`](Versions::Any): nothing but the record says the event was applied. A redelivery
//!   after its record was swept **is applied again**. That is why the retention must exceed the
//!   broker's redelivery window, the longest time after a first delivery that the broker may
//!   deliver the event again (a JetStream stream's `max_age`, a RabbitMQ queue's message TTL
//!   and the longest a consumer may hold a message unacknowledged, the outbox's relay's
//!   longest retry): the sweeper refuses a retention that does not, naming both values. A
//!   broker with no bound on redelivery needs events with versions, or no sweep.
//!
//! ```
//! use surely::inbox::{MemoryInbox, Processed, Versions};
//! use surely::outbox::{Event, EventId};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let inbox = MemoryInbox::new();
//! let event = Event::new(EventId::derive("order o-1", "OrderCreated"), "order o-1", 1,
//!     "OrderCreated", "sku-42").unwrap();
//! let mut stock = 12;
//! for _delivery in 0..2 {
//!     let processed = inbox
//!         .process("inventory", &event, Versions::InOrder, || async {
//!             stock -= 1;
//!             Ok::<_, std::io::Error>(bytes::Bytes::from("reserved"))
//!         })
//!         .await
//!         .unwrap();
//!     assert!(matches!(processed, Processed::Applied(_) | Processed::Duplicate(_)));
//! }
//! assert_eq!(stock, 11, "delivered twice, applied once");
//! assert_eq!(inbox.stats().duplicates, 1);
//! # }
//! ```
#![cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "`PostgresInbox`",
        "`PostgresInbox::sweeper`",
    )
)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::classify::BoxError;

#[cfg(all(feature = "postgres", any(feature = "nats", feature = "rabbitmq")))]
mod delivered;
#[cfg(all(feature = "postgres", feature = "nats"))]
mod jetstream;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(all(feature = "postgres", feature = "rabbitmq"))]
mod rabbitmq;
mod sweeper;
mod tasks;
mod wait;

pub use self::memory::MemoryInbox;
#[cfg(feature = "postgres")]
pub(crate) use self::postgres::POSTGRES_COMPONENT;
#[cfg(feature = "postgres")]
pub use self::postgres::{Begin, Handler, InboxTransaction, PostgresInbox, Ticket};
pub use self::sweeper::InboxSweeper;
pub use self::tasks::{TaskCount, TaskStats, TaskStore};
pub use self::wait::{
    Consumer, ConsumerBuilder, Reason, Step, Task, TaskState, UnknownReason, Wait, WaitPolicy,
    Waiting,
};

/// How a consumer treats the versions of an aggregate's events. See the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Versions {
    /// No version check.
    Any,
    /// Each version after the last applied one, in turn: older ones are no-ops, gaps are parked.
    InOrder,
    /// Any version newer than the last applied one: older ones are no-ops.
    Latest,
}

/// What a delivery came to.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Processed {
    /// The handler ran, and this is its result.
    Applied(Bytes),
    /// The event was processed before (or found stale before): the handler did not run; the
    /// first processing's result (empty for a stale one).
    Duplicate(Bytes),
    /// The aggregate is already at `applied` or beyond: the event is recorded, not applied.
    Stale {
        /// The last version applied.
        applied: i64,
    },
    /// The event skips a version ([`Versions::InOrder`]): not applied and not recorded, so that
    /// a redelivery after the missing event applies it. Acknowledge it negatively (redeliver
    /// later).
    Parked {
        /// The last version applied; the event was for a later one than the next.
        applied: i64,
    },
    /// ([`MemoryInbox`] only) Another delivery of the event is being processed now: nothing
    /// was done; redeliver later. [`PostgresInbox`] waits for the other transaction instead.
    #[cfg_attr(
        not(all(feature = "durable", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "`PostgresInbox`",
        )
    )]
    InFlight,
    /// (A task: [`MemoryInbox::process_task`]) It waits: the handler answered a
    /// [`Wait`] that comes back, or the delivery came before the task's time. Not recorded as
    /// processed; acknowledge it negatively with its [`delay`](Waiting::delay).
    Waiting(Waiting),
    /// (A task) It is in the manual queue: a person must retry or discard it. The delivery may
    /// be acknowledged: the task is kept in the inbox's store, and a redelivery does not run
    /// the handler.
    Manual {
        /// Why it waited last.
        reason: Reason,
    },
}

impl Processed {
    /// Whether the delivery may be acknowledged: it was applied, or never needs to be (a task
    /// in the manual queue is kept by the inbox).
    pub fn is_settled(&self) -> bool {
        !matches!(
            self,
            Processed::Parked { .. } | Processed::InFlight | Processed::Waiting(_)
        )
    }

    /// How long to wait before the delivery comes again, for one that waits.
    pub fn delay(&self) -> Option<std::time::Duration> {
        match self {
            Processed::Waiting(waiting) => Some(waiting.delay),
            _ => None,
        }
    }
}

/// An inbox's counts since it was made: deliveries processed by this process, a delivery whose
/// transaction later rolled back included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxStats {
    /// Events applied.
    pub applied: u64,
    /// Deliveries of events already processed: the duplicates the inbox absorbed.
    pub duplicates: u64,
    /// Events recorded as no-ops for being stale.
    pub stale: u64,
    /// Events parked for a gap.
    pub parked: u64,
    /// Tasks' waits: handler answers that a task comes back later, and deliveries that came
    /// before their task's time.
    pub waits: u64,
    /// Tasks that went to the manual queue.
    pub to_manual: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    applied: AtomicU64,
    duplicates: AtomicU64,
    stale: AtomicU64,
    parked: AtomicU64,
    waits: AtomicU64,
    to_manual: AtomicU64,
}

impl Counters {
    pub(crate) fn count(&self, processed: &Processed) {
        let counter = match processed {
            Processed::Applied(_) => &self.applied,
            Processed::Duplicate(_) => &self.duplicates,
            Processed::Stale { .. } => &self.stale,
            Processed::Parked { .. } => &self.parked,
            Processed::Waiting(_) => &self.waits,
            Processed::InFlight | Processed::Manual { .. } => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a task that went to the manual queue now.
    pub(crate) fn to_manual(&self) {
        self.to_manual.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> InboxStats {
        InboxStats {
            applied: self.applied.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            parked: self.parked.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            to_manual: self.to_manual.load(Ordering::Relaxed),
        }
    }
}

/// Processing a delivery failed: the handler did (its error, as it gave it), the store did, or
/// the delivery was not an event. Nothing was recorded: the delivery may be tried again (but
/// for a malformed one).
///
/// The store's error, and what a malformed delivery lacks, are its
/// [`source`](std::error::Error::source), said once. The handler's error is said in the
/// message instead (`the event's handler failed: database down`), and is not a source: it is
/// the handler's own type, which need not be a `std::error::Error` (tower's `BoxError` and
/// anyhow's error are not), and an `InboxError` is an error whatever it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError<E = Infallible> {
    /// The handler failed.
    #[error("the event's handler failed: {0}")]
    Handler(E),
    /// The store failed.
    #[error("inbox store failed")]
    Store(#[source] BoxError),
    /// The delivery is not an event: it lacks what a relay writes.
    #[error("not an event")]
    Malformed(#[source] crate::outbox::InvalidEvent),
    /// An in-memory inbox holds its capacity of records (this many), and the event is new to
    /// it: nothing was recorded and the handler did not run ([`MemoryInbox`]'s "Memory").
    #[error("inbox is full: it holds its capacity of {0} records")]
    Full(usize),
    /// A task's stored reason is one this version does not know (a later version wrote it):
    /// the task is held as it is, and the delivery is acknowledged negatively.
    #[error("a task's stored reason is unknown")]
    UnknownReason(#[source] UnknownReason),
    /// A person's action named a task that is not in the manual queue (this text says which).
    #[error("no such task in the manual queue: {0}")]
    NoSuchTask(String),
    /// A person's action came with a name or a reason the inbox does not keep (empty, over
    /// 256 bytes for a name or 16 KiB for a reason, or with a control character): this text
    /// says which.
    #[error("refused: {0}")]
    Invalid(String),
}

impl<E> InboxError<E> {
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn store(e: impl Into<BoxError>) -> Self {
        InboxError::Store(e.into())
    }

    /// Whether the handler failed.
    pub fn is_handler(&self) -> bool {
        matches!(self, InboxError::Handler(_))
    }

    /// Whether the store failed.
    pub fn is_store(&self) -> bool {
        matches!(self, InboxError::Store(_))
    }

    /// Whether the delivery was not an event.
    pub fn is_malformed(&self) -> bool {
        matches!(self, InboxError::Malformed(_))
    }

    /// Whether the inbox was full ([`InboxError::Full`]).
    pub fn is_full(&self) -> bool {
        matches!(self, InboxError::Full(_))
    }

    /// Whether a person's action named a task not in the manual queue.
    pub fn is_no_such_task(&self) -> bool {
        matches!(self, InboxError::NoSuchTask(_))
    }

    /// Whether a person's action came with a name or reason refused.
    pub fn is_invalid(&self) -> bool {
        matches!(self, InboxError::Invalid(_))
    }

    /// Whether a task's stored reason is unknown ([`InboxError::UnknownReason`]).
    pub fn is_unknown_reason(&self) -> bool {
        matches!(self, InboxError::UnknownReason(_))
    }
}
