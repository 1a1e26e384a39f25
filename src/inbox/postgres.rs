//! The PostgreSQL inbox.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use deadpool_postgres::{ClientWrapper, Object};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Statement, Transaction};

use super::memory::judge;
use super::{Counters, InboxError, InboxStats, InboxSweeper, Processed, Versions};
use crate::outbox::Event;
use crate::storage::{Component, Migration, Pool, Statements, Store};
use crate::ConfigError;

mod task;

const APPLIED: i16 = 1;
const STALE: i16 = 2;
/// A task a person discarded ([`PostgresInbox::discard_task`]).
const DISCARDED: i16 = 3;

/// The inbox's tables (`name` and `name_versions`), and their migrations in version order.
pub(crate) static POSTGRES_COMPONENT: Component = Component {
    name: "inbox",
    default_table: "surely_inbox",
    migrations: &[
        Migration {
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
        },
        Migration {
            version: 2,
            name: "processed at index",
            // The sweep reads the records by when they were processed, the oldest first.
            sql: |t| {
                let n = crate::storage::bare(t);
                format!("CREATE INDEX IF NOT EXISTS {n}_processed ON {t} (processed_at);")
            },
        },
        Migration {
            version: 3,
            name: "tasks and their steps",
            sql: task::migration,
        },
    ],
};

/// The inbox of a consumer whose state is in PostgreSQL: the record of each processed event is
/// written in the consumer's own transaction, with its business write (tables `surely_inbox`
/// and `surely_inbox_versions` by default).
///
/// Two deliveries of one event processed at once never both run: the second waits for the
/// first's transaction, then finds its record (or, if the first rolled back, processes the
/// event itself). Events of one aggregate are processed one transaction at a time when their
/// [`Versions`] are checked. The wait is on a transaction-scoped advisory lock named after the
/// event (for [`Versions::Any`]) or after the aggregate, taken before the record is read; the
/// record and the aggregate's version are written once, in their final form, after the
/// business write. Two names whose hashes collide only wait for each other.
///
/// The wait works at `READ COMMITTED` (PostgreSQL's default), where each statement sees what
/// committed before it began. At `REPEATABLE READ` or `SERIALIZABLE`, a delivery that waited
/// for another of the same event does not see its record: its handler runs, and its
/// transaction then fails on the record's key, so that the event is still applied once.
///
/// In one call that opens and commits its own transaction,
/// [`process_and_commit`](Self::process_and_commit); in the caller's transaction,
/// [`process`](Self::process); or in two calls around the business write,
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
    store: Store<Sql>,
    counters: Arc<Counters>,
}

struct Sql {
    lock: String,
    read: String,
    stale: String,
    applied: String,
    applied_at_version: String,
    sweep: String,
    task: task::TaskSql,
}

impl Statements for Sql {
    const COMPONENT: &'static Component = &POSTGRES_COMPONENT;
    const TABLE_SETTING: &'static str = "inbox table name";

    fn new(t: &str) -> Self {
        let insert =
            format!("INSERT INTO {t} (consumer, event_id, aggregate, version, outcome, result)");
        Sql {
            // Waits for any other transaction holding the name: another delivery of the event,
            // or another event of the aggregate.
            lock: "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))".to_owned(),
            // Sent after the lock, as a statement of its own: at READ COMMITTED it sees what
            // the transaction it waited for committed.
            read: format!(
                "SELECT r.result, v.version
                 FROM (VALUES (1)) AS one (n)
                 LEFT JOIN {t} AS r ON r.consumer = $1 AND r.event_id = $2
                 LEFT JOIN {t}_versions AS v ON v.consumer = $1 AND v.aggregate = $3"
            ),
            stale: format!("{insert} VALUES ($1, $2, $3, $4, {STALE}, ''::bytea)"),
            applied: format!("{insert} VALUES ($1, $2, $3, $4, {APPLIED}, $5)"),
            applied_at_version: format!(
                "WITH record AS ({insert} VALUES ($1, $2, $3, $4, {APPLIED}, $5))
                 INSERT INTO {t}_versions AS v (consumer, aggregate, version)
                 VALUES ($1, $3, $4)
                 ON CONFLICT (consumer, aggregate)
                 DO UPDATE SET version = GREATEST(v.version, EXCLUDED.version)"
            ),
            // At most `$2` records processed `$1` microseconds ago or more, the oldest first,
            // through the index on `processed_at`; rows another batch holds are skipped. The
            // versions table is never swept. By `ctid`: the records' key is two columns.
            sweep: format!(
                "DELETE FROM {t}
                 WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM {t}
                     WHERE processed_at <= now() - $1::int8 * interval '1 microsecond'
                     ORDER BY processed_at
                     LIMIT $2
                     FOR UPDATE SKIP LOCKED
                 ))"
            ),
            task: task::TaskSql::new(t),
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
#[must_use = "finish the ticket in the same transaction, or the event is not recorded"]
pub struct Ticket {
    consumer: String,
    event_id: String,
    aggregate: String,
    version: i64,
    versions: Versions,
}

/// A handler for [`PostgresInbox::process`] and
/// [`process_and_commit`](PostgresInbox::process_and_commit): it writes in the transaction it
/// is given, and answers with what a redelivery of the event gets back.
pub type Handler<'t, E> = Pin<Box<dyn Future<Output = Result<Bytes, E>> + Send + 't>>;

/// The transaction an event's handler writes in under
/// [`process_and_commit`](PostgresInbox::process_and_commit): a connection of the inbox's pool
/// inside the transaction the inbox opened for the event. It dereferences to
/// deadpool-postgres's client, and through it to tokio-postgres's: run statements on it
/// (`prepare_cached` prepares each once per connection), and enqueue the events the handler
/// causes with [`PostgresOutbox::enqueue`](crate::outbox::PostgresOutbox::enqueue), which
/// takes it, so that they commit with the business write and the inbox's record.
///
/// Do not end the transaction yourself (no `COMMIT` or `ROLLBACK` statement): the inbox commits
/// it with the record once the handler answers `Ok`, and rolls it back otherwise.
///
/// It is not a `tokio_postgres::Transaction` because the inbox sends the `BEGIN` together with
/// its lock and its read, in one flight, where `Client::transaction` would wait for the
/// `BEGIN`'s answer first: one round trip less for every event.
pub struct InboxTransaction {
    /// The connection, until the transaction ends; `None` after.
    conn: Option<Object>,
}

impl Deref for InboxTransaction {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        // Only the inbox ends the transaction, and it lends no reference after that.
        self.conn
            .as_deref()
            .expect("an InboxTransaction lent to a handler holds its connection")
    }
}

impl InboxTransaction {
    /// The connection, out of the transaction guard: the caller ends the transaction.
    fn take(&mut self) -> Option<Object> {
        self.conn.take()
    }

    /// Ends the transaction with a `ROLLBACK` sent without waiting for its answer, and hands
    /// the connection back to the pool: the next statement on it queues behind the rollback.
    fn roll_back_behind(&mut self) {
        if let Some(conn) = self.conn.take() {
            send_behind(&conn, "ROLLBACK");
        }
    }
}

/// Dropped with the transaction still open (the caller's future dropped while the handler
/// ran, or a panic), it rolls the transaction back behind whatever is in flight, as
/// tokio-postgres's own `Transaction` does.
impl Drop for InboxTransaction {
    fn drop(&mut self) {
        self.roll_back_behind();
    }
}

impl fmt::Debug for InboxTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxTransaction")
            .field("open", &self.conn.is_some())
            .finish()
    }
}

/// The outbox's `enqueue` (and any write of the crate that joins a caller's transaction) takes
/// it: it is inside the event's transaction.
impl crate::storage::InTransaction for InboxTransaction {}

impl crate::storage::in_transaction::Sealed for InboxTransaction {
    async fn query_one<'a>(
        &'a self,
        sql: &'a str,
        params: &'a [&'a (dyn ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
        crate::storage::in_transaction::query_one_cached(self, sql, params).await
    }
}

/// Sends `sql` on `conn` without waiting for its answer. tokio-postgres queues a request on
/// the connection when its future is first polled, and a request whose answer nobody waits for
/// still runs, in order: this polls the future once and drops it. Anything sent on the
/// connection afterwards runs after it.
fn send_behind(conn: &tokio_postgres::Client, sql: &str) {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let _ = std::pin::pin!(conn.batch_execute(sql)).poll(&mut cx);
}

impl PostgresInbox {
    /// An inbox over `pool`, in the tables `surely_inbox` and `surely_inbox_versions`.
    pub fn new(pool: Pool) -> Self {
        PostgresInbox {
            store: Store::new(pool),
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
        Ok(PostgresInbox {
            store: self.store.with_table(table)?,
            counters: self.counters,
        })
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        self.store.pool()
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        self.store.table()
    }

    /// The counts since this inbox (and its clones) was made.
    pub fn stats(&self) -> InboxStats {
        self.counters.stats()
    }

    /// Deletes at most `limit` of the records processed `retention` ago or more (at most
    /// [`MAX_DURATION`](crate::MAX_DURATION) counted), the oldest first, in one statement;
    /// returns how many. The versions are kept. What an [`InboxSweeper`] runs.
    pub(crate) async fn sweep_batch(
        &self,
        retention: std::time::Duration,
        limit: usize,
    ) -> Result<u64, InboxError> {
        let client = self.store.client().await.map_err(InboxError::store)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        client
            .execute(
                &self.store.sql().sweep,
                &[&crate::storage::micros(retention), &limit],
            )
            .await
            .map_err(InboxError::store)
    }

    /// The [chore](crate::maintenance::Chore) that deletes this inbox's records processed
    /// `retention` ago or more ([`InboxSweeper`]), named `inbox <table>`: the instances that
    /// share the table share its lease. Each batch is one statement, read through the table's
    /// index on `processed_at`. The latest version of each aggregate (the `_versions` table)
    /// is never swept, so that a redelivery of a versioned event older than the sweep is still
    /// [`Stale`](Processed::Stale); an event under [`Versions::Any`] redelivered after its
    /// record was swept is applied again, which is why `retention` must exceed the broker's
    /// `redelivery_window`: the longest time after its first delivery that the broker may
    /// deliver an event again (see the [module docs](super#retention)).
    ///
    /// ```no_run
    /// # fn run(pool: surely::postgres::Pool) -> Result<(), surely::ConfigError> {
    /// use std::time::Duration;
    /// use surely::inbox::PostgresInbox;
    /// use surely::maintenance::{Maintenance, PostgresLeases};
    ///
    /// let inbox = PostgresInbox::new(pool.clone());
    /// const DAY: Duration = Duration::from_secs(24 * 3600);
    /// // The stream keeps a message, and may redeliver it, for 7 days: keep records 14.
    /// let maintenance = Maintenance::builder()
    ///     .leases(PostgresLeases::new(pool))
    ///     .chore(inbox.sweeper(14 * DAY, 7 * DAY)?)
    ///     .build()?;
    /// # let _ = maintenance; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming both values: `retention` not longer than `redelivery_window`
    /// (`inbox retention`), or either longer than [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn sweeper(
        &self,
        retention: std::time::Duration,
        redelivery_window: std::time::Duration,
    ) -> Result<InboxSweeper, ConfigError> {
        InboxSweeper::new(
            super::sweeper::Target::Postgres(self.clone()),
            format!("inbox {}", self.table()),
            retention,
            redelivery_window,
        )
    }

    /// Applies this inbox's tables' migrations that the database has not recorded yet.
    ///
    /// # Errors
    ///
    /// The database refused, or could not be reached.
    pub async fn migrate(&self) -> Result<(), InboxError> {
        self.store.migrate().await.map_err(InboxError::store)
    }

    /// Starts processing a delivery of `event` for `consumer` in `txn`: finds it processed
    /// before, stale or parked, or fresh. Two statements sent together (the lock, then the
    /// record and the aggregate's version read), and for a stale event its record.
    ///
    /// A fresh event is not recorded yet: [`finish`](Self::finish) writes its record, in the
    /// same transaction, after the business write.
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
        self.begin_with(txn.client(), None, consumer, event, versions)
            .await
    }

    /// [`begin`](Self::begin) on `client`, in its open transaction, with the statements
    /// `prepared` on it (else sent with their text, unprepared).
    async fn begin_with(
        &self,
        client: &tokio_postgres::Client,
        prepared: Option<&Prepared>,
        consumer: &str,
        event: &Event,
        versions: Versions,
    ) -> Result<Begin, InboxError> {
        let id = event.id().as_str();
        let (aggregate, version) = (event.aggregate(), event.version());
        let name = self.lock_name(consumer, event, versions);
        let lock_params: [(&(dyn ToSql + Sync), Type); 1] = [(&name, Type::TEXT)];
        let read_params: [(&(dyn ToSql + Sync), Type); 3] = [
            (&consumer, Type::TEXT),
            (&id, Type::TEXT),
            (&aggregate, Type::TEXT),
        ];
        // One flight: the read is sent behind the lock, and runs once the lock is held.
        let (locked, row) = tokio::join!(
            query(
                client,
                prepared.map(|p| &p.lock),
                &self.store.sql().lock,
                &lock_params
            ),
            query(
                client,
                prepared.map(|p| &p.read),
                &self.store.sql().read,
                &read_params
            ),
        );
        locked.map_err(InboxError::store)?;
        let row = row
            .map_err(InboxError::store)?
            .into_iter()
            .next()
            .ok_or_else(|| InboxError::store("the inbox's read returned no row"))?;
        let result: Option<Vec<u8>> = row.try_get(0).map_err(InboxError::store)?;
        if let Some(result) = result {
            return Ok(self.done(Processed::Duplicate(Bytes::from(result))));
        }
        if versions != Versions::Any {
            let last: Option<i64> = row.try_get(1).map_err(InboxError::store)?;
            match judge(versions, last, version) {
                Some(stale @ Processed::Stale { .. }) => {
                    client
                        .execute_typed(
                            &self.store.sql().stale,
                            &record_params(&consumer, &id, &aggregate, &version),
                        )
                        .await
                        .map_err(InboxError::store)?;
                    return Ok(self.done(stale));
                }
                Some(parked) => {
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

    /// The name of the advisory lock a delivery of `event` takes: the event's own with
    /// [`Versions::Any`], its aggregate's otherwise (which a redelivery of the event shares).
    fn lock_name(&self, consumer: &str, event: &Event, versions: Versions) -> String {
        let (kind, name) = match versions {
            Versions::Any => ("event", event.id().as_str()),
            Versions::InOrder | Versions::Latest => ("aggregate", event.aggregate()),
        };
        format!(
            "{} {}:{consumer} {kind} {name}",
            self.store.table(),
            consumer.len()
        )
    }

    fn done(&self, processed: Processed) -> Begin {
        self.counters.count(&processed);
        Begin::Done(processed)
    }

    /// Finishes a fresh event in `txn`, after its business write: records it with `result`
    /// (what a redelivery gets back), and the aggregate's version, in one statement. The
    /// caller then commits.
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
        self.record(txn.client(), None, &ticket, &result)
            .await
            .map_err(InboxError::store)?;
        Ok(self.applied(result))
    }

    /// The statement of [`finish`](Self::finish).
    async fn record(
        &self,
        client: &tokio_postgres::Client,
        prepared: Option<&Prepared>,
        ticket: &Ticket,
        result: &[u8],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let mut params = record_params(
            &ticket.consumer,
            &ticket.event_id,
            &ticket.aggregate,
            &ticket.version,
        )
        .to_vec();
        params.push((&result, Type::BYTEA));
        let sql = if ticket.versions == Versions::Any {
            &self.store.sql().applied
        } else {
            &self.store.sql().applied_at_version
        };
        query(client, prepared.map(|p| &p.record), sql, &params).await
    }

    fn applied(&self, result: Bytes) -> Processed {
        let processed = Processed::Applied(result);
        self.counters.count(&processed);
        processed
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

    /// Processes a delivery in a transaction of its own, on a connection of the pool, and
    /// commits it: [`process`](Self::process)'s steps, in fewer round trips. The `BEGIN` goes
    /// out with the lock and the read (one flight), the handler writes through the
    /// [`InboxTransaction`] it is given, and the event's record goes out with the `COMMIT`
    /// (one flight). Acknowledge the delivery once this returns `Ok` with a
    /// [settled](Processed::is_settled) outcome.
    ///
    /// ```no_run
    /// # async fn consume(inbox: surely::inbox::PostgresInbox, event: surely::outbox::Event)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use surely::inbox::Versions;
    ///
    /// let processed = inbox
    ///     .process_and_commit("inventory", &event, Versions::InOrder, |txn| {
    ///         Box::pin(async move {
    ///             let reserve = txn
    ///                 .prepare_cached("UPDATE stock SET qty = qty - 1 WHERE sku = $1")
    ///                 .await?;
    ///             txn.execute(&reserve, &[&"sku-42"]).await?;
    ///             Ok::<_, tokio_postgres::Error>("reserved".into())
    ///         })
    ///     })
    ///     .await?;
    /// if processed.is_settled() {
    ///     // acknowledge the delivery
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The handler or a statement failed, or the commit did: nothing was committed (or, if
    /// the connection was lost during the `COMMIT`, maybe it was: a redelivery then finds the
    /// record). The delivery may be tried again.
    pub async fn process_and_commit<F, E>(
        &self,
        consumer: &str,
        event: &Event,
        versions: Versions,
        handler: F,
    ) -> Result<Processed, InboxError<E>>
    where
        F: for<'t> FnOnce(&'t InboxTransaction) -> Handler<'t, E>,
    {
        let (mut txn, prepared, begun, found) =
            self.open(consumer, event, versions).await.map_err(retype)?;
        let ticket = match (begun, found) {
            (Err(e), _) => return Err(InboxError::store(e)),
            (Ok(()), Ok(Begin::Fresh(ticket))) => ticket,
            (Ok(()), Ok(Begin::Done(processed @ Processed::Stale { .. }))) => {
                // The stale event's record is in the transaction.
                let conn = txn.take();
                let conn = conn.as_deref().ok_or_else(no_connection)?;
                conn.batch_execute("COMMIT")
                    .await
                    .map_err(InboxError::store)?;
                return Ok(processed);
            }
            // Nothing written: the rollback goes out without waiting for its answer.
            (Ok(()), Ok(Begin::Done(processed))) => return Ok(processed),
            (Ok(()), Err(e)) => return Err(retype(e)),
        };
        let result = handler(&txn).await.map_err(InboxError::Handler)?;
        let client = txn.take().ok_or_else(no_connection)?;
        // One flight: the record, then `COMMIT`. If the record fails, the server ends the
        // failed transaction at the `COMMIT` with a rollback (and answers it without an error),
        // so each answer is checked.
        let (recorded, committed) = tokio::join!(
            self.record(&client, Some(&prepared), &ticket, &result),
            client.batch_execute("COMMIT")
        );
        match (recorded, committed) {
            (Ok(_), Ok(())) => Ok(self.applied(result)),
            (Err(e), _) if e.as_db_error().is_some() => Err(InboxError::store(e)),
            (Ok(_), Err(e)) if e.as_db_error().is_some_and(|db| db.severity() == "ERROR") => {
                Err(InboxError::store(e))
            }
            (Err(e), _) | (_, Err(e)) => {
                // The connection's state is unknown: close it rather than pool it.
                drop(Object::take(client));
                Err(InboxError::store(e))
            }
        }
    }
}

impl PostgresInbox {
    /// Opens a delivery's transaction on a connection of the pool, with the inbox's statements
    /// prepared on it (once per connection: deadpool-postgres's statement cache), and sends the
    /// `BEGIN`, the lock and the read in one flight: `BEGIN` is queued first, then the lock and
    /// the read, all before any answer is read. Returns the transaction (dropped, it rolls back
    /// behind anything in flight), the statements, and what the `BEGIN` and the read answered;
    /// if the `BEGIN` failed, the statements behind it ran outside any transaction and their
    /// results are not to be used.
    async fn open(
        &self,
        consumer: &str,
        event: &Event,
        versions: Versions,
    ) -> Result<
        (
            InboxTransaction,
            Prepared,
            Result<(), tokio_postgres::Error>,
            Result<Begin, InboxError>,
        ),
        InboxError,
    > {
        let client = self.store.client().await.map_err(InboxError::store)?;
        let sql = self.store.sql();
        let record = if versions == Versions::Any {
            &sql.applied
        } else {
            &sql.applied_at_version
        };
        let (lock, read, record) = tokio::join!(
            client.prepare_cached(&sql.lock),
            client.prepare_cached(&sql.read),
            client.prepare_cached(record),
        );
        let prepared = Prepared {
            lock: lock.map_err(InboxError::store)?,
            read: read.map_err(InboxError::store)?,
            record: record.map_err(InboxError::store)?,
        };
        let txn = InboxTransaction { conn: Some(client) };
        let (begun, found) = tokio::join!(
            txn.batch_execute("BEGIN"),
            self.begin_with(&txn, Some(&prepared), consumer, event, versions)
        );
        Ok((txn, prepared, begun, found))
    }
}

/// The transaction's connection was taken before it ended: a bug of the inbox's, reported as
/// the store's error rather than a panic.
fn no_connection<E>() -> InboxError<E> {
    InboxError::store("the inbox's transaction has no connection")
}

/// The inbox's statements prepared on one connection.
struct Prepared {
    lock: Statement,
    read: Statement,
    record: Statement,
}

/// Runs `sql`, as its `prepared` statement if there is one (the types given are then the
/// statement's own), else unprepared with the types given: one round trip either way.
async fn query(
    client: &tokio_postgres::Client,
    prepared: Option<&Statement>,
    sql: &str,
    params: &[(&(dyn ToSql + Sync), Type)],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    match prepared {
        Some(statement) => {
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
            client.query(statement, &values).await
        }
        None => client.query_typed(sql, params).await,
    }
}

/// The parameters of a record's insert, but its result.
fn record_params<'a>(
    consumer: &'a (dyn ToSql + Sync),
    id: &'a (dyn ToSql + Sync),
    aggregate: &'a (dyn ToSql + Sync),
    version: &'a i64,
) -> [(&'a (dyn ToSql + Sync), Type); 4] {
    [
        (consumer, Type::TEXT),
        (id, Type::TEXT),
        (aggregate, Type::TEXT),
        (version, Type::INT8),
    ]
}

/// An error of a call without a handler, as one of a call with one.
fn retype<E>(e: InboxError) -> InboxError<E> {
    match e {
        InboxError::Store(e) => InboxError::Store(e),
        InboxError::Malformed(e) => InboxError::Malformed(e),
        InboxError::Full(capacity) => InboxError::Full(capacity),
        InboxError::UnknownReason(e) => InboxError::UnknownReason(e),
        InboxError::NoSuchTask(e) => InboxError::NoSuchTask(e),
        InboxError::Invalid(e) => InboxError::Invalid(e),
        InboxError::Handler(never) => match never {},
    }
}

impl fmt::Debug for PostgresInbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresInbox")
            .field("table", &self.store.table())
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::PostgresInbox;
    use crate::storage::testing::{plan, pool};

    /// The sweep reads the records through the index on `processed_at`, and deletes them by
    /// `ctid`.
    #[tokio::test]
    async fn pg_the_sweep_is_read_through_the_processed_at_index() {
        let table = format!("surely_inbox_plan_{:x}", crate::ids::random_u128() as u64);
        let inbox = PostgresInbox::new(pool()).with_table(&table).unwrap();
        inbox.migrate().await.unwrap();
        let shown = plan(inbox.pool(), &inbox.store.sql().sweep, "0, 1000").await;
        let client = inbox.pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "DROP TABLE {table}, {table}_versions, {table}_task_steps, {table}_tasks;
                 DELETE FROM surely_migrations WHERE target = '{table}'"
            ))
            .await
            .unwrap();
        assert!(shown.contains(&format!("{table}_processed ")), "{shown}");
        assert!(!shown.contains("Seq Scan"), "{shown}");
        assert!(shown.contains("Tid Scan"), "{shown}");
        assert!(shown.contains("LockRows"), "{shown}");
    }
}
