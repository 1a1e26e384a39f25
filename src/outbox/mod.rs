//! The transactional outbox: an event is written in the same transaction as the business change
//! it announces, and a relay publishes it afterwards, at least once
//! ([`docs::boundary`](crate::docs::boundary)).
//!
//! Writing the order and publishing `OrderCreated` are two systems: whichever goes first, a crash
//! between them loses one or invents the other. The outbox makes them one write. The handler
//! [enqueues][PostgresOutbox::enqueue] the event **inside its own transaction**; if the order
//! commits, so does the event, and if it rolls back, no event exists. A [`Relay`] then claims
//! unpublished events, publishes them through any `tower::Service` (so the crate's deadline,
//! retry, breaker and budget can sit in front of the broker), and marks them published.
//!
//! What it guarantees, and what it does not:
//!
//! * **At least once.** An event that committed is published, eventually, while the relay runs:
//!   a relay that dies holding events loses its claim when the claim's lease passes, and another
//!   relay (or itself, restarted) takes them.
//! * **Not exactly once.** A relay that published and then crashed before it marked the event,
//!   or whose publish lost its acknowledgement (an *unknown* outcome), publishes the event again,
//!   with the **same** [`EventId`]. The broker (NATS JetStream's duplicate window, keyed by
//!   `Nats-Msg-Id`) or the consumer's inbox drops the copy (RabbitMQ keeps every copy: there
//!   only the inbox does): the outbox does not remove duplicates, the consumer must.
//! * **Nothing silently dropped.** An event whose publish keeps failing is retried after a wait,
//!   and after a limit is **quarantined** with its last error: never dropped, never marked
//!   published, visible in [`OutboxStats`] for an operator, who
//!   [lists](OutboxStore::quarantined) them and [requeues](OutboxStore::requeue) or
//!   [discards](OutboxStore::discard) each (by hand, or through the
//!   [operator's surface](crate::docs::operators)).
//! * **Order.** Events are claimed and published in the order they were enqueued; an event that
//!   fails waits while later ones go on, so consumers order by the event's
//!   [version](Event::version), not by arrival.
//!
//! A running relay ([`Relay::run`]) overlaps its rounds while there is a backlog: it claims the
//! next batch and marks the last one while a batch is being published, still one batch published
//! at a time and in order ([pipelining](Relay#pipelining)). A batch claimed ahead waits in line,
//! so a claim's [lease](RelayBuilder::lease) covers a few batches' publishing and marking rather
//! than one round's; what a relay holds when it dies, or when its store fails, comes back when
//! the lease passes.
//!
//! Published events are [swept](OutboxStore::sweep) after a retention: by the relay, 24 hours
//! after they were published unless [told otherwise](RelayBuilder::retention), or by an
//! [`OutboxSweeper`] that a [`Maintenance`](crate::maintenance::Maintenance) runs in leased,
//! bounded batches (then tell the relay [`no_sweep`](RelayBuilder::no_sweep)).
//!
//! An idle relay looks for new events every poll interval; given a [`Wakeup`], it looks as soon
//! as one is enqueued: [`MemoryOutbox::wakeup`], or `PostgresOutbox::listen`, woken by the
//! `NOTIFY` that every enqueue sends when its transaction commits. Polling stays on as the
//! safety net for a lost wake.
//!
//! [`MemoryOutbox`] is the embedded default and the one for tests; [`PostgresOutbox`] (feature
//! `postgres`) shares the handler's database and transaction. On PostgreSQL, a [`LogRelay`]
//! (feature `postgres-log`) reads the events from the write-ahead log instead of polling the
//! table: in commit order, with nothing written to claim or mark them
//! ([`docs::boundary`](crate::docs::boundary#two-relays-polling-the-table-or-reading-the-log)
//! compares the two).
//!
//! ```
//! use std::time::Duration;
//! use surely::outbox::{Event, EventId, MemoryOutbox, Relay};
//! use tower::service_fn;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let outbox = MemoryOutbox::new();
//! outbox.enqueue(Event::new(EventId::derive("order o-1", "OrderCreated"), "order o-1", 1,
//!     "OrderCreated", "o-1").unwrap());
//!
//! // The broker: here, a service that accepts everything.
//! let broker = service_fn(|event: Event| async move {
//!     println!("published {}", event.id());
//!     Ok::<_, std::io::Error>(())
//! });
//! let mut relay = Relay::builder(outbox.clone(), broker).build().unwrap();
//! let round = relay.run_once().await.unwrap();
//! assert_eq!(round.published, 1);
//! assert_eq!(outbox.stats_now().backlog, 0);
//! # }
//! ```
#![cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "PostgresOutbox::enqueue",
        "`PostgresOutbox`",
    )
)]
#![cfg_attr(
    not(feature = "postgres-log"),
    doc = crate::docs::links::to_features!("`LogRelay`")
)]

use std::future::Future;
use std::time::Duration;

use crate::classify::BoxError;
use crate::record::OutboxStats;

mod event;
#[cfg(feature = "postgres-log")]
mod log;
mod memory;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
mod relay;
mod sweeper;
mod wakeup;
mod webhook;

pub use self::event::{Event, EventId, InvalidEvent};
#[cfg(feature = "postgres-log")]
pub use self::log::{LogError, LogRelay, LogRelayBuilder, LogSource, WalPosition};
pub use self::memory::MemoryOutbox;
#[cfg(feature = "nats")]
pub use self::nats::{JetStreamPublisher, Published};
#[cfg(feature = "postgres")]
pub use self::postgres::PostgresOutbox;
#[cfg(feature = "postgres")]
pub(crate) use self::postgres::{event_of, POSTGRES_COMPONENT};
#[cfg(feature = "rabbitmq")]
pub use self::rabbitmq::{RabbitError, RabbitPublisher, RabbitPublisherBuilder};
pub use self::relay::{Relay, RelayBuilder};
pub use self::sweeper::OutboxSweeper;
pub use self::wakeup::Wakeup;
pub use self::webhook::{WebhookError, WebhookPublisher};

/// An event a relay claimed: it holds it until it marks it, or until the claim's lease passes.
#[derive(Clone, Debug)]
pub struct Claimed {
    /// The event.
    pub event: Event,
    /// How many publishes of it failed before this claim.
    pub failures: u32,
    /// The claim's number: a later claim of the same event (after this one's lease passed)
    /// has a higher one, and the store refuses a mark made with an older.
    claim: u64,
}

impl Claimed {
    /// A claim; for stores of your own.
    pub fn new(event: Event, failures: u32, claim: u64) -> Self {
        Claimed {
            event,
            failures,
            claim,
        }
    }

    /// The claim's number.
    pub fn claim(&self) -> u64 {
        self.claim
    }
}

/// Where an event stands in its store's queue: pending (waiting, or claimed by a relay whose
/// lease runs), quarantined (its publishes failed their limit: a person requeues or discards
/// it), or published (swept after the retention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Pending,
    Quarantined,
    Published,
}

/// An event is an item of the leased work queue: a pending one is claimed when its wait or its
/// claim's lease has passed (its state stays pending: a claim only sets the lease).
impl crate::queue::States for State {
    const ALL: &'static [Self] = &[State::Pending, State::Quarantined, State::Published];
    const CLAIMED: Self = State::Pending;

    fn claimable(self) -> bool {
        self == State::Pending
    }

    fn settled(self) -> bool {
        self == State::Published
    }
}

/// What a failed publish did to its event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failed {
    /// It will be claimed again after the wait.
    Retry,
    /// It failed its limit of times: it is kept, with its last error, and no longer claimed.
    Quarantined,
}

/// Where a relay finds the events to publish. [`MemoryOutbox`] and [`PostgresOutbox`]
/// implement it; every method is one atomic operation of the store.
///
/// Every duration a method takes (a lease, a wait, a hold, a retention) counts as at most
/// [`MAX_DURATION`](crate::MAX_DURATION), ten years: a longer one, `Duration::MAX` included, is
/// taken as ten years, never a panic nor a database's refusal.
#[cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "`PostgresOutbox`",
    )
)]
pub trait OutboxStore: Send + Sync + 'static {
    /// Claims up to `max` unpublished events that no live claim holds, oldest first, for
    /// `lease`.
    fn claim(
        &self,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Claimed>, OutboxError>> + Send;

    /// Marks a claimed event published.
    ///
    /// # Errors
    ///
    /// [`OutboxError::is_stale`] if the claim is no longer the event's (its lease passed and
    /// another relay claimed it): the event was published (at least) twice, as the outbox
    /// allows.
    fn published(&self, claimed: &Claimed) -> impl Future<Output = Result<(), OutboxError>> + Send;

    /// Marks claimed events published, at once where the store can (one statement on
    /// PostgreSQL); returns how many it marked: the others' claims were stale. The default
    /// marks them one by one.
    fn published_all(
        &self,
        claimed: &[Claimed],
    ) -> impl Future<Output = Result<usize, OutboxError>> + Send {
        async move {
            let mut marked = 0;
            for c in claimed {
                match self.published(c).await {
                    Ok(()) => marked = usize::saturating_add(marked, 1),
                    Err(e) if e.is_stale() => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(marked)
        }
    }

    /// Records a failed publish of a claimed event, with its error: the event is claimed again
    /// after `retry_after`, or quarantined once it has failed `quarantine_after` times.
    ///
    /// # Errors
    ///
    /// As for [`published`](Self::published).
    fn failed(
        &self,
        claimed: &Claimed,
        error: &str,
        retry_after: Duration,
        quarantine_after: u32,
    ) -> impl Future<Output = Result<Failed, OutboxError>> + Send;

    /// Deletes the events published `retention` ago or more, and returns how many. Never an
    /// unpublished or quarantined one. The crate's stores delete them in
    /// [bounded batches](Self::sweep_batch), one statement each, until none is left.
    fn sweep(&self, retention: Duration) -> impl Future<Output = Result<u64, OutboxError>> + Send;

    /// Deletes at most `limit` of the events published `retention` ago or more, the longest
    /// published first, and returns how many: one bounded step of [`sweep`](Self::sweep), what
    /// an [`OutboxSweeper`] runs. Never an unpublished or quarantined one. On PostgreSQL, two
    /// batches at once delete disjoint events, and neither waits for the other.
    ///
    /// The default sweeps them all at once, through [`sweep`](Self::sweep): a store written
    /// before this method still sweeps, unbounded.
    fn sweep_batch(
        &self,
        retention: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, OutboxError>> + Send {
        let _ = limit;
        self.sweep(retention)
    }

    /// The backlog, the oldest unpublished event's age, and the quarantined events.
    fn stats(&self) -> impl Future<Output = Result<OutboxStats, OutboxError>> + Send;

    /// The quarantined events, oldest first, at most `limit`, each with its failures and last
    /// error: what an operator inspects before [requeueing](Self::requeue) or
    /// [discarding](Self::discard) one.
    ///
    /// # Errors
    ///
    /// [`OutboxError::is_unsupported`] from a store that does not implement it (the default,
    /// so that stores written before it still compile).
    fn quarantined(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Quarantined>, OutboxError>> + Send {
        let _ = limit;
        std::future::ready(Err(OutboxError::unsupported("list quarantined events")))
    }

    /// The quarantined event with this id, or `None` if there is none (never quarantined,
    /// requeued, discarded).
    ///
    /// # Errors
    ///
    /// As for [`quarantined`](Self::quarantined).
    fn quarantined_event(
        &self,
        id: &EventId,
    ) -> impl Future<Output = Result<Option<Quarantined>, OutboxError>> + Send {
        let _ = id;
        std::future::ready(Err(OutboxError::unsupported("read a quarantined event")))
    }

    /// Puts a quarantined event back to be published, at once, with its failures counted from
    /// zero again (its last error kept until the next one). A new claim number fences any
    /// mark of an older claim. One atomic change of the store.
    ///
    /// # Errors
    ///
    /// [`OutboxError::is_not_found`] if no quarantined event has this id (it may have been
    /// requeued or discarded meanwhile); [`OutboxError::is_unsupported`] as for
    /// [`quarantined`](Self::quarantined).
    fn requeue(&self, id: &EventId) -> impl Future<Output = Result<(), OutboxError>> + Send {
        let _ = id;
        std::future::ready(Err(OutboxError::unsupported("requeue a quarantined event")))
    }

    /// Deletes a quarantined event: it will never be published. Only a quarantined one: a
    /// pending or published event is never discarded. Returns the event it deleted, for the
    /// caller's own record of why (the [admin](crate::docs::operators)'s audit log keeps its
    /// id, kind and aggregate with who and why).
    ///
    /// # Errors
    ///
    /// As for [`requeue`](Self::requeue).
    fn discard(&self, id: &EventId) -> impl Future<Output = Result<Event, OutboxError>> + Send {
        let _ = id;
        std::future::ready(Err(OutboxError::unsupported("discard a quarantined event")))
    }
}

/// A quarantined event, as [`OutboxStore::quarantined`] lists it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Quarantined {
    /// The event.
    pub event: Event,
    /// How many publishes of it failed.
    pub failures: u32,
    /// The last publish's error.
    pub last_error: Option<String>,
    /// How long ago it was enqueued, by the store's clock when it was read.
    pub age: Duration,
}

impl Quarantined {
    /// A quarantined event; for stores of your own.
    pub fn new(event: Event, failures: u32, last_error: Option<String>, age: Duration) -> Self {
        Quarantined {
            event,
            failures,
            last_error,
            age,
        }
    }
}

/// An outbox operation failed: the backend failed, a mark came with a stale claim, no
/// quarantined event has the id, or the store cannot do what was asked. Tell them apart with
/// the `is_*` methods; a failure of the backend is its [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct OutboxError {
    kind: ErrorKind,
}

#[derive(Debug, thiserror::Error)]
enum ErrorKind {
    #[error("outbox event not marked: its claim is stale, another relay claimed it")]
    Stale,
    #[error("no quarantined outbox event {0}")]
    NotFound(EventId),
    #[error("this outbox store cannot {0}")]
    Unsupported(&'static str),
    #[error("outbox store failed")]
    Backend(#[source] BoxError),
    #[error("outbox is full: it holds its capacity of {0} events")]
    Full(usize),
}

impl OutboxError {
    /// A mark with a stale claim.
    pub fn stale() -> Self {
        OutboxError {
            kind: ErrorKind::Stale,
        }
    }

    /// The backend failed, with this error (the source).
    pub fn backend(error: impl Into<BoxError>) -> Self {
        OutboxError {
            kind: ErrorKind::Backend(error.into()),
        }
    }

    /// Whether the backend failed.
    pub fn is_backend(&self) -> bool {
        matches!(self.kind, ErrorKind::Backend(_))
    }

    /// No quarantined event has this id.
    pub fn not_found(id: &EventId) -> Self {
        OutboxError {
            kind: ErrorKind::NotFound(id.clone()),
        }
    }

    /// The store does not implement an operation (`what`: "requeue a quarantined event").
    pub fn unsupported(what: &'static str) -> Self {
        OutboxError {
            kind: ErrorKind::Unsupported(what),
        }
    }

    /// Whether a mark was refused for a stale claim.
    pub fn is_stale(&self) -> bool {
        matches!(self.kind, ErrorKind::Stale)
    }

    /// Whether no quarantined event had the id.
    pub fn is_not_found(&self) -> bool {
        matches!(self.kind, ErrorKind::NotFound(_))
    }

    /// Whether the store does not implement the operation.
    pub fn is_unsupported(&self) -> bool {
        matches!(self.kind, ErrorKind::Unsupported(_))
    }

    /// A new event was refused because the store holds its `capacity` of events, in every
    /// state (an in-memory outbox, [`MemoryOutbox::with_capacity`]): none is dropped to make
    /// room.
    pub fn full(capacity: usize) -> Self {
        OutboxError {
            kind: ErrorKind::Full(capacity),
        }
    }

    /// Whether a new event was refused because the store is full ([`full`](Self::full)).
    pub fn is_full(&self) -> bool {
        matches!(self.kind, ErrorKind::Full(_))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_states_are_what_the_queue_needs() {
        crate::queue::check_states::<super::State>();
    }
}
