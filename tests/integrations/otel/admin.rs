//! The admin's observable gauges (features `admin` and `opentelemetry`): what waits for a
//! person, read by `AdminMetrics::refresh`, reported at each collection.

use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use surely::admin::Admin;
use surely::idempotency::IdempotencyKey;
use surely::ledger::{Evidence, Ledger, MemoryLedger};
use surely::outbox::{Event, EventId, MemoryOutbox, OutboxStore, Relay};
use surely::server::store::{Acquire, IdempotencyStore, MemoryStore, RecordKey, RequestDigest};
use tower::service_fn;

use super::Metrics;

#[tokio::test(start_paused = true)]
async fn the_gauges_report_what_waits_for_a_person() {
    let metrics = Metrics::new();
    let ledger = MemoryLedger::new();
    for key in ["o-1", "o-2", "o-3"] {
        ledger
            .record(&Evidence::new(key, "POST /orders"))
            .await
            .unwrap();
    }
    tokio::time::advance(Duration::from_secs(90)).await;
    let claims = ledger.claim(2, Duration::from_secs(30)).await.unwrap();
    for c in &claims {
        ledger.to_manual(c, "cannot query").await.unwrap();
    }
    let outbox = MemoryOutbox::new();
    outbox.enqueue(
        Event::new(
            EventId::new("evt-1").unwrap(),
            "order o-1",
            1,
            "OrderCreated",
            "x",
        )
        .unwrap(),
    );
    let refuse = service_fn(|_: Event| async { Err::<(), _>(std::io::Error::other("down")) });
    Relay::builder(outbox.clone(), refuse)
        .quarantine_after(1)
        .build()
        .unwrap()
        .run_once()
        .await
        .unwrap();
    let store = MemoryStore::new();
    let lease = Duration::from_secs(600);
    for (key, unknown) in [("pay-1", true), ("pay-2", false)] {
        let key = RecordKey::new("acme", "POST /payments", IdempotencyKey::new(key).unwrap());
        let Acquire::Owner(fence) = store
            .acquire(&key, &RequestDigest::of(b"1"), lease)
            .await
            .unwrap()
        else {
            panic!("a new key");
        };
        if unknown {
            store
                .mark_unknown(&key, fence, "the bank did not answer")
                .await
                .unwrap();
        }
    }
    tokio::time::advance(Duration::from_secs(120)).await;

    let admin = Admin::builder()
        .ledger(ledger.clone())
        .outbox(outbox.clone())
        .idempotency(store)
        .stuck_after(Duration::from_secs(60))
        .build();
    let gauges = admin.metrics(&metrics.provider.meter("surely-test"));
    // Nothing read yet: nothing reported.
    assert!(!metrics.exported("surely.admin.ledger.manual"));

    gauges.refresh().await;
    assert_eq!(metrics.gauge("surely.admin.ledger.manual", &[]), Some(2));
    assert_eq!(metrics.gauge("surely.admin.ledger.open", &[]), Some(1));
    assert_eq!(
        metrics.gauge_f64("surely.admin.ledger.oldest_age"),
        Some(210.0)
    );
    assert_eq!(
        metrics.gauge("surely.admin.outbox.quarantine", &[]),
        Some(1)
    );
    assert_eq!(
        metrics.gauge("surely.admin.idempotency.unknown", &[]),
        Some(1)
    );
    assert_eq!(
        metrics.gauge("surely.admin.idempotency.stuck", &[]),
        Some(1)
    );

    // A requeue, read at the next refresh (not before).
    outbox
        .requeue(&EventId::new("evt-1").unwrap())
        .await
        .unwrap();
    assert_eq!(
        metrics.gauge("surely.admin.outbox.quarantine", &[]),
        Some(1)
    );
    gauges.refresh().await;
    assert_eq!(
        metrics.gauge("surely.admin.outbox.quarantine", &[]),
        Some(0)
    );

    // An admin without a store reports nothing for it.
    let other = Metrics::new();
    let bare = Admin::builder().ledger(ledger).build();
    bare.metrics(&other.provider.meter("surely-test"))
        .refresh()
        .await;
    assert!(other.exported("surely.admin.ledger.manual"));
    assert!(!other.exported("surely.admin.outbox.quarantine"));
}

/// `run` reads the stores at once, then every interval, until told to stop.
#[tokio::test(start_paused = true)]
async fn the_gauges_are_refreshed_until_shutdown() {
    let metrics = Metrics::new();
    let ledger = MemoryLedger::new();
    let admin = Admin::builder().ledger(ledger.clone()).build();
    let gauges = admin.metrics(&metrics.provider.meter("surely-test"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(gauges.run(Duration::from_secs(30), async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(metrics.gauge("surely.admin.ledger.open", &[]), Some(0));
    ledger
        .record(&Evidence::new("o-1", "POST /orders"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(metrics.gauge("surely.admin.ledger.open", &[]), Some(1));
    stop.send(()).unwrap();
    running.await.unwrap();
}

/// The inbox's tasks, by state and reason, and the oldest's age.
#[tokio::test(start_paused = true)]
async fn the_task_gauges_count_by_state_and_reason() {
    use surely::inbox::{Consumer, MemoryInbox, Wait};
    let metrics = Metrics::new();
    let inbox = MemoryInbox::new();
    let payments = Consumer::builder("payments").build().unwrap();
    let answers: [fn() -> Wait; 3] = [
        || Wait::person("limit rule", "over 10 000 EUR"),
        || Wait::business("the card is not verified"),
        || Wait::business("the card is not verified"),
    ];
    for (i, answer) in answers.into_iter().enumerate() {
        let event = Event::new(
            EventId::new(format!("charge-{i}")).unwrap(),
            "o",
            1,
            "Charge",
            "",
        )
        .unwrap();
        inbox
            .process_task(&payments, &event, || async move { Err(answer()) })
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
    }
    let admin = Admin::builder().tasks(inbox).build();
    let gauges = admin.metrics(&metrics.provider.meter("surely-test"));
    gauges.refresh().await;
    let tasks = |state, reason| {
        metrics.gauge(
            "surely.admin.tasks",
            &[("state", state), ("reason", reason)],
        )
    };
    assert_eq!(tasks("manual", "person"), Some(1));
    assert_eq!(tasks("waiting", "business"), Some(2));
    assert_eq!(
        tasks("waiting", "transient"),
        None,
        "no point without tasks"
    );
    assert!(metrics.exported("surely.admin.tasks.oldest_age"));
}
