//! The log relay on the machine's PostgreSQL (`wal_level = logical`, set by `.ci/run`): the
//! outbox's rows read from a logical replication slot, published in commit order, the slot
//! confirmed only past what the broker acknowledged. Real time, on the database's clock: every
//! wait is bounded, and a test that does not see what it waits for fails.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use surely::outbox::{
    Event, EventId, LogRelay, LogRelayBuilder, LogSource, OutboxStore, PostgresOutbox,
};
use surely::postgres::Pool;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{event, Broker, Bus};
use crate::support::names::unique;
use crate::support::postgres::{forget, pool, url};

/// An outbox table and a slot of the test's own, dropped at the end.
struct Fixture {
    pool: Pool,
    outbox: PostgresOutbox,
    table: String,
    slot: String,
}

impl Fixture {
    /// A new table, migrated; the slot is not made yet.
    async fn new(test: &str) -> Self {
        let pool = pool();
        let table = unique("surely_log");
        let outbox = PostgresOutbox::new(pool.clone())
            .with_table(&table)
            .unwrap();
        outbox
            .migrate()
            .await
            .unwrap_or_else(|e| panic!("{test}: migrations failed: {e}"));
        let slot = table.clone();
        Fixture {
            pool,
            outbox,
            table,
            slot,
        }
    }

    async fn create_slot(&self) {
        self.outbox.create_slot(&self.slot).await.unwrap();
    }

    fn source(&self) -> LogSource {
        LogSource::new(&url(), &self.slot).unwrap()
    }

    fn relay<P>(&self, publisher: P) -> LogRelayBuilder<P> {
        LogRelay::builder(self.outbox.clone(), self.source(), publisher)
            .heartbeat(Duration::from_millis(100))
            .retry_after(Duration::from_millis(20))
    }

    /// Enqueues `events` in one transaction.
    async fn enqueue(&self, events: &[Event]) {
        let mut client = self.pool.get().await.unwrap();
        let txn = client.transaction().await.unwrap();
        for e in events {
            self.outbox.enqueue(&txn, e).await.unwrap();
        }
        txn.commit().await.unwrap();
    }

    /// How many bytes of log the slot keeps past its confirmed position, and its confirmed
    /// position.
    async fn slot_lag(&self) -> (i64, String) {
        let row = self
            .pool
            .get()
            .await
            .unwrap()
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8,
                        confirmed_flush_lsn::text
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }

    async fn states(&self) -> Vec<(String, i16, Option<String>)> {
        self.pool
            .get()
            .await
            .unwrap()
            .query(
                &format!(
                    "SELECT id, state, last_error FROM {} ORDER BY seq",
                    self.table
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    async fn drop(self) {
        // A relay still reading (a test that failed) holds the slot for a moment.
        for _ in 0..50 {
            match self.outbox.drop_slot(&self.slot).await {
                Ok(_) => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let slots = format!("{}_slots", self.table);
        let publication = format!("{}_publication", self.table);
        let client = self.pool.get().await.unwrap();
        client
            .batch_execute(&format!("DROP PUBLICATION IF EXISTS {publication}"))
            .await
            .unwrap();
        forget(&self.pool, &[&slots, &self.table], &[&self.table]).await;
    }
}

/// A relay running in a task of its own, until stopped.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), surely::outbox::LogError>>,
}

fn spawn<P>(relay: LogRelay<P>) -> Running
where
    P: tower::Service<Event> + Send + 'static,
    P::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    P::Future: Send + 'static,
{
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(relay.run(async move {
        let _ = stopped.await;
    }));
    Running { stop, task }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the relay stops when told")
            .unwrap()
            .unwrap();
    }
}

/// Waits (up to 10 s) until `done` holds.
async fn until<F: Future<Output = bool>>(what: &str, mut done: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited 10 s for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn published(bus: &Bus, n: usize) {
    until(&format!("{n} events published"), || async {
        bus.published().len() >= n
    })
    .await;
}

/// The ids in the order of their first publish.
fn first_seen(ids: Vec<EventId>) -> Vec<EventId> {
    let mut seen = Vec::new();
    for id in ids {
        if !seen.contains(&id) {
            seen.push(id);
        }
    }
    seen
}

#[tokio::test]
async fn pg_log_events_go_out_in_commit_order_and_the_slot_is_confirmed_past_them() {
    let f = Fixture::new("commit order").await;
    f.create_slot().await;
    // The first transaction enqueues first and commits last: the log has it second.
    let mut early = f.pool.get().await.unwrap();
    let early_txn = early.transaction().await.unwrap();
    f.outbox.enqueue(&early_txn, &event(1)).await.unwrap();
    f.enqueue(&[event(2), event(3)]).await;
    early_txn.commit().await.unwrap();
    f.enqueue(&[event(4)]).await;

    let bus = Bus::default();
    let running = spawn(f.relay(bus.service()).build().unwrap());
    published(&bus, 4).await;
    let order: Vec<EventId> = [2, 3, 1, 4]
        .iter()
        .map(|n| event(*n).id().clone())
        .collect();
    assert_eq!(bus.published(), order, "in the order of their commits");
    // Confirmed past them, and nothing written to the rows.
    until("the slot confirmed", || async {
        f.slot_lag().await.0 < 1_000_000
    })
    .await;
    running.stop().await;
    assert!(f.states().await.iter().all(|(_, state, _)| *state == 0));

    // A relay started again publishes nothing twice: the slot starts past them.
    let again = Bus::default();
    let running = spawn(f.relay(again.service()).build().unwrap());
    f.enqueue(&[event(5)]).await;
    published(&again, 1).await;
    running.stop().await;
    assert_eq!(again.published(), vec![event(5).id().clone()]);
    f.drop().await;
}

#[tokio::test]
async fn pg_log_events_before_the_slot_go_out_from_the_table_first() {
    let f = Fixture::new("before the slot").await;
    f.enqueue(&[event(1), event(2)]).await;
    f.create_slot().await;
    f.enqueue(&[event(3)]).await;
    let bus = Bus::default();
    let running = spawn(f.relay(bus.service()).build().unwrap());
    published(&bus, 3).await;
    running.stop().await;
    let ids: Vec<EventId> = (1..=3).map(|n| event(n).id().clone()).collect();
    assert_eq!(bus.published(), ids);
    // Those from the table are marked published; the one from the log is not touched.
    let states: Vec<i16> = f.states().await.iter().map(|s| s.1).collect();
    assert_eq!(states, vec![1, 1, 0]);
    f.drop().await;
}

#[tokio::test]
async fn pg_log_a_row_that_is_not_an_event_is_quarantined_and_the_relay_goes_on() {
    let f = Fixture::new("bad rows").await;
    f.create_slot().await;
    f.enqueue(&[event(1)]).await;
    // A row written by hand with a kind that names no subject, and one over max_payload.
    let client = f.pool.get().await.unwrap();
    client
        .batch_execute(&format!(
            "INSERT INTO {t} (id, aggregate, version, kind, header_names, header_values, payload)
             VALUES ('bad-kind', 'order o-9', 1, 'not a kind!', '{{}}', '{{}}', 'x'),
                    ('too-big', 'order o-9', 2, 'OrderCreated', '{{}}', '{{}}', repeat('x', 5000)::bytea)",
            t = f.table
        ))
        .await
        .unwrap();
    f.enqueue(&[event(2)]).await;
    let bus = Bus::default();
    let running = spawn(f.relay(bus.service()).max_payload(4096).build().unwrap());
    published(&bus, 2).await;
    until("the bad rows quarantined", || async {
        f.states().await.iter().filter(|s| s.1 == 2).count() == 2
    })
    .await;
    running.stop().await;
    assert_eq!(
        bus.published(),
        vec![event(1).id().clone(), event(2).id().clone()]
    );
    for (id, state, error) in f.states().await {
        if state == 2 {
            let error = error.unwrap();
            assert!(error.starts_with("log relay at "), "{id}: {error}");
            let why = if id == "bad-kind" {
                "kind"
            } else {
                "max_payload"
            };
            assert!(error.contains(why), "{id}: {error}");
        }
    }
    let stats = f.outbox.stats().await.unwrap();
    assert_eq!(stats.quarantined, 2);
    f.drop().await;
}

#[tokio::test]
async fn pg_log_a_refused_event_holds_the_slot_then_is_quarantined_and_a_requeue_publishes_it() {
    let f = Fixture::new("refusals").await;
    f.create_slot().await;
    // The broker refuses the first event three times: the relay tries it three times, then
    // quarantines it and goes on.
    let bus = Bus::new([Broker::Refuse, Broker::Refuse, Broker::Refuse]);
    let running = spawn(
        f.relay(bus.service())
            .max_in_flight(1)
            .quarantine_after(3)
            .build()
            .unwrap(),
    );
    f.enqueue(&[event(1)]).await;
    f.enqueue(&[event(2)]).await;
    published(&bus, 1).await;
    assert_eq!(
        bus.published(),
        vec![event(2).id().clone()],
        "1 quarantined, 2 published"
    );
    let quarantined = f.outbox.quarantined(10).await.unwrap();
    assert_eq!(quarantined.len(), 1);
    assert_eq!(quarantined[0].event.id(), event(1).id());
    assert!(quarantined[0]
        .last_error
        .as_deref()
        .unwrap()
        .contains("broker unavailable"));

    // A person requeues it: the update is in the log, and the relay publishes it and marks it.
    f.outbox.requeue(event(1).id()).await.unwrap();
    published(&bus, 2).await;
    until("the requeued event marked", || async {
        f.states()
            .await
            .iter()
            .any(|s| s.0 == event(1).id().as_str() && s.1 == 1)
    })
    .await;
    running.stop().await;
    assert_eq!(
        bus.published(),
        vec![event(2).id().clone(), event(1).id().clone()]
    );
    f.drop().await;
}

#[tokio::test]
async fn pg_log_a_relay_killed_before_it_confirmed_publishes_again_in_order() {
    let f = Fixture::new("killed").await;
    f.create_slot().await;
    // A broker that never answers: the relay holds every event, confirms nothing.
    let held = Arc::new(Mutex::new(Vec::<EventId>::new()));
    let h = held.clone();
    let stuck = tower::service_fn(move |e: Event| {
        h.lock().unwrap().push(e.id().clone());
        std::future::pending::<Result<(), std::io::Error>>()
    });
    let running = spawn(f.relay(stuck).build().unwrap());
    for n in 1..=5 {
        f.enqueue(&[event(n)]).await;
    }
    until("five events sent", || async {
        held.lock().unwrap().len() == 5
    })
    .await;
    // Killed: the task ends where it is.
    running.task.abort();
    let _ = running.task.await;
    // The killed relay's connection ends at once; the next relay may find the slot active
    // for a moment, and stands by until it is free.
    let bus = Bus::default();
    let next = spawn(
        f.relay(bus.service())
            .standby(Duration::from_millis(50))
            .build()
            .unwrap(),
    );
    published(&bus, 5).await;
    next.stop().await;
    let ids: Vec<EventId> = (1..=5).map(|n| event(n).id().clone()).collect();
    assert_eq!(first_seen(bus.published()), ids, "all of them, in order");
    f.drop().await;
}

#[tokio::test]
async fn pg_log_a_second_relay_stands_by_and_takes_over() {
    let f = Fixture::new("standby").await;
    f.create_slot().await;
    let (a, b) = (Bus::default(), Bus::default());
    let first = spawn(f.relay(a.service()).build().unwrap());
    f.enqueue(&[event(1)]).await;
    published(&a, 1).await;
    let second = spawn(
        f.relay(b.service())
            .standby(Duration::from_millis(50))
            .build()
            .unwrap(),
    );
    f.enqueue(&[event(2)]).await;
    published(&a, 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(b.published().is_empty(), "the standby publishes nothing");
    first.stop().await;
    f.enqueue(&[event(3)]).await;
    published(&b, 1).await;
    second.stop().await;
    assert_eq!(first_seen(b.published()), vec![event(3).id().clone()]);
    f.drop().await;
}

#[tokio::test]
async fn pg_log_setup_that_is_missing_is_a_typed_error_naming_what_to_run() {
    let f = Fixture::new("setup").await;
    let relay = f.relay(Bus::default().service()).build().unwrap();
    let err = relay.check().await.unwrap_err();
    assert!(err.is_no_slot() && err.is_setup(), "{err}");
    assert!(err.to_string().contains("create_slot"), "{err}");
    // `run` stops on it instead of waiting for a slot that nobody makes.
    let err = tokio::time::timeout(Duration::from_secs(10), relay.run(std::future::pending()))
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.is_no_slot(), "{err}");

    f.create_slot().await;
    f.pool
        .get()
        .await
        .unwrap()
        .batch_execute(&format!("DROP PUBLICATION {}_publication", f.table))
        .await
        .unwrap();
    let err = f
        .relay(Bus::default().service())
        .build()
        .unwrap()
        .check()
        .await
        .unwrap_err();
    assert!(err.is_no_publication(), "{err}");
    assert!(err.to_string().contains("migrate"), "{err}");
    f.drop().await;
}

#[tokio::test]
async fn pg_log_an_idle_outbox_beside_a_busy_table_keeps_the_slot_near_the_end_of_the_log() {
    let f = Fixture::new("heartbeat").await;
    f.create_slot().await;
    let busy = unique("surely_busy");
    let client = f.pool.get().await.unwrap();
    client
        .batch_execute(&format!("CREATE TABLE {busy} (n int, pad text)"))
        .await
        .unwrap();
    let bus = Bus::default();
    let running = spawn(f.relay(bus.service()).build().unwrap());
    // About 8 MB of log from another table, none from the outbox.
    let (_, start) = f.slot_lag().await;
    for _ in 0..20 {
        client
            .batch_execute(&format!(
                "INSERT INTO {busy} SELECT g, repeat('x', 300) FROM generate_series(1, 1000) g"
            ))
            .await
            .unwrap();
    }
    let written: i64 = client
        .query_one(
            &format!("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{start}')::int8"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        written > 4_000_000,
        "the busy table wrote {written} bytes of log"
    );
    // Within a few heartbeats, the slot is confirmed close to the end of the log.
    until(
        "the idle slot confirmed past the busy table's log",
        || async { f.slot_lag().await.0 < written / 10 },
    )
    .await;
    // And the log the server keeps for it (from its restart position, which moves at the next
    // snapshot of running transactions the log carries: a checkpoint writes one, as the
    // background writer does every 15 s on a busy server) shrinks with it.
    client.batch_execute("CHECKPOINT").await.unwrap();
    until("the idle slot's retained log bounded", || async {
        let kept: i64 = f
            .pool
            .get()
            .await
            .unwrap()
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&f.slot],
            )
            .await
            .unwrap()
            .get(0);
        kept < written / 10
    })
    .await;
    running.stop().await;
    client
        .batch_execute(&format!("DROP TABLE {busy}"))
        .await
        .unwrap();
    f.drop().await;
}

#[tokio::test]
async fn pg_log_durations_up_to_the_longest_run_without_a_panic_or_a_refusal() {
    let f = Fixture::new("longest durations").await;
    f.create_slot().await;
    let bus = Bus::default();
    let relay = LogRelay::builder(f.outbox.clone(), f.source(), bus.service())
        .retry_after(Duration::MAX)
        .standby(Duration::MAX)
        .retention(Duration::MAX)
        .build()
        .unwrap();
    let running = spawn(relay);
    f.enqueue(&[event(1)]).await;
    published(&bus, 1).await;
    running.stop().await;
    f.drop().await;
}

#[tokio::test]
async fn pg_log_the_slots_lag_and_the_backlog_after_it_are_in_the_outboxs_stats() {
    let f = Fixture::new("lag").await;
    let before = f.outbox.stats().await.unwrap();
    assert_eq!(
        (before.log_lag_bytes, before.log_lag),
        (None, None),
        "no slot"
    );
    f.create_slot().await;
    let bus = Bus::default();
    let running = spawn(f.relay(bus.service()).build().unwrap());
    f.enqueue(&[event(1), event(2)]).await;
    published(&bus, 2).await;
    // Within a few heartbeats the relay records how far it published: the backlog is empty
    // though the rows stay until swept, and the slot is close to the end of the log.
    until("the backlog read as published", || async {
        let s = f.outbox.stats().await.unwrap();
        s.backlog == 0 && s.log_lag.is_some_and(|a| a < Duration::from_secs(5))
    })
    .await;
    running.stop().await;
    let s = f.outbox.stats().await.unwrap();
    assert!(s.log_lag_bytes.is_some_and(|b| b < 1_000_000), "{s:?}");
    // No relay reads the slot: new events wait, and the lag grows.
    f.enqueue(&[event(3)]).await;
    let client = f.pool.get().await.unwrap();
    client
        .batch_execute(&format!(
            "UPDATE {}_slots SET confirmed_at = now() - interval '10 minutes'",
            f.table
        ))
        .await
        .unwrap();
    let s = f.outbox.stats().await.unwrap();
    assert_eq!(s.backlog, 1, "{s:?}");
    assert!(
        s.log_lag.is_some_and(|a| a >= Duration::from_secs(600)),
        "{s:?}"
    );
    assert!(s.log_lag_bytes.is_some_and(|b| b > 0), "{s:?}");
    #[cfg(feature = "admin")]
    {
        // The admin's overview says it, on its page and in its counts.
        use surely::admin::{Access, Admin, Authorize};
        use tower::ServiceExt;
        let admin = Admin::builder()
            .outbox(f.outbox.clone())
            .authorize(Authorize::new(|_: &http::request::Parts| {
                Access::read("test")
            }))
            .build();
        for (path, says) in [
            ("/api/counts", "\"log_lag_bytes\":"),
            ("/", "the log relay's slot keeps"),
        ] {
            let answer = admin
                .router()
                .oneshot(
                    http::Request::get(path)
                        .body(axum::body::Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            let body = axum::body::to_bytes(answer.into_body(), 1 << 20)
                .await
                .unwrap();
            let body = String::from_utf8_lossy(&body);
            assert!(body.contains(says), "{path}: {body}");
        }
    }
    #[cfg(feature = "cli")]
    {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_surely"))
            .args(["--json", "--outbox-table", &f.table, "outbox", "stats"])
            .env("SURELY_DATABASE_URL", url())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(stats["backlog"], 1, "{stats}");
        assert!(stats["log_lag_secs"].as_u64().unwrap() >= 600, "{stats}");
        assert!(stats["log_lag_bytes"].as_u64().unwrap() > 0, "{stats}");
    }
    f.drop().await;
}

#[tokio::test]
async fn pg_log_published_events_are_swept_after_the_retention_and_the_table_stays_bounded() {
    let f = Fixture::new("sweep").await;
    f.create_slot().await;
    let bus = Bus::default();
    let running = spawn(
        f.relay(bus.service())
            .retention(Duration::ZERO)
            .build()
            .unwrap(),
    );
    for n in 0..5 {
        f.enqueue(&[event(3 * n), event(3 * n + 1), event(3 * n + 2)])
            .await;
    }
    published(&bus, 15).await;
    // Swept once the relay has recorded them published (a heartbeat or two), without a mark.
    until("the published rows swept", || async {
        f.states().await.is_empty()
    })
    .await;
    running.stop().await;
    f.drop().await;
}

#[tokio::test]
async fn pg_log_a_slot_dropped_and_made_again_resumes_from_the_table_and_loses_nothing() {
    let f = Fixture::new("recreate").await;
    f.create_slot().await;
    let bus = Bus::default();
    let running = spawn(f.relay(bus.service()).build().unwrap());
    f.enqueue(&[event(1), event(2)]).await;
    published(&bus, 2).await;
    // Let a heartbeat record how far the table is published, then stop.
    tokio::time::sleep(Duration::from_millis(400)).await;
    running.stop().await;
    // Committed while no relay reads, then the slot is lost (dropped by an operator whose disk
    // filled), and more committed while there is none.
    f.enqueue(&[event(3)]).await;
    assert!(f.outbox.drop_slot(&f.slot).await.unwrap());
    assert!(!f.outbox.drop_slot(&f.slot).await.unwrap(), "already gone");
    f.enqueue(&[event(4)]).await;
    // Made again: the relay publishes from the table what no slot carries, then the log.
    f.create_slot().await;
    f.enqueue(&[event(5)]).await;
    let running = spawn(f.relay(bus.service()).build().unwrap());
    published(&bus, 5).await;
    running.stop().await;
    let all: Vec<EventId> = (1..=5).map(|n| event(n).id().clone()).collect();
    let seen = first_seen(bus.published());
    assert_eq!(seen, all, "every event, in order");
    // What went out twice went out with its id, for the broker's window or the inbox.
    let twice = bus.published().len() - seen.len();
    assert!(twice <= 2, "published twice: {twice}");
    f.drop().await;
}

/// Into JetStream: a relay killed after the broker stored a transaction's events, before the
/// slot was confirmed past them; the next relay publishes them again with the same ids, and
/// the stream's duplicate window keeps one copy of each.
#[cfg(feature = "nats")]
#[tokio::test]
async fn pg_log_into_jetstream_a_killed_relays_events_are_stored_once() {
    use surely::outbox::JetStreamPublisher;
    use tower::ServiceExt;

    let f = Fixture::new("jetstream").await;
    f.create_slot().await;
    let js = crate::support::nats::jetstream("log relay into jetstream").await;
    let name = unique("surely_log_js");
    let mut stream = crate::support::nats::stream(&js, "log relay into jetstream", &name).await;
    // The first relay: every publish reaches the stream, the last one's answer never comes.
    let sent = Arc::new(Mutex::new(0usize));
    let count = sent.clone();
    let first = JetStreamPublisher::new(js.clone(), name.clone()).then(move |r| {
        let n = {
            let mut n = count.lock().unwrap();
            *n += 1;
            *n
        };
        async move {
            if n == 5 {
                std::future::pending::<()>().await;
            }
            r
        }
    });
    let running = spawn(f.relay(first).build().unwrap());
    f.enqueue(&(1..=5).map(event).collect::<Vec<_>>()).await;
    until("five events stored", || async {
        *sent.lock().unwrap() == 5
    })
    .await;
    running.task.abort();
    let _ = running.task.await;
    // The next relay starts where the slot was confirmed: before the transaction.
    let duplicates = Arc::new(Mutex::new(Vec::new()));
    let seen = duplicates.clone();
    let next = JetStreamPublisher::new(js.clone(), name.clone()).map_response(move |p| {
        seen.lock().unwrap().push(p.duplicate);
        p
    });
    let running = spawn(
        f.relay(next)
            .standby(Duration::from_millis(50))
            .build()
            .unwrap(),
    );
    until("five events published again", || async {
        duplicates.lock().unwrap().len() == 5
    })
    .await;
    running.stop().await;
    assert_eq!(
        *duplicates.lock().unwrap(),
        vec![true; 5],
        "each one a duplicate"
    );
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        5,
        "one copy each"
    );
    js.delete_stream(&name).await.unwrap();
    f.drop().await;
}

mod settings {
    use std::time::Duration;

    use proptest::prelude::*;
    use surely::outbox::{LogRelay, LogSource, PostgresOutbox, WalPosition};

    fn duration() -> impl Strategy<Value = Duration> {
        prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::MAX),
            (0u64..=u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
            (0u64..100_000).prop_map(Duration::from_millis),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Any settings build a relay or are refused with the setting named: never a panic.
        #[test]
        fn any_settings_build_or_are_refused_by_name(
            heartbeat in duration(),
            retry in duration(),
            standby in duration(),
            retention in duration(),
            in_flight in 0usize..100_000,
            refusals in 0u32..5,
            payload in 0usize..usize::MAX,
        ) {
            let pool = surely::postgres::connect("postgres://nobody@127.0.0.1:1/none").unwrap();
            let outbox = PostgresOutbox::new(pool);
            let source = LogSource::new("postgres://nobody@127.0.0.1:1/none", "slot").unwrap();
            let built = LogRelay::builder(outbox, source, ())
                .heartbeat(heartbeat)
                .retry_after(retry)
                .standby(standby)
                .retention(retention)
                .max_in_flight(in_flight)
                .quarantine_after(refusals)
                .max_payload(payload)
                .build();
            let valid = heartbeat >= Duration::from_millis(10)
                && (1..=65_536).contains(&in_flight)
                && refusals >= 1;
            match built {
                Ok(_) => prop_assert!(valid),
                Err(e) => {
                    prop_assert!(!valid);
                    prop_assert!(e.setting().starts_with("log relay "), "{e}");
                }
            }
        }

        /// A source's URL and slot, and a WAL position, parse or are refused: never a panic.
        #[test]
        fn any_source_or_position_parses_or_is_refused(url in ".{0,80}", slot in ".{0,70}", at in ".{0,24}") {
            let _ = LogSource::new(&url, &slot);
            let _ = at.parse::<WalPosition>();
        }
    }

    #[test]
    fn a_position_reads_and_writes_as_postgresql_does() {
        let at: WalPosition = "16/B374D848".parse().unwrap();
        assert_eq!(at.bytes(), 0x16_B374_D848);
        assert_eq!(at.to_string(), "16/B374D848");
        assert!("16-B3".parse::<WalPosition>().is_err());
        assert!(LogSource::new("postgres://u@h/db", "Not A Slot").is_err());
        assert!(LogSource::new("postgres://u@h/db", &"s".repeat(64)).is_err());
        assert!(LogSource::new("not a url", "slot").is_err());
        let tls = LogSource::new("postgres://u@h/db?sslmode=require", "slot").unwrap_err();
        assert!(tls.reason().contains("from_config"), "{tls}");
    }
}

#[tokio::test]
async fn pg_log_a_relay_that_hears_nothing_stops_publishing_before_a_standby_takes_over() {
    use crate::support::proxy::Proxy;

    let f = Fixture::new("fence").await;
    f.create_slot().await;
    // The first relay reads the slot through a proxy that can silence the server.
    let proxy = Proxy::start("127.0.0.1:5432".to_owned()).await;
    let through = format!("postgres://postgres@{}/test", proxy.addr());
    let (a, b) = (Bus::default(), Bus::default());
    let first = spawn(
        LogRelay::builder(
            f.outbox.clone(),
            LogSource::new(&through, &f.slot).unwrap(),
            a.service(),
        )
        .heartbeat(Duration::from_millis(100))
        .fence_after(Duration::from_millis(600))
        .build()
        .unwrap(),
    );
    f.enqueue(&[event(1)]).await;
    published(&a, 1).await;
    let second = spawn(
        f.relay(b.service())
            .standby(Duration::from_millis(50))
            .build()
            .unwrap(),
    );
    // The server's words to the first relay are held: it hears nothing, fences itself, and
    // lets the slot go; the standby takes over and publishes what follows.
    proxy.hold_replies(true);
    let held_at = tokio::time::Instant::now();
    f.enqueue(&[event(2)]).await;
    f.enqueue(&[event(3)]).await;
    published(&b, 2).await;
    let took = held_at.elapsed();
    assert_eq!(
        a.published(),
        vec![event(1).id().clone()],
        "the fenced relay published nothing more"
    );
    // The standby starts where the slot was confirmed: the first event again if its
    // confirmation had not reached the server when the first relay fenced itself.
    let seen = first_seen(b.published());
    let (one, two, three) = (
        event(1).id().clone(),
        event(2).id().clone(),
        event(3).id().clone(),
    );
    assert!(
        seen == [two.clone(), three.clone()] || seen == [one, two, three],
        "in order: {seen:?}"
    );
    assert!(took < Duration::from_secs(8), "took over after {took:?}");
    second.stop().await;
    first.task.abort();
    f.drop().await;
}
