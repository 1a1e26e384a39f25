//! The seed's recovery chain, end to end, with a fault at every boundary, on real hyper
//! servers over 127.0.0.1.
//!
//! 1. **A lost reply.** A gateway (`surely::client::http()`, told that the order service
//!    honours keys, a 2 s deadline, and no retry started with less than 1.5 s left: an order
//!    write may take that long) sends `POST /orders` for order `o-1`, with `o-1` as its business
//!    key and its `Idempotency-Key`. The order service (surely's idempotency layer) works for
//!    900 ms, then writes the order, its `OrderCreated` outbox event and its idempotency record
//!    together, and the connection is reset before the reply. The gateway has 1.1 s left, not
//!    enough for another attempt: the caller is told **unknown**, and the gateway's
//!    `LedgerRecorder` writes the call to the UNKNOWN ledger. Meanwhile a monitor reports the
//!    idempotency record still `PROCESSING` past its limit.
//! 2. **Asking again is the query.** The caller sends the same request with the same key: the
//!    idempotency layer replays the stored `201`; there is still one order, and the replay
//!    settles the gateway's ledger entry for `o-1`. Order `o-2` is then
//!    placed without trouble.
//! 3. **Across the asynchronous boundary.** The order service's relay publishes both
//!    `OrderCreated`s and crashes before it marks them; after its lease, a new relay publishes
//!    them again, with the same event ids. The broker delivers every copy; the inventory
//!    service's inbox reserves stock once per event and emits `InventoryReserved` (version 1)
//!    through its own outbox, whose relay crashes the same way; the dispatch consumer's inbox
//!    lets only the first copy of each through.
//! 4. **An effect outside any database.** The dispatch consumer calls the warehouse (a plain
//!    `POST`, no key, no idempotent query): the warehouse commits, and its reply comes after
//!    the attempt's timeout. The call is **unknown** and is not sent again; the order goes to
//!    `PENDING_CONFIRMATION`, and the inventory service's own `LedgerRecorder` writes the call
//!    to the same ledger. A reconciler settles `o-1`'s warehouse call from the warehouse's
//!    journal (asked over HTTP by key; the order service would answer for an order entry that
//!    no replay settled); `o-2`'s journal never answers, so its entry
//!    goes to the manual queue, where a person settles it, saying who and why. A second
//!    reconciler finds nothing left to do, and the verdicts stay as they were.
//!
//! Every step prints its attempts and outcomes; the run ends with one line per invariant (one
//! order per order id, one inventory change per event id, every unknown call queryable in the
//! ledger by its key, processing past its limit alerted, reconciliation run twice the same),
//! then `invariants: ok`, or says what failed and exits with 1.
//!
//! Two modes:
//!
//! ```sh
//! # everything in memory: MemoryStore, MemoryOutbox, MemoryInbox, MemoryLedger, and an
//! # in-process broker that delivers every publish (duplicates included)
//! cargo run --release --example recovery
//!
//! # PostgreSQL for every store (the order, its event and its idempotency record in one
//! # transaction) and NATS JetStream as the broker; tables and stream of its own, dropped at
//! # the end
//! SURELY_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! SURELY_NATS_URL=nats://127.0.0.1:4222 \
//!   cargo run --release --features postgres,nats --example recovery
//! ```
//!
//! (`--postgres URL --nats URL` on the command line do the same as the variables.) A URL that
//! does not answer ends the run with an error; there is no fallback to memory.

#[path = "support/checks.rs"]
mod checks;
#[path = "support/http_client.rs"]
mod http_client;
use checks::Checks;
use http_client::HttpClient;

use std::collections::{HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use surely::fault::{Fault, InjectFaultLayer};
use surely::headers::IDEMPOTENCY_KEY;
use surely::headers::NOT_PROCESSED;
use surely::inbox::{InboxStats, Processed};
use surely::ledger::{
    Entry, EntryState, Filter, Ledger, LedgerRecorder, Reconciler, SettledBy, Settlement, Verdict,
};
use surely::outbox::{Claimed, Event, EventId, Failed, OutboxError, OutboxStore, Relay};
use surely::record::{BusinessKey, CallRecord, InMemoryRecorder};
use surely::record::{OutboxStats, RelayRound};
use surely::retry::backoff::Backoff;
use surely::retry::{Query, ReplayBody, Resolution};
use surely::server::deadline::ServerDeadlineLayer;
use surely::server::idempotency::{IdempotencyLayer, Ticket};
use surely::server::store::{report_stuck, IdempotencyStore, StoredResponse};
use surely::{CallOutcome, Outcome, OutcomeExt};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

// ----- the figures ------------------------------------------------------------------------------

/// How long the order service works on an order before it writes it.
const ORDER_WORK: Duration = Duration::from_millis(900);
/// The gateway's budget per call, and the least it starts a retry with.
const GATEWAY_DEADLINE: Duration = Duration::from_secs(2);
const GATEWAY_MIN_ATTEMPT: Duration = Duration::from_millis(1500);
/// An idempotency record `PROCESSING` for longer than this is reported.
const STUCK_AFTER: Duration = Duration::from_millis(500);
/// How long a relay's claim holds its events.
const RELAY_LEASE: Duration = Duration::from_millis(500);
/// The inventory service's budget for a warehouse call, and per attempt.
const WAREHOUSE_DEADLINE: Duration = Duration::from_millis(1500);
const WAREHOUSE_PER_TRY: Duration = Duration::from_millis(300);
/// How late the warehouse's replies are today.
const WAREHOUSE_LATE: Duration = Duration::from_secs(1);
/// The reconciler: one query's limit, the wait between the queries of an entry, the queries
/// before the manual queue, and the age past which an unsettled entry is reported.
const QUERY_TIMEOUT: Duration = Duration::from_millis(300);
const RECONCILE_BACKOFF: Duration = Duration::from_millis(100);
const MAX_TRIES: u32 = 2;
const ALERT_AFTER: Duration = Duration::from_millis(500);
/// The stock of `sku-42` before any reservation.
const STOCK: i64 = 10;

/// An order's statuses.
const CREATED: &str = "CREATED";
const PENDING: &str = "PENDING_CONFIRMATION";
const CONFIRMED: &str = "CONFIRMED";
const NOT_DISPATCHED: &str = "NOT_DISPATCHED";

/// The warehouse's key for an order's dispatch (its journal is looked up by it).
fn dispatch_key(order: &str) -> String {
    format!("wh-{order}")
}

fn order_created(order: &str) -> Result<Event, BoxError> {
    let about = format!("order {order}");
    Ok(Event::new(
        EventId::derive(&about, "OrderCreated"),
        about,
        1,
        "OrderCreated",
        order.to_owned(),
    )?)
}

fn inventory_reserved(order: &str) -> Result<Event, BoxError> {
    Ok(Event::new(
        EventId::derive(&format!("order {order}"), "InventoryReserved"),
        format!("reservation {order}"),
        1,
        "InventoryReserved",
        order.to_owned(),
    )?)
}

fn order_of(event: &Event) -> String {
    String::from_utf8_lossy(event.payload()).into_owned()
}

// ----- where the services keep their state --------------------------------------------------------

/// A delivery a consumer processed, and what its inbox made of it.
struct Delivered {
    event: Event,
    processed: Processed,
}

/// The dispatch consumer's call to the warehouse for an order: the order's next status.
type Dispatch = Arc<dyn Fn(String) -> BoxFuture<Result<&'static str, BoxError>> + Send + Sync>;

/// The services' state, in memory or in PostgreSQL with JetStream as the broker. The story
/// below is the same for both.
trait World: Send + Sync + 'static {
    type Store: IdempotencyStore + Clone;
    type Outbox: OutboxStore + Clone;
    type Publisher: Service<Event, Error: Into<BoxError>>;
    type Ledger: Ledger + Clone;

    /// One line on where things are kept.
    fn describe(&self) -> String;
    /// What the order service's write is made of, for the log.
    fn one_write(&self) -> &'static str;
    /// What the broker does with a second publish of an event, for the log.
    fn broker(&self) -> &'static str;
    /// The order service's idempotency store.
    fn store(&self) -> Self::Store;
    /// The ledger of unknown calls, shared by the gateway and the inventory service.
    fn ledger(&self) -> Self::Ledger;
    fn order_outbox(&self) -> Self::Outbox;
    fn inventory_outbox(&self) -> Self::Outbox;
    /// The broker, as the relays publish to it.
    fn publisher(&self) -> Self::Publisher;

    /// The order service's write: the order and its `OrderCreated`, and where the store can
    /// join the transaction, the idempotency record completed with `reply`; all or nothing.
    fn create_order(
        &self,
        order: String,
        ticket: Option<Ticket>,
        reply: StoredResponse,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
    fn status(
        &self,
        order: String,
    ) -> impl Future<Output = Result<Option<String>, BoxError>> + Send;
    /// Moves an order from `PENDING_CONFIRMATION` to `to`; false if it was not pending.
    async fn settle_status(&self, order: &str, to: &str) -> Result<bool, BoxError>;
    /// Every order row, duplicates included (so that a duplicate would show).
    async fn orders(&self) -> Result<Vec<String>, BoxError>;
    /// Every reservation row's event id, duplicates included.
    async fn reservations(&self) -> Result<Vec<String>, BoxError>;
    async fn stock(&self) -> Result<i64, BoxError>;
    /// The inventory consumer: every `OrderCreated` delivery waiting, through its inbox; a
    /// fresh one reserves a unit and enqueues `InventoryReserved` in the same write.
    async fn consume_orders(&self, report: fn(&Delivered)) -> Result<Vec<Delivered>, BoxError>;
    /// The dispatch consumer: every `InventoryReserved` delivery waiting, through its inbox;
    /// a fresh one calls the warehouse and records the order's new status.
    async fn consume_reservations(
        &self,
        dispatch: Dispatch,
        report: fn(&Delivered),
    ) -> Result<Vec<Delivered>, BoxError>;
    fn inbox_stats(&self) -> InboxStats;
}

mod memory {
    use super::*;
    use surely::inbox::{MemoryInbox, Versions};
    use surely::ledger::MemoryLedger;
    use surely::outbox::MemoryOutbox;
    use surely::server::store::MemoryStore;

    /// The embedded defaults: every store in memory, one lock per service standing in for its
    /// transaction.
    #[derive(Default)]
    pub(super) struct MemWorld {
        store: MemoryStore,
        ledger: MemoryLedger,
        order_outbox: MemoryOutbox,
        inventory_outbox: MemoryOutbox,
        broker: Broker,
        inbox: MemoryInbox,
        orders: Mutex<Vec<(String, String)>>,
        inventory: Mutex<Inventory>,
    }

    struct Inventory {
        stock: i64,
        reservations: Vec<String>,
    }

    impl Default for Inventory {
        fn default() -> Self {
            Inventory {
                stock: STOCK,
                reservations: Vec::new(),
            }
        }
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An in-process broker: every publish is a delivery, per event kind, in order; like a
    /// real broker past its duplicate window, it delivers a second publish of an event again.
    #[derive(Clone, Default)]
    pub(super) struct Broker(Arc<Mutex<HashMap<String, VecDeque<Event>>>>);

    impl Broker {
        fn take(&self, kind: &str) -> Vec<Event> {
            lock(&self.0)
                .get_mut(kind)
                .map(|q| q.drain(..).collect())
                .unwrap_or_default()
        }
    }

    impl Service<Event> for Broker {
        type Response = ();
        type Error = Infallible;
        type Future = std::future::Ready<Result<(), Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, event: Event) -> Self::Future {
            lock(&self.0)
                .entry(event.kind().to_owned())
                .or_default()
                .push_back(event);
            std::future::ready(Ok(()))
        }
    }

    impl MemWorld {
        pub(super) fn new() -> Self {
            Self::default()
        }
    }

    impl World for MemWorld {
        type Store = MemoryStore;
        type Outbox = MemoryOutbox;
        type Publisher = Broker;
        type Ledger = MemoryLedger;

        fn describe(&self) -> String {
            "memory: MemoryStore, MemoryOutbox, MemoryInbox, MemoryLedger; an in-process broker \
             that delivers every publish"
                .to_owned()
        }

        fn one_write(&self) -> &'static str {
            "the order and its OrderCreated under one lock (no transaction in memory: the layer \
             completes the idempotency record right after the handler)"
        }

        fn broker(&self) -> &'static str {
            "the in-process broker delivers every publish, the second one included"
        }

        fn store(&self) -> MemoryStore {
            self.store.clone()
        }

        fn ledger(&self) -> MemoryLedger {
            self.ledger.clone()
        }

        fn order_outbox(&self) -> MemoryOutbox {
            self.order_outbox.clone()
        }

        fn inventory_outbox(&self) -> MemoryOutbox {
            self.inventory_outbox.clone()
        }

        fn publisher(&self) -> Broker {
            self.broker.clone()
        }

        async fn create_order(
            &self,
            order: String,
            _: Option<Ticket>,
            _: StoredResponse,
        ) -> Result<(), BoxError> {
            // No transaction in memory: the order and its event under one lock; the layer
            // completes the idempotency record once the handler has answered.
            let event = order_created(&order)?;
            let mut orders = lock(&self.orders);
            orders.push((order, CREATED.to_owned()));
            self.order_outbox.enqueue(event);
            Ok(())
        }

        async fn status(&self, order: String) -> Result<Option<String>, BoxError> {
            Ok(lock(&self.orders)
                .iter()
                .find(|(o, _)| *o == order)
                .map(|(_, s)| s.clone()))
        }

        async fn settle_status(&self, order: &str, to: &str) -> Result<bool, BoxError> {
            let mut orders = lock(&self.orders);
            Ok(match orders.iter_mut().find(|(o, _)| o == order) {
                Some((_, status)) if status == PENDING => {
                    *status = to.to_owned();
                    true
                }
                _ => false,
            })
        }

        async fn orders(&self) -> Result<Vec<String>, BoxError> {
            Ok(lock(&self.orders).iter().map(|(o, _)| o.clone()).collect())
        }

        async fn reservations(&self) -> Result<Vec<String>, BoxError> {
            Ok(lock(&self.inventory).reservations.clone())
        }

        async fn stock(&self) -> Result<i64, BoxError> {
            Ok(lock(&self.inventory).stock)
        }

        async fn consume_orders(&self, report: fn(&Delivered)) -> Result<Vec<Delivered>, BoxError> {
            let mut out = Vec::new();
            for event in self.broker.take("OrderCreated") {
                let processed = self
                    .inbox
                    .process("inventory", &event, Versions::InOrder, || async {
                        let reserved = inventory_reserved(&order_of(&event))?;
                        let mut inventory = lock(&self.inventory);
                        inventory.stock -= 1;
                        inventory.reservations.push(event.id().as_str().to_owned());
                        self.inventory_outbox.enqueue(reserved);
                        Ok::<_, BoxError>(Bytes::from("reserved 1 x sku-42"))
                    })
                    .await?;
                let delivered = Delivered { event, processed };
                report(&delivered);
                out.push(delivered);
            }
            Ok(out)
        }

        async fn consume_reservations(
            &self,
            dispatch: Dispatch,
            report: fn(&Delivered),
        ) -> Result<Vec<Delivered>, BoxError> {
            let mut out = Vec::new();
            for event in self.broker.take("InventoryReserved") {
                let order = order_of(&event);
                let processed = self
                    .inbox
                    .process("dispatch", &event, Versions::InOrder, || async {
                        let status = dispatch(order.clone()).await?;
                        if let Some((_, s)) =
                            lock(&self.orders).iter_mut().find(|(o, _)| *o == order)
                        {
                            *s = status.to_owned();
                        }
                        Ok::<_, BoxError>(Bytes::from(status))
                    })
                    .await?;
                let delivered = Delivered { event, processed };
                report(&delivered);
                out.push(delivered);
            }
            Ok(out)
        }

        fn inbox_stats(&self) -> InboxStats {
            self.inbox.stats()
        }
    }
}

#[cfg(all(feature = "postgres", feature = "nats"))]
mod durable {
    use std::time::{SystemTime, UNIX_EPOCH};

    use super::*;
    use surely::deps::async_nats::{
        self,
        jetstream::{self, consumer, stream},
    };
    use surely::inbox::{PostgresInbox, Versions};
    use surely::ledger::PostgresLedger;
    use surely::outbox::{JetStreamPublisher, PostgresOutbox};
    use surely::postgres::Pool;
    use surely::server::store::PostgresStore;
    use tokio_stream::StreamExt;

    /// How long the first contact with PostgreSQL or NATS may take.
    const CONNECT: Duration = Duration::from_secs(5);
    /// JetStream's duplicate window for the run's stream: shorter than a relay's lease, so that
    /// a crashed relay's second publish is stored and delivered again, as it is in production
    /// once a relay stays down past the window (2 minutes by default).
    const DUPLICATE_WINDOW: Duration = Duration::from_millis(100);
    /// The tables the crate's stores keep, after the run's prefix.
    const STORE_TABLES: [&str; 5] = ["_idem", "_order_outbox", "_inv_outbox", "_inbox", "_ledger"];

    /// Every store in PostgreSQL (tables of the run's own), NATS JetStream as the broker (a
    /// stream of the run's own, a durable pull consumer per event kind).
    pub(crate) struct PgWorld {
        pg_url: String,
        nats_url: String,
        pool: Pool,
        prefix: String,
        store: PostgresStore,
        ledger: PostgresLedger,
        order_outbox: PostgresOutbox,
        inventory_outbox: PostgresOutbox,
        inbox: PostgresInbox,
        js: jetstream::Context,
        reserve: consumer::PullConsumer,
        dispatch: consumer::PullConsumer,
    }

    impl PgWorld {
        /// Connects to both, and makes the run's tables and stream; fails if either does not
        /// answer.
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
            let prefix = format!("surely_rec_{}_{nanos}", std::process::id());
            client
                .batch_execute(&format!(
                    "CREATE TABLE {prefix}_orders (id text NOT NULL, status text NOT NULL);
                     CREATE TABLE {prefix}_stock (sku text PRIMARY KEY, qty bigint NOT NULL);
                     INSERT INTO {prefix}_stock VALUES ('sku-42', {STOCK});
                     CREATE TABLE {prefix}_reservations (event_id text NOT NULL, order_id text NOT NULL);"
                ))
                .await?;
            let table = |suffix: &str| format!("{prefix}{suffix}");
            let world = PgWorld {
                pg_url: pg_url.to_owned(),
                nats_url: nats_url.to_owned(),
                store: PostgresStore::new(pool.clone()).with_table(&table("_idem"))?,
                ledger: PostgresLedger::new(pool.clone()).with_table(&table("_ledger"))?,
                order_outbox: PostgresOutbox::new(pool.clone())
                    .with_table(&table("_order_outbox"))?,
                inventory_outbox: PostgresOutbox::new(pool.clone())
                    .with_table(&table("_inv_outbox"))?,
                inbox: PostgresInbox::new(pool.clone()).with_table(&table("_inbox"))?,
                reserve: consumer_of(&js, &prefix, "OrderCreated").await?,
                dispatch: consumer_of(&js, &prefix, "InventoryReserved").await?,
                js,
                pool,
                prefix,
            };
            world.store.migrate().await?;
            world.ledger.migrate().await?;
            world.order_outbox.migrate().await?;
            world.inventory_outbox.migrate().await?;
            world.inbox.migrate().await?;
            Ok(world)
        }

        /// Drops the run's tables, their migration records and its stream; says what it
        /// dropped.
        pub(crate) async fn clean_up(&self) -> Result<String, BoxError> {
            let p = &self.prefix;
            let client = self.pool.get().await?;
            client
                .batch_execute(&format!(
                    "DROP TABLE IF EXISTS {p}_orders, {p}_stock, {p}_reservations, {p}_idem,
                         {p}_order_outbox, {p}_inv_outbox, {p}_inbox_task_steps,
                         {p}_inbox_tasks, {p}_inbox, {p}_inbox_versions,
                         {p}_ledger_attempts, {p}_ledger;
                     DROP FUNCTION IF EXISTS {p}_idem_acquire;"
                ))
                .await?;
            let targets: Vec<String> = STORE_TABLES.iter().map(|t| format!("{p}{t}")).collect();
            client
                .execute(
                    "DELETE FROM surely_migrations WHERE target = ANY($1)",
                    &[&targets],
                )
                .await?;
            self.js.delete_stream(p).await?;
            Ok(format!("the tables {p}_* and the stream {p}"))
        }

        fn sql(&self, statement: &str) -> String {
            statement.replace("{p}", &self.prefix)
        }
    }

    /// A stream for the run (if it is not there yet), and a durable pull consumer of one kind.
    async fn consumer_of(
        js: &jetstream::Context,
        name: &str,
        kind: &str,
    ) -> Result<consumer::PullConsumer, BoxError> {
        let stream = js
            .get_or_create_stream(stream::Config {
                name: name.to_owned(),
                subjects: vec![format!("{name}.>")],
                duplicate_window: DUPLICATE_WINDOW,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("cannot make a JetStream stream (is JetStream on?): {e}"))?;
        Ok(stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some(kind.to_lowercase()),
                filter_subject: format!("{name}.{kind}"),
                ack_wait: Duration::from_secs(10),
                ..Default::default()
            })
            .await?)
    }

    /// The messages waiting for `consumer`: batches until one comes back empty.
    async fn fetch(consumer: &consumer::PullConsumer) -> Result<Vec<jetstream::Message>, BoxError> {
        let mut all = Vec::new();
        loop {
            let mut batch = consumer
                .fetch()
                .max_messages(10)
                .expires(Duration::from_millis(300))
                .messages()
                .await?;
            let before = all.len();
            while let Some(message) = batch.next().await {
                all.push(message?);
            }
            if all.len() == before {
                return Ok(all);
            }
        }
    }

    impl World for PgWorld {
        type Store = PostgresStore;
        type Outbox = PostgresOutbox;
        type Publisher = JetStreamPublisher;
        type Ledger = PostgresLedger;

        fn describe(&self) -> String {
            format!(
                "PostgreSQL at {} (tables {}_*): PostgresStore, PostgresOutbox, PostgresInbox, \
                 PostgresLedger; NATS JetStream at {} (stream {}, duplicate window {})",
                self.pg_url,
                self.prefix,
                self.nats_url,
                self.prefix,
                ms(DUPLICATE_WINDOW)
            )
        }

        fn one_write(&self) -> &'static str {
            "the order, its OrderCreated and its idempotency record (complete_in) in one transaction"
        }

        fn broker(&self) -> &'static str {
            "JetStream stores the second publish: the stream's duplicate window (100ms here) has passed"
        }

        fn store(&self) -> PostgresStore {
            self.store.clone()
        }

        fn ledger(&self) -> PostgresLedger {
            self.ledger.clone()
        }

        fn order_outbox(&self) -> PostgresOutbox {
            self.order_outbox.clone()
        }

        fn inventory_outbox(&self) -> PostgresOutbox {
            self.inventory_outbox.clone()
        }

        fn publisher(&self) -> JetStreamPublisher {
            JetStreamPublisher::new(self.js.clone(), self.prefix.clone())
        }

        async fn create_order(
            &self,
            order: String,
            ticket: Option<Ticket>,
            reply: StoredResponse,
        ) -> Result<(), BoxError> {
            // One transaction: the order, its event, and the idempotency record completed.
            let event = order_created(&order)?;
            let insert = self.sql("INSERT INTO {p}_orders (id, status) VALUES ($1, $2)");
            let mut client = self.pool.get().await?;
            let txn = client.transaction().await?;
            txn.execute(&insert, &[&order, &CREATED]).await?;
            self.order_outbox.enqueue(&txn, &event).await?;
            if let Some(ticket) = &ticket {
                self.store.complete_in(&txn, ticket, &reply).await?;
            }
            txn.commit().await?;
            Ok(())
        }

        async fn status(&self, order: String) -> Result<Option<String>, BoxError> {
            let select = self.sql("SELECT status FROM {p}_orders WHERE id = $1 LIMIT 1");
            let client = self.pool.get().await?;
            let row = client.query_opt(&select, &[&order]).await?;
            Ok(row.map(|r| r.get(0)))
        }

        async fn settle_status(&self, order: &str, to: &str) -> Result<bool, BoxError> {
            let update =
                self.sql("UPDATE {p}_orders SET status = $2 WHERE id = $1 AND status = $3");
            let client = self.pool.get().await?;
            Ok(client.execute(&update, &[&order, &to, &PENDING]).await? > 0)
        }

        async fn orders(&self) -> Result<Vec<String>, BoxError> {
            let client = self.pool.get().await?;
            let rows = client
                .query(&self.sql("SELECT id FROM {p}_orders ORDER BY id"), &[])
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        }

        async fn reservations(&self) -> Result<Vec<String>, BoxError> {
            let client = self.pool.get().await?;
            let rows = client
                .query(&self.sql("SELECT event_id FROM {p}_reservations"), &[])
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        }

        async fn stock(&self) -> Result<i64, BoxError> {
            let client = self.pool.get().await?;
            let row = client
                .query_one(
                    &self.sql("SELECT qty FROM {p}_stock WHERE sku = 'sku-42'"),
                    &[],
                )
                .await?;
            Ok(row.get(0))
        }

        async fn consume_orders(&self, report: fn(&Delivered)) -> Result<Vec<Delivered>, BoxError> {
            let mut out = Vec::new();
            for message in fetch(&self.reserve).await? {
                let event = Event::from_nats(&message)?;
                let order = order_of(&event);
                let reserved = inventory_reserved(&order)?;
                let id = event.id().as_str().to_owned();
                let take = self.sql("UPDATE {p}_stock SET qty = qty - 1 WHERE sku = 'sku-42'");
                let reserve =
                    self.sql("INSERT INTO {p}_reservations (event_id, order_id) VALUES ($1, $2)");
                let outbox = self.inventory_outbox.clone();
                // The reservation, the inbox's record and InventoryReserved: one transaction,
                // acknowledged after its commit.
                let processed = self
                    .inbox
                    .process_jetstream(&message, "inventory", Versions::InOrder, move |txn| {
                        Box::pin(async move {
                            txn.execute(&take, &[]).await?;
                            txn.execute(&reserve, &[&id, &order]).await?;
                            outbox.enqueue(txn, &reserved).await?;
                            Ok::<_, BoxError>(Bytes::from("reserved 1 x sku-42"))
                        })
                    })
                    .await?;
                let delivered = Delivered { event, processed };
                report(&delivered);
                out.push(delivered);
            }
            Ok(out)
        }

        async fn consume_reservations(
            &self,
            dispatch: Dispatch,
            report: fn(&Delivered),
        ) -> Result<Vec<Delivered>, BoxError> {
            let mut out = Vec::new();
            for message in fetch(&self.dispatch).await? {
                let event = Event::from_nats(&message)?;
                let order = order_of(&event);
                let update = self.sql("UPDATE {p}_orders SET status = $2 WHERE id = $1");
                let dispatch = dispatch.clone();
                // The warehouse call happens inside the consumer's transaction: if the commit
                // failed after it, the redelivery would call the warehouse again. That is the
                // boundary the ledger is for.
                let processed = self
                    .inbox
                    .process_jetstream(&message, "dispatch", Versions::InOrder, move |txn| {
                        Box::pin(async move {
                            let status = dispatch(order.clone()).await?;
                            txn.execute(&update, &[&order, &status]).await?;
                            Ok::<_, BoxError>(Bytes::from(status))
                        })
                    })
                    .await?;
                let delivered = Delivered { event, processed };
                report(&delivered);
                out.push(delivered);
            }
            Ok(out)
        }

        fn inbox_stats(&self) -> InboxStats {
            self.inbox.stats()
        }
    }
}

// ----- fault injection ----------------------------------------------------------------------------

/// An outbox as a relay that crashes sees it: it publishes its batch, and dies before it
/// marks it (the mark fails, the round ends with an error, and the relay is dropped).
struct CrashesBeforeMark<St>(St);

impl<St: OutboxStore> OutboxStore for CrashesBeforeMark<St> {
    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Claimed>, OutboxError> {
        self.0.claim(max, lease).await
    }

    async fn published(&self, _: &Claimed) -> Result<(), OutboxError> {
        Err(OutboxError::backend("the relay crashed before it marked"))
    }

    async fn published_all(&self, _: &[Claimed]) -> Result<usize, OutboxError> {
        Err(OutboxError::backend("the relay crashed before it marked"))
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

// ----- the order service --------------------------------------------------------------------------

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(body.into()));
    *res.status_mut() = status;
    res
}

/// What the order service's door lets through: the first `POST` with key `o-1` is reset
/// after the handler has answered (the reply is lost).
#[derive(Default)]
struct Door {
    lost: AtomicBool,
}

impl Door {
    fn fault(&self, req: &Request<Incoming>) -> Option<Fault> {
        if req.method() != Method::POST {
            return None;
        }
        let key = req
            .headers()
            .get(IDEMPOTENCY_KEY)
            .and_then(|k| k.to_str().ok())
            .unwrap_or("-");
        let lose = key == "o-1" && !self.lost.swap(true, Ordering::SeqCst);
        if lose {
            println!("  orders     POST /orders (key {key}): will do the work, then reset the connection before the reply");
            Some(Fault::ResetAfterSend)
        } else {
            println!("  orders     POST /orders (key {key})");
            None
        }
    }
}

async fn order_handler<W: World>(
    world: Arc<W>,
    req: Request<Full<Bytes>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    Ok(match (parts.method, path.as_str()) {
        (Method::POST, "/orders") => {
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let order = String::from_utf8_lossy(&body).into_owned();
            let ticket = parts.extensions.get::<Ticket>().cloned();
            let fence = ticket.as_ref().map_or(0, |t| t.fence().get());
            tokio::time::sleep(ORDER_WORK).await;
            let stored = StoredResponse::new(StatusCode::CREATED, &HeaderMap::new(), body.clone());
            match world.create_order(order.clone(), ticket, stored).await {
                Ok(()) => {
                    println!(
                        "  orders     handler: order {order} written after {} (fence {fence}): {}",
                        ms(ORDER_WORK),
                        world.one_write()
                    );
                    reply(StatusCode::CREATED, body)
                }
                Err(e) => {
                    println!(
                        "  orders     handler: the write of {order} failed and rolled back: {e}"
                    );
                    let mut res = reply(StatusCode::SERVICE_UNAVAILABLE, "");
                    res.headers_mut()
                        .insert(NOT_PROCESSED, http::HeaderValue::from_static("true"));
                    res
                }
            }
        }
        (Method::GET, p) if p.starts_with("/orders/") => {
            let order = p.trim_start_matches("/orders/").to_owned();
            match world.status(order.clone()).await {
                Ok(Some(status)) => reply(StatusCode::OK, format!("order {order}: {status}")),
                Ok(None) => reply(StatusCode::NOT_FOUND, ""),
                Err(_) => reply(StatusCode::SERVICE_UNAVAILABLE, ""),
            }
        }
        _ => reply(StatusCode::NOT_FOUND, ""),
    })
}

/// Serves the order service on a fresh port: deadline → door (faults) → idempotency → handler.
async fn serve_orders<W: World>(world: Arc<W>) -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let door = Arc::new(Door::default());
    let svc = ServiceBuilder::new()
        .layer(
            ServerDeadlineLayer::builder()
                .max(Duration::from_secs(10))
                .build()?,
        )
        .layer(InjectFaultLayer::new(move |req: &Request<Incoming>| {
            door.fault(req)
        }))
        .layer(IdempotencyLayer::builder(world.store()).build()?)
        .service_fn(move |req| order_handler(world.clone(), req));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    Ok(addr)
}

// ----- the warehouse --------------------------------------------------------------------------------

/// A warehouse system: `POST /reservations` commits to its journal and answers late; `GET
/// /journal/{key}` says whether a key is in the journal, except for the keys on a shard that
/// does not answer.
#[derive(Default)]
struct Warehouse {
    journal: Mutex<Vec<String>>,
    down: HashSet<String>,
}

impl Warehouse {
    fn posts(&self, key: &str) -> usize {
        self.journal
            .lock()
            .map_or(0, |j| j.iter().filter(|k| *k == key).count())
    }
}

async fn warehouse_handler(
    warehouse: Arc<Warehouse>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    Ok(match (parts.method, path.as_str()) {
        (Method::POST, "/reservations") => {
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let key = String::from_utf8_lossy(&body).into_owned();
            if let Ok(mut journal) = warehouse.journal.lock() {
                journal.push(key.clone());
            }
            println!(
                "  warehouse  POST /reservations {key}: committed to the journal; the reply takes {}",
                ms(WAREHOUSE_LATE)
            );
            tokio::time::sleep(WAREHOUSE_LATE).await;
            reply(StatusCode::CREATED, key)
        }
        (Method::GET, p) if p.starts_with("/journal/") => {
            let key = p.trim_start_matches("/journal/");
            if warehouse.down.contains(key) {
                println!("  warehouse  GET /journal/{key}: its journal shard does not answer");
                std::future::pending::<()>().await;
            }
            if warehouse.posts(key) > 0 {
                reply(StatusCode::OK, format!("{key} is in the warehouse journal"))
            } else {
                reply(StatusCode::NOT_FOUND, "")
            }
        }
        _ => reply(StatusCode::NOT_FOUND, ""),
    })
}

async fn serve_warehouse(warehouse: Arc<Warehouse>) -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let warehouse = warehouse.clone();
            let svc =
                hyper::service::service_fn(move |req| warehouse_handler(warehouse.clone(), req));
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    Ok(addr)
}

// ----- the clients ------------------------------------------------------------------------------------

type Transport = Client<HttpConnector, ReplayBody<Full<Bytes>>>;
/// Every client's records: kept in memory for the timelines and the invariants, and every
/// unknown call written to the ledger.
type Records = (InMemoryRecorder, LedgerRecorder);

fn transport() -> Transport {
    Client::builder(TokioExecutor::new()).build_http()
}

fn post(
    uri: String,
    body: &str,
    key: &str,
    idempotency_key: bool,
) -> Result<Request<Full<Bytes>>, BoxError> {
    let mut req = Request::post(uri);
    if idempotency_key {
        req = req.header(IDEMPOTENCY_KEY, key);
    }
    let mut req = req.body(Full::new(Bytes::from(body.to_owned())))?;
    req.extensions_mut().insert(BusinessKey::new(key));
    Ok(req)
}

/// What a call came to: the outcome handed back, and the answer read to its end (reading it
/// settles the attempt's record) or the error.
struct Answer {
    outcome: Option<CallOutcome>,
    got: Result<(StatusCode, bool, String), String>,
}

async fn answer<B, E>(res: Result<Response<B>, surely::Error<E>>) -> Answer
where
    B: http_body::Body,
    B::Error: std::fmt::Display,
    E: std::error::Error + 'static,
{
    let outcome = res.call_outcome().cloned();
    let got = match res {
        Ok(res) => {
            let status = res.status();
            let replayed = res.call_outcome().is_some_and(CallOutcome::is_replayed);
            match res.into_body().collect().await {
                Ok(b) => Ok((
                    status,
                    replayed,
                    String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                )),
                Err(e) => Err(format!("{status}, then the body broke: {e}")),
            }
        }
        Err(e) => Err(chain(&e)),
    };
    Answer { outcome, got }
}

/// An error and its sources, on one line.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        out.push_str(": ");
        out.push_str(&e.to_string());
        next = e.source();
    }
    out
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Prints the attempts of the last call with `key`, and the call; returns the call.
fn timeline(records: &InMemoryRecorder, key: &str) -> Option<CallRecord> {
    let call = records
        .calls()
        .into_iter()
        .rev()
        .find(|c| c.key.as_ref().is_some_and(|k| k.as_str() == key))?;
    let mut attempts = records.attempts_of(call.call);
    attempts.sort_by_key(|a| a.attempt);
    for a in &attempts {
        let timeout = a
            .timeout
            .as_ref()
            .map_or(String::new(), |t| format!(", {t}"));
        println!(
            "    attempt {}: {} with {} left, took {}: {} ({}{timeout})",
            a.attempt,
            call.operation
                .as_ref()
                .map_or("-".to_owned(), ToString::to_string),
            a.deadline_left.map_or("-".to_owned(), ms),
            ms(a.duration()),
            a.class().as_str(),
            a.phase().as_str(),
        );
    }
    println!(
        "    call {key}: {} after {} attempt(s), stop: {}, in {} of its {}",
        call.outcome.as_str(),
        call.attempts,
        call.stop.as_str(),
        ms(call.duration()),
        call.deadline_left.map_or("-".to_owned(), ms),
    );
    Some(call)
}

fn print_answer(who: &str, answer: &Answer) {
    match &answer.got {
        Ok((status, replayed, body)) => {
            let note = if *replayed { ", replayed" } else { "" };
            println!("  {who:<10} got {status}{note}, body {body:?}");
        }
        Err(e) => println!("  {who:<10} got an error: {e}"),
    }
    match &answer.outcome {
        Some(o) => println!("  {who:<10} handed back: {o}"),
        None => println!("  {who:<10} handed back no outcome"),
    }
}

// ----- the story -------------------------------------------------------------------------------------

/// Everything the steps share.
struct Chain<W: World> {
    world: Arc<W>,
    orders: SocketAddr,
    warehouse: Arc<Warehouse>,
    warehouse_addr: SocketAddr,
    records: InMemoryRecorder,
    ledger_records: LedgerRecorder,
    checks: Checks,
    /// What the idempotency monitor reported during step 1: key, age.
    stuck: Option<(String, Duration)>,
    /// What the reconcilers did.
    rounds: Vec<(&'static str, surely::ledger::ReconcileRound)>,
    /// Whether the second reconciliation left every entry as the first did.
    again_same: bool,
}

impl<W: World> Chain<W> {
    fn recorder(&self) -> Records {
        (self.records.clone(), self.ledger_records.clone())
    }

    /// The gateway's client for the order service.
    fn gateway(&self) -> Result<impl HttpClient + use<W>, BoxError> {
        Ok(surely::client::http()
            .server_honours_keys()
            .timeout(GATEWAY_DEADLINE)
            .retry(|r| {
                r.backoff(Backoff::constant(Duration::from_millis(50)))
                    .min_attempt_time(GATEWAY_MIN_ATTEMPT)
            })
            .recorder(self.recorder())
            .build(transport())?)
    }

    /// Step 1: the lost reply, and the monitor that watches the idempotency records.
    async fn lost_reply(&mut self) -> Result<(), BoxError> {
        println!("1. The gateway POSTs order o-1 (key o-1); the order service works {}, writes it, and the reply is lost.", ms(ORDER_WORK));
        println!("   Expect: maybe committed, {} of the gateway's {} left, less than the {} an attempt needs:", ms(GATEWAY_DEADLINE - ORDER_WORK), ms(GATEWAY_DEADLINE), ms(GATEWAY_MIN_ATTEMPT));
        println!("   no retry, the caller told unknown, the call in the ledger; the record PROCESSING past {} reported.", ms(STUCK_AFTER));
        let monitor = tokio::spawn(watch_stuck(self.world.store()));
        let mut gateway = self.gateway()?;
        let req = post(format!("http://{}/orders", self.orders), "o-1", "o-1", true)?;
        let got = answer(gateway.ready().await?.call(req).await).await;
        print_answer("gateway", &got);
        let call = timeline(&self.records, "o-1");
        self.stuck = monitor.await?;
        match &self.stuck {
            Some((key, age)) => println!(
                "  monitor    report_stuck: the idempotency record {key} PROCESSING for {} (limit {}): alert",
                ms(*age),
                ms(STUCK_AFTER)
            ),
            None => println!("  monitor    report_stuck found nothing"),
        }
        self.ledger_records.flush().await;
        let entries = self.world.ledger().by_key("o-1").await?;
        for e in &entries {
            println!(
                "  ledger     entry {} for key o-1: {}, {} attempt(s) of evidence, state {}",
                e.evidence.id,
                e.evidence.operation.as_deref().unwrap_or("-"),
                e.evidence.attempts.len(),
                e.state.as_str()
            );
        }
        let outcome = got.outcome.as_ref().map(CallOutcome::outcome);
        self.checks.check(
            outcome == Some(Outcome::Unknown),
            format!("step 1: the caller was told unknown (was {outcome:?})"),
        );
        self.checks.check(
            call.is_some_and(|c| c.attempts == 1 && c.outcome == Outcome::Unknown),
            "step 1: one attempt, and the record says unknown",
        );
        self.checks.check(
            entries.len() == 1,
            "step 1: the unknown call is one ledger entry",
        );
        Ok(())
    }

    /// Step 2: the same request again, and a second order.
    async fn ask_again(&mut self) -> Result<(), BoxError> {
        println!();
        println!("2. The caller sends the same POST again, with the same key o-1.");
        println!("   Expect: the idempotency layer replays the stored 201; still one order o-1.");
        let mut gateway = self.gateway()?;
        let req = post(format!("http://{}/orders", self.orders), "o-1", "o-1", true)?;
        let got = answer(gateway.ready().await?.call(req).await).await;
        print_answer("gateway", &got);
        timeline(&self.records, "o-1");
        let replayed = got.outcome.as_ref().is_some_and(CallOutcome::is_replayed);
        self.checks.check(
            replayed && got.outcome.as_ref().map(CallOutcome::outcome) == Some(Outcome::Succeeded),
            "step 2: the second POST succeeded as a replay",
        );
        self.checks.check(
            matches!(&got.got, Ok((StatusCode::CREATED, _, body)) if body == "o-1"),
            "step 2: the replay is the stored 201 for o-1",
        );
        // The replay proves the first call took effect: the gateway's recorder settles its
        // ledger entry, without waiting for the reconciler.
        self.ledger_records.flush().await;
        let entries = self.world.ledger().by_key("o-1").await?;
        for e in &entries {
            let how = e.settlement.as_ref().map_or_else(
                || "not settled".to_owned(),
                |s| format!("settled {}: {}", s.verdict.as_str(), s.evidence),
            );
            println!("  ledger     entry {} for key o-1: {}", e.evidence.id, how);
        }
        self.checks.check(
            entries.len() == 1 && entries[0].state == EntryState::Settled,
            "step 2: the replay settled the ledger entry of o-1",
        );
        println!("   Then order o-2, without trouble.");
        let req = post(format!("http://{}/orders", self.orders), "o-2", "o-2", true)?;
        let got = answer(gateway.ready().await?.call(req).await).await;
        print_answer("gateway", &got);
        timeline(&self.records, "o-2");
        self.checks.check(
            got.outcome.as_ref().map(CallOutcome::outcome) == Some(Outcome::Succeeded),
            "step 2: o-2 was placed",
        );
        let orders = self.world.orders().await?;
        println!("  orders     hold: {}", orders.join(", "));
        Ok(())
    }

    /// Step 3: the relays crash before marking; the consumers' inboxes absorb the copies.
    async fn across_the_boundary(&mut self) -> Result<(), BoxError> {
        println!();
        println!("3. The order service's relay publishes, then crashes before it marks; a new relay publishes again after the {} lease.", ms(RELAY_LEASE));
        println!("   Expect: every event delivered twice; the inventory inbox reserves once per event id, and emits InventoryReserved v1.");
        self.relay("order relay", self.world.order_outbox()).await?;
        let stock_before = self.world.stock().await?;
        self.world
            .consume_orders(|d| print_delivery("inventory", d))
            .await?;
        println!(
            "  inventory  stock of sku-42: {stock_before} -> {}",
            self.world.stock().await?
        );
        println!("   The inventory service's relay crashes the same way with its InventoryReserved events;");
        println!("   its dispatch consumer calls the warehouse for the first copy of each (step 4), and no more.");
        self.relay("inventory relay", self.world.inventory_outbox())
            .await?;
        Ok(())
    }

    /// A relay that publishes and crashes before marking, then a new one that publishes the
    /// same events after the lease.
    async fn relay(&mut self, name: &str, outbox: W::Outbox) -> Result<(), BoxError> {
        let mut crashing =
            Relay::builder(CrashesBeforeMark(outbox.clone()), self.world.publisher())
                .lease(RELAY_LEASE)
                .no_sweep()
                .build()?;
        match crashing.run_once().await {
            Ok(round) => println!("  {name:<10} round: {}", fmt_round(&round)),
            Err(e) => println!("  {name:<10} published its batch, then: {e}"),
        }
        drop(crashing);
        let mut relay = Relay::builder(outbox, self.world.publisher())
            .lease(RELAY_LEASE)
            .no_sweep()
            .build()?;
        let round = relay.run_once().await?;
        println!(
            "  {name:<10} restarted at once: {} (the crashed relay's lease holds them)",
            fmt_round(&round)
        );
        // A little past the lease: PostgreSQL's clock decides there.
        tokio::time::sleep(RELAY_LEASE + Duration::from_millis(50)).await;
        let round = relay.run_once().await?;
        println!(
            "  {name:<10} after the lease: {}; {}",
            fmt_round(&round),
            self.world.broker()
        );
        self.checks.check(
            round.published == 2,
            format!("{name}: the restarted relay published both events again"),
        );
        Ok(())
    }

    /// Step 4: the dispatch consumer's warehouse calls, and their reconciliation.
    async fn warehouse(&mut self) -> Result<(), BoxError> {
        println!();
        println!("4. The dispatch consumer POSTs each reservation to the warehouse (no key; it commits, then answers after {},", ms(WAREHOUSE_LATE));
        println!("   past the {} attempt timeout).", ms(WAREHOUSE_PER_TRY));
        println!("   Expect: unknown, not sent again, the order PENDING_CONFIRMATION, the call in the ledger.");
        let dispatch = self.dispatch()?;
        self.world
            .consume_reservations(dispatch, |d| print_delivery("dispatch", d))
            .await?;
        self.ledger_records.flush().await;
        for order in ["o-1", "o-2"] {
            let key = dispatch_key(order);
            let call = timeline(&self.records, &key);
            let status = self.world.status(order.to_owned()).await?;
            let entries = self.world.ledger().by_key(&key).await?;
            println!(
                "  inventory  order {order}: {}; ledger entries for {key}: {}; warehouse journal holds it {} time(s)",
                status.as_deref().unwrap_or("-"),
                entries.len(),
                self.warehouse.posts(&key)
            );
            self.checks.check(
                call.is_some_and(|c| {
                    c.outcome == Outcome::Unknown
                        && c.attempts == 1
                        && c.stop == surely::StopReason::Unknown
                }),
                format!("step 4: {key} ended unknown after one attempt, not retried"),
            );
            self.checks.check(
                status.as_deref() == Some(PENDING),
                format!("step 4: {order} went to {PENDING}"),
            );
        }
        self.reconcile().await
    }

    /// The dispatch consumer's warehouse call, through the inventory service's own client.
    fn dispatch(&self) -> Result<Dispatch, BoxError> {
        let client = surely::client::http()
            .no_idempotency_keys()
            .timeout(WAREHOUSE_DEADLINE)
            .per_try_timeout(WAREHOUSE_PER_TRY)
            .recorder(self.recorder())
            .build(transport())?;
        let base = format!("http://{}", self.warehouse_addr);
        Ok(Arc::new(move |order: String| {
            let client = client.clone();
            let base = base.clone();
            Box::pin(async move {
                let key = dispatch_key(&order);
                let req = post(format!("{base}/reservations"), &key, &key, false)?;
                let got = answer(client.oneshot(req).await).await;
                let outcome = got.outcome.as_ref().map(CallOutcome::outcome);
                let status = match outcome {
                    Some(Outcome::Succeeded) => CONFIRMED,
                    Some(Outcome::Failed) => NOT_DISPATCHED,
                    _ => PENDING,
                };
                println!(
                    "  dispatch   POST /reservations {key}: {}; order {order} -> {status}",
                    got.outcome
                        .map_or("no outcome".to_owned(), |o| o.to_string())
                );
                Ok(status)
            }) as BoxFuture<_>
        }))
    }

    /// The reconciler's rounds, the manual queue, and the second reconciler.
    async fn reconcile(&mut self) -> Result<(), BoxError> {
        println!();
        println!("   The reconciler asks by key, and by operation which downstream: the warehouse's journal for the warehouse calls (o-1's entry was settled by its replay)");
        println!("   (the query times out after {}, {} unanswered queries go to the manual queue; entries unsettled", ms(QUERY_TIMEOUT), MAX_TRIES);
        println!(
            "   past {} are reported). Its next scheduled round is {} away.",
            ms(ALERT_AFTER),
            ms(ALERT_AFTER)
        );
        tokio::time::sleep(ALERT_AFTER).await;
        let ledger = self.world.ledger();
        let mut reconciler = self.reconciler()?;
        let mut round_no = 0;
        loop {
            round_no += 1;
            let round = reconciler.run_once().await?;
            println!("  reconciler round {round_no}: {}", fmt_reconcile(&round));
            self.rounds.push(("first", round));
            self.apply_settlements().await?;
            let stats = ledger.stats().await?;
            if stats.open + stats.claimed == 0 || round_no >= 5 {
                break;
            }
            tokio::time::sleep(RECONCILE_BACKOFF).await;
        }
        let manual = ledger
            .list(&Filter::new().state(EntryState::Manual))
            .await?;
        for entry in &manual {
            println!(
                "  ledger     manual queue: {} ({}, key {}): {}",
                entry.evidence.id,
                entry.evidence.operation.as_deref().unwrap_or("-"),
                entry.evidence.key.as_deref().unwrap_or("-"),
                entry.note.as_deref().unwrap_or("-")
            );
            let settlement = Settlement::manual(
                Verdict::Succeeded,
                "dana (warehouse desk)",
                "phoned the warehouse: the pick slip for this dispatch exists; its journal shard is down",
            )?;
            let settled = ledger
                .settle_manually(&entry.evidence.id, &settlement)
                .await?;
            println!(
                "  ledger     settled by hand: {} ({}): {}",
                settled.settlement().verdict.as_str(),
                who(settled.settlement()),
                settled.settlement().evidence
            );
        }
        self.checks.check(
            manual.len() == 1,
            format!(
                "step 4: one entry went to the manual queue ({} did)",
                manual.len()
            ),
        );
        self.apply_settlements().await?;
        let before = snapshot(&ledger).await?;

        println!();
        println!("   Reconciliation again: a second reconciler over the same ledger, and the same manual settlement made twice.");
        let mut again = self.reconciler()?;
        let round = again.run_once().await?;
        println!("  reconciler (second) round: {}", fmt_reconcile(&round));
        self.rounds.push(("second", round));
        let mut kept = false;
        if let Some(entry) = manual.first() {
            let other =
                Settlement::manual(Verdict::Failed, "sam (night shift)", "no pick slip found")?;
            let settled = ledger.settle_manually(&entry.evidence.id, &other).await?;
            println!(
                "  ledger     a second manual settlement of {}: {} (kept: {} by {})",
                entry.evidence.id,
                if settled.is_now() {
                    "written"
                } else {
                    "already settled"
                },
                settled.settlement().verdict.as_str(),
                who(settled.settlement())
            );
            kept = !settled.is_now() && settled.settlement().verdict == Verdict::Succeeded;
        }
        self.apply_settlements().await?;
        let after = snapshot(&ledger).await?;
        self.again_same = kept && before == after;
        Ok(())
    }

    fn reconciler(
        &self,
    ) -> Result<Reconciler<W::Ledger, impl surely::retry::Resolve<Found> + use<W>, Found>, BoxError>
    {
        Ok(Reconciler::builder(
            self.world.ledger(),
            resolver(self.orders, self.warehouse_addr),
        )
        .lease(Duration::from_secs(2))
        .query_timeout(QUERY_TIMEOUT)
        .backoff(Backoff::constant(RECONCILE_BACKOFF))
        .max_tries(MAX_TRIES)
        .alert_after(ALERT_AFTER)
        .build()?)
    }

    /// The inventory service acts on the settled warehouse calls: a pending order's dispatch
    /// confirmed, or not. Idempotent: only a pending order moves.
    async fn apply_settlements(&mut self) -> Result<(), BoxError> {
        let settled = self
            .world
            .ledger()
            .list(&Filter::new().state(EntryState::Settled))
            .await?;
        for entry in settled {
            let (Some(key), Some(s)) = (entry.evidence.key.as_deref(), entry.settlement.as_ref())
            else {
                continue;
            };
            let Some(order) = key.strip_prefix("wh-") else {
                continue;
            };
            let to = match s.verdict {
                Verdict::Succeeded => CONFIRMED,
                Verdict::Failed => NOT_DISPATCHED,
            };
            if self.world.settle_status(order, to).await? {
                println!(
                    "  inventory  order {order}: {PENDING} -> {to} ({key} settled {} by {})",
                    s.verdict.as_str(),
                    who(s)
                );
            }
        }
        Ok(())
    }

    /// The invariants, over the whole run: one line each.
    async fn invariants(&mut self) -> Result<(), BoxError> {
        println!();
        println!("Invariants:");
        // One order per order id.
        let orders = self.world.orders().await?;
        let counts: Vec<(&str, usize)> = ["o-1", "o-2"]
            .into_iter()
            .map(|id| (id, orders.iter().filter(|o| *o == id).count()))
            .collect();
        self.checks.invariant(
            counts.iter().all(|(_, n)| *n == 1) && orders.len() == 2,
            format!("one order per order id: {}", fmt_counts(&counts)),
        );

        // One inventory change (and one warehouse dispatch) per event id.
        let reservations = self.world.reservations().await?;
        let stock = self.world.stock().await?;
        let stats = self.world.inbox_stats();
        let mut reserved = Vec::new();
        let mut dispatched = Vec::new();
        for id in ["o-1", "o-2"] {
            let event = order_created(id)?;
            let n = reservations
                .iter()
                .filter(|r| *r == event.id().as_str())
                .count();
            reserved.push((id, n));
            dispatched.push((id, self.warehouse.posts(&dispatch_key(id))));
        }
        self.checks.invariant(
            reserved.iter().chain(&dispatched).all(|(_, n)| *n == 1)
                && stock == STOCK - 2
                && stats.duplicates >= 4,
            format!(
                "one inventory change per event id: OrderCreated reserved {}, InventoryReserved dispatched {}, \
                 stock {STOCK} -> {stock}, {} duplicate deliveries absorbed",
                fmt_counts(&reserved),
                fmt_counts(&dispatched),
                stats.duplicates
            ),
        );

        // Every unknown call queryable in the ledger, by its key.
        self.ledger_records.flush().await;
        let ledger = self.world.ledger();
        let unknown: Vec<CallRecord> = self
            .records
            .calls()
            .into_iter()
            .filter(|c| c.outcome == Outcome::Unknown)
            .collect();
        let mut found = Vec::new();
        for call in &unknown {
            let key = call.key.as_ref().map_or("", BusinessKey::as_str);
            let entries = ledger.by_key(key).await?;
            if entries
                .iter()
                .any(|e| e.evidence.call == Some(call.call.get()))
            {
                found.push(key.to_owned());
            }
        }
        self.checks.invariant(
            unknown.len() == 3 && found.len() == unknown.len(),
            format!(
                "every unknown call queryable in the ledger by its key: {} of {} ({})",
                found.len(),
                unknown.len(),
                found.join(", ")
            ),
        );

        // Processing past its limit alerted.
        let overdue = self
            .rounds
            .iter()
            .filter_map(|(_, r)| r.overdue)
            .max()
            .unwrap_or(0);
        let stuck = self.stuck.as_ref().map_or("none".to_owned(), |(k, age)| {
            format!("{k} after {}", ms(*age))
        });
        self.checks.invariant(
            overdue > 0 && self.stuck.is_some(),
            format!(
                "processing past its limit alerted: idempotency record PROCESSING past {}: {stuck}; \
                 ledger entries unsettled past {}: {overdue}",
                ms(STUCK_AFTER),
                ms(ALERT_AFTER)
            ),
        );

        // Reconciliation run twice: the same result.
        let second: Vec<_> = self.rounds.iter().filter(|(n, _)| *n == "second").collect();
        let idle = second
            .iter()
            .all(|(_, r)| r.succeeded + r.failed + r.retried + r.to_manual == 0);
        let ledger_stats = ledger.stats().await?;
        self.checks.invariant(
            second.len() == 1 && idle && self.again_same && ledger_stats.unsettled() == 0,
            format!(
                "reconciliation run twice gives the same result: the second reconciler settled nothing, \
                 the second manual settlement kept the first, the ledger unchanged ({} settled, {} unsettled)",
                ledger_stats.settled,
                ledger_stats.unsettled()
            ),
        );

        // And the orders that waited for confirmation got it.
        let mut statuses = Vec::new();
        for order in ["o-1", "o-2"] {
            let status = self.world.status(order.to_owned()).await?;
            statuses.push(format!(
                "{order} {}",
                status.as_deref().unwrap_or("missing")
            ));
        }
        self.checks.invariant(
            statuses.iter().all(|s| s.ends_with(CONFIRMED)),
            format!("no order left pending: {}", statuses.join(", ")),
        );
        Ok(())
    }
}

fn fmt_counts(counts: &[(&str, usize)]) -> String {
    counts
        .iter()
        .map(|(id, n)| format!("{id} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The entries as they stand: id, state, verdict, who.
async fn snapshot<L: Ledger>(
    ledger: &L,
) -> Result<Vec<(String, EntryState, Option<String>)>, BoxError> {
    let mut entries: Vec<(String, EntryState, Option<String>)> = ledger
        .list(&Filter::new().limit(1000))
        .await?
        .into_iter()
        .map(|e: Entry| {
            let verdict = e
                .settlement
                .as_ref()
                .map(|s| format!("{} by {}: {}", s.verdict.as_str(), who(s), s.evidence));
            (e.evidence.id.to_string(), e.state, verdict)
        })
        .collect();
    entries.sort();
    Ok(entries)
}

fn who(s: &Settlement) -> String {
    match &s.by {
        SettledBy::Reconciler => "the reconciler".to_owned(),
        SettledBy::Manual { who } => who.clone(),
        other => format!("{other:?}"),
    }
}

/// Watches the idempotency records for one `PROCESSING` past the limit, for up to 2 s.
async fn watch_stuck<St: IdempotencyStore>(store: St) -> Option<(String, Duration)> {
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(stuck) = report_stuck(&store, STUCK_AFTER).await
            && let Some(s) = stuck.first()
        {
            return Some((s.key.key().as_str().to_owned(), s.age));
        }
    }
    None
}

fn print_delivery(who: &str, d: &Delivered) {
    let what = match &d.processed {
        Processed::Applied(result) => format!("applied: {}", String::from_utf8_lossy(result)),
        Processed::Duplicate(first) => format!(
            "duplicate, not applied again (first result: {})",
            String::from_utf8_lossy(first)
        ),
        Processed::Stale { applied } => format!("stale (at version {applied}), a no-op"),
        Processed::Parked { applied } => format!("parked (at version {applied})"),
        other => format!("{other:?}"),
    };
    println!(
        "  {who:<10} {} {} v{} ({}): {what}",
        d.event.kind(),
        order_of(&d.event),
        d.event.version(),
        d.event.id()
    );
}

fn fmt_round(r: &RelayRound) -> String {
    format!(
        "claimed {}, published and marked {}, failed {}",
        r.claimed, r.published, r.failed
    )
}

fn fmt_reconcile(r: &surely::ledger::ReconcileRound) -> String {
    format!(
        "claimed {}, succeeded {}, failed {}, already {}, retried {}, to manual {}, overdue {}",
        r.claimed,
        r.succeeded,
        r.failed,
        r.already,
        r.retried,
        r.to_manual,
        r.overdue.unwrap_or(0)
    )
}

/// What a reconciler's query found, as its evidence.
struct Found(String);

impl std::fmt::Debug for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The reconciler's query: by the key's form, the order service (`o-…`: does the order
/// exist?) or the warehouse's journal (`wh-…`: did the dispatch commit?).
fn resolver(
    orders: SocketAddr,
    warehouse: SocketAddr,
) -> impl Fn(Query) -> BoxFuture<Resolution<Found>> + Clone {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    move |q: Query| {
        let client = client.clone();
        Box::pin(async move {
            let Some(key) = q.key.map(|k| k.as_str().to_owned()) else {
                return Resolution::Unknown;
            };
            // One reconciler for the ledger both client stacks write to: the operation says
            // which downstream to ask.
            let operation = q.operation.map(|o| o.to_string());
            let uri = if operation.as_deref() == Some("POST /reservations") {
                format!("http://{warehouse}/journal/{key}")
            } else {
                format!("http://{orders}/orders/{key}")
            };
            let Ok(req) = Request::get(uri.clone()).body(Full::default()) else {
                return Resolution::Unknown;
            };
            let answer = match tokio::time::timeout(
                QUERY_TIMEOUT - Duration::from_millis(50),
                client.request(req),
            )
            .await
            {
                Ok(Ok(res)) => {
                    let status = res.status();
                    let body = res
                        .into_body()
                        .collect()
                        .await
                        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                        .unwrap_or_default();
                    match status {
                        StatusCode::OK => {
                            Resolution::Succeeded(Found(format!("GET {uri}: {body}")))
                        }
                        StatusCode::NOT_FOUND => Resolution::Failed,
                        _ => Resolution::Unknown,
                    }
                }
                _ => Resolution::Unknown,
            };
            let said = match &answer {
                Resolution::Succeeded(found) => format!("succeeded ({})", found.0),
                Resolution::Failed => "failed (not found)".to_owned(),
                // `Unknown`, and any answer a later version adds.
                _ => "unknown (no answer)".to_owned(),
            };
            println!("  reconciler asks for {key}: {said}");
            answer
        }) as BoxFuture<_>
    }
}

async fn story<W: World>(world: Arc<W>) -> Result<bool, BoxError> {
    println!("Mode: {}", world.describe());
    println!();
    let started = Instant::now();
    let orders = serve_orders(world.clone()).await?;
    let warehouse = Arc::new(Warehouse {
        journal: Mutex::default(),
        down: HashSet::from([dispatch_key("o-2")]),
    });
    let warehouse_addr = serve_warehouse(warehouse.clone()).await?;
    let mut chain = Chain {
        ledger_records: LedgerRecorder::new(world.ledger()),
        world,
        orders,
        warehouse,
        warehouse_addr,
        records: InMemoryRecorder::new(),
        checks: Checks::default(),
        stuck: None,
        rounds: Vec::new(),
        again_same: false,
    };
    chain.lost_reply().await?;
    chain.ask_again().await?;
    chain.across_the_boundary().await?;
    chain.warehouse().await?;
    chain.ledger_records.flush().await;
    let writes = chain.ledger_records.writes();
    println!();
    println!(
        "{} calls recorded, {} ledger entries written ({} failed), in {}.",
        chain.records.calls().len(),
        writes.written,
        writes.failed,
        ms(started.elapsed())
    );
    chain.invariants().await?;
    Ok(chain.checks.verdict())
}

#[path = "support/mode.rs"]
mod mode;
use mode::{mode, Mode};

// ----- the modes -----------------------------------------------------------------------------------

#[cfg(not(all(feature = "postgres", feature = "nats")))]
async fn durable(_: &str, _: &str) -> Result<bool, BoxError> {
    Err("PostgreSQL and NATS URLs were given, but this build lacks the cargo features `postgres` and `nats`: \
         run `cargo run --release --features postgres,nats --example recovery` (or `--all-features`)"
        .into())
}

#[tokio::main]
async fn main() {
    let ran = match mode() {
        Ok(Mode::Memory) => story(Arc::new(memory::MemWorld::new())).await,
        Ok(Mode::Durable { postgres, nats }) => durable(&postgres, &nats).await,
        Err(e) => Err(e),
    };
    match ran {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("recovery: {}", chain(&*e));
            std::process::exit(1);
        }
    }
}

#[cfg(all(feature = "postgres", feature = "nats"))]
async fn durable(postgres: &str, nats: &str) -> Result<bool, BoxError> {
    let world = Arc::new(durable::PgWorld::connect(postgres, nats).await?);
    let ran = story(world.clone()).await;
    match world.clean_up().await {
        Ok(what) => eprintln!("recovery: dropped {what}"),
        Err(e) => eprintln!("recovery: could not clean up: {}", chain(&*e)),
    }
    ran
}
