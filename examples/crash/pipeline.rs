//! The `relay` role (the order service's outbox to JetStream) and the `consumer` role (the
//! inventory service: JetStream through its PostgreSQL inbox, each event a task whose handler
//! writes one inventory change or says why it waits: [`tasks`](crate::tasks)).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use surely::deps::async_nats::jetstream::{self, AckKind};
use surely::inbox::{
    Consumer, InboxError, InboxTransaction, PostgresInbox, Processed, Versions, Wait,
};
use surely::outbox::{
    Claimed, Event, Failed, JetStreamPublisher, OutboxError, OutboxStore, PostgresOutbox,
    RabbitPublisher, Relay,
};
use surely::postgres::Pool;
use surely::record::OutboxStats;
use tokio::task::JoinSet;
use tokio_stream::StreamExt;

use crate::crashpoint::{self, AFTER_ANSWER, AFTER_APPLY, AFTER_PUBLISH, AFTER_SCHEDULE};
use crate::tasks::{self, Fates, Run};
use crate::world::{World, CONSUMER};
use crate::{chain, BoxError, RELAY_LEASE};

/// The relay's poll when idle; a `LISTEN` wakes it sooner.
const RELAY_POLL: Duration = Duration::from_millis(200);
/// How long a parked delivery waits before JetStream delivers it again.
const PARKED: Duration = Duration::from_millis(200);
/// The deliveries the consumer processes at once (each holds up to two of the pool's
/// connections: its transaction's, and its run's record). A task's deliveries never run at
/// once: the inbox locks the event.
const IN_FLIGHT: usize = 4;

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
        let marked = self.0.published_all(claimed).await?;
        if marked < claimed.len() && crashpoint::resumed() {
            // Paused past the claim's lease while another relay took the events over: their
            // marks are refused.
            crashpoint::say(&format!(
                "note late-write-refused:relay-mark n {}",
                claimed.len() - marked
            ));
        }
        Ok(marked)
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
    relay(None, None).await
}

/// The log relay: the outbox read from the write-ahead log through the run's slot, with the
/// crash point between an acknowledgement and the slot's confirmation (an event published,
/// the slot not yet moved past it); it sweeps what it published after `retention` (`None`:
/// never).
async fn log_relay(
    quarantine_after: Option<u32>,
    retention: Option<Duration>,
) -> Result<(), BoxError> {
    use surely::outbox::{LogRelay, LogSource};
    use tower::ServiceExt;

    let stopped = crashpoint::control();
    let world = World::from_env()?;
    world.reach_postgres().await?;
    let js = world.jetstream().await?;
    let publisher = JetStreamPublisher::new(js, world.prefix.clone()).then(|published| async {
        if published.is_ok() {
            crashpoint::at(AFTER_PUBLISH).await;
        }
        published
    });
    let mut relay = LogRelay::builder(
        world.outbox()?,
        LogSource::new(&world.pg_url, &world.prefix)?,
        publisher,
    )
    .heartbeat(Duration::from_millis(200))
    .retry_after(Duration::from_millis(200))
    .standby(Duration::from_millis(200));
    if let Some(refusals) = quarantine_after {
        relay = relay.quarantine_after(refusals);
    }
    let relay = match retention {
        Some(retention) => relay.retention(retention),
        None => relay.no_sweep(),
    }
    .build()?;
    crashpoint::ready();
    relay.run(crashpoint::stop_of(stopped)).await?;
    Ok(())
}

/// The relay, polling the table or reading the log as the run says; `quarantine_after` failed
/// publishes of an event quarantine it (default: the relay's own); a log relay sweeps what it
/// published after `log_retention` (the polling relay's published events are swept by a chore).
pub(crate) async fn relay(
    quarantine_after: Option<u32>,
    log_retention: Option<Duration>,
) -> Result<(), BoxError> {
    if World::from_env()?.log_relay {
        return log_relay(quarantine_after, log_retention).await;
    }
    let stopped = crashpoint::control();
    let world = World::from_env()?;
    world.reach_postgres().await?;
    match &world.amqp_url {
        Some(url) => {
            // The events go to the run's exchange, each with its subject as its routing key.
            let publisher = RabbitPublisher::builder(url.clone(), world.prefix.clone())
                .timeout(Duration::from_secs(5))
                .connect()
                .await?;
            polling_relay(&world, publisher, quarantine_after, stopped).await
        }
        None => {
            let js = world.jetstream().await?;
            let publisher = JetStreamPublisher::new(js, world.prefix.clone());
            polling_relay(&world, publisher, quarantine_after, stopped).await
        }
    }
}

/// The polling relay over `publisher`, until the driver says stop.
async fn polling_relay<P>(
    world: &World,
    publisher: P,
    quarantine_after: Option<u32>,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<(), BoxError>
where
    P: tower::Service<Event>,
    P::Error: Into<BoxError>,
{
    let outbox = world.outbox()?;
    let wakeup = outbox.listen(&world.pg_url).await?;
    let mut relay = Relay::builder(CrashingOutbox(outbox), publisher);
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
    if world.amqp_url.is_some() {
        return amqp_consumer(world, stopped).await;
    }
    let js = world.jetstream().await?;
    let durable = world.consumer(&js).await?;
    let task = Arc::new(Task {
        inbox: world.inbox()?,
        consumer: tasks::consumer()?,
        fates: Fates::from_env()?,
        sql: Sql {
            insert: world.sql(INSERT_CHANGE),
            record_run: world.sql(tasks::RECORD_RUN),
        },
        pid: std::process::id() as i32,
        world,
    });
    let mut messages = durable.messages().await?;
    let mut running = JoinSet::new();
    crashpoint::ready();
    let stop = crashpoint::stop_of(stopped);
    tokio::pin!(stop);
    loop {
        let message = tokio::select! {
            _ = &mut stop => {
                // Told to stop: the deliveries in hand finish first.
                while running.join_next().await.is_some() {}
                return Ok(());
            }
            Some(_) = running.join_next(), if !running.is_empty() => continue,
            next = messages.next(), if running.len() < IN_FLIGHT => next,
        };
        match message {
            Some(Ok(message)) => {
                let task = task.clone();
                running.spawn(async move {
                    if let Err(e) = task.apply(&message).await {
                        eprintln!("consumer: {}", chain(&*e));
                    }
                });
            }
            Some(Err(e)) => eprintln!("consumer: the message stream failed: {e}"),
            None => messages = durable.messages().await?,
        }
    }
}

/// The consumer on RabbitMQ: each delivery applied through the PostgreSQL inbox
/// (`PostgresInbox::process_amqp`: acknowledged after the commit, requeued on a failure,
/// dead-lettered when it is not an event), at most [`IN_FLIGHT`] unacknowledged (the channel's
/// prefetch). No tasks here: every event is applied at once (`tasks::Fates` says so for the
/// run), and the crash point `after-answer` sits in the handler, before the commit.
async fn amqp_consumer(
    world: World,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<(), BoxError> {
    use surely::deps::lapin::options::{BasicConsumeOptions, BasicQosOptions};
    use surely::deps::lapin::types::FieldTable;
    let connection = world.amqp().await?;
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(IN_FLIGHT as u16, BasicQosOptions::default())
        .await?;
    let mut deliveries = channel
        .basic_consume(
            world.prefix.clone().into(),
            CONSUMER.into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let inbox = Arc::new(world.inbox()?);
    let insert: Arc<str> = world.sql(INSERT_CHANGE).into();
    let pid = std::process::id() as i32;
    let mut running = JoinSet::new();
    crashpoint::ready();
    let stop = crashpoint::stop_of(stopped);
    tokio::pin!(stop);
    loop {
        let delivery = tokio::select! {
            _ = &mut stop => {
                while running.join_next().await.is_some() {}
                return Ok(());
            }
            Some(_) = running.join_next(), if !running.is_empty() => continue,
            next = deliveries.next(), if running.len() < IN_FLIGHT => next,
        };
        let delivery = match delivery {
            Some(Ok(delivery)) => delivery,
            Some(Err(e)) => return Err(format!("the RabbitMQ consumer failed: {e}").into()),
            None => return Err("the RabbitMQ consumer was cancelled".into()),
        };
        let (inbox, insert) = (inbox.clone(), insert.clone());
        running.spawn(async move {
            // The handler writes the event's id and key: read here (a delivery that is not an
            // event is dead-lettered by the inbox before any handler runs).
            let (id, key) = match Event::from_amqp(&delivery) {
                Ok(e) => (
                    e.id().as_str().to_owned(),
                    String::from_utf8_lossy(e.payload()).into_owned(),
                ),
                Err(_) => (String::new(), String::new()),
            };
            let processed = inbox
                .process_amqp(&delivery, CONSUMER, Versions::Any, |txn| {
                    Box::pin(async move {
                        txn.execute(&*insert, &[&id, &key, &pid]).await?;
                        crashpoint::at(AFTER_ANSWER).await;
                        Ok::<_, surely::deps::tokio_postgres::Error>(Bytes::from_static(
                            b"reserved",
                        ))
                    })
                })
                .await;
            match processed {
                Ok(Processed::Duplicate(_)) => crashpoint::say("note duplicate-absorbed"),
                Ok(_) => {}
                Err(e) => eprintln!("consumer: {e}"),
            }
        });
    }
}

/// The consumer's write: one inventory change for an event.
const INSERT_CHANGE: &str =
    "INSERT INTO {p}_inventory_changes (event_id, order_key, delta, pid) VALUES ($1, $2, -1, $3)";

/// The consumer's statements.
struct Sql {
    insert: String,
    record_run: String,
}

/// What every delivery is processed with.
struct Task {
    world: World,
    inbox: PostgresInbox,
    consumer: Consumer,
    /// The events' fates; none (the soak): every event is applied at once.
    fates: Option<Fates>,
    sql: Sql,
    pid: i32,
}

impl Task {
    /// One delivery, as a task: the handler writes the inventory change, then answers `Ok` or
    /// why it waits; the inbox commits the change and its record, or (the change rolled back)
    /// the task's schedule; then the delivery is acknowledged, or acknowledged negatively with
    /// the task's delay.
    async fn apply(&self, message: &jetstream::Message) -> Result<(), BoxError> {
        let event = match Event::from_nats(message) {
            Ok(event) => event,
            Err(e) => {
                let _ = message.ack_with(AckKind::Term).await;
                return Err(format!("not an event of the relay's: {e}").into());
            }
        };
        let id = event.id().as_str().to_owned();
        let key = String::from_utf8_lossy(event.payload()).into_owned();
        let fate = self.fates.map(|f| f.of(&id));
        let version = event.version();
        let (pool, pid) = (self.world.pool.clone(), self.pid);
        // Owned: the handler's future may outlive any borrow of this call's.
        let (insert, record) = (self.sql.insert.clone(), self.sql.record_run.clone());
        let processed = self
            .inbox
            .process_task_and_commit(&self.consumer, &event, |txn| {
                Box::pin(async move {
                    let run = match fate {
                        Some(_) => Some(record_run(&pool, &record, &id, pid, txn).await?),
                        None => None,
                    };
                    // Written before the answer: a wait rolls it back.
                    txn.execute(&insert, &[&id, &key, &pid]).await?;
                    let answer = match (fate, run) {
                        (Some(fate), Some(run)) => tasks::answer(fate, run, &key, version),
                        _ => Ok(()),
                    };
                    crashpoint::at(AFTER_ANSWER).await;
                    answer.map(|()| Bytes::from_static(b"reserved"))
                })
            })
            .await;
        match processed {
            Ok(Processed::Waiting(waiting)) => {
                if waiting.early {
                    crashpoint::say("note task-early");
                } else {
                    // The schedule is committed: a kill here loses the `nak`, and JetStream
                    // delivers again after its ack wait, maybe before the task's time.
                    crashpoint::at(AFTER_SCHEDULE).await;
                }
                message
                    .ack_with(AckKind::Nak(Some(waiting.delay)))
                    .await
                    .map_err(|e| format!("negative acknowledgement not sent: {e}"))?;
                Ok(())
            }
            Ok(processed) if processed.is_settled() => {
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
                let _ = message.ack_with(AckKind::Nak(Some(PARKED))).await;
                Ok(())
            }
            Err(e) => {
                let _ = message.ack_with(AckKind::Nak(None)).await;
                Err(match e {
                    InboxError::Handler(e) => format!("the inventory change failed: {e}").into(),
                    other => format!("the inbox failed: {other}").into(),
                })
            }
        }
    }
}

/// Records a handler run through a connection of its own, committed before the handler goes
/// on (its transaction's writes may roll back): the run's number and its time since the
/// event's first run. A run that cannot be recorded answers a transient wait and writes nothing.
async fn record_run(
    pool: &Pool,
    statement: &str,
    id: &str,
    pid: i32,
    txn: &InboxTransaction,
) -> Result<Run, Wait> {
    let times = txn
        .query_one("SELECT now(), clock_timestamp()", &[])
        .await?;
    let (txn_at, started): (SystemTime, SystemTime) = (times.get(0), times.get(1));
    let client = pool
        .get()
        .await
        .map_err(|e| Wait::transient(format_args!("the run's record: {e}")))?;
    let row = client
        .query_one(statement, &[&id, &pid, &txn_at, &started])
        .await?;
    let since_first: i64 = row.get(1);
    Ok(Run {
        number: row.get(0),
        since_first: Duration::from_micros(u64::try_from(since_first).unwrap_or(0)),
    })
}
