//! Recovery without a request: records left `PROCESSING` by an owner that died with its client
//! are taken over by a round of `recover_abandoned`, fenced, and decided by the abandoned-record
//! hook (or the rule without one), never by running the handler again. Shared by the three
//! stores: `wait` advances a paused clock (memory) or waits in real time on the store's clock
//! (PostgreSQL, Redis), and `lease` is an hour on a paused clock, a few hundred milliseconds on
//! a real one.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use surely::record::{AbandonedVerdict, InMemoryRecorder, ServerEventKind};
use surely::server::idempotency::{AbandonedRecovery, AbandonedRound, IdempotencyLayer};
use surely::server::store::{
    AbandonedRecord, Acquire, Checkpoint, Fence, IdempotencyStore, MemoryStore, RecordKey,
    RecordState, RequestDigest, StoredResponse,
};
use tower::Layer;

use super::record;
use super::support::{handler, post, send, Seen};

/// What an owner that dies with its client leaves: the record acquired (and checkpointed
/// with `steps`), never completed nor released, and no request with the key to come.
async fn abandon<St: IdempotencyStore>(
    store: &St,
    key: &str,
    lease: Duration,
    steps: &[(&str, &str)],
) -> RecordKey {
    let record = record(key);
    let Acquire::Owner(fence) = store
        .acquire(&record, &RequestDigest::of(b"o-1"), lease)
        .await
        .unwrap()
    else {
        panic!("{key}: not the owner");
    };
    for (name, value) in steps {
        let step = Checkpoint::new(*name, *value).unwrap();
        store.checkpoint(&record, fence, &step).await.unwrap();
    }
    record
}

async fn state<St: IdempotencyStore>(store: &St, key: &RecordKey) -> (RecordState, u64) {
    let view = store
        .inspect(key)
        .await
        .unwrap()
        .expect("the record is there");
    (view.state, view.fence.get())
}

fn round(
    seen: usize,
    completed: usize,
    failed: usize,
    unknown: usize,
    released: usize,
    left: usize,
) -> AbandonedRound {
    let mut r = AbandonedRound::default();
    (r.seen, r.completed, r.failed, r.unknown, r.released) =
        (seen, completed, failed, unknown, released);
    r.left = left;
    r
}

/// Without a hook: a record without a checkpoint is released (the next request runs it), one
/// with a checkpoint becomes `UNKNOWN`, its evidence naming the step; each reported once.
pub(crate) async fn without_a_hook<St, F, Fut>(store: St, lease: Duration, wait: F)
where
    St: IdempotencyStore + Clone,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let events = InMemoryRecorder::new();
    let layer = IdempotencyLayer::builder(store.clone())
        .lease(lease)
        .recorder(events.clone())
        .build()
        .unwrap();
    let plain = abandon(&store, "k-plain", lease, &[]).await;
    let charged = abandon(&store, "k-charged", lease, &[("charge", "ch-1")]).await;

    wait(lease + lease / 2).await;
    let done = layer.recover_abandoned(100).await.unwrap();
    assert_eq!(done, round(2, 0, 0, 1, 1, 0), "{done}");
    assert!(matches!(
        state(&store, &plain).await,
        (RecordState::Released, 2)
    ));
    match state(&store, &charged).await {
        (RecordState::Unknown { evidence }, 2) => {
            assert!(evidence.contains("charge=\"ch-1\""), "{evidence}");
        }
        other => panic!("not unknown: {other:?}"),
    }
    let mut seen: Vec<(String, u64, AbandonedVerdict)> = events
        .server_events()
        .iter()
        .filter_map(|e| match e.kind {
            ServerEventKind::Abandoned { fence, verdict } => {
                Some((e.key().unwrap().to_owned(), fence.get(), verdict))
            }
            _ => None,
        })
        .collect();
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        seen,
        [
            ("k-charged".to_owned(), 2, AbandonedVerdict::Unknown),
            ("k-plain".to_owned(), 2, AbandonedVerdict::Released),
        ]
    );

    // The released key runs for the next request (fence 3); the unknown one does not run.
    let calls = Seen::default();
    let mut svc = layer.layer(handler(calls.clone(), 201));
    let again = send(&mut svc, post(Some("k-plain"), "o-1")).await;
    assert_eq!(again.status, 201);
    assert_eq!(calls.fences(), [Some(3)]);
    let unknown = send(&mut svc, post(Some("k-charged"), "o-1")).await;
    assert_eq!(unknown.status, 202);
    assert_eq!(calls.calls(), 1);

    // Nothing left to take.
    assert_eq!(layer.recover_abandoned(100).await.unwrap().seen, 0);
}

/// With a hook, each of its four answers lands: completed and failed answers are stored and
/// replayed to the next request with the key, unknown waits to be settled, released runs.
pub(crate) async fn each_verdict_lands<St, F, Fut>(store: St, lease: Duration, wait: F)
where
    St: IdempotencyStore + Clone,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let asked: Arc<Mutex<Vec<AbandonedRecord>>> = Arc::default();
    let log = asked.clone();
    let layer = IdempotencyLayer::builder(store.clone())
        .lease(lease)
        .recover_abandoned(move |r: AbandonedRecord| {
            log.lock().unwrap().push(r.clone());
            async move {
                let charge = r.checkpoint("charge").unwrap_or("none").to_owned();
                match r.key.key().as_str() {
                    "k-done" => AbandonedRecovery::Completed(
                        http::Response::builder()
                            .status(201)
                            .body(Bytes::from(format!("paid by {charge}")))
                            .unwrap(),
                    ),
                    "k-declined" => AbandonedRecovery::Failed(
                        http::Response::builder()
                            .status(402)
                            .body(Bytes::from("declined"))
                            .unwrap(),
                    ),
                    "k-unsure" => AbandonedRecovery::Unknown("the channel did not say".into()),
                    _ => AbandonedRecovery::Released,
                }
            }
        })
        .build()
        .unwrap();
    for key in ["k-done", "k-declined", "k-unsure", "k-never"] {
        abandon(&store, key, lease, &[("charge", &format!("ch-{key}"))]).await;
    }
    wait(lease + lease / 2).await;
    let done = layer.recover_abandoned(100).await.unwrap();
    assert_eq!(done, round(4, 1, 1, 1, 1, 0), "{done}");

    // The hook was given each record's facts: the round's fence, the digest, the steps.
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 4);
    for r in &asked {
        assert_eq!(r.fence, Fence::new(2));
        assert_eq!(r.digest, RequestDigest::of(b"o-1"));
        assert_eq!(
            r.checkpoint("charge"),
            Some(format!("ch-{}", r.key.key().as_str()).as_str())
        );
        assert!(r.overdue >= lease / 2, "{r:?}");
        // One millisecond for a clock read as a fraction of seconds (PostgreSQL's).
        assert!(
            r.age + Duration::from_millis(1) >= r.overdue + lease,
            "{r:?}"
        );
    }

    let calls = Seen::default();
    let mut svc = layer.layer(handler(calls.clone(), 201));
    let paid = send(&mut svc, post(Some("k-done"), "o-1")).await;
    assert_eq!(paid.status, 201);
    assert!(paid.replayed());
    assert_eq!(paid.body, "paid by ch-k-done");
    let declined = send(&mut svc, post(Some("k-declined"), "o-1")).await;
    assert_eq!(declined.status, 402);
    assert!(declined.replayed());
    let unsure = send(&mut svc, post(Some("k-unsure"), "o-1")).await;
    assert_eq!(unsure.status, 202);
    assert_eq!(unsure.code(), Some("IDEMPOTENCY_OUTCOME_UNKNOWN"));
    assert_eq!(calls.calls(), 0, "the handler never ran for them");
    let never = send(&mut svc, post(Some("k-never"), "o-1")).await;
    assert_eq!(never.status, 201);
    assert_eq!(calls.fences(), [Some(3)]);
}

/// A hook that panics, and one that does not answer within its timeout, leave the record as
/// it was (`PROCESSING` under the round's fence); the next round, once that lease passed,
/// takes it again and recovers it.
pub(crate) async fn a_failing_hook_leaves_the_record<St, F, Fut>(
    store: St,
    lease: Duration,
    wait: F,
) where
    St: IdempotencyStore + Clone,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let healthy = Arc::new(AtomicBool::new(false));
    let well = healthy.clone();
    let events = InMemoryRecorder::new();
    let layer = IdempotencyLayer::builder(store.clone())
        .lease(lease)
        .abandoned_timeout(lease / 4)
        .recorder(events.clone())
        .recover_abandoned(move |r: AbandonedRecord| {
            let well = well.load(Ordering::SeqCst);
            async move {
                if !well {
                    if r.key.key().as_str() == "k-panics" {
                        panic!("the hook's bug");
                    }
                    // Far longer than the hook's timeout.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                AbandonedRecovery::Completed(http::Response::new(Bytes::from("done")))
            }
        })
        .build()
        .unwrap();
    let panics = abandon(&store, "k-panics", lease, &[]).await;
    let hangs = abandon(&store, "k-hangs", lease, &[]).await;
    wait(lease + lease / 2).await;

    let done = layer.recover_abandoned(100).await.unwrap();
    assert_eq!(done, round(2, 0, 0, 0, 0, 2), "{done}");
    for key in [&panics, &hangs] {
        let (state, fence) = state(&store, key).await;
        assert!(matches!(state, RecordState::Processing { .. }), "{state:?}");
        assert_eq!(fence, 2, "under the round's fence");
    }
    let mut verdicts: Vec<AbandonedVerdict> = events
        .server_events()
        .iter()
        .filter_map(|e| match e.kind {
            ServerEventKind::Abandoned { verdict, .. } => Some(verdict),
            _ => None,
        })
        .collect();
    verdicts.sort_by_key(|v| v.as_str());
    assert_eq!(
        verdicts,
        [
            AbandonedVerdict::HookPanicked,
            AbandonedVerdict::HookTimedOut
        ]
    );

    // The hook is mended; the round's lease has not passed: nothing to take yet.
    healthy.store(true, Ordering::SeqCst);
    assert_eq!(layer.recover_abandoned(100).await.unwrap().seen, 0);
    wait(lease + lease / 2).await;
    let done = layer.recover_abandoned(100).await.unwrap();
    assert_eq!(done, round(2, 2, 0, 0, 0, 0), "{done}");
    for key in [&panics, &hangs] {
        let (state, fence) = state(&store, key).await;
        assert!(matches!(state, RecordState::Completed { .. }), "{state:?}");
        assert_eq!(fence, 3);
    }
}

/// Records whose lease has not passed, completed records and unknown ones are left alone.
pub(crate) async fn only_abandoned_records_are_taken<St, F, Fut>(
    store: St,
    lease: Duration,
    wait: F,
) where
    St: IdempotencyStore + Clone,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let layer = IdempotencyLayer::builder(store.clone())
        .lease(lease)
        .build()
        .unwrap();
    let digest = RequestDigest::of(b"o-1");
    let completed = abandon(&store, "k-completed", lease, &[]).await;
    let ok = StoredResponse::new(StatusCode::OK, &http::HeaderMap::new(), "ok".into());
    store
        .complete(&completed, Fence::new(1), &ok, lease * 100)
        .await
        .unwrap();
    let unknown = abandon(&store, "k-unknown", lease, &[]).await;
    store
        .mark_unknown(&unknown, Fence::new(1), "asked nobody")
        .await
        .unwrap();
    wait(lease / 2).await;
    // Acquired later, with a lease that outlives the wait below.
    let live = record("k-live");
    store.acquire(&live, &digest, lease * 4).await.unwrap();
    wait(lease + lease / 4).await;

    assert_eq!(
        layer.recover_abandoned(100).await.unwrap(),
        round(0, 0, 0, 0, 0, 0)
    );
    assert!(store
        .take_abandoned(Duration::ZERO, lease, 100)
        .await
        .unwrap()
        .is_empty());
    assert!(matches!(
        state(&store, &completed).await,
        (RecordState::Completed { .. }, 1)
    ));
    assert!(matches!(
        state(&store, &unknown).await,
        (RecordState::Unknown { .. }, 1)
    ));
    assert!(matches!(
        state(&store, &live).await,
        (RecordState::Processing { .. }, 1)
    ));
    // A limit of zero takes nothing, and the oldest lease goes first.
    let older = abandon(&store, "k-older", lease, &[]).await;
    wait(lease / 4).await;
    let newer = abandon(&store, "k-newer", lease, &[]).await;
    wait(lease + lease / 4).await;
    assert!(store
        .take_abandoned(Duration::ZERO, lease, 0)
        .await
        .unwrap()
        .is_empty());
    let first = store
        .take_abandoned(Duration::ZERO, lease, 1)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].key, older);
    let second = store
        .take_abandoned(Duration::ZERO, lease, 1)
        .await
        .unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].key, newer);
}

/// With a grace, a round leaves a record whose lease passed alone until the grace has passed
/// too: a client that retries in that time takes it over with its request.
pub(crate) async fn a_grace_leaves_the_client_time_to_come_back<St, F, Fut>(
    store: St,
    lease: Duration,
    wait: F,
) where
    St: IdempotencyStore + Clone,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let layer = IdempotencyLayer::builder(store.clone())
        .lease(lease)
        .abandoned_grace(lease * 2)
        .build()
        .unwrap();
    let key = abandon(&store, "k-grace", lease, &[]).await;
    wait(lease + lease / 2).await;
    // The lease passed, the grace did not: a request could take it over, a round does not.
    assert_eq!(
        layer.recover_abandoned(100).await.unwrap(),
        round(0, 0, 0, 0, 0, 0)
    );
    assert!(matches!(
        state(&store, &key).await,
        (RecordState::Processing { .. }, 1)
    ));
    wait(lease * 2).await;
    assert_eq!(
        layer.recover_abandoned(100).await.unwrap(),
        round(1, 0, 0, 0, 1, 0)
    );
}

/// Rounds on four layers over one store (four instances), at once, in small batches: every
/// abandoned record is taken once, by one round, with fence 2, and decided once.
pub(crate) async fn concurrent_rounds_take_each_record_once<St, F, Fut>(
    stores: Vec<St>,
    lease: Duration,
    wait: F,
) where
    St: IdempotencyStore + Clone,
    F: Fn(Duration) -> Fut,
    Fut: Future<Output = ()>,
{
    let asked: Arc<Mutex<HashMap<String, Vec<u64>>>> = Arc::default();
    let keys: Vec<String> = (0..24).map(|i| format!("k-{i}")).collect();
    for key in &keys {
        abandon(&stores[0], key, lease, &[]).await;
    }
    wait(lease + lease / 2).await;
    let mut rounds = Vec::new();
    for store in &stores {
        let log = asked.clone();
        let layer = IdempotencyLayer::builder(store.clone())
            .lease(lease * 20)
            .recover_abandoned(move |r: AbandonedRecord| {
                log.lock()
                    .unwrap()
                    .entry(r.key.key().as_str().to_owned())
                    .or_default()
                    .push(r.fence.get());
                async move {
                    tokio::task::yield_now().await;
                    AbandonedRecovery::Released
                }
            })
            .build()
            .unwrap();
        rounds.push(tokio::spawn(async move {
            let mut total = 0;
            loop {
                let done = layer.recover_abandoned(3).await.unwrap();
                if done.seen == 0 {
                    return total;
                }
                assert_eq!(done.released, done.seen, "{done}");
                total += done.seen;
            }
        }));
    }
    let mut total = 0;
    for r in rounds {
        total += r.await.unwrap();
    }
    assert_eq!(total, keys.len());
    let asked = asked.lock().unwrap();
    assert_eq!(asked.len(), keys.len());
    for key in &keys {
        assert_eq!(
            asked[key],
            [2],
            "{key} was taken more than once, or not with fence 2"
        );
    }
}

const HOUR: Duration = Duration::from_secs(3600);

async fn advance(d: Duration) {
    tokio::time::advance(d).await;
}

#[tokio::test(start_paused = true)]
async fn memory_without_a_hook_releases_or_marks_unknown() {
    without_a_hook(MemoryStore::new(), HOUR, advance).await;
}

#[tokio::test(start_paused = true)]
async fn memory_a_grace_leaves_the_client_time_to_come_back() {
    a_grace_leaves_the_client_time_to_come_back(MemoryStore::new(), HOUR, advance).await;
}

#[tokio::test(start_paused = true)]
async fn memory_each_verdict_of_the_hook_lands() {
    each_verdict_lands(MemoryStore::new(), HOUR, advance).await;
}

#[tokio::test(start_paused = true)]
async fn memory_a_hook_that_panics_or_hangs_leaves_the_record_for_the_next_round() {
    a_failing_hook_leaves_the_record(MemoryStore::new(), HOUR, advance).await;
}

#[tokio::test(start_paused = true)]
async fn memory_only_abandoned_records_are_taken() {
    only_abandoned_records_are_taken(MemoryStore::new(), HOUR, advance).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_concurrent_rounds_take_each_record_once() {
    // Real time, so that the four rounds run in parallel on two threads; the lease is short.
    let store = MemoryStore::with_shards(4);
    let stores = vec![store.clone(), store.clone(), store.clone(), store];
    concurrent_rounds_take_each_record_once(stores, Duration::from_millis(100), tokio::time::sleep)
        .await;
}

/// A store that does not find abandoned records (the trait's default) fails the round, which
/// says so with an event.
#[tokio::test(start_paused = true)]
async fn a_store_without_the_move_fails_the_round_and_says_so() {
    let events = InMemoryRecorder::new();
    let layer = IdempotencyLayer::builder(super::Down)
        .recorder(events.clone())
        .build()
        .unwrap();
    let err = layer.recover_abandoned(10).await.unwrap_err();
    assert!(err.is_backend());
    assert_eq!(
        std::error::Error::source(&err).unwrap().to_string(),
        "this idempotency store does not recover abandoned records"
    );
    let kinds: Vec<_> = events.server_events().iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [ServerEventKind::AbandonedRoundFailed]);
}

/// The hook's timeout is a setting like the others: zero and over ten years are refused.
#[test]
fn the_hook_timeout_is_bounded() {
    for bad in [
        Duration::ZERO,
        surely::MAX_DURATION + Duration::from_secs(1),
    ] {
        let err = IdempotencyLayer::builder(MemoryStore::new())
            .abandoned_timeout(bad)
            .build()
            .unwrap_err();
        assert_eq!(err.setting(), "idempotency abandoned-record hook timeout");
    }
}
