//! The PostgreSQL store, against the server named by `SURELY_TEST_POSTGRES_URL`, or by default
//! the one every development and CI machine runs (`postgres://postgres@127.0.0.1:5432/test`).
//! A server that does not answer fails the tests, with the address they tried: they never pass
//! without it. Every test has its own tables (unique names, dropped at the end), so runs may
//! overlap and repeat.
//!
//! Leases and retention here are short and real (the store uses the database's clock): at most
//! a second, and every wait is bounded.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use surely::server::idempotency::{IdempotencyLayer, Ticket};
use surely::server::store::{
    Acquire, Checkpoint, ExpiredRecord, Fence, IdempotencyStore, PostgresStore, RecordKey,
    RequestDigest, StoreError, StoredResponse, StuckRecord, UnknownRecord,
};
use tokio::sync::Notify;
use tower::{service_fn, Layer};

use super::scenarios;
use super::support::{handler, post, reply, send, Req, Seen};
use crate::support::names::suffix;
use crate::support::postgres::{did_not_answer, forget, url};

/// A migrated store in a fresh table; panics, naming the server, if it does not answer.
async fn store(test: &str) -> Db {
    let suffix = suffix();
    let table = format!("surely_idem_t{suffix}");
    let store = PostgresStore::connect(&url())
        .unwrap()
        .with_table(&table)
        .unwrap();
    store
        .migrate()
        .await
        .unwrap_or_else(|e| did_not_answer(test, e));
    // Migrating twice is harmless.
    store.migrate().await.unwrap();
    Db {
        store,
        table,
        orders: format!("surely_orders_t{suffix}"),
    }
}

struct Db {
    store: PostgresStore,
    table: String,
    orders: String,
}

impl Db {
    async fn drop_tables(self) {
        // And the record of its migrations.
        forget(
            self.store.pool(),
            &[&self.table, &self.orders],
            &[&self.table],
        )
        .await;
    }

    async fn order_rows(&self) -> i64 {
        let client = self.store.pool().get().await.unwrap();
        client
            .query_one(&format!("SELECT count(*) FROM {}", self.orders), &[])
            .await
            .unwrap()
            .get(0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_64_concurrent_first_requests_run_the_handler_once() {
    let db = store("pg_64_concurrent_first_requests_run_the_handler_once").await;
    scenarios::concurrent_first_requests(db.store.clone()).await;
    db.drop_tables().await;
}

/// Real time: the store's leases run on the database's clock. About a second and a half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_handler_outlives_its_caller() {
    let db = store("pg_a_handler_outlives_its_caller").await;
    super::disconnect::a_handler_outlives_its_caller(db.store.clone()).await;
    db.drop_tables().await;
}

/// Real time, about a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_handler_cancelled_with_its_caller_frees_its_key() {
    let db = store("pg_a_handler_cancelled_with_its_caller_frees_its_key").await;
    super::disconnect::a_handler_cancelled_with_its_caller_frees_its_key(db.store.clone()).await;
    db.drop_tables().await;
}

/// A real one-second lease: the test waits it out (about 1.2 s).
#[test]
fn pg_a_shutdown_mid_handler_leaves_the_key_to_its_lease() {
    let setup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = setup.block_on(store(
        "pg_a_shutdown_mid_handler_leaves_the_key_to_its_lease",
    ));
    let url = url();
    super::disconnect::a_shutdown_mid_handler_leaves_the_key_to_its_lease(
        || {
            PostgresStore::connect(&url)
                .unwrap()
                .with_table(&db.table)
                .unwrap()
        },
        Duration::from_secs(1),
        false,
    );
    setup.block_on(db.drop_tables());
}

/// A short real threshold on the database's clock: about 0.4 s.
#[tokio::test]
async fn pg_stuck_records_are_reported() {
    let db = store("pg_stuck_records_are_reported").await;
    super::recovery::stuck_records_are_reported(
        db.store.clone(),
        Duration::from_millis(250),
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

/// Real retentions of a second and of a hundred seconds: about 1.5 s.
#[tokio::test]
async fn pg_retention_by_operation() {
    let db = store("pg_retention_by_operation").await;
    super::recovery::retention_by_operation(
        db.store.clone(),
        Duration::from_secs(1),
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_client_input_never_makes_a_5xx() {
    let db = store("pg_client_input_never_makes_a_5xx").await;
    super::limits::client_input_never_makes_a_5xx(db.store.clone()).await;
    db.drop_tables().await;
}

/// A value the database refuses is the request's fault: the layer answers 400, not 503 (which
/// would have the client retry it). Here the operation column is narrowed by hand, so that an
/// ordinary path is refused (SQLSTATE 22001).
#[tokio::test]
async fn pg_a_value_the_database_refuses_is_a_400_not_a_503() {
    let db = store("pg_a_value_the_database_refuses_is_a_400_not_a_503").await;
    let client = db.store.pool().get().await.unwrap();
    client
        .batch_execute(&format!(
            "ALTER TABLE {} ALTER COLUMN operation TYPE varchar(8)",
            db.table
        ))
        .await
        .unwrap();
    drop(client);
    let seen = Seen::default();
    let mut svc = IdempotencyLayer::builder(db.store.clone())
        .build()
        .unwrap()
        .layer(handler(seen.clone(), 201));
    let got = send(&mut svc, post(Some("k-narrow"), "o-1")).await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST);
    assert_eq!(got.code(), Some("IDEMPOTENCY_REQUEST_REJECTED"));
    assert!(!got.headers.contains_key(http::header::RETRY_AFTER));
    assert_eq!(seen.calls(), 0, "the handler did not run");
    db.drop_tables().await;
}

#[tokio::test]
async fn pg_scenarios_422_400_413_tenants_stored_replay() {
    let db = store("pg_scenarios_422_400_413_tenants_stored_replay").await;
    scenarios::all(db.store.clone()).await;
    db.drop_tables().await;
}

/// A one-second lease on the database's clock: the second acquire after it takes over with fence
/// 2; the first owner's moves are refused; the layer then replays the new owner's result.
#[tokio::test]
async fn pg_lease_expiry_takeover_and_stale_completion_refused() {
    let db = store("pg_lease_expiry_takeover_and_stale_completion_refused").await;
    super::leases::a_lease_passes_and_the_stale_owner_is_refused(
        db.store.clone(),
        Duration::from_secs(1),
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

#[tokio::test]
async fn pg_a_takeover_is_told_from_a_release() {
    let db = store("pg_a_takeover_is_told_from_a_release").await;
    super::events::a_takeover_is_told_from_a_release(
        db.store.clone(),
        Duration::from_millis(400),
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

/// The owner renews its lease by the database's clock; once another request took over, the old
/// owner's renewal is refused. Two leases of 300 ms pass: about 0.8 s.
#[tokio::test]
async fn pg_renewal_extends_the_owners_lease_only() {
    let db = store("pg_renewal_extends_the_owners_lease_only").await;
    super::leases::renewal_extends_the_owners_lease_only(
        db.store.clone(),
        Duration::from_millis(300),
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

/// A handler that writes an order and completes the record in the same transaction, commits,
/// and then crashes (its future is dropped before it answers). The retry with the same key gets
/// the stored response: one order. A crash before the commit rolls back both; after the lease,
/// the retry runs and makes the one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_crash_after_commit_with_in_transaction_completion_makes_one_order() {
    let db = store("pg_crash_after_commit_with_in_transaction_completion_makes_one_order").await;
    {
        let client = db.store.pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "CREATE TABLE {} (id bigserial PRIMARY KEY, key text NOT NULL)",
                db.orders
            ))
            .await
            .unwrap();
    }
    let seen = Seen::default();
    let committed = Arc::new(Notify::new());
    let (counted, store, orders, signal) = (
        seen.clone(),
        db.store.clone(),
        db.orders.clone(),
        committed.clone(),
    );
    // Call 1: write, complete in the transaction, commit, crash. Call 2: write, complete, crash
    // before the commit (rolled back). Call 3: the normal path.
    let app = service_fn(move |req: Req| {
        let (n, _) = counted.hit(&req);
        let (store, orders, signal) = (store.clone(), orders.clone(), signal.clone());
        async move {
            let ticket = req.extensions().get::<Ticket>().cloned().unwrap();
            let mut client = store.pool().get().await.unwrap();
            let txn = client.transaction().await.unwrap();
            txn.execute(
                &format!("INSERT INTO {orders} (key) VALUES ($1)"),
                &[&ticket.record_key().key().as_str()],
            )
            .await
            .unwrap();
            let res = reply(201, format!("order by call {n}"));
            let stored = StoredResponse::new(
                res.status(),
                res.headers(),
                bytes::Bytes::from(format!("order by call {n}")),
            );
            store.complete_in(&txn, &ticket, &stored).await.unwrap();
            if n == 2 {
                txn.rollback().await.unwrap();
                signal.notify_one();
                std::future::pending::<()>().await;
                unreachable!();
            }
            txn.commit().await.unwrap();
            if n == 1 {
                signal.notify_one();
                std::future::pending::<()>().await;
            }
            Ok::<_, Infallible>(res)
        }
    });
    let layer = IdempotencyLayer::builder(db.store.clone())
        .lease(Duration::from_secs(1))
        .build()
        .unwrap();

    // Crash after the commit.
    let mut a = layer.layer(app.clone());
    let crashed = tokio::spawn(async move { send(&mut a, post(Some("k-after"), "o")).await });
    tokio::time::timeout(Duration::from_secs(10), committed.notified())
        .await
        .unwrap();
    crashed.abort();
    let _ = crashed.await;
    let mut b = layer.layer(app.clone());
    let retry = send(&mut b, post(Some("k-after"), "o")).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(retry.body, "order by call 1");
    assert_eq!(db.order_rows().await, 1);
    assert_eq!(seen.calls(), 1);

    // Crash before the commit: nothing of it stays.
    let mut c = layer.layer(app.clone());
    let crashed = tokio::spawn(async move { send(&mut c, post(Some("k-before"), "o")).await });
    tokio::time::timeout(Duration::from_secs(10), committed.notified())
        .await
        .unwrap();
    crashed.abort();
    let _ = crashed.await;
    assert_eq!(db.order_rows().await, 1);
    let retry = send(&mut b, post(Some("k-before"), "o")).await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let retry = send(&mut b, post(Some("k-before"), "o")).await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed());
    assert_eq!(retry.body, "order by call 3");
    assert_eq!(db.order_rows().await, 2, "one order per key");
    assert_eq!(seen.fences(), vec![Some(1), Some(1), Some(2)]);
    db.drop_tables().await;
}

/// After retention the key gets the explicit error, until swept.
#[tokio::test]
async fn pg_expired_key_is_an_explicit_error() {
    let db = store("pg_expired_key_is_an_explicit_error").await;
    super::leases::an_expired_key_is_an_explicit_error_until_swept(
        db.store.clone(),
        Duration::from_millis(300),
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

#[tokio::test]
async fn pg_the_sweeper_never_deletes_a_processing_record() {
    let db = store("pg_the_sweeper_never_deletes_a_processing_record").await;
    super::sweeper_spares_processing(db.store.clone(), tokio::time::sleep).await;
    db.drop_tables().await;
}

#[test]
fn pg_table_names_are_checked() {
    let store = PostgresStore::connect("postgres://nobody@127.0.0.1:1/none").unwrap();
    for bad in [
        "",
        "Orders",
        "a;drop table x",
        "1abc",
        "a.b.c",
        &"x".repeat(51),
    ] {
        let err = store.clone().with_table(bad).unwrap_err();
        assert_eq!(err.setting(), "idempotency table name", "{bad}");
    }
    assert_eq!(
        store.with_table("app.idempotency").unwrap().table(),
        "app.idempotency"
    );
}

/// A real lease of a second on the database's clock: about 1.5 s.
#[tokio::test]
async fn pg_checkpoints_and_unknowns_in_the_store() {
    let db = store("pg_checkpoints_and_unknowns_in_the_store").await;
    super::takeover::checkpoints_and_unknowns_in_the_store(
        db.store.clone(),
        Duration::from_millis(400),
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

/// Instance A's runtime shut down after the charge; B's hook finds it. A real one-second lease:
/// about 1.5 s.
#[test]
fn pg_the_hook_finds_the_charge_and_the_answer_is_replayed() {
    takeover_on_postgres(
        "pg_the_hook_finds_the_charge_and_the_answer_is_replayed",
        super::takeover::Death::AfterCharge,
        true,
    );
}

/// The same without a hook: unknown, settled, replayed.
#[test]
fn pg_without_a_hook_the_record_is_unknown_then_settled_and_replayed() {
    takeover_on_postgres(
        "pg_without_a_hook_the_record_is_unknown_then_settled_and_replayed",
        super::takeover::Death::AfterCharge,
        false,
    );
}

fn takeover_on_postgres(test: &str, death: super::takeover::Death, with_hook: bool) {
    let setup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = setup.block_on(store(test));
    let url = url();
    super::takeover::an_owner_dies_after_its_checkpoint(
        || {
            PostgresStore::connect(&url)
                .unwrap()
                .with_table(&db.table)
                .unwrap()
        },
        Duration::from_secs(1),
        false,
        death,
        with_hook,
    );
    setup.block_on(db.drop_tables());
}

#[tokio::test]
async fn pg_what_is_stored() {
    let db = store("pg_what_is_stored").await;
    super::stored::what_is_stored(db.store.clone()).await;
    // The sealed body, as the table holds it: not the secret.
    let client = db.store.pool().get().await.unwrap();
    let row = client
        .query_one(
            &format!(
                "SELECT body, body_flags FROM {} WHERE key = 'k-sealed'",
                db.table
            ),
            &[],
        )
        .await
        .unwrap();
    let body: Vec<u8> = row.get(0);
    let flags: i16 = row.get(1);
    assert!(!body.is_empty());
    assert!(
        !String::from_utf8_lossy(&body).contains("4242"),
        "the secret is not in the table"
    );
    assert_eq!(flags, 3, "compressed, then sealed");
    let row = client
        .query_one(
            &format!(
                "SELECT resource, result_code, length(body) FROM {} WHERE key = 'k-ref'",
                db.table
            ),
            &[],
        )
        .await
        .unwrap();
    let (resource, code, len): (String, String, i32) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        (resource.as_str(), code.as_str(), len),
        ("payments/p-1", "charged", 0)
    );
    drop(client);
    db.drop_tables().await;
}

/// A real retention of half a second: about 1 s.
#[tokio::test]
async fn pg_the_archive_sees_records_before_the_sweep() {
    let db = store("pg_the_archive_sees_records_before_the_sweep").await;
    super::stored::the_archive_sees_records_before_the_sweep(
        db.store.clone(),
        Duration::from_millis(500),
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

/// The PostgreSQL store, counting the completions the layer asks of it.
#[derive(Clone)]
struct CountingCompletions {
    inner: PostgresStore,
    completions: Arc<std::sync::atomic::AtomicUsize>,
}

impl IdempotencyStore for CountingCompletions {
    fn acquire(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> impl std::future::Future<Output = Result<Acquire, StoreError>> + Send {
        self.inner.acquire(key, digest, lease)
    }

    fn complete(
        &self,
        key: &RecordKey,
        fence: Fence,
        response: &StoredResponse,
        retention: Duration,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        self.completions
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.complete(key, fence, response, retention)
    }

    fn release(
        &self,
        key: &RecordKey,
        fence: Fence,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        self.inner.release(key, fence)
    }

    fn renew(
        &self,
        key: &RecordKey,
        fence: Fence,
        lease: Duration,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        self.inner.renew(key, fence, lease)
    }

    fn sweep(
        &self,
        keep: Duration,
    ) -> impl std::future::Future<Output = Result<u64, StoreError>> + Send {
        self.inner.sweep(keep)
    }

    fn stuck(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> impl std::future::Future<Output = Result<Vec<StuckRecord>, StoreError>> + Send {
        self.inner.stuck(older_than, limit)
    }

    fn checkpoint(
        &self,
        key: &RecordKey,
        fence: Fence,
        checkpoint: &Checkpoint,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        self.inner.checkpoint(key, fence, checkpoint)
    }

    fn mark_unknown(
        &self,
        key: &RecordKey,
        fence: Fence,
        evidence: &str,
    ) -> impl std::future::Future<Output = Result<(), StoreError>> + Send {
        self.inner.mark_unknown(key, fence, evidence)
    }

    fn unknowns(
        &self,
        limit: usize,
    ) -> impl std::future::Future<Output = Result<Vec<UnknownRecord>, StoreError>> + Send {
        self.inner.unknowns(limit)
    }

    fn expired(
        &self,
        keep: Duration,
        limit: usize,
    ) -> impl std::future::Future<Output = Result<Vec<ExpiredRecord>, StoreError>> + Send {
        self.inner.expired(keep, limit)
    }

    fn forget(
        &self,
        records: &[ExpiredRecord],
    ) -> impl std::future::Future<Output = Result<u64, StoreError>> + Send {
        self.inner.forget(records)
    }
}

/// A handler that completes its record in its transaction with the answer it returns: the
/// layer does not complete it again. One that stores another answer than it returns: the
/// layer does (refused as stale), and the stored one is what duplicates get. A replay locks
/// nothing: the row's `xmax` stays 0.
#[tokio::test]
async fn pg_the_handlers_completion_is_the_only_one_and_a_replay_writes_nothing() {
    let db = store("pg_the_handlers_completion_is_the_only_one").await;
    let counting = CountingCompletions {
        inner: db.store.clone(),
        completions: Arc::default(),
    };
    let pg = db.store.clone();
    let app = service_fn(move |req: Req| {
        let pg = pg.clone();
        async move {
            let ticket = req.extensions().get::<Ticket>().cloned().unwrap();
            let restated = req.headers().contains_key("x-restate-otherwise");
            let mut client = pg.pool().get().await.unwrap();
            let txn = client.transaction().await.unwrap();
            let stored = if restated { "stored" } else { "returned" };
            let stored = StoredResponse::new(
                StatusCode::CREATED,
                &http::HeaderMap::new(),
                bytes::Bytes::from(stored),
            );
            let step = Checkpoint::new("order", "o-1").unwrap();
            if restated {
                // tokio-postgres's own transaction: the statements go typed, unprepared.
                let plain: &tokio_postgres::Transaction<'_> = &txn;
                pg.checkpoint_in(plain, &ticket, &step).await.unwrap();
                pg.complete_in(plain, &ticket, &stored).await.unwrap();
            } else {
                pg.checkpoint_in(&txn, &ticket, &step).await.unwrap();
                pg.complete_in(&txn, &ticket, &stored).await.unwrap();
            }
            txn.commit().await.unwrap();
            Ok::<_, Infallible>(reply(201, "returned"))
        }
    });
    let mut svc = IdempotencyLayer::new(counting.clone()).layer(app);
    let completions = || {
        counting
            .completions
            .load(std::sync::atomic::Ordering::SeqCst)
    };

    let got = send(&mut svc, post(Some("k-same"), "o")).await;
    assert_eq!(
        (got.status, got.body.as_ref()),
        (StatusCode::CREATED, &b"returned"[..])
    );
    assert_eq!(
        completions(),
        0,
        "completed once, in the handler's transaction"
    );
    for _ in 0..5 {
        let got = send(&mut svc, post(Some("k-same"), "o")).await;
        assert!(got.replayed());
        assert_eq!(got.body, "returned");
    }
    let client = db.store.pool().get().await.unwrap();
    let xmax: i64 = client
        .query_one(
            &format!(
                "SELECT xmax::text::bigint FROM {} WHERE key = 'k-same'",
                db.table
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(xmax, 0, "no replay locked the row");
    let steps: Vec<String> = client
        .query_one(
            &format!(
                "SELECT checkpoint_names FROM {} WHERE key = 'k-same'",
                db.table
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(steps, ["order"], "recorded in the handler's transaction");

    let mut restating = post(Some("k-other"), "o");
    restating
        .headers_mut()
        .insert("x-restate-otherwise", "1".parse().unwrap());
    let got = send(&mut svc, restating).await;
    assert_eq!(got.body, "returned");
    assert_eq!(completions(), 1, "the layer tried, and was refused");
    let got = send(&mut svc, post(Some("k-other"), "o")).await;
    assert!(got.replayed());
    assert_eq!(got.body, "stored", "the stored answer is the one replayed");
    let steps: Vec<String> = client
        .query_one(
            &format!(
                "SELECT checkpoint_names FROM {} WHERE key = 'k-other'",
                db.table
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(steps, ["order"]);
    drop(client);
    db.drop_tables().await;
}

/// Any lease, renewal, retention, sweep age and stuck threshold, up to `Duration::MAX`: the store
/// counts one past `MAX_DURATION` as ten years, so that no interval or timestamp leaves the
/// database's range, and answers each call (before, `Duration::MAX` was an error from the
/// database).
#[test]
fn pg_any_durations_are_answered() {
    use proptest::test_runner::{Config, TestRunner};

    use crate::durations::{duration, store_any_durations};

    let rt = tokio::runtime::Runtime::new().unwrap();
    let db = rt.block_on(store("pg_any_durations_are_answered"));
    let mut runner = TestRunner::new(Config::with_cases(16));
    let strategy = (duration(), duration(), duration(), duration(), duration());
    let result = runner.run(&strategy, |(lease, renewal, retention, keep, older)| {
        rt.block_on(store_any_durations(
            &db.store, lease, renewal, retention, keep, older,
        ))
    });
    rt.block_on(db.drop_tables());
    result.unwrap();
}

/// The lease of the abandoned-record tests, on the database's clock.
const ABANDONED_LEASE: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_abandoned_records_without_a_hook_are_released_or_unknown() {
    let db = store("pg_abandoned_records_without_a_hook_are_released_or_unknown").await;
    super::abandoned::without_a_hook(db.store.clone(), ABANDONED_LEASE, tokio::time::sleep).await;
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_abandoned_records_each_verdict_of_the_hook_lands() {
    let db = store("pg_abandoned_records_each_verdict_of_the_hook_lands").await;
    super::abandoned::each_verdict_lands(db.store.clone(), ABANDONED_LEASE, tokio::time::sleep)
        .await;
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_abandoned_records_a_failing_hook_leaves_them_for_the_next_round() {
    let db = store("pg_abandoned_records_a_failing_hook_leaves_them_for_the_next_round").await;
    super::abandoned::a_failing_hook_leaves_the_record(
        db.store.clone(),
        ABANDONED_LEASE,
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_abandoned_records_wait_out_the_grace() {
    let db = store("pg_abandoned_records_wait_out_the_grace").await;
    super::abandoned::a_grace_leaves_the_client_time_to_come_back(
        db.store.clone(),
        ABANDONED_LEASE,
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_abandoned_records_only_they_are_taken() {
    let db = store("pg_abandoned_records_only_they_are_taken").await;
    super::abandoned::only_abandoned_records_are_taken(
        db.store.clone(),
        ABANDONED_LEASE,
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

/// Four instances (four pools) over one table: `FOR UPDATE SKIP LOCKED` shares the records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_abandoned_records_concurrent_rounds_take_each_once() {
    let db = store("pg_abandoned_records_concurrent_rounds_take_each_once").await;
    let mut stores = vec![db.store.clone()];
    for _ in 0..3 {
        stores.push(
            PostgresStore::connect(&url())
                .unwrap()
                .with_table(&db.table)
                .unwrap(),
        );
    }
    super::abandoned::concurrent_rounds_take_each_record_once(
        stores,
        ABANDONED_LEASE,
        tokio::time::sleep,
    )
    .await;
    db.drop_tables().await;
}

/// The migration adds an index on the lease's end, and the round's statement reads through
/// it.
#[tokio::test]
async fn pg_abandoned_records_are_found_through_the_lease_index() {
    let db = store("pg_abandoned_records_are_found_through_the_lease_index").await;
    let client = db.store.pool().get().await.unwrap();
    let bare = db.table.rsplit('.').next().unwrap();
    let index: String = client
        .query_one(
            "SELECT indexdef FROM pg_indexes WHERE indexname = $1",
            &[&format!("{bare}_lease")],
        )
        .await
        .unwrap()
        .get(0);
    assert!(index.contains("(lease_until)"), "{index}");
    assert!(index.contains("WHERE (state = 0)"), "{index}");
    // With sequential scans priced out, the planner picks it for the round's search.
    client
        .batch_execute("SET enable_seqscan = off")
        .await
        .unwrap();
    let plan: Vec<String> = client
        .query(
            &format!(
                "EXPLAIN SELECT tenant FROM {} WHERE state = 0 AND lease_until <= now()
                 ORDER BY lease_until LIMIT 10 FOR UPDATE SKIP LOCKED",
                db.table
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        plan.iter().any(|l| l.contains(&format!("{bare}_lease"))),
        "{plan:#?}"
    );
    drop(client);
    db.drop_tables().await;
}
