//! The inbox: each event's effect applied once per consumer, however often it is delivered;
//! versions in order, or the latest; a failed handler records nothing. On the memory inbox and
//! on PostgreSQL (the tests fail if it does not answer).

#[cfg(all(feature = "postgres", feature = "nats"))]
mod jetstream;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(all(feature = "postgres", feature = "rabbitmq"))]
mod rabbitmq;
#[cfg(all(feature = "postgres", feature = "nats"))]
mod soak;
mod waits;
#[cfg(feature = "postgres")]
mod waits_postgres;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use surely::inbox::{InboxError, MemoryInbox, Processed, Versions};
use surely::outbox::{Event, EventId};

/// Version `version` of stock `sku`, "set to `qty`".
pub(crate) fn stock_event(sku: &str, version: i64) -> Event {
    Event::new(
        EventId::derive(&format!("{sku} v{version}"), "StockChanged"),
        sku,
        version,
        "StockChanged",
        format!("{version}"),
    )
    .unwrap()
}

/// The end-to-end runs' (`jetstream`, `soak`) outbox and inbox, in tables
/// `<prefix>_outbox_<s>` and `<prefix>_inbox_<s>` of the test server, migrated; fails `test`,
/// naming the server, if it does not answer.
#[cfg(all(feature = "postgres", any(feature = "nats", feature = "rabbitmq")))]
async fn outbox_and_inbox(
    test: &str,
    prefix: &str,
    s: &str,
) -> (
    surely::postgres::Pool,
    surely::outbox::PostgresOutbox,
    surely::inbox::PostgresInbox,
) {
    use crate::support::postgres;

    let pool = postgres::pool();
    let outbox = surely::outbox::PostgresOutbox::new(pool.clone())
        .with_table(&format!("{prefix}_outbox_{s}"))
        .unwrap();
    let inbox = surely::inbox::PostgresInbox::new(pool.clone())
        .with_table(&format!("{prefix}_inbox_{s}"))
        .unwrap();
    outbox
        .migrate()
        .await
        .unwrap_or_else(|e| postgres::did_not_answer(test, e));
    inbox.migrate().await.unwrap();
    (pool, outbox, inbox)
}

/// Drops the tables of [`outbox_and_inbox`], then `others`, and forgets their migrations.
#[cfg(all(feature = "postgres", any(feature = "nats", feature = "rabbitmq")))]
async fn forget_outbox_and_inbox(
    outbox: &surely::outbox::PostgresOutbox,
    inbox: &surely::inbox::PostgresInbox,
    others: &[&str],
) {
    let (o, i) = (outbox.table(), inbox.table());
    let versions = format!("{i}_versions");
    let mut tables = vec![o, i, &versions];
    tables.extend_from_slice(others);
    crate::support::postgres::forget(outbox.pool(), &tables, &[o, i]).await;
}

async fn apply(
    inbox: &MemoryInbox,
    event: &Event,
    versions: Versions,
    runs: &Arc<AtomicUsize>,
) -> Processed {
    let runs = runs.clone();
    let version = event.version();
    inbox
        .process("inventory", event, versions, || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from(format!("applied v{version}")))
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn a_redelivered_event_gets_the_first_result_and_runs_nothing() {
    let inbox = MemoryInbox::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let e = stock_event("sku-42", 1);
    assert_eq!(
        apply(&inbox, &e, Versions::Any, &runs).await,
        Processed::Applied("applied v1".into())
    );
    assert_eq!(
        apply(&inbox, &e, Versions::Any, &runs).await,
        Processed::Duplicate("applied v1".into())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Another consumer of the same event is another record.
    let other = inbox
        .process("billing", &e, Versions::Any, || async {
            Ok::<_, std::io::Error>(Bytes::from("billed"))
        })
        .await
        .unwrap();
    assert_eq!(other, Processed::Applied("billed".into()));
    let stats = inbox.stats();
    assert_eq!((stats.applied, stats.duplicates), (2, 1));
}

#[tokio::test]
async fn a_failed_handler_records_nothing_and_the_redelivery_applies() {
    let inbox = MemoryInbox::new();
    let e = stock_event("sku-42", 1);
    let err = inbox
        .process("inventory", &e, Versions::InOrder, || async {
            Err::<Bytes, _>(std::io::Error::other("database down"))
        })
        .await
        .unwrap_err();
    assert!(matches!(err, InboxError::Handler(_)), "{err}");
    let runs = Arc::new(AtomicUsize::new(0));
    assert!(matches!(
        apply(&inbox, &e, Versions::InOrder, &runs).await,
        Processed::Applied(_)
    ));
}

#[tokio::test]
async fn in_order_parks_a_gap_and_ignores_the_old() {
    let inbox = MemoryInbox::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let (v8, v9) = (stock_event("sku-42", 8), stock_event("sku-42", 9));
    // The first version seen is taken as the start.
    assert!(matches!(
        apply(&inbox, &stock_event("sku-42", 7), Versions::InOrder, &runs).await,
        Processed::Applied(_)
    ));
    // 9 before 8: parked, not recorded.
    assert_eq!(
        apply(&inbox, &v9, Versions::InOrder, &runs).await,
        Processed::Parked { applied: 7 }
    );
    assert!(!Processed::Parked { applied: 7 }.is_settled());
    assert!(matches!(
        apply(&inbox, &v8, Versions::InOrder, &runs).await,
        Processed::Applied(_)
    ));
    // 9 redelivered after 8: applied.
    assert!(matches!(
        apply(&inbox, &v9, Versions::InOrder, &runs).await,
        Processed::Applied(_)
    ));
    // 8 twice: a duplicate, nothing run.
    assert!(matches!(
        apply(&inbox, &v8, Versions::InOrder, &runs).await,
        Processed::Duplicate(_)
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let stats = inbox.stats();
    assert_eq!((stats.applied, stats.parked, stats.duplicates), (3, 1, 1));
}

#[tokio::test]
async fn latest_applies_over_a_gap_and_records_the_old_as_a_no_op() {
    let inbox = MemoryInbox::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let (v8, v9) = (stock_event("sku-42", 8), stock_event("sku-42", 9));
    assert!(matches!(
        apply(&inbox, &v9, Versions::Latest, &runs).await,
        Processed::Applied(_)
    ));
    assert_eq!(
        apply(&inbox, &v8, Versions::Latest, &runs).await,
        Processed::Stale { applied: 9 }
    );
    // The stale one is recorded: its redelivery is a duplicate.
    assert_eq!(
        apply(&inbox, &v8, Versions::Latest, &runs).await,
        Processed::Duplicate(Bytes::new())
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let stats = inbox.stats();
    assert_eq!((stats.applied, stats.stale, stats.duplicates), (1, 1, 1));
}

#[tokio::test]
async fn a_delivery_while_another_is_processed_is_in_flight() {
    let inbox = MemoryInbox::new();
    let e = stock_event("sku-42", 1);
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (inbox, e) = (inbox.clone(), e.clone());
        tokio::spawn(async move {
            inbox
                .process("inventory", &e, Versions::Any, || async {
                    let _ = wait.await;
                    Ok::<_, std::io::Error>(Bytes::from("done"))
                })
                .await
                .unwrap()
        })
    };
    tokio::task::yield_now().await;
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        apply(&inbox, &e, Versions::Any, &runs).await,
        Processed::InFlight
    );
    go.send(()).unwrap();
    assert_eq!(first.await.unwrap(), Processed::Applied("done".into()));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);

/// The memory inbox's sweep: records past the retention go, at most `limit` a batch and the
/// oldest first; the versions stay, so an old versioned redelivery is stale; an event without
/// versions redelivered after the sweep runs again; a delivery in flight is never swept.
#[tokio::test(start_paused = true)]
async fn the_memory_sweep_is_bounded_and_keeps_the_versions() {
    use surely::maintenance::Chore;
    let inbox = MemoryInbox::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let (v1, v2) = (stock_event("sku-42", 1), stock_event("sku-42", 2));
    apply(&inbox, &v1, Versions::InOrder, &runs).await;
    tokio::time::advance(HOUR).await;
    apply(&inbox, &v2, Versions::InOrder, &runs).await;
    let unversioned = stock_event("sku-7", 1);
    apply(&inbox, &unversioned, Versions::Any, &runs).await;
    // A delivery in flight, its handler waiting.
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let in_flight = {
        let inbox = inbox.clone();
        tokio::spawn(async move {
            inbox
                .process(
                    "inventory",
                    &stock_event("sku-9", 1),
                    Versions::Any,
                    || async {
                        let _ = released.await;
                        Ok::<_, std::io::Error>(Bytes::from("late"))
                    },
                )
                .await
                .unwrap()
        })
    };
    tokio::task::yield_now().await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    let sweeper = inbox.sweeper(2 * HOUR, HOUR).unwrap();
    assert!(
        sweeper.name().starts_with("inbox memory "),
        "{}",
        sweeper.name()
    );
    assert_eq!(sweeper.run(10).await.unwrap().done, 0, "none is old enough");
    tokio::time::advance(HOUR + HOUR / 2).await;
    // v1 is 2.5 hours old, v2 and the unversioned one 1.5.
    let batch = sweeper.run(10).await.unwrap();
    assert_eq!((batch.done, batch.more), (1, false));
    assert_eq!(
        apply(&inbox, &v1, Versions::InOrder, &runs).await,
        Processed::Stale { applied: 2 },
        "the version outlives the record"
    );
    tokio::time::advance(HOUR).await;
    // v2, the unversioned one and v1's stale record are old enough; the batch takes two.
    let batch = sweeper.run(2).await.unwrap();
    assert_eq!((batch.done, batch.more), (2, true));
    let batch = sweeper.run(2).await.unwrap();
    assert_eq!(
        (batch.done, batch.more),
        (0, false),
        "v1's stale record is recent"
    );
    assert_eq!(
        apply(&inbox, &v2, Versions::Latest, &runs).await,
        Processed::Stale { applied: 2 }
    );
    assert!(
        matches!(
            apply(&inbox, &unversioned, Versions::Any, &runs).await,
            Processed::Applied(_)
        ),
        "without versions, nothing remembers it"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    // The delivery in flight was not swept: a second delivery of it still waits.
    assert_eq!(
        inbox
            .process(
                "inventory",
                &stock_event("sku-9", 1),
                Versions::Any,
                || async { Ok::<_, std::io::Error>(Bytes::from("twice")) }
            )
            .await
            .unwrap(),
        Processed::InFlight
    );
    release.send(()).unwrap();
    assert_eq!(in_flight.await.unwrap(), Processed::Applied("late".into()));
}
