//! The soak of issue 16, over the real PostgreSQL and NATS JetStream of the machine (it fails if
//! either does not answer): ten thousand orders, each written with its event in one
//! transaction (some transactions roll back), relays killed at seeded points of their rounds
//! (two relays at once for a while), consumers crashing at seeded points of their deliveries.
//! In the end every committed event's effect is there exactly once, none is lost, none of a
//! rolled-back transaction is ever seen, and the counts are printed (`--nocapture`).
//!
//! The crash plan comes from a seed, printed; `SURELY_SOAK_SEED=<seed>` replays the plan (the
//! interleaving of the tasks stays the machine's). The only waits are the database's lease and
//! the broker's ack wait and redelivery delay, the idle relay's poll, and polls for completion.
//!
//! The consumer checks [`Versions::InOrder`] (the aggregates are customers, each order one
//! version of its customer): a redelivery that reorders an aggregate's events parks the later
//! ones until the missing one is applied. The inbox's version table is seeded with version 0
//! for every customer before the run: `InOrder` takes the first version it sees of an
//! aggregate as its start, so without it a reordering of an aggregate's first two events would
//! record version 1 as stale and never apply it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};
use surely::deps::async_nats::jetstream::{self, consumer, AckKind};
use surely::inbox::{Begin, PostgresInbox, Processed, Versions};
use surely::outbox::{
    Claimed, Event, EventId, Failed, JetStreamPublisher, OutboxError, OutboxStore, PostgresOutbox,
    Relay,
};
use surely::record::OutboxStats;
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinHandle};
use tokio_stream::StreamExt;
use tower::Service;

use super::{forget_outbox_and_inbox, outbox_and_inbox};
use crate::support::names::suffix;
use crate::support::{nats, postgres};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Committed events (orders).
const EVENTS: u64 = 10_000;
/// Events per producer transaction.
const PER_TXN: u64 = 100;
/// Customers: each has `EVENTS / CUSTOMERS` orders, its versions 1, 2, ...
const CUSTOMERS: u64 = 500;
/// Producer transactions that roll back, beside the committed ones.
const ROLLED_BACK_TXNS: usize = 5;
/// Relay crashes planned, spread over the four points of a round.
const RELAY_CRASHES: usize = 12;
/// Consumer crashes (and failures) planned, spread over their five points.
const CONSUMER_CRASHES: usize = 50;
/// Consumer workers, pulling from one durable consumer.
const WORKERS: usize = 6;
/// Events a relay claims per round.
const RELAY_BATCH: usize = 50;
/// A relay's lease: a killed relay's events come back after it (the database's clock).
const LEASE: Duration = Duration::from_millis(400);
/// JetStream redelivers an unacknowledged message after this.
const ACK_WAIT: Duration = Duration::from_secs(1);
/// A parked event comes back after this.
const PARKED_DELAY: Duration = Duration::from_millis(500);
/// The whole run, setup excluded.
const DEADLINE: Duration = Duration::from_secs(120);
/// The consumer's name in the inbox.
const CONSUMER: &str = "soak";

/// The seed of the crash plan: `SURELY_SOAK_SEED`, or a fresh one.
fn seed() -> u64 {
    match std::env::var("SURELY_SOAK_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("SURELY_SOAK_SEED={s:?} is not a u64: {e}")),
        Err(_) => StdRng::from_os_rng().next_u64(),
    }
}

/// The outbox, the inbox, the business tables, the stream and its consumer, in names of this
/// run's own; and the background tasks, to stop.
struct World {
    outbox: PostgresOutbox,
    inbox: PostgresInbox,
    orders: String,
    effects: String,
    js: jetstream::Context,
    stream: String,
    consumer: consumer::PullConsumer,
    tasks: Mutex<Vec<AbortHandle>>,
}

impl World {
    async fn new() -> World {
        let s = suffix();
        let (pool, outbox, inbox) = outbox_and_inbox("soak", "surely_soak", &s).await;
        let orders = format!("surely_soak_orders_{s}");
        let effects = format!("surely_soak_effects_{s}");
        pool.get()
            .await
            .unwrap()
            .batch_execute(&format!(
                // No unique key on the effects: an event applied twice shows as two rows.
                "CREATE TABLE {orders} (id text PRIMARY KEY, customer text NOT NULL,
                                        version bigint NOT NULL);
                 CREATE TABLE {effects} (seq bigserial, event_id text NOT NULL,
                                         aggregate text NOT NULL, version bigint NOT NULL,
                                         delivery bigint NOT NULL);
                 INSERT INTO {inbox}_versions (consumer, aggregate, version)
                     SELECT '{CONSUMER}', 'customer-' || c, 0
                     FROM generate_series(0, {last}) AS c;",
                inbox = inbox.table(),
                last = CUSTOMERS - 1,
            ))
            .await
            .unwrap();
        let js = nats::jetstream("soak").await;
        let name = format!("surely_soak_{s}");
        let st = nats::stream(&js, "soak", &name).await;
        let consumer = st
            .create_consumer(consumer::pull::Config {
                durable_name: Some(CONSUMER.to_owned()),
                ack_wait: ACK_WAIT,
                // Parked events hold their slots while they wait: room for all of them.
                max_ack_pending: 20_000,
                ..Default::default()
            })
            .await
            .unwrap();
        World {
            outbox,
            inbox,
            orders,
            effects,
            js,
            stream: name,
            consumer,
            tasks: Mutex::new(Vec::new()),
        }
    }

    fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = tokio::spawn(task);
        self.tasks.lock().unwrap().push(handle.abort_handle());
        handle
    }

    /// Stops every background task, and waits until they are gone (a task stops at its next
    /// await).
    async fn stop_tasks(&self) {
        let tasks: Vec<_> = self.tasks.lock().unwrap().drain(..).collect();
        for task in &tasks {
            task.abort();
        }
        for task in &tasks {
            while !task.is_finished() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    async fn count(&self, sql: &str) -> i64 {
        self.outbox
            .pool()
            .get()
            .await
            .unwrap()
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    async fn stream_messages(&self) -> u64 {
        let mut st = self.js.get_stream(&self.stream).await.unwrap();
        st.info().await.unwrap().state.messages
    }

    /// Drops the tables and the stream.
    async fn forget(&self) {
        forget_outbox_and_inbox(&self.outbox, &self.inbox, &[&self.orders, &self.effects]).await;
        self.js.delete_stream(&self.stream).await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// The producer.

/// What the producer wrote: the committed events' ids, the rolled-back ones'.
struct Produced {
    committed: Vec<String>,
    rolled_back: Vec<String>,
}

/// Writes the orders, `PER_TXN` per transaction, each with its event; the transactions at
/// `rollbacks` roll back, and the next one writes the same customers' versions again, as other
/// orders. Order `k` is version `k / CUSTOMERS + 1` of customer `k % CUSTOMERS`.
async fn produce(world: Arc<World>, rollbacks: HashSet<usize>) -> Produced {
    let insert = format!(
        "INSERT INTO {} (id, customer, version) VALUES ($1, $2, $3)",
        world.orders
    );
    let mut produced = Produced {
        committed: Vec::new(),
        rolled_back: Vec::new(),
    };
    let mut client = world.outbox.pool().get().await.unwrap();
    let mut next = 0;
    let mut t = 0;
    while next < EVENTS {
        let txn = client.transaction().await.unwrap();
        let orders: Vec<(String, String, i64, Event)> = (next..next + PER_TXN)
            .map(|k| {
                let order = format!("o{k}-t{t}");
                let customer = format!("customer-{}", k % CUSTOMERS);
                let version = (k / CUSTOMERS + 1) as i64;
                let event = Event::new(
                    EventId::derive(&format!("order {order}"), "OrderCreated"),
                    customer.as_str(),
                    version,
                    "OrderCreated",
                    order.clone(),
                )
                .unwrap();
                (order, customer, version, event)
            })
            .collect();
        // The statements of the transaction pipelined on its connection.
        let writes = orders.iter().map(|(order, customer, version, event)| {
            let (txn, insert, outbox) = (&txn, &insert, &world.outbox);
            async move {
                txn.execute(insert, &[order, customer, version])
                    .await
                    .unwrap();
                assert!(outbox.enqueue(txn, event).await.unwrap());
            }
        });
        join_all(writes.collect()).await;
        let ids: Vec<String> = orders
            .iter()
            .map(|(_, _, _, event)| event.id().as_str().to_owned())
            .collect();
        if rollbacks.contains(&t) {
            txn.rollback().await.unwrap();
            produced.rolled_back.extend(ids);
        } else {
            txn.commit().await.unwrap();
            produced.committed.extend(ids);
            next += PER_TXN;
        }
        t += 1;
    }
    produced
}

/// Runs `futures` together (their statements pipelined on one connection); their outputs.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, output) in futures.iter_mut().zip(&mut outputs) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    Poll::Ready(out) => {
                        *output = Some(out);
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

// ---------------------------------------------------------------------------------------------
// The relays, and their crashes.

/// Where a relay dies in its round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum RelayCrash {
    /// It claimed a batch, and published none of it.
    AfterClaim,
    /// It published the start of its batch; the rest never went.
    MidBatch,
    /// JetStream acknowledged one of its publishes; the rest of the batch never went.
    AfterAck,
    /// JetStream acknowledged the whole batch; the relay did not mark it.
    BeforeMark,
}

const RELAY_CRASH_KINDS: [RelayCrash; 4] = [
    RelayCrash::AfterClaim,
    RelayCrash::MidBatch,
    RelayCrash::AfterAck,
    RelayCrash::BeforeMark,
];

/// A planned crash: the first relay to reach its point once `at` publishes were made dies there.
struct RelayFault {
    at: u64,
    kind: RelayCrash,
    fired: AtomicBool,
}

/// What the relays share: the plan, their counts, the supervisor's line.
struct Relays {
    plan: Vec<RelayFault>,
    /// Publishes sent to JetStream (calls of the publisher).
    calls: AtomicU64,
    /// Publishes JetStream acknowledged.
    acked: AtomicU64,
    /// Of those, the ones JetStream had already (same `Nats-Msg-Id`) and dropped.
    duplicates: AtomicU64,
    /// After this many publishes, the second relay stops.
    second_until: u64,
    stop_second: watch::Sender<bool>,
    crashes: mpsc::UnboundedSender<(usize, RelayCrash)>,
}

impl Relays {
    /// Whether a relay at point `kind` dies now (each planned crash once).
    fn fire(&self, kind: RelayCrash) -> bool {
        self.take(kind).is_some()
    }

    /// The planned crash at point `kind` that is due, taken (each once): its index in the plan.
    fn take(&self, kind: RelayCrash) -> Option<usize> {
        let now = self.calls.load(Ordering::SeqCst);
        self.plan.iter().position(|f| {
            f.kind == kind
                && f.at <= now
                && f.fired
                    .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
        })
    }

    /// Tells the supervisor, then hangs until it kills the relay.
    fn crash<T>(&self, slot: usize, kind: RelayCrash) -> impl Future<Output = T> + use<T> {
        let _ = self.crashes.send((slot, kind));
        std::future::pending()
    }
}

/// The PostgreSQL outbox, with the relay's crash points at its claim and its mark.
struct CrashingStore {
    inner: PostgresOutbox,
    relays: Arc<Relays>,
    slot: usize,
}

impl OutboxStore for CrashingStore {
    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Claimed>, OutboxError> {
        let batch = self.inner.claim(max, lease).await?;
        if !batch.is_empty() && self.relays.fire(RelayCrash::AfterClaim) {
            return self.relays.crash(self.slot, RelayCrash::AfterClaim).await;
        }
        Ok(batch)
    }

    async fn published(&self, claimed: &Claimed) -> Result<(), OutboxError> {
        self.inner.published(claimed).await
    }

    async fn published_all(&self, claimed: &[Claimed]) -> Result<usize, OutboxError> {
        if !claimed.is_empty() && self.relays.fire(RelayCrash::BeforeMark) {
            return self.relays.crash(self.slot, RelayCrash::BeforeMark).await;
        }
        self.inner.published_all(claimed).await
    }

    async fn failed(
        &self,
        claimed: &Claimed,
        error: &str,
        retry_after: Duration,
        quarantine_after: u32,
    ) -> Result<Failed, OutboxError> {
        self.inner
            .failed(claimed, error, retry_after, quarantine_after)
            .await
    }

    async fn sweep(&self, retention: Duration) -> Result<u64, OutboxError> {
        self.inner.sweep(retention).await
    }

    async fn stats(&self) -> Result<OutboxStats, OutboxError> {
        self.inner.stats().await
    }
}

/// The JetStream publisher, with the relay's crash points between its publishes.
struct CrashingPublisher {
    inner: JetStreamPublisher,
    relays: Arc<Relays>,
    slot: usize,
    /// This relay is dying: nothing more goes out.
    dead: Arc<AtomicBool>,
}

/// A crash taken from the plan for after an acknowledgement: put back if it does not happen.
struct Planned {
    relays: Arc<Relays>,
    at: usize,
    happened: bool,
}

impl Drop for Planned {
    fn drop(&mut self) {
        if !self.happened {
            self.relays.plan[self.at]
                .fired
                .store(false, Ordering::SeqCst);
        }
    }
}

impl Service<Event> for CrashingPublisher {
    type Response = ();
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, event: Event) -> Self::Future {
        if self.dead.load(Ordering::SeqCst) {
            return Box::pin(std::future::pending());
        }
        let n = self.relays.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n >= self.relays.second_until {
            self.relays.stop_second.send_replace(true);
        }
        if self.relays.fire(RelayCrash::MidBatch) {
            self.dead.store(true, Ordering::SeqCst);
            return Box::pin(self.relays.crash(self.slot, RelayCrash::MidBatch));
        }
        // A crash after the acknowledgement that never comes (the publish failed, or this
        // relay was stopped while it waited) goes back to the plan for the next publish.
        let mut crash_after = self.relays.take(RelayCrash::AfterAck).map(|at| Planned {
            relays: self.relays.clone(),
            at,
            happened: false,
        });
        if crash_after.is_some() {
            self.dead.store(true, Ordering::SeqCst);
        }
        let publish = self.inner.call(event);
        let (relays, slot, dead) = (self.relays.clone(), self.slot, self.dead.clone());
        Box::pin(async move {
            let published = match publish.await {
                Ok(published) => published,
                Err(e) => {
                    if crash_after.is_some() {
                        dead.store(false, Ordering::SeqCst);
                    }
                    return Err(e);
                }
            };
            relays.acked.fetch_add(1, Ordering::SeqCst);
            if published.duplicate {
                relays.duplicates.fetch_add(1, Ordering::SeqCst);
            }
            if let Some(mut planned) = crash_after.take() {
                planned.happened = true;
                return relays.crash(slot, RelayCrash::AfterAck).await;
            }
            Ok(())
        })
    }
}

/// A fresh relay in `slot` (0: the one that always runs; 1: the second one, until told to stop).
fn spawn_relay(world: &Arc<World>, relays: &Arc<Relays>, slot: usize) -> JoinHandle<()> {
    let relay = Relay::builder(
        CrashingStore {
            inner: world.outbox.clone(),
            relays: relays.clone(),
            slot,
        },
        CrashingPublisher {
            inner: JetStreamPublisher::new(world.js.clone(), world.stream.clone()),
            relays: relays.clone(),
            slot,
            dead: Arc::new(AtomicBool::new(false)),
        },
    )
    .batch(RELAY_BATCH)
    .lease(LEASE)
    .retry_after(Duration::from_millis(100))
    .poll(Duration::from_millis(50))
    .build()
    .unwrap();
    let mut stop = relays.stop_second.subscribe();
    world.spawn(relay.run(async move {
        if slot == 0 {
            std::future::pending::<()>().await;
        }
        let _ = stop.wait_for(|stop| *stop).await;
    }))
}

/// Restarts each relay that crashed; returns the crashes by point.
async fn supervise(
    world: Arc<World>,
    relays: Arc<Relays>,
    mut crashes: mpsc::UnboundedReceiver<(usize, RelayCrash)>,
    counts: Arc<Mutex<BTreeMap<RelayCrash, u64>>>,
) {
    let mut running = [
        Some(spawn_relay(&world, &relays, 0)),
        Some(spawn_relay(&world, &relays, 1)),
    ];
    while let Some((slot, kind)) = crashes.recv().await {
        if let Some(relay) = running[slot].take() {
            relay.abort();
        }
        *counts.lock().unwrap().entry(kind).or_default() += 1;
        if slot == 0 || !*relays.stop_second.borrow() {
            running[slot] = Some(spawn_relay(&world, &relays, slot));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The consumers, and their crashes.

/// What goes wrong with a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ConsumerCrash {
    /// The worker dies with the message (and the rest of its batch) in hand, before any write.
    OnReceipt,
    /// The worker dies after the business write, before the commit: the transaction rolls back.
    BeforeCommit,
    /// The worker dies after the commit, before the acknowledgement.
    AfterCommit,
    /// The acknowledgement is lost; the worker goes on.
    AckLost,
    /// The handler fails: rolled back, acknowledged negatively.
    HandlerFails,
}

const CONSUMER_CRASH_KINDS: [ConsumerCrash; 5] = [
    ConsumerCrash::OnReceipt,
    ConsumerCrash::BeforeCommit,
    ConsumerCrash::AfterCommit,
    ConsumerCrash::AckLost,
    ConsumerCrash::HandlerFails,
];

/// What the consumer workers share: the plan (by delivery number) and their counts.
#[derive(Default)]
struct Consumers {
    plan: HashMap<u64, ConsumerCrash>,
    deliveries: AtomicU64,
    redeliveries: AtomicU64,
    crashes: Mutex<BTreeMap<ConsumerCrash, u64>>,
    /// Fresh events whose transaction rolled back after `finish` (counted applied by the
    /// inbox's stats, not applied in the database).
    fresh_rolled_back: AtomicU64,
    parked_naks: AtomicU64,
    acks_unconfirmed: AtomicU64,
}

/// After a delivery: the next message of the batch, or the worker crashed.
#[derive(PartialEq, Eq)]
enum Step {
    Next,
    Crash,
}

/// A consumer worker: pulls batches and delivers their messages until stopped; a crash drops
/// the batch (what it held comes back after the ack wait) and pulls again.
async fn work(world: Arc<World>, consumers: Arc<Consumers>) {
    let effect = format!(
        "INSERT INTO {} (event_id, aggregate, version, delivery) VALUES ($1, $2, $3, $4)",
        world.effects
    );
    loop {
        let mut batch = world
            .consumer
            .batch()
            .max_messages(10)
            .expires(Duration::from_millis(250))
            .messages()
            .await
            .unwrap_or_else(|e| panic!("soak: JetStream pull failed: {e}"));
        while let Some(message) = batch.next().await {
            let message = message.unwrap_or_else(|e| panic!("soak: JetStream batch failed: {e}"));
            if deliver(&world, &consumers, &effect, message).await == Step::Crash {
                break;
            }
        }
    }
}

fn count<K: Ord>(counts: &Mutex<BTreeMap<K, u64>>, kind: K) {
    *counts.lock().unwrap().entry(kind).or_default() += 1;
}

/// One delivery, through the inbox: the effect and the record in one transaction, committed,
/// then acknowledged (or a parked event acknowledged negatively) — but for the planned crash.
async fn deliver(
    world: &World,
    consumers: &Consumers,
    effect: &str,
    message: jetstream::Message,
) -> Step {
    let n = consumers.deliveries.fetch_add(1, Ordering::SeqCst);
    let crash = consumers.plan.get(&n).copied();
    if let Some(kind) = crash {
        count(&consumers.crashes, kind);
    }
    let delivered = message.info().unwrap().delivered;
    if delivered > 1 {
        consumers.redeliveries.fetch_add(1, Ordering::SeqCst);
    }
    if crash == Some(ConsumerCrash::OnReceipt) {
        return Step::Crash;
    }
    let event = Event::from_nats(&message).expect("every message is a relay's event");
    let mut client = world.inbox.pool().get().await.unwrap();
    let txn = client.transaction().await.unwrap();
    let begun = world
        .inbox
        .begin(&txn, CONSUMER, &event, Versions::InOrder)
        .await
        .unwrap();
    let processed = match begun {
        Begin::Fresh(ticket) => {
            txn.execute(
                effect,
                &[
                    &event.id().as_str(),
                    &event.aggregate(),
                    &event.version(),
                    &delivered,
                ],
            )
            .await
            .unwrap();
            if crash == Some(ConsumerCrash::HandlerFails) {
                drop(ticket);
                drop(txn);
                message.ack_with(AckKind::Nak(None)).await.unwrap();
                return Step::Next;
            }
            let processed = world
                .inbox
                .finish(&txn, ticket, "applied".into())
                .await
                .unwrap();
            if crash == Some(ConsumerCrash::BeforeCommit) {
                consumers.fresh_rolled_back.fetch_add(1, Ordering::SeqCst);
            }
            processed
        }
        Begin::Done(processed) => processed,
    };
    if crash == Some(ConsumerCrash::BeforeCommit) {
        drop(txn);
        return Step::Crash;
    }
    txn.commit().await.unwrap();
    match crash {
        Some(ConsumerCrash::AfterCommit) => return Step::Crash,
        Some(ConsumerCrash::AckLost) => return Step::Next,
        _ => {}
    }
    if processed.is_settled() {
        if message.double_ack().await.is_err() {
            // Committed: the redelivery finds the record.
            consumers.acks_unconfirmed.fetch_add(1, Ordering::SeqCst);
        }
    } else {
        assert!(
            matches!(processed, Processed::Parked { .. }),
            "{processed:?}"
        );
        consumers.parked_naks.fetch_add(1, Ordering::SeqCst);
        message
            .ack_with(AckKind::Nak(Some(PARKED_DELAY)))
            .await
            .unwrap();
    }
    Step::Next
}

// ---------------------------------------------------------------------------------------------
// The soak.

/// Panics if a background task ended (they run until stopped): with its panic.
async fn check_alive(name: &str, task: &mut JoinHandle<()>) {
    if task.is_finished() {
        match task.await {
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            other => panic!("soak: the {name} task ended: {other:?}"),
        }
    }
}

async fn soak(world: Arc<World>, seed: u64) {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);

    // The plan.
    // Among the first `EVENTS / PER_TXN` transactions: each of those is reached before the
    // last commit, so every planned rollback happens.
    let mut positions: Vec<usize> = (0..(EVENTS / PER_TXN) as usize).collect();
    positions.shuffle(&mut rng);
    let rollbacks: HashSet<usize> = positions[..ROLLED_BACK_TXNS].iter().copied().collect();
    let (crash_line, crashes) = mpsc::unbounded_channel();
    let relays = Arc::new(Relays {
        plan: (0..RELAY_CRASHES)
            .map(|i| RelayFault {
                // Early enough that publishes (and claims and marks) still follow.
                at: rng.random_range(100..EVENTS * 8 / 10),
                kind: RELAY_CRASH_KINDS[i % RELAY_CRASH_KINDS.len()],
                fired: AtomicBool::new(false),
            })
            .collect(),
        calls: AtomicU64::new(0),
        acked: AtomicU64::new(0),
        duplicates: AtomicU64::new(0),
        second_until: rng.random_range(EVENTS * 3 / 10..EVENTS * 7 / 10),
        stop_second: watch::channel(false).0,
        crashes: crash_line,
    });
    let mut deliveries: Vec<u64> = (0..EVENTS * 9 / 10).collect();
    deliveries.shuffle(&mut rng);
    let consumers = Arc::new(Consumers {
        plan: deliveries[..CONSUMER_CRASHES]
            .iter()
            .enumerate()
            .map(|(i, &n)| (n, CONSUMER_CRASH_KINDS[i % CONSUMER_CRASH_KINDS.len()]))
            .collect(),
        ..Consumers::default()
    });
    let mut planned: Vec<_> = relays.plan.iter().map(|f| (f.at, f.kind)).collect();
    planned.sort();
    println!(
        "soak: rolled-back transactions at {:?}; relay crashes at publishes {planned:?}; \
         second relay until publish {}",
        {
            let mut r: Vec<_> = rollbacks.iter().collect();
            r.sort();
            r
        },
        relays.second_until
    );

    // Everything at once.
    let relay_crashes = Arc::new(Mutex::new(BTreeMap::new()));
    let mut supervisor = world.spawn(supervise(
        world.clone(),
        relays.clone(),
        crashes,
        relay_crashes.clone(),
    ));
    let mut workers: Vec<_> = (0..WORKERS)
        .map(|_| world.spawn(work(world.clone(), consumers.clone())))
        .collect();
    let mut producer = world.spawn(produce(world.clone(), rollbacks));

    // Until every effect is there, the outbox is empty, and JetStream has nothing pending or
    // unacknowledged (a lost acknowledgement's redelivery was processed too).
    let distinct = format!("SELECT count(DISTINCT event_id) FROM {}", world.effects);
    let mut produced = None;
    let (mut produced_at, mut applied_at) = (None, None);
    // Since when the outbox and JetStream have had nothing left to deliver.
    let mut quiet_since: Option<Instant> = None;
    loop {
        check_alive("relay supervisor", &mut supervisor).await;
        for w in &mut workers {
            check_alive("consumer worker", w).await;
        }
        if produced.is_none() && producer.is_finished() {
            produced = Some((&mut producer).await.unwrap());
            produced_at = Some(started.elapsed());
        }
        if produced.is_some() {
            let applied = world.count(&distinct).await == EVENTS as i64;
            if applied {
                applied_at.get_or_insert(started.elapsed());
            }
            let backlog = world.outbox.stats().await.unwrap().backlog;
            let info = world.consumer.get_info().await.unwrap();
            if backlog == 0 && info.num_pending == 0 && info.num_ack_pending == 0 {
                if applied {
                    break;
                }
                // Nothing more is coming: the missing effects are lost (the checks below say
                // which way).
                if quiet_since.get_or_insert_with(Instant::now).elapsed() > 3 * ACK_WAIT {
                    break;
                }
            } else {
                quiet_since = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let settled = started.elapsed();
    world.stop_tasks().await;
    let produced = produced.unwrap();

    // The counts.
    let stats = world.outbox.stats().await.unwrap();
    let inbox = world.inbox.stats();
    let stream_messages = world.stream_messages().await;
    let effects = world
        .count(&format!("SELECT count(*) FROM {}", world.effects))
        .await;
    let relay_crashes = relay_crashes.lock().unwrap().clone();
    let consumer_crashes = consumers.crashes.lock().unwrap().clone();
    println!("soak: seed {seed}");
    println!(
        "soak: events committed {} (in {} transactions), rolled back {} (in {} transactions)",
        produced.committed.len(),
        produced.committed.len() as u64 / PER_TXN,
        produced.rolled_back.len(),
        produced.rolled_back.len() as u64 / PER_TXN,
    );
    println!(
        "soak: relay crashes {} {relay_crashes:?}; publishes {}, acknowledged {}, \
         dropped by JetStream as duplicates {}; stream holds {stream_messages}",
        relay_crashes.values().sum::<u64>(),
        relays.calls.load(Ordering::SeqCst),
        relays.acked.load(Ordering::SeqCst),
        relays.duplicates.load(Ordering::SeqCst),
    );
    println!(
        "soak: consumer crashes {} {consumer_crashes:?}; deliveries {}, redeliveries {}, \
         parked {} (naks {}), acknowledgements unconfirmed {}",
        consumer_crashes.values().sum::<u64>(),
        consumers.deliveries.load(Ordering::SeqCst),
        consumers.redeliveries.load(Ordering::SeqCst),
        inbox.parked,
        consumers.parked_naks.load(Ordering::SeqCst),
        consumers.acks_unconfirmed.load(Ordering::SeqCst),
    );
    println!(
        "soak: inbox applied {} (of which rolled back by a crash {}), duplicate hits {}, \
         stale {}; effect rows {effects}; outbox backlog {}, quarantined {}",
        inbox.applied,
        consumers.fresh_rolled_back.load(Ordering::SeqCst),
        inbox.duplicates,
        inbox.stale,
        stats.backlog,
        stats.quarantined,
    );
    println!(
        "soak: wall time: produced in {:?}, all applied at {}, settled in {settled:?}",
        produced_at.unwrap(),
        applied_at.map_or("never".to_owned(), |t| format!("{t:?}"))
    );

    // Exactly once, nothing lost, nothing of a rollback.
    assert_eq!(produced.committed.len() as u64, EVENTS);
    assert_eq!(
        produced.rolled_back.len() as u64,
        ROLLED_BACK_TXNS as u64 * PER_TXN
    );
    let once = world
        .count(&format!(
            "SELECT count(*) FROM (SELECT event_id FROM {} GROUP BY event_id HAVING count(*) <> 1) x",
            world.effects
        ))
        .await;
    assert_eq!(once, 0, "soak (seed {seed}): events applied more than once");
    assert_eq!(
        effects, EVENTS as i64,
        "soak (seed {seed}): effect rows, one per committed event"
    );
    let client = world.outbox.pool().get().await.unwrap();
    let lost: i64 = client
        .query_one(
            &format!(
                "SELECT count(*) FROM unnest($1::text[]) AS c(id)
                 WHERE NOT EXISTS (SELECT 1 FROM {} e WHERE e.event_id = c.id)",
                world.effects
            ),
            &[&produced.committed],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        lost, 0,
        "soak (seed {seed}): committed events never applied"
    );
    for (table, column) in [
        (world.effects.as_str(), "event_id"),
        (world.outbox.table(), "id"),
    ] {
        let ghosts: i64 = client
            .query_one(
                &format!("SELECT count(*) FROM {table} WHERE {column} = ANY($1::text[])"),
                &[&produced.rolled_back],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            ghosts, 0,
            "soak (seed {seed}): events of rolled-back transactions in {table}"
        );
    }
    let orders = world
        .count(&format!("SELECT count(*) FROM {}", world.orders))
        .await;
    assert_eq!(
        orders, EVENTS as i64,
        "soak (seed {seed}): orders committed"
    );
    // In order: each customer's effects went 1, 2, 3, ... however the deliveries came.
    let disorder = world
        .count(&format!(
            "SELECT count(*) FROM (
                 SELECT version, lag(version, 1, 0::bigint) OVER (PARTITION BY aggregate ORDER BY seq) AS prev
                 FROM {}
             ) x WHERE version <> prev + 1",
            world.effects
        ))
        .await;
    assert_eq!(
        disorder, 0,
        "soak (seed {seed}): effects out of their customer's order"
    );
    assert_eq!(
        (stats.backlog, stats.quarantined),
        (0, 0),
        "soak (seed {seed}): outbox backlog and quarantined"
    );
    assert_eq!(
        stream_messages, EVENTS,
        "soak (seed {seed}): JetStream kept one message per event (Nats-Msg-Id)"
    );
    assert_eq!(inbox.stale, 0, "soak (seed {seed}): events found stale");
    assert_eq!(
        inbox.applied - consumers.fresh_rolled_back.load(Ordering::SeqCst),
        EVENTS,
        "soak (seed {seed}): the inbox's applied count"
    );
    // The plan happened: every crash fired.
    assert_eq!(
        relay_crashes.values().sum::<u64>(),
        RELAY_CRASHES as u64,
        "soak (seed {seed}): relay crashes"
    );
    assert_eq!(
        consumer_crashes.values().sum::<u64>(),
        CONSUMER_CRASHES as u64,
        "soak (seed {seed}): consumer crashes"
    );
    assert!(
        inbox.duplicates > 0 && relays.duplicates.load(Ordering::SeqCst) > 0,
        "soak (seed {seed}): the crashes made no duplicate"
    );
}

/// Ten thousand events, relays and consumers crashing: each event's effect applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_ten_thousand_events_with_crashes_apply_each_effect_once() {
    let seed = seed();
    println!("soak: seed {seed} (SURELY_SOAK_SEED={seed} replays this crash plan)");
    let world = Arc::new(
        tokio::time::timeout(Duration::from_secs(30), World::new())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "soak: PostgreSQL at {} or NATS at {} did not answer within 30 s",
                    postgres::url(),
                    nats::url()
                )
            }),
    );
    // Not one of the world's tasks: it stops those itself.
    let run = tokio::spawn(soak(world.clone(), seed));
    let abort = run.abort_handle();
    let outcome = tokio::time::timeout(DEADLINE, run).await;
    abort.abort();
    while !abort.is_finished() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    world.stop_tasks().await;
    let timed_out = if outcome.is_err() {
        let effects = world
            .count(&format!(
                "SELECT count(DISTINCT event_id) FROM {}",
                world.effects
            ))
            .await;
        let backlog = world.outbox.stats().await.map(|s| s.backlog);
        let info = world
            .consumer
            .get_info()
            .await
            .map(|i| (i.num_pending, i.num_ack_pending, i.num_redelivered));
        Some(format!(
            "soak (seed {seed}): not settled within {DEADLINE:?}: {effects} of {EVENTS} effects, \
             outbox backlog {backlog:?}, consumer (pending, ack pending, redelivered) {info:?}"
        ))
    } else {
        None
    };
    world.forget().await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Ok(Err(e)) => panic!("soak (seed {seed}): the run ended: {e}"),
        Err(_) => panic!("{}", timed_out.unwrap()),
    }
}
