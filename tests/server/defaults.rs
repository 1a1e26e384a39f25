//! The defaults the guide states about the server half (`docs::server_states`), checked
//! through what a request gets.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::MemoryStore;
use tower::{service_fn, Layer, ServiceExt};

fn post(key: &str) -> Request<Full<Bytes>> {
    Request::post("/reports")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"r")))
        .unwrap()
}

/// `docs::server_states`: `max_stored_bytes` is 1 MiB by default. A body of 1 MiB is replayed
/// whole; one byte more is the first request's answer, and a duplicate gets an empty body that
/// says it was omitted.
#[tokio::test(start_paused = true)]
async fn a_body_up_to_one_mebibyte_is_stored_by_default() {
    let layer = IdempotencyLayer::new(MemoryStore::new());
    for (len, kept) in [(1 << 20, true), ((1 << 20) + 1, false)] {
        let body = Bytes::from(vec![b'x'; len]);
        let svc = layer.layer(service_fn(move |_: Request<Full<Bytes>>| {
            let body = body.clone();
            async move { Ok::<_, std::convert::Infallible>(Response::new(Full::new(body))) }
        }));
        let key = format!("k-{len}");
        let first = svc.clone().oneshot(post(&key)).await.unwrap();
        assert_eq!(
            first.into_body().collect().await.unwrap().to_bytes().len(),
            len
        );
        let again = svc.clone().oneshot(post(&key)).await.unwrap();
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        let omitted = again.headers().get("idempotent-replay-body-omitted");
        assert_eq!(omitted.is_some(), !kept, "{len} bytes");
        let replayed = again.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(replayed.len(), if kept { len } else { 0 }, "{len} bytes");
    }
}
