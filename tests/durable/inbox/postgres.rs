//! The PostgreSQL inbox, with a business table beside it: the stock changes once per event,
//! in the same transaction as the record.

use surely::inbox::{Begin, PostgresInbox, Processed, Versions};
use surely::outbox::Event;

use super::stock_event;
use crate::support::names::suffix;
use crate::support::postgres::{self, did_not_answer, pool};

/// An inbox and a stock table of this test's own, with `sku-42` at 100.
async fn inbox(test: &str) -> (PostgresInbox, String) {
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

async fn forget(inbox: &PostgresInbox, stock: &str) {
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
    // The connection is outside any transaction: an aborted one would refuse the query, and
    // in an open one `now()` (when it began) would be older than the query (one message of the
    // simple protocol, which starts a transaction of its own when there is none).
    let rows = inbox
        .pool()
        .get()
        .await
        .unwrap()
        .simple_query("SELECT now() = statement_timestamp()")
        .await
        .unwrap();
    let fresh = rows.iter().any(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0) == Some("t"),
        _ => false,
    });
    assert!(fresh);
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
