//! The PostgreSQL inbox.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use tokio_postgres::Transaction;

use super::memory::judge;
use super::{Counters, InboxError, InboxStats, Processed, Versions};
use crate::outbox::Event;
use crate::storage::{Component, Migration, Pool};
use crate::ConfigError;

const APPLIED: i16 = 1;
const STALE: i16 = 2;

/// The inbox's tables (`name` and `name_versions`), and their migrations in version order.
pub(crate) static POSTGRES_COMPONENT: Component = Component {
    name: "inbox",
    default_table: "surely_inbox",
    migrations: &[Migration {
        version: 1,
        name: "events and versions",
        sql: |t| {
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    consumer text NOT NULL,
                    event_id text NOT NULL,
                    aggregate text NOT NULL,
                    version bigint NOT NULL,
                    outcome smallint NOT NULL,
                    result bytea,
                    processed_at timestamptz NOT NULL DEFAULT now(),
                    PRIMARY KEY (consumer, event_id)
                );
                CREATE TABLE IF NOT EXISTS {t}_versions (
                    consumer text NOT NULL,
                    aggregate text NOT NULL,
                    version bigint,
                    PRIMARY KEY (consumer, aggregate)
                );"
            )
        },
    }],
};

/// The inbox of a consumer whose state is in PostgreSQL: the record of each processed event is
/// written in the consumer's own transaction, with its business write (tables `surely_inbox`
/// and `surely_inbox_versions` by default).
///
/// Two deliveries of one event processed at once never both run: the second waits for the
/// first's transaction on the record's key, then finds the record (or, if the first rolled
/// back, processes it itself). Events of one aggregate are processed one transaction at a time
/// when their [`Versions`] are checked (the version row is locked).
///
/// In one call, [`process`](Self::process); or in two, around the business write,
/// [`begin`](Self::begin) and [`finish`](Self::finish):
///
/// ```no_run
/// # async fn consume(inbox: surely::inbox::PostgresInbox, event: surely::outbox::Event)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// use surely::inbox::{Begin, Versions};
///
/// let mut client = inbox.pool().get().await?;
/// let txn = client.transaction().await?;
/// match inbox.begin(&txn, "inventory", &event, Versions::InOrder).await? {
///     Begin::Fresh(ticket) => {
///         txn.execute("UPDATE stock SET qty = qty - 1 WHERE sku = $1", &[&"sku-42"]).await?;
///         inbox.finish(&txn, ticket, "reserved".into()).await?;
///     }
///     // Processed before, stale, or parked: nothing to write.
///     Begin::Done(processed) => println!("{processed:?}"),
/// }
/// txn.commit().await?; // then acknowledge the delivery
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresInbox {
    pool: Pool,
    sql: Arc<Sql>,
    counters: Arc<Counters>,
}

struct Sql {
    table: String,
    claim: String,
    read: String,
    stale: String,
    park: String,
    lock_version: String,
    applied: String,
    applied_at_version: String,
}

impl Sql {
    fn new(t: &str) -> Self {
        Sql {
            table: t.to_owned(),
            claim: format!(
                "INSERT INTO {t} (consumer, event_id, aggregate, version, outcome)
                 VALUES ($1, $2, $3, $4, 0) ON CONFLICT DO NOTHING"
            ),
            read: format!("SELECT result FROM {t} WHERE consumer = $1 AND event_id = $2"),
            stale: format!(
                "UPDATE {t} SET outcome = {STALE}, result = ''::bytea
                 WHERE consumer = $1 AND event_id = $2"
            ),
            park: format!("DELETE FROM {t} WHERE consumer = $1 AND event_id = $2"),
            // Creates the aggregate's row if it is new, and locks it either way (the no-op
            // update), in one round trip: the aggregate's events go one transaction at a time.
            lock_version: format!(
                "INSERT INTO {t}_versions AS v (consumer, aggregate, version) VALUES ($1, $2, NULL)
                 ON CONFLICT (consumer, aggregate) DO UPDATE SET version = v.version
                 RETURNING version"
            ),
            applied: format!(
                "UPDATE {t} SET outcome = {APPLIED}, result = $3
                 WHERE consumer = $1 AND event_id = $2"
            ),
            applied_at_version: format!(
                "WITH applied AS (
                     UPDATE {t} SET outcome = {APPLIED}, result = $3
                     WHERE consumer = $1 AND event_id = $2
                 )
                 UPDATE {t}_versions SET version = GREATEST(COALESCE(version, $5), $5)
                 WHERE consumer = $1 AND aggregate = $4"
            ),
        }
    }
}

/// What [`PostgresInbox::begin`] found.
#[derive(Debug)]
pub enum Begin {
    /// The event is new: do the business write, then [`finish`](PostgresInbox::finish), in the
    /// same transaction.
    Fresh(Ticket),
    /// Nothing to write: processed before, stale, or parked. Commit (a stale event's record is
    /// in the transaction) and acknowledge, or for [`Processed::Parked`] acknowledge
    /// negatively.
    Done(Processed),
}

/// A fresh event's place in the inbox, for [`PostgresInbox::finish`].
#[derive(Debug)]
#[must_use = "finish the ticket in the same transaction, or the event is recorded without a result"]
pub struct Ticket {
    consumer: String,
    event_id: String,
    aggregate: String,
    version: i64,
    versions: Versions,
}

/// A handler for [`PostgresInbox::process`]: it writes in the transaction it is given.
pub type Handler<'t, E> = Pin<Box<dyn Future<Output = Result<Bytes, E>> + Send + 't>>;

impl PostgresInbox {
    /// An inbox over `pool`, in the tables `surely_inbox` and `surely_inbox_versions`.
    pub fn new(pool: Pool) -> Self {
        PostgresInbox {
            pool,
            sql: Arc::new(Sql::new(POSTGRES_COMPONENT.default_table)),
            counters: Arc::default(),
        }
    }

    /// The same inbox in other tables (`table` and `table_versions`).
    ///
    /// # Errors
    ///
    /// The name is not a lower-case identifier (letters, digits, `_`, at most 50 bytes),
    /// optionally schema-qualified.
    pub fn with_table(self, table: &str) -> Result<Self, ConfigError> {
        crate::storage::check_table("inbox table name", table)?;
        Ok(PostgresInbox {
            pool: self.pool,
            sql: Arc::new(Sql::new(table)),
            counters: self.counters,
        })
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The counts since this inbox (and its clones) was made.
    pub fn stats(&self) -> InboxStats {
        self.counters.stats()
    }

    /// Applies this inbox's tables' migrations that the database has not recorded yet.
    ///
    /// # Errors
    ///
    /// The database refused, or could not be reached.
    pub async fn migrate(&self) -> Result<(), InboxError> {
        crate::storage::apply(&self.pool, &[(&POSTGRES_COMPONENT, self.table())])
            .await
            .map(drop)
            .map_err(InboxError::store)
    }

    /// Starts processing a delivery of `event` for `consumer` in `txn`: records it, or finds
    /// it processed before, stale or parked.
    ///
    /// # Errors
    ///
    /// A statement failed: the transaction is failed too, and rolls back; nothing is recorded.
    pub async fn begin(
        &self,
        txn: &Transaction<'_>,
        consumer: &str,
        event: &Event,
        versions: Versions,
    ) -> Result<Begin, InboxError> {
        let id = event.id().as_str();
        let (aggregate, version) = (event.aggregate(), event.version());
        let new = txn
            .execute(&self.sql.claim, &[&consumer, &id, &aggregate, &version])
            .await
            .map_err(InboxError::store)?;
        if new == 0 {
            let row = txn
                .query_one(&self.sql.read, &[&consumer, &id])
                .await
                .map_err(InboxError::store)?;
            let result: Option<Vec<u8>> = row.try_get(0).map_err(InboxError::store)?;
            return Ok(self.done(Processed::Duplicate(
                result.map(Bytes::from).unwrap_or_default(),
            )));
        }
        if versions != Versions::Any {
            let last: Option<i64> = txn
                .query_one(&self.sql.lock_version, &[&consumer, &aggregate])
                .await
                .map_err(InboxError::store)?
                .try_get(0)
                .map_err(InboxError::store)?;
            match judge(versions, last, version) {
                Some(stale @ Processed::Stale { .. }) => {
                    txn.execute(&self.sql.stale, &[&consumer, &id])
                        .await
                        .map_err(InboxError::store)?;
                    return Ok(self.done(stale));
                }
                Some(parked) => {
                    txn.execute(&self.sql.park, &[&consumer, &id])
                        .await
                        .map_err(InboxError::store)?;
                    tracing::warn!(
                        consumer,
                        event = id,
                        aggregate,
                        version,
                        "inbox: event parked for a version gap"
                    );
                    return Ok(self.done(parked));
                }
                None => {}
            }
        }
        Ok(Begin::Fresh(Ticket {
            consumer: consumer.to_owned(),
            event_id: id.to_owned(),
            aggregate: aggregate.to_owned(),
            version,
            versions,
        }))
    }

    fn done(&self, processed: Processed) -> Begin {
        self.counters.count(&processed);
        Begin::Done(processed)
    }

    /// Finishes a fresh event in `txn`, after its business write: stores `result` (what a
    /// redelivery gets back) and the aggregate's version. The caller then commits.
    ///
    /// # Errors
    ///
    /// A statement failed: the transaction is failed too, and rolls back.
    pub async fn finish(
        &self,
        txn: &Transaction<'_>,
        ticket: Ticket,
        result: Bytes,
    ) -> Result<Processed, InboxError> {
        let stored: &[u8] = &result;
        let (consumer, id) = (&ticket.consumer, &ticket.event_id);
        if ticket.versions == Versions::Any {
            txn.execute(&self.sql.applied, &[consumer, id, &stored])
                .await
        } else {
            txn.execute(
                &self.sql.applied_at_version,
                &[consumer, id, &stored, &ticket.aggregate, &ticket.version],
            )
            .await
        }
        .map_err(InboxError::store)?;
        let processed = Processed::Applied(result);
        self.counters.count(&processed);
        Ok(processed)
    }

    /// Processes a delivery in one call, in `txn`: [`begin`](Self::begin), then `handler` (the
    /// business write, in the same transaction) for a fresh event, then
    /// [`finish`](Self::finish). The caller commits, then acknowledges.
    ///
    /// ```no_run
    /// # async fn consume(inbox: surely::inbox::PostgresInbox, event: surely::outbox::Event)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use surely::inbox::Versions;
    ///
    /// let mut client = inbox.pool().get().await?;
    /// let txn = client.transaction().await?;
    /// let processed = inbox
    ///     .process(&txn, "inventory", &event, Versions::InOrder, |txn| {
    ///         Box::pin(async move {
    ///             txn.execute("UPDATE stock SET qty = qty - 1 WHERE sku = $1", &[&"sku-42"]).await?;
    ///             Ok::<_, tokio_postgres::Error>("reserved".into())
    ///         })
    ///     })
    ///     .await?;
    /// txn.commit().await?;
    /// # let _ = processed; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The handler or a statement failed: roll back, and the delivery may be tried again.
    pub async fn process<'t, F, E>(
        &self,
        txn: &'t Transaction<'_>,
        consumer: &str,
        event: &Event,
        versions: Versions,
        handler: F,
    ) -> Result<Processed, InboxError<E>>
    where
        F: FnOnce(&'t Transaction<'_>) -> Handler<'t, E>,
    {
        let ticket = match self.begin(txn, consumer, event, versions).await {
            Ok(Begin::Fresh(ticket)) => ticket,
            Ok(Begin::Done(processed)) => return Ok(processed),
            Err(e) => return Err(retype(e)),
        };
        let result = handler(txn).await.map_err(InboxError::Handler)?;
        self.finish(txn, ticket, result).await.map_err(retype)
    }
}

/// An error of a call without a handler, as one of a call with one.
fn retype<E>(e: InboxError) -> InboxError<E> {
    match e {
        InboxError::Store(e) => InboxError::Store(e),
        InboxError::Malformed(e) => InboxError::Malformed(e),
        InboxError::Handler(never) => match never {},
    }
}

impl fmt::Debug for PostgresInbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresInbox")
            .field("table", &self.sql.table)
            .field("stats", &self.stats())
            .finish()
    }
}
