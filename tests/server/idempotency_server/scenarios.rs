//! Scenarios run against every store: the memory store (in `main.rs`), PostgreSQL (in
//! `postgres.rs`) and Redis (in `redis.rs`).

use std::convert::Infallible;
use std::time::Duration;

use http::StatusCode;
use surely::server::idempotency::{IdempotencyLayer, IdempotencyLayerBuilder};
use surely::server::store::IdempotencyStore;
use tower::Layer;

use super::support::{handler, post, post_as, reply, send, Req, Res, Seen};

fn builder<St: IdempotencyStore>(store: St) -> IdempotencyLayerBuilder<St> {
    IdempotencyLayer::builder(store).require_key_for([http::Method::POST])
}

/// 64 concurrent first requests with one key, through 4 independent layers over one store: the
/// handler runs once; every other request gets 409 (in flight) or the replay.
pub(crate) async fn concurrent_first_requests<St: IdempotencyStore + Clone>(store: St) {
    let seen = Seen::default();
    let counted = seen.clone();
    // A handler that takes a while (yields, no sleep), so that most duplicates find it running.
    let slow = tower::service_fn(move |req: Req| {
        let (n, _) = counted.hit(&req);
        async move {
            for _ in 0..200 {
                tokio::task::yield_now().await;
            }
            Ok::<_, Infallible>(reply(201, format!("order {n}")))
        }
    });
    let layers: Vec<_> = (0..4)
        .map(|_| builder(store.clone()).build().unwrap())
        .collect();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let mut svc = layers[i % 4].layer(slow.clone());
        tasks.push(tokio::spawn(async move {
            send(&mut svc, post(Some("k-concurrent"), "o-1")).await
        }));
    }
    let mut first = 0;
    let mut replays = 0;
    let mut in_flight = 0;
    for t in tasks {
        let got = t.await.unwrap();
        match got.status {
            StatusCode::CREATED if got.replayed() => {
                assert_eq!(got.body, "order 1");
                replays += 1;
            }
            StatusCode::CREATED => {
                assert_eq!(got.body, "order 1");
                first += 1;
            }
            StatusCode::CONFLICT => {
                assert!(got.headers.contains_key("retry-after"), "{got:?}");
                assert!(got.headers.contains_key("idempotency-key-in-flight"));
                assert_eq!(got.code(), Some("IDEMPOTENCY_KEY_IN_FLIGHT"));
                in_flight += 1;
            }
            other => panic!("unexpected {other}: {got:?}"),
        }
    }
    assert_eq!(seen.calls(), 1, "the handler ran more than once");
    assert_eq!(first, 1);
    assert_eq!(first + replays + in_flight, 64);
    eprintln!("64 requests: 1 ran, {replays} replays, {in_flight} in flight");
}

/// The same key with another body gets 422; the first result is kept.
pub(crate) async fn different_body_is_422<St: IdempotencyStore + Clone>(store: St) {
    let seen = Seen::default();
    let mut svc = builder(store)
        .build()
        .unwrap()
        .layer(handler(seen.clone(), 201));
    assert_eq!(send(&mut svc, post(Some("k-422"), "o-1")).await.status, 201);
    let other = send(&mut svc, post(Some("k-422"), "o-2")).await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(other.code(), Some("IDEMPOTENCY_KEY_MISMATCH"));
    let again = send(&mut svc, post(Some("k-422"), "o-1")).await;
    assert!(again.replayed());
    assert_eq!(seen.calls(), 1);
}

/// A key too long, a key with a space, two keys, no key on a POST: 400, the handler never runs,
/// nothing is stored. A GET without a key passes through.
pub(crate) async fn bad_keys_are_400<St: IdempotencyStore + Clone>(store: St) {
    let seen = Seen::default();
    let mut svc = builder(store)
        .build()
        .unwrap()
        .layer(handler(seen.clone(), 201));
    let long = "k".repeat(256);
    let got = send(&mut svc, post(Some(&long), "o-1")).await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST);
    assert_eq!(got.code(), Some("IDEMPOTENCY_KEY_INVALID"));
    assert!(
        String::from_utf8_lossy(&got.body).contains("256 bytes long"),
        "{got:?}"
    );
    // 255 is fine.
    let ok = send(&mut svc, post(Some(&"k".repeat(255)), "o-1")).await;
    assert_eq!(ok.status, 201);

    let got = send(&mut svc, post(Some("two\tparts"), "o-1")).await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST);

    let mut twice = post(Some("k-a"), "o-1");
    twice
        .headers_mut()
        .append("idempotency-key", "k-b".parse().unwrap());
    let got = send(&mut svc, twice).await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&got.body).contains("more than once"));

    let got = send(&mut svc, post(None, "o-1")).await;
    assert_eq!(got.status, StatusCode::BAD_REQUEST);
    assert_eq!(got.code(), Some("IDEMPOTENCY_KEY_MISSING"));
    assert_eq!(seen.calls(), 1);

    let get = http::Request::get("/orders/1")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert_eq!(send(&mut svc, get).await.status, 201);
    assert_eq!(seen.calls(), 2);
}

/// A body over the limit is refused (413) before it is hashed or the store is touched: the same
/// key with a small body afterwards is a first request, not a mismatch.
pub(crate) async fn oversized_body_is_refused_before_hashing<St: IdempotencyStore + Clone>(
    store: St,
) {
    let seen = Seen::default();
    let mut svc = builder(store)
        .max_body_bytes(16)
        .build()
        .unwrap()
        .layer(handler(seen.clone(), 201));
    // No content-length: found out while reading.
    let got = send(&mut svc, post(Some("k-big"), &"x".repeat(17))).await;
    assert_eq!(got.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(got.code(), Some("IDEMPOTENCY_BODY_TOO_LARGE"));
    // A content-length over the limit: refused before reading.
    let mut req = post(Some("k-big"), "small");
    req.headers_mut()
        .insert("content-length", "1000000".parse().unwrap());
    assert_eq!(
        send(&mut svc, req).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert_eq!(seen.calls(), 0);
    let got = send(&mut svc, post(Some("k-big"), &"x".repeat(16))).await;
    assert_eq!(got.status, 201, "{got:?}");
    assert!(!got.replayed());
    assert_eq!(seen.calls(), 1);
}

/// One tenant can neither read nor block another's record with the same key.
pub(crate) async fn tenants_are_isolated<St: IdempotencyStore + Clone>(store: St) {
    let seen = Seen::default();
    let mut svc = builder(store)
        .tenant(|parts: &http::request::Parts| {
            parts
                .headers
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .build()
        .unwrap()
        .layer(handler(seen.clone(), 201));
    let a = send(&mut svc, post_as("a", "k-shared", "o-a")).await;
    assert_eq!(a.status, 201);
    // Tenant b, same key, another body: its own first request, not a mismatch nor a replay.
    let b = send(&mut svc, post_as("b", "k-shared", "o-b")).await;
    assert_eq!(b.status, 201, "{b:?}");
    assert!(!b.replayed());
    assert_ne!(a.body, b.body);
    // Each replays its own.
    let a2 = send(&mut svc, post_as("a", "k-shared", "o-a")).await;
    let b2 = send(&mut svc, post_as("b", "k-shared", "o-b")).await;
    assert!(a2.replayed() && b2.replayed());
    assert_eq!(a2.body, a.body);
    assert_eq!(b2.body, b.body);
    assert_eq!(seen.calls(), 2);
    // No tenant: 401, nothing runs.
    let none = send(&mut svc, post(Some("k-shared"), "o-a")).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(seen.calls(), 2);
}

/// 500 is stored and replayed by default; with `store_server_errors(false)` it releases the key.
/// 429, 503, 409 and a response marked not-processed always release it.
pub(crate) async fn what_is_stored<St: IdempotencyStore + Clone>(store: St) {
    let seen = Seen::default();
    let mut svc = builder(store.clone())
        .build()
        .unwrap()
        .layer(handler(seen.clone(), 500));
    assert_eq!(send(&mut svc, post(Some("k-500"), "o")).await.status, 500);
    let again = send(&mut svc, post(Some("k-500"), "o")).await;
    assert_eq!(again.status, 500);
    assert!(again.replayed());
    assert_eq!(seen.calls(), 1);

    let seen = Seen::default();
    let mut svc = builder(store.clone())
        .store_server_errors(false)
        .build()
        .unwrap()
        .layer(handler(seen.clone(), 500));
    send(&mut svc, post(Some("k-500-released"), "o")).await;
    let again = send(&mut svc, post(Some("k-500-released"), "o")).await;
    assert!(!again.replayed());
    assert_eq!(seen.calls(), 2);

    for status in [409, 429, 503] {
        let seen = Seen::default();
        let mut svc = builder(store.clone())
            .build()
            .unwrap()
            .layer(handler(seen.clone(), status));
        let key = format!("k-released-{status}");
        send(&mut svc, post(Some(&key), "o")).await;
        let again = send(&mut svc, post(Some(&key), "o")).await;
        assert!(!again.replayed(), "{status}");
        assert_eq!(seen.calls(), 2, "{status}: the retry did not run");
        // And the second owner had a higher fence.
        assert_eq!(seen.fences(), vec![Some(1), Some(2)]);
    }

    let seen = Seen::default();
    let counted = seen.clone();
    let marked = tower::service_fn(move |req: Req| {
        let (n, _) = counted.hit(&req);
        async move {
            let mut res: Res = reply(if n == 1 { 400 } else { 201 }, "");
            if n == 1 {
                res.headers_mut().insert(
                    surely::headers::NOT_PROCESSED,
                    "validation".parse().unwrap(),
                );
            }
            Ok::<_, Infallible>(res)
        }
    });
    let mut svc = builder(store).build().unwrap().layer(marked);
    assert_eq!(
        send(&mut svc, post(Some("k-marked"), "o")).await.status,
        400
    );
    assert_eq!(
        send(&mut svc, post(Some("k-marked"), "o")).await.status,
        201
    );
    let third = send(&mut svc, post(Some("k-marked"), "o")).await;
    assert!(third.replayed());
    assert!(!third.headers.contains_key(surely::headers::NOT_PROCESSED));
    assert_eq!(seen.calls(), 2);
}

/// The replay carries status, headers and body, and the replay marker; not `set-cookie` or
/// `date`.
pub(crate) async fn replay_carries_the_response<St: IdempotencyStore + Clone>(store: St) {
    let seen = Seen::default();
    let counted = seen.clone();
    let svc = tower::service_fn(move |req: Req| {
        counted.hit(&req);
        async move {
            let res = http::Response::builder()
                .status(201)
                .header("location", "/orders/o-1")
                .header("x-order", "a")
                .header("x-order", "b")
                .header("set-cookie", "session=secret")
                .header("date", "Sun, 06 Nov 1994 08:49:37 GMT")
                .body(http_body_util::Full::new(bytes::Bytes::from_static(
                    b"{\"id\":\"o-1\"}",
                )))
                .unwrap();
            Ok::<_, Infallible>(res)
        }
    });
    let mut svc = builder(store)
        .retention(Duration::from_secs(3600))
        .build()
        .unwrap()
        .layer(svc);
    let first = send(&mut svc, post(Some("k-replay"), "o")).await;
    assert!(!first.replayed());
    assert!(first.headers.contains_key("set-cookie"));
    let again = send(&mut svc, post(Some("k-replay"), "o")).await;
    assert!(again.replayed());
    assert_eq!(again.status, 201);
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers["location"], "/orders/o-1");
    let orders: Vec<_> = again.headers.get_all("x-order").iter().collect();
    assert_eq!(orders, ["a", "b"]);
    assert!(!again.headers.contains_key("set-cookie"));
    assert!(!again.headers.contains_key("date"));
    assert_eq!(seen.calls(), 1);
}

/// Every scenario above, against one store.
pub(crate) async fn all<St: IdempotencyStore + Clone>(store: St) {
    different_body_is_422(store.clone()).await;
    bad_keys_are_400(store.clone()).await;
    oversized_body_is_refused_before_hashing(store.clone()).await;
    tenants_are_isolated(store.clone()).await;
    what_is_stored(store.clone()).await;
    replay_carries_the_response(store.clone()).await;
    inspect_reads_each_state(store).await;
}

/// `inspect` reads what the store holds for a key, in each state, and nothing for a key it
/// never saw.
pub(crate) async fn inspect_reads_each_state<St: IdempotencyStore>(store: St) {
    use surely::idempotency::IdempotencyKey;
    use surely::server::store::{
        Acquire, Checkpoint, RecordKey, RecordState, RequestDigest, StoredResponse,
    };

    let key = |k: &str| RecordKey::new("", "POST /inspect", IdempotencyKey::new(k).unwrap());
    let lease = Duration::from_secs(30);
    let digest = RequestDigest::of(b"inspected");
    let owner = |acquired: Acquire| match acquired {
        Acquire::Owner(fence) => fence,
        other => panic!("not the owner: {other:?}"),
    };
    assert!(store.inspect(&key("inspect-none")).await.unwrap().is_none());

    // Processing, with a checkpoint.
    let k = key("inspect-p");
    let fence = owner(store.acquire(&k, &digest, lease).await.unwrap());
    let step = Checkpoint::new("charge", "ch-1").unwrap();
    store.checkpoint(&k, fence, &step).await.unwrap();
    let view = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(view.fence, fence);
    assert_eq!(view.digest.as_bytes(), digest.as_bytes());
    assert_eq!(view.checkpoints, vec![step]);
    match view.state {
        RecordState::Processing { lease_left } => {
            assert!(
                lease_left > Duration::ZERO && lease_left <= lease,
                "{lease_left:?}"
            )
        }
        other => panic!("not processing: {other:?}"),
    }

    // Completed.
    let k = key("inspect-c");
    let fence = owner(store.acquire(&k, &digest, lease).await.unwrap());
    let mut headers = http::HeaderMap::new();
    headers.insert("x-order", "o-1".parse().unwrap());
    let answer = StoredResponse::new(StatusCode::CREATED, &headers, "created".into());
    store
        .complete(&k, fence, &answer, Duration::from_secs(3600))
        .await
        .unwrap();
    let view = store.inspect(&k).await.unwrap().unwrap();
    assert_eq!(view.fence, fence);
    match view.state {
        RecordState::Completed { response, expired } => {
            assert!(!expired);
            assert_eq!(response.status(), StatusCode::CREATED);
            assert_eq!(response.headers()["x-order"], "o-1");
            assert_eq!(response.body(), "created");
        }
        other => panic!("not completed: {other:?}"),
    }

    // Released.
    let k = key("inspect-r");
    let fence = owner(store.acquire(&k, &digest, lease).await.unwrap());
    store.release(&k, fence).await.unwrap();
    let view = store.inspect(&k).await.unwrap().unwrap();
    assert!(matches!(view.state, RecordState::Released), "{view:?}");
    assert_eq!(view.fence, fence);

    // Unknown, with its evidence.
    let k = key("inspect-u");
    let fence = owner(store.acquire(&k, &digest, lease).await.unwrap());
    store
        .mark_unknown(&k, fence, "the charge may have gone through")
        .await
        .unwrap();
    match store.inspect(&k).await.unwrap().unwrap().state {
        RecordState::Unknown { evidence } => {
            assert_eq!(evidence, "the charge may have gone through")
        }
        other => panic!("not unknown: {other:?}"),
    }
}
