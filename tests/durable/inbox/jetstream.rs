//! The seed's fault tests across the asynchronous boundary, over the real PostgreSQL and NATS
//! JetStream of the machine: an order and its event committed together (outbox), a relay that
//! crashes after publishing and before marking, a consumer that crashes after committing and
//! before acknowledging; in every case the stock changes once. Real time, short waits on the
//! broker's redelivery timer.

use std::time::Duration;

use surely::deps::async_nats::jetstream::{self, consumer};
use surely::inbox::{PostgresInbox, Processed, Versions};
use surely::outbox::{Event, EventId, JetStreamPublisher, OutboxStore, PostgresOutbox, Relay};
use tokio_stream::StreamExt;

use super::{forget_outbox_and_inbox, outbox_and_inbox};
use crate::support::names::suffix;
use crate::support::nats;

/// Everything one test needs, in names of its own.
struct World {
    outbox: PostgresOutbox,
    inbox: PostgresInbox,
    stock: String,
    js: jetstream::Context,
    stream: String,
    consumer: consumer::PullConsumer,
}

const ACK_WAIT: Duration = Duration::from_secs(1);

impl World {
    async fn new(test: &str) -> World {
        let s = suffix();
        let (pool, outbox, inbox) = outbox_and_inbox(test, "surely_e2e", &s).await;
        let stock = format!("surely_e2e_stock_{s}");
        pool.get()
            .await
            .unwrap()
            .batch_execute(&format!(
                "CREATE TABLE {stock} (sku text PRIMARY KEY, qty bigint NOT NULL);
                 INSERT INTO {stock} VALUES ('sku-42', 100);
                 CREATE TABLE {stock}_orders (id text PRIMARY KEY);"
            ))
            .await
            .unwrap();
        let js = nats::jetstream(test).await;
        let name = format!("surely_e2e_{s}");
        let st = nats::stream(&js, test, &name).await;
        let consumer = st
            .create_consumer(consumer::pull::Config {
                durable_name: Some("inventory".to_owned()),
                ack_wait: ACK_WAIT,
                ..Default::default()
            })
            .await
            .unwrap();
        World {
            outbox,
            inbox,
            stock,
            js,
            stream: name,
            consumer,
        }
    }

    /// The order service: the order and its event, in one transaction.
    async fn place_order(&self, id: &str) -> Event {
        let event = Event::new(
            EventId::derive(&format!("order {id}"), "OrderCreated"),
            format!("order {id}"),
            1,
            "OrderCreated",
            "sku-42",
        )
        .unwrap();
        let mut client = self.outbox.pool().get().await.unwrap();
        let txn = client.transaction().await.unwrap();
        txn.execute(
            &format!("INSERT INTO {}_orders (id) VALUES ($1)", self.stock),
            &[&id],
        )
        .await
        .unwrap();
        self.outbox.enqueue(&txn, &event).await.unwrap();
        txn.commit().await.unwrap();
        event
    }

    fn publisher(&self) -> JetStreamPublisher {
        JetStreamPublisher::new(self.js.clone(), self.stream.clone())
    }

    /// The messages waiting for the consumer now (at most 10, waiting at most 300 ms).
    async fn fetch(&self) -> Vec<jetstream::Message> {
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(10)
            .expires(Duration::from_millis(300))
            .messages()
            .await
            .unwrap();
        let mut out = Vec::new();
        while let Some(m) = batch.next().await {
            out.push(m.unwrap());
        }
        out
    }

    /// The inventory consumer: one unit reserved per event.
    async fn consume(&self, message: &jetstream::Message) -> Processed {
        let sql = format!(
            "UPDATE {} SET qty = qty - 1 WHERE sku = 'sku-42'",
            self.stock
        );
        self.inbox
            .process_jetstream(message, "inventory", Versions::Any, move |txn| {
                Box::pin(async move {
                    txn.execute(&sql, &[]).await?;
                    Ok::<_, tokio_postgres::Error>("reserved".into())
                })
            })
            .await
            .unwrap()
    }

    async fn qty(&self) -> i64 {
        self.outbox
            .pool()
            .get()
            .await
            .unwrap()
            .query_one(
                &format!("SELECT qty FROM {} WHERE sku = 'sku-42'", self.stock),
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    async fn forget(self) {
        let s = &self.stock;
        forget_outbox_and_inbox(&self.outbox, &self.inbox, &[s, &format!("{s}_orders")]).await;
        self.js.delete_stream(&self.stream).await.unwrap();
    }
}

/// The relay publishes, then crashes before it marks: after its lease the event goes out again
/// with the same id; JetStream keeps one copy, the consumer sees one message, and the stock
/// changes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_crash_after_publish_changes_the_stock_once() {
    let w = World::new("a_relay_crash_after_publish_changes_the_stock_once").await;
    let event = w.place_order("o-1").await;
    let lease = Duration::from_millis(200);
    // The relay that dies: claims, publishes, never marks.
    let held = w.outbox.claim(10, lease).await.unwrap();
    use tower::{Service, ServiceExt};
    let mut publisher = w.publisher();
    publisher
        .ready()
        .await
        .unwrap()
        .call(held[0].event.clone())
        .await
        .unwrap();
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    // The relay that takes over.
    let mut relay = Relay::builder(w.outbox.clone(), w.publisher())
        .lease(lease)
        .build()
        .unwrap();
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    let messages = w.fetch().await;
    assert_eq!(messages.len(), 1, "JetStream dropped the second publish");
    assert_eq!(
        w.consume(&messages[0]).await,
        Processed::Applied("reserved".into())
    );
    assert_eq!(w.qty().await, 99);
    assert_eq!(Event::from_nats(&messages[0]).unwrap(), event);
    w.forget().await;
}

/// The consumer commits, then crashes before it acknowledges: JetStream redelivers after its
/// ack wait, the inbox finds the record, and the stock changed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_crash_after_commit_changes_the_stock_once() {
    let w = World::new("a_consumer_crash_after_commit_changes_the_stock_once").await;
    w.place_order("o-1").await;
    let mut relay = Relay::builder(w.outbox.clone(), w.publisher())
        .build()
        .unwrap();
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    // The consumer that dies: its transaction commits, its acknowledgement never goes.
    let first = w.fetch().await;
    assert_eq!(first.len(), 1);
    let event = Event::from_nats(&first[0]).unwrap();
    {
        let mut client = w.inbox.pool().get().await.unwrap();
        let txn = client.transaction().await.unwrap();
        let sql = format!("UPDATE {} SET qty = qty - 1 WHERE sku = 'sku-42'", w.stock);
        let processed = w
            .inbox
            .process(&txn, "inventory", &event, Versions::Any, move |txn| {
                Box::pin(async move {
                    txn.execute(&sql, &[]).await?;
                    Ok::<_, tokio_postgres::Error>("reserved".into())
                })
            })
            .await
            .unwrap();
        assert!(matches!(processed, Processed::Applied(_)));
        txn.commit().await.unwrap();
    }
    drop(first);
    tokio::time::sleep(ACK_WAIT + Duration::from_millis(200)).await;
    // The redelivery: a duplicate, acknowledged this time.
    let again = w.fetch().await;
    assert_eq!(again.len(), 1, "redelivered after the ack wait");
    assert_eq!(
        w.consume(&again[0]).await,
        Processed::Duplicate("reserved".into())
    );
    assert_eq!(w.qty().await, 99);
    tokio::time::sleep(ACK_WAIT + Duration::from_millis(200)).await;
    assert!(
        w.fetch().await.is_empty(),
        "acknowledged: not delivered again"
    );
    assert_eq!(w.inbox.stats().duplicates, 1);
    w.forget().await;
}

/// A message no relay published is terminated, not redelivered forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_is_not_an_event_is_terminated() {
    let w = World::new("a_message_that_is_not_an_event_is_terminated").await;
    w.js.publish(format!("{}.Junk", w.stream), "not an event".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let junk = w.fetch().await;
    assert_eq!(junk.len(), 1);
    let err = w
        .inbox
        .process_jetstream(&junk[0], "inventory", Versions::Any, |_txn| {
            Box::pin(async { Ok::<_, std::io::Error>("never".into()) })
        })
        .await
        .unwrap_err();
    assert!(err.to_string().starts_with("not an event"), "{err}");
    tokio::time::sleep(ACK_WAIT + Duration::from_millis(200)).await;
    assert!(w.fetch().await.is_empty());
    assert_eq!(w.qty().await, 100);
    w.forget().await;
}
