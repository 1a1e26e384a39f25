//! The RabbitMQ publisher over the real broker of the machine (`SURELY_TEST_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`; the tests fail if it does not answer). Real time,
//! short waits: the broker's clock and timers are its own.

use surely::deps::lapin::message::Delivery;
use surely::deps::lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use surely::deps::lapin::BasicProperties;
use surely::outbox::{Event, MemoryOutbox, RabbitPublisher, Relay};

use super::event;
use crate::support::rabbitmq::{self, Topology};

/// A publisher to the test's exchange, with keys `orders.<kind>`.
async fn publisher(topology: &Topology) -> RabbitPublisher {
    RabbitPublisher::builder(rabbitmq::url(), topology.exchange.clone())
        .routing_prefix("orders")
        .connect()
        .await
        .unwrap()
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
