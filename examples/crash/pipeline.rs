//! The `relay` role (the order service's outbox to JetStream) and the `consumer` role (the
//! inventory service: JetStream through its PostgreSQL inbox, one inventory change per event).

use std::time::Duration;

use bytes::Bytes;
use surely::deps::async_nats::jetstream::{self, AckKind};
use surely::inbox::{InboxError, Processed, Versions};
use surely::outbox::{
    Claimed, Event, Failed, JetStreamPublisher, OutboxError, OutboxStore, PostgresOutbox, Relay,
};
use surely::record::OutboxStats;
use tokio_stream::StreamExt;

use crate::crashpoint::{self, AFTER_APPLY, AFTER_PUBLISH};
use crate::world::{World, CONSUMER};
use crate::{chain, BoxError, RELAY_LEASE};

/// The relay's poll when idle; a `LISTEN` wakes it sooner.
const RELAY_POLL: Duration = Duration::from_millis(200);
/// How long a parked delivery waits before JetStream delivers it again.
const PARKED: Duration = Duration::from_millis(200);

/// The outbox as the relay sees it, with the crash point between the publish and the mark.
struct CrashingOutbox(PostgresOutbox);

impl OutboxStore for CrashingOutbox {
    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Claimed>, OutboxError> {
        self.0.claim(max, lease).await
    }

    async fn published(&self, claimed: &Claimed) -> Result<(), OutboxError> {
        crashpoint::at(AFTER_PUBLISH).await;
        self.0.published(claimed).await
    }

    async fn published_all(&self, claimed: &[Claimed]) -> Result<usize, OutboxError> {
        if !claimed.is_empty() {
            crashpoint::at(AFTER_PUBLISH).await;
        }
        self.0.published_all(claimed).await
    }

    async fn failed(
        &self,
        claimed: &Claimed,
        error: &str,
        retry_after: Duration,
        quarantine_after: u32,
    ) -> Result<Failed, OutboxError> {
        self.0
            .failed(claimed, error, retry_after, quarantine_after)
            .await
    }

    async fn sweep(&self, retention: Duration) -> Result<u64, OutboxError> {
        self.0.sweep(retention).await
    }

    async fn stats(&self) -> Result<OutboxStats, OutboxError> {
        self.0.stats().await
    }
}

pub(crate) async fn run_relay() -> Result<(), BoxError> {
    relay(None).await
}

/// The relay; `quarantine_after` failed publishes of an event quarantine it (default: the
/// relay's own).
pub(crate) async fn relay(quarantine_after: Option<u32>) -> Result<(), BoxError> {
    let stopped = crashpoint::control();
    let world = World::from_env()?;
    world.reach_postgres().await?;
    let js = world.jetstream().await?;
    let outbox = world.outbox()?;
    let wakeup = outbox.listen(&world.pg_url).await?;
    let mut relay = Relay::builder(
        CrashingOutbox(outbox),
        JetStreamPublisher::new(js, world.prefix.clone()),
    );
    if let Some(failures) = quarantine_after {
        relay = relay.quarantine_after(failures);
    }
    let relay = relay
        .lease(RELAY_LEASE)
        .retry_after(Duration::from_millis(200))
        .poll(RELAY_POLL)
        .wake_on(wakeup)
        .no_sweep()
        .build()?;
    crashpoint::ready();
    relay.run(crashpoint::stop_of(stopped)).await;
    Ok(())
}

pub(crate) async fn run_consumer() -> Result<(), BoxError> {
    let stopped = crashpoint::control();
    let world = World::from_env()?;
    world.reach_postgres().await?;
    let js = world.jetstream().await?;
    let consumer = world.consumer(&js).await?;
    let inbox = world.inbox()?;
    let insert = world.sql(
        "INSERT INTO {p}_inventory_changes (event_id, order_key, delta, pid) VALUES ($1, $2, -1, $3)",
    );
    let pid = std::process::id() as i32;
    let mut messages = consumer.messages().await?;
    crashpoint::ready();
    let stop = crashpoint::stop_of(stopped);
    tokio::pin!(stop);
    loop {
        let message = tokio::select! {
            _ = &mut stop => return Ok(()),
            next = messages.next() => next,
        };
        match message {
            Some(Ok(message)) => {
                if let Err(e) = apply(&world, &inbox, &insert, pid, &message).await {
                    eprintln!("consumer: {}", chain(&*e));
                }
            }
            Some(Err(e)) => eprintln!("consumer: the message stream failed: {e}"),
            None => messages = consumer.messages().await?,
        }
    }
}

/// One delivery: the inventory change and the inbox's record in one transaction, committed,
/// then acknowledged.
async fn apply(
    world: &World,
    inbox: &surely::inbox::PostgresInbox,
    insert: &str,
    pid: i32,
    message: &jetstream::Message,
) -> Result<(), BoxError> {
    let event = match Event::from_nats(message) {
        Ok(event) => event,
        Err(e) => {
            let _ = message.ack_with(AckKind::Term).await;
            return Err(format!("not an event of the relay's: {e}").into());
        }
    };
    let id = event.id().as_str().to_owned();
    let key = String::from_utf8_lossy(event.payload()).into_owned();
    let mut client = world.pool.get().await?;
    let txn = client.transaction().await?;
    let processed = inbox
        .process(&txn, CONSUMER, &event, Versions::InOrder, |txn| {
            Box::pin(async move {
                txn.execute(insert, &[&id, &key, &pid]).await?;
                Ok::<_, surely::deps::tokio_postgres::Error>(Bytes::from_static(b"reserved"))
            })
        })
        .await;
    match processed {
        Ok(processed) if processed.is_settled() => {
            txn.commit().await?;
            crashpoint::at(AFTER_APPLY).await;
            if let Processed::Duplicate(_) = processed {
                crashpoint::say("note duplicate-absorbed");
            }
            // Committed: a lost acknowledgement brings a redelivery the inbox absorbs.
            message
                .double_ack()
                .await
                .map_err(|e| format!("acknowledgement not confirmed: {e}"))?;
            Ok(())
        }
        Ok(_) => {
            txn.commit().await?;
            let _ = message.ack_with(AckKind::Nak(Some(PARKED))).await;
            Ok(())
        }
        Err(e) => {
            drop(txn);
            let _ = message.ack_with(AckKind::Nak(None)).await;
            Err(match e {
                InboxError::Handler(e) => format!("the inventory change failed: {e}").into(),
                other => format!("the inbox failed: {other}").into(),
            })
        }
    }
}
