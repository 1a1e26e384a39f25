//! The PostgreSQL inbox, with a business table beside it: the stock changes once per event,
//! in the same transaction as the record.

use surely::inbox::{Begin, PostgresInbox, Processed, Versions};
use surely::outbox::Event;

use super::stock_event;
use crate::support::names::suffix;
use crate::support::postgres::{self, did_not_answer, pool};

/// An inbox and a stock table of this test's own, with `sku-42` at 100.
pub(super) async fn inbox(test: &str) -> (PostgresInbox, String) {
    let suffix = suffix();
    let inbox = PostgresInbox::new(pool())
        .with_table(&format!("surely_inbox_t{suffix}"))
        .unwrap();
    inbox
        .migrate()
        .await
        .unwrap_or_else(|e| did_not_answer(test, e));
    let stock = format!("surely_stock_t{suffix}");
    inbox
        .pool()
        .get()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE {stock} (sku text PRIMARY KEY, qty bigint NOT NULL);
             INSERT INTO {stock} VALUES ('sku-42', 100);"
        ))
        .await
        .unwrap();
    (inbox, stock)
}

pub(super) async fn forget(inbox: &PostgresInbox, stock: &str) {
    let t = inbox.table();
    postgres::forget(inbox.pool(), &[t, &format!("{t}_versions"), stock], &[t]).await;
}

/// One delivery: reserve one unit, in one transaction with the record; commit (or not).
async fn deliver(
    inbox: &PostgresInbox,
    stock: &str,
    event: &Event,
    versions: Versions,
    commit: bool,
) -> Processed {
    let mut client = inbox.pool().get().await.unwrap();
    let txn = client.transaction().await.unwrap();
    let sql = format!("UPDATE {stock} SET qty = qty - 1 WHERE sku = 'sku-42'");
    let processed = inbox
        .process(&txn, "inventory", event, versions, move |txn| {
            Box::pin(async move {
                txn.execute(&sql, &[]).await?;
                Ok::<_, tokio_postgres::Error>("reserved".into())
            })
        })
        .await
        .unwrap();
    if commit {
        txn.commit().await.unwrap();
    } else {
        txn.rollback().await.unwrap();
    }
    processed
}

async fn qty(inbox: &PostgresInbox, stock: &str) -> i64 {
    inbox
        .pool()
        .get()
        .await
        .unwrap()
        .query_one(
            &format!("SELECT qty FROM {stock} WHERE sku = 'sku-42'"),
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// The consumer commits, then crashes before it acknowledges: the redelivery is a duplicate,
/// and the stock changed once.
#[tokio::test]
async fn pg_a_redelivery_after_commit_changes_nothing() {
    let (inbox, stock) = inbox("pg_a_redelivery_after_commit_changes_nothing").await;
    let e = stock_event("sku-42", 1);
    assert_eq!(
        deliver(&inbox, &stock, &e, Versions::Any, true).await,
        Processed::Applied("reserved".into())
    );
    assert_eq!(
        deliver(&inbox, &stock, &e, Versions::Any, true).await,
        Processed::Duplicate("reserved".into())
    );
    assert_eq!(qty(&inbox, &stock).await, 99);
    assert_eq!(inbox.stats().duplicates, 1);
    forget(&inbox, &stock).await;
}

/// The consumer crashes before it commits: nothing is recorded, and the redelivery applies.
#[tokio::test]
async fn pg_a_rolled_back_delivery_leaves_the_event_to_its_redelivery() {
    let (inbox, stock) =
        inbox("pg_a_rolled_back_delivery_leaves_the_event_to_its_redelivery").await;
    let e = stock_event("sku-42", 1);
    assert!(matches!(
        deliver(&inbox, &stock, &e, Versions::Any, false).await,
        Processed::Applied(_)
    ));
    assert_eq!(qty(&inbox, &stock).await, 100);
    assert!(matches!(
        deliver(&inbox, &stock, &e, Versions::Any, true).await,
        Processed::Applied(_)
    ));
    assert_eq!(qty(&inbox, &stock).await, 99);
    forget(&inbox, &stock).await;
}

#[tokio::test]
async fn pg_versions_in_order_and_latest() {
    let (inbox, stock) = inbox("pg_versions_in_order_and_latest").await;
    let (v7, v8, v9) = (
        stock_event("sku-42", 7),
        stock_event("sku-42", 8),
        stock_event("sku-42", 9),
    );
    assert!(matches!(
        deliver(&inbox, &stock, &v7, Versions::InOrder, true).await,
        Processed::Applied(_)
    ));
    assert_eq!(
        deliver(&inbox, &stock, &v9, Versions::InOrder, true).await,
        Processed::Parked { applied: 7 }
    );
    assert!(matches!(
        deliver(&inbox, &stock, &v8, Versions::InOrder, true).await,
        Processed::Applied(_)
    ));
    assert!(matches!(
        deliver(&inbox, &stock, &v9, Versions::InOrder, true).await,
        Processed::Applied(_)
    ));
    assert!(matches!(
        deliver(&inbox, &stock, &v8, Versions::InOrder, true).await,
        Processed::Duplicate(_)
    ));
    assert_eq!(qty(&inbox, &stock).await, 97, "7, 8 and 9 once each");
    // State-based, on another aggregate: 9 then 8.
    let (s8, s9) = (stock_event("sku-7", 8), stock_event("sku-7", 9));
    assert!(matches!(
        deliver(&inbox, &stock, &s9, Versions::Latest, true).await,
        Processed::Applied(_)
    ));
    assert_eq!(
        deliver(&inbox, &stock, &s8, Versions::Latest, true).await,
        Processed::Stale { applied: 9 }
    );
    assert_eq!(
        deliver(&inbox, &stock, &s8, Versions::Latest, true).await,
        Processed::Duplicate(bytes::Bytes::new())
    );
    forget(&inbox, &stock).await;
}

/// Two deliveries of one event at once: the second waits for the first's transaction, then
/// finds its record. The handler ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_two_deliveries_at_once_apply_once() {
    let (inbox, stock) = inbox("pg_two_deliveries_at_once_apply_once").await;
    let e = stock_event("sku-42", 1);
    let mut first_client = inbox.pool().get().await.unwrap();
    let first = first_client.transaction().await.unwrap();
    let Begin::Fresh(ticket) = inbox
        .begin(&first, "inventory", &e, Versions::Any)
        .await
        .unwrap()
    else {
        panic!("the first delivery is fresh");
    };
    let second = {
        let (inbox, stock, e) = (inbox.clone(), stock.clone(), e.clone());
        tokio::spawn(async move { deliver(&inbox, &stock, &e, Versions::Any, true).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        !second.is_finished(),
        "the second waits for the first's transaction"
    );
    first
        .execute(
            &format!("UPDATE {stock} SET qty = qty - 1 WHERE sku = 'sku-42'"),
            &[],
        )
        .await
        .unwrap();
    inbox.finish(&first, ticket, "first".into()).await.unwrap();
    first.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), Processed::Duplicate("first".into()));
    assert_eq!(qty(&inbox, &stock).await, 99);
    forget(&inbox, &stock).await;
}

/// One delivery through `process_and_commit`, whose handler reserves one unit and answers
/// `result`.
async fn deliver_and_commit(
    inbox: &PostgresInbox,
    stock: &str,
    event: &Event,
    result: &'static str,
) -> Result<Processed, surely::inbox::InboxError<tokio_postgres::Error>> {
    let sql = format!("UPDATE {stock} SET qty = qty - 1 WHERE sku = 'sku-42'");
    inbox
        .process_and_commit("inventory", event, Versions::InOrder, move |txn| {
            Box::pin(async move {
                txn.execute(&sql, &[]).await?;
                Ok(result.into())
            })
        })
        .await
}

/// `process_and_commit` sends the record together with the `COMMIT`. A record the database
/// refuses fails the transaction, and the `COMMIT` behind it rolls back: the call fails, the
/// business write is gone with the transaction, the connection goes back to the pool outside
/// any transaction, and the redelivery applies the event.
#[tokio::test]
async fn pg_a_record_refused_beside_the_commit_rolls_the_delivery_back() {
    let test = "pg_a_record_refused_beside_the_commit_rolls_the_delivery_back";
    let (inbox, stock) = inbox(test).await;
    let client = inbox.pool().get().await.unwrap();
    client
        .batch_execute(&format!(
            "ALTER TABLE {} ADD CONSTRAINT refuse_boom CHECK (result IS DISTINCT FROM 'boom'::bytea)",
            inbox.table()
        ))
        .await
        .unwrap();
    drop(client);
    let e = stock_event("sku-42", 1);
    let err = deliver_and_commit(&inbox, &stock, &e, "boom")
        .await
        .unwrap_err();
    assert!(
        matches!(err, surely::inbox::InboxError::Store(_)),
        "{err:?}"
    );
    assert_eq!(qty(&inbox, &stock).await, 100, "rolled back");
    assert!(outside_any_transaction(&inbox).await);
    assert_eq!(
        deliver_and_commit(&inbox, &stock, &e, "reserved")
            .await
            .unwrap(),
        Processed::Applied("reserved".into())
    );
    assert_eq!(
        deliver_and_commit(&inbox, &stock, &e, "reserved")
            .await
            .unwrap(),
        Processed::Duplicate("reserved".into())
    );
    assert_eq!(qty(&inbox, &stock).await, 99);
    forget(&inbox, &stock).await;
}

/// Whether the pool's next connection is outside any transaction: an aborted one would refuse
/// the query, and in an open one `now()` (when it began) would be older than the query (one
/// message of the simple protocol, which starts a transaction of its own when there is none).
async fn outside_any_transaction(inbox: &PostgresInbox) -> bool {
    let rows = inbox
        .pool()
        .get()
        .await
        .unwrap()
        .simple_query("SELECT now() = statement_timestamp()")
        .await
        .unwrap();
    rows.iter().any(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0) == Some("t"),
        _ => false,
    })
}

/// `process_and_commit` sends its `BEGIN` without waiting for it, and ends a transaction it
/// writes nothing in with a `ROLLBACK` it does not wait for either. On a pool of one
/// connection, every way a delivery ends (applied, a duplicate, a handler that fails, a caller
/// that stops waiting while the handler runs, a stale event) leaves that connection outside
/// any transaction, with its locks freed, for the next delivery.
#[tokio::test]
async fn pg_every_end_of_process_and_commit_frees_its_one_connection() {
    let (inbox, stock) = inbox("pg_every_end_of_process_and_commit_frees_its_one_connection").await;
    inbox.pool().resize(1);
    let (v1, v2) = (stock_event("sku-42", 1), stock_event("sku-42", 2));
    let sql = format!("UPDATE {stock} SET qty = qty - 1 WHERE sku = 'sku-42'");

    let applied = deliver_and_commit(&inbox, &stock, &v1, "r1").await.unwrap();
    assert_eq!(applied, Processed::Applied("r1".into()));
    assert!(
        outside_any_transaction(&inbox).await,
        "after an applied event"
    );

    let again = deliver_and_commit(&inbox, &stock, &v1, "r1").await.unwrap();
    assert_eq!(again, Processed::Duplicate("r1".into()));
    assert!(outside_any_transaction(&inbox).await, "after a duplicate");

    let write = sql.clone();
    let failed = inbox
        .process_and_commit("inventory", &v2, Versions::InOrder, move |txn| {
            Box::pin(async move {
                txn.execute(&write, &[]).await.map_err(|e| e.to_string())?;
                Err::<bytes::Bytes, _>("the handler gives up".to_owned())
            })
        })
        .await;
    assert!(
        matches!(&failed, Err(surely::inbox::InboxError::Handler(e)) if e == "the handler gives up"),
        "{failed:?}"
    );
    assert_eq!(
        qty(&inbox, &stock).await,
        99,
        "the failed handler's write rolled back"
    );
    assert!(
        outside_any_transaction(&inbox).await,
        "after a failed handler"
    );

    // The caller stops waiting once the handler has written, while it still runs.
    let (wrote, written) = tokio::sync::oneshot::channel::<()>();
    let write = sql.clone();
    let delivery = inbox.process_and_commit("inventory", &v2, Versions::InOrder, move |txn| {
        Box::pin(async move {
            txn.execute(&write, &[]).await?;
            let _ = wrote.send(());
            std::future::pending::<()>().await;
            Ok::<_, tokio_postgres::Error>("never".into())
        })
    });
    tokio::select! {
        out = delivery => panic!("the handler never answers, yet the delivery ended: {out:?}"),
        _ = written => {}
    }
    assert_eq!(
        qty(&inbox, &stock).await,
        99,
        "the dropped delivery's write rolled back"
    );
    assert!(
        outside_any_transaction(&inbox).await,
        "after a dropped delivery"
    );

    let applied = deliver_and_commit(&inbox, &stock, &v2, "r2").await.unwrap();
    assert_eq!(
        applied,
        Processed::Applied("r2".into()),
        "its lock was freed"
    );
    assert_eq!(qty(&inbox, &stock).await, 98);

    // v1 again, under another id: older than what the aggregate has, so stale, and recorded.
    let old = Event::new(
        surely::outbox::EventId::derive("sku-42 v1 again", "StockChanged"),
        "sku-42",
        1,
        "StockChanged",
        "1",
    )
    .unwrap();
    let stale = deliver_and_commit(&inbox, &stock, &old, "r").await.unwrap();
    assert_eq!(stale, Processed::Stale { applied: 2 });
    assert!(outside_any_transaction(&inbox).await, "after a stale event");
    // Its record committed: a redelivery finds it (a stale event's result is empty).
    assert_eq!(
        deliver_and_commit(&inbox, &stock, &old, "r").await.unwrap(),
        Processed::Duplicate(bytes::Bytes::new())
    );
    assert_eq!(qty(&inbox, &stock).await, 98);
    forget(&inbox, &stock).await;
}

/// The handler's [`InboxTransaction`](surely::inbox::InboxTransaction) is a transaction the
/// outbox joins: the events a handler enqueues commit with its write and the inbox's record,
/// or not at all.
#[tokio::test]
async fn pg_events_a_handler_enqueues_commit_with_the_event_or_not_at_all() {
    let test = "pg_events_a_handler_enqueues_commit_with_the_event_or_not_at_all";
    let (inbox, stock) = inbox(test).await;
    let outbox = surely::outbox::PostgresOutbox::new(inbox.pool().clone())
        .with_table(&format!("{}_outbox", inbox.table()))
        .unwrap();
    outbox.migrate().await.unwrap();
    let deliver = |event: Event, fail: bool| {
        let (outbox, sql) = (
            outbox.clone(),
            format!("UPDATE {stock} SET qty = qty - 1 WHERE sku = 'sku-42'"),
        );
        let inbox = inbox.clone();
        let follow = Event::new(
            surely::outbox::EventId::derive(event.id().as_str(), "Reserved"),
            "sku-42",
            event.version(),
            "Reserved",
            "1",
        )
        .unwrap();
        async move {
            inbox
                .process_and_commit("inventory", &event, Versions::Any, move |txn| {
                    Box::pin(async move {
                        txn.execute(&sql, &[]).await.map_err(|e| e.to_string())?;
                        outbox
                            .enqueue(txn, &follow)
                            .await
                            .map_err(|e| e.to_string())?;
                        if fail {
                            return Err("failed after both writes".to_owned());
                        }
                        Ok("reserved".into())
                    })
                })
                .await
        }
    };
    let events = |table: String| {
        let pool = inbox.pool().clone();
        async move {
            let n: i64 = pool
                .get()
                .await
                .unwrap()
                .query_one(&format!("SELECT count(*) FROM {table}"), &[])
                .await
                .unwrap()
                .get(0);
            n
        }
    };
    let outbox_table = format!("{}_outbox", inbox.table());
    assert!(deliver(stock_event("sku-42", 1), true).await.is_err());
    assert_eq!(
        events(outbox_table.clone()).await,
        0,
        "rolled back together"
    );
    assert_eq!(qty(&inbox, &stock).await, 100);
    assert_eq!(
        deliver(stock_event("sku-42", 1), false).await.unwrap(),
        Processed::Applied("reserved".into())
    );
    assert_eq!(events(outbox_table.clone()).await, 1, "committed together");
    assert_eq!(qty(&inbox, &stock).await, 99);
    postgres::forget(inbox.pool(), &[&outbox_table], &[&outbox_table]).await;
    forget(&inbox, &stock).await;
}

/// `process_and_commit` in version order: a gap is parked (nothing written), an old version
/// is recorded as stale, and the handler runs once per version.
#[tokio::test]
async fn pg_process_and_commit_parks_gaps_and_records_the_stale() {
    let (inbox, stock) = inbox("pg_process_and_commit_parks_gaps_and_records_the_stale").await;
    let (v1, v2, v3) = (
        stock_event("sku-42", 1),
        stock_event("sku-42", 2),
        stock_event("sku-42", 3),
    );
    let ok = |p: Result<Processed, _>| p.unwrap();
    assert!(matches!(
        ok(deliver_and_commit(&inbox, &stock, &v2, "r").await),
        Processed::Applied(_)
    ));
    assert_eq!(
        ok(deliver_and_commit(&inbox, &stock, &v1, "r").await),
        Processed::Stale { applied: 2 }
    );
    assert_eq!(
        ok(deliver_and_commit(&inbox, &stock, &v1, "r").await),
        Processed::Duplicate(bytes::Bytes::new())
    );
    let v4 = stock_event("sku-42", 4);
    assert_eq!(
        ok(deliver_and_commit(&inbox, &stock, &v4, "r").await),
        Processed::Parked { applied: 2 }
    );
    assert!(matches!(
        ok(deliver_and_commit(&inbox, &stock, &v3, "r").await),
        Processed::Applied(_)
    ));
    assert!(matches!(
        ok(deliver_and_commit(&inbox, &stock, &v4, "r").await),
        Processed::Applied(_)
    ));
    assert_eq!(qty(&inbox, &stock).await, 97, "2, 3 and 4 once each");
    forget(&inbox, &stock).await;
}

/// Sets the records of `inbox` (all, or those of `where_`) back by `secs` on the database's
/// clock: processed that long ago.
async fn age(inbox: &PostgresInbox, secs: i64, where_: &str) {
    let sql = format!(
        "UPDATE {} SET processed_at = processed_at - $1::int8 * interval '1 second' {where_}",
        inbox.table()
    );
    inbox
        .pool()
        .get()
        .await
        .unwrap()
        .execute(&sql, &[&secs])
        .await
        .unwrap();
}

async fn records(inbox: &PostgresInbox) -> i64 {
    let sql = format!("SELECT count(*) FROM {}", inbox.table());
    let client = inbox.pool().get().await.unwrap();
    client.query_one(&sql, &[]).await.unwrap().get(0)
}

const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);

/// The sweep deletes the records and keeps the versions: a redelivery of a versioned event
/// older than the sweep is still stale, and the stock does not change. An event without
/// versions, redelivered after its record was swept, is applied again: what the retention's
/// bound on the redelivery window is for.
#[tokio::test]
async fn pg_after_the_sweep_an_old_versioned_redelivery_is_still_stale() {
    use surely::maintenance::Chore;
    let (inbox, stock) =
        inbox("pg_after_the_sweep_an_old_versioned_redelivery_is_still_stale").await;
    let (v1, v2) = (stock_event("sku-42", 1), stock_event("sku-42", 2));
    for e in [&v1, &v2] {
        assert!(matches!(
            deliver(&inbox, &stock, e, Versions::InOrder, true).await,
            Processed::Applied(_)
        ));
    }
    let unversioned = stock_event("sku-7", 1);
    assert!(matches!(
        deliver(&inbox, &stock, &unversioned, Versions::Any, true).await,
        Processed::Applied(_)
    ));
    assert_eq!(qty(&inbox, &stock).await, 97);
    let sweeper = inbox.sweeper(2 * HOUR, HOUR).unwrap();
    assert_eq!(sweeper.name(), format!("inbox {}", inbox.table()));
    assert_eq!(
        sweeper.run(100).await.unwrap().done,
        0,
        "processed just now"
    );
    age(&inbox, 3 * 3600, "").await;
    let batch = sweeper.run(100).await.unwrap();
    assert_eq!((batch.done, batch.more), (3, false));
    assert_eq!(records(&inbox).await, 0);

    assert_eq!(
        deliver(&inbox, &stock, &v1, Versions::InOrder, true).await,
        Processed::Stale { applied: 2 },
        "the version outlives the record"
    );
    assert_eq!(
        deliver(&inbox, &stock, &v2, Versions::Latest, true).await,
        Processed::Stale { applied: 2 }
    );
    assert_eq!(qty(&inbox, &stock).await, 97, "not applied again");
    assert!(
        matches!(
            deliver(&inbox, &stock, &unversioned, Versions::Any, true).await,
            Processed::Applied(_)
        ),
        "without versions, nothing remembers it"
    );
    assert_eq!(qty(&inbox, &stock).await, 96);
    forget(&inbox, &stock).await;
}

/// At most `limit` per batch, the oldest first, `more` while a batch is full; records younger
/// than the retention stay.
#[tokio::test]
async fn pg_sweep_batches_are_bounded_and_the_oldest_go_first() {
    use surely::maintenance::Chore;
    let (inbox, stock) = inbox("pg_sweep_batches_are_bounded_and_the_oldest_go_first").await;
    for v in 1..=6 {
        let e = stock_event(&format!("sku-{v}"), 1);
        deliver(&inbox, &stock, &e, Versions::Any, true).await;
    }
    // sku-1 processed 9 hours ago, sku-2 8, ... sku-5 5; sku-6 now.
    let sql = format!(
        "UPDATE {} SET processed_at = processed_at - (10 - substr(aggregate, 5)::int) * interval '1 hour'
         WHERE aggregate <> 'sku-6'",
        inbox.table()
    );
    inbox
        .pool()
        .get()
        .await
        .unwrap()
        .execute(&sql, &[])
        .await
        .unwrap();
    let sweeper = inbox.sweeper(2 * HOUR, HOUR).unwrap();
    let batch = sweeper.run(2).await.unwrap();
    assert_eq!((batch.done, batch.more), (2, true));
    let left: Vec<String> = inbox
        .pool()
        .get()
        .await
        .unwrap()
        .query(
            &format!("SELECT aggregate FROM {} ORDER BY aggregate", inbox.table()),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        left,
        ["sku-3", "sku-4", "sku-5", "sku-6"],
        "the oldest first"
    );
    let batch = sweeper.run(2).await.unwrap();
    assert_eq!((batch.done, batch.more), (2, true));
    let batch = sweeper.run(2).await.unwrap();
    assert_eq!((batch.done, batch.more), (1, false));
    assert_eq!(records(&inbox).await, 1, "the recent one stays");
    forget(&inbox, &stock).await;
}

/// Two instances' batches at once delete disjoint records, all of them between them, without
/// an error; a batch skips the records another holds locked, without waiting for them.
#[tokio::test]
async fn pg_two_sweeps_at_once_delete_disjoint_records() {
    use surely::maintenance::Chore;
    let (inbox, stock) = inbox("pg_two_sweeps_at_once_delete_disjoint_records").await;
    for v in 1..=40 {
        let e = stock_event(&format!("sku-{v}"), 1);
        deliver(&inbox, &stock, &e, Versions::Any, true).await;
    }
    age(&inbox, 3 * 3600, "").await;
    // Another instance's batch holds three records, its transaction open.
    let mut other = inbox.pool().get().await.unwrap();
    let txn = other.transaction().await.unwrap();
    txn.execute(
        &format!(
            "SELECT 1 FROM {} WHERE aggregate IN ('sku-1', 'sku-2', 'sku-3') FOR UPDATE",
            inbox.table()
        ),
        &[],
    )
    .await
    .unwrap();
    let (a, b) = (
        inbox.sweeper(2 * HOUR, HOUR).unwrap(),
        inbox.sweeper(2 * HOUR, HOUR).unwrap(),
    );
    let (x, y) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        tokio::join!(a.run(20), b.run(20))
    })
    .await
    .expect("no batch waits for the held records");
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x.done + y.done, 37, "disjoint, and every record not held");
    txn.rollback().await.unwrap();
    assert_eq!(records(&inbox).await, 3);
    forget(&inbox, &stock).await;
}

#[tokio::test]
async fn pg_a_retention_within_the_redelivery_window_is_refused() {
    let inbox = PostgresInbox::new(pool());
    let err = inbox.sweeper(HOUR, 2 * HOUR).unwrap_err();
    assert_eq!(err.setting(), "inbox retention");
    assert!(
        err.reason().contains("3600s") && err.reason().contains("7200s"),
        "{err}"
    );
    assert!(inbox.sweeper(HOUR, HOUR).is_err(), "equal does not exceed");
    let ten_years = surely::MAX_DURATION;
    let err = inbox.sweeper(ten_years + HOUR, HOUR).unwrap_err();
    assert_eq!(err.setting(), "inbox retention");
    let err = inbox.sweeper(ten_years, ten_years + HOUR).unwrap_err();
    assert_eq!(err.setting(), "inbox redelivery window");
    assert!(inbox.sweeper(2 * HOUR, std::time::Duration::ZERO).is_ok());
}
