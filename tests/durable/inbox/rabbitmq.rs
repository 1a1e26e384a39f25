//! RabbitMQ into the PostgreSQL inbox, on the machine's broker and database: deliveries
//! acknowledged only after the inbox's commit, a consumer killed between the commit and the
//! acknowledgement, a handler that fails and is delivered again, a message that is not an
//! event dead-lettered, and the prefetch that bounds what a consumer holds.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use surely::deps::lapin::message::Delivery;
use surely::deps::lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use surely::deps::lapin::types::{AMQPValue, FieldTable};
use surely::deps::lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, Consumer, ExchangeKind,
};
use surely::inbox::{InboxError, PostgresInbox, Processed, Versions};
use surely::outbox::{Event, EventId, RabbitPublisher};
use tokio_stream::StreamExt;
use tower::{Service, ServiceExt};

use super::{forget_outbox_and_inbox, outbox_and_inbox};
use crate::support::names::suffix;
use crate::support::rabbitmq;

/// One test's world: an inbox and a stock table, an exchange and a durable queue bound to it
/// (and a dead-letter exchange and queue for what is refused).
struct World {
    outbox: surely::outbox::PostgresOutbox,
    inbox: PostgresInbox,
    stock: String,
    admin: Channel,
    _admin_connection: Connection,
    exchange: String,
    queue: String,
    dead: String,
}

impl World {
    async fn new(test: &str) -> World {
        let s = suffix();
        let (pool, outbox, inbox) = outbox_and_inbox(test, "surely_amqp", &s).await;
        let stock = format!("surely_amqp_stock_{s}");
        pool.get()
            .await
            .unwrap()
            .batch_execute(&format!(
                "CREATE TABLE {stock} (sku text PRIMARY KEY, qty bigint NOT NULL);
                 INSERT INTO {stock} VALUES ('sku-42', 100);"
            ))
            .await
            .unwrap();
        let connection = connect(test).await;
        let admin = connection.create_channel().await.unwrap();
        let exchange = format!("surely_amqp_{s}");
        let queue = format!("surely_amqp_{s}");
        let dead = format!("surely_amqp_dead_{s}");
        for (name, kind) in [
            (&exchange, ExchangeKind::Topic),
            (&dead, ExchangeKind::Fanout),
        ] {
            admin
                .exchange_declare(
                    name.clone().into(),
                    kind,
                    ExchangeDeclareOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
        let mut args = FieldTable::default();
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(dead.clone().into()),
        );
        for (q, args, x, key) in [
            (&queue, args, &exchange, "#"),
            (&dead, FieldTable::default(), &dead, ""),
        ] {
            admin
                .queue_declare(q.clone().into(), QueueDeclareOptions::default(), args)
                .await
                .unwrap();
            admin
                .queue_bind(
                    q.clone().into(),
                    x.clone().into(),
                    key.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
        World {
            outbox,
            inbox,
            stock,
            admin,
            _admin_connection: connection,
            exchange,
            queue,
            dead,
        }
    }

    /// Publishes `event` through a relay's publisher.
    async fn publish(&self, event: Event) {
        let mut publisher = RabbitPublisher::builder(rabbitmq::url(), self.exchange.clone())
            .connect()
            .await
            .unwrap();
        publisher.ready().await.unwrap().call(event).await.unwrap();
    }

    /// A consumer of the queue on a connection of its own, manual acknowledgements, at most
    /// `prefetch` unacknowledged.
    async fn consumer(&self, test: &str, prefetch: u16) -> (Connection, Consumer) {
        let connection = connect(test).await;
        let channel = connection.create_channel().await.unwrap();
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .unwrap();
        let consumer = channel
            .basic_consume(
                self.queue.clone().into(),
                "inventory".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (connection, consumer)
    }

    /// The inventory consumer's handler: one unit reserved, or an error for the first `fail`
    /// runs.
    async fn consume(
        &self,
        delivery: &Delivery,
        fail: Arc<AtomicUsize>,
    ) -> Result<Processed, InboxError<std::io::Error>> {
        let sql = format!(
            "UPDATE {} SET qty = qty - 1 WHERE sku = 'sku-42'",
            self.stock
        );
        self.inbox
            .process_amqp(delivery, "inventory", Versions::Any, move |txn| {
                Box::pin(async move {
                    if fail
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                    {
                        return Err(std::io::Error::other("the warehouse is down"));
                    }
                    txn.execute(&sql, &[])
                        .await
                        .map_err(std::io::Error::other)?;
                    Ok("reserved".into())
                })
            })
            .await
    }

    async fn qty(&self) -> i64 {
        self.inbox
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

    /// Messages ready in `queue` now.
    async fn ready(&self, queue: &str) -> u32 {
        self.admin
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
            .message_count()
    }

    async fn forget(self) {
        for q in [&self.queue, &self.dead] {
            let _ = self
                .admin
                .queue_delete(q.clone().into(), QueueDeleteOptions::default())
                .await;
        }
        for x in [&self.exchange, &self.dead] {
            let _ = self
                .admin
                .exchange_delete(x.clone().into(), Default::default())
                .await;
        }
        forget_outbox_and_inbox(&self.outbox, &self.inbox, &[&self.stock]).await;
    }
}

async fn connect(test: &str) -> Connection {
    Connection::connect(&rabbitmq::url(), ConnectionProperties::default())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{test}: RabbitMQ at {} did not answer: {e}",
                rabbitmq::address()
            )
        })
}

fn order(n: u32) -> Event {
    Event::new(
        EventId::derive(&format!("order {n}"), "OrderCreated"),
        format!("order {n}"),
        1,
        "OrderCreated",
        "sku-42",
    )
    .unwrap()
}

/// The next delivery, within two seconds.
async fn next(consumer: &mut Consumer) -> Delivery {
    tokio::time::timeout(Duration::from_secs(2), consumer.next())
        .await
        .expect("a delivery within 2 s")
        .expect("the consumer is open")
        .unwrap()
}

/// The consumer commits, then is killed before it acknowledges: RabbitMQ delivers the message
/// again to the next consumer, the inbox finds the record, the handler does not run, and the
/// stock changed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_between_commit_and_ack_changes_the_stock_once() {
    let test = "a_consumer_killed_between_commit_and_ack_changes_the_stock_once";
    let w = World::new(test).await;
    w.publish(order(1)).await;
    let (killed, mut first) = w.consumer(test, 4).await;
    let delivery = next(&mut first).await;
    assert!(!delivery.redelivered);
    // The inbox's transaction commits; the acknowledgement never goes.
    let event = Event::from_amqp(&delivery).unwrap();
    let sql = format!("UPDATE {} SET qty = qty - 1 WHERE sku = 'sku-42'", w.stock);
    let processed = w
        .inbox
        .process_and_commit("inventory", &event, Versions::Any, move |txn| {
            Box::pin(async move {
                txn.execute(&sql, &[]).await?;
                Ok::<_, tokio_postgres::Error>("reserved".into())
            })
        })
        .await
        .unwrap();
    assert_eq!(processed, Processed::Applied("reserved".into()));
    killed.close(0, "killed".into()).await.unwrap();
    drop(first);
    // The next consumer gets it again, as a redelivery, and acknowledges it without running
    // the handler.
    let (_c, mut second) = w.consumer(test, 4).await;
    let again = next(&mut second).await;
    assert!(again.redelivered, "a redelivery");
    let ran = Arc::new(AtomicUsize::new(0));
    assert_eq!(
        w.consume(&again, ran).await.unwrap(),
        Processed::Duplicate("reserved".into())
    );
    assert_eq!(w.qty().await, 99);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), second.next())
            .await
            .is_err(),
        "acknowledged: not delivered again"
    );
    assert_eq!(w.ready(&w.queue).await, 0);
    w.forget().await;
}

/// A handler that fails rolls back, and the delivery goes back to the queue: delivered again,
/// applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_handler_is_requeued_and_applied_once() {
    let test = "a_failed_handler_is_requeued_and_applied_once";
    let w = World::new(test).await;
    w.publish(order(1)).await;
    let (_c, mut consumer) = w.consumer(test, 4).await;
    let fail = Arc::new(AtomicUsize::new(1));
    let first = next(&mut consumer).await;
    let err = w.consume(&first, fail.clone()).await.unwrap_err();
    assert!(err.to_string().contains("the warehouse is down"), "{err}");
    assert_eq!(w.qty().await, 100, "rolled back");
    let again = next(&mut consumer).await;
    assert!(again.redelivered);
    assert_eq!(
        w.consume(&again, fail).await.unwrap(),
        Processed::Applied("reserved".into())
    );
    assert_eq!(w.qty().await, 99);
    w.forget().await;
}

/// A message no relay published is refused without requeue: it goes to the queue's
/// dead-letter exchange, not round and round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_is_not_an_event_is_dead_lettered() {
    let test = "a_message_that_is_not_an_event_is_dead_lettered";
    let w = World::new(test).await;
    w.admin
        .basic_publish(
            w.exchange.clone().into(),
            "junk".into(),
            BasicPublishOptions::default(),
            b"not an event",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let (_c, mut consumer) = w.consumer(test, 4).await;
    let junk = next(&mut consumer).await;
    let err = w
        .consume(&junk, Arc::new(AtomicUsize::new(0)))
        .await
        .unwrap_err();
    assert!(err.to_string().starts_with("not an event"), "{err}");
    let mut dead = 0;
    for _ in 0..20 {
        dead = w.ready(&w.dead).await;
        if dead == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(dead, 1, "dead-lettered");
    assert_eq!(w.ready(&w.queue).await, 0);
    assert_eq!(w.qty().await, 100);
    w.forget().await;
}

/// With a prefetch of 2, a consumer holds at most two unacknowledged deliveries: the third
/// comes only once one is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefetch_bounds_what_a_consumer_holds() {
    let test = "the_prefetch_bounds_what_a_consumer_holds";
    let w = World::new(test).await;
    for n in 1..=5 {
        w.publish(order(n)).await;
    }
    let (_c, mut consumer) = w.consumer(test, 2).await;
    let a = next(&mut consumer).await;
    let _b = next(&mut consumer).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), consumer.next())
            .await
            .is_err(),
        "a third delivery while two are unacknowledged"
    );
    assert_eq!(
        w.consume(&a, Arc::new(AtomicUsize::new(0))).await.unwrap(),
        Processed::Applied("reserved".into())
    );
    let _c3 = next(&mut consumer).await;
    assert_eq!(w.qty().await, 99);
    w.forget().await;
}
