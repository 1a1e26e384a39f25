//! The transactional outbox and its relay: events published at least once, in order, never
//! lost or silently dropped; a relay that dies lets its events go; failures retried, then
//! quarantined. On the memory outbox (paused time) and on PostgreSQL (real time, short waits on
//! the database's clock; the tests fail if it does not answer).

#[cfg(feature = "postgres-log")]
mod log;
#[cfg(feature = "nats")]
mod nats;
mod pipeline;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
mod webhook;

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use surely::outbox::{Event, EventId, MemoryOutbox, OutboxStore, Relay};
use tower::service_fn;

/// What the broker does with each publish, in turn (then accepts everything).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Broker {
    /// Acknowledges.
    Ack,
    /// Refuses: nothing published.
    Refuse,
    /// Publishes, but the acknowledgement is lost: the relay sees an error.
    LoseAck,
}

/// A broker that follows a script and keeps the ids it published.
#[derive(Clone, Default)]
pub(crate) struct Bus {
    script: Arc<Mutex<VecDeque<Broker>>>,
    pub(crate) published: Arc<Mutex<Vec<EventId>>>,
}

impl Bus {
    pub(crate) fn new(script: impl IntoIterator<Item = Broker>) -> Self {
        Bus {
            script: Arc::new(Mutex::new(script.into_iter().collect())),
            ..Bus::default()
        }
    }

    pub(crate) fn published(&self) -> Vec<EventId> {
        self.published.lock().unwrap().clone()
    }

    pub(crate) fn service(
        &self,
    ) -> impl tower::Service<
        Event,
        Response = (),
        Error = std::io::Error,
        Future = impl Future<Output = Result<(), std::io::Error>> + Send + use<>,
    >
           + Send
           + 'static
           + use<> {
        let bus = self.clone();
        service_fn(move |event: Event| {
            let step = bus
                .script
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Broker::Ack);
            if !matches!(step, Broker::Refuse) {
                bus.published.lock().unwrap().push(event.id().clone());
            }
            async move {
                match step {
                    Broker::Ack => Ok(()),
                    Broker::Refuse => Err(std::io::Error::other("broker unavailable")),
                    Broker::LoseAck => Err(std::io::Error::from(std::io::ErrorKind::TimedOut)),
                }
            }
        })
    }
}

pub(crate) fn event(n: u32) -> Event {
    let key = format!("order o-{n}");
    Event::new(
        EventId::derive(&key, "OrderCreated"),
        key,
        1,
        "OrderCreated",
        format!("o-{n}"),
    )
    .unwrap()
    .with_header("content-type", "text/plain")
    .unwrap()
}

/// Publishes in order, marks, and leaves nothing behind; a published event is swept after its
/// retention.
pub(crate) async fn publishes_in_order_then_sweeps<St, W, Fut>(
    store: St,
    ids: Vec<EventId>,
    wait: W,
) where
    St: OutboxStore + Clone,
    W: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let bus = Bus::default();
    let mut relay = Relay::builder(store.clone(), bus.service())
        .batch(2)
        .build()
        .unwrap();
    let mut published = 0;
    loop {
        let round = relay.run_once().await.unwrap();
        published += round.published;
        if round.claimed == 0 {
            break;
        }
    }
    assert_eq!(published, ids.len());
    assert_eq!(bus.published(), ids, "in the order enqueued");
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.backlog, stats.oldest, stats.quarantined),
        (0, None, 0)
    );
    assert_eq!(store.sweep(Duration::from_secs(3600)).await.unwrap(), 0);
    wait(Duration::from_millis(300)).await;
    assert_eq!(
        store.sweep(Duration::from_millis(200)).await.unwrap(),
        ids.len() as u64
    );
}

/// A refused publish waits and goes again; one whose acknowledgement was lost goes again with the
/// same id; one that keeps failing is quarantined with its last error, never published.
pub(crate) async fn failures_retry_then_quarantine<St, W, Fut>(
    store: St,
    ids: [EventId; 2],
    wait: W,
) where
    St: OutboxStore + Clone,
    W: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    // The first event: refused, then its ack lost, then acknowledged. The second: refused
    // every time.
    let bus = Bus::new([
        Broker::Refuse,
        Broker::Refuse,
        Broker::LoseAck,
        Broker::Refuse,
        Broker::Ack,
        Broker::Refuse,
    ]);
    let retry = Duration::from_millis(100);
    let mut relay = Relay::builder(store.clone(), bus.service())
        .retry_after(retry)
        .quarantine_after(3)
        .build()
        .unwrap();
    let first = relay.run_once().await.unwrap();
    assert_eq!((first.claimed, first.failed), (2, 2));
    // Not claimed again before the wait.
    assert_eq!(relay.run_once().await.unwrap().claimed, 0);
    wait(retry * 2).await;
    let second = relay.run_once().await.unwrap();
    assert_eq!((second.claimed, second.failed), (2, 2));
    wait(retry * 2).await;
    let third = relay.run_once().await.unwrap();
    assert_eq!(
        (third.published, third.failed, third.quarantined),
        (1, 1, 1)
    );
    wait(retry * 2).await;
    assert_eq!(
        relay.run_once().await.unwrap().claimed,
        0,
        "quarantined: no longer claimed"
    );
    // The first went out twice with one id (the lost ack), the second never.
    assert_eq!(bus.published(), [ids[0].clone(), ids[0].clone()]);
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.backlog, stats.quarantined), (0, 1));
    // Kept, not swept.
    wait(Duration::from_millis(300)).await;
    assert_eq!(
        store.sweep(Duration::ZERO).await.unwrap(),
        1,
        "the published one only"
    );
    assert_eq!(store.stats().await.unwrap().quarantined, 1);
}

/// An operator lists the quarantined events (with their failures and last error), requeues one
/// (published by the next round, fenced against the old claim) and discards another (never
/// published); a pending or unknown event is neither requeued nor discarded.
pub(crate) async fn quarantine_is_listed_requeued_and_discarded<St>(store: St, events: [Event; 3])
where
    St: OutboxStore + Clone,
{
    let [a, b, pending] = events;
    // Two refused once each, with a limit of one: both quarantined. The third is not claimed.
    let bus = Bus::new([Broker::Refuse, Broker::Refuse]);
    let mut relay = Relay::builder(store.clone(), bus.service())
        .batch(2)
        .quarantine_after(1)
        .build()
        .unwrap();
    let old = relay.run_once().await.unwrap();
    assert_eq!(old.quarantined, 2);
    let listed = store.quarantined(10).await.unwrap();
    let ids: Vec<&EventId> = listed.iter().map(|q| q.event.id()).collect();
    assert_eq!(ids, [a.id(), b.id()], "oldest first");
    assert_eq!(listed[0].failures, 1);
    assert_eq!(listed[0].last_error.as_deref(), Some("broker unavailable"));
    assert_eq!(listed[0].event.payload(), a.payload());
    assert_eq!(listed[0].event.headers(), a.headers());
    assert_eq!(store.quarantined(1).await.unwrap().len(), 1, "the limit");
    let one = store.quarantined_event(b.id()).await.unwrap().unwrap();
    assert_eq!(one.event.kind(), "OrderCreated");
    assert!(store
        .quarantined_event(pending.id())
        .await
        .unwrap()
        .is_none());

    // Neither a pending event nor an unknown id is requeued or discarded.
    for id in [pending.id().clone(), EventId::new("evt-none").unwrap()] {
        assert!(store.requeue(&id).await.unwrap_err().is_not_found());
        assert!(store.discard(&id).await.unwrap_err().is_not_found());
    }

    store.requeue(a.id()).await.unwrap();
    assert!(
        store.requeue(a.id()).await.unwrap_err().is_not_found(),
        "requeued once: no longer quarantined"
    );
    let gone = store.discard(b.id()).await.unwrap();
    assert_eq!(gone.id(), b.id());
    assert!(store.discard(b.id()).await.unwrap_err().is_not_found());
    assert!(store.quarantined(10).await.unwrap().is_empty());
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.backlog, stats.quarantined), (2, 0));

    let round = relay.run_once().await.unwrap();
    assert_eq!(round.published, 2, "the requeued one and the pending one");
    assert_eq!(bus.published(), [a.id().clone(), pending.id().clone()]);
}

/// A relay that claimed and died: its events come back after the lease, and another relay
/// publishes them; the dead one's late mark is refused as stale.
pub(crate) async fn a_dead_relays_events_come_back<St, W, Fut>(store: St, wait: W)
where
    St: OutboxStore + Clone,
    W: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let lease = Duration::from_millis(200);
    let held = store.claim(10, lease).await.unwrap();
    assert_eq!(held.len(), 1);
    // Held: nobody else gets it.
    assert!(store.claim(10, lease).await.unwrap().is_empty());
    wait(lease + Duration::from_millis(100)).await;
    let bus = Bus::default();
    let mut relay = Relay::builder(store.clone(), bus.service())
        .lease(lease)
        .build()
        .unwrap();
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    // The dead relay wakes up and marks: refused, the event is already published.
    let late = store.published(&held[0]).await.unwrap_err();
    assert!(late.is_stale(), "{late}");
    // Marked as part of a batch: not counted.
    assert_eq!(store.published_all(&held).await.unwrap(), 0);
    assert_eq!(store.published_all(&[]).await.unwrap(), 0);
    assert_eq!(bus.published(), [held[0].event.id().clone()]);
}

#[tokio::test(start_paused = true)]
async fn memory_publishes_in_order_then_sweeps() {
    let outbox = MemoryOutbox::new();
    let events: Vec<Event> = (1..=5).map(event).collect();
    for e in &events {
        assert!(outbox.enqueue(e.clone()));
    }
    // One id, one event.
    assert!(!outbox.enqueue(events[0].clone()));
    let ids = events.iter().map(|e| e.id().clone()).collect();
    publishes_in_order_then_sweeps(outbox, ids, tokio::time::advance).await;
}

#[tokio::test(start_paused = true)]
async fn memory_failures_retry_then_quarantine() {
    let outbox = MemoryOutbox::new();
    let (a, b) = (event(1), event(2));
    outbox.enqueue(a.clone());
    outbox.enqueue(b.clone());
    failures_retry_then_quarantine(
        outbox.clone(),
        [a.id().clone(), b.id().clone()],
        tokio::time::advance,
    )
    .await;
    assert_eq!(
        outbox.last_error(b.id()).as_deref(),
        Some("broker unavailable")
    );
}

#[tokio::test(start_paused = true)]
async fn memory_quarantine_is_listed_requeued_and_discarded() {
    let outbox = MemoryOutbox::new();
    let events = [event(1), event(2), event(3)];
    for e in &events {
        outbox.enqueue(e.clone());
    }
    quarantine_is_listed_requeued_and_discarded(outbox.clone(), events).await;
    assert_eq!(outbox.quarantined_now(10).len(), 0);
}

/// A store of one's own, written before the operator's operations: it still compiles, and
/// says what it cannot do.
#[tokio::test]
async fn a_store_without_the_operators_operations_says_so() {
    struct Old;
    impl OutboxStore for Old {
        async fn claim(
            &self,
            _: usize,
            _: Duration,
        ) -> Result<Vec<surely::outbox::Claimed>, surely::outbox::OutboxError> {
            Ok(Vec::new())
        }
        async fn published(
            &self,
            _: &surely::outbox::Claimed,
        ) -> Result<(), surely::outbox::OutboxError> {
            Ok(())
        }
        async fn failed(
            &self,
            _: &surely::outbox::Claimed,
            _: &str,
            _: Duration,
            _: u32,
        ) -> Result<surely::outbox::Failed, surely::outbox::OutboxError> {
            Ok(surely::outbox::Failed::Retry)
        }
        async fn sweep(&self, _: Duration) -> Result<u64, surely::outbox::OutboxError> {
            Ok(0)
        }
        async fn stats(&self) -> Result<surely::record::OutboxStats, surely::outbox::OutboxError> {
            Ok(Default::default())
        }
    }
    let id = EventId::new("evt-1").unwrap();
    let e = Old.requeue(&id).await.unwrap_err();
    assert!(e.is_unsupported() && !e.is_not_found(), "{e}");
    assert_eq!(
        e.to_string(),
        "this outbox store cannot requeue a quarantined event"
    );
    assert!(Old.discard(&id).await.unwrap_err().is_unsupported());
    assert!(Old.quarantined(1).await.unwrap_err().is_unsupported());
    assert!(Old
        .quarantined_event(&id)
        .await
        .unwrap_err()
        .is_unsupported());
}

#[tokio::test(start_paused = true)]
async fn memory_a_dead_relays_events_come_back() {
    let outbox = MemoryOutbox::new();
    outbox.enqueue(event(1));
    a_dead_relays_events_come_back(outbox, tokio::time::advance).await;
}

#[tokio::test(start_paused = true)]
async fn the_relay_runs_until_told_to_stop() {
    let outbox = MemoryOutbox::new();
    let bus = Bus::default();
    let relay = Relay::builder(outbox.clone(), bus.service())
        .poll(Duration::from_millis(50))
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async {
        let _ = stopped.await;
    }));
    // Events enqueued while it runs are published within a poll interval.
    tokio::time::sleep(Duration::from_millis(10)).await;
    outbox.enqueue(event(1));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(bus.published().len(), 1);
    stop.send(()).unwrap();
    running.await.unwrap();
}

/// `docs::boundary`: an idle relay finds new events at its poll interval, 1 s by default.
#[tokio::test(start_paused = true)]
async fn an_idle_relay_polls_once_a_second_by_default() {
    let outbox = MemoryOutbox::new();
    let bus = Bus::default();
    let relay = Relay::builder(outbox.clone(), bus.service())
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async {
        let _ = stopped.await;
    }));
    // The first round finds nothing; the relay waits.
    tokio::time::sleep(Duration::from_millis(10)).await;
    outbox.enqueue(event(1));
    tokio::time::sleep(Duration::from_millis(980)).await;
    assert!(bus.published().is_empty(), "not before the poll");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        bus.published().len(),
        1,
        "at the poll, 1 s after the last round"
    );
    stop.send(()).unwrap();
    running.await.unwrap();
}

/// A batch's events are all sent, in order, before any acknowledgement is awaited: a broker
/// that takes 100 ms to acknowledge costs one round 100 ms, not 100 ms per event; a refused
/// event in the middle does not hold back the ones after it.
#[tokio::test(start_paused = true)]
async fn a_batch_awaits_its_acknowledgements_together() {
    let outbox = MemoryOutbox::new();
    let events: Vec<Event> = (1..=8).map(event).collect();
    for e in &events {
        outbox.enqueue(e.clone());
    }
    let sent = Arc::new(Mutex::new(Vec::new()));
    let log = sent.clone();
    let broker = service_fn(move |event: Event| {
        log.lock().unwrap().push(event.id().clone());
        let refused = event.payload().as_ref() == b"o-4";
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if refused {
                Err(std::io::Error::other("refused"))
            } else {
                Ok(())
            }
        }
    });
    let mut relay = Relay::builder(outbox.clone(), broker)
        .batch(8)
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let round = relay.run_once().await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!((round.claimed, round.published, round.failed), (8, 7, 1));
    let ids: Vec<EventId> = events.iter().map(|e| e.id().clone()).collect();
    assert_eq!(*sent.lock().unwrap(), ids, "sent in the order enqueued");
    assert_eq!(outbox.stats().await.unwrap().backlog, 1);
}

/// A relay that polls once an hour, woken by the outbox's enqueues: an event goes out at once.
#[tokio::test(start_paused = true)]
async fn an_enqueue_wakes_an_idle_relay() {
    let outbox = MemoryOutbox::new();
    let bus = Bus::default();
    let relay = Relay::builder(outbox.clone(), bus.service())
        .poll(Duration::from_secs(3600))
        .wake_on(outbox.wakeup())
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async {
        let _ = stopped.await;
    }));
    let start = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(10)).await;
    outbox.enqueue(event(1));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(bus.published().len(), 1);
    // A second one while it waits again; a duplicate enqueue wakes nothing and adds nothing.
    outbox.enqueue(event(2));
    assert!(!outbox.enqueue(event(2)));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(bus.published().len(), 2);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "no poll was needed"
    );
    stop.send(()).unwrap();
    running.await.unwrap();
}

/// A publisher that takes one event at a time (a concurrency limit of 1, smaller than the
/// batch): the round still publishes the whole batch, in order, and ends.
#[tokio::test(start_paused = true)]
async fn a_publisher_with_less_room_than_the_batch_still_gets_every_event() {
    let outbox = MemoryOutbox::new();
    let events: Vec<Event> = (1..=8).map(event).collect();
    for e in &events {
        outbox.enqueue(e.clone());
    }
    let bus = Bus::default();
    let limited = tower::ServiceBuilder::new()
        .concurrency_limit(1)
        .service(bus.service());
    let mut relay = Relay::builder(outbox.clone(), limited)
        .batch(8)
        .build()
        .unwrap();
    let round = tokio::time::timeout(Duration::from_secs(5), relay.run_once())
        .await
        .expect("the round ended")
        .unwrap();
    assert_eq!(round.published, 8);
    let ids: Vec<EventId> = events.iter().map(|e| e.id().clone()).collect();
    assert_eq!(bus.published(), ids);
}

/// A relay sweeps published events past their retention, at most once a minute; with
/// `no_sweep` it leaves them.
#[tokio::test(start_paused = true)]
async fn the_relay_sweeps_published_events_after_their_retention() {
    let outbox = MemoryOutbox::new();
    outbox.enqueue(event(1));
    outbox.enqueue(event(2));
    let bus = Bus::new([Broker::Ack, Broker::Refuse]);
    let mut keeper = Relay::builder(outbox.clone(), bus.service())
        .no_sweep()
        .build()
        .unwrap();
    let mut relay = Relay::builder(outbox.clone(), bus.service())
        .retention(Duration::from_secs(30))
        .quarantine_after(1)
        .build()
        .unwrap();
    let first = relay.run_once().await.unwrap();
    assert_eq!((first.published, first.quarantined, first.swept), (1, 1, 0));
    tokio::time::advance(Duration::from_secs(40)).await;
    assert_eq!(keeper.run_once().await.unwrap().swept, 0, "no_sweep");
    assert_eq!(relay.run_once().await.unwrap().swept, 0, "not a minute yet");
    tokio::time::advance(Duration::from_secs(30)).await;
    assert_eq!(
        relay.run_once().await.unwrap().swept,
        1,
        "the published one; the quarantined one stays"
    );
    assert_eq!(outbox.stats_now().quarantined, 1);
}

/// A relay with a recorder reports each round that claimed events, and the outbox's stats at
/// most every `stats_every`, idle or not.
#[tokio::test(start_paused = true)]
async fn the_relay_reports_rounds_and_stats_to_its_recorder() {
    let outbox = MemoryOutbox::new();
    outbox.enqueue(event(1));
    outbox.enqueue(event(2));
    let recorder = surely::record::InMemoryRecorder::new();
    let bus = Bus::new([Broker::Ack, Broker::Refuse]);
    let mut relay = Relay::builder(outbox.clone(), bus.service())
        .recorder(recorder.clone())
        .stats_every(Duration::from_secs(10))
        .quarantine_after(1)
        .build()
        .unwrap();
    relay.run_once().await.unwrap();
    let first = recorder.relay_reports();
    assert_eq!(first.len(), 1);
    let round = first[0].round.unwrap();
    assert_eq!(
        (
            round.claimed,
            round.published,
            round.failed,
            round.quarantined
        ),
        (2, 1, 1, 1)
    );
    let stats = first[0].stats.expect("stats are due on the first round");
    assert_eq!((stats.backlog, stats.quarantined), (0, 1));
    // Idle, stats not due: nothing to report.
    tokio::time::advance(Duration::from_secs(5)).await;
    relay.run_once().await.unwrap();
    assert_eq!(recorder.relay_reports().len(), 1);
    // Idle, stats due: reported.
    outbox.enqueue(event(3));
    tokio::time::advance(Duration::from_secs(5)).await;
    let before = outbox.stats_now();
    assert_eq!(before.backlog, 1);
    relay.run_once().await.unwrap();
    let reports = recorder.relay_reports();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[1].round.unwrap().published, 1);
    assert_eq!(reports[1].stats.unwrap().backlog, 0);
    // A closure recorder sees them too.
    let seen = Arc::new(Mutex::new(0));
    let count = seen.clone();
    let mut relay = Relay::builder(outbox.clone(), bus.service())
        .recorder(move |r: surely::record::Record<'_>| {
            if let surely::record::Record::Relay(_) = r {
                *count.lock().unwrap() += 1;
            }
        })
        .build()
        .unwrap();
    relay.run_once().await.unwrap();
    assert_eq!(*seen.lock().unwrap(), 1, "stats on the first round");
}

#[test]
fn bad_settings_and_bad_events_are_errors() {
    let outbox = MemoryOutbox::new();
    let bus = Bus::default();
    for (what, builder) in [
        (
            "batch",
            Relay::builder(outbox.clone(), bus.service()).batch(0),
        ),
        (
            "lease",
            Relay::builder(outbox.clone(), bus.service()).lease(Duration::ZERO),
        ),
        (
            "poll",
            Relay::builder(outbox.clone(), bus.service()).poll(Duration::ZERO),
        ),
        (
            "quarantine",
            Relay::builder(outbox.clone(), bus.service()).quarantine_after(0),
        ),
        (
            "stats",
            Relay::builder(outbox.clone(), bus.service()).stats_every(Duration::ZERO),
        ),
        (
            "pipeline depth",
            Relay::builder(outbox.clone(), bus.service()).pipeline_depth(0),
        ),
    ] {
        let err = builder.build().unwrap_err();
        assert!(err.to_string().contains("invalid relay"), "{what}: {err}");
    }
    let id = || EventId::derive("k", "Kind");
    assert!(Event::new(id(), "", 1, "Kind", "").is_err());
    assert!(Event::new(id(), "a", 1, "", "").is_err());
    assert!(Event::new(id(), "a".repeat(256), 1, "Kind", "").is_err());
    assert!(Event::new(id(), "a\tb", 1, "Kind", "").is_err());
    assert!(Event::new(id(), "a", 1, "Order Created", "").is_err());
    assert!(Event::new(id(), "a", 1, "orders>", "").is_err());
    assert!(Event::new(id(), "commande é-1", 1, "order.created-v2_x", "").is_ok());
    let ok = Event::new(id(), "a", 1, "Kind", "").unwrap();
    assert!(ok.clone().with_header("bad name", "v").is_err());
    assert!(ok.with_header("x-ok", "line\nbreak").is_err());
    assert!(EventId::new("").is_err());
    assert!(EventId::new("é").is_err());
    assert!(EventId::new("x".repeat(256)).is_err());
}
