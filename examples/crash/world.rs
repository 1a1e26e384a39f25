//! What every role shares: where PostgreSQL and NATS are, the run's prefix, its tables and
//! stream, and the crate's stores over them.

use std::time::Duration;

use surely::deps::async_nats::{
    self,
    jetstream::{self, consumer, stream},
};
use surely::inbox::PostgresInbox;
use surely::ledger::PostgresLedger;
use surely::outbox::{Event, EventId, PostgresOutbox};
use surely::postgres::Pool;
use surely::server::store::{
    AbandonedRecord, Acquire, Checkpoint, ExpiredRecord, Fence, IdempotencyStore, PostgresStore,
    RecordKey, RecordView, RequestDigest, StoreError, StoredResponse, StuckRecord, UnknownRecord,
};

use crate::{chain, BoxError};

/// How long the first contact with PostgreSQL or NATS may take.
pub(crate) const CONNECT: Duration = Duration::from_secs(5);
/// JetStream's duplicate window for the run's stream: shorter than the relay's lease, so that a
/// relay killed after it published and before it marked has its events stored and delivered
/// again by the next relay, as in production once a relay stays down past the window.
const DUPLICATE_WINDOW: Duration = Duration::from_millis(100);
/// The durable consumer of the inventory service.
pub(crate) const CONSUMER: &str = "inventory";
/// The event the order service emits with every order.
pub(crate) const ORDER_CREATED: &str = "OrderCreated";

/// The environment variables the driver hands its roles.
pub(crate) const ENV_PG: &str = "CRASH_PG";
pub(crate) const ENV_NATS: &str = "CRASH_NATS";
pub(crate) const ENV_PREFIX: &str = "CRASH_PREFIX";
/// `log`: the relay is a log relay, reading the slot named as the run's prefix.
pub(crate) const ENV_RELAY: &str = "CRASH_RELAY";
/// The RabbitMQ broker's URL when the events go through it (`--broker rabbitmq`); unset: NATS.
pub(crate) const ENV_AMQP: &str = "CRASH_AMQP";
/// The Redis server's URL when the order service keeps its keys there (`--store redis`);
/// unset: PostgreSQL.
pub(crate) const ENV_REDIS: &str = "CRASH_REDIS";

/// Where things are, for one run.
#[derive(Clone)]
pub(crate) struct World {
    pub(crate) pg_url: String,
    pub(crate) nats_url: String,
    pub(crate) prefix: String,
    pub(crate) pool: Pool,
    /// The relay reads the write-ahead log through the slot named as the prefix.
    pub(crate) log_relay: bool,
    /// The events go through RabbitMQ at this URL (the exchange and queue named as the
    /// prefix), not through JetStream.
    pub(crate) amqp_url: Option<String>,
    /// The order service keeps its idempotency keys in the Redis at this URL (under the
    /// prefix), not in PostgreSQL.
    pub(crate) redis_url: Option<String>,
}

impl World {
    /// A world over the run's prefix; nothing is created.
    pub(crate) fn new(pg_url: &str, nats_url: &str, prefix: &str) -> Result<World, BoxError> {
        Ok(World {
            pg_url: pg_url.to_owned(),
            nats_url: nats_url.to_owned(),
            prefix: prefix.to_owned(),
            pool: surely::postgres::connect(pg_url)?,
            log_relay: false,
            amqp_url: None,
            redis_url: None,
        })
    }

    /// The same world, the order service's keys in the Redis at `url` (`None`: PostgreSQL).
    pub(crate) fn with_redis(mut self, url: Option<String>) -> World {
        self.redis_url = url;
        self
    }

    /// The order service's idempotency store: the run's Redis, or its PostgreSQL table.
    pub(crate) fn keys(&self) -> Result<RunStore, BoxError> {
        Ok(match &self.redis_url {
            Some(url) => RunStore::Redis(
                surely::server::store::RedisStore::connect(url)?
                    .with_prefix(&format!("{}:", self.prefix))?,
            ),
            None => RunStore::Pg(self.store()?),
        })
    }

    /// The same world, its events going through RabbitMQ at `url` (`None`: JetStream).
    pub(crate) fn with_amqp(mut self, url: Option<String>) -> World {
        self.amqp_url = url;
        self
    }

    /// The run's dead-letter exchange and queue (RabbitMQ): where a message that is not an
    /// event goes.
    pub(crate) fn dead_letters(&self) -> String {
        format!("{}.dead", self.prefix)
    }

    /// A channel to the run's RabbitMQ, on a connection of its own (kept alive by the channel's
    /// holder keeping the connection).
    pub(crate) async fn amqp(&self) -> Result<surely::deps::lapin::Connection, BoxError> {
        let url = self.amqp_url.as_deref().ok_or("the run has no RabbitMQ")?;
        let connect = surely::deps::lapin::Connection::connect(
            url,
            surely::deps::lapin::ConnectionProperties::default(),
        );
        Ok(tokio::time::timeout(CONNECT, connect)
            .await
            .map_err(|_| format!("RabbitMQ at {url} did not answer within {CONNECT:?}"))??)
    }

    /// The same world, its relay reading the write-ahead log (`log`) or polling the table.
    pub(crate) fn with_log_relay(mut self, log: bool) -> World {
        self.log_relay = log;
        self
    }

    /// The world a role is started in: from the driver's variables.
    pub(crate) fn from_env() -> Result<World, BoxError> {
        let var = |name: &str| {
            std::env::var(name)
                .map_err(|_| format!("{name} is not set: roles are started by the driver"))
        };
        Ok(
            World::new(&var(ENV_PG)?, &var(ENV_NATS)?, &var(ENV_PREFIX)?)?
                .with_log_relay(std::env::var(ENV_RELAY).is_ok_and(|r| r == "log"))
                .with_amqp(std::env::var(ENV_AMQP).ok())
                .with_redis(std::env::var(ENV_REDIS).ok()),
        )
    }

    /// The variables that give a role this world.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (ENV_PG, self.pg_url.clone()),
            (ENV_NATS, self.nats_url.clone()),
            (ENV_PREFIX, self.prefix.clone()),
            (
                ENV_RELAY,
                if self.log_relay { "log" } else { "poll" }.to_owned(),
            ),
        ];
        if let Some(url) = &self.amqp_url {
            env.push((ENV_AMQP, url.clone()));
        }
        if let Some(url) = &self.redis_url {
            env.push((ENV_REDIS, url.clone()));
        }
        env
    }

    /// A table of the run's.
    pub(crate) fn t(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.prefix)
    }

    /// `statement` with `{p}` replaced by the run's prefix.
    pub(crate) fn sql(&self, statement: &str) -> String {
        statement.replace("{p}", &self.prefix)
    }

    pub(crate) fn store(&self) -> Result<PostgresStore, BoxError> {
        Ok(PostgresStore::new(self.pool.clone()).with_table(&self.t("idem"))?)
    }

    /// The admin's audit log, in the run's table.
    pub(crate) fn audit(&self) -> Result<surely::admin::AuditLog, BoxError> {
        Ok(surely::admin::AuditLog::postgres(self.pool.clone()).with_table(&self.t("audit"))?)
    }

    pub(crate) fn ledger(&self) -> Result<PostgresLedger, BoxError> {
        Ok(PostgresLedger::new(self.pool.clone()).with_table(&self.t("ledger"))?)
    }

    pub(crate) fn outbox(&self) -> Result<PostgresOutbox, BoxError> {
        Ok(PostgresOutbox::new(self.pool.clone()).with_table(&self.t("outbox"))?)
    }

    pub(crate) fn inbox(&self) -> Result<PostgresInbox, BoxError> {
        Ok(PostgresInbox::new(self.pool.clone()).with_table(&self.t("inbox"))?)
    }

    /// Waits for a first connection to PostgreSQL, for at most [`CONNECT`].
    pub(crate) async fn reach_postgres(&self) -> Result<(), BoxError> {
        let url = &self.pg_url;
        let _first = tokio::time::timeout(CONNECT, self.pool.get())
            .await
            .map_err(|_| format!("PostgreSQL at {url} did not answer within {CONNECT:?}"))?
            .map_err(|e| format!("PostgreSQL at {url} did not answer: {}", chain(&e)))?;
        Ok(())
    }

    /// JetStream at the run's NATS, reached within [`CONNECT`].
    pub(crate) async fn jetstream(&self) -> Result<jetstream::Context, BoxError> {
        let url = &self.nats_url;
        let nats = tokio::time::timeout(CONNECT, async_nats::connect(url))
            .await
            .map_err(|_| format!("NATS at {url} did not answer within {CONNECT:?}"))?
            .map_err(|e| format!("NATS at {url} did not answer: {}", chain(&e)))?;
        Ok(jetstream::new(nats))
    }

    /// The inventory service's durable pull consumer.
    pub(crate) async fn consumer(
        &self,
        js: &jetstream::Context,
    ) -> Result<consumer::PullConsumer, BoxError> {
        let stream = js.get_stream(&self.prefix).await?;
        stream.get_consumer(CONSUMER).await
    }

    /// Makes the run's tables (the services' own, and the crate's stores through their
    /// migrations), its stream and its consumer.
    pub(crate) async fn create(&self, ack_wait: Duration) -> Result<(), BoxError> {
        self.reach_postgres().await?;
        let client = self.pool.get().await?;
        // No unique constraint anywhere: a second order, payment or inventory change for one
        // key or event is a row, and is counted.
        client
            .batch_execute(&self.sql(
                "CREATE TABLE {p}_orders (key text NOT NULL, keyed boolean NOT NULL, pid int NOT NULL,
                     at timestamptz NOT NULL DEFAULT now());
                 CREATE INDEX {p}_orders_key ON {p}_orders (key);
                 CREATE TABLE {p}_payments (payment_id text NOT NULL, order_key text NOT NULL,
                     pid int NOT NULL, at timestamptz NOT NULL DEFAULT now());
                 CREATE INDEX {p}_payments_id ON {p}_payments (payment_id);
                 CREATE INDEX {p}_payments_key ON {p}_payments (order_key);
                 CREATE TABLE {p}_payment_requests (payment_id text NOT NULL, order_key text NOT NULL,
                     pid int NOT NULL, at timestamptz NOT NULL DEFAULT now(),
                     pay_by timestamptz NOT NULL);
                 CREATE INDEX {p}_payment_requests_id ON {p}_payment_requests (payment_id);
                 CREATE TABLE {p}_arrivals (key text NOT NULL, keyed boolean NOT NULL, pid int NOT NULL,
                     client bigint,
                     at timestamptz NOT NULL DEFAULT now());
                 CREATE TABLE {p}_inventory_changes (event_id text NOT NULL, order_key text NOT NULL,
                     delta int NOT NULL, pid int NOT NULL, at timestamptz NOT NULL DEFAULT now());
                 CREATE INDEX {p}_inventory_key ON {p}_inventory_changes (order_key);",
            ))
            .await?;
        self.store()?.migrate().await?;
        self.outbox()?.migrate().await?;
        if self.log_relay {
            self.outbox()?.create_slot(&self.prefix).await?;
        }
        self.inbox()?.migrate().await?;
        client.batch_execute(&crate::tasks::schema(self)).await?;
        self.ledger()?.migrate().await?;
        self.audit()?.migrate().await?;

        if self.amqp_url.is_some() {
            return self.create_amqp().await;
        }
        let js = self.jetstream().await?;
        let stream = js
            .get_or_create_stream(stream::Config {
                name: self.prefix.clone(),
                subjects: vec![format!("{}.>", self.prefix)],
                duplicate_window: DUPLICATE_WINDOW,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("cannot make a JetStream stream (is JetStream on?): {e}"))?;
        stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some(CONSUMER.to_owned()),
                filter_subject: format!("{}.{ORDER_CREATED}", self.prefix),
                ack_wait,
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    /// The run's RabbitMQ topology: the relay's exchange (topic) and the consumer's queue
    /// bound to it, whose dead letters go to a fanout exchange and its queue.
    async fn create_amqp(&self) -> Result<(), BoxError> {
        use surely::deps::lapin::options::{
            ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
        };
        use surely::deps::lapin::types::{AMQPValue, FieldTable};
        use surely::deps::lapin::ExchangeKind;
        let connection = self.amqp().await?;
        let channel = connection.create_channel().await?;
        let dead = self.dead_letters();
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        for (name, kind) in [
            (&self.prefix, ExchangeKind::Topic),
            (&dead, ExchangeKind::Fanout),
        ] {
            channel
                .exchange_declare(name.clone().into(), kind, durable, FieldTable::default())
                .await?;
        }
        let mut args = FieldTable::default();
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(dead.clone().into()),
        );
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        for (queue, args, exchange, key) in [
            (&self.prefix, args, &self.prefix, "#"),
            (&dead, FieldTable::default(), &dead, ""),
        ] {
            channel
                .queue_declare(queue.clone().into(), durable, args)
                .await?;
            channel
                .queue_bind(
                    queue.clone().into(),
                    exchange.clone().into(),
                    key.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        let _ = connection.close(0, "created".into()).await;
        Ok(())
    }

    /// Deletes the run's RabbitMQ queues and exchanges; says how many messages were dead.
    async fn drop_amqp(&self) -> Result<u32, BoxError> {
        use surely::deps::lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
        let connection = self.amqp().await?;
        let channel = connection.create_channel().await?;
        let dead = self.dead_letters();
        let mut dead_messages = 0;
        for queue in [&self.prefix, &dead] {
            let n = channel
                .queue_delete(queue.clone().into(), QueueDeleteOptions::default())
                .await?;
            if queue == &dead {
                dead_messages = n;
            }
        }
        for exchange in [&self.prefix, &dead] {
            channel
                .exchange_delete(exchange.clone().into(), ExchangeDeleteOptions::default())
                .await?;
        }
        let _ = connection.close(0, "dropped".into()).await;
        Ok(dead_messages)
    }

    /// Messages in the dead-letter queue now (RabbitMQ), without taking them.
    pub(crate) async fn dead_lettered(&self) -> Result<u32, BoxError> {
        use surely::deps::lapin::options::QueueDeclareOptions;
        use surely::deps::lapin::types::FieldTable;
        let connection = self.amqp().await?;
        let channel = connection.create_channel().await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let queue = channel
            .queue_declare(self.dead_letters().into(), passive, FieldTable::default())
            .await?;
        let _ = connection.close(0, "counted".into()).await;
        Ok(queue.message_count())
    }

    /// Drops every table and function of the run's prefix, the crate's migration records of
    /// them, and the stream (with its consumer); says what it dropped.
    pub(crate) async fn drop_all(&self) -> Result<String, BoxError> {
        let client = self.pool.get().await?;
        // The log relay's slot (it keeps the log while it exists) and its publication.
        if self.log_relay {
            // A killed relay's connection may hold it for a moment.
            for _ in 0..50 {
                match self.outbox()?.drop_slot(&self.prefix).await {
                    Ok(_) => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
        client
            .batch_execute(&format!(
                "DROP PUBLICATION IF EXISTS {}_outbox_publication",
                self.prefix
            ))
            .await?;
        let pattern = format!("{}\\_%", self.prefix);
        let rows = client
            .query(
                "SELECT schemaname || '.' || tablename FROM pg_tables WHERE tablename LIKE $1",
                &[&pattern],
            )
            .await?;
        let tables: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        if !tables.is_empty() {
            client
                .batch_execute(&format!(
                    "DROP TABLE IF EXISTS {} CASCADE",
                    tables.join(", ")
                ))
                .await?;
        }
        // The idempotency store's table comes with a function, which dropping it leaves.
        let functions = client
            .query(
                "SELECT n.nspname || '.' || p.proname FROM pg_proc p
                 JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.proname LIKE $1",
                &[&pattern],
            )
            .await?;
        for f in &functions {
            let f: String = f.get(0);
            client
                .batch_execute(&format!("DROP FUNCTION IF EXISTS {f}"))
                .await?;
        }
        client
            .execute(
                "DELETE FROM surely_migrations WHERE target LIKE $1",
                &[&pattern],
            )
            .await?;
        if self.amqp_url.is_some() {
            let queues = match self.drop_amqp().await {
                Ok(_) => format!(" and the queues and exchanges {0}, {0}.dead", self.prefix),
                Err(e) => format!(
                    " (the queues {} could not be deleted: {})",
                    self.prefix,
                    chain(&*e)
                ),
            };
            return Ok(format!("{} tables {}_*{queues}", tables.len(), self.prefix));
        }
        let deleted = match self.jetstream().await {
            Ok(js) => js
                .delete_stream(&self.prefix)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(chain(&*e)),
        };
        let stream = match deleted {
            Ok(_) => format!(" and the stream {}", self.prefix),
            Err(e) => format!(" (the stream {} could not be deleted: {e})", self.prefix),
        };
        Ok(format!("{} tables {}_*{stream}", tables.len(), self.prefix))
    }
}

/// Whether a key is an order placed with an `Idempotency-Key` (`k-…` and `t-…`) or without
/// (`u-…`).
pub(crate) fn is_keyed(key: &str) -> bool {
    key.starts_with("k-") || key.starts_with("t-")
}

/// Whether a key is an order whose key the order service claims in the handler's transaction
/// (`t-…`, `POST /orders-tx`): no payment, the order and its event in the claim's transaction.
pub(crate) fn in_claim(key: &str) -> bool {
    key.starts_with("t-")
}

/// Whether a key's order is paid (`k-…`).
pub(crate) fn pays(key: &str) -> bool {
    key.starts_with("k-")
}

/// The id of an order's payment at the payment provider: one per order key.
pub(crate) fn payment_id(key: &str) -> String {
    format!("pay-{key}")
}

/// The `OrderCreated` event of an order: its id derived from the order, so that a retried
/// handler enqueues the same event.
pub(crate) fn order_created(key: &str) -> Result<Event, BoxError> {
    let about = format!("order {key}");
    Ok(Event::new(
        EventId::derive(&about, ORDER_CREATED),
        about,
        1,
        ORDER_CREATED,
        key.to_owned(),
    )?)
}

/// The order service's idempotency store, PostgreSQL's or Redis's: one type for the layers, the
/// reconciler and the checks, each call passed to the store the run uses.
#[derive(Clone)]
pub(crate) enum RunStore {
    Pg(PostgresStore),
    Redis(surely::server::store::RedisStore),
}

macro_rules! both {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            RunStore::Pg($s) => $e,
            RunStore::Redis($s) => $e,
        }
    };
}

impl IdempotencyStore for RunStore {
    fn kind(&self) -> &'static str {
        both!(self, s => s.kind())
    }

    async fn acquire(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> Result<Acquire, StoreError> {
        both!(self, s => s.acquire(key, digest, lease).await)
    }

    async fn complete(
        &self,
        key: &RecordKey,
        fence: Fence,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        both!(self, s => s.complete(key, fence, response, retention).await)
    }

    async fn release(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        both!(self, s => s.release(key, fence).await)
    }

    async fn renew(
        &self,
        key: &RecordKey,
        fence: Fence,
        lease: Duration,
    ) -> Result<(), StoreError> {
        both!(self, s => s.renew(key, fence, lease).await)
    }

    async fn checkpoint(
        &self,
        key: &RecordKey,
        fence: Fence,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        both!(self, s => s.checkpoint(key, fence, checkpoint).await)
    }

    async fn mark_unknown(
        &self,
        key: &RecordKey,
        fence: Fence,
        evidence: &str,
    ) -> Result<(), StoreError> {
        both!(self, s => s.mark_unknown(key, fence, evidence).await)
    }

    async fn unknowns(&self, limit: usize) -> Result<Vec<UnknownRecord>, StoreError> {
        both!(self, s => s.unknowns(limit).await)
    }

    async fn expired(
        &self,
        keep_expired_for: Duration,
        limit: usize,
    ) -> Result<Vec<ExpiredRecord>, StoreError> {
        both!(self, s => s.expired(keep_expired_for, limit).await)
    }

    async fn forget(&self, records: &[ExpiredRecord]) -> Result<u64, StoreError> {
        both!(self, s => s.forget(records).await)
    }

    async fn sweep(&self, keep_expired_for: Duration) -> Result<u64, StoreError> {
        both!(self, s => s.sweep(keep_expired_for).await)
    }

    async fn stuck(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<StuckRecord>, StoreError> {
        both!(self, s => s.stuck(older_than, limit).await)
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordView>, StoreError> {
        both!(self, s => s.inspect(key).await)
    }

    async fn take_abandoned(
        &self,
        overdue_by: Duration,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<AbandonedRecord>, StoreError> {
        both!(self, s => s.take_abandoned(overdue_by, lease, limit).await)
    }
}
