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
            assert!(items.insert(*k, S::Waiting, None, i as u32).unwrap());
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
    assert!(
        !q.lock().insert("a", S::Waiting, None, 9).unwrap(),
        "one item a key"
    );
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

    {
        // The first holder, late: refused, whatever it writes.
        let mut items = q.lock();
        assert_eq!(items.held("a", 1).err(), Some(Refused::Stale));
        assert_eq!(items.held("b", 1).err(), Some(Refused::Missing));
        // The second holder settles; then neither may write.
        items.held("a", 2).unwrap().settle(S::Done);
        assert_eq!(items.held("a", 2).err(), Some(Refused::Stale));
        assert_eq!(items.held("a", 1).err(), Some(Refused::Stale));
    }
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
    q.lock().insert("a", S::Waiting, None, 0).unwrap();
    q.lock().insert("b", S::Waiting, Some(secs(5)), 1).unwrap();
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
    q.lock().insert("c", S::Manual, None, 0).unwrap();
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

/// A batch deletes at most its limit, the longest settled first (not the first inserted), and
/// the next batch the rest.
#[tokio::test(start_paused = true)]
async fn a_sweep_batch_deletes_at_most_its_limit_the_longest_settled_first() {
    let keys = ["a", "b", "c", "d", "open"];
    let q = queue(&keys);
    assert_eq!(claim(&q, &keys, 5, LEASE).len(), 5);
    // Settled in the order d, c, b, a, a minute apart.
    for key in ["d", "c", "b", "a"] {
        q.lock().held(key, 1).unwrap().settle(S::Done);
        advance(secs(60)).await;
    }
    assert_eq!(q.lock().sweep(Duration::ZERO, 0), 0, "a limit of none");
    assert_eq!(q.lock().sweep(Duration::ZERO, 2), 2);
    {
        let items = q.lock();
        assert!(items.get("d").is_none() && items.get("c").is_none());
        assert!(items.get("b").is_some() && items.get("a").is_some());
    }
    // b was settled two minutes ago, a one: a retention of 90 s takes b alone.
    assert_eq!(q.lock().sweep(secs(90), 2), 1);
    assert!(q.lock().get("a").is_some());
    assert_eq!(q.sweep_all(Duration::ZERO), 1);
    assert_eq!(q.lock().len(), 1, "the open item is kept");
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
    assert_eq!(q.lock().sweep(secs(60), usize::MAX), 1);
    let items = q.lock();
    assert!(items.get("settled").is_none());
    for key in ["open", "claimed", "manual", "recent"] {
        assert!(items.get(key).is_some(), "{key} kept");
    }
    drop(items);
    assert_eq!(
        q.lock().sweep(Duration::MAX, usize::MAX),
        0,
        "nothing settled ten years ago"
    );
    assert_eq!(q.lock().sweep(Duration::ZERO, usize::MAX), 1, "recent");
    assert_eq!(q.lock().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn one_state_that_waits_and_is_claimed() {
    let keys = ["a", "b"];
    let q = MemoryQueue::<&'static str, P, u32>::default();
    q.lock().insert("a", P::Pending, None, 0).unwrap();
    q.lock().insert("b", P::Pending, None, 1).unwrap();
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
    super::check_states::<S>();
    super::check_states::<P>();
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
            let mut fences = [0_u64; 8];
            let mut inserted = 0_usize;
            for op in ops {
                match op {
                    Op::Insert(hold) => {
                        if inserted < 8 {
                            prop_assert!(q.lock().insert(inserted, S::Waiting, hold, ()).unwrap());
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
                        for (k, fence) in fences.iter_mut().enumerate().take(inserted) {
                            if let Some(item) = q.lock().get(&k)
                                && item.fence() > *fence {
                                    prop_assert_eq!(item.fence(), *fence + 1);
                                    got.push((k as u64, item.fence()));
                                    *fence = item.fence();
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
                        if let Some(item) = items.get_mut(&k)
                            && item.state() == S::Manual {
                                item.reopen(S::Waiting);
                                fences[k] = item.fence();
                            }
                    }
                    Op::Sweep(retention) => {
                        let unsettled = q.lock().iter().filter(|i| !i.state().settled()).count();
                        q.lock().sweep(retention, 2);
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

#[cfg(feature = "postgres")]
mod postgres {
    //! The statements against the machine's PostgreSQL, in a table of each test's own with the
    //! queue's columns and nothing else. Leases and waits of zero make an item due at once, and
    //! of an hour keep it waiting: no test waits on the database's clock.

    use std::time::Duration;

    use deadpool_postgres::Object;

    use super::S;
    use crate::queue::{fence, later, micros, Columns, SqlStates, Table};

    impl SqlStates for S {
        fn sql(self) -> &'static str {
            match self {
                S::Waiting => "'waiting'",
                S::Claimed => "'claimed'",
                S::Manual => "'manual'",
                S::Done => "'done'",
            }
        }
    }

    static COLUMNS: Columns = Columns {
        key: "id",
        state: "state",
        fence: "fence",
        until: "until",
        tries: "tries",
        order: &["seq"],
        settled_at: Some("settled_at"),
    };

    const HOUR: Duration = Duration::from_secs(3600);

    /// A test's table, dropped when the test ends (or at the next run, if it fails).
    struct Fixture {
        client: Object,
        name: String,
        table: Table<S>,
    }

    impl Fixture {
        async fn new() -> Self {
            let url = std::env::var("SURELY_TEST_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
            let pool = crate::storage::connect(&url).unwrap();
            let client = pool.get().await.unwrap_or_else(|e| {
                panic!("PostgreSQL at {url} (SURELY_TEST_POSTGRES_URL) did not answer: {e}")
            });
            let name = format!("surely_queue_{:x}", crate::ids::random_u128() as u64);
            client
                .batch_execute(&format!(
                    "CREATE TABLE {name} (
                         id text PRIMARY KEY,
                         seq bigserial NOT NULL,
                         state text NOT NULL,
                         fence bigint NOT NULL DEFAULT 0,
                         until timestamptz,
                         tries integer NOT NULL DEFAULT 0,
                         settled_at timestamptz
                     )"
                ))
                .await
                .unwrap();
            Fixture {
                client,
                table: Table::new(&name, &COLUMNS),
                name,
            }
        }

        async fn drop_table(self) {
            self.client
                .batch_execute(&format!("DROP TABLE {}", self.name))
                .await
                .unwrap();
        }

        /// Inserts `id`, waiting for `hold` (none: due at once).
        async fn insert(&self, id: &str, hold: Option<Duration>) {
            let sql = format!(
                "INSERT INTO {} (id, state, until) VALUES ($1, 'waiting', {})",
                self.name,
                later(2)
            );
            let hold = hold.map(micros);
            self.client.execute(&sql, &[&id, &hold]).await.unwrap();
        }

        /// Claims up to `max` for `lease`: each key with its fence, in the queue's order.
        async fn claim(&self, max: i64, lease: Duration) -> Vec<(String, i64)> {
            self.claim_on(&self.client, max, lease).await
        }

        async fn claim_on(
            &self,
            client: &tokio_postgres::Client,
            max: i64,
            lease: Duration,
        ) -> Vec<(String, i64)> {
            let sql = self.table.claim_joined("e.id, e.fence", "");
            let rows = client.query(&sql, &[&max, &micros(lease)]).await.unwrap();
            rows.iter().map(|r| (r.get(0), r.get(1))).collect()
        }

        /// A holder's write `set` with `fence`: whether it changed the row.
        async fn write(&self, set: &str, id: &str, fence: i64, extra: Option<i64>) -> bool {
            let sql = self.table.fenced(set);
            let n = match extra {
                Some(x) => self.client.execute(&sql, &[&id, &fence, &x]).await,
                None => self.client.execute(&sql, &[&id, &fence]).await,
            };
            n.unwrap() == 1
        }

        async fn state(&self, id: &str) -> Option<(String, i64, i32)> {
            let sql = self.table.look("state, fence, tries");
            let row = self.client.query_opt(&sql, &[&id]).await.unwrap();
            row.map(|r| (r.get(0), r.get(1), r.get(2)))
        }
    }

    fn owned(claims: &[(&str, i64)]) -> Vec<(String, i64)> {
        claims.iter().map(|(k, f)| ((*k).to_owned(), *f)).collect()
    }

    #[tokio::test]
    async fn pg_claims_take_the_oldest_due_rows_and_skip_the_locked_ones() {
        let f = Fixture::new().await;
        for id in ["a", "b", "c", "d"] {
            f.insert(id, None).await;
        }
        assert_eq!(f.claim(1, HOUR).await, owned(&[("a", 1)]));
        assert_eq!(f.claim(0, HOUR).await, owned(&[]));

        // A claim still in its transaction holds its rows locked: another claim skips them,
        // without waiting for it.
        let url = std::env::var("SURELY_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let pool = crate::storage::connect(&url).unwrap();
        let mut other = pool.get().await.unwrap();
        let txn = other.transaction().await.unwrap();
        let sql = f.table.claim("c.id, c.fence");
        let held = txn.query(&sql, &[&1_i64, &micros(HOUR)]).await.unwrap();
        assert_eq!(held[0].get::<_, String>(0), "b");
        let next = tokio::time::timeout(Duration::from_secs(30), f.claim(5, HOUR))
            .await
            .expect("a claim waited for another's locked rows");
        assert_eq!(next, owned(&[("c", 1), ("d", 1)]));
        txn.commit().await.unwrap();
        assert_eq!(f.claim(5, HOUR).await, owned(&[]), "every row is held");
        f.drop_table().await;
    }

    #[tokio::test]
    async fn pg_a_passed_lease_is_taken_over_and_the_late_holder_refused() {
        let f = Fixture::new().await;
        f.insert("a", None).await;
        assert_eq!(f.claim(5, Duration::ZERO).await, owned(&[("a", 1)]));
        assert_eq!(f.claim(5, HOUR).await, owned(&[("a", 2)]), "taken over");
        assert_eq!(f.claim(5, HOUR).await, owned(&[]), "held for an hour");
        let settle = f.table.settle(S::Done);
        assert!(!f.write(&settle, "a", 1, None).await, "the late holder");
        assert!(!f.write(&settle, "b", 2, None).await, "no such row");
        assert!(f.write(&settle, "a", 2, None).await);
        assert!(
            !f.write(&settle, "a", 2, None).await,
            "settled: not held any more"
        );
        assert_eq!(f.state("a").await.unwrap().0, "done");
        assert_eq!(f.claim(5, Duration::ZERO).await, owned(&[]), "never again");
        f.drop_table().await;
    }

    #[tokio::test]
    async fn pg_retry_later_and_a_hold_wait_for_their_time_and_count_tries() {
        let f = Fixture::new().await;
        f.insert("a", None).await;
        f.insert("b", Some(HOUR)).await;
        f.insert("c", Some(Duration::ZERO)).await;
        assert_eq!(
            f.claim(5, HOUR).await,
            owned(&[("a", 1), ("c", 1)]),
            "b is held"
        );
        let later = f.table.retry_later(S::Waiting, 3);
        assert!(f.write(&later, "a", 1, Some(micros(HOUR))).await);
        assert!(
            !f.write(&later, "a", 1, Some(0)).await,
            "released: not held"
        );
        assert!(f.write(&later, "c", 1, Some(0)).await);
        assert_eq!(
            f.claim(5, HOUR).await,
            owned(&[("c", 2)]),
            "a waits an hour"
        );
        assert_eq!(f.state("a").await.unwrap(), ("waiting".to_owned(), 1, 1));
        assert_eq!(f.state("c").await.unwrap(), ("claimed".to_owned(), 2, 1));
        assert_eq!(f.state("b").await.unwrap(), ("waiting".to_owned(), 0, 0));

        // Put back, or parked once this try makes the limit.
        let sql = format!(
            "{} RETURNING state",
            f.table
                .fenced(&f.table.retry_or_park(S::Waiting, S::Manual, 3, 4))
        );
        let state = |row: tokio_postgres::Row| row.get::<_, String>(0);
        let back = f
            .client
            .query_one(&sql, &[&"c", &2_i64, &0_i64, &3_i32])
            .await;
        assert_eq!(state(back.unwrap()), "waiting");
        assert_eq!(f.claim(5, HOUR).await, owned(&[("c", 3)]));
        let parked = f
            .client
            .query_one(&sql, &[&"c", &3_i64, &0_i64, &3_i32])
            .await;
        assert_eq!(state(parked.unwrap()), "manual");
        assert_eq!(f.state("c").await.unwrap(), ("manual".to_owned(), 3, 3));
        f.drop_table().await;
    }

    #[tokio::test]
    async fn pg_the_manual_state_is_never_claimed_until_a_person_reopens_it() {
        let f = Fixture::new().await;
        f.insert("a", None).await;
        assert_eq!(f.claim(5, Duration::ZERO).await, owned(&[("a", 1)]));
        assert!(f.write(&f.table.park(S::Manual), "a", 1, None).await);
        assert_eq!(f.claim(5, Duration::ZERO).await, owned(&[]));
        let reopen = f.table.reopen(&[S::Manual], S::Waiting, "", "");
        assert_eq!(f.client.execute(&reopen, &[&"a"]).await.unwrap(), 1);
        assert_eq!(
            f.client.execute(&reopen, &[&"a"]).await.unwrap(),
            0,
            "not manual"
        );
        assert_eq!(f.state("a").await.unwrap(), ("waiting".to_owned(), 2, 1));
        assert_eq!(f.claim(5, HOUR).await, owned(&[("a", 3)]));
        assert!(!f.write(&f.table.settle(S::Done), "a", 1, None).await);

        // A person's write, not fenced: anything unsettled.
        let by_hand = f.table.unsettled(&f.table.settle(S::Done), 1);
        assert_eq!(f.client.execute(&by_hand, &[&"a"]).await.unwrap(), 1);
        assert_eq!(
            f.client.execute(&by_hand, &[&"a"]).await.unwrap(),
            0,
            "settled"
        );
        f.drop_table().await;
    }

    #[tokio::test]
    async fn pg_the_sweep_deletes_only_settled_rows_past_the_retention() {
        let f = Fixture::new().await;
        for id in ["open", "claimed", "manual", "settled"] {
            f.insert(id, None).await;
        }
        assert_eq!(f.claim(5, HOUR).await.len(), 4);
        let later = f.table.retry_later(S::Waiting, 3);
        assert!(f.write(&later, "open", 1, Some(0)).await);
        assert!(f.write(&f.table.park(S::Manual), "manual", 1, None).await);
        assert!(f.write(&f.table.settle(S::Done), "settled", 1, None).await);
        let sweep = f.table.sweep();
        let swept = |retention: Duration| {
            let (client, sweep) = (&f.client, &sweep);
            async move {
                client
                    .execute(sweep, &[&micros(retention), &100_i64])
                    .await
                    .unwrap()
            }
        };
        assert_eq!(swept(HOUR).await, 0, "settled just now");
        assert_eq!(swept(Duration::MAX).await, 0);
        assert_eq!(swept(Duration::ZERO).await, 1);
        assert!(f.state("settled").await.is_none());
        for id in ["open", "claimed", "manual"] {
            assert!(f.state(id).await.is_some(), "{id} kept");
        }
        f.drop_table().await;
    }

    /// A batch deletes at most its limit, the longest settled first; a batch that runs while
    /// another holds its rows (its transaction open) skips them, without waiting and without
    /// an error: the two delete disjoint rows, and together all of them.
    #[tokio::test]
    async fn pg_sweep_batches_are_bounded_oldest_first_and_skip_each_others_rows() {
        let f = Fixture::new().await;
        let ids: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
        for id in &ids {
            f.insert(id, None).await;
        }
        f.insert("open", None).await;
        assert_eq!(f.claim(10, HOUR).await.len(), 7);
        for id in &ids {
            assert!(f.write(&f.table.settle(S::Done), id, 1, None).await);
        }
        // Settled an hour apart, s5 the longest ago.
        f.client
            .execute(
                &format!(
                    "UPDATE {} SET settled_at = now() - (7 - substr(id, 2)::int) * interval '1 hour'
                     WHERE id LIKE 's%'",
                    f.name
                ),
                &[],
            )
            .await
            .unwrap();
        let sweep = f.table.sweep();
        let n = f
            .client
            .execute(&sweep, &[&micros(Duration::ZERO), &1_i64])
            .await
            .unwrap();
        assert_eq!(n, 1);
        assert!(f.state("s0").await.is_none(), "the longest settled first");

        // A batch that holds two rows in an open transaction, and one beside it.
        let pool = crate::storage::connect(
            &std::env::var("SURELY_TEST_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned()),
        )
        .unwrap();
        let mut held = pool.get().await.unwrap();
        let txn = held.transaction().await.unwrap();
        let first = txn
            .execute(&sweep, &[&micros(Duration::ZERO), &2_i64])
            .await
            .unwrap();
        let beside = tokio::time::timeout(
            Duration::from_secs(5),
            f.client
                .execute(&sweep, &[&micros(Duration::ZERO), &100_i64]),
        )
        .await
        .expect("the second batch does not wait for the first")
        .unwrap();
        txn.commit().await.unwrap();
        assert_eq!((first, beside), (2, 3), "disjoint, and all of them");
        assert!(f.state("open").await.is_some());
        f.drop_table().await;
    }

    #[tokio::test]
    async fn pg_many_holders_write_at_once_each_under_its_own_fence() {
        let f = Fixture::new().await;
        for id in ["a", "b", "c"] {
            f.insert(id, None).await;
        }
        assert_eq!(f.claim(5, Duration::ZERO).await.len(), 3);
        assert_eq!(f.claim(1, HOUR).await, owned(&[("a", 2)]));
        let sql = f.table.fenced_all(&f.table.settle(S::Done));
        let ids = vec!["a", "b", "c"];
        let fences = vec![1_i64, 1, 2];
        let n = f.client.execute(&sql, &[&ids, &fences]).await.unwrap();
        assert_eq!(
            n, 1,
            "a was taken over, c's fence is not its claim's: b alone"
        );
        assert_eq!(f.state("b").await.unwrap().0, "done");
        f.drop_table().await;
    }

    /// `Duration::MAX` as a hold, a lease, a wait and a retention: no error from the database
    /// (PostgreSQL refuses `now()` moved past its timestamps' range), and the longest counts as
    /// ten years.
    #[tokio::test]
    async fn pg_no_duration_takes_the_database_out_of_range() {
        let f = Fixture::new().await;
        for (i, d) in [
            Duration::MAX,
            crate::MAX_DURATION,
            Duration::new(u64::MAX / 2, 7),
        ]
        .into_iter()
        .enumerate()
        {
            f.insert(&format!("held-{i}"), Some(d)).await;
        }
        f.insert("a", None).await;
        assert_eq!(f.claim(5, Duration::MAX).await, owned(&[("a", 1)]));
        let later = f.table.retry_later(S::Waiting, 3);
        assert!(f.write(&later, "a", 1, Some(micros(Duration::MAX))).await);
        let sql = format!(
            "SELECT until BETWEEN now() + interval '3649 days' AND now() + interval '3651 days'
             FROM {} WHERE id = 'a'",
            f.name
        );
        let ten_years: bool = f.client.query_one(&sql, &[]).await.unwrap().get(0);
        assert!(ten_years, "Duration::MAX counts as ten years");
        let sweep = f.table.sweep();
        f.client
            .execute(&sweep, &[&micros(Duration::MAX), &i64::MAX])
            .await
            .unwrap();
        assert_eq!(micros(Duration::MAX), micros(crate::MAX_DURATION));
        assert_eq!(micros(Duration::from_nanos(1)), 1, "rounded up");
        assert_eq!(fence(u64::MAX), i64::MAX);
        f.drop_table().await;
    }
}

/// A million distinct keys into a queue of 1 000: it holds 1 000, refuses every key past them
/// without dropping one, and takes new keys again once settled items are swept.
#[tokio::test(start_paused = true)]
async fn a_million_keys_fill_the_queue_to_its_capacity_and_no_further() {
    let q: MemoryQueue<u32, S, ()> = MemoryQueue::default();
    let mut items = q.lock();
    assert_eq!(items.capacity(), super::DEFAULT_CAPACITY);
    items.set_capacity(1_000);
    let mut refused = 0;
    for k in 0..1_000_000u32 {
        match items.insert(k, S::Waiting, None, ()) {
            Ok(added) => assert!(added),
            Err(super::Full(capacity)) => {
                assert_eq!(capacity, 1_000);
                refused += 1;
            }
        }
    }
    assert_eq!((items.len(), refused), (1_000, 999_000));
    // The first thousand are the ones kept: nothing was dropped to make room.
    assert!(items.get(&0).is_some() && items.get(&999).is_some() && items.get(&1_000).is_none());
    // A key already in is still "already here", not "full".
    assert!(!items.insert(5, S::Waiting, None, ()).unwrap());
    for k in 0..1_000 {
        items.get_mut(&k).expect("kept").settle(S::Done);
    }
    assert_eq!(items.sweep(Duration::ZERO, usize::MAX), 1_000);
    assert!(items.insert(1_000_001, S::Waiting, None, ()).unwrap());
}
