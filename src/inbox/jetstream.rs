//! Consuming from JetStream into a PostgreSQL inbox: acknowledged only once committed.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind};

use super::delivered::Answer;
use super::postgres::{Handler, InboxTransaction};
use super::{Consumer, InboxError, PostgresInbox, Processed, Versions, Wait};
use crate::outbox::Event;

/// How long JetStream waits before it redelivers a parked event.
const PARKED_REDELIVERY: Duration = Duration::from_secs(1);

impl PostgresInbox {
    /// Processes one JetStream message, published by a
    /// [`JetStreamPublisher`](crate::outbox::JetStreamPublisher), for `consumer` (features
    /// `postgres` and `nats`). It runs `handler` in a transaction of its own with the inbox's
    /// record ([`process_and_commit`](Self::process_and_commit): the handler writes through the
    /// [`InboxTransaction`] it is given), commits, and only then acknowledges the message (waiting for JetStream to
    /// confirm the acknowledgement).
    ///
    /// * A consumer that crashes after the commit and before the acknowledgement gets the
    ///   message again: the inbox finds its record, the handler does not run, and it is
    ///   acknowledged.
    /// * A handler or store that fails rolls back and acknowledges negatively: JetStream
    ///   redelivers.
    /// * A parked event (a version gap) is acknowledged negatively with a short delay, to come
    ///   back after the missing one.
    /// * A message that is not an event of the relay's is terminated (never redelivered), and
    ///   the error says why.
    ///
    /// ```no_run
    /// # async fn consume(inbox: surely::inbox::PostgresInbox,
    /// #     consumer: surely::deps::async_nats::jetstream::consumer::PullConsumer)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use surely::inbox::Versions;
    /// use tokio_stream::StreamExt;
    ///
    /// let mut messages = consumer.messages().await?;
    /// while let Some(message) = messages.next().await {
    ///     let processed = inbox
    ///         .process_jetstream(&message?, "inventory", Versions::InOrder, |txn| {
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
    /// The message is not an event, the handler failed, or the store did; the message was
    /// terminated or acknowledged negatively accordingly.
    pub async fn process_jetstream<F, E>(
        &self,
        message: &jetstream::Message,
        consumer: &str,
        versions: Versions,
        handler: F,
    ) -> Result<Processed, InboxError<E>>
    where
        F: for<'t> FnOnce(&'t InboxTransaction) -> Handler<'t, E>,
    {
        let event = match Event::from_nats(message) {
            Ok(event) => event,
            Err(e) => {
                ack(message, AckKind::Term).await;
                return Err(InboxError::Malformed(e));
            }
        };
        self.process_and_answer(
            &JetStreamAnswer(message),
            &event,
            consumer,
            versions,
            handler,
        )
        .await
    }
}

/// JetStream's answers: a confirmed acknowledgement, a `nak` with a delay for a parked event,
/// one without for a failure.
struct JetStreamAnswer<'a>(&'a jetstream::Message);

impl Answer for JetStreamAnswer<'_> {
    async fn settled(&self, event: &Event) {
        if let Err(e) = self.0.double_ack().await {
            // Committed: the redelivery will find the record.
            tracing::warn!(event = %event.id(), error = &*e as &dyn std::error::Error, "inbox: acknowledgement not confirmed");
        }
    }

    async fn parked(&self) {
        ack(self.0, AckKind::Nak(Some(PARKED_REDELIVERY))).await;
    }

    async fn failed(&self) {
        ack(self.0, AckKind::Nak(None)).await;
    }
}

/// How long JetStream waits before it redelivers a task whose stored reason this version does
/// not know: held, and looked at again.
const HELD_REDELIVERY: Duration = Duration::from_secs(60);

impl PostgresInbox {
    /// Processes one JetStream message as a task (features `postgres` and `nats`): what
    /// [`process_task_and_commit`](Self::process_task_and_commit) does, then the answer to
    /// JetStream, once the transaction committed.
    ///
    /// * Applied, stale, a duplicate, or in the manual queue: acknowledged (the manual queue's
    ///   task is kept in the inbox's table; a person's retry hands it out through
    ///   [`take_retried`](Self::take_retried)).
    /// * Waiting: acknowledged negatively **with the delay** the task's policy gave (or the
    ///   time left, for a delivery that came early). The schedule is committed before the
    ///   `nak`: if the `nak` is lost, JetStream redelivers after its ack wait, and the inbox
    ///   answers with the time left without running the handler.
    /// * A message JetStream delivered more than the consumer's
    ///   [`max_deliveries`](Consumer::max_deliveries) times (its delivery count): the task goes
    ///   to the manual queue before its handler runs, so that a handler that kills its
    ///   consumer does not run for ever.
    /// * A message that is not an event: terminated. A store that failed: acknowledged
    ///   negatively, at once. A task whose stored reason is unknown to this version: held,
    ///   acknowledged negatively for a minute.
    ///
    /// ```no_run
    /// # async fn consume(inbox: surely::inbox::PostgresInbox,
    /// #     consumer: surely::deps::async_nats::jetstream::consumer::PullConsumer)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use surely::inbox::{Consumer, Wait};
    /// use tokio_stream::StreamExt;
    ///
    /// let payments = Consumer::builder("payments").build()?;
    /// let mut messages = consumer.messages().await?;
    /// while let Some(message) = messages.next().await {
    ///     let processed = inbox
    ///         .process_jetstream_task(&message?, &payments, |_txn| {
    ///             Box::pin(async move {
    ///                 // The channel answered 429 with `Retry-After: 30`.
    ///                 let headers = http::HeaderMap::new();
    ///                 Err(Wait::paced_by(&headers))
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
    /// As [`process_task_and_commit`](Self::process_task_and_commit), and a message that is
    /// not an event.
    pub async fn process_jetstream_task<F>(
        &self,
        message: &jetstream::Message,
        consumer: &Consumer,
        handler: F,
    ) -> Result<Processed, InboxError>
    where
        F: for<'t> FnOnce(&'t InboxTransaction) -> Handler<'t, Wait>,
    {
        let event = match Event::from_nats(message) {
            Ok(event) => event,
            Err(e) => {
                ack(message, AckKind::Term).await;
                return Err(InboxError::Malformed(e));
            }
        };
        let deliveries = message.info().ok().map(|info| info.delivered.max(0) as u64);
        let out = self
            .process_delivered(consumer, &event, deliveries, handler)
            .await;
        match &out {
            Ok(Processed::Waiting(waiting)) => {
                ack(message, AckKind::Nak(Some(waiting.delay))).await;
            }
            Ok(processed) if processed.is_settled() => {
                if let Err(e) = message.double_ack().await {
                    tracing::warn!(event = %event.id(), error = &*e as &dyn std::error::Error, "inbox: acknowledgement not confirmed");
                }
            }
            Ok(_) => ack(message, AckKind::Nak(Some(PARKED_REDELIVERY))).await,
            Err(InboxError::UnknownReason(_)) => {
                ack(message, AckKind::Nak(Some(HELD_REDELIVERY))).await;
            }
            Err(_) => ack(message, AckKind::Nak(None)).await,
        }
        out
    }
}

/// Acknowledges `message` as `kind`; a failure only delays the redelivery to the ack wait.
async fn ack(message: &jetstream::Message, kind: AckKind) {
    if let Err(e) = message.ack_with(kind).await {
        tracing::warn!(
            error = &*e as &dyn std::error::Error,
            "inbox: acknowledgement not sent"
        );
    }
}
