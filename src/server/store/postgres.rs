//! The PostgreSQL store.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::Pool;
use http::StatusCode;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::{
    AbandonedRecord, Acquire, Checkpoint, ExpiredRecord, Fence, IdempotencyStore, RecordKey,
    RecordState, RecordView, RequestDigest, StoreError, StoredResponse, StuckRecord, UnknownRecord,
};
use crate::idempotency::IdempotencyKey;
use crate::server::idempotency::Ticket;
use crate::ConfigError;

mod claim;

pub use self::claim::{KeyedTransaction, TransactionClient};

/// The store for services that run more than one instance: records in a PostgreSQL table, with
/// the database's clock (`now()`) for leases and retention, so that instances with skewed clocks
/// agree.
///
/// Every state transition is one statement in one round trip. `acquire` calls a function the
/// migrations create beside the table (`<table>_acquire`): it reads the record, and answers
/// from that read when there is nothing to take (completed, in flight, unknown, another
/// digest, expired); otherwise it inserts the record, or takes over one released or whose
/// lease passed, raising the fence. Only when another request inserted or changed the record
/// between the two does a plain `SELECT` follow. `complete` and `release` are
/// `UPDATE ... WHERE fence = $n AND state = processing`; `sweep` is one `DELETE` that spares
/// `PROCESSING` rows.
///
/// # In the handler's transaction
///
/// A handler that writes to the same database should complete the record **in its own
/// transaction** with [`complete_in`](Self::complete_in): the business row and the stored
/// response then commit together or not at all. Without it, a crash between the commit and the
/// completion leaves the record `PROCESSING`; after the lease, the retry runs the handler again
/// and creates a second order. With it, the retry finds the completed record and replays it.
/// The layer then does not complete the record again, provided the handler returns the answer
/// it stored: status, the headers the layer stores, and body. Store the response the handler
/// returns with [`StoredResponse::buffer`], which keeps the headers its framework set (axum's
/// `content-type`, say). If it returns another (its commit failed after the completion, or a
/// layer between it and the idempotency layer added a header), the layer completes with that
/// one, which the store refuses as stale if the handler's completion did commit: the stored
/// answer is the one replayed, and the layer warns of the difference
/// ([`StoredAnswerDiffers`](crate::record::ServerEventKind::StoredAnswerDiffers)).
///
/// A handler whose every effect is a write to this database can go further: with
/// [`in_transaction`](crate::server::idempotency::IdempotencyLayerBuilder::in_transaction) the
/// layer claims the key in a transaction it opens for the handler ([`KeyedTransaction`]), and
/// the record is inserted, completed, in that transaction: nothing is written before the
/// handler's writes, no record is ever `PROCESSING`, and a crash leaves nothing to take over.
///
/// # Round trips and commits
///
/// A first request costs the layer one statement before the handler (`acquire`: it inserts
/// the record), and one inside the handler's transaction (`complete_in`: prepared once per
/// connection on a deadpool-postgres transaction, sent typed in one round trip on a
/// tokio-postgres one). A replay is one read that writes nothing: no row lock, no transaction
/// id, no WAL; the function answers it before it plans any write, so that it costs about what
/// a plain `SELECT` of the record does.
///
/// The acquire commits without waiting for its WAL to reach the disk
/// (`synchronous_commit = off` for that one statement): it is visible to every other request at
/// once, and it is on disk no later than anything that depends on it, since whatever comes
/// after it in the log and is flushed flushes it too (the handler's commit with its
/// `complete_in`, a checkpoint, the layer's completion). Should the database crash before
/// then, the record is lost with the handler's uncommitted work, and the next request runs as
/// the first: the same as a takeover of a record without checkpoints, a lease later.
///
/// # Why tokio-postgres and deadpool
///
/// `tokio-postgres` is the asynchronous driver the others build on; it exposes
/// [`Transaction`](tokio_postgres::Transaction), which is what `complete_in` needs to join the
/// handler's transaction, without a query macro or a compile-time database. `deadpool-postgres`
/// adds a small pool with a statement cache over it; its transactions dereference to
/// tokio-postgres's, so `complete_in` takes either. `sqlx` would bring its own runtime
/// abstraction and much more code for the four statements this store needs.
///
/// The table (default `surely_idempotency`) is created and kept up to date by the crate's
/// versioned migrations: [`surely::postgres::migrate`](crate::postgres::migrate) for everything
/// the crate keeps, or [`migrate`](Self::migrate) for this store's table alone.
pub struct PostgresStore {
    pool: Pool,
    sql: Arc<Sql>,
}

impl Clone for PostgresStore {
    fn clone(&self) -> Self {
        PostgresStore {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
        }
    }
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.sql.table)
            .finish()
    }
}

struct Sql {
    table: String,
    acquire: String,
    read: String,
    complete: String,
    release: String,
    renew: String,
    sweep: String,
    stuck: String,
    checkpoint: String,
    checkpoint_in: String,
    complete_in: String,
    checkpoints_held: String,
    mark_unknown: String,
    unknowns: String,
    expired: String,
    forget: String,
    take_abandoned: String,
    /// The statements of a claim in the handler's transaction.
    claim: claim::ClaimSql,
}

/// The idempotency store's table, and its migrations in version order.
pub(crate) static POSTGRES_COMPONENT: crate::storage::Component = crate::storage::Component {
    name: "idempotency",
    default_table: "surely_idempotency",
    migrations: &[
        crate::storage::Migration {
            version: 1,
            name: "records",
            sql: |t| {
                let n = crate::storage::bare(t);
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                        tenant text NOT NULL,
                        operation text NOT NULL,
                        key text NOT NULL,
                        digest bytea NOT NULL,
                        state smallint NOT NULL,
                        fence bigint NOT NULL,
                        lease_until timestamptz,
                        expires_at timestamptz,
                        status smallint,
                        header_names text[],
                        header_values bytea[],
                        body bytea,
                        PRIMARY KEY (tenant, operation, key)
                    );
                    CREATE INDEX IF NOT EXISTS {n}_expires_at ON {t} (expires_at)
                        WHERE state <> {PROCESSING};"
                )
            },
        },
        crate::storage::Migration {
            version: 2,
            name: "acquired_at",
            sql: |t| {
                let n = crate::storage::bare(t);
                format!(
                    "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS acquired_at timestamptz;
                     CREATE INDEX IF NOT EXISTS {n}_processing ON {t} (acquired_at)
                         WHERE state = {PROCESSING};"
                )
            },
        },
        crate::storage::Migration {
            version: 3,
            name: "checkpoints_and_unknown",
            sql: |t| {
                let n = crate::storage::bare(t);
                format!(
                    "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS checkpoint_names text[],
                         ADD COLUMN IF NOT EXISTS checkpoint_values text[],
                         ADD COLUMN IF NOT EXISTS evidence text,
                         ADD COLUMN IF NOT EXISTS unknown_at timestamptz;
                     CREATE INDEX IF NOT EXISTS {n}_unknown ON {t} (unknown_at)
                         WHERE state = {UNKNOWN};"
                )
            },
        },
        crate::storage::Migration {
            version: 4,
            name: "stored_forms",
            sql: |t| {
                format!(
                    "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS resource text,
                         ADD COLUMN IF NOT EXISTS result_code text,
                         ADD COLUMN IF NOT EXISTS body_flags smallint;"
                )
            },
        },
        crate::storage::Migration {
            version: 5,
            name: "acquire_function",
            sql: acquire_function,
        },
        crate::storage::Migration {
            version: 6,
            name: "lease_index",
            sql: |t| {
                let n = crate::storage::bare(t);
                format!(
                    "CREATE INDEX IF NOT EXISTS {n}_lease ON {t} (lease_until)
                         WHERE state = {PROCESSING};"
                )
            },
        },
    ],
};

/// The record's columns as `acquire`, `read` and a claim return them, after the fence, for a
/// record aliased `a`: the indices [`classify`], [`taken`] and [`stored_answer`] read.
fn columns(a: &str) -> String {
    format!(
        "{a}.digest, {a}.state,
         GREATEST(EXTRACT(EPOCH FROM ({a}.lease_until - now())), 0)::float8,
         COALESCE({a}.expires_at <= now(), false),
         {a}.status, {a}.header_names, {a}.header_values, {a}.body,
         GREATEST(EXTRACT(EPOCH FROM (now() - {a}.lease_until)), 0)::float8,
         {a}.checkpoint_names, {a}.checkpoint_values, {a}.evidence,
         GREATEST(EXTRACT(EPOCH FROM (now() - {a}.acquired_at)), 0)::float8,
         {a}.resource, {a}.result_code, {a}.body_flags"
    )
}

/// The function `acquire` calls, `<table>_acquire(tenant, operation, key, digest, lease)`: one
/// row, the fence the caller now holds (`NULL` when it took nothing) and the record as it was
/// read before any write ([`columns`]; all `NULL` when there was none).
///
/// It reads the record first, and writes only when there is something to take: it inserts the
/// record when there is none, and takes over one that is released, or processing with its lease
/// passed and the same digest, raising the fence it read (a concurrent takeover makes it update
/// nothing). Anything else (completed, in flight, unknown, another digest) is answered from the
/// read alone: a replay takes no row lock, no transaction id and writes no WAL, and costs about
/// a plain read. A single statement doing the same (a data-modifying `WITH`) costs a replay
/// half again as much, for the insert and update it plans and opens even when they change
/// nothing. A write commits without waiting for the disk, as the store's docs explain.
///
/// An insert that loses a race to another request (the key inserted after the read) returns
/// all `NULL`: the caller reads the record again, as it does for any record changed under it.
fn acquire_function(t: &str) -> String {
    let seen = columns("seen");
    format!(
        "CREATE OR REPLACE FUNCTION {t}_acquire(
             p_tenant text, p_operation text, p_key text, p_digest bytea, p_lease float8)
         RETURNS TABLE (
             fence bigint, digest bytea, state smallint, lease_left float8, expired boolean,
             status smallint, header_names text[], header_values bytea[], body bytea,
             overdue float8, checkpoint_names text[], checkpoint_values text[], evidence text,
             age float8, resource text, result_code text, body_flags smallint)
         LANGUAGE plpgsql AS $acquire$
         #variable_conflict use_column
         DECLARE
             seen {t}%ROWTYPE;
             won bigint;
         BEGIN
             SELECT * INTO seen FROM {t} AS r
             WHERE r.tenant = p_tenant AND r.operation = p_operation AND r.key = p_key;
             IF NOT FOUND THEN
                 PERFORM set_config('synchronous_commit', 'off', true);
                 INSERT INTO {t} AS r
                     (tenant, operation, key, digest, state, fence, lease_until, acquired_at)
                 VALUES (p_tenant, p_operation, p_key, p_digest, {PROCESSING}, 1,
                         now() + make_interval(secs => p_lease), now())
                 ON CONFLICT (tenant, operation, key) DO NOTHING
                 RETURNING r.fence INTO won;
             ELSIF seen.state = {RELEASED}
                 OR (seen.state = {PROCESSING} AND seen.lease_until <= now()
                     AND seen.digest = p_digest) THEN
                 PERFORM set_config('synchronous_commit', 'off', true);
                 UPDATE {t} AS r
                 SET state = {PROCESSING}, fence = r.fence + 1, digest = p_digest,
                     lease_until = now() + make_interval(secs => p_lease), acquired_at = now(),
                     expires_at = NULL, status = NULL,
                     header_names = NULL, header_values = NULL, body = NULL,
                     resource = NULL, result_code = NULL, body_flags = NULL
                 WHERE r.tenant = p_tenant AND r.operation = p_operation AND r.key = p_key
                   AND r.fence = seen.fence
                   AND (r.state = {RELEASED}
                        OR (r.state = {PROCESSING} AND r.lease_until <= now()
                            AND r.digest = p_digest))
                 RETURNING r.fence INTO won;
             END IF;
             RETURN QUERY SELECT won, {seen};
         END
         $acquire$;"
    )
}

const PROCESSING: i16 = 0;
const COMPLETED: i16 = 1;
const RELEASED: i16 = 2;
const UNKNOWN: i16 = 3;

impl Sql {
    fn new(table: &str) -> Self {
        let t = table;
        let pk = "tenant = $1 AND operation = $2 AND key = $3";
        let pk_t = "tenant = $1 AND t.operation = $2 AND t.key = $3";
        let columns = &columns("t");
        let mut sql = Sql {
            table: t.to_owned(),
            claim: claim::ClaimSql::new(t, columns),
            checkpoint_in: String::new(),
            complete_in: String::new(),
            // One round trip: the function reads the record first and answers with it when
            // there is nothing to take (a replay, a request in flight, another digest), so
            // that a replay writes nothing and costs a read; it inserts the record when there
            // is none, or takes over one that is free (see the migration `acquire_function`).
            acquire: format!("SELECT * FROM {t}_acquire($1, $2, $3, $4, $5)"),
            read: format!("SELECT NULL::bigint, {columns} FROM {t} AS t WHERE t.{pk_t}"),
            complete: format!(
                "UPDATE {t} SET state = {COMPLETED}, lease_until = NULL, status = $5,
                     header_names = $6, header_values = $7, body = $8,
                     expires_at = now() + make_interval(secs => $9),
                     resource = $10, result_code = $11, body_flags = $12
                 WHERE {pk} AND fence = $4 AND state IN ({PROCESSING}, {UNKNOWN})"
            ),
            release: format!(
                "UPDATE {t} SET state = {RELEASED}, lease_until = NULL, expires_at = now(),
                     checkpoint_names = NULL, checkpoint_values = NULL
                 WHERE {pk} AND fence = $4 AND state IN ({PROCESSING}, {UNKNOWN})"
            ),
            renew: format!(
                "UPDATE {t} SET lease_until = now() + make_interval(secs => $5)
                 WHERE {pk} AND fence = $4 AND state = {PROCESSING}"
            ),
            sweep: format!(
                "DELETE FROM {t}
                 WHERE state <> {PROCESSING} AND state <> {UNKNOWN}
                   AND expires_at <= now() - make_interval(secs => $1)"
            ),
            checkpoint: format!(
                "UPDATE {t}
                 SET checkpoint_names = array_append(COALESCE(checkpoint_names, '{{}}'), $5),
                     checkpoint_values = array_append(COALESCE(checkpoint_values, '{{}}'), $6)
                 WHERE {pk} AND fence = $4 AND state = {PROCESSING}
                   AND COALESCE(cardinality(checkpoint_names), 0) < {max}",
                max = super::checkpoint::MAX_CHECKPOINTS
            ),
            checkpoints_held: format!(
                "SELECT COALESCE(cardinality(checkpoint_names), 0) FROM {t}
                 WHERE {pk} AND fence = $4 AND state = {PROCESSING}"
            ),
            mark_unknown: format!(
                "UPDATE {t} SET state = {UNKNOWN}, lease_until = NULL, evidence = $5,
                     unknown_at = now()
                 WHERE {pk} AND fence = $4 AND state = {PROCESSING}"
            ),
            expired: format!(
                "SELECT tenant, operation, key, fence, status, resource,
                     checkpoint_names, checkpoint_values
                 FROM {t}
                 WHERE state <> {PROCESSING} AND state <> {UNKNOWN}
                   AND expires_at <= now() - make_interval(secs => $1)
                 ORDER BY expires_at LIMIT $2"
            ),
            forget: format!(
                "DELETE FROM {t} AS r
                 USING unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
                     AS d(tenant, operation, key, fence)
                 WHERE r.tenant = d.tenant AND r.operation = d.operation AND r.key = d.key
                   AND r.fence = d.fence AND r.state IN ({COMPLETED}, {RELEASED})"
            ),
            unknowns: format!(
                "SELECT tenant, operation, key, fence, COALESCE(evidence, ''),
                     checkpoint_names, checkpoint_values,
                     GREATEST(EXTRACT(EPOCH FROM (now() - unknown_at)), 0)::float8
                 FROM {t} WHERE state = {UNKNOWN}
                 ORDER BY unknown_at LIMIT $1"
            ),
            // The abandoned records, oldest lease first, through the index on the lease's end;
            // each locked as it is found, and one another round holds is skipped, so that two
            // rounds (on two instances) share the work and never take the same record. A
            // request's takeover of the same record at the same moment waits for the lock,
            // then finds the fence changed and takes nothing.
            take_abandoned: format!(
                "WITH due AS (
                     SELECT tenant, operation, key, lease_until, acquired_at FROM {t}
                     WHERE state = {PROCESSING}
                       AND lease_until <= now() - make_interval(secs => $3)
                     ORDER BY lease_until
                     LIMIT $2
                     FOR UPDATE SKIP LOCKED
                 )
                 UPDATE {t} AS r
                 SET fence = r.fence + 1, acquired_at = now(),
                     lease_until = now() + make_interval(secs => $1)
                 FROM due
                 WHERE r.tenant = due.tenant AND r.operation = due.operation AND r.key = due.key
                 RETURNING r.tenant, r.operation, r.key, r.fence, r.digest,
                     r.checkpoint_names, r.checkpoint_values,
                     GREATEST(EXTRACT(EPOCH FROM
                         (now() - COALESCE(due.acquired_at, due.lease_until))), 0)::float8,
                     GREATEST(EXTRACT(EPOCH FROM (now() - due.lease_until)), 0)::float8"
            ),
            // A record from before `acquired_at` existed counts from its lease.
            stuck: format!(
                "SELECT tenant, operation, key, fence,
                     GREATEST(EXTRACT(EPOCH FROM (now() - COALESCE(acquired_at, lease_until))), 0)::float8
                 FROM {t}
                 WHERE state = {PROCESSING}
                   AND COALESCE(acquired_at, lease_until) <= now() - make_interval(secs => $1)
                 ORDER BY COALESCE(acquired_at, lease_until)
                 LIMIT $2"
            ),
        };
        // The handler's transaction runs them typed, unprepared: `RETURNING` counts the rows.
        sql.checkpoint_in = format!("{} RETURNING 1", sql.checkpoint);
        sql.complete_in = format!("{} RETURNING 1", sql.complete);
        sql
    }
}

/// A table made by an earlier version of the store and not migrated since: its acquire
/// function is missing (the database's error is the source).
#[derive(Debug, thiserror::Error)]
#[error(
    "{table}_acquire does not exist: the table was not migrated since an earlier version of \
     the store; run surely::postgres::migrate (or PostgresStore::migrate) before serving"
)]
struct Unmigrated {
    table: String,
    source: tokio_postgres::Error,
}

/// An owner's update changed its one record, or found it taken over (or no longer processing).
fn one_record(updated: u64) -> Result<(), StoreError> {
    if updated == 1 {
        Ok(())
    } else {
        Err(StoreError::stale())
    }
}

/// `d` in seconds for an interval, at most ten years (see [`IdempotencyStore`]'s durations): a
/// longer one would be out of an interval's or a timestamp's range.
fn secs(d: Duration) -> f64 {
    super::bounded(d).as_secs_f64()
}

impl PostgresStore {
    /// A store over `pool`, in the table `surely_idempotency`.
    pub fn new(pool: Pool) -> Self {
        PostgresStore {
            pool,
            sql: Arc::new(Sql::new("surely_idempotency")),
        }
    }

    /// A store with its own pool (16 connections, no TLS) to the database at `url`
    /// (`postgres://user@host:port/db`).
    ///
    /// # Errors
    ///
    /// The URL does not parse, or the pool cannot be built. Nothing connects yet.
    pub fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = crate::storage::connect(url).map_err(StoreError::backend)?;
        Ok(Self::new(pool))
    }

    /// The same store in another table, such as `myschema.idempotency`.
    ///
    /// # Errors
    ///
    /// The name is not a lower-case identifier (letters, digits, `_`, at most 50 bytes),
    /// optionally qualified by a schema of the same form.
    pub fn with_table(self, table: &str) -> Result<Self, ConfigError> {
        crate::storage::check_table("idempotency table name", table)?;
        Ok(PostgresStore {
            pool: self.pool,
            sql: Arc::new(Sql::new(table)),
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

    /// Applies this store's table's migrations that the database has not recorded yet (see
    /// [`surely::postgres`](crate::postgres), whose [`migrate`](crate::postgres::migrate)
    /// migrates everything the crate keeps, with the default table names, in one call).
    ///
    /// # Errors
    ///
    /// The database refused, or could not be reached.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        crate::storage::apply(&self.pool, &[(&POSTGRES_COMPONENT, self.table())])
            .await
            .map(drop)
            .map_err(StoreError::backend)
    }

    /// Completes the record of `ticket` with `response` inside the caller's transaction `txn`:
    /// it commits with the caller's business writes, or rolls back with them. The layer stores
    /// it as it stores any answer (headers it never stores left out, size limit, compression,
    /// seal), and does not complete the record again when the handler returns this answer.
    ///
    /// Store the response the handler returns, as it returns it:
    /// [`StoredResponse::buffer`] takes it (headers its framework set included) and gives it
    /// back to return. An answer that differs from the one returned (a `content-type` left
    /// out) is replayed as stored, and the layer warns of it
    /// ([`StoredAnswerDiffers`](crate::record::ServerEventKind::StoredAnswerDiffers)).
    ///
    /// Takes a deadpool-postgres transaction (its statement is then prepared once per
    /// connection) or a tokio-postgres one (sent typed, unprepared): see
    /// [`HandlerTransaction`].
    ///
    /// An axum handler behind the layer, which finds its [`Ticket`] in the request's
    /// extensions:
    ///
    /// ```no_run
    /// use axum::extract::State;
    /// use axum::response::{IntoResponse, Response};
    /// use axum::{Extension, Router};
    /// use http::StatusCode;
    /// use surely::server::idempotency::{IdempotencyLayer, Ticket};
    /// use surely::server::store::{PostgresStore, StoredResponse};
    ///
    /// type BoxError = Box<dyn std::error::Error + Send + Sync>;
    ///
    /// async fn create_order(
    ///     State(store): State<PostgresStore>,
    ///     Extension(ticket): Extension<Ticket>,
    /// ) -> Response {
    ///     match write_order(&store, &ticket).await {
    ///         Ok(res) => res.into_response(),
    ///         // Rolled back: nothing of the order nor of its answer is stored.
    ///         Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    ///     }
    /// }
    ///
    /// async fn write_order(
    ///     store: &PostgresStore,
    ///     ticket: &Ticket,
    /// ) -> Result<http::Response<http_body_util::Full<bytes::Bytes>>, BoxError> {
    ///     let mut client = store.pool().get().await?;
    ///     let txn = client.transaction().await?;
    ///     txn.execute("INSERT INTO orders (id) VALUES ($1)", &[&"o-1"]).await?;
    ///     // The answer as axum sends it (`content-type: text/plain; charset=utf-8` included),
    ///     // stored as it is, in the order's transaction.
    ///     let res = (StatusCode::CREATED, String::from("o-1")).into_response();
    ///     let (stored, res) = StoredResponse::buffer(res).await?;
    ///     store.complete_in(&txn, ticket, &stored).await?;
    ///     txn.commit().await?;
    ///     Ok(res)
    /// }
    ///
    /// # fn main() -> Result<(), BoxError> {
    /// let store = PostgresStore::connect("postgres://postgres@127.0.0.1/test")?;
    /// let keyed = IdempotencyLayer::builder(store.clone()).build()?;
    /// let app: Router = Router::new()
    ///     .route("/orders", axum::routing::post(create_order).layer(keyed))
    ///     .with_state(store);
    /// # let _ = app;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::is_stale`] if the ticket's fence is no longer the record's (a later owner
    /// took over: roll back), or the statement failed.
    pub async fn complete_in(
        &self,
        txn: &impl HandlerTransaction,
        ticket: &Ticket,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let stored = ticket.encode(response).map_err(StoreError::backend)?;
        let key = ticket.record_key();
        let (names, values) = header_arrays(&stored);
        let params = complete_params(
            key,
            ticket.fence(),
            &stored,
            &names,
            &values,
            ticket.retention(),
        );
        let rows = sealed::Sealed::run(txn, &self.sql.complete_in, &params.typed())
            .await
            .map_err(StoreError::backend)?;
        one_record(rows.len() as u64)?;
        ticket.completed_in(response);
        Ok(())
    }

    /// Records `checkpoint` on the record of `ticket` inside the caller's transaction `txn`: the
    /// step and the business writes it describes commit together or not at all. The ticket
    /// remembers it (see [`Ticket::checkpoint`]).
    ///
    /// ```no_run
    /// # async fn handler(store: surely::server::store::PostgresStore,
    /// #     ticket: surely::server::idempotency::Ticket) -> Result<(), Box<dyn std::error::Error>> {
    /// use surely::server::store::Checkpoint;
    ///
    /// let mut client = store.pool().get().await?;
    /// let txn = client.transaction().await?;
    /// txn.execute("INSERT INTO payments (id, channel_request) VALUES ($1, $2)", &[&"p-1", &"req-9"]).await?;
    /// store.checkpoint_in(&txn, &ticket, &Checkpoint::new("charge", "req-9")?).await?;
    /// txn.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`IdempotencyStore::checkpoint`].
    pub async fn checkpoint_in(
        &self,
        txn: &impl HandlerTransaction,
        ticket: &Ticket,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        ticket.checkpointed();
        let step = Step::new(ticket.record_key(), ticket.fence(), checkpoint);
        let rows = sealed::Sealed::run(txn, &self.sql.checkpoint_in, &step.typed())
            .await
            .map_err(StoreError::backend)?;
        if rows.len() == 1 {
            return Ok(());
        }
        let held = sealed::Sealed::run(txn, &self.sql.checkpoints_held, &step.typed()[..4])
            .await
            .map_err(StoreError::backend)?;
        full_or_stale(held.into_iter().next())
    }

    /// Runs a listing whose rows start with tenant, operation, key and fence; `rest` reads
    /// the other columns.
    async fn list<T>(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        rest: impl Fn(&Row, RecordKey, Fence) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let client = self.pool.get().await.map_err(StoreError::backend)?;
        let rows = client
            .query(sql, params)
            .await
            .map_err(StoreError::backend)?;
        rows.iter()
            .map(|row| {
                let e = StoreError::backend;
                let tenant: &str = row.try_get(0).map_err(e)?;
                let operation: &str = row.try_get(1).map_err(e)?;
                let key: &str = row.try_get(2).map_err(e)?;
                let fence: i64 = row.try_get(3).map_err(e)?;
                let key = IdempotencyKey::new(key).map_err(StoreError::backend)?;
                rest(
                    row,
                    RecordKey::new(tenant, operation, key),
                    Fence::new(fence as u64),
                )
            })
            .collect()
    }

    /// Runs one of the updates that only the owner with the fence in `params` may make: stale
    /// unless it changed the one record.
    async fn update_owned(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), StoreError> {
        let client = self.pool.get().await.map_err(StoreError::backend)?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(StoreError::backend)?;
        let n = client
            .execute(&stmt, params)
            .await
            .map_err(StoreError::backend)?;
        one_record(n)
    }

    /// A statement that could not be prepared: when what it calls is missing, the table was
    /// made by an earlier version and not migrated since, which the error says.
    fn unmigrated(&self, e: tokio_postgres::Error) -> StoreError {
        if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_FUNCTION) {
            StoreError::backend(Unmigrated {
                table: self.sql.table.clone(),
                source: e,
            })
        } else {
            StoreError::backend(e)
        }
    }

    async fn acquire_inner(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> Result<Acquire, StoreError> {
        let client = self.pool.get().await.map_err(StoreError::backend)?;
        let acquire = client
            .prepare_cached(&self.sql.acquire)
            .await
            .map_err(|e| self.unmigrated(e))?;
        let read = client
            .prepare_cached(&self.sql.read)
            .await
            .map_err(StoreError::backend)?;
        let (tenant, operation, k) = (key.tenant(), key.operation(), key.key().as_str());
        let digest: &[u8] = digest.as_bytes();
        let lease = secs(lease);
        // A record released, swept, or inserted by another request between the function's read
        // and its write sends us round again (with the plain read, then the function).
        let params: [&(dyn ToSql + Sync); 5] = [&tenant, &operation, &k, &digest, &lease];
        let mut take = true;
        for _ in 0..4 {
            let row = if take {
                client.query_opt(&acquire, &params).await
            } else {
                client.query_opt(&read, &params[..3]).await
            }
            .map_err(by_content)?;
            // The plain read found nothing: the record is gone, acquire again.
            let Some(row) = row else {
                take = true;
                continue;
            };
            let fence: Option<i64> = row.try_get(0).map_err(StoreError::backend)?;
            if let Some(fence) = fence {
                return taken(&row, Fence::new(fence as u64));
            }
            let seen: Option<&[u8]> = row.try_get(1).map_err(StoreError::backend)?;
            if seen.is_none() {
                // Inserted by another request after the function's read: read it as it is now.
                take = false;
                continue;
            }
            match classify(&row, digest)? {
                Some(found) => return Ok(found),
                None => take = true,
            }
        }
        Err(StoreError::backend(
            "idempotency record changed under four acquire attempts in a row",
        ))
    }
}

/// A query on the request's own values failed: a data exception (SQLSTATE class 22, such as a
/// value PostgreSQL's types refuse) or a limit (class 54, such as an index entry over the btree's
/// limit) is the request's doing, and retrying it would fail again; anything else is the
/// backend's.
fn by_content(e: tokio_postgres::Error) -> StoreError {
    if crate::storage::is_input_error(&e) {
        StoreError::rejected(e)
    } else {
        StoreError::backend(e)
    }
}

/// What the acquire that made the caller the owner took: a takeover when the function's read
/// saw the record `PROCESSING` with its lease passed (the function took it over, as it
/// takes nothing else that is processing); a new or released record otherwise. A record that
/// another request committed after the snapshot reads as a plain owner.
fn taken(row: &Row, fence: Fence) -> Result<Acquire, StoreError> {
    let e = StoreError::backend;
    let state: Option<i16> = row.try_get(2).map_err(e)?;
    let overdue: Option<f64> = row.try_get(9).map_err(e)?;
    Ok(match (state, overdue) {
        (Some(PROCESSING), Some(overdue)) if fence.get() > 1 => {
            let age: Option<f64> = row.try_get(13).map_err(e)?;
            Acquire::TakenOver {
                fence,
                overdue: duration(overdue),
                age: age.map_or(Duration::ZERO, duration),
                checkpoints: checkpoints(row.try_get(10).map_err(e)?, row.try_get(11).map_err(e)?)?,
            }
        }
        _ => Acquire::Owner(fence),
    })
}

/// What a read of a record not taken says; `None` when it is free again (released meanwhile).
fn classify(row: &Row, digest: &[u8]) -> Result<Option<Acquire>, StoreError> {
    let e = StoreError::backend;
    let stored: &[u8] = row.try_get(1).map_err(e)?;
    let state: i16 = row.try_get(2).map_err(e)?;
    let left: f64 = row.try_get(3).map_err(e)?;
    let expired: bool = row.try_get(4).map_err(e)?;
    Ok(Some(match state {
        PROCESSING if stored != digest => Acquire::Mismatch,
        PROCESSING if left > 0.0 => Acquire::InFlight {
            retry_after: Duration::try_from_secs_f64(left).unwrap_or(Duration::from_secs(1)),
        },
        // The lease passed between the two statements: try again.
        PROCESSING => return Ok(None),
        UNKNOWN if stored != digest => Acquire::Mismatch,
        UNKNOWN => {
            let evidence: Option<String> = row.try_get(12).map_err(e)?;
            Acquire::Unknown {
                evidence: evidence.unwrap_or_default(),
            }
        }
        COMPLETED if expired => Acquire::Expired,
        COMPLETED if stored != digest => Acquire::Mismatch,
        COMPLETED => Acquire::Completed(stored_answer(row)?),
        _ => return Ok(None),
    }))
}

/// The answer a completed record stores.
fn stored_answer(row: &Row) -> Result<StoredResponse, StoreError> {
    let e = StoreError::backend;
    let status: i16 = row.try_get(5).map_err(e)?;
    let names: Vec<String> = row.try_get(6).map_err(e)?;
    let values: Vec<Vec<u8>> = row.try_get(7).map_err(e)?;
    let body: Vec<u8> = row.try_get(8).map_err(e)?;
    let status = u16::try_from(status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| StoreError::backend("stored status out of range"))?;
    let resource: Option<String> = row.try_get(14).map_err(e)?;
    let code: Option<String> = row.try_get(15).map_err(e)?;
    let flags: Option<i16> = row.try_get(16).map_err(e)?;
    let stored = match (resource, code) {
        (Some(resource), Some(code)) => StoredResponse::reference(status, resource, code),
        _ => StoredResponse::from_parts(
            status,
            names
                .iter()
                .map(String::as_str)
                .zip(values.iter().map(Vec::as_slice)),
            Bytes::from(body),
        ),
    };
    Ok(stored.with_flags(flags.unwrap_or(0) as u8))
}

/// What a read of one record (`t.fence` then the columns) says, for `inspect`.
fn view(row: &Row) -> Result<RecordView, StoreError> {
    let e = StoreError::backend;
    let fence: i64 = row.try_get(0).map_err(e)?;
    let digest: &[u8] = row.try_get(1).map_err(e)?;
    let digest = <[u8; 32]>::try_from(digest)
        .map_err(|_| StoreError::backend("stored digest is not 32 bytes"))?;
    let state: i16 = row.try_get(2).map_err(e)?;
    let state = match state {
        PROCESSING => {
            let left: f64 = row.try_get(3).map_err(e)?;
            RecordState::Processing {
                lease_left: duration(left),
            }
        }
        COMPLETED => RecordState::Completed {
            response: stored_answer(row)?,
            expired: row.try_get(4).map_err(e)?,
        },
        RELEASED => RecordState::Released,
        UNKNOWN => {
            let evidence: Option<String> = row.try_get(12).map_err(e)?;
            RecordState::Unknown {
                evidence: evidence.unwrap_or_default(),
            }
        }
        other => {
            return Err(StoreError::backend(format!(
                "idempotency record in an unknown state {other}"
            )))
        }
    };
    Ok(RecordView::new(
        state,
        Fence::new(u64::try_from(fence).map_err(|_| StoreError::backend("negative fence"))?),
        RequestDigest::from_bytes(digest),
        checkpoints(row.try_get(10).map_err(e)?, row.try_get(11).map_err(e)?)?,
    ))
}

fn duration(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::ZERO)
}

/// The checkpoints stored in two parallel arrays. A row whose arrays disagree, or whose values
/// no longer pass [`Checkpoint::new`] (written by hand), is reported, never skipped.
fn checkpoints(
    names: Option<Vec<String>>,
    values: Option<Vec<String>>,
) -> Result<Vec<Checkpoint>, StoreError> {
    let (names, values) = (names.unwrap_or_default(), values.unwrap_or_default());
    if names.len() != values.len() {
        return Err(StoreError::backend(
            "idempotency record's checkpoint names and values differ in number",
        ));
    }
    names
        .into_iter()
        .zip(values)
        .map(|(n, v)| Checkpoint::new(n, v).map_err(StoreError::backend))
        .collect()
}

fn header_arrays(response: &StoredResponse) -> (Vec<&str>, Vec<&[u8]>) {
    response
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .unzip()
}

/// The twelve parameters of the `complete` statement.
struct CompleteParams<'a> {
    tenant: &'a str,
    operation: &'a str,
    key: &'a str,
    fence: i64,
    status: i16,
    names: &'a [&'a str],
    values: &'a [&'a [u8]],
    body: &'a [u8],
    retention: f64,
    resource: Option<&'a str>,
    result_code: Option<&'a str>,
    flags: i16,
}

impl CompleteParams<'_> {
    fn refs(&self) -> [&(dyn ToSql + Sync); 12] {
        [
            &self.tenant,
            &self.operation,
            &self.key,
            &self.fence,
            &self.status,
            &self.names,
            &self.values,
            &self.body,
            &self.retention,
            &self.resource,
            &self.result_code,
            &self.flags,
        ]
    }

    fn typed(&self) -> [(&(dyn ToSql + Sync), Type); 12] {
        let types = [
            Type::TEXT,
            Type::TEXT,
            Type::TEXT,
            Type::INT8,
            Type::INT2,
            Type::TEXT_ARRAY,
            Type::BYTEA_ARRAY,
            Type::BYTEA,
            Type::FLOAT8,
            Type::TEXT,
            Type::TEXT,
            Type::INT2,
        ];
        let mut refs = self.refs().into_iter();
        types.map(|t| (refs.next().expect("twelve parameters"), t))
    }
}

fn complete_params<'a>(
    key: &'a RecordKey,
    fence: Fence,
    response: &'a StoredResponse,
    names: &'a [&'a str],
    values: &'a [&'a [u8]],
    retention: Duration,
) -> CompleteParams<'a> {
    CompleteParams {
        tenant: key.tenant(),
        operation: key.operation(),
        key: key.key().as_str(),
        fence: fence.get() as i64,
        status: response.status().as_u16() as i16,
        names,
        values,
        body: response.body(),
        retention: secs(retention),
        resource: response.resource(),
        result_code: response.result_code(),
        flags: i16::from(response.flags()),
    }
}

/// The six parameters of the `checkpoint` statement.
struct Step<'a> {
    tenant: &'a str,
    operation: &'a str,
    key: &'a str,
    fence: i64,
    name: &'a str,
    value: &'a str,
}

impl<'a> Step<'a> {
    fn new(key: &'a RecordKey, fence: Fence, checkpoint: &'a Checkpoint) -> Self {
        Step {
            tenant: key.tenant(),
            operation: key.operation(),
            key: key.key().as_str(),
            fence: fence.get() as i64,
            name: checkpoint.name(),
            value: checkpoint.value(),
        }
    }

    fn refs(&self) -> [&(dyn ToSql + Sync); 6] {
        [
            &self.tenant,
            &self.operation,
            &self.key,
            &self.fence,
            &self.name,
            &self.value,
        ]
    }

    fn typed(&self) -> [(&(dyn ToSql + Sync), Type); 6] {
        let [t, o, k, f, n, v] = self.refs();
        [
            (t, Type::TEXT),
            (o, Type::TEXT),
            (k, Type::TEXT),
            (f, Type::INT8),
            (n, Type::TEXT),
            (v, Type::TEXT),
        ]
    }
}

/// A transaction that a handler's completion or checkpoint joins
/// ([`PostgresStore::complete_in`], [`PostgresStore::checkpoint_in`]): deadpool-postgres's,
/// whose connection's statement cache the store then uses (the statement is prepared once per
/// connection), or tokio-postgres's, to which the store sends its statement typed, unprepared,
/// in one round trip. Sealed: implemented for those two only.
pub trait HandlerTransaction: sealed::Sealed {}

impl HandlerTransaction for tokio_postgres::Transaction<'_> {}
impl HandlerTransaction for deadpool_postgres::Transaction<'_> {}

mod sealed {
    use std::future::Future;

    use tokio_postgres::types::{ToSql, Type};
    use tokio_postgres::Row;

    /// What the store does with a handler's transaction; not nameable outside the crate.
    pub trait Sealed: Sync {
        fn run<'a>(
            &'a self,
            sql: &'a str,
            params: &'a [(&'a (dyn ToSql + Sync), Type)],
        ) -> impl Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + Send + 'a;
    }

    impl Sealed for tokio_postgres::Transaction<'_> {
        fn run<'a>(
            &'a self,
            sql: &'a str,
            params: &'a [(&'a (dyn ToSql + Sync), Type)],
        ) -> impl Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + Send + 'a {
            // Typed: one round trip, nothing prepared on the connection.
            self.query_typed(sql, params)
        }
    }

    impl Sealed for deadpool_postgres::Transaction<'_> {
        async fn run<'a>(
            &'a self,
            sql: &'a str,
            params: &'a [(&'a (dyn ToSql + Sync), Type)],
        ) -> Result<Vec<Row>, tokio_postgres::Error> {
            // Prepared once per connection, in its statement cache.
            let stmt = self.prepare_cached(sql).await?;
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
            self.query(&stmt, &values).await
        }
    }
}

/// A checkpoint refused: the record is full, or no longer this owner's.
fn full_or_stale(held: Option<Row>) -> Result<(), StoreError> {
    let held: Option<i32> = held
        .map(|row| row.try_get(0))
        .transpose()
        .map_err(StoreError::backend)?;
    match held {
        Some(n) => Checkpoint::room_after(n as usize).map_err(StoreError::rejected),
        None => Err(StoreError::stale()),
    }
}

impl IdempotencyStore for PostgresStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn acquire(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> impl Future<Output = Result<Acquire, StoreError>> + Send {
        self.acquire_inner(key, digest, lease)
    }

    async fn complete(
        &self,
        key: &RecordKey,
        fence: Fence,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let (names, values) = header_arrays(response);
        let params = complete_params(key, fence, response, &names, &values, retention);
        self.update_owned(&self.sql.complete, &params.refs()).await
    }

    async fn release(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        let fence = fence.get() as i64;
        let params: [&(dyn ToSql + Sync); 4] =
            [&key.tenant(), &key.operation(), &key.key().as_str(), &fence];
        self.update_owned(&self.sql.release, &params).await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        fence: Fence,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let (fence, lease) = (fence.get() as i64, secs(lease));
        let params: [&(dyn ToSql + Sync); 5] = [
            &key.tenant(),
            &key.operation(),
            &key.key().as_str(),
            &fence,
            &lease,
        ];
        self.update_owned(&self.sql.renew, &params).await
    }

    async fn stuck(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<StuckRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.list(
            &self.sql.stuck,
            &[&secs(older_than), &limit],
            |row, key, fence| {
                let age: f64 = row.try_get(4).map_err(StoreError::backend)?;
                Ok(StuckRecord::new(key, fence, duration(age)))
            },
        )
        .await
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordView>, StoreError> {
        let client = self.pool.get().await.map_err(StoreError::backend)?;
        let stmt = client
            .prepare_cached(&self.sql.claim.read)
            .await
            .map_err(StoreError::backend)?;
        let (tenant, operation, k) = (key.tenant(), key.operation(), key.key().as_str());
        let row = client
            .query_opt(&stmt, &[&tenant, &operation, &k])
            .await
            .map_err(by_content)?;
        row.as_ref().map(view).transpose()
    }

    async fn checkpoint(
        &self,
        key: &RecordKey,
        fence: Fence,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        let step = Step::new(key, fence, checkpoint);
        let client = self.pool.get().await.map_err(StoreError::backend)?;
        let stmt = client
            .prepare_cached(&self.sql.checkpoint)
            .await
            .map_err(StoreError::backend)?;
        let n = client
            .execute(&stmt, &step.refs())
            .await
            .map_err(StoreError::backend)?;
        if n == 1 {
            return Ok(());
        }
        let held = client
            .query_opt(&self.sql.checkpoints_held, &step.refs()[..4])
            .await
            .map_err(StoreError::backend)?;
        full_or_stale(held)
    }

    async fn mark_unknown(
        &self,
        key: &RecordKey,
        fence: Fence,
        evidence: &str,
    ) -> Result<(), StoreError> {
        let fence = fence.get() as i64;
        let params: [&(dyn ToSql + Sync); 5] = [
            &key.tenant(),
            &key.operation(),
            &key.key().as_str(),
            &fence,
            &evidence,
        ];
        self.update_owned(&self.sql.mark_unknown, &params).await
    }

    async fn unknowns(&self, limit: usize) -> Result<Vec<UnknownRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.list(&self.sql.unknowns, &[&limit], |row, key, fence| {
            let e = StoreError::backend;
            let evidence: String = row.try_get(4).map_err(e)?;
            let steps = checkpoints(row.try_get(5).map_err(e)?, row.try_get(6).map_err(e)?)?;
            let age: f64 = row.try_get(7).map_err(e)?;
            Ok(UnknownRecord::new(
                key,
                fence,
                evidence,
                steps,
                duration(age),
            ))
        })
        .await
    }

    async fn expired(
        &self,
        keep_expired_for: Duration,
        limit: usize,
    ) -> Result<Vec<ExpiredRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 2] = [&secs(keep_expired_for), &limit];
        self.list(&self.sql.expired, &params, |row, key, fence| {
            let e = StoreError::backend;
            let status: Option<i16> = row.try_get(4).map_err(e)?;
            let resource: Option<String> = row.try_get(5).map_err(e)?;
            let steps = checkpoints(row.try_get(6).map_err(e)?, row.try_get(7).map_err(e)?)?;
            let status = status
                .and_then(|s| u16::try_from(s).ok())
                .and_then(|s| StatusCode::from_u16(s).ok());
            Ok(ExpiredRecord::new(key, fence, status, resource, steps))
        })
        .await
    }

    async fn forget(&self, records: &[ExpiredRecord]) -> Result<u64, StoreError> {
        if records.is_empty() {
            return Ok(0);
        }
        let tenants: Vec<&str> = records.iter().map(|r| r.key.tenant()).collect();
        let operations: Vec<&str> = records.iter().map(|r| r.key.operation()).collect();
        let keys: Vec<&str> = records.iter().map(|r| r.key.key().as_str()).collect();
        let fences: Vec<i64> = records.iter().map(|r| r.fence.get() as i64).collect();
        let client = self.pool.get().await.map_err(StoreError::backend)?;
        client
            .execute(&self.sql.forget, &[&tenants, &operations, &keys, &fences])
            .await
            .map_err(StoreError::backend)
    }

    async fn take_abandoned(
        &self,
        overdue_by: Duration,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<AbandonedRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let params: [&(dyn ToSql + Sync); 3] = [&secs(lease), &limit, &secs(overdue_by)];
        let mut taken = self
            .list(&self.sql.take_abandoned, &params, |row, key, fence| {
                let e = StoreError::backend;
                let digest: &[u8] = row.try_get(4).map_err(e)?;
                let digest = <[u8; 32]>::try_from(digest)
                    .map_err(|_| StoreError::backend("stored digest is not 32 bytes"))?;
                let steps = checkpoints(row.try_get(5).map_err(e)?, row.try_get(6).map_err(e)?)?;
                let age: f64 = row.try_get(7).map_err(e)?;
                let overdue: f64 = row.try_get(8).map_err(e)?;
                Ok(AbandonedRecord::new(
                    key,
                    fence,
                    duration(age),
                    duration(overdue),
                    RequestDigest::from_bytes(digest),
                    steps,
                ))
            })
            .await?;
        // `RETURNING` keeps no order: the oldest lease first, as they were taken.
        taken.sort_by_key(|r| std::cmp::Reverse(r.overdue));
        Ok(taken)
    }

    async fn sweep(&self, keep_expired_for: Duration) -> Result<u64, StoreError> {
        {
            let client = self.pool.get().await.map_err(StoreError::backend)?;
            client
                .execute(&self.sql.sweep, &[&secs(keep_expired_for)])
                .await
                .map_err(StoreError::backend)
        }
    }
}

#[cfg(test)]
mod plans {
    //! The sweep's reads go through the index on `expires_at`, on the machine's PostgreSQL.

    use super::*;

    #[tokio::test]
    async fn the_expired_records_are_read_through_the_index_on_their_expiry() {
        let url = std::env::var("SURELY_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let pool = crate::storage::connect(&url).unwrap();
        let table = format!("surely_plan_{:x}", crate::ids::random_u128() as u64);
        let store = PostgresStore::new(pool.clone()).with_table(&table).unwrap();
        store.migrate().await.unwrap_or_else(|e| {
            panic!("PostgreSQL at {url} (SURELY_TEST_POSTGRES_URL) did not answer: {e}")
        });
        let client = pool.get().await.unwrap();
        // A table this small would be scanned whole; the question is whether the index can
        // serve the statement at all. An expiry moved by the safety window in the column's
        // expression (`expires_at + interval <= now()`) could not: every sweep would read
        // every terminal record.
        client
            .batch_execute("SET enable_seqscan = off")
            .await
            .unwrap();
        let (window, limit): (f64, i64) = (1.0, 10);
        let params: [&(dyn ToSql + Sync); 2] = [&window, &limit];
        for (what, sql, n) in [
            ("expired", &store.sql.expired, 2),
            ("sweep", &store.sql.sweep, 1),
        ] {
            let plan: Vec<String> = client
                .query(&format!("EXPLAIN {sql}"), &params[..n])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            let plan = plan.join("\n");
            assert!(
                plan.contains(&format!("{table}_expires_at"))
                    && plan.contains("Index Cond: (expires_at <="),
                "{what}: the index on expires_at is not used:\n{plan}"
            );
        }
        client
            .batch_execute(&format!(
                "DROP TABLE {table}; DROP FUNCTION IF EXISTS {table}_acquire;
                 DELETE FROM surely_migrations WHERE target = '{table}';"
            ))
            .await
            .unwrap();
    }
}
