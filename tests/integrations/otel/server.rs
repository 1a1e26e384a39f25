//! The server idempotency layer's events and the outbox relay's reports, through a real
//! `IdempotencyLayer` over the memory store and a real `Relay` over the memory outbox.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use surely::outbox::{Event, EventId, MemoryOutbox, Relay};
use surely::record::InMemoryRecorder;
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::{
    Acquire, Checkpoint, ExpiredRecord, Fence, IdempotencyStore, MemoryStore, RecordKey,
    RequestDigest, StoreError, StoredResponse, StuckRecord, UnknownRecord,
};
use tokio::sync::Notify;
use tower::{service_fn, Layer, ServiceExt};

use super::Metrics;

type Req = Request<Full<Bytes>>;
type Res = Response<Full<Bytes>>;

fn keyed(method: http::Method, key: &str, body: &'static str) -> Req {
    Request::builder()
        .method(method)
        .uri("/orders")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

fn post(key: &str, body: &'static str) -> Req {
    keyed(http::Method::POST, key, body)
}

fn created() -> Res {
    Response::builder()
        .status(201)
        .body(Full::new(Bytes::from("created")))
        .unwrap()
}

const EVENTS: &str = "surely.server.idempotency.events";

fn event(kind: &'static str) -> [(&'static str, &'static str); 2] {
    [("surely.event", kind), ("http.request.method", "POST")]
}

/// Replay, in-flight 409, mismatch, a lease takeover and its recovery (paused time), each counted once by
/// name and method, with no attribute but those two.
#[tokio::test(start_paused = true)]
async fn server_events_are_counted_by_kind_and_method() {
    let metrics = Metrics::new();
    let gate = std::sync::Arc::new(Notify::new());
    let held = gate.clone();
    let handler = service_fn(move |req: Req| {
        let hang = req.headers().contains_key("x-hang");
        let held = held.clone();
        async move {
            if hang {
                held.notified().await;
            }
            Ok::<_, Infallible>(created())
        }
    });
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .lease(Duration::from_secs(10))
        .recorder(metrics.recorder())
        .build()
        .unwrap();
    let svc = layer.layer(handler);

    // Nothing yet: a first request is no event.
    let res = svc.clone().oneshot(post("k-1", "o-1")).await.unwrap();
    assert_eq!(res.status(), 201);
    assert!(!metrics.exported(EVENTS));

    let res = svc.clone().oneshot(post("k-1", "o-1")).await.unwrap();
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    let res = svc.clone().oneshot(post("k-1", "o-2")).await.unwrap();
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // An owner that hangs: a duplicate gets 409; after the lease, one takes over.
    let mut hung = post("k-2", "o");
    hung.headers_mut().insert("x-hang", "1".parse().unwrap());
    let first = tokio::spawn(svc.clone().oneshot(hung));
    while layer.store().len() < 2 {
        tokio::task::yield_now().await;
    }
    let res = svc.clone().oneshot(post("k-2", "o")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    tokio::time::advance(Duration::from_secs(12)).await;
    let res = svc.clone().oneshot(post("k-2", "o")).await.unwrap();
    assert_eq!(res.status(), 201);
    gate.notify_one();
    assert_eq!(first.await.unwrap().unwrap().status(), 201);

    // The takeover, then what its recovery decided (no checkpoints: run again).
    for kind in [
        "replayed",
        "key_mismatch",
        "in_flight",
        "lease_takeover",
        "recovered",
    ] {
        assert_eq!(metrics.count(EVENTS, &event(kind)), 1, "{kind}");
    }
    assert_eq!(metrics.count(EVENTS, &[]), 5);
    // Keys, tenants and operations are unbounded: never attributes.
    let mut keys = metrics.attribute_keys(EVENTS);
    keys.sort();
    keys.dedup();
    assert_eq!(keys, ["http.request.method", "surely.event"]);

    // A method outside the standard ones is `_OTHER`.
    let purge = http::Method::from_bytes(b"PURGE").unwrap();
    svc.clone()
        .oneshot(keyed(purge.clone(), "k-3", "o"))
        .await
        .unwrap();
    svc.clone().oneshot(keyed(purge, "k-3", "o")).await.unwrap();
    assert_eq!(
        metrics.count(
            EVENTS,
            &[
                ("surely.event", "replayed"),
                ("http.request.method", "_OTHER")
            ]
        ),
        1
    );
}

/// A store that cannot be reached.
#[derive(Clone)]
struct Down;

fn refused() -> StoreError {
    StoreError::backend("connection refused")
}

impl IdempotencyStore for Down {
    fn acquire(
        &self,
        _: &RecordKey,
        _: &RequestDigest,
        _: Duration,
    ) -> impl Future<Output = Result<Acquire, StoreError>> + Send {
        std::future::ready(Err(refused()))
    }

    fn complete(
        &self,
        _: &RecordKey,
        _: Fence,
        _: &StoredResponse,
        _: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Err(refused()))
    }

    fn release(
        &self,
        _: &RecordKey,
        _: Fence,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Err(refused()))
    }

    fn renew(
        &self,
        _: &RecordKey,
        _: Fence,
        _: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Err(refused()))
    }

    fn sweep(&self, _: Duration) -> impl Future<Output = Result<u64, StoreError>> + Send {
        std::future::ready(Err(refused()))
    }

    fn stuck(
        &self,
        _: Duration,
        _: usize,
    ) -> impl Future<Output = Result<Vec<StuckRecord>, StoreError>> + Send {
        std::future::ready(Err(refused()))
    }

    async fn checkpoint(&self, _: &RecordKey, _: Fence, _: &Checkpoint) -> Result<(), StoreError> {
        Err(StoreError::backend("connection refused"))
    }

    async fn mark_unknown(&self, _: &RecordKey, _: Fence, _: &str) -> Result<(), StoreError> {
        Err(StoreError::backend("connection refused"))
    }

    async fn unknowns(&self, _: usize) -> Result<Vec<UnknownRecord>, StoreError> {
        Err(StoreError::backend("connection refused"))
    }

    async fn expired(&self, _: Duration, _: usize) -> Result<Vec<ExpiredRecord>, StoreError> {
        Err(StoreError::backend("connection refused"))
    }

    async fn forget(&self, _: &[ExpiredRecord]) -> Result<u64, StoreError> {
        Err(StoreError::backend("connection refused"))
    }
}

/// An unreachable store answers 503 and counts `store_unavailable`; a stuck-record report that
/// fails sets no gauge.
#[tokio::test]
async fn an_unreachable_store_is_counted() {
    let metrics = Metrics::new();
    let layer = IdempotencyLayer::builder(Down)
        .recorder(metrics.recorder())
        .build()
        .unwrap();
    let svc = layer.layer(service_fn(|_req: Req| async {
        Ok::<_, Infallible>(created())
    }));
    let res = svc.clone().oneshot(post("k-1", "o")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(metrics.count(EVENTS, &event("store_unavailable")), 1);
    assert!(layer.report_stuck(Duration::from_secs(60)).await.is_err());
    assert!(!metrics.exported("surely.server.idempotency.stuck"));
}

/// The stuck-record report sets its gauges, and sets them back to zero once the record is
/// settled.
#[tokio::test(start_paused = true)]
async fn stuck_records_are_a_gauge() {
    let metrics = Metrics::new();
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::builder(store.clone())
        .recorder(metrics.recorder())
        .build()
        .unwrap();
    let key = RecordKey::new(
        "acme",
        "POST /payments",
        surely::idempotency::IdempotencyKey::new("pay-1").unwrap(),
    );
    let Acquire::Owner(fence) = store
        .acquire(&key, &RequestDigest::of(b"42"), Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("not the owner");
    };
    tokio::time::advance(Duration::from_secs(600)).await;
    assert_eq!(
        layer
            .report_stuck(Duration::from_secs(300))
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        metrics.gauge("surely.server.idempotency.stuck", &[]),
        Some(1)
    );
    assert_eq!(
        metrics.gauge_f64("surely.server.idempotency.stuck.oldest_age"),
        Some(600.0)
    );

    store.release(&key, fence).await.unwrap();
    assert!(layer
        .report_stuck(Duration::from_secs(300))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        metrics.gauge("surely.server.idempotency.stuck", &[]),
        Some(0)
    );
    assert_eq!(
        metrics.gauge_f64("surely.server.idempotency.stuck.oldest_age"),
        Some(0.0)
    );
    // A report is not an event of a request.
    assert!(!metrics.exported(EVENTS));
}

fn outbox_event(n: u32) -> Event {
    let key = format!("order o-{n}");
    Event::new(
        EventId::derive(&key, "OrderCreated"),
        key,
        1,
        "OrderCreated",
        format!("o-{n}"),
    )
    .unwrap()
}

/// A relay round that published one event and quarantined another, with a third left waiting:
/// the counters count them, the gauges say the backlog, its age and the quarantine.
#[tokio::test(start_paused = true)]
async fn relay_rounds_and_stats_are_metrics() {
    let metrics = Metrics::new();
    let records = InMemoryRecorder::new();
    let outbox = MemoryOutbox::new();
    for n in 1..=3 {
        outbox.enqueue(outbox_event(n));
    }
    let refused = EventId::derive("order o-2", "OrderCreated");
    let broker = service_fn(move |event: Event| {
        let fails = *event.id() == refused;
        async move {
            if fails {
                Err(std::io::Error::other("broker refused"))
            } else {
                Ok(())
            }
        }
    });
    let mut relay = Relay::builder(outbox.clone(), broker)
        .batch(2)
        .quarantine_after(1)
        .recorder((records.clone(), metrics.recorder()))
        .build()
        .unwrap();
    tokio::time::advance(Duration::from_secs(5)).await;
    let round = relay.run_once().await.unwrap();
    assert_eq!(
        (round.published, round.failed, round.quarantined),
        (1, 1, 1)
    );
    assert_eq!(records.relay_reports().len(), 1);

    assert_eq!(metrics.count("surely.outbox.relay.published", &[]), 1);
    assert_eq!(metrics.count("surely.outbox.relay.failed", &[]), 1);
    assert_eq!(metrics.count("surely.outbox.relay.quarantined", &[]), 1);
    assert!(!metrics.exported("surely.outbox.relay.stale"));
    assert_eq!(metrics.gauge("surely.outbox.backlog", &[]), Some(1));
    assert_eq!(metrics.gauge_f64("surely.outbox.oldest_age"), Some(5.0));
    assert_eq!(metrics.gauge("surely.outbox.quarantine", &[]), Some(1));

    // The next round publishes the last one; the stats, when due, empty the backlog.
    tokio::time::advance(Duration::from_secs(10)).await;
    relay.run_once().await.unwrap();
    assert_eq!(metrics.count("surely.outbox.relay.published", &[]), 2);
    assert_eq!(metrics.gauge("surely.outbox.backlog", &[]), Some(0));
    assert_eq!(metrics.gauge_f64("surely.outbox.oldest_age"), Some(0.0));
    assert_eq!(metrics.gauge("surely.outbox.quarantine", &[]), Some(1));
}

/// The adaptive limit's refusals counted by reason, criticality and partition, and its limit
/// and requests in flight as gauges, through a real `AdaptiveLimitLayer`.
#[tokio::test(start_paused = true)]
async fn limit_refusals_and_gauges_are_recorded() {
    use surely::server::limit::AdaptiveLimitLayer;
    use surely::Envelope;

    let metrics = Metrics::new();
    let gate = std::sync::Arc::new(Notify::new());
    let held = gate.clone();
    let handler = service_fn(move |_req: Req| {
        let held = held.clone();
        async move {
            held.notified().await;
            Ok::<_, Infallible>(created())
        }
    });
    let limit = AdaptiveLimitLayer::builder()
        .initial(1)
        .min(1)
        .max(1)
        .partition("orders", 0.5, |req: &dyn Envelope| {
            req.uri().is_some_and(|u| u.path() == "/orders")
        })
        .recorder(metrics.recorder())
        .build()
        .unwrap();
    let svc = limit.layer(handler);
    let first = tokio::spawn(svc.clone().oneshot(post("k-1", "a")));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let mut shed = Request::get("/other")
        .body(Full::new(Bytes::new()))
        .unwrap();
    shed.headers_mut().insert(
        "surely-criticality",
        http::HeaderValue::from_static("sheddable"),
    );
    assert_eq!(svc.clone().oneshot(shed).await.unwrap().status(), 503);
    assert_eq!(
        svc.clone()
            .oneshot(post("k-2", "b"))
            .await
            .unwrap()
            .status(),
        503
    );

    let refused = "surely.server.limit.refused";
    assert_eq!(
        metrics.count(
            refused,
            &[
                ("surely.refusal.reason", "limit"),
                ("surely.criticality", "sheddable")
            ]
        ),
        1
    );
    assert_eq!(
        metrics.count(
            refused,
            &[
                ("surely.refusal.reason", "limit"),
                ("surely.criticality", "critical"),
                ("surely.partition", "orders")
            ]
        ),
        1
    );
    assert_eq!(metrics.gauge("surely.server.limit", &[]), Some(1));
    assert_eq!(metrics.gauge("surely.server.limit.in_flight", &[]), Some(1));

    gate.notify_one();
    first.await.unwrap().unwrap();
    limit.report();
    assert_eq!(metrics.gauge("surely.server.limit.in_flight", &[]), Some(0));
}

/// A handler on PostgreSQL that stores its own answer (`complete_in`) without the
/// `content-type` it returns: counted once as `stored_answer_differs`, by name and method.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn an_answer_sent_other_than_the_one_the_handler_stored_is_counted() {
    use surely::server::idempotency::Ticket;
    use surely::server::store::PostgresStore;

    use crate::support::names::suffix;
    use crate::support::postgres::{did_not_answer, forget, url};

    let table = format!("surely_idem_otel{}", suffix());
    let store = PostgresStore::connect(&url())
        .unwrap()
        .with_table(&table)
        .unwrap();
    store
        .migrate()
        .await
        .unwrap_or_else(|e| did_not_answer("otel: stored_answer_differs", e));
    let metrics = Metrics::new();
    let layer = IdempotencyLayer::builder(store.clone())
        .recorder(metrics.recorder())
        .build()
        .unwrap();
    let handler_store = store.clone();
    let svc = layer.layer(service_fn(move |req: Req| {
        let store = handler_store.clone();
        async move {
            let ticket = req.extensions().get::<Ticket>().cloned().unwrap();
            let mut client = store.pool().get().await.unwrap();
            let txn = client.transaction().await.unwrap();
            let stored =
                StoredResponse::new(StatusCode::CREATED, &http::HeaderMap::new(), "o-1".into());
            store.complete_in(&txn, &ticket, &stored).await.unwrap();
            txn.commit().await.unwrap();
            let res = Response::builder()
                .status(201)
                .header("content-type", "text/plain")
                .body(Full::new(Bytes::from("o-1")))
                .unwrap();
            Ok::<_, Infallible>(res)
        }
    }));
    let res = svc.clone().oneshot(post("k-otel", "o")).await.unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(metrics.count(EVENTS, &event("stored_answer_differs")), 1);
    forget(store.pool(), &[&table], &[&table]).await;
}
