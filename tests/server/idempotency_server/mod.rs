//! The server idempotency layer: the scenarios every store must pass, run on the memory store
//! (and on PostgreSQL in `postgres.rs`, on Redis in `redis.rs`), then what the memory store
//! shows with paused time: leases, fencing, crashes, expiry and the sweeper; and the client and
//! server halves together over a real hyper server.

use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use surely::deadline::Deadline;
use surely::idempotency::IdempotencyKey;
use surely::server::idempotency::{IdempotencyLayer, Ticket};
use surely::server::store::{
    Acquire, Checkpoint, ExpiredRecord, Fence, IdempotencyStore, MemoryStore, RecordKey,
    RequestDigest, StoreError, StoredResponse, StuckRecord, UnknownRecord,
};
use tokio::sync::Notify;
use tower::{service_fn, Layer, Service, ServiceExt};

use crate::support::time::secs;

mod abandoned;
#[cfg(feature = "postgres")]
mod axum_answer;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod disconnect;
mod events;
#[cfg(feature = "postgres")]
mod in_transaction;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod leases;
mod limits;
mod postgres;
mod recovery;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_cluster;
mod scenarios;
mod stored;
mod support;
mod takeover;

use support::{chain, handler, post, reply, send, Req, Seen};

fn record(key: &str) -> RecordKey {
    RecordKey::new("", "POST /orders", IdempotencyKey::new(key).unwrap())
}

/// Lets spawned tasks run until `done` holds (paused time does not move).
async fn until(done: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the condition never held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_64_concurrent_first_requests_run_the_handler_once() {
    scenarios::concurrent_first_requests(MemoryStore::new()).await;
}

#[tokio::test]
async fn memory_same_key_different_body_is_422() {
    scenarios::different_body_is_422(MemoryStore::new()).await;
}

#[tokio::test]
async fn memory_bad_or_missing_keys_are_400() {
    scenarios::bad_keys_are_400(MemoryStore::new()).await;
}

#[tokio::test]
async fn memory_oversized_body_is_refused_before_hashing() {
    let store = MemoryStore::new();
    scenarios::oversized_body_is_refused_before_hashing(store.clone()).await;
    assert_eq!(
        store.len(),
        1,
        "only the request within the limit made a record"
    );
}

#[tokio::test]
async fn memory_tenants_are_isolated() {
    scenarios::tenants_are_isolated(MemoryStore::new()).await;
}

#[tokio::test]
async fn memory_what_is_stored_and_what_releases() {
    scenarios::what_is_stored(MemoryStore::new()).await;
}

#[tokio::test]
async fn memory_replay_carries_status_headers_body() {
    scenarios::replay_carries_the_response(MemoryStore::new()).await;
}

#[tokio::test]
async fn memory_store_with_one_shard_passes_the_scenarios() {
    scenarios::all(MemoryStore::with_shards(1)).await;
}

/// An owner that hangs past its lease is taken over with a higher fence; its late completion is
/// refused, and duplicates replay the new owner's result.
#[tokio::test(start_paused = true)]
async fn lease_expiry_takeover_with_a_higher_fence_and_the_stale_completion_refused() {
    let store = MemoryStore::new();
    let seen = Seen::default();
    let gate = Arc::new(Notify::new());
    let counted = seen.clone();
    let held = gate.clone();
    let svc = service_fn(move |req: Req| {
        let (n, fence) = counted.hit(&req);
        let held = held.clone();
        async move {
            if n == 1 {
                held.notified().await;
            }
            Ok::<_, Infallible>(reply(201, format!("fence {}", fence.unwrap())))
        }
    });
    let layer = IdempotencyLayer::builder(store.clone())
        .lease(secs(10))
        .in_flight_retry_after(secs(60))
        .build()
        .unwrap();
    let mut a = layer.layer(svc.clone());
    let first = tokio::spawn(async move { send(&mut a, post(Some("k-lease"), "o")).await });
    until(|| seen.calls() == 1).await;

    let mut b = layer.layer(svc);
    let dup = send(&mut b, post(Some("k-lease"), "o")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.headers["retry-after"], "10");

    tokio::time::advance(secs(4)).await;
    let dup = send(&mut b, post(Some("k-lease"), "o")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.headers["retry-after"], "6");

    tokio::time::advance(secs(7)).await;
    let taken = send(&mut b, post(Some("k-lease"), "o")).await;
    assert_eq!(taken.status, 201);
    assert!(!taken.replayed());
    assert_eq!(taken.body, "fence 2");

    // The old owner wakes up: its client gets its answer, the store keeps the new owner's.
    gate.notify_one();
    let late = first.await.unwrap();
    assert_eq!(late.body, "fence 1");
    let again = send(&mut b, post(Some("k-lease"), "o")).await;
    assert!(again.replayed());
    assert_eq!(again.body, "fence 2");
    assert_eq!(seen.fences(), vec![Some(1), Some(2)]);

    // And directly: a completion or release with fence 1 is refused.
    let stale = StoredResponse::new(StatusCode::OK, &http::HeaderMap::new(), "stale".into());
    let err = store
        .complete(&record("k-lease"), Fence::new(1), &stale, secs(60))
        .await
        .unwrap_err();
    assert!(err.is_stale(), "{err}");
    assert!(store
        .release(&record("k-lease"), Fence::new(1))
        .await
        .unwrap_err()
        .is_stale());
}

/// The handler hangs after its business write, and its caller goes away (a hung owner: the
/// handler runs on, on its own task). Within the lease, a retry gets 409 and does not run; after
/// it, the retry takes over with fence 2, and a handler that checks its own writes by key (as
/// the memory store cannot commit both together) does not write a second row.
#[tokio::test(start_paused = true)]
async fn crash_after_the_business_write_never_runs_twice_within_the_lease() {
    let store = MemoryStore::new();
    let seen = Seen::default();
    let rows: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let counted = seen.clone();
    let table = rows.clone();
    let svc = service_fn(move |req: Req| {
        let (n, _) = counted.hit(&req);
        let ticket = req.extensions().get::<Ticket>().cloned().unwrap();
        let table = table.clone();
        async move {
            let key = ticket.record_key().key().to_string();
            {
                let mut rows = table.lock().unwrap();
                if !rows.iter().any(|(k, _)| *k == key) {
                    rows.push((key, ticket.fence().get()));
                }
            }
            if n == 1 {
                // Crash: never answer.
                std::future::pending::<()>().await;
            }
            Ok::<_, Infallible>(reply(201, "created"))
        }
    });
    let layer = IdempotencyLayer::builder(store.clone())
        .lease(secs(30))
        .build()
        .unwrap();
    let mut a = layer.layer(svc.clone());
    let crashed = tokio::spawn(async move { send(&mut a, post(Some("k-crash"), "o")).await });
    until(|| seen.calls() == 1).await;
    crashed.abort();
    assert!(crashed.await.unwrap_err().is_cancelled());

    let mut b = layer.layer(svc);
    let retry = send(&mut b, post(Some("k-crash"), "o")).await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    // The lease has 30 s left; the client is told to come back in 1 s (the default cap).
    assert_eq!(retry.headers["retry-after"], "1");
    assert_eq!(seen.calls(), 1);

    tokio::time::advance(secs(31)).await;
    let retry = send(&mut b, post(Some("k-crash"), "o")).await;
    assert_eq!(retry.status, 201);
    assert_eq!(seen.fences(), vec![Some(1), Some(2)]);
    assert_eq!(rows.lock().unwrap().len(), 1, "a second business row");
}

/// A handler error leaves the record processing: duplicates get 409 until the lease passes.
#[tokio::test(start_paused = true)]
async fn a_handler_error_leaves_the_lease_to_expire() {
    let store = MemoryStore::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let svc = service_fn(move |_req: Req| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Err(io::Error::other("handler failed"))
            } else {
                Ok(reply(201, "ok"))
            }
        }
    });
    let mut svc = IdempotencyLayer::builder(store)
        .lease(secs(5))
        .build()
        .unwrap()
        .layer(svc);
    let err = ServiceExt::<Req>::ready(&mut svc)
        .await
        .unwrap()
        .call(post(Some("k-err"), "o"))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "handler failed");
    let res = svc.call(post(Some("k-err"), "o")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    tokio::time::advance(secs(6)).await;
    let res = svc.call(post(Some("k-err"), "o")).await.unwrap();
    assert_eq!(res.status(), 201);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// After retention, the key is an explicit error (410, `IDEMPOTENCY_KEY_EXPIRED`), never a new
/// order; once swept, the key is forgotten.
#[tokio::test(start_paused = true)]
async fn an_expired_key_is_an_explicit_error() {
    let store = MemoryStore::new();
    let seen = Seen::default();
    let mut svc = IdempotencyLayer::builder(store.clone())
        .retention(secs(60))
        .build()
        .unwrap()
        .layer(handler(seen.clone(), 201));
    assert_eq!(send(&mut svc, post(Some("k-old"), "o")).await.status, 201);
    tokio::time::advance(secs(59)).await;
    assert!(send(&mut svc, post(Some("k-old"), "o")).await.replayed());
    tokio::time::advance(secs(2)).await;
    let got = send(&mut svc, post(Some("k-old"), "o")).await;
    assert_eq!(got.status, StatusCode::GONE);
    assert_eq!(got.code(), Some("IDEMPOTENCY_KEY_EXPIRED"));
    assert!(String::from_utf8_lossy(&got.body).contains("IDEMPOTENCY_KEY_EXPIRED"));
    assert_eq!(seen.calls(), 1);

    // Kept as expired for an hour by this sweep: still the explicit error.
    assert_eq!(store.sweep(secs(3600)).await.unwrap(), 0);
    assert_eq!(
        send(&mut svc, post(Some("k-old"), "o")).await.status,
        StatusCode::GONE
    );
    assert_eq!(store.sweep(Duration::ZERO).await.unwrap(), 1);
    let fresh = send(&mut svc, post(Some("k-old"), "o")).await;
    assert_eq!(fresh.status, 201);
    assert!(!fresh.replayed());
    assert_eq!(seen.calls(), 2);
}

/// The sweeper deletes completed and released records past retention, never a processing one,
/// however old.
#[tokio::test(start_paused = true)]
async fn the_sweeper_never_deletes_a_processing_record() {
    sweeper_spares_processing(MemoryStore::new(), |d| async move {
        tokio::time::advance(d).await
    })
    .await;
}

/// Shared with the PostgreSQL test, which waits in real time.
pub(crate) async fn sweeper_spares_processing<St, F, Fut>(store: St, wait: F)
where
    St: IdempotencyStore,
    F: Fn(Duration) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let digest = RequestDigest::of(b"o");
    let short = Duration::from_secs(1);
    let done = StoredResponse::new(StatusCode::OK, &http::HeaderMap::new(), "ok".into());
    let processing = record("k-processing");
    let completed = record("k-completed");
    let released = record("k-released");
    assert!(matches!(
        store.acquire(&processing, &digest, short).await.unwrap(),
        Acquire::Owner(_)
    ));
    let Acquire::Owner(f) = store.acquire(&completed, &digest, short).await.unwrap() else {
        panic!("not owner")
    };
    store.complete(&completed, f, &done, short).await.unwrap();
    let Acquire::Owner(f) = store.acquire(&released, &digest, short).await.unwrap() else {
        panic!("not owner")
    };
    store.release(&released, f).await.unwrap();

    // Nothing is past retention (or, for the released one, 800 ms after its release) yet.
    assert_eq!(store.sweep(Duration::from_millis(800)).await.unwrap(), 0);
    wait(Duration::from_millis(1100)).await;
    // The processing record's lease passed too; still it stays.
    assert_eq!(store.sweep(Duration::ZERO).await.unwrap(), 2);
    assert_eq!(store.sweep(Duration::ZERO).await.unwrap(), 0);
    // It is there: acquiring takes it over (fence 2), rather than creating it (fence 1), and
    // says so.
    assert!(matches!(
        store.acquire(&processing, &digest, short).await.unwrap(),
        Acquire::TakenOver { fence, overdue, .. }
            if fence == Fence::new(2) && overdue >= Duration::from_millis(100)
    ));
    // The swept ones start again at fence 1.
    assert!(matches!(
        store.acquire(&completed, &digest, short).await.unwrap(),
        Acquire::Owner(f) if f == Fence::new(1)
    ));
}

/// A store that cannot be reached: the handler does not run, and the client is told so.
#[derive(Clone)]
pub(crate) struct Down;

impl IdempotencyStore for Down {
    async fn acquire(
        &self,
        _: &RecordKey,
        _: &RequestDigest,
        _: Duration,
    ) -> Result<Acquire, StoreError> {
        Err(StoreError::backend("connection refused"))
    }

    async fn complete(
        &self,
        _: &RecordKey,
        _: Fence,
        _: &StoredResponse,
        _: Duration,
    ) -> Result<(), StoreError> {
        Err(StoreError::backend("connection refused"))
    }

    async fn release(&self, _: &RecordKey, _: Fence) -> Result<(), StoreError> {
        Err(StoreError::backend("connection refused"))
    }

    async fn renew(&self, _: &RecordKey, _: Fence, _: Duration) -> Result<(), StoreError> {
        Err(StoreError::backend("connection refused"))
    }

    async fn sweep(&self, _: Duration) -> Result<u64, StoreError> {
        Err(StoreError::backend("connection refused"))
    }

    async fn stuck(&self, _: Duration, _: usize) -> Result<Vec<StuckRecord>, StoreError> {
        Err(StoreError::backend("connection refused"))
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

/// A store of one's own that does not read single records answers `inspect` with an error,
/// never with a made-up `None`.
#[tokio::test]
async fn a_store_without_inspect_says_so() {
    let err = Down.inspect(&record("k")).await.unwrap_err();
    assert!(err.is_backend());
    assert!(chain(&err).contains("single records"), "{err}");
}

#[tokio::test]
async fn an_unreachable_store_answers_503_not_processed() {
    let seen = Seen::default();
    let mut svc = IdempotencyLayer::new(Down).layer(handler(seen.clone(), 201));
    let got = send(&mut svc, post(Some("k"), "o")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(got.headers.contains_key(surely::headers::NOT_PROCESSED));
    assert!(got.headers.contains_key("retry-after"));
    assert_eq!(seen.calls(), 0);
    // Unkeyed requests do not need the store.
    let get = Request::get("/").body(Full::new(Bytes::new())).unwrap();
    assert_eq!(send(&mut svc, get).await.status, 201);
}

#[test]
fn bad_configuration_is_an_error() {
    let err = IdempotencyLayer::builder(MemoryStore::new())
        .lease(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid idempotency lease: must be greater than zero"
    );
    assert!(IdempotencyLayer::builder(MemoryStore::new())
        .retention(Duration::ZERO)
        .build()
        .is_err());
    assert!(IdempotencyLayer::builder(MemoryStore::new())
        .retention(Duration::MAX)
        .build()
        .is_err());
    assert!(IdempotencyLayer::builder(MemoryStore::new())
        .max_body_bytes(0)
        .build()
        .is_err());
    let err = IdempotencyLayer::builder(MemoryStore::new())
        .renew_for(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid idempotency lease renewal: must be greater than zero (leave it unset for no renewal)"
    );
    assert!(IdempotencyLayer::builder(MemoryStore::new())
        .renew_for(Duration::MAX)
        .build()
        .is_err());
}

/// A handler that takes 35 s under a 10 s lease: it renews its lease, so duplicates get 409 all
/// along and it runs once; without renewal, a duplicate after the lease runs it again.
#[tokio::test(start_paused = true)]
async fn a_slow_handler_that_renews_its_lease_runs_once() {
    for renew in [true, false] {
        let seen = Seen::default();
        let counted = seen.clone();
        let svc = service_fn(move |req: Req| {
            counted.hit(&req);
            async move {
                tokio::time::sleep(secs(35)).await;
                Ok::<_, Infallible>(reply(201, "created"))
            }
        });
        let builder = IdempotencyLayer::builder(MemoryStore::new()).lease(secs(10));
        let layer = if renew {
            builder.renew_for(secs(600))
        } else {
            builder
        }
        .build()
        .unwrap();
        let mut a = layer.layer(svc.clone());
        let first = tokio::spawn(async move { send(&mut a, post(Some("k-slow"), "o")).await });
        until(|| seen.calls() == 1).await;

        let mut b = layer.layer(svc);
        tokio::time::sleep(secs(15)).await;
        let dup = send(&mut b, post(Some("k-slow"), "o")).await;
        if !renew {
            // The lease passed while the first request still ran: the work runs again.
            assert_eq!(dup.status, 201);
            assert_eq!(seen.fences(), vec![Some(1), Some(2)]);
            continue;
        }
        assert_eq!(dup.status, StatusCode::CONFLICT);
        tokio::time::sleep(secs(15)).await;
        let dup = send(&mut b, post(Some("k-slow"), "o")).await;
        assert_eq!(dup.status, StatusCode::CONFLICT);

        assert_eq!(first.await.unwrap().status, 201);
        let again = send(&mut b, post(Some("k-slow"), "o")).await;
        assert!(again.replayed());
        assert_eq!(seen.fences(), vec![Some(1)]);
    }
}

/// Renewal is bounded: a handler that hangs keeps its key for `renew_for` (or until its
/// deadline), then its lease runs out and the next request takes over.
#[tokio::test(start_paused = true)]
async fn a_hung_handler_stops_renewing_at_its_bound_or_its_deadline() {
    for deadline in [None, Some(secs(20))] {
        let seen = Seen::default();
        let counted = seen.clone();
        let svc = service_fn(move |req: Req| {
            let (n, _) = counted.hit(&req);
            async move {
                if n == 1 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, Infallible>(reply(201, "created"))
            }
        });
        let layer = IdempotencyLayer::builder(MemoryStore::new())
            .lease(secs(9))
            .renew_for(secs(60))
            .build()
            .unwrap();
        let mut a = layer.layer(svc.clone());
        let hung = tokio::spawn(async move {
            let call = send(&mut a, post(Some("k-hung"), "o"));
            match deadline {
                Some(d) => surely::deadline::scope(Deadline::after(d), call).await,
                None => call.await,
            }
        });
        until(|| seen.calls() == 1).await;
        let mut b = layer.layer(svc);
        // Renewed every 3 s while renewing: the lease then ends at most 9 s after the bound.
        let bound = deadline.unwrap_or(secs(60));
        tokio::time::sleep(bound - secs(1)).await;
        assert_eq!(
            send(&mut b, post(Some("k-hung"), "o")).await.status,
            StatusCode::CONFLICT
        );
        tokio::time::sleep(secs(10)).await;
        let taken = send(&mut b, post(Some("k-hung"), "o")).await;
        assert_eq!(taken.status, 201, "{deadline:?}");
        assert_eq!(seen.fences(), vec![Some(1), Some(2)]);
        hung.abort();
    }
}

/// A store that cannot renew (unreachable at that moment): the handler still runs to its end and
/// its client gets the answer; the lease is not extended, so a duplicate after it takes over.
#[derive(Clone)]
struct NoRenew(MemoryStore);

impl IdempotencyStore for NoRenew {
    async fn acquire(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> Result<Acquire, StoreError> {
        self.0.acquire(key, digest, lease).await
    }

    async fn complete(
        &self,
        key: &RecordKey,
        fence: Fence,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.0.complete(key, fence, response, retention).await
    }

    async fn release(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        self.0.release(key, fence).await
    }

    async fn renew(&self, _: &RecordKey, _: Fence, _: Duration) -> Result<(), StoreError> {
        Err(StoreError::backend("connection refused"))
    }

    async fn sweep(&self, keep_expired_for: Duration) -> Result<u64, StoreError> {
        self.0.sweep(keep_expired_for).await
    }

    async fn stuck(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<StuckRecord>, StoreError> {
        self.0.stuck(older_than, limit).await
    }

    async fn checkpoint(
        &self,
        key: &RecordKey,
        fence: Fence,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        self.0.checkpoint(key, fence, checkpoint).await
    }

    async fn mark_unknown(
        &self,
        key: &RecordKey,
        fence: Fence,
        evidence: &str,
    ) -> Result<(), StoreError> {
        self.0.mark_unknown(key, fence, evidence).await
    }

    async fn unknowns(&self, limit: usize) -> Result<Vec<UnknownRecord>, StoreError> {
        self.0.unknowns(limit).await
    }

    async fn expired(
        &self,
        keep: Duration,
        limit: usize,
    ) -> Result<Vec<ExpiredRecord>, StoreError> {
        self.0.expired(keep, limit).await
    }

    async fn forget(&self, records: &[ExpiredRecord]) -> Result<u64, StoreError> {
        self.0.forget(records).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_renewal_the_store_refuses_leaves_the_handler_running_and_the_lease_unextended() {
    let seen = Seen::default();
    let counted = seen.clone();
    let svc = service_fn(move |req: Req| {
        counted.hit(&req);
        async move {
            tokio::time::sleep(secs(35)).await;
            Ok::<_, Infallible>(reply(201, "created"))
        }
    });
    let layer = IdempotencyLayer::builder(NoRenew(MemoryStore::new()))
        .lease(secs(10))
        .renew_for(secs(600))
        .build()
        .unwrap();
    let mut a = layer.layer(svc.clone());
    let first = tokio::spawn(async move { send(&mut a, post(Some("k-norenew"), "o")).await });
    until(|| seen.calls() == 1).await;
    tokio::time::sleep(secs(15)).await;
    let mut b = layer.layer(svc);
    let dup = send(&mut b, post(Some("k-norenew"), "o")).await;
    assert_eq!(dup.status, 201);
    assert_eq!(seen.fences(), vec![Some(1), Some(2)]);
    assert_eq!(first.await.unwrap().status, 201);
}

#[tokio::test(start_paused = true)]
async fn the_memory_store_renews_only_its_owners_lease() {
    let store = MemoryStore::new();
    let key = record("k-renew");
    let digest = RequestDigest::of(b"o");
    let Acquire::Owner(first) = store.acquire(&key, &digest, secs(10)).await.unwrap() else {
        panic!("not the owner");
    };
    // Past its lease, but not taken over: the owner keeps it.
    tokio::time::advance(secs(11)).await;
    store.renew(&key, first, secs(10)).await.unwrap();
    assert!(matches!(
        store.acquire(&key, &digest, secs(10)).await.unwrap(),
        Acquire::InFlight { retry_after } if retry_after == secs(10)
    ));
    // Taken over, a second past the renewed lease: the old owner's renewal is stale.
    tokio::time::advance(secs(11)).await;
    let Acquire::TakenOver {
        fence: second,
        overdue,
        ..
    } = store.acquire(&key, &digest, secs(10)).await.unwrap()
    else {
        panic!("not taken over");
    };
    assert_eq!(overdue, secs(1));
    assert!(store
        .renew(&key, first, secs(10))
        .await
        .unwrap_err()
        .is_stale());
    // Completed: nothing to renew.
    let done = StoredResponse::new(StatusCode::OK, &http::HeaderMap::new(), "ok".into());
    store.complete(&key, second, &done, secs(60)).await.unwrap();
    assert!(store
        .renew(&key, second, secs(10))
        .await
        .unwrap_err()
        .is_stale());
}

/// The two halves over a real hyper server on 127.0.0.1: a client with `RetryLayer` and
/// `SetIdempotencyKeyLayer` sends a POST whose key is in flight (another connection's first
/// request); it gets 409 in flight, retries with the same key, and gets the replay. The handler
/// ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_retries_with_the_same_key_get_the_replay_over_hyper() {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use surely::idempotency::SetIdempotencyKeyLayer;
    use surely::record::{InMemoryRecorder, RecordAttemptLayer};
    use surely::retry::backoff::Backoff;
    use surely::retry::RetryLayer;

    let seen = Seen::default();
    let counted = seen.clone();
    let gate = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let saw_409 = Arc::new(AtomicBool::new(false));
    let (held, starting) = (gate.clone(), started.clone());
    let app = service_fn(move |req: Req| {
        let (n, _) = counted.hit(&req);
        let (held, starting) = (held.clone(), starting.clone());
        async move {
            if n == 1 {
                starting.notify_one();
                // Hold the first request until a duplicate has been refused.
                held.notified().await;
            }
            Ok::<_, Infallible>(reply(201, format!("order {n}")))
        }
    });
    let idem = IdempotencyLayer::builder(MemoryStore::new())
        .build()
        .unwrap()
        .layer(app);
    let (open, flag) = (gate.clone(), saw_409.clone());
    let server = service_fn(move |req: Request<hyper::body::Incoming>| {
        let mut idem = idem.clone();
        let (open, flag) = (open.clone(), flag.clone());
        async move {
            let res = ServiceExt::<Request<hyper::body::Incoming>>::ready(&mut idem)
                .await?
                .call(req)
                .await?;
            if res.status() == StatusCode::CONFLICT {
                flag.store(true, Ordering::SeqCst);
                open.notify_one();
            }
            Ok::<_, Infallible>(res)
        }
    });
    let addr = crate::support::serve::serve(server).await;
    let url = format!("http://{addr}/orders");
    let post_to = |url: &str| {
        Request::post(url)
            .header("idempotency-key", "order-o-1")
            .body(Full::new(Bytes::from_static(b"o-1")))
            .unwrap()
    };

    // The first request, from a client without retries.
    let plain = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let first = {
        let plain = plain.clone();
        let req = post_to(&url);
        tokio::spawn(async move { plain.request(req).await })
    };
    tokio::time::timeout(secs(10), started.notified())
        .await
        .expect("the first request never reached the handler");

    // The retrying client, with the same key. The 409 asks it to come back in a second (the
    // header's least), and it is never sooner: one real second.
    let records = InMemoryRecorder::new();
    let mut client = tower::ServiceBuilder::new()
        .layer(SetIdempotencyKeyLayer::new())
        .layer(
            RetryLayer::builder()
                .backoff(Backoff::constant(Duration::from_millis(20)))
                .max_attempts(20)
                .no_budget()
                .build()
                .unwrap(),
        )
        .layer(RecordAttemptLayer::new(records.clone()))
        .service(plain);
    let res = tokio::time::timeout(secs(10), async {
        client.ready().await.unwrap().call(post_to(&url)).await
    })
    .await
    .expect("the retrying call took over 10 s")
    .expect("the retrying call failed");
    assert_eq!(res.status(), 201);
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "order 1");
    assert!(saw_409.load(Ordering::SeqCst));
    assert!(
        records.attempts().len() >= 2,
        "{} attempts",
        records.attempts().len()
    );

    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 201);
    assert!(!first.headers().contains_key("idempotent-replayed"));
    assert_eq!(seen.calls(), 1, "the handler ran twice");
}

/// The layer composes with tower's `ServiceBuilder` and the crate's other server layer: the
/// deadline layer outside, the idempotency layer inside it, over an `async fn` handler.
#[tokio::test]
async fn composes_with_service_builder_and_the_server_deadline_layer() {
    use surely::server::deadline::ServerDeadlineLayer;

    async fn create(req: Req) -> Result<support::Res, Infallible> {
        let fence = req.extensions().get::<Ticket>().map(|t| t.fence().get());
        Ok(reply(201, format!("fence {fence:?}")))
    }
    let mut app = tower::ServiceBuilder::new()
        .layer(ServerDeadlineLayer::new())
        .layer(
            IdempotencyLayer::builder(MemoryStore::new())
                .require_key_for([http::Method::POST])
                .build()
                .unwrap(),
        )
        .service_fn(create);
    let first = send(&mut app, post(Some("k-stack"), "o")).await;
    assert_eq!(first.body, "fence Some(1)");
    let again = send(&mut app, post(Some("k-stack"), "o")).await;
    assert!(again.replayed());
    assert_eq!(again.body, "fence Some(1)");
}
