//! The JetStream publisher over the real NATS server of the machine (`SURELY_TEST_NATS_URL`,
//! default `nats://127.0.0.1:4222`; the tests fail if it does not answer). Real time, short
//! waits: the broker's clock and timers are its own.

use std::time::Duration;

use surely::deps::async_nats::jetstream;
use surely::outbox::{JetStreamPublisher, MemoryOutbox, OutboxStore, Relay};
use tokio_stream::StreamExt;
use tower::{Service, ServiceExt};

use super::event;
use crate::support::names::suffix;
use crate::support::nats;

/// A stream of this test's own, on subjects `<name>.>`; deleted by the caller.
async fn stream(test: &str) -> (jetstream::Context, String) {
    let name = format!("surely_{}", suffix());
    let js = nats::jetstream(test).await;
    nats::stream(&js, test, &name).await;
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
            .get(surely::deps::async_nats::header::NATS_MESSAGE_ID)
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

/// An event header that NATS acts on (`Nats-Msg-Id` would replace the event's id) or that the
/// publisher writes is refused before anything is sent; repeated headers are kept, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_headers_are_refused_and_repeated_ones_kept() {
    let (js, name) = stream("reserved_headers_are_refused_and_repeated_ones_kept").await;
    let mut publisher = JetStreamPublisher::new(js.clone(), name.clone());
    for reserved in ["Nats-Msg-Id", "nats-expected-stream", "Surely-Version"] {
        let err = publisher
            .ready()
            .await
            .unwrap()
            .call(event(1).with_header(reserved, "x").unwrap())
            .await
            .unwrap_err();
        assert!(err.to_string().contains(reserved), "{err}");
    }
    assert_eq!(messages(&js, &name).await, 0, "nothing sent");
    let repeated = event(2)
        .with_header("x-trace", "a")
        .unwrap()
        .with_header("x-trace", "b")
        .unwrap();
    publisher
        .ready()
        .await
        .unwrap()
        .call(repeated.clone())
        .await
        .unwrap();
    // Read as a consumer gets it, delivered from the stream (async-nats's reading of a stored
    // message keeps one value per name). The message is stored once the publish is acked, so
    // the fetch does not race the publish, as a live subscription made before it could.
    let consumer = js
        .get_stream(&name)
        .await
        .unwrap()
        .create_consumer(jetstream::consumer::pull::Config::default())
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(5))
        .messages()
        .await
        .unwrap();
    let message = batch
        .next()
        .await
        .expect("the stored message is delivered")
        .unwrap();
    let values: Vec<String> = message
        .headers
        .as_ref()
        .unwrap()
        .get_all("x-trace")
        .map(|v| v.as_str().to_owned())
        .collect();
    assert_eq!(values, ["a", "b"]);
    // NATS keeps no order between names: the headers come back sorted by name, which is the
    // order `repeated` already has (`content-type` before `x-trace`).
    assert_eq!(
        surely::outbox::Event::from_nats(&message).unwrap(),
        repeated,
        "read back whole"
    );
    js.delete_stream(&name).await.unwrap();
}
