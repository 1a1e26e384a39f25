//! The key claimed in the handler's transaction
//! ([`IdempotencyLayerBuilder::in_transaction`](crate::server::idempotency::IdempotencyLayerBuilder::in_transaction)).
//!
//! The layer opens a transaction on one of the store's connections, takes a transaction-scoped
//! advisory lock named after the record, and reads the record, in one flight (`BEGIN` and the
//! lock in one simple query, the read behind it). The handler writes through that transaction
//! ([`KeyedTransaction`]); the layer then inserts the completed record and commits, in a second
//! flight. Nothing is written before the handler's own writes, and the record commits with them
//! or not at all; a process that dies takes its transaction, its lock and its writes with it.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Object};
use sha2::{Digest as _, Sha256};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};
use tokio_postgres::types::ToSql;
use tokio_postgres::SimpleQueryMessage;

use super::{
    by_content, classify, complete_params, header_arrays, PostgresStore, COMPLETED, PROCESSING,
    RELEASED,
};
use crate::server::store::{
    Acquire, Claim, CommitError, Fence, Opened, RecordKey, RequestDigest, StoreError,
    StoredResponse,
};

/// The transaction a keyed request's handler writes in, when its layer claims keys
/// [in the handler's transaction](crate::server::idempotency::IdempotencyLayerBuilder::in_transaction):
/// found in the request's extensions. The layer has begun it and holds the key's lock in it; it
/// inserts the record of the handler's answer and commits after the handler returns, or rolls
/// back if the handler fails.
///
/// [`client`](Self::client) lends the connection, as a shared reference: run statements on it
/// (`prepare_cached` keeps them prepared once per connection). Do not end the transaction
/// yourself (no `COMMIT` or `ROLLBACK` statement): the layer ends it. Clones share the one
/// transaction.
///
/// ```no_run
/// # async fn handler(req: http::Request<http_body_util::Full<bytes::Bytes>>) -> Result<(), Box<dyn std::error::Error>> {
/// use surely::server::store::KeyedTransaction;
///
/// let txn = req.extensions().get::<KeyedTransaction>().ok_or("not behind the layer")?;
/// let client = txn.client().await?;
/// let insert = client.prepare_cached("INSERT INTO orders (id) VALUES ($1)").await?;
/// client.execute(&insert, &[&"o-1"]).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct KeyedTransaction {
    slot: Arc<Mutex<Slot>>,
}

impl fmt::Debug for KeyedTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedTransaction").finish_non_exhaustive()
    }
}

impl KeyedTransaction {
    /// The connection the transaction runs on, for as long as the returned guard lives (other
    /// clones wait meanwhile).
    ///
    /// # Errors
    ///
    /// [`StoreError::is_stale`] once the layer has ended the transaction (the handler returned,
    /// or was dropped).
    pub async fn client(&self) -> Result<TransactionClient, StoreError> {
        let guard = self.slot.clone().lock_owned().await;
        OwnedMutexGuard::try_map(guard, |slot| slot.conn.as_mut())
            .map(TransactionClient)
            .map_err(|_| StoreError::stale())
    }
}

/// The connection of a [`KeyedTransaction`], lent: it dereferences to deadpool-postgres's
/// client (and through it to tokio-postgres's), shared, so that the transaction cannot be
/// ended or nested through it.
pub struct TransactionClient(OwnedMappedMutexGuard<Slot, Object>);

impl Deref for TransactionClient {
    type Target = ClientWrapper;

    fn deref(&self) -> &ClientWrapper {
        &self.0
    }
}

/// The outbox's `enqueue` (and any write of the crate that joins a caller's transaction) takes
/// it: it is inside the claim's transaction.
impl crate::storage::InTransaction for TransactionClient {}

impl crate::storage::in_transaction::Sealed for TransactionClient {
    async fn query_one<'a>(
        &'a self,
        sql: &'a str,
        params: &'a [&'a (dyn ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
        crate::storage::in_transaction::query_one_cached(self, sql, params).await
    }
}

impl fmt::Debug for TransactionClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionClient").finish_non_exhaustive()
    }
}

/// A connection inside a transaction that the layer has not ended. Dropped with the connection
/// still in it (the request's future dropped, a panic), it closes the connection instead of
/// handing it back to the pool: the server then rolls the transaction back and frees the lock,
/// as after a crash.
struct Slot {
    conn: Option<Object>,
}

impl Slot {
    fn take(&mut self) -> Option<Object> {
        self.conn.take()
    }

    /// Ends the transaction behind the answer (see [`roll_back_behind`]).
    fn end_behind(&mut self) {
        if let Some(conn) = self.conn.take() {
            roll_back_behind(conn);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            close(conn);
        }
    }
}

/// Takes a connection out of the pool and drops it: the server sees it close.
fn close(conn: Object) {
    drop(Object::take(conn));
}

/// Ends the transaction on `conn` with `ROLLBACK` and hands the connection back to the pool;
/// a connection that fails to roll back is closed.
async fn roll_back(conn: Object) -> Result<(), StoreError> {
    match conn.batch_execute("ROLLBACK").await {
        Ok(()) => Ok(()),
        Err(e) => {
            close(conn);
            Err(StoreError::backend(e))
        }
    }
}

/// Rolls back on a task of its own, so that an answer that needs nothing more of the
/// transaction (a replay, a key in flight) is not kept waiting for it; without a runtime, the
/// connection is closed.
fn roll_back_behind(conn: Object) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                if let Err(e) = roll_back(conn).await {
                    tracing::debug!(
                        error = &e as &dyn std::error::Error,
                        "idempotency claim: rollback failed, connection closed"
                    );
                }
            });
        }
        Err(_) => close(conn),
    }
}

/// The advisory lock that stands for `key` in `table`: the first eight bytes of a SHA-256 of
/// both. Two records whose names collide only wait for each other.
fn lock_id(table: &str, key: &RecordKey) -> i64 {
    let mut h = Sha256::new();
    for part in [
        "surely-idempotency",
        table,
        key.tenant(),
        key.operation(),
        key.key().as_str(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// How long the transaction may sit idle, as PostgreSQL's setting wants it: milliseconds, at
/// least one, at most its limit.
fn idle_ms(lease: Duration) -> String {
    lease.as_millis().clamp(1, i32::MAX as u128).to_string()
}

impl PostgresStore {
    /// Begins a transaction, locks the record's name and reads the record: the claim, or the
    /// answer the record already gives.
    pub(crate) async fn open(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> Result<Opened, StoreError> {
        let conn = self.pool.get().await.map_err(StoreError::backend)?;
        let read = conn
            .prepare_cached(&self.sql.claim.read)
            .await
            .map_err(StoreError::backend)?;
        // From here until the transaction ends, a connection dropped is closed, never pooled.
        let mut slot = Slot { conn: Some(conn) };
        let id = lock_id(&self.sql.table, key);
        let idle = idle_ms(lease);
        let (tenant, operation, k) = (key.tenant(), key.operation(), key.key().as_str());
        let Some(conn) = slot.conn.as_ref() else {
            return Err(StoreError::backend("no connection"));
        };
        // `BEGIN` and the lock in one simple query (two numbers of ours in it, nothing of the
        // request's); the read, with the request's values as parameters, in the next statement,
        // so that its snapshot is taken with the lock held (an owner's commit is visible before
        // its lock is free). One flight: both are sent before any answer is read.
        let begin = format!(
            "BEGIN; SELECT pg_try_advisory_xact_lock({id}), \
             set_config('idle_in_transaction_session_timeout', '{idle}', true)"
        );
        let read_params: [&(dyn ToSql + Sync); 3] = [&tenant, &operation, &k];
        let (begun, row) = tokio::join!(
            conn.simple_query(&begin),
            conn.query_opt(&read, &read_params),
        );
        // Any failure drops `slot`, which closes the connection.
        let locked = begun
            .map_err(StoreError::backend)?
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(row.get(0) == Some("t")),
                _ => None,
            })
            .ok_or_else(|| StoreError::backend("the lock's statement returned no row"))?;
        let row = row.map_err(by_content)?;
        if !locked {
            slot.end_behind();
            return Ok(Opened::Found(Acquire::InFlight { retry_after: lease }));
        }
        let (fence, replaces) = match row {
            None => (Fence::new(1), None),
            Some(row) => {
                let e = StoreError::backend;
                let fence: i64 = row.try_get(0).map_err(e)?;
                let state: i16 = row.try_get(2).map_err(e)?;
                match classify(&row, digest.as_bytes())? {
                    Some(found) => {
                        slot.end_behind();
                        return Ok(Opened::Found(found));
                    }
                    None if state == PROCESSING && has_checkpoints(&row)? => {
                        // A default-mode owner died after a step outside any transaction of
                        // this layer's: its work may have taken effect, and only its recovery
                        // knows. This mode has none.
                        slot.end_behind();
                        return Ok(Opened::Found(Acquire::Unknown {
                            evidence: "a previous owner's lease passed after a checkpoint; \
                                       settle the record before the key runs again"
                                .to_owned(),
                        }));
                    }
                    // Released, or a lease passed with nothing checkpointed: the record is
                    // replaced when the handler's answer commits.
                    None => (Fence::new(fence as u64 + 1), Some(fence)),
                }
            }
        };
        Ok(Opened::Claimed(Box::new(PgClaim {
            slot: Arc::new(Mutex::new(slot)),
            store: self.clone(),
            key: key.clone(),
            digest: *digest.as_bytes(),
            fence,
            replaces,
        })))
    }
}

fn has_checkpoints(row: &tokio_postgres::Row) -> Result<bool, StoreError> {
    let names: Option<Vec<String>> = row.try_get(10).map_err(StoreError::backend)?;
    Ok(names.is_some_and(|n| !n.is_empty()))
}

/// A record claimed in an open transaction, until the layer commits or rolls it back.
struct PgClaim {
    slot: Arc<Mutex<Slot>>,
    store: PostgresStore,
    key: RecordKey,
    digest: [u8; 32],
    fence: Fence,
    /// The fence of the record the commit replaces (released, or its lease passed); `None`:
    /// there was none, and the commit inserts it.
    replaces: Option<i64>,
}

impl PgClaim {
    async fn take(&self) -> Result<Object, StoreError> {
        self.slot
            .lock()
            .await
            .take()
            .ok_or_else(|| StoreError::backend("the claim's transaction has already ended"))
    }
}

/// The record's insert failed with an answer from the server (an SQLSTATE): the transaction
/// is aborted (the `COMMIT` behind it rolls back) or its session ended (the server rolls back):
/// it did not commit. Any other failure (the connection closed, an I/O error) leaves the
/// commit unknown.
fn refused(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some()
}

/// The `COMMIT` itself failed with an `ERROR` (a deferred constraint, a serialization failure):
/// the session goes on, and the transaction rolled back. A `FATAL` or `PANIC` (the session
/// terminated mid-commit) or a lost connection leaves it unknown: the commit may have been
/// written first.
fn commit_refused(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| db.severity() == "ERROR")
}

impl Claim for PgClaim {
    fn fence(&self) -> Fence {
        self.fence
    }

    fn attach(&self, extensions: &mut http::Extensions) {
        extensions.insert(KeyedTransaction {
            slot: self.slot.clone(),
        });
    }

    fn commit<'a>(
        self: Box<Self>,
        stored: &'a StoredResponse,
        retention: Duration,
    ) -> crate::server::store::BoxFuture<'a, Result<(), CommitError>> {
        Box::pin(async move {
            let conn = self.take().await.map_err(CommitError::NotCommitted)?;
            let sql = &self.store.sql;
            let (names, values) = header_arrays(stored);
            let params = complete_params(&self.key, self.fence, stored, &names, &values, retention);
            let digest: &[u8] = &self.digest;
            let mut refs: Vec<&(dyn ToSql + Sync)> = params.refs().to_vec();
            refs.push(&digest);
            let Some(replaces) = self.replaces else {
                let insert = match conn.prepare_cached(&sql.claim.insert).await {
                    Ok(stmt) => stmt,
                    Err(e) => {
                        let _ = roll_back(conn).await;
                        return Err(CommitError::NotCommitted(StoreError::backend(e)));
                    }
                };
                // One flight. A refused insert aborts the transaction, and the `COMMIT` behind
                // it then rolls back.
                let (inserted, committed) =
                    tokio::join!(conn.execute(&insert, &refs), conn.batch_execute("COMMIT"));
                return match (inserted, committed) {
                    (Ok(1), Ok(())) => Ok(()),
                    (Ok(_), Ok(())) => Err(CommitError::Unknown(StoreError::backend(
                        "the record's insert reported no row, and the transaction committed",
                    ))),
                    (Err(e), _) if refused(&e) => {
                        Err(CommitError::NotCommitted(StoreError::backend(e)))
                    }
                    (Ok(_), Err(e)) if commit_refused(&e) => {
                        Err(CommitError::NotCommitted(StoreError::backend(e)))
                    }
                    (Err(e), _) | (_, Err(e)) => {
                        close(conn);
                        Err(CommitError::Unknown(StoreError::backend(e)))
                    }
                };
            };
            // The record is replaced only if it is still the one read at the claim.
            let replaces_ref: &(dyn ToSql + Sync) = &replaces;
            refs.push(replaces_ref);
            let replaced = match conn.prepare_cached(&sql.claim.replace).await {
                Ok(stmt) => conn.execute(&stmt, &refs).await,
                Err(e) => Err(e),
            };
            match replaced {
                Ok(1) => {}
                Ok(_) => {
                    let _ = roll_back(conn).await;
                    return Err(CommitError::NotCommitted(StoreError::stale()));
                }
                Err(e) => {
                    let _ = roll_back(conn).await;
                    return Err(CommitError::NotCommitted(by_content(e)));
                }
            }
            match conn.batch_execute("COMMIT").await {
                Ok(()) => Ok(()),
                Err(e) if commit_refused(&e) => {
                    Err(CommitError::NotCommitted(StoreError::backend(e)))
                }
                Err(e) => {
                    close(conn);
                    Err(CommitError::Unknown(StoreError::backend(e)))
                }
            }
        })
    }

    fn rollback(
        self: Box<Self>,
    ) -> crate::server::store::BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(async move { roll_back(self.take().await?).await })
    }
}

/// The statements of a claim, for the store's table `t`.
pub(super) struct ClaimSql {
    pub(super) read: String,
    pub(super) insert: String,
    pub(super) replace: String,
}

impl ClaimSql {
    pub(super) fn new(t: &str, columns: &str) -> Self {
        let pk = "tenant = $1 AND operation = $2 AND key = $3";
        let stored = "status = $5, header_names = $6, header_values = $7, body = $8,
                      expires_at = now() + make_interval(secs => $9),
                      resource = $10, result_code = $11, body_flags = $12";
        ClaimSql {
            read: format!(
                "SELECT t.fence, {columns} FROM {t} AS t
                 WHERE t.tenant = $1 AND t.operation = $2 AND t.key = $3"
            ),
            insert: format!(
                "INSERT INTO {t} (tenant, operation, key, fence, status, header_names,
                     header_values, body, expires_at, resource, result_code, body_flags,
                     digest, state, acquired_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9),
                     $10, $11, $12, $13, {COMPLETED}, now())"
            ),
            replace: format!(
                "UPDATE {t} SET state = {COMPLETED}, fence = $4, digest = $13,
                     lease_until = NULL, acquired_at = now(), {stored},
                     checkpoint_names = NULL, checkpoint_values = NULL, evidence = NULL,
                     unknown_at = NULL
                 WHERE {pk} AND fence = $14 AND state IN ({PROCESSING}, {RELEASED})"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::IdempotencyKey;

    #[test]
    fn lock_ids_differ_by_every_part_and_do_not_shift_between_parts() {
        let key = |t: &str, o: &str, k: &str| {
            RecordKey::new(t, o, IdempotencyKey::new(k).expect("a key"))
        };
        let a = lock_id("t", &key("", "POST /orders", "k1"));
        assert_eq!(a, lock_id("t", &key("", "POST /orders", "k1")));
        assert_ne!(a, lock_id("t", &key("", "POST /orders", "k2")));
        assert_ne!(a, lock_id("u", &key("", "POST /orders", "k1")));
        assert_ne!(a, lock_id("t", &key("x", "POST /orders", "k1")));
        // Lengths are hashed too: moving a byte from one part to the next names another lock.
        assert_ne!(
            lock_id("t", &key("a", "b", "k")),
            lock_id("t", &key("", "ab", "k"))
        );
    }

    #[test]
    fn the_idle_bound_is_in_milliseconds_within_postgres_limits() {
        assert_eq!(idle_ms(Duration::from_secs(30)), "30000");
        assert_eq!(idle_ms(Duration::from_micros(10)), "1");
        assert_eq!(
            idle_ms(Duration::from_secs(10 * 365 * 86_400)),
            i32::MAX.to_string()
        );
    }
}
