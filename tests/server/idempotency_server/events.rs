//! What the layer tells its recorder: one scripted scenario in which every event happens once,
//! the store's failures included; the default `()` (and any disabled recorder) that is never
//! called; and what the `TracingRecorder` writes.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use surely::record::{
    AttemptRecord, CallRecord, InMemoryRecorder, Recorder, RecoveryVerdict, ServerEvent,
    ServerEventKind, TracingRecorder,
};
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::{
    Acquire, Checkpoint, ExpiredRecord, Fence, IdempotencyStore, MemoryStore, RecordKey,
    RequestDigest, StoreError, StoredResponse, StuckRecord, UnknownRecord,
};
use tower::{service_fn, Layer};

use super::support::{post, reply, send, Req, Seen};
use super::{secs, until};

/// A memory store that can be switched down (every call fails) or made to fail completions only.
#[derive(Clone, Default)]
struct Switch {
    inner: MemoryStore,
    down: Arc<AtomicBool>,
    completions_fail: Arc<AtomicBool>,
}

fn refused() -> StoreError {
    StoreError::backend("connection refused")
}

impl IdempotencyStore for Switch {
    async fn acquire(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> Result<Acquire, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.inner.acquire(key, digest, lease).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        fence: Fence,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) || self.completions_fail.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.inner.complete(key, fence, response, retention).await
    }

    async fn release(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.inner.release(key, fence).await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        fence: Fence,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.inner.renew(key, fence, lease).await
    }

    async fn sweep(&self, keep_expired_for: Duration) -> Result<u64, StoreError> {
        self.inner.sweep(keep_expired_for).await
    }

    async fn stuck(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<StuckRecord>, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.inner.stuck(older_than, limit).await
    }

    async fn checkpoint(
        &self,
        key: &RecordKey,
        fence: Fence,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.inner.checkpoint(key, fence, checkpoint).await
    }

    async fn mark_unknown(
        &self,
        key: &RecordKey,
        fence: Fence,
        evidence: &str,
    ) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.inner.mark_unknown(key, fence, evidence).await
    }

    async fn unknowns(&self, limit: usize) -> Result<Vec<UnknownRecord>, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.inner.unknowns(limit).await
    }

    async fn expired(
        &self,
        keep: Duration,
        limit: usize,
    ) -> Result<Vec<ExpiredRecord>, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.inner.expired(keep, limit).await
    }

    async fn forget(&self, records: &[ExpiredRecord]) -> Result<u64, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(refused());
        }
        self.inner.forget(records).await
    }
}

/// A handler that counts, answers 201, and never answers a request with `x-hang`.
fn hanging_handler(
    seen: Seen,
) -> impl tower::Service<Req, Response = super::support::Res, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    service_fn(move |req: Req| {
        let hang = req.headers().contains_key("x-hang");
        let (n, fence) = seen.hit(&req);
        async move {
            if hang {
                std::future::pending::<()>().await;
            }
            Ok::<_, Infallible>(reply(
                201,
                format!("order {n} fence {}", fence.unwrap_or(0)),
            ))
        }
    })
}

fn hang(mut req: Req) -> Req {
    req.headers_mut().insert("x-hang", "1".parse().unwrap());
    req
}

fn kinds(events: &[ServerEvent]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind.as_str()).collect()
}

/// Every event, once each, in the order the script makes them; a stale release (an owner
/// taken over) and a first request that completes make none.
#[tokio::test(start_paused = true)]
async fn every_event_is_recorded_once_where_it_happens() {
    let store = Switch::default();
    let events = InMemoryRecorder::new();
    let seen = Seen::default();
    let layer = IdempotencyLayer::builder(store.clone())
        .lease(secs(10))
        .retention(secs(60))
        .cancel_with_caller()
        .recorder(events.clone())
        .build()
        .unwrap();
    let mut svc = layer.layer(hanging_handler(seen.clone()));

    // A first request that completes: no event.
    assert_eq!(send(&mut svc, post(Some("k-1"), "o")).await.status, 201);
    assert!(events.server_events().is_empty());

    // Replayed.
    assert!(send(&mut svc, post(Some("k-1"), "o")).await.replayed());
    // Key mismatch.
    let got = send(&mut svc, post(Some("k-1"), "another body")).await;
    assert_eq!(got.status, StatusCode::UNPROCESSABLE_ENTITY);

    // In flight: the owner of k-2 hangs.
    let mut owner = svc.clone();
    let hung = tokio::spawn(async move { send(&mut owner, hang(post(Some("k-2"), "o"))).await });
    until(|| seen.calls() == 2).await;
    let got = send(&mut svc, post(Some("k-2"), "o")).await;
    assert_eq!(got.status, StatusCode::CONFLICT);

    // Lease takeover, 5 s past the lease.
    tokio::time::advance(secs(15)).await;
    let got = send(&mut svc, post(Some("k-2"), "o")).await;
    assert_eq!(got.status, 201);
    assert_eq!(got.body, "order 3 fence 2");
    // The hung owner goes away: its release is refused (stale), and reported as nothing.
    hung.abort();
    assert!(hung.await.unwrap_err().is_cancelled());
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    // The takeover and its recovery: no checkpoints, so the handler ran again.
    assert_eq!(events.server_events().len(), 5);

    // Released: an owner dropped before it answered.
    let mut owner = svc.clone();
    let dropped = tokio::spawn(async move { send(&mut owner, hang(post(Some("k-3"), "o"))).await });
    until(|| seen.calls() == 4).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    until(|| events.server_events().len() == 6).await;

    // Store unavailable: 503, the handler does not run.
    store.down.store(true, Ordering::SeqCst);
    let got = send(&mut svc, post(Some("k-4"), "o")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(seen.calls(), 4);
    store.down.store(false, Ordering::SeqCst);

    // Not stored: the handler answered, the completion failed.
    store.completions_fail.store(true, Ordering::SeqCst);
    let got = send(&mut svc, post(Some("k-5"), "o")).await;
    assert_eq!(got.status, 201);
    store.completions_fail.store(false, Ordering::SeqCst);

    // Expired: k-1 was completed at 0 s with 60 s of retention.
    tokio::time::advance(secs(50)).await;
    let got = send(&mut svc, post(Some("k-1"), "o")).await;
    assert_eq!(got.status, StatusCode::GONE);

    // Stuck: k-5 has been processing for 50 s (acquired at 15 s).
    let stuck = layer.report_stuck(secs(30)).await.unwrap();
    assert_eq!(stuck.len(), 1);

    let all = events.server_events();
    assert_eq!(
        kinds(&all),
        [
            "replayed",
            "key_mismatch",
            "in_flight",
            "lease_takeover",
            "recovered",
            "released",
            "store_unavailable",
            "not_stored",
            "expired",
            "stuck",
        ]
    );
    assert_eq!(
        all[0].kind,
        ServerEventKind::Replayed {
            status: StatusCode::CREATED
        }
    );
    assert_eq!(
        all[2].kind,
        ServerEventKind::InFlight {
            lease_left: secs(10)
        }
    );
    assert_eq!(
        all[3].kind,
        ServerEventKind::LeaseTakeover {
            fence: Fence::new(2),
            overdue: secs(5)
        }
    );
    assert_eq!(
        all[4].kind,
        ServerEventKind::Recovered {
            fence: Fence::new(2),
            verdict: RecoveryVerdict::Resumed
        }
    );
    assert_eq!(
        all[5].kind,
        ServerEventKind::Released {
            fence: Fence::new(1)
        }
    );
    assert_eq!(
        all[7].kind,
        ServerEventKind::NotStored {
            fence: Fence::new(1)
        }
    );
    assert_eq!(
        all[9].kind,
        ServerEventKind::Stuck {
            records: 1,
            oldest: Some(secs(50))
        }
    );
    // Every request's event names its method and record; the report's names none.
    let keys: Vec<_> = all.iter().map(ServerEvent::key).collect();
    assert_eq!(
        keys,
        [
            Some("k-1"),
            Some("k-1"),
            Some("k-2"),
            Some("k-2"),
            Some("k-2"),
            Some("k-3"),
            Some("k-4"),
            Some("k-5"),
            Some("k-1"),
            None,
        ]
    );
    for e in &all[..9] {
        assert_eq!(e.method, Some(Method::POST), "{e}");
        assert_eq!(e.operation(), Some("POST /orders"), "{e}");
        assert_eq!(e.tenant(), Some(""), "{e}");
    }
    assert_eq!((all[9].method.as_ref(), all[9].tenant()), (None, None));
    assert_eq!(
        all[3].to_string(),
        "idempotency lease_takeover POST tenant= operation=\"POST /orders\" key=k-2 \
         fence=2 overdue=5000ms"
    );

    // The released key ran again at once; the store that failed to complete left k-5 to its
    // lease.
    let got = send(&mut svc, post(Some("k-3"), "o")).await;
    assert_eq!(got.status, 201);
    assert_eq!(
        events.server_events().len(),
        10,
        "a fresh owner makes no event"
    );
}

/// A recorder that counts what it is asked, and says whether it is enabled.
#[derive(Clone)]
struct Counting {
    enabled: bool,
    server: Arc<AtomicUsize>,
}

impl Recorder for Counting {
    fn enabled(&self) -> bool {
        self.enabled
    }

    fn record_attempt(&self, _: &AttemptRecord) {}

    fn record_call(&self, _: &CallRecord) {}

    fn record_server(&self, _: &ServerEvent) {
        self.server.fetch_add(1, Ordering::SeqCst);
    }
}

/// Replay, mismatch, in flight and a down store through a layer.
async fn eventful(layer: IdempotencyLayer<Switch>, store: Switch) {
    let seen = Seen::default();
    let mut svc = layer.layer(hanging_handler(seen.clone()));
    assert_eq!(send(&mut svc, post(Some("k-1"), "o")).await.status, 201);
    assert!(send(&mut svc, post(Some("k-1"), "o")).await.replayed());
    assert_eq!(send(&mut svc, post(Some("k-1"), "x")).await.status, 422);
    store.down.store(true, Ordering::SeqCst);
    assert_eq!(send(&mut svc, post(Some("k-2"), "o")).await.status, 503);
    store.down.store(false, Ordering::SeqCst);
    layer.report_stuck(secs(1)).await.unwrap();
}

/// The default records nothing, and a recorder that is not enabled is never called. The layer
/// keeps a recorder it is given whatever it says at build time (a `TracingRecorder` is enabled
/// only once a subscriber listens, which may be later) and asks it at each event.
#[tokio::test]
async fn the_default_and_a_disabled_recorder_record_nothing() {
    let store = Switch::default();
    let layer = IdempotencyLayer::builder(store.clone()).build().unwrap();
    assert!(
        format!("{layer:?}").contains("recorder: false"),
        "{layer:?}"
    );
    eventful(layer, store.clone()).await;

    let layer = IdempotencyLayer::builder(store.clone())
        .recorder(())
        .build()
        .unwrap();
    assert!(format!("{layer:?}").contains("recorder: true"));

    let disabled = Counting {
        enabled: false,
        server: Arc::default(),
    };
    let store = Switch::default();
    let layer = IdempotencyLayer::builder(store.clone())
        .recorder(((), disabled.clone()))
        .build()
        .unwrap();
    eventful(layer, store).await;
    assert_eq!(disabled.server.load(Ordering::SeqCst), 0);

    // The same, enabled, in a pair with `()`: every event reaches it.
    let enabled = Counting {
        enabled: true,
        server: Arc::default(),
    };
    let store = Switch::default();
    let layer = IdempotencyLayer::builder(store.clone())
        .recorder(((), enabled.clone()))
        .build()
        .unwrap();
    assert!(format!("{layer:?}").contains("recorder: true"));
    eventful(layer, store).await;
    assert_eq!(
        enabled.server.load(Ordering::SeqCst),
        4,
        "replayed, mismatch, store unavailable, stuck"
    );
}

/// A closure recorder gets `Record::Server`.
#[tokio::test]
async fn a_closure_recorder_sees_server_events() {
    let seen: Arc<std::sync::Mutex<Vec<&'static str>>> = Arc::default();
    let log = seen.clone();
    let store = Switch::default();
    let layer = IdempotencyLayer::builder(store.clone())
        .recorder(move |r: surely::record::Record<'_>| {
            if let surely::record::Record::Server(e) = r {
                log.lock().unwrap().push(e.kind.as_str());
            }
        })
        .build()
        .unwrap();
    eventful(layer, store).await;
    assert_eq!(
        *seen.lock().unwrap(),
        ["replayed", "key_mismatch", "store_unavailable", "stuck"]
    );
}

/// The `TracingRecorder` warns of a takeover, with how long past the lease and the record;
/// a replay is `INFO`.
#[tokio::test(start_paused = true)]
async fn the_tracing_recorder_warns_of_a_takeover() {
    let out = super::recovery::Captured::default();
    let _guard = tracing::subscriber::set_default(out.subscriber());

    let seen = Seen::default();
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .lease(secs(10))
        .recorder(TracingRecorder::new())
        .build()
        .unwrap();
    let mut svc = layer.layer(hanging_handler(seen.clone()));
    let mut owner = svc.clone();
    let hung = tokio::spawn(async move { send(&mut owner, hang(post(Some("k-t"), "o"))).await });
    until(|| seen.calls() == 1).await;
    tokio::time::advance(secs(12)).await;
    assert_eq!(send(&mut svc, post(Some("k-t"), "o")).await.status, 201);
    assert!(send(&mut svc, post(Some("k-t"), "o")).await.replayed());
    hung.abort();

    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let takeover = text
        .lines()
        .find(|l| l.contains("lease taken over"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(takeover.contains("WARN"), "{takeover}");
    for field in [
        "surely.event=\"lease_takeover\"",
        "http.request.method=\"POST\"",
        "surely.key=\"k-t\"",
        "surely.operation=\"POST /orders\"",
        "surely.fence=2",
        "surely.overdue_ms=2000",
    ] {
        assert!(takeover.contains(field), "{field} in {takeover}");
    }
    let replay = text
        .lines()
        .find(|l| l.contains("replayed"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(replay.contains("INFO"), "{replay}");
    assert!(replay.contains("http.response.status_code=201"), "{replay}");
}

/// Through the layer, on any store: a record released by its owner runs again as a plain owner
/// (no event), one whose owner's lease passed is a takeover, told with how long past the
/// lease. `scale` is the lease: ten seconds of paused time (memory), or a fraction of a second
/// of the database's clock (PostgreSQL).
pub(crate) async fn a_takeover_is_told_from_a_release<St, F, Fut>(
    store: St,
    scale: Duration,
    wait: F,
) where
    St: IdempotencyStore + Clone,
    F: Fn(Duration) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let events = InMemoryRecorder::new();
    let seen = Seen::default();
    let layer = IdempotencyLayer::builder(store.clone())
        .lease(scale)
        .recorder(events.clone())
        .build()
        .unwrap();
    let mut svc = layer.layer(hanging_handler(seen.clone()));
    let digest = RequestDigest::of(b"o");

    // Released by its owner: the next request owns it with fence 2, and that is no event.
    let released = super::record("k-released");
    let Acquire::Owner(fence) = store.acquire(&released, &digest, scale).await.unwrap() else {
        panic!("not the owner");
    };
    store.release(&released, fence).await.unwrap();
    let got = send(&mut svc, post(Some("k-released"), "o")).await;
    assert_eq!(got.status, 201);
    assert!(got.body.ends_with(b"fence 2"), "{got:?}");
    assert!(
        events.server_events().is_empty(),
        "{:?}",
        events.server_events()
    );

    // An owner that never answers: after its lease and half as long again, taken over.
    let crashed = super::record("k-crashed");
    let Acquire::Owner(_) = store.acquire(&crashed, &digest, scale).await.unwrap() else {
        panic!("not the owner");
    };
    wait(scale + scale / 2).await;
    let got = send(&mut svc, post(Some("k-crashed"), "o")).await;
    assert_eq!(got.status, 201);
    let all = events.server_events();
    assert_eq!(kinds(&all), ["lease_takeover", "recovered"]);
    let ServerEventKind::LeaseTakeover { fence, overdue } = all[0].kind else {
        panic!("{all:?}");
    };
    assert_eq!(
        all[1].kind,
        ServerEventKind::Recovered {
            fence,
            verdict: RecoveryVerdict::Resumed
        }
    );
    assert_eq!(fence, Fence::new(2));
    assert!(
        overdue >= scale / 2 && overdue < scale * 10,
        "{overdue:?} past a lease of {scale:?}"
    );
    assert_eq!(all[0].key(), Some("k-crashed"));
}

#[tokio::test(start_paused = true)]
async fn memory_a_takeover_is_told_from_a_release() {
    a_takeover_is_told_from_a_release(MemoryStore::new(), secs(10), tokio::time::advance).await;
}

/// A `TracingRecorder` given to the layer before any subscriber listens still reports once one
/// does: the layer asks at each event, not once when it is built.
#[tokio::test]
async fn a_tracing_recorder_reports_once_a_subscriber_listens() {
    use std::io::Write;
    use std::sync::Mutex;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    let store = Switch::default();
    let layer = IdempotencyLayer::builder(store.clone())
        .recorder(TracingRecorder::new())
        .build()
        .unwrap();
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    eventful(layer, store).await;
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("idempotent request replayed"), "{text}");
    assert!(text.contains("key_mismatch"), "{text}");
}
