//! An owner that dies after its external call's checkpoint is recovered from facts, never run
//! again blindly (`docs::server_states`). Over real hyper on 127.0.0.1: instance A takes the
//! payment, records the channel request id, and its runtime is shut down (after the charge, or
//! between the checkpoint and the charge); instance B, on another runtime over the same store,
//! gets the client's retry after the lease. A fake payment channel counts the charges.
//!
//! The memory store runs on paused clocks (each runtime's own, moved past the lease); the
//! PostgreSQL store on the database's clock, with a real one-second lease.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::classify::{AttemptClass, HttpRequestClassifier, OutcomeTally};
use surely::ledger::{MemoryLedger, Reconciler};
use surely::pushback::Pushback;
use surely::record::{InMemoryRecorder, RecoveryVerdict, ServerEventKind};
use surely::retry::{Query, Resolution};
use surely::server::idempotency::{IdempotencyLayer, Recovery, Takeover, Ticket};
use surely::server::store::{
    Acquire, Checkpoint, Fence, IdempotencyStore, MemoryStore, RequestDigest, StoredResponse,
};
use surely::{Outcome, Semantics};
use tokio::sync::Notify;
use tower::{service_fn, Layer, ServiceExt};

use super::record;
use super::support::chain;
use crate::support::serve::serve;

/// A payment channel that charges every request it gets (it is not idempotent), and answers
/// whether a channel request id was charged.
#[derive(Clone, Default)]
pub(crate) struct Channel(Arc<Mutex<HashMap<String, u32>>>);

impl Channel {
    fn charge(&self, id: &str) {
        *self.0.lock().unwrap().entry(id.to_owned()).or_default() += 1;
    }

    fn charged(&self, id: &str) -> bool {
        self.0.lock().unwrap().contains_key(id)
    }

    fn charges(&self) -> u32 {
        self.0.lock().unwrap().values().sum()
    }
}

/// Where instance A's process dies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Death {
    /// After the channel charged: the answer is lost.
    AfterCharge,
    /// After the checkpoint, before the channel was called.
    BeforeCharge,
}

/// The payment handler: reuses the channel request id an earlier owner recorded, records it
/// before calling the channel, and (on instance A) dies at `death`.
fn payments(
    channel: Channel,
    death: Option<(Death, Arc<Notify>)>,
) -> impl tower::Service<
    Request<Full<Bytes>>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future: Send,
> + Clone
       + Send
       + 'static {
    service_fn(move |req: Request<Full<Bytes>>| {
        let (channel, death) = (channel.clone(), death.clone());
        async move {
            let ticket = req.extensions().get::<Ticket>().unwrap().clone();
            let id = match ticket.recorded("charge") {
                Some(id) => id.to_owned(),
                None => format!("ch-{}", ticket.record_key().key().as_str()),
            };
            ticket.checkpoint("charge", &id).await.unwrap();
            if let Some((Death::BeforeCharge, dead)) = &death {
                dead.notify_one();
                std::future::pending::<()>().await;
            }
            channel.charge(&id);
            if let Some((Death::AfterCharge, dead)) = &death {
                dead.notify_one();
                std::future::pending::<()>().await;
            }
            Ok(Response::builder()
                .status(201)
                .body(Full::new(Bytes::from(format!("paid {id}"))))
                .unwrap())
        }
    })
}

/// The hook: asks the channel about the recorded request.
async fn ask_channel(channel: Channel, t: Takeover) -> Recovery {
    match t.checkpoint("charge") {
        Some(id) if channel.charged(id) => {
            let body = Bytes::from(format!("paid {id}"));
            Recovery::Completed(Response::builder().status(201).body(body).unwrap())
        }
        // Recorded, not charged: run it again, with the same channel request id.
        _ => Recovery::Resume,
    }
}

fn layer<St: IdempotencyStore>(
    store: St,
    lease: Duration,
    hook: Option<Channel>,
    events: &InMemoryRecorder,
) -> IdempotencyLayer<St> {
    let builder = IdempotencyLayer::builder(store)
        .lease(lease)
        .recorder(events.clone());
    match hook {
        Some(channel) => builder.recover(move |t| ask_channel(channel.clone(), t)),
        None => builder,
    }
    .build()
    .unwrap()
}

async fn serve_layer<St: IdempotencyStore + Clone>(
    layer: &IdempotencyLayer<St>,
    handler: impl tower::Service<
            Request<Full<Bytes>>,
            Response = Response<Full<Bytes>>,
            Error = Infallible,
            Future: Send,
        > + Clone
        + Send
        + 'static,
) -> SocketAddr {
    let idem = layer.layer(handler);
    serve(service_fn(move |req: Request<Incoming>| {
        idem.clone().oneshot(req)
    }))
    .await
}

fn pay(addr: SocketAddr) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}/payments"))
        .header("idempotency-key", "pay-1")
        .body(Full::new(Bytes::from_static(b"42 EUR")))
        .unwrap()
}

/// Status, replayed or not, body.
async fn send(addr: SocketAddr) -> (StatusCode, bool, Bytes, http::HeaderMap) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let res = client.request(pay(addr)).await.unwrap();
    let (head, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let replayed = head.headers.contains_key("idempotent-replayed");
    (head.status, replayed, body, head.headers)
}

fn runtime(paused: bool) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(paused)
        .build()
        .unwrap()
}

/// The story: A dies at `death`; after the lease, the client's retry reaches B, whose layer has
/// the hook or not. `store` makes each instance's store (a pool belongs to its runtime).
pub(crate) fn an_owner_dies_after_its_checkpoint<St>(
    store: impl Fn() -> St,
    lease: Duration,
    paused: bool,
    death: Death,
    with_hook: bool,
) where
    St: IdempotencyStore + Clone,
{
    let channel = Channel::default();

    // Instance A: the first request reaches the handler, which dies where it is told.
    let a = runtime(paused);
    a.block_on(async {
        let dead = Arc::new(Notify::new());
        let layer = layer(store(), lease, None, &InMemoryRecorder::new());
        let addr = serve_layer(
            &layer,
            payments(channel.clone(), Some((death, dead.clone()))),
        )
        .await;
        tokio::spawn(async move {
            let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
            let _ = client.request(pay(addr)).await;
        });
        tokio::time::timeout(Duration::from_secs(10), dead.notified())
            .await
            .expect("instance A's handler never reached its death");
    });
    // The process dies: its server, its connection and its handler, with nothing released.
    drop(a);
    let charged_by_a = u32::from(death == Death::AfterCharge);
    assert_eq!(channel.charges(), charged_by_a);

    // Instance B, over the same store: the client's retry after the lease.
    runtime(paused).block_on(async {
        let events = InMemoryRecorder::new();
        let hook = with_hook.then(|| channel.clone());
        let layer = layer(store(), lease, hook, &events);
        let addr = serve_layer(&layer, payments(channel.clone(), None)).await;
        let (status, _, _, _) = send(addr).await;
        assert_eq!(
            status,
            StatusCode::CONFLICT,
            "A's lease still holds the key"
        );
        if paused {
            tokio::time::advance(lease + Duration::from_secs(1)).await;
        } else {
            tokio::time::sleep(lease + Duration::from_millis(300)).await;
        }
        let kinds = |events: &InMemoryRecorder| -> Vec<ServerEventKind> {
            events.server_events().iter().map(|e| e.kind).collect()
        };

        let (status, replayed, body, headers) = send(addr).await;
        let recovered = |verdict| ServerEventKind::Recovered {
            fence: Fence::new(2),
            verdict,
        };
        match (with_hook, death) {
            (true, Death::AfterCharge) => {
                // The hook found the charge: the answer is rebuilt, stored, and replayed.
                assert_eq!((status, replayed), (StatusCode::CREATED, true));
                assert_eq!(body, "paid ch-pay-1");
                assert!(kinds(&events).contains(&recovered(RecoveryVerdict::Completed)));
            }
            (true, Death::BeforeCharge) => {
                // Recorded but never charged: the handler resumes with the same request id.
                assert_eq!((status, replayed), (StatusCode::CREATED, false));
                assert_eq!(body, "paid ch-pay-1");
                assert!(kinds(&events).contains(&recovered(RecoveryVerdict::Resumed)));
            }
            (false, _) => {
                // No hook and a checkpoint: never run again. The client reads "unknown".
                assert_eq!(status, StatusCode::ACCEPTED);
                assert_eq!(headers["idempotency-error"], "IDEMPOTENCY_OUTCOME_UNKNOWN");
                let c = HttpRequestClassifier::new(Semantics::Keyed, false)
                    .classify_status(status, &headers);
                assert_eq!(c.class(), AttemptClass::MaybeCommitted);
                assert_eq!(c.pushback(), Some(Pushback::Stop));
                assert!(!c.is_retryable(Semantics::Keyed));
                let mut tally = OutcomeTally::new(Semantics::Keyed);
                tally.observe(c.class());
                assert_eq!(tally.outcome(), Some(Outcome::Unknown));
                assert!(kinds(&events).contains(&recovered(RecoveryVerdict::Unknown)));

                // Every duplicate gets the same answer, and the handler does not run.
                let (again, _, _, _) = send(addr).await;
                assert_eq!(again, StatusCode::ACCEPTED);
                assert!(kinds(&events).contains(&ServerEventKind::UnknownAnswered));
                let unknowns = layer.store().unknowns(10).await.unwrap();
                assert_eq!(unknowns.len(), 1, "{unknowns:?}");
                assert_eq!(unknowns[0].checkpoint("charge"), Some("ch-pay-1"));
                assert_eq!(unknowns[0].fence, Fence::new(2));
                assert!(unknowns[0].evidence.contains("charge"), "{unknowns:?}");

                // The channel, asked through the Resolve hook.
                let resolver = |q: Query| {
                    let channel = channel.clone();
                    async move {
                        let id = format!("ch-{}", q.key.unwrap());
                        if channel.charged(&id) {
                            let body = Bytes::from(format!("paid {id}"));
                            Resolution::Succeeded(
                                Response::builder().status(201).body(body).unwrap(),
                            )
                        } else {
                            Resolution::Failed
                        }
                    }
                };
                // The ledger's reconciler works the server's unknowns down with its resolver.
                let reconciler = Reconciler::builder(MemoryLedger::new(), resolver)
                    .build()
                    .unwrap();
                let round = reconciler.settle_server(&layer).await.unwrap();
                match death {
                    Death::AfterCharge => {
                        assert_eq!((round.seen, round.completed), (1, 1), "{round}");
                        let (status, replayed, body, _) = send(addr).await;
                        assert_eq!((status, replayed), (StatusCode::CREATED, true));
                        assert_eq!(body, "paid ch-pay-1");
                    }
                    Death::BeforeCharge => {
                        // Not charged: released, and the client's next request runs it, with
                        // a higher fence.
                        assert_eq!((round.seen, round.released), (1, 1), "{round}");
                        let (status, replayed, body, _) = send(addr).await;
                        assert_eq!((status, replayed), (StatusCode::CREATED, false));
                        assert_eq!(body, "paid ch-pay-1");
                    }
                }
                assert!(layer.store().unknowns(10).await.unwrap().is_empty());
                // Settled once: a second round finds nothing.
                let again = reconciler.settle_server(&layer).await.unwrap();
                assert_eq!(again.seen, 0);
            }
        }
        // A duplicate now replays, and the channel was charged once in all.
        let (status, replayed, body, _) = send(addr).await;
        assert_eq!((status, replayed), (StatusCode::CREATED, true));
        assert_eq!(body, "paid ch-pay-1");
        assert_eq!(channel.charges(), 1, "one charge per key");
    });
}

/// The story on one memory store shared by both instances, on paused clocks.
fn on_memory(death: Death, with_hook: bool) {
    let store = MemoryStore::new();
    an_owner_dies_after_its_checkpoint(
        || store.clone(),
        Duration::from_secs(30),
        true,
        death,
        with_hook,
    );
}

#[test]
fn memory_the_hook_finds_the_charge_and_the_answer_is_replayed() {
    on_memory(Death::AfterCharge, true);
}

#[test]
fn memory_the_hook_resumes_a_step_that_never_reached_the_channel() {
    on_memory(Death::BeforeCharge, true);
}

#[test]
fn memory_without_a_hook_the_record_is_unknown_then_settled_and_replayed() {
    on_memory(Death::AfterCharge, false);
}

#[test]
fn memory_without_a_hook_an_unknown_found_not_charged_is_released_and_runs() {
    on_memory(Death::BeforeCharge, false);
}

/// The store's side: checkpoints are fenced, kept across a takeover, dropped on release, and
/// bounded; an unknown record answers `Unknown`, is listed, never swept, and settled only with
/// its fence. `wait` moves the store's clock past `lease`.
pub(crate) async fn checkpoints_and_unknowns_in_the_store<St, F, Fut>(
    store: St,
    lease: Duration,
    wait: F,
) where
    St: IdempotencyStore,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let digest = RequestDigest::of(b"42 EUR");
    let key = record("k-steps");
    let step = |n: &str, v: &str| Checkpoint::new(n, v).unwrap();
    let Acquire::Owner(first) = store.acquire(&key, &digest, lease).await.unwrap() else {
        panic!("not the owner");
    };
    store
        .checkpoint(&key, first, &step("charge", "ch-1"))
        .await
        .unwrap();
    store
        .checkpoint(&key, first, &step("reserve", "r-9"))
        .await
        .unwrap();

    wait(lease + lease / 2).await;
    let Acquire::TakenOver {
        fence, checkpoints, ..
    } = store.acquire(&key, &digest, lease).await.unwrap()
    else {
        panic!("not taken over");
    };
    assert_eq!(fence, Fence::new(2));
    assert_eq!(
        checkpoints,
        [step("charge", "ch-1"), step("reserve", "r-9")]
    );
    // The dead owner's late step is refused; the new owner's is kept.
    let late = store.checkpoint(&key, first, &step("charge", "ch-2")).await;
    assert!(late.unwrap_err().is_stale());
    for n in 2..16 {
        store
            .checkpoint(&key, fence, &step("step", &n.to_string()))
            .await
            .unwrap();
    }
    let full = store
        .checkpoint(&key, fence, &step("one", "too many"))
        .await;
    let full = full.unwrap_err();
    assert!(full.is_rejected(), "{full}");
    assert!(chain(&full).contains("at most 16 checkpoints"), "{full}");

    // Unknown: fenced, answered, listed, kept by the sweeper.
    let stale = store.mark_unknown(&key, first, "late").await;
    assert!(stale.unwrap_err().is_stale());
    store
        .mark_unknown(&key, fence, "channel did not answer")
        .await
        .unwrap();
    match store.acquire(&key, &digest, lease).await.unwrap() {
        Acquire::Unknown { evidence } => assert_eq!(evidence, "channel did not answer"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        store
            .acquire(&key, &RequestDigest::of(b"other"), lease)
            .await
            .unwrap(),
        Acquire::Mismatch
    ));
    assert!(store
        .checkpoint(&key, fence, &step("after", "x"))
        .await
        .unwrap_err()
        .is_stale());
    wait(lease * 2).await;
    store.sweep(Duration::ZERO).await.unwrap();
    let unknowns = store.unknowns(10).await.unwrap();
    assert_eq!(unknowns.len(), 1);
    assert_eq!(unknowns[0].key, key);
    assert_eq!(unknowns[0].fence, fence);
    assert_eq!(unknowns[0].checkpoints.len(), 16);
    assert_eq!(unknowns[0].checkpoint("step"), Some("15"));
    assert!(unknowns[0].age >= lease, "{:?}", unknowns[0].age);
    // Settled with the wrong fence: refused; with its own: completed and replayed.
    let paid = StoredResponse::new(StatusCode::CREATED, &http::HeaderMap::new(), "paid".into());
    assert!(store
        .complete(&key, first, &paid, lease * 100)
        .await
        .unwrap_err()
        .is_stale());
    store
        .complete(&key, fence, &paid, lease * 100)
        .await
        .unwrap();
    assert!(store.unknowns(10).await.unwrap().is_empty());
    match store.acquire(&key, &digest, lease).await.unwrap() {
        Acquire::Completed(stored) => assert_eq!(stored.body(), "paid"),
        other => panic!("{other:?}"),
    }

    // A release drops the steps: the next owner starts clean, and a later takeover has none.
    let key = record("k-released-steps");
    let Acquire::Owner(f) = store.acquire(&key, &digest, lease).await.unwrap() else {
        panic!("not the owner");
    };
    store
        .checkpoint(&key, f, &step("charge", "ch-3"))
        .await
        .unwrap();
    store
        .mark_unknown(&key, f, "asked, no answer")
        .await
        .unwrap();
    // Settled "it did not happen": released.
    store.release(&key, f).await.unwrap();
    let Acquire::Owner(f) = store.acquire(&key, &digest, lease).await.unwrap() else {
        panic!("not the owner after a release");
    };
    assert_eq!(f, Fence::new(2));
    wait(lease + lease / 2).await;
    match store.acquire(&key, &digest, lease).await.unwrap() {
        Acquire::TakenOver { checkpoints, .. } => assert!(checkpoints.is_empty()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn memory_checkpoints_and_unknowns_in_the_store() {
    checkpoints_and_unknowns_in_the_store(MemoryStore::new(), Duration::from_secs(10), |d| {
        tokio::time::advance(d)
    })
    .await;
}

/// A checkpoint the client controls (a huge, binary or control-character value) is refused with
/// a clear error before any store sees it, and the handler answers a 4xx: never a 5xx.
#[tokio::test(start_paused = true)]
async fn hostile_checkpoints_are_refused_with_a_clear_error() {
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(service_fn(|req: Request<Full<Bytes>>| async move {
        let ticket = req.extensions().get::<Ticket>().unwrap().clone();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let value = String::from_utf8_lossy(&body);
        Ok::<_, Infallible>(match ticket.checkpoint("reference", &value).await {
            Ok(()) => Response::new(Full::new(Bytes::from("recorded"))),
            // What was wrong with the value is the error's source.
            Err(e) if e.is_rejected() => Response::builder()
                .status(422)
                .body(Full::new(Bytes::from(chain(&e))))
                .unwrap(),
            Err(e) => Response::builder()
                .status(503)
                .body(Full::new(Bytes::from(e.to_string())))
                .unwrap(),
        })
    }));
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("huge", vec![b'x'; 10_000], "over the limit of 512"),
        ("binary", vec![0xff, 0x00, 0x9f], "control character"),
        ("bell", b"ref\x07".to_vec(), "control character at byte 3"),
        (
            "newline",
            b"ref\nSet-Cookie: a=b".to_vec(),
            "control character",
        ),
    ];
    for (key, body, why) in cases {
        let req = Request::post("/payments")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), 422, "{key}");
        let text = res.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&text);
        assert!(text.contains(why), "{key}: {text}");
    }
    // Names are checked too, and a fine one passes.
    assert!(Checkpoint::new("a b", "x").is_err());
    assert!(Checkpoint::new("x".repeat(65), "x").is_err());
    assert!(Checkpoint::new("charge:eu-1", "ch_1 \u{e9}").is_ok());
}

/// A handler dropped after its checkpoint (its caller went away, with `cancel_with_caller`)
/// does not release its key: the next request waits for the lease, then recovery decides.
#[tokio::test(start_paused = true)]
async fn a_dropped_handler_after_a_checkpoint_keeps_its_key_for_recovery() {
    let events = InMemoryRecorder::new();
    let layer = IdempotencyLayer::builder(MemoryStore::new())
        .lease(Duration::from_secs(10))
        .cancel_with_caller()
        .recorder(events.clone())
        .build()
        .unwrap();
    let reached = Arc::new(Notify::new());
    let signal = reached.clone();
    let svc = layer.layer(service_fn(move |req: Request<Full<Bytes>>| {
        let signal = signal.clone();
        async move {
            let ticket = req.extensions().get::<Ticket>().unwrap().clone();
            ticket.checkpoint("charge", "ch-1").await.unwrap();
            signal.notify_one();
            std::future::pending::<()>().await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    }));
    let post = || {
        Request::post("/payments")
            .header("idempotency-key", "k-dropped")
            .body(Full::new(Bytes::from_static(b"1")))
            .unwrap()
    };
    let caller = tokio::spawn(svc.clone().oneshot(post()));
    reached.notified().await;
    caller.abort();
    let _ = caller.await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let res = svc.clone().oneshot(post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT, "not released");
    tokio::time::advance(Duration::from_secs(11)).await;
    let res = svc.clone().oneshot(post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::ACCEPTED, "unknown, not run again");
    let kinds: Vec<_> = events
        .server_events()
        .iter()
        .map(|e| e.kind.as_str())
        .collect();
    assert_eq!(kinds, ["in_flight", "lease_takeover", "recovered"]);
}
