//! The queue tested on its own, with states of its own: in memory under paused time, and on
//! the machine's PostgreSQL (`SURELY_TEST_POSTGRES_URL`) in a table of each test's own.

use std::time::Duration;

use proptest::prelude::*;

use super::{MemoryQueue, Refused, States};

/// A component's states, as small as the protocol allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum S {
    Waiting,
    Claimed,
    Manual,
    Done,
}

impl States for S {
    const ALL: &'static [Self] = &[S::Waiting, S::Claimed, S::Manual, S::Done];
    const CLAIMED: Self = S::Claimed;

    fn claimable(self) -> bool {
        matches!(self, S::Waiting | S::Claimed)
    }

    fn settled(self) -> bool {
        self == S::Done
    }
}

/// The outbox's shape: one state both waits and is claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum P {
    Pending,
    Quarantined,
    Published,
}

impl States for P {
    const ALL: &'static [Self] = &[P::Pending, P::Quarantined, P::Published];
    const CLAIMED: Self = P::Pending;

    fn claimable(self) -> bool {
        self == P::Pending
    }

    fn settled(self) -> bool {
        self == P::Published
    }
}

const LEASE: Duration = Duration::from_secs(30);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

async fn advance(d: Duration) {
    tokio::time::advance(d).await;
}

/// A queue holding `keys`, waiting, in that order.
fn queue(keys: &[&'static str]) -> MemoryQueue<&'static str, S, u32> {
    let q = MemoryQueue::default();
    {
        let mut items = q.lock();
        for (i, k) in keys.iter().enumerate() {
            assert!(items.insert(*k, S::Waiting, None, i as u32));
        }
    }
    q
}

/// Claims up to `max` for `lease`: each claimed key with its fence.
fn claim<S: States>(
    q: &MemoryQueue<&'static str, S, u32>,
    keys: &[&'static str],
    max: usize,
    lease: Duration,
) -> Vec<(&'static str, u64)> {
    q.lock()
        .claim(max, lease, |item| (keys[item.value as usize], item.fence()))
}

#[tokio::test(start_paused = true)]
async fn claims_take_the_oldest_due_items_first() {
    let keys = ["a", "b", "c", "d"];
    let q = queue(&keys);
    assert_eq!(claim(&q, &keys, 2, LEASE), [("a", 1), ("b", 1)]);
    assert_eq!(claim(&q, &keys, 5, LEASE), [("c", 1), ("d", 1)]);
    assert_eq!(claim(&q, &keys, 5, LEASE), []);
    assert_eq!(claim(&q, &keys, 0, LEASE), []);
    assert!(!q.lock().insert("a", S::Waiting, None, 9), "one item a key");
    assert_eq!(q.lock().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn one_holder_at_a_time_until_the_lease_passes_then_a_higher_fence() {
    let keys = ["a"];
    let q = queue(&keys);
    assert_eq!(claim(&q, &keys, 1, LEASE), [("a", 1)]);
    advance(LEASE - Duration::from_millis(1)).await;
    assert_eq!(claim(&q, &keys, 1, LEASE), [], "held while the lease lasts");
    advance(Duration::from_millis(1)).await;
    assert_eq!(claim(&q, &keys, 1, LEASE), [("a", 2)], "taken over");

    // The first holder, late: refused, whatever it writes.
    let mut items = q.lock();
    assert_eq!(items.held("a", 1).err(), Some(Refused::Stale));
    assert_eq!(items.held("b", 1).err(), Some(Refused::Missing));
    // The second holder settles; then neither may write.
    items.held("a", 2).unwrap().settle(S::Done);
    assert_eq!(items.held("a", 2).err(), Some(Refused::Stale));
    assert_eq!(items.held("a", 1).err(), Some(Refused::Stale));
    drop(items);
    advance(LEASE * 10).await;
    assert_eq!(
        claim(&q, &keys, 1, LEASE),
        [],
        "settled: never claimed again"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_later_and_a_hold_wait_for_their_time_and_count_tries() {
    let keys = ["a", "b"];
    let q = MemoryQueue::default();
    q.lock().insert("a", S::Waiting, None, 0);
    q.lock().insert("b", S::Waiting, Some(secs(5)), 1);
    assert_eq!(claim(&q, &keys, 5, LEASE), [("a", 1)], "b is held 5 s");
    q.lock()
        .held("a", 1)
        .unwrap()
        .retry_later(S::Waiting, secs(10));
    assert_eq!(
        q.lock().held("a", 1).err(),
        Some(Refused::Stale),
        "released"
    );
    advance(secs(5)).await;
    assert_eq!(claim(&q, &keys, 5, LEASE), [("b", 1)], "a waits 10 s");
    advance(secs(5)).await;
    assert_eq!(claim(&q, &keys, 5, LEASE), [("a", 2)]);
    let items = q.lock();
    assert_eq!(items.get("a").unwrap().tries(), 1);
    assert_eq!(items.get("b").unwrap().tries(), 0);
    assert_eq!(items.get("a").unwrap().state(), S::Claimed);
}

#[tokio::test(start_paused = true)]
async fn the_manual_state_is_never_claimed_until_a_person_reopens_it() {
    let keys = ["a", "b"];
    let q = queue(&keys);
    assert_eq!(claim(&q, &keys, 1, LEASE), [("a", 1)]);
    q.lock().held("a", 1).unwrap().park(S::Manual);
    q.lock().insert("c", S::Manual, None, 0);
    advance(secs(365 * 24 * 3600)).await;
    assert_eq!(claim(&q, &keys, 5, LEASE), [("b", 1)]);
    assert_eq!(q.lock().get("a").unwrap().tries(), 1);

    // A person sends it back: due at once, under a fence no earlier claim had.
    q.lock().get_mut("a").unwrap().reopen(S::Waiting);
    assert_eq!(q.lock().held("a", 1).err(), Some(Refused::Stale));
    assert_eq!(claim(&q, &keys, 5, LEASE), [("a", 3)]);
    assert_eq!(q.lock().get("a").unwrap().tries(), 1, "tries kept");
}

#[tokio::test(start_paused = true)]
async fn a_reopening_fences_out_the_holder_it_overtook() {
    let keys = ["a"];
    let q = queue(&keys);
    assert_eq!(claim(&q, &keys, 1, LEASE), [("a", 1)]);
    advance(LEASE).await;
    // Its lease passed and a person reopened it while the holder was paused.
    q.lock().get_mut("a").unwrap().reopen(S::Waiting);
    assert_eq!(claim(&q, &keys, 1, LEASE), [("a", 3)]);
    assert_eq!(q.lock().held("a", 1).err(), Some(Refused::Stale));
    assert!(q.lock().held("a", 3).is_ok());
}

#[tokio::test(start_paused = true)]
async fn the_sweep_deletes_only_settled_items_past_the_retention() {
    let keys = ["open", "claimed", "manual", "settled", "recent"];
    let q = queue(&keys);
    assert_eq!(claim(&q, &keys, 5, LEASE).len(), 5);
    {
        let mut items = q.lock();
        items
            .held("open", 1)
            .unwrap()
            .retry_later(S::Waiting, Duration::ZERO);
        items.held("manual", 1).unwrap().park(S::Manual);
        items.held("settled", 1).unwrap().settle(S::Done);
    }
    advance(secs(60)).await;
    q.lock().held("recent", 1).unwrap().settle(S::Done);
    assert_eq!(q.lock().sweep(secs(60)), 1);
    let items = q.lock();
    assert!(items.get("settled").is_none());
    for key in ["open", "claimed", "manual", "recent"] {
        assert!(items.get(key).is_some(), "{key} kept");
    }
    drop(items);
    assert_eq!(
        q.lock().sweep(Duration::MAX),
        0,
        "nothing settled ten years ago"
    );
    assert_eq!(q.lock().sweep(Duration::ZERO), 1, "recent");
    assert_eq!(q.lock().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn one_state_that_waits_and_is_claimed() {
    let keys = ["a", "b"];
    let q = MemoryQueue::<&'static str, P, u32>::default();
    q.lock().insert("a", P::Pending, None, 0);
    q.lock().insert("b", P::Pending, None, 1);
    assert_eq!(claim(&q, &keys, 5, LEASE), [("a", 1), ("b", 1)]);
    assert_eq!(claim(&q, &keys, 5, LEASE), [], "pending, and held");
    q.lock()
        .held("a", 1)
        .unwrap()
        .retry_later(P::Pending, secs(1));
    q.lock().held("b", 1).unwrap().park(P::Quarantined);
    advance(secs(1)).await;
    assert_eq!(claim(&q, &keys, 5, LEASE), [("a", 2)]);
    q.lock().held("a", 2).unwrap().settle(P::Published);
    assert_eq!(q.lock().held("a", 2).err(), Some(Refused::Stale));
    let mut items = q.lock();
    let b = items.get_mut("b").unwrap();
    b.reopen(P::Pending);
    b.reset_tries();
    assert_eq!((b.tries(), b.fence()), (0, 2));
    assert!(items
        .remove_if("a", |i| i.state() == P::Quarantined)
        .is_none());
    assert!(items
        .remove_if("a", |i| i.state() == P::Published)
        .is_some());
    assert!(items.get("a").is_none());
}

#[test]
fn every_claimed_state_is_claimable_and_no_state_is_two_things() {
    fn check<T: States>() {
        assert!(T::CLAIMED.claimable());
        for s in T::ALL {
            assert!(!(s.claimable() && s.settled()), "{s:?}");
        }
        assert!(T::ALL.iter().any(|s| s.manual()));
    }
    check::<S>();
    check::<P>();
    check::<crate::ledger::EntryState>();
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::MAX),
        Just(Duration::ZERO),
        Just(crate::MAX_DURATION),
        (0..=u64::MAX, 0..1_000_000_000_u32).prop_map(|(s, n)| Duration::new(s, n)),
        (0..=3_600_000_u64).prop_map(Duration::from_millis),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Insert(Option<Duration>),
    Claim(usize, Duration),
    RetryLater(usize, Duration),
    Park(usize),
    Settle(usize),
    Reopen(usize),
    Sweep(Duration),
    Advance(Duration),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        proptest::option::of(duration()).prop_map(Op::Insert),
        (0..4_usize, duration()).prop_map(|(n, d)| Op::Claim(n, d)),
        (0..8_usize, duration()).prop_map(|(k, d)| Op::RetryLater(k, d)),
        (0..8_usize).prop_map(Op::Park),
        (0..8_usize).prop_map(Op::Settle),
        (0..8_usize).prop_map(Op::Reopen),
        duration().prop_map(Op::Sweep),
        (0..=100_000_u64).prop_map(|ms| Op::Advance(Duration::from_millis(ms))),
    ]
}

proptest! {
    /// Any duration, `Duration::MAX` included, as a hold, a lease, a wait or a retention: no
    /// panic, and the protocol's promises hold after every step.
    #[test]
    fn no_duration_panics_and_the_promises_hold(ops in proptest::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let q = MemoryQueue::<usize, S, ()>::default();
            // The fence each key's latest claim gave, as its holder knows it.
            let mut fences = vec![0_u64; 8];
            let mut inserted = 0_usize;
            for op in ops {
                match op {
                    Op::Insert(hold) => {
                        if inserted < 8 {
                            prop_assert!(q.lock().insert(inserted, S::Waiting, hold, ()));
                            inserted += 1;
                        }
                    }
                    Op::Claim(max, lease) => {
                        let before: Vec<(usize, S)> = (0..inserted)
                            .filter_map(|k| q.lock().get(&k).map(|i| (k, i.state())))
                            .collect();
                        let mut got: Vec<(u64, u64)> = Vec::new();
                        let mut items = q.lock();
                        let claimed = items.claim(max, lease, |i| i.fence());
                        prop_assert!(claimed.len() <= max);
                        drop(items);
                        for k in 0..inserted {
                            if let Some(item) = q.lock().get(&k) {
                                if item.fence() > fences[k] {
                                    prop_assert_eq!(item.fence(), fences[k] + 1);
                                    got.push((k as u64, item.fence()));
                                    fences[k] = item.fence();
                                }
                            }
                        }
                        prop_assert_eq!(got.len(), claimed.len());
                        for (k, _) in &got {
                            let was = before.iter().find(|(key, _)| *key as u64 == *k).map(|(_, s)| *s);
                            prop_assert!(was.is_some_and(S::claimable), "claimed from {was:?}");
                        }
                    }
                    Op::RetryLater(k, after) => {
                        if let Ok(item) = q.lock().held(&k, fences[k]) {
                            item.retry_later(S::Waiting, after);
                        }
                    }
                    Op::Park(k) => {
                        if let Ok(item) = q.lock().held(&k, fences[k]) {
                            item.park(S::Manual);
                        }
                    }
                    Op::Settle(k) => {
                        // A late holder (one fence behind) is refused.
                        if fences[k] > 1 {
                            prop_assert!(q.lock().held(&k, fences[k] - 1).is_err());
                        }
                        if let Ok(item) = q.lock().held(&k, fences[k]) {
                            item.settle(S::Done);
                        }
                    }
                    Op::Reopen(k) => {
                        let mut items = q.lock();
                        if let Some(item) = items.get_mut(&k) {
                            if item.state() == S::Manual {
                                item.reopen(S::Waiting);
                                fences[k] = item.fence();
                            }
                        }
                    }
                    Op::Sweep(retention) => {
                        let unsettled = q.lock().iter().filter(|i| !i.state().settled()).count();
                        q.lock().sweep(retention);
                        let left = q.lock().iter().filter(|i| !i.state().settled()).count();
                        prop_assert_eq!(unsettled, left, "the sweep deleted an unsettled item");
                    }
                    Op::Advance(d) => advance(d).await,
                }
            }
            Ok(())
        })?;
    }
}
