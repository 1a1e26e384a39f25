//! What the client sends never turns into a 5xx: over real hyper on 127.0.0.1, with both
//! stores, long paths (3 KB, 64 KB), a 100 KB tenant header and a 255-byte key are served,
//! deduplicated and kept apart like any other.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::IdempotencyStore;
use tower::{service_fn, Layer, ServiceExt};

use crate::support::serve::serve;

/// Serves the layer over `store` on 127.0.0.1, the tenant from `x-tenant`; returns the base
/// URL and the count of handler runs.
async fn server<St: IdempotencyStore + Clone>(store: St) -> (String, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = service_fn(move |_req: Request<Full<Bytes>>| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .body(Full::new(Bytes::from(format!("run {n}"))))
                    .unwrap(),
            )
        }
    });
    let idem = IdempotencyLayer::builder(store)
        .tenant(|parts| {
            parts
                .headers
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .build()
        .unwrap()
        .layer(handler);
    let app = service_fn(move |req: Request<Incoming>| idem.clone().oneshot(req));
    (format!("http://{}", serve(app).await), runs)
}

/// One POST; the status, whether it was replayed, and the body.
async fn post(url: &str, tenant: &str, key: &str) -> (StatusCode, bool, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(url)
        .header("x-tenant", tenant)
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"o-1")))
        .unwrap();
    let res = client.request(req).await.unwrap();
    let status = res.status();
    let replayed = res.headers().contains_key("idempotent-replayed");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// `n` characters that do not compress (PostgreSQL compresses long values before it indexes
/// them: a run of one letter would slip under its limit).
fn noise(n: usize, seed: u64) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            CHARS[(x % CHARS.len() as u64) as usize] as char
        })
        .collect()
}

/// The cases, against a server over `store`.
pub(crate) async fn client_input_never_makes_a_5xx<St: IdempotencyStore + Clone>(store: St) {
    let (base, runs) = server(store).await;
    let long_path = |n: usize| format!("{base}/orders/{}", noise(n, n as u64));
    let big_tenant = noise(100_000, 7);
    let other_big_tenant = format!("{}!", &big_tenant[..99_999]);
    let long_key = noise(255, 11);
    let cases = [
        (
            "3 KB path",
            long_path(3_000),
            "acme".to_owned(),
            "k-3k".to_owned(),
        ),
        (
            "64 KB path",
            long_path(64_000),
            "acme".to_owned(),
            "k-64k".to_owned(),
        ),
        (
            "100 KB tenant",
            format!("{base}/orders"),
            big_tenant.clone(),
            "k-t".to_owned(),
        ),
        (
            "other 100 KB tenant",
            format!("{base}/orders"),
            other_big_tenant,
            "k-t".to_owned(),
        ),
        (
            "255-byte key",
            format!("{base}/orders"),
            "acme".to_owned(),
            long_key,
        ),
    ];
    for (n, (what, url, tenant, key)) in cases.iter().enumerate() {
        let (status, replayed, body) = post(url, tenant, key).await;
        assert_eq!(status, StatusCode::CREATED, "{what}: {body}");
        assert!(!replayed, "{what}");
        // The same request again: the stored result, and the handler did not run again.
        let (again, replayed, body_again) = post(url, tenant, key).await;
        assert_eq!(again, StatusCode::CREATED, "{what}: {body_again}");
        assert!(replayed, "{what}");
        assert_eq!(body_again, body, "{what}");
        assert_eq!(runs.load(Ordering::SeqCst), n + 1, "{what}");
    }
}

#[tokio::test]
async fn memory_client_input_never_makes_a_5xx() {
    client_input_never_makes_a_5xx(surely::server::store::MemoryStore::new()).await;
}
