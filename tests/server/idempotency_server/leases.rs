//! What a shared store does as its own clock passes a lease or a retention (PostgreSQL's,
//! Redis's): run by `postgres.rs` and `redis.rs` with short real leases, `wait` sleeping.

use std::future::Future;
use std::time::Duration;

use http::StatusCode;
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::{
    Acquire, Checkpoint, Fence, IdempotencyStore, RequestDigest, StoredResponse,
};
use tower::Layer;

use super::record;
use super::support::{handler, post, send, Seen};

/// After `lease`, the second acquire takes over with fence 2 and the first owner's checkpoints;
/// another body is a mismatch before and after the lease, never a takeover. The first owner's
/// completion, release, renewal, checkpoint and unknown are refused; the layer then replays the
/// new owner's result.
pub(crate) async fn a_lease_passes_and_the_stale_owner_is_refused<St, F, Fut>(
    store: St,
    lease: Duration,
    wait: F,
) where
    St: IdempotencyStore + Clone,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let s = &store;
    let key = record("k-lease");
    let digest = RequestDigest::of(b"o");
    let other = RequestDigest::of(b"other");
    assert!(matches!(
        s.acquire(&key, &digest, lease).await.unwrap(),
        Acquire::Owner(f) if f == Fence::new(1)
    ));
    match s.acquire(&key, &digest, lease).await.unwrap() {
        Acquire::InFlight { retry_after } => {
            assert!(
                retry_after <= lease && retry_after > Duration::ZERO,
                "{retry_after:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    // Another body while in flight: a mismatch, not a wait.
    let mismatch =
        || async { matches!(s.acquire(&key, &other, lease).await, Ok(Acquire::Mismatch)) };
    assert!(mismatch().await);
    let step = Checkpoint::new("charge", "ch-1").unwrap();
    s.checkpoint(&key, Fence::new(1), &step).await.unwrap();
    wait(lease + lease / 3).await;
    assert!(mismatch().await, "another body after the lease took over");
    // A takeover, and the store says how long past the lease, by its own clock.
    match s.acquire(&key, &digest, lease).await.unwrap() {
        Acquire::TakenOver {
            fence,
            overdue,
            age,
            checkpoints,
        } => {
            assert_eq!(fence, Fence::new(2));
            assert!(overdue >= lease / 6 && overdue < lease * 5, "{overdue:?}");
            assert!(age >= lease, "{age:?}");
            assert_eq!(checkpoints, std::slice::from_ref(&step));
        }
        other => panic!("not taken over: {other:?}"),
    }
    let (one, minute) = (Fence::new(1), Duration::from_secs(60));
    let late = StoredResponse::new(StatusCode::CREATED, &http::HeaderMap::new(), "late".into());
    assert!(s
        .complete(&key, one, &late, minute)
        .await
        .unwrap_err()
        .is_stale());
    assert!(s.release(&key, one).await.unwrap_err().is_stale());
    assert!(s.renew(&key, one, minute).await.unwrap_err().is_stale());
    assert!(s.checkpoint(&key, one, &step).await.unwrap_err().is_stale());
    assert!(s
        .mark_unknown(&key, one, "late")
        .await
        .unwrap_err()
        .is_stale());
    let won = StoredResponse::new(StatusCode::CREATED, &http::HeaderMap::new(), "won".into());
    s.complete(&key, Fence::new(2), &won, minute).await.unwrap();
    // Completing twice is refused too: the record is no longer processing.
    let twice = s.complete(&key, Fence::new(2), &won, minute).await;
    assert!(twice.unwrap_err().is_stale());
    let seen = Seen::default();
    let mut svc = IdempotencyLayer::new(store.clone()).layer(handler(seen.clone(), 201));
    let got = send(&mut svc, post(Some("k-lease"), "o")).await;
    assert!(got.replayed());
    assert_eq!(got.body, "won");
    assert_eq!(seen.calls(), 0);
}

/// The owner renews its lease by the store's clock, and keeps the record past a lease nobody
/// took over; once another request took over, the old owner's renewal is refused. A released
/// record is taken, with any body, by a plain owner with a higher fence.
pub(crate) async fn renewal_extends_the_owners_lease_only<St, F, Fut>(
    store: St,
    short: Duration,
    wait: F,
) where
    St: IdempotencyStore,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let s = &store;
    let key = record("k-renew");
    let digest = RequestDigest::of(b"o");
    let (first, second) = (Fence::new(1), Fence::new(2));
    assert!(matches!(
        s.acquire(&key, &digest, short).await.unwrap(),
        Acquire::Owner(f) if f == first
    ));
    s.renew(&key, first, Duration::from_secs(60)).await.unwrap();
    match s.acquire(&key, &digest, short).await.unwrap() {
        Acquire::InFlight { retry_after } => assert!(retry_after > Duration::from_secs(50)),
        other => panic!("{other:?}"),
    }
    // Back to a short lease, let it pass: not taken over, so the owner keeps it.
    s.renew(&key, first, short).await.unwrap();
    wait(short + short / 3).await;
    s.renew(&key, first, short).await.unwrap();
    let held = s.acquire(&key, &digest, short).await.unwrap();
    assert!(matches!(held, Acquire::InFlight { .. }), "{held:?}");
    wait(short + short / 3).await;
    let taken = s.acquire(&key, &digest, short).await.unwrap();
    assert!(matches!(taken, Acquire::TakenOver { fence, .. } if fence == second));
    assert!(s.renew(&key, first, short).await.unwrap_err().is_stale());
    s.renew(&key, second, short).await.unwrap();
    s.release(&key, second).await.unwrap();
    let again = s.acquire(&key, &RequestDigest::of(b"another"), short).await;
    assert!(matches!(again.unwrap(), Acquire::Owner(f) if f == Fence::new(3)));
}

/// After `retention` the key gets the explicit error (410), until swept; then it runs anew.
pub(crate) async fn an_expired_key_is_an_explicit_error_until_swept<St, F, Fut>(
    store: St,
    retention: Duration,
    wait: F,
) where
    St: IdempotencyStore + Clone,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let seen = Seen::default();
    let mut svc = IdempotencyLayer::builder(store.clone())
        .retention(retention)
        .build()
        .unwrap()
        .layer(handler(seen.clone(), 201));
    assert_eq!(send(&mut svc, post(Some("k-old"), "o")).await.status, 201);
    wait(retention + retention / 3).await;
    let expired = send(&mut svc, post(Some("k-old"), "o")).await;
    assert_eq!(expired.status, StatusCode::GONE);
    assert_eq!(expired.code(), Some("IDEMPOTENCY_KEY_EXPIRED"));
    assert_eq!(seen.calls(), 1);
    assert_eq!(store.sweep(Duration::from_secs(3600)).await.unwrap(), 0);
    assert_eq!(store.sweep(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(send(&mut svc, post(Some("k-old"), "o")).await.status, 201);
    assert_eq!(seen.calls(), 2);
}
