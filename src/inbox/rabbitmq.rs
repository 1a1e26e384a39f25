//! Consuming from RabbitMQ into a PostgreSQL inbox: acknowledged only once committed.

use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};

use super::delivered::Answer;
use super::postgres::{Handler, InboxTransaction};
use super::{InboxError, PostgresInbox, Processed, Versions};
use crate::outbox::Event;

/// How long a parked event (a version gap) is held before it goes back to its queue: RabbitMQ
/// redelivers a requeued message at once, so the wait is the consumer's.
const PARKED_REQUEUE: Duration = Duration::from_secs(1);

impl PostgresInbox {
    /// Processes one RabbitMQ delivery, published by a
    /// [`RabbitPublisher`](crate::outbox::RabbitPublisher), for `consumer` (features
    /// `postgres` and `rabbitmq`). It runs `handler` in a transaction of its own with the
    /// inbox's record ([`process_and_commit`](Self::process_and_commit): the handler writes
    /// through the [`InboxTransaction`] it is given), commits, and only then acknowledges the
    /// delivery (`basic.ack`). The delivery must come from a consumer with manual
    /// acknowledgements (`no_ack: false`), on a channel whose prefetch is bounded
    /// (`basic.qos`), so that a slow handler holds a bounded number of messages.
    ///
    /// * A consumer that dies after the commit and before the acknowledgement leaves the
    ///   message unacknowledged: RabbitMQ delivers it again (to this consumer's successor, with
    ///   `redelivered` set), the inbox finds its record, the handler does not run, and it is
    ///   acknowledged.
    /// * A handler or store that fails rolls back, and the delivery is acknowledged negatively
    ///   with `requeue`: RabbitMQ delivers it again.
    /// * A parked event (a version gap) is held a second, then requeued, to come back after
    ///   the missing one.
    /// * A message that is not an event of the relay's is acknowledged negatively without
    ///   `requeue`: RabbitMQ moves it to the queue's dead-letter exchange if it has one
    ///   (`x-dead-letter-exchange`), and drops it otherwise; the error says why.
    ///
    /// ```no_run
    /// # async fn consume(inbox: surely::inbox::PostgresInbox, channel: surely::deps::lapin::Channel)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use surely::deps::lapin::options::{BasicConsumeOptions, BasicQosOptions};
    /// use surely::deps::lapin::types::FieldTable;
    /// use surely::inbox::Versions;
    /// use tokio_stream::StreamExt;
    ///
    /// // At most 16 messages unacknowledged at once.
    /// channel.basic_qos(16, BasicQosOptions::default()).await?;
    /// let mut deliveries = channel
    ///     .basic_consume("inventory".into(), "inventory".into(), BasicConsumeOptions::default(), FieldTable::default())
    ///     .await?;
    /// while let Some(delivery) = deliveries.next().await {
    ///     let processed = inbox
    ///         .process_amqp(&delivery?, "inventory", Versions::InOrder, |txn| {
    ///             Box::pin(async move {
    ///                 txn.execute("UPDATE stock SET qty = qty - 1 WHERE sku = $1", &[&"sku-42"]).await?;
    ///                 Ok::<_, tokio_postgres::Error>("reserved".into())
    ///             })
    ///         })
    ///         .await;
    ///     println!("{processed:?}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The delivery is not an event, the handler failed, or the store did; the delivery was
    /// acknowledged negatively accordingly.
    pub async fn process_amqp<F, E>(
        &self,
        delivery: &Delivery,
        consumer: &str,
        versions: Versions,
        handler: F,
    ) -> Result<Processed, InboxError<E>>
    where
        F: for<'t> FnOnce(&'t InboxTransaction) -> Handler<'t, E>,
    {
        let event = match Event::from_amqp(delivery) {
            Ok(event) => event,
            Err(e) => {
                nack(delivery, false).await;
                return Err(InboxError::Malformed(e));
            }
        };
        self.process_and_answer(&AmqpAnswer(delivery), &event, consumer, versions, handler)
            .await
    }
}

/// RabbitMQ's answers: `basic.ack`, and `basic.nack` with requeue for a parked event (after
/// [`PARKED_REQUEUE`]: RabbitMQ redelivers at once) or a failure.
struct AmqpAnswer<'a>(&'a Delivery);

impl Answer for AmqpAnswer<'_> {
    async fn settled(&self, event: &Event) {
        if let Err(e) = self.0.acker.ack(BasicAckOptions::default()).await {
            // Committed: the redelivery will find the record.
            tracing::warn!(event = %event.id(), error = &e as &dyn std::error::Error, "inbox: acknowledgement not sent");
        }
    }

    async fn parked(&self) {
        tokio::time::sleep(PARKED_REQUEUE).await;
        nack(self.0, true).await;
    }

    async fn failed(&self) {
        nack(self.0, true).await;
    }
}

/// Acknowledges `delivery` negatively, requeued or not; a failure leaves it to RabbitMQ, which
/// delivers it again once the channel closes.
async fn nack(delivery: &Delivery, requeue: bool) {
    let options = BasicNackOptions {
        requeue,
        multiple: false,
    };
    if let Err(e) = delivery.acker.nack(options).await {
        tracing::warn!(
            error = &e as &dyn std::error::Error,
            "inbox: negative acknowledgement not sent"
        );
    }
}
