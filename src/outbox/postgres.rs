//! The PostgreSQL outbox.

use std::fmt;
use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use tokio_postgres::Row;

use super::wakeup::WeakWakeup;
use super::{
    Claimed, Event, EventId, Failed, OutboxError, OutboxStore, Quarantined, State, Wakeup,
};
use crate::classify::BoxError;
use crate::queue::{self, micros};
use crate::record::OutboxStats;
use crate::storage::{Component, Migration, Pool, Statements, Store};
use crate::ConfigError;

const PENDING: i16 = 0;
const PUBLISHED: i16 = 1;
const QUARANTINED: i16 = 2;

/// The outbox's table, and its migrations in version order.
pub(crate) static POSTGRES_COMPONENT: Component = Component {
    name: "outbox",
    default_table: "surely_outbox",
    migrations: &[
        Migration {
            version: 1,
            name: "events",
            sql: |t| {
                let n = crate::storage::bare(t);
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                    seq bigserial NOT NULL,
                    id text PRIMARY KEY,
                    aggregate text NOT NULL,
                    version bigint NOT NULL,
                    kind text NOT NULL,
                    header_names text[] NOT NULL,
                    header_values text[] NOT NULL,
                    payload bytea NOT NULL,
                    state smallint NOT NULL DEFAULT {PENDING},
                    claim bigint NOT NULL DEFAULT 0,
                    claimed_until timestamptz,
                    failures integer NOT NULL DEFAULT 0,
                    last_error text,
                    enqueued_at timestamptz NOT NULL DEFAULT now(),
                    published_at timestamptz
                );
                CREATE INDEX IF NOT EXISTS {n}_pending ON {t} (seq) WHERE state = {PENDING};
                CREATE INDEX IF NOT EXISTS {n}_published ON {t} (published_at)
                    WHERE state = {PUBLISHED};"
                )
            },
        },
        Migration {
            version: 2,
            name: "quarantined index",
            // The stats read the pending and the quarantined rows only, never the published ones
            // kept for their retention.
            sql: |t| {
                let n = crate::storage::bare(t);
                format!(
                    "CREATE INDEX IF NOT EXISTS {n}_quarantined ON {t} (seq)
                    WHERE state = {QUARANTINED};"
                )
            },
        },
        Migration {
            version: 3,
            name: "log",
            sql: log_migration,
        },
        Migration {
            version: 4,
            name: "log progress",
            // How far each slot's relay has published in the order enqueued: the backlog
            // counts the events after it.
            sql: |t| {
                let slots = slots_table(t);
                format!("ALTER TABLE {slots} ADD COLUMN IF NOT EXISTS published_seq bigint;")
            },
        },
    ],
};

/// The publication the crate's migrations create on an outbox table: its name with `.`
/// written `_`, then `_publication` (at most 50 + 12 bytes: within PostgreSQL's 63).
pub(crate) fn publication(table: &str) -> String {
    format!("{}_publication", table.replace('.', "_"))
}

/// The table of the slots that read an outbox table, and where each stands.
pub(crate) fn slots_table(table: &str) -> String {
    format!("{table}_slots")
}

/// The statements the outbox's migration 3 runs: the column that names each row's
/// transaction, the slots' table, and the publication (inserts and updates: an update that
/// makes a row pending again is a requeue).
fn log_migration(t: &str) -> String {
    let slots = slots_table(t);
    let publication = publication(t);
    format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS xact xid8;
         ALTER TABLE {t} ALTER COLUMN xact SET DEFAULT pg_current_xact_id();
         CREATE TABLE IF NOT EXISTS {slots} (
             slot text PRIMARY KEY,
             boundary pg_snapshot NOT NULL,
             caught_up boolean NOT NULL DEFAULT false,
             published_below xid8,
             confirmed text,
             confirmed_at timestamptz,
             created_at timestamptz NOT NULL DEFAULT now()
         );
         SET LOCAL client_min_messages = error;
         DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = '{publication}') THEN
                 CREATE PUBLICATION {publication} FOR TABLE {t}
                     WITH (publish = 'insert, update');
             END IF;
         END $$;
         SET LOCAL client_min_messages = warning;"
    )
}

/// The outbox for a service whose state is in PostgreSQL: events are rows of a table (default
/// `surely_outbox`), [enqueued](Self::enqueue) in the handler's own transaction, so that they
/// commit or roll back with the business change they announce.
///
/// A relay claims rows with `FOR UPDATE SKIP LOCKED` (relays never wait on one another, and never
/// take the same row at once) and a lease on the database's clock: the rows of a relay that died
/// come back when the lease passes. Marks are fenced by the claim's number.
///
/// The table is created by [`surely::postgres::migrate`](crate::postgres::migrate) (component
/// `outbox`), or by [`migrate`](Self::migrate) for this table alone.
///
/// ```no_run
/// # async fn handler(outbox: surely::outbox::PostgresOutbox) -> Result<(), Box<dyn std::error::Error>> {
/// use surely::outbox::{Event, EventId};
///
/// let mut client = outbox.pool().get().await?;
/// let txn = client.transaction().await?;
/// txn.execute("INSERT INTO orders (id, sku) VALUES ($1, $2)", &[&"o-1", &"sku-42"]).await?;
/// let created = Event::new(EventId::derive("order o-1", "OrderCreated"), "order o-1", 1,
///     "OrderCreated", r#"{"order":"o-1"}"#)?;
/// outbox.enqueue(&txn, &created).await?;
/// txn.commit().await?; // the order and its event, or neither
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresOutbox {
    store: Store<Sql>,
}

struct Sql {
    /// The `NOTIFY` channel of the table's enqueues.
    channel: String,
    enqueue: String,
    claim: String,
    published: String,
    published_all: String,
    failed: String,
    sweep: String,
    stats: String,
    /// The quarantined events, oldest first: `claimed`'s columns, then the last error and the
    /// age in seconds.
    quarantined: String,
    quarantined_event: String,
    requeue: String,
    discard: String,
    last_error: String,
}

/// Where the outbox's table keeps the queue's part of an event: its claim number is the fence,
/// its failures the tries; claimed in the order enqueued; swept by when it was published.
static QUEUE: queue::Columns = queue::Columns {
    key: "id",
    state: "state",
    fence: "claim",
    until: "claimed_until",
    tries: "failures",
    order: &["seq"],
    settled_at: Some("published_at"),
};

impl queue::SqlStates for State {
    fn sql(self) -> &'static str {
        match self {
            State::Pending => "0",
            State::Published => "1",
            State::Quarantined => "2",
        }
    }
}

/// The columns an event is read from by [`claimed`], in its order.
const EVENT_COLUMNS: &str =
    "seq, id, aggregate, version, kind, header_names, header_values, payload, failures, claim";

impl Statements for Sql {
    const COMPONENT: &'static Component = &POSTGRES_COMPONENT;
    const TABLE_SETTING: &'static str = "outbox table name";

    fn new(t: &str) -> Self {
        let queue = queue::Table::new(t, &QUEUE);
        let channel = channel(t);
        let published = queue.settle(State::Published);
        Sql {
            channel: channel.clone(),
            // The notification goes out when the caller's transaction commits (none if it rolls
            // back), once per transaction however many events it enqueued.
            enqueue: format!(
                "WITH added AS (
                     INSERT INTO {t} (id, aggregate, version, kind, header_names, header_values, payload)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (id) DO NOTHING
                     RETURNING 1
                 )
                 SELECT (SELECT count(*) FROM added), pg_notify('{channel}', '')"
            ),
            claim: queue.claim(EVENT_COLUMNS),
            published: queue.fenced(&published),
            published_all: queue.fenced_all(&published),
            // `$3` the error, `$4` the wait, `$5` the failures that quarantine.
            failed: format!(
                "{} RETURNING state",
                queue.fenced(&format!(
                    "{}, last_error = $3",
                    queue.retry_or_park(State::Pending, State::Quarantined, 4, 5)
                ))
            ),
            sweep: queue.sweep(),
            // With a log relay's slot, the backlog is what follows the slowest slot's
            // published events in the order enqueued (the rows it published stay pending
            // until swept), and the slots' lag is read from the server.
            stats: format!(
                "WITH s AS (
                     SELECT x.published_seq, x.confirmed_at, x.created_at,
                            pg_wal_lsn_diff(pg_current_wal_lsn(), r.confirmed_flush_lsn) AS lag
                     FROM {slots} x JOIN pg_replication_slots r ON r.slot_name = x.slot
                 ),
                 after AS (
                     SELECT CASE WHEN bool_and(published_seq IS NOT NULL)
                                 THEN min(published_seq) END AS seq
                     FROM s
                 )
                 SELECT count(*), EXTRACT(EPOCH FROM (now() - min(enqueued_at)))::float8,
                        (SELECT count(*) FROM {t} WHERE state = {QUARANTINED}),
                        (SELECT max(lag)::int8 FROM s),
                        (SELECT EXTRACT(EPOCH FROM (now() - min(coalesce(confirmed_at, created_at))))::float8
                         FROM s)
                 FROM {t} WHERE state = {PENDING}
                     AND seq > coalesce((SELECT seq FROM after), -1)",
                slots = slots_table(t)
            ),
            quarantined: format!(
                "SELECT {EVENT_COLUMNS}, last_error,
                        EXTRACT(EPOCH FROM (now() - enqueued_at))::float8
                 FROM {t} WHERE state = {QUARANTINED} ORDER BY seq LIMIT $1"
            ),
            quarantined_event: format!(
                "SELECT {EVENT_COLUMNS}, last_error,
                        EXTRACT(EPOCH FROM (now() - enqueued_at))::float8
                 FROM {t} WHERE state = {QUARANTINED} AND id = $1"
            ),
            // A new claim number fences a mark of any older claim; the relays are woken.
            requeue: format!(
                "WITH back AS ({})
                 SELECT (SELECT count(*) FROM back), pg_notify('{channel}', '')",
                queue.reopen(&[State::Quarantined], State::Pending, "failures = 0", "1")
            ),
            discard: format!(
                "DELETE FROM {t} WHERE id = $1 AND state = {QUARANTINED} RETURNING {EVENT_COLUMNS}"
            ),
            last_error: queue.look("last_error"),
        }
    }
}

impl PostgresOutbox {
    /// An outbox over `pool`, in the table `surely_outbox`.
    pub fn new(pool: Pool) -> Self {
        PostgresOutbox {
            store: Store::new(pool),
        }
    }

    /// The same outbox in another table, such as `orders.outbox`.
    ///
    /// # Errors
    ///
    /// The name is not a lower-case identifier (letters, digits, `_`, at most 50 bytes),
    /// optionally schema-qualified.
    pub fn with_table(self, table: &str) -> Result<Self, ConfigError> {
        Ok(PostgresOutbox {
            store: self.store.with_table(table)?,
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

    /// Applies this outbox's table's migrations that the database has not recorded yet.
    ///
    /// # Errors
    ///
    /// The database refused, or could not be reached.
    pub async fn migrate(&self) -> Result<(), OutboxError> {
        self.store.migrate().await.map_err(OutboxError::backend)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, OutboxError> {
        self.store.client().await.map_err(OutboxError::backend)
    }

    /// Adds `event` in the caller's transaction `txn`: it commits with the caller's business
    /// writes, or rolls back with them. An event whose id is already there (enqueued twice, by
    /// a retried handler) is left as it is: returns false.
    ///
    /// Takes a tokio-postgres or deadpool-postgres transaction or, with the key claimed in the
    /// handler's transaction by the idempotency layer, that transaction's connection (see
    /// [`InTransaction`](crate::postgres::InTransaction)).
    ///
    /// # Errors
    ///
    /// The statement failed: the caller's transaction is then failed too, and rolls back.
    pub async fn enqueue(
        &self,
        txn: &impl crate::storage::InTransaction,
        event: &Event,
    ) -> Result<bool, OutboxError> {
        let names: Vec<&str> = event.headers().iter().map(|(n, _)| n.as_str()).collect();
        let values: Vec<&str> = event.headers().iter().map(|(_, v)| v.as_str()).collect();
        let payload: &[u8] = event.payload();
        let row = txn
            .query_one(
                &self.store.sql().enqueue,
                &[
                    &event.id().as_str(),
                    &event.aggregate(),
                    &event.version(),
                    &event.kind(),
                    &names,
                    &values,
                    &payload,
                ],
            )
            .await
            .map_err(OutboxError::backend)?;
        let added: i64 = row.try_get(0).map_err(OutboxError::backend)?;
        Ok(added == 1)
    }

    /// A [`Wakeup`] woken when a transaction that [enqueued](Self::enqueue) into this outbox
    /// commits: give it to [`RelayBuilder::wake_on`](super::RelayBuilder::wake_on), and an
    /// idle relay publishes a committed event within a database round trip instead of at its
    /// next poll.
    ///
    /// It `LISTEN`s on a connection of its own to `url` (not the pool's: a pooled connection
    /// is shared, and nothing reads its notifications), without TLS like
    /// [`postgres::connect`](crate::postgres::connect), named `surely outbox listener` in
    /// `pg_stat_activity`. A task keeps that connection while the wakeup (or a clone) exists.
    /// When the connection drops, the task reconnects (waiting 100 ms, doubling to 30 s) and
    /// wakes the relay once, for what was committed meanwhile; the relay's polling covers the
    /// gap.
    ///
    /// ```no_run
    /// # async fn run(outbox: surely::outbox::PostgresOutbox,
    /// #     broker: impl tower::Service<surely::outbox::Event, Error = std::io::Error>)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use surely::outbox::Relay;
    ///
    /// let url = "postgres://postgres@127.0.0.1:5432/test";
    /// let relay = Relay::builder(outbox.clone(), broker)
    ///     .wake_on(outbox.listen(url).await?)
    ///     .poll(Duration::from_secs(5)) // the safety net
    ///     .build()?;
    /// relay.run(std::future::pending()).await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The URL does not parse, or the first connection (or its `LISTEN`) fails: the database
    /// is checked when the relay starts, not at its first event.
    pub async fn listen(&self, url: &str) -> Result<Wakeup, OutboxError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| OutboxError::backend(format!("cannot listen for outbox events: {e}")))?;
        config.application_name("surely outbox listener");
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        let channel = self.store.sql().channel.clone();
        let listening = Listening::open(&config, &channel)
            .await
            .map_err(|e| OutboxError::backend(format!("cannot listen for outbox events: {e}")))?;
        let wakeup = Wakeup::new();
        tokio::spawn(keep_listening(config, channel, listening, wakeup.waker()));
        Ok(wakeup)
    }

    /// The last error of a quarantined or failing event.
    ///
    /// # Errors
    ///
    /// The database could not be reached.
    pub async fn last_error(&self, id: &EventId) -> Result<Option<String>, OutboxError> {
        let client = self.client().await?;
        let row = client
            .query_opt(&self.store.sql().last_error, &[&id.as_str()])
            .await
            .map_err(OutboxError::backend)?;
        Ok(row.and_then(|r| r.get(0)))
    }

    async fn mark(&self, sql: &str, claimed: &Claimed) -> Result<(), OutboxError> {
        let client = self.client().await?;
        let claim = queue::fence(claimed.claim());
        let n = client
            .execute(sql, &[&claimed.event.id().as_str(), &claim])
            .await
            .map_err(OutboxError::backend)?;
        if n == 1 {
            Ok(())
        } else {
            Err(OutboxError::stale())
        }
    }
}

/// An event read back from a row whose columns 1 to 7 are its id, aggregate, version, kind,
/// header names, header values and payload (the outbox's claimed rows, the inbox's tasks).
pub(crate) fn event_of(row: &Row) -> Result<Event, BoxError> {
    let id: String = row.try_get(1)?;
    let names: Vec<String> = row.try_get(5)?;
    let values: Vec<String> = row.try_get(6)?;
    let payload: Vec<u8> = row.try_get(7)?;
    Ok(Event::from_parts(
        EventId::new(id)?,
        row.try_get(2)?,
        row.try_get(3)?,
        row.try_get(4)?,
        names.into_iter().zip(values).collect(),
        Bytes::from(payload),
    ))
}

/// An event read back from a claimed row.
fn claimed(row: &Row) -> Result<Claimed, OutboxError> {
    let e = OutboxError::backend;
    let event = event_of(row).map_err(OutboxError::backend)?;
    let failures: i32 = row.try_get(8).map_err(e)?;
    let claim: i64 = row.try_get(9).map_err(e)?;
    Ok(Claimed::new(
        event,
        u32::try_from(failures).unwrap_or(0),
        queue::fence_of(claim),
    ))
}

/// A quarantined event read back from a row of `quarantined`'s columns.
fn quarantined(row: &Row) -> Result<Quarantined, OutboxError> {
    let c = claimed(row)?;
    let e = OutboxError::backend;
    let last_error: Option<String> = row.try_get(10).map_err(e)?;
    let age: Option<f64> = row.try_get(11).map_err(e)?;
    Ok(Quarantined::new(
        c.event,
        c.failures,
        last_error,
        seconds(age.unwrap_or(0.0)),
    ))
}

/// Runs `statement` (a future of a statement on `client`, not yet polled) in a transaction of
/// its own whose commit is not waited for on disk (`synchronous_commit` off for it alone), in
/// one flight: `BEGIN`, the statement, `COMMIT`.
///
/// For the relay's claims and marks only: a crash of the database can lose the last ones, and
/// a lost claim or mark only has the events published again (the outbox delivers at least
/// once: see `docs::boundary`).
async fn unflushed<T>(
    client: &tokio_postgres::Client,
    statement: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, OutboxError> {
    let (begun, out, committed) = tokio::join!(
        client.batch_execute("BEGIN; SET LOCAL synchronous_commit TO off"),
        statement,
        client.batch_execute("COMMIT"),
    );
    // A failed statement fails the transaction, and the `COMMIT` then rolls it back (without
    // an error): each answer is checked.
    begun.map_err(OutboxError::backend)?;
    let out = out.map_err(OutboxError::backend)?;
    committed.map_err(OutboxError::backend)?;
    Ok(out)
}

/// Seconds from the database, as a duration (none below zero).
fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::ZERO)
}

impl OutboxStore for PostgresOutbox {
    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Claimed>, OutboxError> {
        let client = self.client().await?;
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        // Prepared once per pooled connection: one round trip, no planning.
        let claim = client
            .prepare_cached(&self.store.sql().claim)
            .await
            .map_err(OutboxError::backend)?;
        let lease = micros(lease);
        let rows = unflushed(&client, client.query(&claim, &[&max, &lease])).await?;
        let mut batch = rows
            .iter()
            .map(|row| {
                Ok((
                    row.try_get::<_, i64>(0).map_err(OutboxError::backend)?,
                    claimed(row)?,
                ))
            })
            .collect::<Result<Vec<_>, OutboxError>>()?;
        // RETURNING keeps no order: publish in the order of enqueueing.
        batch.sort_by_key(|(seq, _)| *seq);
        Ok(batch.into_iter().map(|(_, c)| c).collect())
    }

    async fn published(&self, claimed: &Claimed) -> Result<(), OutboxError> {
        self.mark(&self.store.sql().published, claimed).await
    }

    async fn published_all(&self, claimed: &[Claimed]) -> Result<usize, OutboxError> {
        if claimed.is_empty() {
            return Ok(0);
        }
        let ids: Vec<&str> = claimed.iter().map(|c| c.event.id().as_str()).collect();
        let claims: Vec<i64> = claimed.iter().map(|c| queue::fence(c.claim())).collect();
        let client = self.client().await?;
        let mark = client
            .prepare_cached(&self.store.sql().published_all)
            .await
            .map_err(OutboxError::backend)?;
        let n = unflushed(&client, client.execute(&mark, &[&ids, &claims])).await?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    async fn failed(
        &self,
        claimed: &Claimed,
        error: &str,
        retry_after: Duration,
        quarantine_after: u32,
    ) -> Result<Failed, OutboxError> {
        let client = self.client().await?;
        let claim = queue::fence(claimed.claim());
        let limit = i32::try_from(quarantine_after).unwrap_or(i32::MAX);
        let row = client
            .query_opt(
                &self.store.sql().failed,
                &[
                    &claimed.event.id().as_str(),
                    &claim,
                    &error,
                    &micros(retry_after),
                    &limit,
                ],
            )
            .await
            .map_err(OutboxError::backend)?
            .ok_or_else(OutboxError::stale)?;
        let state: i16 = row.try_get(0).map_err(OutboxError::backend)?;
        Ok(if state == QUARANTINED {
            Failed::Quarantined
        } else {
            Failed::Retry
        })
    }

    async fn sweep(&self, retention: Duration) -> Result<u64, OutboxError> {
        let mut total = 0u64;
        loop {
            let n = self.sweep_batch(retention, queue::SWEEP_BATCH).await?;
            total = total.saturating_add(n);
            if n < queue::SWEEP_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    async fn sweep_batch(&self, retention: Duration, limit: usize) -> Result<u64, OutboxError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        client
            .execute(&self.store.sql().sweep, &[&micros(retention), &limit])
            .await
            .map_err(OutboxError::backend)
    }

    async fn stats(&self) -> Result<OutboxStats, OutboxError> {
        let client = self.client().await?;
        let row = client
            .query_one(&self.store.sql().stats, &[])
            .await
            .map_err(OutboxError::backend)?;
        let e = OutboxError::backend;
        let backlog: i64 = row.try_get(0).map_err(e)?;
        let oldest: Option<f64> = row.try_get(1).map_err(e)?;
        let quarantined: i64 = row.try_get(2).map_err(e)?;
        let lag_bytes: Option<i64> = row.try_get(3).map_err(e)?;
        let lag: Option<f64> = row.try_get(4).map_err(e)?;
        Ok(OutboxStats {
            backlog: backlog.max(0) as u64,
            oldest: oldest.map(seconds),
            quarantined: quarantined.max(0) as u64,
            log_lag_bytes: lag_bytes.map(|b| b.max(0) as u64),
            log_lag: lag.map(seconds),
        })
    }

    async fn quarantined(&self, limit: usize) -> Result<Vec<Quarantined>, OutboxError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(&self.store.sql().quarantined, &[&limit])
            .await
            .map_err(OutboxError::backend)?;
        rows.iter().map(quarantined).collect()
    }

    async fn quarantined_event(&self, id: &EventId) -> Result<Option<Quarantined>, OutboxError> {
        let client = self.client().await?;
        let row = client
            .query_opt(&self.store.sql().quarantined_event, &[&id.as_str()])
            .await
            .map_err(OutboxError::backend)?;
        row.as_ref().map(quarantined).transpose()
    }

    async fn requeue(&self, id: &EventId) -> Result<(), OutboxError> {
        let client = self.client().await?;
        let row = client
            .query_one(&self.store.sql().requeue, &[&id.as_str()])
            .await
            .map_err(OutboxError::backend)?;
        let back: i64 = row.try_get(0).map_err(OutboxError::backend)?;
        if back == 1 {
            Ok(())
        } else {
            Err(OutboxError::not_found(id))
        }
    }

    async fn discard(&self, id: &EventId) -> Result<Event, OutboxError> {
        let client = self.client().await?;
        let row = client
            .query_opt(&self.store.sql().discard, &[&id.as_str()])
            .await
            .map_err(OutboxError::backend)?
            .ok_or_else(|| OutboxError::not_found(id))?;
        claimed(&row).map(|c| c.event)
    }
}

impl fmt::Debug for PostgresOutbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresOutbox")
            .field("table", &self.store.table())
            .finish()
    }
}

/// The `NOTIFY` channel of a table: its name, cut to PostgreSQL's 63-byte identifiers (names
/// are ASCII). Two tables whose names share 63 bytes share a channel: a wake too many, never
/// one too few.
fn channel(table: &str) -> String {
    table[..table.len().min(63)].to_owned()
}

/// A connection that `LISTEN`s.
struct Listening {
    /// Kept: dropping the client closes the connection.
    _client: tokio_postgres::Client,
    connection:
        tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
}

impl Listening {
    async fn open(config: &tokio_postgres::Config, channel: &str) -> Result<Self, BoxError> {
        let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
        let listen = format!("LISTEN \"{channel}\"");
        {
            let mut listen = std::pin::pin!(client.batch_execute(&listen));
            // The statement completes only while the connection is driven.
            std::future::poll_fn(|cx| {
                loop {
                    match connection.poll_message(cx) {
                        Poll::Ready(Some(Ok(_))) => continue,
                        Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(BoxError::from(e))),
                        Poll::Ready(None) => {
                            return Poll::Ready(Err("the connection closed before LISTEN".into()))
                        }
                        Poll::Pending => break,
                    }
                }
                listen.as_mut().poll(cx).map_err(BoxError::from)
            })
            .await?;
        }
        Ok(Listening {
            _client: client,
            connection,
        })
    }

    /// Wakes `waker` at each notification until the connection ends (returns why) or the
    /// wakeups are gone (returns `None`).
    async fn relay_notifications(&mut self, waker: &WeakWakeup) -> Option<String> {
        std::future::poll_fn(|cx| loop {
            match self.connection.poll_message(cx) {
                Poll::Ready(Some(Ok(tokio_postgres::AsyncMessage::Notification(_)))) => {
                    if !waker.wake() {
                        return Poll::Ready(None);
                    }
                }
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(e.to_string())),
                Poll::Ready(None) => return Poll::Ready(Some("the connection closed".to_owned())),
                Poll::Pending => return Poll::Pending,
            }
        })
        .await
    }
}

/// The listener's task: relays notifications, reconnects when the connection drops, ends when
/// every wakeup is gone.
async fn keep_listening(
    config: tokio_postgres::Config,
    channel: String,
    mut listening: Listening,
    waker: WeakWakeup,
) {
    const FIRST_WAIT: Duration = Duration::from_millis(100);
    const LONGEST_WAIT: Duration = Duration::from_secs(30);
    loop {
        let ended = tokio::select! {
            _ = waker.gone() => return,
            ended = listening.relay_notifications(&waker) => ended,
        };
        let Some(why) = ended else { return };
        tracing::warn!(error = %why, channel = %channel, "outbox listener lost its connection; reconnecting");
        let mut wait = FIRST_WAIT;
        listening = loop {
            tokio::select! {
                _ = waker.gone() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match Listening::open(&config, &channel).await {
                Ok(l) => break l,
                Err(e) => {
                    tracing::warn!(error = &*e as &dyn std::error::Error, channel = %channel, "outbox listener cannot reconnect");
                    wait = wait.saturating_mul(2).min(LONGEST_WAIT);
                }
            }
        };
        // Events committed while nobody listened sent no wake that arrived.
        if !waker.wake() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::SqlStates;

    #[test]
    fn the_queue_writes_the_states_the_table_keeps() {
        assert_eq!(State::Pending.sql(), PENDING.to_string());
        assert_eq!(State::Published.sql(), PUBLISHED.to_string());
        assert_eq!(State::Quarantined.sql(), QUARANTINED.to_string());
    }

    /// The sweep reads the published events through the index on `published_at`.
    #[tokio::test]
    async fn pg_the_sweep_is_read_through_the_published_at_index() {
        use crate::storage::testing::{plan, pool};
        let table = format!("surely_outbox_plan_{:x}", crate::ids::random_u128() as u64);
        let outbox = PostgresOutbox::new(pool()).with_table(&table).unwrap();
        outbox.migrate().await.unwrap();
        let shown = plan(outbox.pool(), &outbox.store.sql().sweep, "0, 1000").await;
        outbox
            .pool()
            .get()
            .await
            .unwrap()
            .batch_execute(&format!(
                "DROP TABLE {table}; DELETE FROM surely_migrations WHERE target = '{table}'"
            ))
            .await
            .unwrap();
        assert!(shown.contains(&format!("{table}_published ")), "{shown}");
        assert!(!shown.contains("Seq Scan"), "{shown}");
        assert!(shown.contains("LockRows"), "{shown}");
    }
}
