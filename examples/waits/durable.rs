//! PostgreSQL for the inbox and the business state (tables of the run's own), NATS
//! JetStream as the broker (a stream and a durable pull consumer of the run's own).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use surely::deps::async_nats::{
    self,
    jetstream::{self, consumer, stream},
};
use surely::inbox::{
    Consumer, InboxStats, InboxTransaction, PostgresInbox, Processed, Task, TaskState, Wait,
};
use surely::outbox::{Event, JetStreamPublisher};
use surely::postgres::Pool;
use tokio_stream::StreamExt;
use tower::{Service, ServiceExt};

use crate::handlers::{handle, Books, Ctx};
use crate::world::{consumer_for, Snapshot, World};
use crate::{chain, BoxError, ORDERS, SKU, STOCK};

/// How long the first contact with PostgreSQL or NATS may take.
const CONNECT: Duration = Duration::from_secs(5);
/// JetStream's wait for an acknowledgement: longer than any handler here.
const ACK_WAIT: Duration = Duration::from_secs(10);
/// How long a task a person retried is handed to this consumer.
const LEASE: Duration = Duration::from_secs(10);

/// The handler's view of the business: the inbox's transaction, after its savepoint (a
/// wait rolls its writes back).
struct PgBooks<'t> {
    txn: &'t InboxTransaction,
    p: Arc<str>,
}

impl Books for PgBooks<'_> {
    async fn order(&self, order: &str) -> Result<Option<(i64, String)>, BoxError> {
        let sql = format!(
            "SELECT version, status FROM {}_orders WHERE id = $1",
            self.p
        );
        let row = self.txn.query_opt(&sql, &[&order]).await?;
        Ok(match row {
            Some(row) => Some((row.try_get(0)?, row.try_get(1)?)),
            None => None,
        })
    }

    async fn in_stock(&self, sku: &str) -> Result<i64, BoxError> {
        let sql = format!("SELECT qty FROM {}_stock WHERE sku = $1 FOR UPDATE", self.p);
        Ok(self.txn.query_one(&sql, &[&sku]).await?.try_get(0)?)
    }

    async fn reserve(&self, order: &str, sku: &str, qty: i64) -> Result<i64, BoxError> {
        let p = &self.p;
        let take = format!("UPDATE {p}_stock SET qty = qty - $2 WHERE sku = $1 RETURNING qty");
        let left: i64 = self.txn.query_one(&take, &[&sku, &qty]).await?.try_get(0)?;
        let keep = format!("INSERT INTO {p}_reservations (order_id, qty) VALUES ($1, $2)");
        self.txn.execute(&keep, &[&order, &qty]).await?;
        Ok(left)
    }

    async fn approved(&self, order: &str) -> Result<bool, BoxError> {
        let sql = format!("SELECT 1 FROM {}_approvals WHERE order_id = $1", self.p);
        Ok(self.txn.query_opt(&sql, &[&order]).await?.is_some())
    }

    async fn charged(&self, order: &str, amount: i64, reference: &str) -> Result<(), BoxError> {
        let sql = format!(
            "INSERT INTO {}_charges (order_id, amount, reference) VALUES ($1, $2, $3)",
            self.p
        );
        self.txn
            .execute(&sql, &[&order, &amount, &reference])
            .await?;
        Ok(())
    }
}

pub(crate) struct PgWorld {
    pool: Pool,
    prefix: Arc<str>,
    inbox: PostgresInbox,
    js: jetstream::Context,
    consumer: consumer::PullConsumer,
}

impl PgWorld {
    /// Connects to both, and makes the run's tables, stream and consumer; fails if either
    /// does not answer.
    pub(crate) async fn connect(pg_url: &str, nats_url: &str) -> Result<PgWorld, BoxError> {
        let pool = surely::postgres::connect(pg_url)?;
        let client = tokio::time::timeout(CONNECT, pool.get())
            .await
            .map_err(|_| format!("PostgreSQL at {pg_url} did not answer within {CONNECT:?}"))?
            .map_err(|e| format!("PostgreSQL at {pg_url} did not answer: {}", chain(&e)))?;
        let nats = tokio::time::timeout(CONNECT, async_nats::connect(nats_url))
            .await
            .map_err(|_| format!("NATS at {nats_url} did not answer within {CONNECT:?}"))?
            .map_err(|e| format!("NATS at {nats_url} did not answer: {}", chain(&e)))?;
        let js = jetstream::new(nats);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.subsec_nanos();
        let prefix = format!("surely_waits_{}_{nanos}", std::process::id());
        client
            .batch_execute(&format!(
                "CREATE TABLE {prefix}_stock (sku text PRIMARY KEY, qty bigint NOT NULL);
                 CREATE TABLE {prefix}_orders (id text PRIMARY KEY, version bigint NOT NULL,
                     status text NOT NULL);
                 CREATE TABLE {prefix}_reservations (order_id text NOT NULL,
                     qty bigint NOT NULL);
                 CREATE TABLE {prefix}_approvals (order_id text PRIMARY KEY);
                 CREATE TABLE {prefix}_charges (order_id text NOT NULL,
                     amount bigint NOT NULL, reference text NOT NULL);"
            ))
            .await?;
        let inbox = PostgresInbox::new(pool.clone()).with_table(&format!("{prefix}_inbox"))?;
        inbox.migrate().await?;
        let stream = js
            .create_stream(stream::Config {
                name: prefix.clone(),
                subjects: vec![format!("{prefix}.>")],
                ..Default::default()
            })
            .await
            .map_err(|e| format!("cannot make a JetStream stream (is JetStream on?): {e}"))?;
        let consumer = stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some("waits".to_owned()),
                ack_wait: ACK_WAIT,
                ..Default::default()
            })
            .await?;
        Ok(PgWorld {
            pool,
            prefix: prefix.into(),
            inbox,
            js,
            consumer,
        })
    }

    /// Drops the run's tables, the inbox's migration record and the stream; says what it
    /// dropped.
    pub(crate) async fn clean_up(&self) -> Result<String, BoxError> {
        let p = &self.prefix;
        let client = self.pool.get().await?;
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {p}_stock, {p}_orders, {p}_reservations, {p}_approvals,
                     {p}_charges, {p}_inbox_task_steps, {p}_inbox_tasks, {p}_inbox,
                     {p}_inbox_versions;"
            ))
            .await?;
        client
            .execute(
                "DELETE FROM surely_migrations WHERE target = $1",
                &[&format!("{p}_inbox")],
            )
            .await?;
        self.js.delete_stream(&**p).await?;
        Ok(format!("the tables {p}_* and the stream {p}"))
    }

    async fn execute(&self, sql: &str) -> Result<(), BoxError> {
        let client = self.pool.get().await?;
        client
            .batch_execute(&sql.replace("{p}", &self.prefix))
            .await?;
        Ok(())
    }

    async fn query_i64(&self, sql: &str) -> Result<i64, BoxError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(&sql.replace("{p}", &self.prefix), &[])
            .await?;
        Ok(row.try_get(0)?)
    }
}

impl World for PgWorld {
    type Delivery = jetstream::Message;

    fn describe(&self) -> String {
        format!(
            "PostgreSQL (PostgresInbox and the business state in the tables {p}_*) and NATS \
             JetStream (stream {p}, pull consumer `waits`, each delivery through \
             process_jetstream_task)",
            p = self.prefix
        )
    }

    async fn open(&self) -> Result<(), BoxError> {
        let orders: Vec<String> = ORDERS
            .iter()
            .map(|o| format!("('{o}', 1, 'placed')"))
            .collect();
        self.execute(&format!(
            "INSERT INTO {{p}}_stock VALUES ('{SKU}', {STOCK});
             INSERT INTO {{p}}_orders VALUES {};",
            orders.join(", ")
        ))
        .await
    }

    async fn publish(&self, event: Event) -> Result<(), BoxError> {
        let mut publisher = JetStreamPublisher::new(self.js.clone(), self.prefix.to_string());
        let published = publisher.ready().await?.call(event).await?;
        if published.duplicate {
            return Err("JetStream took a task for a duplicate of one it holds".into());
        }
        Ok(())
    }

    async fn fetch(&self, wait: Duration) -> Result<Vec<jetstream::Message>, BoxError> {
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(20)
            .expires(wait)
            .messages()
            .await?;
        let mut all = Vec::new();
        while let Some(message) = batch.next().await {
            all.push(message?);
        }
        Ok(all)
    }

    async fn process(
        &self,
        consumers: &[Consumer; 2],
        message: jetstream::Message,
        ctx: &Ctx,
    ) -> Result<(Consumer, Event, Processed), BoxError> {
        // A message that is not an event is terminated by `process_jetstream_task`, and
        // its handler never runs.
        let event = Event::from_nats(&message);
        let consumer = match &event {
            Ok(event) => consumer_for(consumers, event).clone(),
            Err(_) => consumers[0].clone(),
        };
        let (task, ctx, p) = (
            event.as_ref().ok().cloned(),
            ctx.clone(),
            self.prefix.clone(),
        );
        let processed = self
            .inbox
            .process_jetstream_task(&message, &consumer, move |txn| {
                Box::pin(async move {
                    let books = PgBooks { txn, p };
                    match task {
                        Some(task) => handle(&books, &ctx, &task).await,
                        None => Err(Wait::person("the consumer", "not an event")),
                    }
                })
            })
            .await?;
        Ok((consumer, event?, processed))
    }

    async fn process_event(
        &self,
        consumer: &Consumer,
        event: &Event,
        ctx: &Ctx,
    ) -> Result<Processed, BoxError> {
        let (task, ctx, p) = (event.clone(), ctx.clone(), self.prefix.clone());
        Ok(self
            .inbox
            .process_task_and_commit(consumer, event, move |txn| {
                Box::pin(async move { handle(&PgBooks { txn, p }, &ctx, &task).await })
            })
            .await?)
    }

    async fn tasks(&self, consumer: &str, state: Option<TaskState>) -> Result<Vec<Task>, BoxError> {
        Ok(self.inbox.tasks(Some(consumer), state, 100).await?)
    }

    async fn task(&self, consumer: &str, event_id: &str) -> Result<Option<Task>, BoxError> {
        Ok(self.inbox.task(consumer, event_id).await?)
    }

    async fn retry_task(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<(), BoxError> {
        Ok(self.inbox.retry_task(consumer, event_id, who, why).await?)
    }

    async fn discard_task(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<Bytes, BoxError> {
        Ok(self
            .inbox
            .discard_task(consumer, event_id, who, why)
            .await?)
    }

    async fn take_retried(&self, consumer: &str) -> Result<Vec<Event>, BoxError> {
        Ok(self.inbox.take_retried(consumer, 10, LEASE).await?)
    }

    fn stats(&self) -> InboxStats {
        self.inbox.stats()
    }

    async fn cancel(&self, order: &str) -> Result<i64, BoxError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "UPDATE {}_orders SET version = version + 1, status = 'cancelled' WHERE id = $1
             RETURNING version",
            self.prefix
        );
        Ok(client.query_one(&sql, &[&order]).await?.try_get(0)?)
    }

    async fn replenish(&self, qty: i64) -> Result<i64, BoxError> {
        self.query_i64(&format!(
            "UPDATE {{p}}_stock SET qty = qty + {qty} WHERE sku = '{SKU}' RETURNING qty"
        ))
        .await
    }

    async fn approve(&self, order: &str) -> Result<(), BoxError> {
        let client = self.pool.get().await?;
        let sql = format!("INSERT INTO {}_approvals VALUES ($1)", self.prefix);
        client.execute(&sql, &[&order]).await?;
        Ok(())
    }

    async fn snapshot(&self) -> Result<Snapshot, BoxError> {
        let stock = self
            .query_i64(&format!("SELECT qty FROM {{p}}_stock WHERE sku = '{SKU}'"))
            .await?;
        let client = self.pool.get().await?;
        let p = &self.prefix;
        let pairs = |rows: Vec<surely::deps::tokio_postgres::Row>| {
            rows.iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect::<Result<Vec<(String, i64)>, BoxError>>()
        };
        let reservations = client
            .query(&format!("SELECT order_id, qty FROM {p}_reservations"), &[])
            .await?;
        let charges = client
            .query(&format!("SELECT order_id, amount FROM {p}_charges"), &[])
            .await?;
        Ok(Snapshot {
            stock,
            reservations: pairs(reservations)?,
            charges: pairs(charges)?,
        })
    }
}
