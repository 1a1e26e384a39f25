//! Keys claimed in the handler's transaction (`IdempotencyLayerBuilder::in_transaction`), on the
//! PostgreSQL server the other store tests use (see `postgres.rs`): the record commits with the
//! handler's writes or not at all; a duplicate in flight is refused; a failed, cancelled or
//! silent handler leaves nothing behind; a commit refused or cut off is told apart.
//!
//! Leases here are short and real (the database's idle bound), every wait is bounded.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::StatusCode;
use surely::server::idempotency::{ErrorCode, IdempotencyLayer, Recovery, Ticket};
use surely::server::store::{KeyedTransaction, PostgresStore};
use tower::{service_fn, Layer};

use super::support::{post, reply, send, Got, Req, Res, Seen};
use crate::support::names::suffix;
use crate::support::postgres::{did_not_answer, forget, url};

/// A migrated store in a fresh table, and an orders table beside it (shared with
/// `axum_answer.rs`).
pub(super) struct Db {
    pub(super) store: PostgresStore,
    table: String,
    pub(super) orders: String,
}

impl Db {
    /// The tables, the orders' with the columns `orders_ddl`.
    pub(super) async fn new(test: &str, orders_ddl: &str) -> Db {
        let suffix = suffix();
        let table = format!("surely_idem_tx{suffix}");
        let orders = format!("surely_orders_tx{suffix}");
        let store = PostgresStore::connect(&url())
            .unwrap()
            .with_table(&table)
            .unwrap();
        store
            .migrate()
            .await
            .unwrap_or_else(|e| did_not_answer(test, e));
        let client = store.pool().get().await.unwrap();
        client
            .batch_execute(&format!("CREATE TABLE {orders} ({orders_ddl})"))
            .await
            .unwrap();
        Db {
            store,
            table,
            orders,
        }
    }

    /// How many orders were written.
    pub(super) async fn orders(&self) -> i64 {
        let client = self.store.pool().get().await.unwrap();
        client
            .query_one(&format!("SELECT count(*) FROM {}", self.orders), &[])
            .await
            .unwrap()
            .get(0)
    }

    /// The records' state and fence, by key.
    async fn records(&self) -> Vec<(String, i16, i64)> {
        let client = self.store.pool().get().await.unwrap();
        client
            .query(
                &format!("SELECT key, state, fence FROM {} ORDER BY key", self.table),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    pub(super) async fn drop_tables(self) {
        forget(
            self.store.pool(),
            &[&self.table, &self.orders],
            &[&self.table],
        )
        .await;
    }
}

const ORDERS: &str = "id bigserial PRIMARY KEY, key text NOT NULL, call int NOT NULL";

/// What the handler does after inserting its order.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Then {
    /// Answers 201.
    Created,
    /// Answers with this status.
    Status(u16),
    /// Fails (the service's error).
    Fail,
    /// Waits for ever, its transaction idle.
    Hang,
    /// Waits this long, then answers 201.
    Slow(Duration),
    /// Answers 201, and has its connection terminated a quarter second later (while a slow
    /// deferred trigger holds the commit).
    LoseConnectionInCommit,
    /// Has its connection terminated before answering 201.
    LoseConnection,
}

/// A handler that inserts one order in the layer's transaction, then does `then(call)`.
fn app(
    db: &Db,
    seen: Seen,
    then: impl Fn(usize) -> Then + Send + Sync + 'static,
) -> impl tower::Service<Req, Response = Res, Error = std::io::Error, Future: Send>
       + Clone
       + Send
       + 'static {
    let (orders, admin) = (db.orders.clone(), db.store.pool().clone());
    let then = Arc::new(then);
    service_fn(move |req: Req| {
        let (n, _) = seen.hit(&req);
        let (orders, admin, then) = (orders.clone(), admin.clone(), then.clone());
        async move {
            let ticket = req.extensions().get::<Ticket>().cloned().unwrap();
            let txn = req.extensions().get::<KeyedTransaction>().cloned().unwrap();
            let pid: i32 = {
                let client = txn.client().await.unwrap();
                let insert = client
                    .prepare_cached(&format!("INSERT INTO {orders} (key, call) VALUES ($1, $2)"))
                    .await
                    .unwrap();
                client
                    .execute(&insert, &[&ticket.record_key().key().as_str(), &(n as i32)])
                    .await
                    .map_err(std::io::Error::other)?;
                client
                    .query_one("SELECT pg_backend_pid()", &[])
                    .await
                    .unwrap()
                    .get(0)
            };
            match then(n) {
                Then::Created => Ok(reply(201, format!("order by call {n}"))),
                Then::Status(s) => Ok(reply(s, format!("status {s} by call {n}"))),
                Then::Fail => Err(std::io::Error::other("the handler failed")),
                Then::Hang => std::future::pending().await,
                Then::Slow(d) => {
                    tokio::time::sleep(d).await;
                    Ok(reply(201, format!("order by call {n}")))
                }
                Then::LoseConnectionInCommit => {
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        let other = admin.get().await.unwrap();
                        other
                            .execute("SELECT pg_terminate_backend($1)", &[&pid])
                            .await
                            .unwrap();
                    });
                    Ok(reply(201, format!("order by call {n}")))
                }
                Then::LoseConnection => {
                    let other = admin.get().await.unwrap();
                    other
                        .execute("SELECT pg_terminate_backend($1)", &[&pid])
                        .await
                        .unwrap();
                    Ok(reply(201, format!("order by call {n}")))
                }
            }
        }
    })
}

/// Sends `req` through a handler whose error is an I/O error, which becomes a 500 here.
async fn call<S>(svc: &mut S, req: Req) -> Got
where
    S: tower::Service<Req, Response = Res, Error = std::io::Error>,
{
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let res = match svc.ready().await {
        Ok(svc) => svc.call(req).await,
        Err(e) => Err(e),
    }
    .unwrap_or_else(|_| reply(500, "handler error"));
    let (head, body) = res.into_parts();
    Got {
        status: head.status,
        headers: head.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// Sends `req` through a service that never fails.
#[cfg(feature = "durable")]
async fn call_infallible<S>(svc: &mut S, req: Req) -> Got
where
    S: tower::Service<Req, Response = Res, Error = Infallible>,
{
    send(svc, req).await
}

/// Waits until the handler has been called once (at most 10 s).
async fn until_called(seen: &Seen) {
    let started = Instant::now();
    while seen.calls() == 0 {
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends the key `k` again until it is no longer in flight, at most until `limit` after
/// `started`; the first other answer.
async fn until_free<S>(svc: &mut S, started: Instant, limit: Duration) -> Got
where
    S: tower::Service<Req, Response = Res, Error = std::io::Error>,
{
    loop {
        let got = call(svc, post(Some("k"), "o")).await;
        if got.status != StatusCode::CONFLICT {
            return got;
        }
        assert!(started.elapsed() < limit, "still in flight");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn layer(db: &Db) -> IdempotencyLayer<PostgresStore> {
    IdempotencyLayer::builder(db.store.clone())
        .in_transaction()
        .lease(Duration::from_secs(1))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_the_record_commits_with_the_handlers_write_and_replays() {
    let db = Db::new(
        "tx_the_record_commits_with_the_handlers_write_and_replays",
        ORDERS,
    )
    .await;
    let seen = Seen::default();
    let mut svc = layer(&db).layer(app(&db, seen.clone(), |_| Then::Created));

    let first = call(&mut svc, post(Some("k1"), "o")).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed());
    assert_eq!(first.body, "order by call 1");
    let again = call(&mut svc, post(Some("k1"), "o")).await;
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    assert_eq!(again.body, "order by call 1");
    // Another body with the key: refused, the handler not run.
    let other = call(&mut svc, post(Some("k1"), "another")).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(seen.calls(), 1);
    assert_eq!(db.orders().await, 1);
    assert_eq!(db.records().await, vec![("k1".to_owned(), 1, 1)]);
    // The handler saw the fence the record committed with.
    assert_eq!(seen.fences(), vec![Some(1)]);
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_32_concurrent_requests_with_one_key_write_once() {
    let db = Db::new("tx_32_concurrent_requests_with_one_key_write_once", ORDERS).await;
    let seen = Seen::default();
    // The lease here is the idle bound of the owner's transaction: long, so that a machine
    // busy enough to leave the owner's task unpolled for a second (a CI run with builds beside
    // it) does not end the transaction this test is not about.
    let svc = IdempotencyLayer::builder(db.store.clone())
        .in_transaction()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap()
        .layer(app(&db, seen.clone(), |_| {
            Then::Slow(Duration::from_millis(50))
        }));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let mut svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            call(&mut svc, post(Some("same"), "o")).await
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    // Every answer is told in a failure's message, so that a run that fails says what it saw.
    let statuses: Vec<u16> = answers.iter().map(|got| got.status.as_u16()).collect();
    for got in &answers {
        match got.status.as_u16() {
            201 => {}
            409 => assert!(got.headers.contains_key("retry-after"), "{got:?}"),
            other => panic!("unexpected {other}: {got:?}; all: {statuses:?}"),
        }
    }
    assert!(statuses.contains(&201), "{statuses:?}");
    assert_eq!(seen.calls(), 1, "one handler ran; answers: {statuses:?}");
    assert_eq!(db.orders().await, 1);
    // Each retry now replays.
    let mut svc = svc.clone();
    let retry = call(&mut svc, post(Some("same"), "o")).await;
    assert!(retry.replayed(), "{retry:?}");
    assert_eq!(seen.calls(), 1);
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_a_failed_handler_leaves_nothing_and_frees_its_key() {
    let db = Db::new(
        "tx_a_failed_handler_leaves_nothing_and_frees_its_key",
        ORDERS,
    )
    .await;
    let seen = Seen::default();
    // Calls 1 to 3 fail three ways; call 4 succeeds. A 5xx is not stored in this mode, though
    // the layer stores server errors by default.
    let svc = IdempotencyLayer::builder(db.store.clone())
        .in_transaction()
        .build()
        .unwrap()
        .layer(app(&db, seen.clone(), |n| match n {
            1 => Then::Fail,
            2 => Then::Status(500),
            3 => Then::Status(503),
            _ => Then::Created,
        }));
    let mut svc = svc;
    for (n, status) in [(1, 500), (2, 500), (3, 503)] {
        let got = call(&mut svc, post(Some("k"), "o")).await;
        assert_eq!(got.status, status, "call {n}: {got:?}");
        assert_eq!(db.orders().await, 0, "call {n} rolled back");
        assert!(db.records().await.is_empty(), "call {n} left no record");
    }
    let got = call(&mut svc, post(Some("k"), "o")).await;
    assert_eq!(got.status, 201);
    assert_eq!(got.body, "order by call 4");
    assert_eq!(db.orders().await, 1);
    assert_eq!(seen.calls(), 4);
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_a_silent_handler_loses_its_transaction_after_the_lease() {
    let db = Db::new(
        "tx_a_silent_handler_loses_its_transaction_after_the_lease",
        ORDERS,
    )
    .await;
    let seen = Seen::default();
    let svc = layer(&db).layer(app(&db, seen.clone(), |n| {
        if n == 1 {
            Then::Hang
        } else {
            Then::Created
        }
    }));
    // The first request hangs with its write uncommitted; its caller gives up (the work goes on
    // on a task of its own, for ever).
    let mut first = svc.clone();
    let hung = tokio::spawn(async move { call(&mut first, post(Some("k"), "o")).await });
    let started = Instant::now();
    until_called(&seen).await;
    let mut svc2 = svc.clone();
    let busy = call(&mut svc2, post(Some("k"), "o")).await;
    assert_eq!(busy.status, StatusCode::CONFLICT, "{busy:?}");
    hung.abort();
    // A second past the lease, the server ends the idle transaction: the write is gone and the
    // key is free.
    let got = until_free(&mut svc2, started, Duration::from_secs(15)).await;
    assert_eq!(got.status, 201, "{got:?}");
    assert_eq!(got.body, "order by call 2");
    assert_eq!(
        db.orders().await,
        1,
        "the silent handler's write rolled back"
    );
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_a_handler_cancelled_with_its_caller_rolls_back_at_once() {
    let db = Db::new(
        "tx_a_handler_cancelled_with_its_caller_rolls_back_at_once",
        ORDERS,
    )
    .await;
    let seen = Seen::default();
    let svc = IdempotencyLayer::builder(db.store.clone())
        .in_transaction()
        .lease(Duration::from_secs(60))
        .cancel_with_caller()
        .build()
        .unwrap()
        .layer(app(&db, seen.clone(), |n| {
            if n == 1 {
                Then::Hang
            } else {
                Then::Created
            }
        }));
    let mut first = svc.clone();
    let hung = tokio::spawn(async move { call(&mut first, post(Some("k"), "o")).await });
    let started = Instant::now();
    until_called(&seen).await;
    hung.abort();
    let _ = hung.await;
    // The connection is closed; the server rolls back as soon as it sees it (well before the
    // 60 s lease).
    let mut svc2 = svc.clone();
    let got = until_free(&mut svc2, started, Duration::from_secs(10)).await;
    assert_eq!(got.status, 201, "{got:?}");
    assert_eq!(db.orders().await, 1);
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_a_commit_refused_is_not_processed_and_nothing_stays() {
    // A deferred unique constraint: the second order with one business id passes its insert and
    // fails at the commit.
    let db = Db::new(
        "tx_a_commit_refused_is_not_processed_and_nothing_stays",
        "id bigserial PRIMARY KEY, key text NOT NULL, call int NOT NULL,
         biz text GENERATED ALWAYS AS ('same') STORED,
         CONSTRAINT one_biz UNIQUE (biz) DEFERRABLE INITIALLY DEFERRED",
    )
    .await;
    let seen = Seen::default();
    let mut svc = layer(&db).layer(app(&db, seen.clone(), |_| Then::Created));
    let first = call(&mut svc, post(Some("a"), "o")).await;
    assert_eq!(first.status, 201);
    let second = call(&mut svc, post(Some("b"), "o")).await;
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE, "{second:?}");
    assert_eq!(second.code(), Some("IDEMPOTENCY_STORE_UNAVAILABLE"));
    assert!(second.headers.contains_key("surely-not-processed"));
    assert_eq!(db.orders().await, 1);
    assert_eq!(db.records().await, vec![("a".to_owned(), 1, 1)]);
    // The key is free: the same request runs again (and is refused again, by the business).
    let again = call(&mut svc, post(Some("b"), "o")).await;
    assert_eq!(again.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(seen.calls(), 3);
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_a_connection_lost_before_the_commit_is_not_processed() {
    let db = Db::new(
        "tx_a_connection_lost_before_the_commit_is_not_processed",
        ORDERS,
    )
    .await;
    let seen = Seen::default();
    let mut svc = layer(&db).layer(app(&db, seen.clone(), |n| {
        if n == 1 {
            Then::LoseConnection
        } else {
            Then::Created
        }
    }));
    // The record's insert meets the terminated session: nothing committed, and the layer says so.
    let first = call(&mut svc, post(Some("k"), "o")).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert_eq!(first.code(), Some("IDEMPOTENCY_STORE_UNAVAILABLE"));
    assert!(first.headers.contains_key("surely-not-processed"));
    let retry = call(&mut svc, post(Some("k"), "o")).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(db.orders().await, 1);
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_a_connection_lost_in_the_commit_is_commit_unknown_and_the_key_settles_it() {
    let db = Db::new(
        "tx_a_connection_lost_in_the_commit_is_commit_unknown_and_the_key_settles_it",
        ORDERS,
    )
    .await;
    // A deferred trigger that holds the first call's commit for two seconds.
    let slow = format!("{}_slow", db.orders);
    {
        let client = db.store.pool().get().await.unwrap();
        client
            .batch_execute(&format!(
                "CREATE FUNCTION {slow}() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN IF NEW.call = 1 THEN PERFORM pg_sleep(2); END IF; RETURN NULL; END $$;
                 CREATE CONSTRAINT TRIGGER {slow} AFTER INSERT ON {orders}
                     DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {slow}();",
                orders = db.orders
            ))
            .await
            .unwrap();
    }
    let seen = Seen::default();
    let mut svc = layer(&db).layer(app(&db, seen.clone(), |n| {
        if n == 1 {
            Then::LoseConnectionInCommit
        } else {
            Then::Created
        }
    }));
    let first = call(&mut svc, post(Some("k"), "o")).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert_eq!(
        first.code(),
        Some(ErrorCode::CommitUnknown.as_str()),
        "{first:?}"
    );
    assert!(!first.headers.contains_key("surely-not-processed"));
    assert!(first.headers.contains_key("retry-after"));
    // The same key settles it: here nothing had committed, so it runs.
    let retry = call(&mut svc, post(Some("k"), "o")).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(!retry.replayed());
    let again = call(&mut svc, post(Some("k"), "o")).await;
    assert!(again.replayed());
    assert_eq!(db.orders().await, 1);
    let client = db.store.pool().get().await.unwrap();
    let orders = db.orders.clone();
    db.drop_tables().await;
    client
        .batch_execute(&format!("DROP FUNCTION IF EXISTS {orders}_slow()"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_a_released_record_of_the_default_mode_is_replaced_with_the_next_fence() {
    let db = Db::new(
        "tx_a_released_record_of_the_default_mode_is_replaced_with_the_next_fence",
        ORDERS,
    )
    .await;
    // The default mode answers 503: the record is released (fence 1).
    let mut plain = IdempotencyLayer::new(db.store.clone()).layer(service_fn(|_req: Req| async {
        Ok::<_, Infallible>(reply(503, "busy"))
    }));
    let got = send(&mut plain, post(Some("k"), "o")).await;
    assert_eq!(got.status, 503);
    assert_eq!(db.records().await, vec![("k".to_owned(), 2, 1)]);
    let seen = Seen::default();
    let mut svc = layer(&db).layer(app(&db, seen.clone(), |_| Then::Created));
    let got = call(&mut svc, post(Some("k"), "o")).await;
    assert_eq!(got.status, 201, "{got:?}");
    assert_eq!(seen.fences(), vec![Some(2)]);
    assert_eq!(db.records().await, vec![("k".to_owned(), 1, 2)]);
    db.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_the_transaction_is_gone_once_the_handler_answered() {
    let db = Db::new(
        "tx_the_transaction_is_gone_once_the_handler_answered",
        ORDERS,
    )
    .await;
    let kept: Arc<Mutex<Option<KeyedTransaction>>> = Arc::default();
    let keep = kept.clone();
    let mut svc = layer(&db).layer(service_fn(move |req: Req| {
        *keep.lock().unwrap() = req.extensions().get::<KeyedTransaction>().cloned();
        async { Ok::<_, Infallible>(reply(201, "ok")) }
    }));
    assert_eq!(send(&mut svc, post(Some("k"), "o")).await.status, 201);
    let txn = kept.lock().unwrap().take().unwrap();
    let err = txn.client().await.unwrap_err();
    assert!(err.is_stale(), "{err}");
    db.drop_tables().await;
}

#[test]
fn tx_a_renewal_or_a_recovery_hook_with_in_transaction_is_refused() {
    let store = PostgresStore::connect(&url()).unwrap();
    let err = IdempotencyLayer::builder(store.clone())
        .in_transaction()
        .renew_for(Duration::from_secs(60))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("in_transaction"), "{err}");
    let err = IdempotencyLayer::builder(store)
        .in_transaction()
        .recover(|_| async { Recovery::Resume })
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("in_transaction"), "{err}");
}

/// The outbox's event, enqueued through the claim's connection, commits with the order and the
/// record, or not at all.
#[cfg(feature = "durable")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_the_outbox_event_commits_with_the_order_or_not_at_all() {
    use surely::outbox::{Event, EventId, PostgresOutbox};

    let db = Db::new(
        "tx_the_outbox_event_commits_with_the_order_or_not_at_all",
        ORDERS,
    )
    .await;
    let events = format!("{}_events", db.orders);
    let outbox = PostgresOutbox::new(db.store.pool().clone())
        .with_table(&events)
        .unwrap();
    outbox.migrate().await.unwrap();
    let (orders, ob) = (db.orders.clone(), outbox.clone());
    let mut svc = layer(&db).layer(service_fn(move |req: Req| {
        let (orders, outbox) = (orders.clone(), ob.clone());
        async move {
            use http_body_util::BodyExt;
            let key = req
                .extensions()
                .get::<Ticket>()
                .unwrap()
                .record_key()
                .key()
                .as_str()
                .to_owned();
            let txn = req.extensions().get::<KeyedTransaction>().cloned().unwrap();
            let client = txn.client().await.unwrap();
            client
                .execute(
                    &format!("INSERT INTO {orders} (key, call) VALUES ($1, 1)"),
                    &[&key],
                )
                .await
                .unwrap();
            let event =
                Event::new(EventId::derive(&key, "created"), &key, 1, "created", "o").unwrap();
            assert!(outbox.enqueue(&client, &event).await.unwrap());
            // The body says whether to fail after both writes.
            let fail = req.body().clone().collect().await.unwrap().to_bytes() == "fail";
            Ok::<_, Infallible>(if fail {
                reply(500, "failed")
            } else {
                reply(201, "ok")
            })
        }
    }));
    let count = |table: String| {
        let pool = db.store.pool().clone();
        async move {
            let client = pool.get().await.unwrap();
            let n: i64 = client
                .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                .await
                .unwrap()
                .get(0);
            n
        }
    };
    let failed = call_infallible(&mut svc, post(Some("k-fail"), "fail")).await;
    assert_eq!(failed.status, 500);
    assert_eq!(count(db.orders.clone()).await, 0);
    assert_eq!(
        count(events.clone()).await,
        0,
        "the event rolled back with the order"
    );
    let ok = call_infallible(&mut svc, post(Some("k-ok"), "o")).await;
    assert_eq!(ok.status, 201);
    assert_eq!(count(db.orders.clone()).await, 1);
    assert_eq!(
        count(events.clone()).await,
        1,
        "the event committed with the order"
    );
    forget(db.store.pool(), &[&events], &[&events]).await;
    db.drop_tables().await;
}
