//! The JetStream publisher over the real NATS server of the machine (`SURELY_TEST_NATS_URL`,
//! default `nats://127.0.0.1:4222`; the tests fail if it does not answer). Real time, short
//! waits: the broker's clock and timers are its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use surely::outbox::async_nats::jetstream::{self, stream};
use surely::outbox::{JetStreamPublisher, MemoryOutbox, OutboxStore, Relay};
use tower::{Service, ServiceExt};

use crate::event;

fn url() -> String {
    std::env::var("SURELY_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A stream of this test's own, on subjects `<name>.>`; deleted by the caller.
async fn stream(test: &str) -> (jetstream::Context, String) {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let name = format!(
        "surely_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    let client = surely::outbox::async_nats::connect(url())
        .await
        .unwrap_or_else(|e| panic!("{test}: NATS at {} did not answer: {e}", url()));
    let js = jetstream::new(client);
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{name}.>")],
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("{test}: JetStream at {} refused a stream: {e}", url()));
    (js, name)
}

async fn messages(js: &jetstream::Context, name: &str) -> u64 {
    js.get_stream(name)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_to_jetstream_with_the_event_id_as_message_id() {
    let (js, name) =
        stream("the_relay_publishes_to_jetstream_with_the_event_id_as_message_id").await;
    let outbox = MemoryOutbox::new();
    let events: Vec<_> = (1..=3).map(event).collect();
    for e in &events {
        outbox.enqueue(e.clone());
    }
    let mut relay = Relay::builder(
        outbox.clone(),
        JetStreamPublisher::new(js.clone(), name.clone()),
    )
    .build()
    .unwrap();
    assert_eq!(relay.run_once().await.unwrap().published, 3);
    assert_eq!(messages(&js, &name).await, 3);
    let stored = js
        .get_stream(&name)
        .await
        .unwrap()
        .get_raw_message(1)
        .await
        .unwrap();
    assert_eq!(stored.subject.as_str(), format!("{name}.OrderCreated"));
    let headers = stored.headers;
    assert_eq!(
        headers
            .get(surely::outbox::async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str()),
        Some(events[0].id().as_str())
    );
    assert_eq!(headers.get("Surely-Version").map(|v| v.as_str()), Some("1"));
    assert_eq!(
        headers.get("content-type").map(|v| v.as_str()),
        Some("text/plain")
    );
    assert_eq!(outbox.stats_now().backlog, 0);
    js.delete_stream(&name).await.unwrap();
}

/// The relay publishes, then dies before it marks the event: after the lease another round
/// publishes it again, with the same id, and JetStream keeps one copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_the_relay_did_not_mark_is_dropped_by_jetstream_as_a_duplicate() {
    let (js, name) =
        stream("a_publish_the_relay_did_not_mark_is_dropped_by_jetstream_as_a_duplicate").await;
    let outbox = MemoryOutbox::new();
    outbox.enqueue(event(1));
    let lease = Duration::from_millis(200);
    let mut publisher = JetStreamPublisher::new(js.clone(), name.clone());
    // The dying relay: claims, publishes, and never marks.
    let held = outbox.claim(10, lease).await.unwrap();
    let first = publisher
        .ready()
        .await
        .unwrap()
        .call(held[0].event.clone())
        .await
        .unwrap();
    assert!(!first.duplicate);
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    // The next relay: the event is back, goes out again, and JetStream says it has it.
    let mut relay = Relay::builder(outbox.clone(), publisher.clone())
        .lease(lease)
        .build()
        .unwrap();
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    let again = publisher
        .ready()
        .await
        .unwrap()
        .call(held[0].event.clone())
        .await
        .unwrap();
    assert!(again.duplicate, "{again:?}");
    assert_eq!(messages(&js, &name).await, 1, "one copy in the stream");
    js.delete_stream(&name).await.unwrap();
}

/// No stream takes the subject: the publish fails, and the event waits to go again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_no_stream_takes_is_a_failed_publish() {
    let (js, name) = stream("a_subject_no_stream_takes_is_a_failed_publish").await;
    let outbox = MemoryOutbox::new();
    outbox.enqueue(event(1));
    let mut relay = Relay::builder(
        outbox.clone(),
        JetStreamPublisher::new(js.clone(), format!("{name}_nowhere")),
    )
    .build()
    .unwrap();
    let round = relay.run_once().await.unwrap();
    assert_eq!((round.published, round.failed), (0, 1));
    assert_eq!(outbox.stats_now().backlog, 1);
    js.delete_stream(&name).await.unwrap();
}
