//! What is stored of a response (`docs::server_states`, "What is stored"): headers that must not
//! be replayed, the size limit, compression, a seal for encryption at rest, a reference with the
//! answer rebuilt, and the archive that sees a record before the sweeper deletes it. Shared by
//! both stores; `wait` advances a paused clock (memory) or waits on the database's.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use surely::classify::BoxError;
use surely::server::idempotency::{IdempotencyLayer, Reference, Seal, Ticket};
use surely::server::store::{
    Acquire, ExpiredRecord, IdempotencyStore, MemoryStore, RecordKey, RequestDigest,
};
use tower::{service_fn, Layer, ServiceExt};

use super::record;
use super::support::chain;

/// ChaCha20-Poly1305, a random nonce before each ciphertext, the record as associated data.
pub(crate) struct AtRest(ChaCha20Poly1305);

impl AtRest {
    pub(crate) fn new(key: [u8; 32]) -> Self {
        AtRest(ChaCha20Poly1305::new(Key::from_slice(&key)))
    }
}

fn aad(record: &RecordKey) -> Vec<u8> {
    format!(
        "{}\0{}\0{}",
        record.tenant(),
        record.operation(),
        record.key().as_str()
    )
    .into_bytes()
}

impl Seal for AtRest {
    fn seal(&self, record: &RecordKey, plain: &[u8]) -> Result<Vec<u8>, BoxError> {
        let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
        let aad = aad(record);
        let sealed = self
            .0
            .encrypt(
                &nonce,
                Payload {
                    msg: plain,
                    aad: &aad,
                },
            )
            .map_err(|_| "sealing failed")?;
        Ok([nonce.as_slice(), &sealed].concat())
    }

    fn open(&self, record: &RecordKey, sealed: &[u8]) -> Result<Vec<u8>, BoxError> {
        if sealed.len() < 12 {
            return Err("sealed body too short".into());
        }
        let (nonce, sealed) = sealed.split_at(12);
        let aad = aad(record);
        Ok(self
            .0
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| "does not open")?)
    }
}

/// The secret every test's handler answers with.
pub(crate) const SECRET: &str = "card 4242-4242-4242-4242 charged";

/// A handler answering 201 with `body`, a session cookie, a token header, and a location.
fn answering(
    body: Bytes,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send
       + 'static {
    service_fn(move |_req: Request<Full<Bytes>>| {
        let body = body.clone();
        async move {
            Ok(Response::builder()
                .status(201)
                .header("set-cookie", "session=abc")
                .header("date", "Tue, 01 Dec 2026 10:00:00 GMT")
                .header("x-session-token", "t-1")
                .header("location", "/payments/p-1")
                .body(Full::new(body))
                .unwrap())
        }
    })
}

fn post(key: &str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"o")))
        .unwrap()
}

async fn body(res: Response<Full<Bytes>>) -> Bytes {
    res.into_body().collect().await.unwrap().to_bytes()
}

/// The stored form of `key`'s record, as a duplicate's acquire finds it.
async fn stored<St: IdempotencyStore>(
    store: &St,
    key: &str,
) -> surely::server::store::StoredResponse {
    match store
        .acquire(
            &record(key),
            &RequestDigest::of(b"o"),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
    {
        Acquire::Completed(stored) => stored,
        other => panic!("{other:?}"),
    }
}

pub(crate) async fn what_is_stored<St: IdempotencyStore + Clone>(store: St) {
    // Headers: set-cookie never, the configured ones never, the rest replayed.
    let layer = IdempotencyLayer::builder(store.clone())
        .never_store_headers([http::HeaderName::from_static("x-session-token")])
        .build()
        .unwrap();
    let svc = layer.layer(answering(Bytes::from_static(b"o-1")));
    let first = svc.clone().oneshot(post("k-headers")).await.unwrap();
    assert_eq!(
        first.headers()["set-cookie"],
        "session=abc",
        "the first answer is whole"
    );
    let again = svc.clone().oneshot(post("k-headers")).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"], "/payments/p-1");
    assert!(!again.headers().contains_key("set-cookie"));
    assert!(
        !again.headers().contains_key("date"),
        "the date is the first answer's own"
    );
    assert!(!again.headers().contains_key("x-session-token"));
    let kept = stored(&store, "k-headers").await;
    assert!(kept.headers().get("set-cookie").is_none());
    assert!(kept.headers().get("x-session-token").is_none());

    // Over the stored-size limit: the first answer is whole, the replay has no body and says so.
    let layer = IdempotencyLayer::builder(store.clone())
        .max_stored_bytes(16)
        .build()
        .unwrap();
    let svc = layer.layer(answering(Bytes::from(vec![b'x'; 100])));
    let first = svc.clone().oneshot(post("k-large")).await.unwrap();
    assert_eq!(body(first).await.len(), 100);
    let again = svc.clone().oneshot(post("k-large")).await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replay-body-omitted"], "true");
    assert_eq!(again.headers()["location"], "/payments/p-1");
    assert!(body(again).await.is_empty());
    assert!(stored(&store, "k-large").await.body().is_empty());

    // Compressed: smaller in the store, the same bytes replayed.
    let big = Bytes::from(SECRET.repeat(300));
    let layer = IdempotencyLayer::builder(store.clone())
        .compress_over(256)
        .build()
        .unwrap();
    let svc = layer.layer(answering(big.clone()));
    assert_eq!(
        body(svc.clone().oneshot(post("k-zip")).await.unwrap()).await,
        big
    );
    let again = svc.clone().oneshot(post("k-zip")).await.unwrap();
    assert_eq!(body(again).await, big);
    let kept = stored(&store, "k-zip").await;
    assert!(
        kept.body().len() * 10 < big.len(),
        "{} bytes stored",
        kept.body().len()
    );
    assert_ne!(kept.flags(), 0);

    // Sealed (and compressed): unreadable at rest, the same bytes replayed.
    let sealing = || {
        IdempotencyLayer::builder(store.clone())
            .compress_over(256)
            .seal(AtRest::new([7; 32]))
            .build()
            .unwrap()
    };
    let svc = sealing().layer(answering(big.clone()));
    assert_eq!(
        body(svc.clone().oneshot(post("k-sealed")).await.unwrap()).await,
        big
    );
    let again = svc.clone().oneshot(post("k-sealed")).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(body(again).await, big);
    let kept = stored(&store, "k-sealed").await;
    let at_rest = String::from_utf8_lossy(kept.body());
    assert!(!at_rest.contains("4242"), "the secret is not in the store");
    // Another key cannot open it: a 500 with its code, never a panic or the sealed bytes.
    let other = IdempotencyLayer::builder(store.clone())
        .compress_over(256)
        .seal(AtRest::new([8; 32]))
        .build()
        .unwrap()
        .layer(answering(big.clone()));
    let res = other.oneshot(post("k-sealed")).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        res.headers()["idempotency-error"],
        "IDEMPOTENCY_REPLAY_FAILED"
    );
    // Nor can a layer without the seal.
    let plain = IdempotencyLayer::new(store.clone()).layer(answering(big.clone()));
    let res = plain.oneshot(post("k-sealed")).await.unwrap();
    assert_eq!(
        res.headers()["idempotency-error"],
        "IDEMPOTENCY_REPLAY_FAILED"
    );

    // A reference: stored without a body, replayed from the resource as it is now.
    let now = Arc::new(Mutex::new("new"));
    let state = now.clone();
    let layer = IdempotencyLayer::builder(store.clone())
        .rebuild(move |_, stored| {
            let state = *state.lock().unwrap();
            async move {
                let resource = stored.resource().unwrap_or_default();
                let code = stored.result_code().unwrap_or_default();
                Response::builder()
                    .status(stored.status())
                    .body(Bytes::from(format!("{resource} {code}: {state}")))
                    .unwrap()
            }
        })
        .build()
        .unwrap();
    let svc = layer.layer(service_fn(|_req: Request<Full<Bytes>>| async {
        let mut res = Response::builder()
            .status(201)
            .body(Full::new(Bytes::from(SECRET)))
            .unwrap();
        res.extensions_mut()
            .insert(Reference::new("payments/p-1", "charged"));
        Ok::<_, Infallible>(res)
    }));
    assert_eq!(
        body(svc.clone().oneshot(post("k-ref")).await.unwrap()).await,
        SECRET
    );
    *now.lock().unwrap() = "refunded";
    let again = svc.clone().oneshot(post("k-ref")).await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(body(again).await, "payments/p-1 charged: refunded");
    let kept = stored(&store, "k-ref").await;
    assert_eq!(kept.resource(), Some("payments/p-1"));
    assert!(kept.body().is_empty());
}

#[tokio::test(start_paused = true)]
async fn memory_what_is_stored() {
    what_is_stored(MemoryStore::new()).await;
}

/// What the archive kept of a record: key, resource, first checkpoint, status.
type Archived = (String, Option<String>, Option<String>, Option<StatusCode>);

/// Archived, then deleted: terminal records past their retention, with their resource and
/// checkpoints; processing and unknown ones are neither. An archive that fails deletes nothing.
pub(crate) async fn the_archive_sees_records_before_the_sweep<St, F, Fut>(
    store: St,
    retention: Duration,
    wait: F,
) where
    St: IdempotencyStore + Clone,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let archived: Arc<Mutex<Vec<ExpiredRecord>>> = Arc::default();
    let fail = Arc::new(Mutex::new(true));
    let (into, failing) = (archived.clone(), fail.clone());
    let layer = IdempotencyLayer::builder(store.clone())
        .retention(retention)
        .rebuild(|_, stored| async move {
            Response::new(Bytes::from(
                stored.resource().unwrap_or_default().to_owned(),
            ))
        })
        .archive(move |batch| {
            let (into, failing) = (into.clone(), *failing.lock().unwrap());
            async move {
                if failing {
                    return Err::<(), BoxError>("the audit store is down".into());
                }
                into.lock().unwrap().extend(batch);
                Ok(())
            }
        })
        .build()
        .unwrap();
    let svc = layer.layer(service_fn(|req: Request<Full<Bytes>>| async move {
        let ticket = req.extensions().get::<Ticket>().unwrap().clone();
        let key = ticket.record_key().key().as_str().to_owned();
        ticket
            .checkpoint("charge", &format!("ch-{key}"))
            .await
            .unwrap();
        let mut res = Response::builder()
            .status(201)
            .body(Full::new(Bytes::new()))
            .unwrap();
        res.extensions_mut()
            .insert(Reference::new(format!("payments/{key}"), "charged"));
        Ok::<_, Infallible>(res)
    }));
    for key in ["k-a", "k-b"] {
        assert_eq!(svc.clone().oneshot(post(key)).await.unwrap().status(), 201);
    }
    // One stays processing, one unknown.
    let digest = RequestDigest::of(b"o");
    let long = retention * 100;
    store
        .acquire(&record("k-processing"), &digest, long)
        .await
        .unwrap();
    let Acquire::Owner(f) = store
        .acquire(&record("k-unknown"), &digest, long)
        .await
        .unwrap()
    else {
        panic!("not the owner");
    };
    store
        .mark_unknown(&record("k-unknown"), f, "asked, no answer")
        .await
        .unwrap();

    wait(retention + retention / 2).await;
    let err = layer.sweep(Duration::ZERO).await.unwrap_err();
    assert!(chain(&err).contains("the audit store is down"), "{err}");
    assert!(
        matches!(
            store.acquire(&record("k-a"), &digest, long).await.unwrap(),
            Acquire::Expired
        ),
        "kept when the archive fails"
    );

    *fail.lock().unwrap() = false;
    assert_eq!(layer.sweep(Duration::ZERO).await.unwrap(), 2);
    let mut seen: Vec<Archived> = archived
        .lock()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.key.key().as_str().to_owned(),
                r.resource.clone(),
                r.checkpoints.first().map(|c| c.value().to_owned()),
                r.status,
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                "k-a".into(),
                Some("payments/k-a".into()),
                Some("ch-k-a".into()),
                Some(StatusCode::CREATED)
            ),
            (
                "k-b".into(),
                Some("payments/k-b".into()),
                Some("ch-k-b".into()),
                Some(StatusCode::CREATED)
            ),
        ]
    );
    // Gone: the key is new again. The processing and unknown records are still there.
    assert!(matches!(
        store.acquire(&record("k-a"), &digest, long).await.unwrap(),
        Acquire::Owner(_)
    ));
    assert!(matches!(
        store
            .acquire(&record("k-processing"), &digest, long)
            .await
            .unwrap(),
        Acquire::InFlight { .. }
    ));
    assert_eq!(store.unknowns(10).await.unwrap().len(), 1);
    assert_eq!(layer.sweep(Duration::ZERO).await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn memory_the_archive_sees_records_before_the_sweep() {
    the_archive_sees_records_before_the_sweep(
        MemoryStore::new(),
        Duration::from_secs(60),
        tokio::time::advance,
    )
    .await;
}

#[test]
fn bad_storage_settings_are_errors() {
    let err = IdempotencyLayer::builder(MemoryStore::new())
        .compress_over(0)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid idempotency compression threshold: must be greater than zero"
    );
}

/// A seal that cannot seal.
struct Broken;

impl Seal for Broken {
    fn seal(&self, _: &RecordKey, _: &[u8]) -> Result<Vec<u8>, BoxError> {
        Err("the key store is down".into())
    }

    fn open(&self, _: &RecordKey, _: &[u8]) -> Result<Vec<u8>, BoxError> {
        Err("the key store is down".into())
    }
}

/// What cannot be stored or read back fails plainly: a seal that fails leaves the answer
/// unstored (the client still gets it; the key stays in flight until its lease); a stored form
/// this server cannot read (bits it does not know, a reference without a rebuild hook) answers
/// `500` with its code, never the stored bytes.
#[tokio::test(start_paused = true)]
async fn what_cannot_be_stored_or_read_back_fails_plainly() {
    use surely::record::{InMemoryRecorder, ServerEventKind};

    let store = MemoryStore::new();
    let events = InMemoryRecorder::new();
    let svc = IdempotencyLayer::builder(store.clone())
        .seal(Broken)
        .recorder(events.clone())
        .build()
        .unwrap()
        .layer(answering(Bytes::from(SECRET)));
    let first = svc.clone().oneshot(post("k-unsealed")).await.unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(body(first).await, SECRET);
    let kinds: Vec<_> = events.server_events().iter().map(|e| e.kind).collect();
    assert!(
        matches!(kinds[..], [ServerEventKind::NotStored { .. }]),
        "{kinds:?}"
    );
    let again = svc.clone().oneshot(post("k-unsealed")).await.unwrap();
    assert_eq!(
        again.status(),
        StatusCode::CONFLICT,
        "not stored: still in flight"
    );

    // Stored with bits this version does not know, and as a reference with no rebuild hook.
    let digest = RequestDigest::of(b"o");
    let lease = Duration::from_secs(30);
    for (key, stored) in [
        (
            "k-future",
            surely::server::store::StoredResponse::new(
                StatusCode::CREATED,
                &http::HeaderMap::new(),
                Bytes::from_static(b"?"),
            )
            .with_flags(0x80),
        ),
        (
            "k-reference",
            surely::server::store::StoredResponse::reference(
                StatusCode::CREATED,
                "payments/p-1",
                "charged",
            ),
        ),
    ] {
        let Acquire::Owner(fence) = store.acquire(&record(key), &digest, lease).await.unwrap()
        else {
            panic!("not the owner");
        };
        store
            .complete(&record(key), fence, &stored, lease)
            .await
            .unwrap();
        let plain = IdempotencyLayer::new(store.clone()).layer(answering(Bytes::new()));
        let res = plain.oneshot(post(key)).await.unwrap();
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR, "{key}");
        assert_eq!(
            res.headers()["idempotency-error"],
            "IDEMPOTENCY_REPLAY_FAILED",
            "{key}"
        );
    }
}

/// `StoredResponse::buffer` keeps the response as it is sent (status, headers but those never
/// stored, body) and gives it back; a body that fails gives the body's own error.
#[tokio::test]
async fn a_response_is_buffered_as_sent_and_a_failing_body_gives_its_error() {
    use surely::server::store::StoredResponse;

    let res = Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .header("location", "/orders/o-1")
        .header("date", "Sun, 06 Nov 1994 08:49:37 GMT")
        .body(Full::new(Bytes::from_static(b"{\"id\":\"o-1\"}")))
        .unwrap();
    let (stored, res) = StoredResponse::buffer(res).await.unwrap();
    assert_eq!(stored.status(), StatusCode::CREATED);
    assert_eq!(stored.headers().len(), 2, "date is never stored");
    assert_eq!(stored.headers()["content-type"], "application/json");
    assert_eq!(stored.body(), "{\"id\":\"o-1\"}");
    assert_eq!(res.headers().len(), 3, "the response goes out as it was");
    assert_eq!(body(res).await, "{\"id\":\"o-1\"}");

    let frames: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> = vec![
        Ok(http_body::Frame::data(Bytes::from_static(b"{\"id\""))),
        Err(std::io::Error::other("connection to the upstream lost")),
    ];
    let failing = Response::new(http_body_util::StreamBody::new(tokio_stream::iter(frames)));
    let err = StoredResponse::buffer(failing).await.unwrap_err();
    assert_eq!(err.to_string(), "connection to the upstream lost");
}
