//! The retention chores over the memory stores, on paused time: what each deletes (terminal
//! rows past the retention, at most a batch's limit, the longest done first), what each never
//! does, and the retentions each refuses. Their PostgreSQL twins are beside each store's tests.

use std::time::Duration;

use surely::ledger::{EntryState, Evidence, Filter, Ledger, MemoryLedger, Settlement, Verdict};
use surely::maintenance::{Chore, Maintenance};
use surely::outbox::{MemoryOutbox, OutboxStore};
use surely::reconcile::{Difference, DifferenceStore, ItemState, MemoryDifferences};

const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);

async fn advance(d: Duration) {
    tokio::time::advance(d).await;
}

#[tokio::test(start_paused = true)]
async fn the_outbox_sweeper_deletes_published_events_a_bounded_batch_at_a_time() {
    let outbox = MemoryOutbox::new();
    for n in 0..8 {
        assert!(outbox.enqueue(crate::outbox::event(n)));
    }
    let claimed = outbox.claim(8, HOUR).await.unwrap();
    // Published a minute apart, event 5 first, then 4, ... 0; 6 quarantined, 7 pending.
    for c in claimed[..6].iter().rev() {
        outbox.published(c).await.unwrap();
        advance(MINUTE).await;
    }
    outbox
        .failed(&claimed[6], "refused", Duration::ZERO, 1)
        .await
        .unwrap();
    let sweeper = outbox.sweeper(2 * HOUR).unwrap();
    assert!(sweeper.name().starts_with("outbox memory "));
    assert_eq!(
        sweeper.run(100).await.unwrap().done,
        0,
        "published just now"
    );
    advance(2 * HOUR - 3 * MINUTE).await;
    // Events 5, 4, 3 and 2 were published two hours ago or more; 1 and 0 not yet.
    let batch = sweeper.run(3).await.unwrap();
    assert_eq!((batch.done, batch.more), (3, true));
    let batch = sweeper.run(3).await.unwrap();
    assert_eq!((batch.done, batch.more), (1, false));
    advance(10 * MINUTE).await;
    assert_eq!(sweeper.run(3).await.unwrap().done, 2);
    let stats = outbox.stats().await.unwrap();
    assert_eq!((stats.backlog, stats.quarantined), (1, 1), "never these");
    assert_eq!(
        outbox.sweeper(MINUTE).unwrap_err().setting(),
        "outbox retention"
    );
}

#[tokio::test(start_paused = true)]
async fn the_ledger_sweeper_deletes_settled_entries_a_bounded_batch_at_a_time() {
    let ledger = MemoryLedger::new();
    for i in 0..7 {
        ledger
            .record(&Evidence::new(format!("k{i}"), "POST /orders"))
            .await
            .unwrap();
    }
    let claims = ledger.claim(6, HOUR).await.unwrap();
    let done = Settlement::reconciled(Verdict::Succeeded, "found");
    for c in &claims[..4] {
        ledger.settle(c, &done).await.unwrap();
        advance(MINUTE).await;
    }
    ledger.to_manual(&claims[4], "by hand").await.unwrap();
    // k5 claimed, k6 open.
    let sweeper = ledger.sweeper(2 * HOUR).unwrap();
    assert_eq!(sweeper.run(100).await.unwrap().done, 0, "settled just now");
    advance(3 * HOUR).await;
    let batch = sweeper.run(3).await.unwrap();
    assert_eq!((batch.done, batch.more), (3, true));
    let settled = ledger
        .list(&Filter::new().state(EntryState::Settled))
        .await
        .unwrap();
    assert_eq!(settled.len(), 1);
    assert_eq!(
        settled[0].evidence.key.as_deref(),
        Some("k3"),
        "the longest settled first"
    );
    let batch = sweeper.run(3).await.unwrap();
    assert_eq!((batch.done, batch.more), (1, false));
    let stats = ledger.stats_now();
    assert_eq!(
        (stats.manual, stats.claimed, stats.open, stats.settled),
        (1, 1, 1, 0)
    );
    assert_eq!(
        ledger.sweeper(MINUTE).unwrap_err().setting(),
        "ledger retention"
    );
}

#[tokio::test(start_paused = true)]
async fn the_differences_sweeper_deletes_done_differences_a_bounded_batch_at_a_time() {
    let store = MemoryDifferences::new();
    for i in 0..5 {
        let d = Difference::new("r", format!("k{i}"), vec![], Some("fix".to_owned()));
        store.record(&d).await.unwrap();
    }
    store
        .record(&Difference::new("r", "k-manual", vec![], None))
        .await
        .unwrap();
    let claims = store.claim(4, HOUR).await.unwrap();
    store.mark_repaired(&claims[0], "fixed").await.unwrap();
    advance(MINUTE).await;
    store
        .resolve_manually(&claims[1].item.difference.id, "ana", "by hand")
        .await
        .unwrap();
    advance(MINUTE).await;
    store.mark_repaired(&claims[2], "fixed").await.unwrap();
    // k3 claimed, k4 open, k-manual manual.
    let sweeper = store.sweeper(2 * HOUR).unwrap();
    assert_eq!(sweeper.run(100).await.unwrap().done, 0, "done just now");
    advance(3 * HOUR).await;
    let batch = sweeper.run(2).await.unwrap();
    assert_eq!((batch.done, batch.more), (2, true));
    let left = store.list(None, 100).await.unwrap();
    let states: Vec<(String, ItemState)> = left
        .iter()
        .map(|i| {
            (
                String::from_utf8(i.difference.key.to_vec()).unwrap(),
                i.state,
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("k2".to_owned(), ItemState::Repaired),
            ("k3".to_owned(), ItemState::Claimed),
            ("k4".to_owned(), ItemState::Open),
            ("k-manual".to_owned(), ItemState::Manual),
        ],
        "the longest done first"
    );
    let batch = sweeper.run(2).await.unwrap();
    assert_eq!((batch.done, batch.more), (1, false));
    assert_eq!(store.list(None, 100).await.unwrap().len(), 3);
    assert_eq!(
        store.sweeper(Duration::MAX).unwrap_err().setting(),
        "reconcile retention"
    );
}

/// The chores in a maintenance task: each round works a backlog down a batch at a time, and
/// the chores of two memory stores have names of their own.
#[tokio::test(start_paused = true)]
async fn a_maintenance_runs_the_sweepers_in_batches() {
    let outbox = MemoryOutbox::new();
    for n in 0..25 {
        outbox.enqueue(crate::outbox::event(n));
    }
    let claimed = outbox.claim(25, HOUR).await.unwrap();
    outbox.published_all(&claimed).await.unwrap();
    let ledger = MemoryLedger::new();
    let maintenance = Maintenance::builder()
        .chore(outbox.sweeper(HOUR).unwrap())
        .chore(ledger.sweeper(HOUR).unwrap())
        .batch_size(10)
        .every(24 * HOUR)
        .build()
        .unwrap()
        .spawn();
    // The round at the start (and one on demand) find nothing old enough.
    for _ in 0..2 {
        assert_eq!(maintenance.run_now().await[0].done, 0);
    }
    advance(2 * HOUR).await;
    let reports = maintenance.run_now().await;
    assert_ne!(reports[0].chore, reports[1].chore);
    assert_eq!(reports.len(), 2);
    assert_eq!((reports[0].done, reports[0].batches), (25, 3));
    assert_eq!(reports[1].done, 0);
    assert_eq!(outbox.stats().await.unwrap().backlog, 0);
    maintenance.shutdown().await;
}
