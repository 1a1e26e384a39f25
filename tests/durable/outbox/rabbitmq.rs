//! The RabbitMQ publisher over the real broker of the machine (`SURELY_TEST_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`; the tests fail if it does not answer). Real time,
//! short waits: the broker's clock and timers are its own.

use std::time::Duration;

use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
use surely::deps::lapin::message::Delivery;
use surely::deps::lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use surely::deps::lapin::BasicProperties;
use surely::inbox::{MemoryInbox, Versions};
use surely::outbox::{
    Event, EventId, MemoryOutbox, OutboxStore, RabbitError, RabbitPublisher, Relay,
};
use tower::{Service, ServiceExt};

use super::event;
use crate::support::proxy::Proxy;
use crate::support::rabbitmq::{self, Topology};

/// A publisher to the test's exchange, with keys `orders.<kind>`.
async fn publisher(topology: &Topology) -> RabbitPublisher {
    RabbitPublisher::builder(rabbitmq::url(), topology.exchange.clone())
        .routing_prefix("orders")
        .connect()
        .await
        .unwrap()
}

/// A publisher to the test's exchange through `proxy`, waiting `timeout` for RabbitMQ.
async fn publisher_through(
    proxy: &Proxy,
    topology: &Topology,
    timeout: Duration,
) -> RabbitPublisher {
    RabbitPublisher::builder(
        rabbitmq::url_through(proxy.addr()),
        topology.exchange.clone(),
    )
    .routing_prefix("orders")
    .timeout(timeout)
    .connect()
    .await
    .unwrap()
}

/// The ids of the events in the test's queue, taken, in order.
async fn delivered_ids(topology: &Topology) -> Vec<EventId> {
    let delivered = topology.drain().await;
    delivered
        .iter()
        .map(|d| Event::from_amqp(d).unwrap().id().clone())
        .collect()
}

async fn publish(publisher: &mut RabbitPublisher, event: Event) -> Result<(), RabbitError> {
    publisher.ready().await?.call(event).await
}

/// An event of `kind` about order `n`.
fn of_kind(n: u32, kind: &str) -> Event {
    let key = format!("order o-{n}");
    Event::new(EventId::derive(&key, kind), key, 1, kind, format!("o-{n}")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_to_rabbitmq_with_the_event_id_as_message_id() {
    let topology = Topology::new(
        "the_relay_publishes_to_rabbitmq_with_the_event_id_as_message_id",
        Some("orders.#"),
    )
    .await;
    let outbox = MemoryOutbox::new();
    let events: Vec<_> = (1..=3).map(event).collect();
    for e in &events {
        outbox.enqueue(e.clone());
    }
    let mut relay = Relay::builder(outbox.clone(), publisher(&topology).await)
        .build()
        .unwrap();
    let round = relay.run_once().await.unwrap();
    assert_eq!((round.published, round.failed), (3, 0));
    assert_eq!(outbox.stats_now().backlog, 0);
    let delivered = topology.drain().await;
    assert_eq!(delivered.len(), 3);
    for (delivery, event) in delivered.iter().zip(&events) {
        assert_eq!(delivery.routing_key.as_str(), "orders.OrderCreated");
        let properties = &delivery.properties;
        assert_eq!(
            properties.message_id().as_ref().map(|id| id.as_str()),
            Some(event.id().as_str())
        );
        assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
        assert_eq!(
            properties.content_type().as_ref().map(|c| c.as_str()),
            Some("text/plain")
        );
        assert_eq!(
            &Event::from_amqp(delivery).unwrap(),
            event,
            "read back whole, in order"
        );
    }
    topology.delete().await;
}

/// A message no relay wrote, or one that was tampered with: a typed error, never a panic.
#[test]
fn from_amqp_refuses_a_message_a_relay_did_not_write() {
    let good = || {
        let mut headers = FieldTable::default();
        headers.insert("surely-aggregate".into(), text("order o-1"));
        headers.insert("surely-version".into(), AMQPValue::LongLongInt(3));
        headers.insert("surely-kind".into(), text("OrderCreated"));
        headers.insert(
            "x-trace".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![text("a"), text("b")])),
        );
        headers.insert("x-note".into(), text("crème brûlée ✓"));
        BasicProperties::default()
            .with_message_id("evt-1".into())
            .with_headers(headers)
    };
    let read = |properties: BasicProperties| {
        let mut delivery = Delivery::mock(1, "ex".into(), "key".into(), false, b"o-1".to_vec());
        delivery.properties = properties;
        Event::from_amqp(&delivery)
    };
    let event = read(good()).unwrap();
    assert_eq!(event.version(), 3);
    assert_eq!(
        event.headers(),
        [
            ("x-note".to_owned(), "crème brûlée ✓".to_owned()),
            ("x-trace".to_owned(), "a".to_owned()),
            ("x-trace".to_owned(), "b".to_owned())
        ]
    );
    let with = |name: &str, value: Option<AMQPValue>| {
        let mut headers = good().headers().clone().unwrap();
        let mut table = std::collections::BTreeMap::new();
        for (k, v) in headers.inner() {
            if k.as_str() != name {
                table.insert(k.clone(), v.clone());
            }
        }
        if let Some(value) = value {
            table.insert(name.into(), value);
        }
        headers = FieldTable::from(table);
        good().with_headers(headers)
    };
    let invalid: Vec<(&str, BasicProperties)> = vec![
        (
            "no message id",
            BasicProperties::default().with_headers(FieldTable::default()),
        ),
        (
            "no headers",
            BasicProperties::default().with_message_id("evt-1".into()),
        ),
        (
            "an id that is not one",
            good().with_message_id("two words".into()),
        ),
        ("no version", with("surely-version", None)),
        ("a version in text", with("surely-version", Some(text("3")))),
        ("no kind", with("surely-kind", None)),
        (
            "a kind that is not one",
            with("surely-kind", Some(text("Order Created"))),
        ),
        (
            "an aggregate that is not UTF-8",
            with(
                "surely-aggregate",
                Some(AMQPValue::LongString(LongString::from(vec![0xff, 0xfe]))),
            ),
        ),
        (
            "a header that is not text",
            with("x-flag", Some(AMQPValue::Boolean(true))),
        ),
        (
            "an array holding a number",
            with(
                "x-trace",
                Some(AMQPValue::FieldArray(FieldArray::from(vec![
                    text("a"),
                    AMQPValue::LongInt(1),
                ]))),
            ),
        ),
        (
            "a header value with a control character",
            with("x-note", Some(text("line\nbreak"))),
        ),
    ];
    for (what, properties) in invalid {
        let err = read(properties).unwrap_err();
        assert!(
            err.to_string().starts_with("invalid event"),
            "{what}: {err}"
        );
    }
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// The relay publishes, then dies before it marks the event: after the lease another round
/// publishes it again, with the same message id. RabbitMQ keeps both copies (it has no
/// duplicate window); the consumer's inbox applies the event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_the_relay_did_not_mark_goes_out_again_and_the_inbox_applies_it_once() {
    let topology = Topology::new(
        "a_publish_the_relay_did_not_mark_goes_out_again_and_the_inbox_applies_it_once",
        Some("orders.#"),
    )
    .await;
    let outbox = MemoryOutbox::new();
    outbox.enqueue(event(1));
    let lease = Duration::from_millis(200);
    let mut publisher = publisher(&topology).await;
    // The dying relay: claims, publishes, and never marks.
    let held = outbox.claim(10, lease).await.unwrap();
    publish(&mut publisher, held[0].event.clone())
        .await
        .unwrap();
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let mut relay = Relay::builder(outbox.clone(), publisher.clone())
        .lease(lease)
        .build()
        .unwrap();
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    let delivered = topology.drain().await;
    assert_eq!(delivered.len(), 2, "RabbitMQ keeps every copy");
    let inbox = MemoryInbox::new();
    let mut applied = 0;
    for delivery in &delivered {
        let event = Event::from_amqp(delivery).unwrap();
        assert_eq!(&event, &held[0].event);
        let processed = inbox
            .process("inventory", &event, Versions::InOrder, || async {
                applied += 1;
                Ok::<_, std::io::Error>(bytes::Bytes::from("reserved"))
            })
            .await
            .unwrap();
        assert!(processed.is_settled(), "{processed:?}");
    }
    assert_eq!(applied, 1, "applied once");
    assert_eq!(inbox.stats().duplicates, 1);
    topology.delete().await;
}

/// No queue takes the routing key: RabbitMQ returns the mandatory message and then confirms
/// it. That is a failed publish, not a published event: retried, then quarantined, never
/// marked published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_no_queue_takes_is_retried_then_quarantined_never_published() {
    let topology = Topology::new(
        "an_event_no_queue_takes_is_retried_then_quarantined_never_published",
        None,
    )
    .await;
    let mut publisher = publisher(&topology).await;
    let err = publish(&mut publisher, event(9)).await.unwrap_err();
    assert!(err.is_returned(), "{err}");
    assert!(!err.is_unknown() && !err.is_timeout(), "{err}");
    assert_classified(&err, AttemptClass::Final, DeliveryPhase::ResponseStarted);
    assert!(err.to_string().contains("no queue took it"), "{err}");
    let outbox = MemoryOutbox::new();
    let e = event(1);
    outbox.enqueue(e.clone());
    let retry = Duration::from_millis(100);
    let mut relay = Relay::builder(outbox.clone(), publisher)
        .retry_after(retry)
        .quarantine_after(2)
        .build()
        .unwrap();
    let first = relay.run_once().await.unwrap();
    assert_eq!((first.published, first.failed), (0, 1));
    assert!(
        outbox
            .last_error(e.id())
            .is_some_and(|why| why.contains("312 NO_ROUTE")),
        "{:?}",
        outbox.last_error(e.id())
    );
    tokio::time::sleep(retry * 2).await;
    let second = relay.run_once().await.unwrap();
    assert_eq!((second.published, second.quarantined), (0, 1));
    let stats = outbox.stats_now();
    assert_eq!((stats.backlog, stats.quarantined), (0, 1));
    tokio::time::sleep(retry * 2).await;
    assert_eq!(relay.run_once().await.unwrap().claimed, 0, "quarantined");
    topology.delete().await;
}

/// A batch where every other event has a kind no queue takes: the events RabbitMQ returned
/// fail and the others are published, each one told apart however the broker groups its
/// confirms (it may acknowledge several messages at once, after a return).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_and_routed_events_of_one_batch_are_told_apart() {
    let topology = Topology::new(
        "returned_and_routed_events_of_one_batch_are_told_apart",
        Some("orders.OrderCreated"),
    )
    .await;
    let publisher = publisher(&topology).await;
    let outbox = MemoryOutbox::new();
    let mut relay = Relay::builder(outbox.clone(), publisher)
        .batch(40)
        .quarantine_after(1)
        .build()
        .unwrap();
    let mut routed = Vec::new();
    for round in 0..5u32 {
        let mut returned = Vec::new();
        for i in 0..40 {
            let n = round * 40 + i;
            let e = if i % 2 == 0 || i % 7 == 3 {
                routed.push(of_kind(n, "OrderCreated"));
                of_kind(n, "OrderCreated")
            } else {
                returned.push(of_kind(n, "OrderCancelled"));
                of_kind(n, "OrderCancelled")
            };
            outbox.enqueue(e);
        }
        let done = relay.run_once().await.unwrap();
        assert_eq!(
            (done.published, done.failed),
            (40 - returned.len(), returned.len()),
            "round {round}"
        );
        for e in &returned {
            let why = outbox.last_error(e.id());
            assert!(
                why.as_deref()
                    .is_some_and(|w| w.contains("no queue took it")),
                "round {round}: {:?} {why:?}",
                e.id()
            );
        }
    }
    let delivered: Vec<Event> = topology
        .drain()
        .await
        .iter()
        .map(|d| Event::from_amqp(d).unwrap())
        .collect();
    assert_eq!(delivered, routed, "the routed ones, each once, in order");
    topology.delete().await;
}

/// The exchange is deleted under the publisher: RabbitMQ closes the channel, the publish fails
/// (an error, not a panic), and once the exchange is back the next publish opens a new channel
/// and goes through. A publisher to an exchange that does not exist is refused at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_exchange_fails_the_publish_and_the_next_one_opens_a_new_channel() {
    let topology = Topology::new(
        "a_missing_exchange_fails_the_publish_and_the_next_one_opens_a_new_channel",
        Some("orders.#"),
    )
    .await;
    let mut publisher = publisher(&topology).await;
    publish(&mut publisher, event(1)).await.unwrap();
    topology.delete_exchange().await;
    let err = publish(&mut publisher, event(2)).await.unwrap_err();
    assert!(err.broker_error().is_some(), "{err}");
    assert!(cause_once(&err).contains("NOT_FOUND"), "{err}");
    topology.redeclare("orders.#").await;
    publish(&mut publisher, event(3)).await.unwrap();
    assert_eq!(
        delivered_ids(&topology).await,
        [event(1).id().clone(), event(3).id().clone()]
    );
    let err = RabbitPublisher::builder(rabbitmq::url(), format!("{}_nowhere", topology.exchange))
        .connect()
        .await
        .unwrap_err();
    assert!(cause_once(&err).contains("NOT_FOUND"), "{err}");
    topology.delete().await;
}

/// lapin's error, which `err` returns as its source and does not repeat in its message.
fn cause_once(err: &RabbitError) -> String {
    let source = std::error::Error::source(err).expect("lapin's error as the source");
    let cause = source.to_string();
    assert!(!err.to_string().contains(&cause), "{err}: {cause}");
    let broker = err.broker_error().map(ToString::to_string);
    assert_eq!(broker.as_deref(), Some(cause.as_str()));
    cause
}

/// The network fails under the publisher while a confirm is on its way: the publish fails at
/// once (the confirm cannot come), and the next publish opens a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_under_a_publish_fails_it_and_the_next_one_reconnects() {
    let topology = Topology::new(
        "a_connection_cut_under_a_publish_fails_it_and_the_next_one_reconnects",
        Some("orders.#"),
    )
    .await;
    let proxy = Proxy::start(rabbitmq::address()).await;
    let timeout = Duration::from_secs(10);
    let mut publisher = publisher_through(&proxy, &topology, timeout).await;
    publish(&mut publisher, event(1)).await.unwrap();
    proxy.hold_replies(true);
    let mut cut_under = publisher.clone();
    let pending = tokio::spawn(async move { publish(&mut cut_under, event(2)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The confirm is held in the proxy: cut, it never reaches the publisher.
    proxy.cut();
    let started = tokio::time::Instant::now();
    let err = pending.await.unwrap().unwrap_err();
    assert!(started.elapsed() < timeout / 2, "failed at once: {err}");
    assert!(err.is_unknown() && !err.is_timeout(), "{err}");
    assert_classified(&err, AttemptClass::MaybeCommitted, DeliveryPhase::Sent);
    proxy.hold_replies(false);
    publish(&mut publisher, event(3)).await.unwrap();
    let delivered = topology.drain().await;
    let last = Event::from_amqp(delivered.last().unwrap()).unwrap();
    assert_eq!(last.id(), event(3).id());
    topology.delete().await;
}

/// RabbitMQ's confirm does not come in time: the publish fails as unknown (the message did
/// reach the queue), and the next publish goes out on a new channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_that_does_not_come_in_time_is_an_unknown_publish() {
    let topology = Topology::new(
        "a_confirm_that_does_not_come_in_time_is_an_unknown_publish",
        Some("orders.#"),
    )
    .await;
    let proxy = Proxy::start(rabbitmq::address()).await;
    let mut publisher = publisher_through(&proxy, &topology, Duration::from_millis(300)).await;
    proxy.hold_replies(true);
    let err = publish(&mut publisher, event(1)).await.unwrap_err();
    assert!(err.is_timeout() && err.is_unknown(), "{err}");
    assert!(err.to_string().contains("no confirm"), "{err}");
    assert_classified(&err, AttemptClass::MaybeCommitted, DeliveryPhase::Sent);
    proxy.hold_replies(false);
    publish(&mut publisher, event(2)).await.unwrap();
    assert_eq!(
        delivered_ids(&topology).await,
        [event(1).id().clone(), event(2).id().clone()],
        "the unconfirmed one was routed after all"
    );
    topology.delete().await;
}

/// Headers the publisher writes or RabbitMQ acts on, a header too large for a frame, a routing
/// key or content type over 255 bytes: refused with nothing sent, and the connection stays up.
/// Text that is not ASCII, and repeated headers, go through and come back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_and_oversized_headers_are_refused_and_others_kept() {
    let topology = Topology::new(
        "reserved_and_oversized_headers_are_refused_and_others_kept",
        Some("#"),
    )
    .await;
    let mut publisher = publisher(&topology).await;
    for reserved in [
        "surely-version",
        "Surely-Kind",
        "surely-other",
        "CC",
        "bcc",
        "x-death",
        "x-first-death-queue",
        "x-delay",
    ] {
        let err = publish(&mut publisher, event(1).with_header(reserved, "x").unwrap())
            .await
            .unwrap_err();
        assert!(err.is_invalid_event(), "{reserved}: {err}");
        assert!(err.to_string().contains(reserved), "{err}");
    }
    let huge = event(2).with_header("x-blob", "é".repeat(100_000)).unwrap();
    let err = publish(&mut publisher, huge).await.unwrap_err();
    assert!(err.is_invalid_event(), "{err}");
    assert!(err.to_string().contains("frame"), "{err}");
    let long_type = of_kind(3, "OrderCreated")
        .with_header("Content-Type", "t".repeat(256))
        .unwrap();
    let err = publish(&mut publisher, long_type).await.unwrap_err();
    assert!(err.is_invalid_event(), "{err}");
    let mut long_key = RabbitPublisher::builder(rabbitmq::url(), topology.exchange.clone())
        .routing_prefix("p".repeat(200))
        .connect()
        .await
        .unwrap();
    let long_kind = Event::new(EventId::derive("k", "K"), "a", 1, "K".repeat(100), "").unwrap();
    let err = publish(&mut long_key, long_kind).await.unwrap_err();
    assert!(err.is_invalid_event(), "{err}");
    assert!(topology.get().await.is_none(), "nothing sent");
    let kept = event(4)
        .with_header("x-note", "crème brûlée ✓ 注文")
        .unwrap()
        .with_header("x-trace", "a")
        .unwrap()
        .with_header("x-trace", "b")
        .unwrap()
        .with_header("x-big", "v".repeat(60_000))
        .unwrap();
    publish(&mut publisher, kept.clone()).await.unwrap();
    let delivery = topology.get().await.expect("published");
    // An AMQP table keeps its names sorted: the headers come back sorted by name.
    let mut sorted = kept.headers().to_vec();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut expected = Event::new(
        kept.id().clone(),
        kept.aggregate(),
        kept.version(),
        kept.kind(),
        kept.payload().clone(),
    )
    .unwrap();
    for (name, value) in sorted {
        expected = expected.with_header(name, value).unwrap();
    }
    assert_eq!(Event::from_amqp(&delivery).unwrap(), expected);
    topology.delete().await;
}

/// Settings that cannot work are refused at connect; a broker that is not there fails it,
/// within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_and_an_absent_broker_fail_connect() {
    let err = RabbitPublisher::builder("http://nowhere", "orders")
        .connect()
        .await
        .unwrap_err();
    assert!(err.is_config(), "{err}");
    let err = RabbitPublisher::builder(rabbitmq::url(), "orders")
        .timeout(Duration::ZERO)
        .connect()
        .await
        .unwrap_err();
    assert!(err.is_config(), "{err}");
    let err = RabbitPublisher::builder(rabbitmq::url(), "e".repeat(256))
        .connect()
        .await
        .unwrap_err();
    assert!(err.is_config(), "{err}");
    let closed = crate::support::serve::closed_port();
    let started = tokio::time::Instant::now();
    let err = RabbitPublisher::builder(rabbitmq::url_through(closed), "orders")
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(!err.is_config(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3), "{err}");
}

/// A queue that refuses what it has no room for (`x-overflow: reject-publish`): RabbitMQ
/// answers with a negative confirm, and the publish fails; the relay tries again later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_confirm_fails_the_publish() {
    use surely::deps::lapin::options::{QueueBindOptions, QueueDeclareOptions};

    let topology = Topology::new("a_negative_confirm_fails_the_publish", None).await;
    let full = format!("{}_full", topology.queue);
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongInt(1));
    arguments.insert("x-overflow".into(), text("reject-publish"));
    let options = QueueDeclareOptions {
        exclusive: true,
        ..QueueDeclareOptions::default()
    };
    let channel = &topology.channel;
    channel
        .queue_declare(full.clone().into(), options, arguments)
        .await
        .unwrap();
    channel
        .queue_bind(
            full.clone().into(),
            topology.exchange.clone().into(),
            "orders.#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut publisher = publisher(&topology).await;
    publish(&mut publisher, event(1)).await.unwrap();
    let err = publish(&mut publisher, event(2)).await.unwrap_err();
    assert!(err.is_nacked() && !err.is_returned(), "{err}");
    assert_classified(&err, AttemptClass::Rejected, DeliveryPhase::ResponseStarted);
    let outbox = MemoryOutbox::new();
    outbox.enqueue(event(3));
    let mut relay = Relay::builder(outbox.clone(), publisher).build().unwrap();
    let round = relay.run_once().await.unwrap();
    assert_eq!((round.published, round.failed), (0, 1));
    assert_eq!(outbox.stats_now().backlog, 1, "waits to go again");
    channel
        .queue_delete(full.into(), Default::default())
        .await
        .unwrap();
    topology.delete().await;
}

/// RabbitMQ closes the publisher's connection (`rabbitmqctl close_connection`, as an operator
/// or a broker shutting down does): the next publish opens a new connection and goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_broker_closes_is_opened_again() {
    use surely::deps::lapin::ConnectionProperties;

    let topology = Topology::new(
        "a_connection_the_broker_closes_is_opened_again",
        Some("orders.#"),
    )
    .await;
    // Named, so that this test closes its own connection and no other.
    let name = crate::support::names::unique("surely_publisher");
    let mut publisher = RabbitPublisher::builder(rabbitmq::url(), topology.exchange.clone())
        .routing_prefix("orders")
        .properties(ConnectionProperties::default().with_connection_name(name.clone().into()))
        .connect()
        .await
        .unwrap();
    publish(&mut publisher, event(1)).await.unwrap();
    rabbitmq::close_connection(&name).await;
    // The broker's close reaches the publisher on its own time: publishes until one has gone
    // through on a new connection, none hanging.
    let mut failures = 0;
    let mut published = Vec::new();
    for n in 2..=40 {
        match tokio::time::timeout(Duration::from_secs(10), publish(&mut publisher, event(n)))
            .await
            .expect("no publish hangs")
        {
            Ok(()) => published.push(event(n).id().clone()),
            Err(e) => {
                assert!(!e.is_timeout(), "{e}");
                failures += 1;
            }
        }
        if published.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(published.len() >= 2, "{failures} failures");
    let ids = delivered_ids(&topology).await;
    assert!(ids.ends_with(&published), "{ids:?} {published:?}");
    assert_eq!(
        rabbitmq::connections_named(&name).await,
        1,
        "one connection now, the new one"
    );
    topology.delete().await;
}

proptest::proptest! {
    /// Every publish timeout past `MAX_DURATION` (`Duration::MAX` among them, whose deadline
    /// once overflowed the clock and panicked) is refused at connect, naming the setting,
    /// before anything is opened.
    #[test]
    fn a_timeout_past_ten_years_is_refused_not_a_panic(
        secs in surely::MAX_DURATION.as_secs()..=u64::MAX,
        nanos in 0u32..1_000_000_000,
        max in proptest::bool::ANY,
    ) {
        let timeout = if max { Duration::MAX } else { Duration::new(secs, nanos) };
        proptest::prop_assume!(timeout > surely::MAX_DURATION);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let err = runtime
            .block_on(RabbitPublisher::builder(rabbitmq::url(), "orders").timeout(timeout).connect())
            .unwrap_err();
        proptest::prop_assert!(err.is_config(), "{}", err);
        proptest::prop_assert_eq!(
            err.to_string(),
            "invalid RabbitMQ publish timeout: must be at most ten years"
        );
    }
}

/// The longest timeout accepted, ten years, sets its deadline without overflow: connecting to
/// a broker that is not there fails as a connection, not as a setting, and not by a panic.
#[tokio::test]
async fn the_longest_timeout_accepted_is_no_panic() {
    let closed = crate::support::serve::closed_port();
    let err = RabbitPublisher::builder(rabbitmq::url_through(closed), "orders")
        .timeout(surely::MAX_DURATION)
        .connect()
        .await
        .unwrap_err();
    assert!(!err.is_config() && !err.is_timeout(), "{err}");
    assert_classified(&err, AttemptClass::Rejected, DeliveryPhase::NotSent);
}

/// `err` as a relay's classifier reads it (`RabbitError: ClassifyError`), whatever phase the
/// caller thought the publish had reached.
fn assert_classified(err: &RabbitError, class: AttemptClass, phase: DeliveryPhase) {
    for assumed in [DeliveryPhase::NotSent, DeliveryPhase::Sent] {
        let c = err.classify_error(assumed);
        assert_eq!((c.class(), c.phase()), (class, phase), "{err}");
    }
}
