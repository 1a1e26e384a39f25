//! Records that stay `PROCESSING` are reported (seed §9: stale processing is alerted), and
//! retention can differ by operation; the sweeper deletes only terminal records past their own
//! retention. Shared by both stores: `wait` advances a paused clock (memory) or waits in real
//! time on the database's (PostgreSQL).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::{
    report_stuck, Acquire, Fence, IdempotencyStore, MemoryStore, RequestDigest,
};
use tower::{service_fn, Layer};

use super::record;
use super::support::{post, reply, send, Req};

/// `scale` is the unit of time: an hour on a paused clock, a quarter of a second on a real one.
pub(crate) async fn stuck_records_are_reported<St, F, Fut>(store: St, scale: Duration, wait: F)
where
    St: IdempotencyStore,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let digest = RequestDigest::of(b"o");
    let lease = scale;
    let (hung, done) = (record("k-hung"), record("k-done"));
    let Acquire::Owner(fence) = store.acquire(&hung, &digest, lease).await.unwrap() else {
        panic!("not the owner");
    };
    let Acquire::Owner(f) = store.acquire(&done, &digest, lease).await.unwrap() else {
        panic!("not the owner");
    };
    let ok = surely::server::store::StoredResponse::new(
        StatusCode::OK,
        &http::HeaderMap::new(),
        "ok".into(),
    );
    store.complete(&done, f, &ok, scale * 100).await.unwrap();
    // Young: nothing to report.
    assert!(store.stuck(scale, 10).await.unwrap().is_empty());

    wait(scale / 2).await;
    // A renewal keeps the lease, not the age.
    store.renew(&hung, fence, lease).await.unwrap();
    wait(scale).await;
    let stuck = store.stuck(scale, 10).await.unwrap();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0].key, hung);
    assert_eq!(stuck[0].fence, fence);
    assert!(stuck[0].age >= scale + scale / 2, "{:?}", stuck[0].age);
    assert!(store.stuck(scale * 10, 10).await.unwrap().is_empty());
    assert!(
        store.stuck(Duration::ZERO, 0).await.unwrap().is_empty(),
        "the limit holds"
    );

    // The report says it where an operator looks.
    let out = Captured::default();
    let reported = {
        let _guard = tracing::subscriber::set_default(out.subscriber());
        report_stuck(&store, scale).await.unwrap()
    };
    assert_eq!(reported.len(), 1);
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("WARN"), "{text}");
    assert!(text.contains("still processing"), "{text}");
    assert!(text.contains("key=\"k-hung\""), "{text}");
    assert!(text.contains("operation=\"POST /orders\""), "{text}");
    assert!(text.contains(&format!("fence={}", fence.get())), "{text}");
}

/// Searches are kept for `scale`, payments for a hundred times that; after `scale` and a bit,
/// the sweeper deletes the search's record only, and a record still processing stays.
pub(crate) async fn retention_by_operation<St, F, Fut>(store: St, scale: Duration, wait: F)
where
    St: IdempotencyStore + Clone,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let layer = IdempotencyLayer::builder(store.clone())
        .retention(scale)
        .retention_by(move |parts| {
            parts
                .uri
                .path()
                .starts_with("/payments")
                .then_some(scale * 100)
        })
        .build()
        .unwrap();
    let mut svc = layer.layer(service_fn(|_req: Req| async {
        Ok::<_, Infallible>(reply(201, "done"))
    }));
    let at = |path: &str, key: &str| {
        let mut req = post(Some(key), "o");
        *req.uri_mut() = path.parse().unwrap();
        req
    };
    assert_eq!(send(&mut svc, at("/search", "k-s")).await.status, 201);
    assert_eq!(send(&mut svc, at("/payments", "k-p")).await.status, 201);
    // An owner that never answers.
    let hung = surely::server::store::RecordKey::new(
        "",
        "POST /payments",
        surely::idempotency::IdempotencyKey::new("k-hung").unwrap(),
    );
    let Acquire::Owner(_) = store
        .acquire(&hung, &RequestDigest::of(b"o"), scale / 4)
        .await
        .unwrap()
    else {
        panic!("not the owner");
    };

    wait(scale + scale / 2).await;
    assert_eq!(
        store.sweep(Duration::ZERO).await.unwrap(),
        1,
        "the search's only"
    );
    // The payment's is still replayed; the search's key is forgotten, and runs anew.
    let payment = send(&mut svc, at("/payments", "k-p")).await;
    assert!(payment.replayed(), "{payment:?}");
    let search = send(&mut svc, at("/search", "k-s")).await;
    assert_eq!(search.status, 201);
    assert!(!search.replayed());
    // The processing record was not swept: taking it over gives fence 2, not 1.
    assert!(matches!(
        store.acquire(&hung, &RequestDigest::of(b"o"), scale).await.unwrap(),
        Acquire::TakenOver { fence, .. } if fence == Fence::new(2)
    ));
}

#[tokio::test(start_paused = true)]
async fn memory_stuck_records_are_reported() {
    stuck_records_are_reported(MemoryStore::new(), Duration::from_secs(3600), |d| {
        tokio::time::advance(d)
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn memory_retention_by_operation() {
    retention_by_operation(MemoryStore::new(), Duration::from_secs(3600), |d| {
        tokio::time::advance(d)
    })
    .await;
}

/// A writer for tracing-subscriber that keeps what it is given.
#[derive(Clone, Default)]
pub(crate) struct Captured(pub(crate) Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    /// A plain-text subscriber that writes into this capture.
    pub(crate) fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + use<> {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
