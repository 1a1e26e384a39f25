//! The PostgreSQL outbox: the same behaviour as the memory one, plus what only a database
//! gives: events that commit or roll back with the business write, and relays racing over one
//! table without taking an event twice.

use std::time::Duration;

use surely::outbox::{Event, OutboxStore, PostgresOutbox, Relay};

use super::{event, Bus};
use crate::support::names::suffix;
use crate::support::postgres::{self, did_not_answer, pool, url};

/// An outbox in a table of its own, migrated; dropped (with its migration records) by `forget`.
async fn outbox(test: &str) -> PostgresOutbox {
    let table = format!("surely_outbox_t{}", suffix());
    let outbox = PostgresOutbox::new(pool()).with_table(&table).unwrap();
    outbox
        .migrate()
        .await
        .unwrap_or_else(|e| did_not_answer(test, e));
    outbox
}

async fn forget(outbox: &PostgresOutbox) {
    postgres::forget(outbox.pool(), &[outbox.table()], &[outbox.table()]).await;
}

/// Enqueues `events` in one transaction, committed or not.
async fn enqueue(outbox: &PostgresOutbox, events: &[Event], commit: bool) {
    let mut client = outbox.pool().get().await.unwrap();
    let txn = client.transaction().await.unwrap();
    for e in events {
        outbox.enqueue(&txn, e).await.unwrap();
    }
    if commit {
        txn.commit().await.unwrap();
    } else {
        txn.rollback().await.unwrap();
    }
}

#[tokio::test]
async fn pg_an_event_commits_or_rolls_back_with_its_transaction() {
    let outbox = outbox("pg_an_event_commits_or_rolls_back_with_its_transaction").await;
    enqueue(&outbox, &[event(1)], false).await;
    assert_eq!(
        outbox.stats().await.unwrap().backlog,
        0,
        "rolled back: no event"
    );
    enqueue(&outbox, &[event(2)], true).await;
    // Enqueued again (a retried handler): still one.
    let mut client = outbox.pool().get().await.unwrap();
    let txn = client.transaction().await.unwrap();
    assert!(!outbox.enqueue(&txn, &event(2)).await.unwrap());
    txn.commit().await.unwrap();
    drop(client);
    let stats = outbox.stats().await.unwrap();
    assert_eq!(stats.backlog, 1);
    assert!(stats.oldest.is_some());
    forget(&outbox).await;
}

#[tokio::test]
async fn pg_publishes_in_order_then_sweeps() {
    let outbox = outbox("pg_publishes_in_order_then_sweeps").await;
    let events: Vec<Event> = (1..=5).map(event).collect();
    enqueue(&outbox, &events, true).await;
    let ids = events.iter().map(|e| e.id().clone()).collect();
    super::publishes_in_order_then_sweeps(outbox.clone(), ids, tokio::time::sleep).await;
    forget(&outbox).await;
}

#[tokio::test]
async fn pg_quarantine_is_listed_requeued_and_discarded() {
    let outbox = outbox("pg_quarantine_is_listed_requeued_and_discarded").await;
    let events = [event(1), event(2), event(3)];
    enqueue(&outbox, &events, true).await;
    super::quarantine_is_listed_requeued_and_discarded(outbox.clone(), events).await;
    forget(&outbox).await;
}

#[tokio::test]
async fn pg_failures_retry_then_quarantine() {
    let outbox = outbox("pg_failures_retry_then_quarantine").await;
    let (a, b) = (event(1), event(2));
    enqueue(&outbox, &[a.clone(), b.clone()], true).await;
    super::failures_retry_then_quarantine(
        outbox.clone(),
        [a.id().clone(), b.id().clone()],
        tokio::time::sleep,
    )
    .await;
    assert_eq!(
        outbox.last_error(b.id()).await.unwrap().as_deref(),
        Some("broker unavailable")
    );
    forget(&outbox).await;
}

#[tokio::test]
async fn pg_a_dead_relays_events_come_back() {
    let outbox = outbox("pg_a_dead_relays_events_come_back").await;
    enqueue(&outbox, &[event(1)], true).await;
    super::a_dead_relays_events_come_back(outbox.clone(), tokio::time::sleep).await;
    forget(&outbox).await;
}

/// Four relays over one table: every event published, none taken by two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_relays_racing_over_one_table_publish_each_event_once() {
    let outbox = outbox("pg_relays_racing_over_one_table_publish_each_event_once").await;
    let events: Vec<Event> = (1..=400).map(event).collect();
    enqueue(&outbox, &events, true).await;
    let bus = Bus::default();
    let relays: Vec<_> = (0..4)
        .map(|_| {
            let (outbox, bus) = (outbox.clone(), bus.clone());
            tokio::spawn(async move {
                let mut relay = Relay::builder(outbox, bus.service())
                    .batch(25)
                    .build()
                    .unwrap();
                while relay.run_once().await.unwrap().claimed > 0 {}
            })
        })
        .collect();
    for r in relays {
        r.await.unwrap();
    }
    let mut published = bus.published();
    assert_eq!(published.len(), 400, "each event once: no claim was shared");
    published.sort();
    published.dedup();
    assert_eq!(published.len(), 400, "every event");
    assert_eq!(outbox.stats().await.unwrap().backlog, 0);
    forget(&outbox).await;
}

/// Waits (at most 10 s of real time) until the bus has published `n` events.
async fn published(bus: &Bus, n: usize, what: &str) {
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while bus.published().len() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "{what}: {} of {n} published",
        bus.published().len()
    );
}

/// A relay that polls once an hour, woken by `LISTEN/NOTIFY`: a committed event is published
/// at once; when the listening connection is killed, the listener reconnects and the next
/// event is published too.
#[tokio::test]
async fn pg_a_commit_wakes_the_relay_even_after_its_listener_was_cut() {
    let outbox = outbox("pg_a_commit_wakes_the_relay_even_after_its_listener_was_cut").await;
    let bus = Bus::default();
    let relay = Relay::builder(outbox.clone(), bus.service())
        .poll(Duration::from_secs(3600))
        .wake_on(outbox.listen(&url()).await.unwrap())
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async {
        let _ = stopped.await;
    }));
    // The relay's first round finds nothing; then it waits for the hour, or a wake.
    tokio::time::sleep(Duration::from_millis(50)).await;
    enqueue(&outbox, &[event(1)], true).await;
    published(&bus, 1, "woken by the commit").await;

    // Cut the listening connection, as a failover or an idle-connection killer would.
    let client = outbox.pool().get().await.unwrap();
    let cut = client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = 'surely outbox listener' AND query = $1",
            &[&format!("LISTEN \"{}\"", outbox.table())],
        )
        .await
        .unwrap();
    assert_eq!(cut, 1, "the listener's connection was found and cut");
    drop(client);
    enqueue(&outbox, &[event(2)], true).await;
    published(&bus, 2, "woken after the listener reconnected").await;
    stop.send(()).unwrap();
    running.await.unwrap();
    forget(&outbox).await;
}

#[tokio::test]
async fn pg_a_listener_that_cannot_listen_is_an_error() {
    let outbox = outbox("pg_a_listener_that_cannot_listen_is_an_error").await;
    let bad = outbox.listen("postgres://no such url").await.unwrap_err();
    assert!(crate::chain(&bad).contains("cannot listen"), "{bad}");
    let down = outbox
        .listen("postgres://postgres@127.0.0.1:1/test")
        .await
        .unwrap_err();
    assert!(crate::chain(&down).contains("cannot listen"), "{down}");
    forget(&outbox).await;
}

/// The outbox's sweeper deletes published events past the retention, at most its limit a
/// batch, the longest published first; never a pending or quarantined one; two instances'
/// batches at once delete disjoint events.
#[tokio::test]
async fn pg_the_sweeper_deletes_published_events_a_bounded_batch_at_a_time() {
    use crate::sweeping::{exec, two_batches_beside_held_rows, HOUR};
    use surely::maintenance::Chore;
    let outbox = outbox("pg_the_sweeper_deletes_published_events_a_bounded_batch_at_a_time").await;
    let events: Vec<Event> = (0..12).map(event).collect();
    enqueue(&outbox, &events, true).await;
    let claimed = outbox.claim(12, Duration::from_secs(60)).await.unwrap();
    // 0..10 published, 10 quarantined, 11 pending.
    assert_eq!(outbox.published_all(&claimed[..10]).await.unwrap(), 10);
    outbox
        .failed(&claimed[10], "refused", Duration::ZERO, 1)
        .await
        .unwrap();
    let sweeper = outbox.sweeper(2 * HOUR).unwrap();
    assert_eq!(sweeper.name(), format!("outbox {}", outbox.table()));
    assert_eq!(
        sweeper.run(100).await.unwrap().done,
        0,
        "published just now"
    );
    // Every event three hours old; event 9 published the longest ago, then 8, ...
    let t = outbox.table();
    exec(
        outbox.pool(),
        &format!(
            "UPDATE {t} SET enqueued_at = now() - interval '3 hours',
                 published_at = now() - interval '3 hours' - seq * interval '1 minute'"
        ),
    )
    .await;
    let batch = sweeper.run(3).await.unwrap();
    assert_eq!((batch.done, batch.more), (3, true));
    let left: Vec<String> = outbox
        .pool()
        .get()
        .await
        .unwrap()
        .query(
            &format!("SELECT id FROM {t} WHERE state = 1 ORDER BY seq"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let first: Vec<String> = events[..7]
        .iter()
        .map(|e| e.id().as_str().to_owned())
        .collect();
    assert_eq!(left, first, "the longest published first");

    let other = outbox.sweeper(2 * HOUR).unwrap();
    let lock = format!("SELECT 1 FROM {t} WHERE state = 1 ORDER BY seq LIMIT 2 FOR UPDATE");
    let swept = two_batches_beside_held_rows(outbox.pool(), &sweeper, &other, &lock).await;
    assert_eq!(swept, 5, "disjoint, every published event not held");
    let batch = sweeper.run(100).await.unwrap();
    assert_eq!((batch.done, batch.more), (2, false));
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.backlog, stats.quarantined), (1, 1), "never these");

    let err = outbox.sweeper(HOUR - Duration::from_secs(1)).unwrap_err();
    assert_eq!(err.setting(), "outbox retention");
    assert!(
        err.reason().contains("3599s") && err.reason().contains("3600s"),
        "{err}"
    );
    let err = outbox.sweeper(surely::MAX_DURATION + HOUR).unwrap_err();
    assert_eq!(err.setting(), "outbox retention");
    forget(&outbox).await;
}
