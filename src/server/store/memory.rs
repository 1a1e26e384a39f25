//! The in-memory store.

use std::collections::hash_map::{Entry, HashMap};
use std::fmt;
use std::future::{ready, Future};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{
    bounded, AbandonedRecord, Acquire, Checkpoint, ExpiredRecord, Fence, IdempotencyStore,
    RecordKey, RecordState, RecordView, RequestDigest, StoreError, StoredResponse, StuckRecord,
    UnknownRecord,
};
#[cfg(surely_loom)]
use crate::sync::mutation;
use crate::sync::{now as clock, AtomicUsize, Mutex, MutexGuard};
use std::sync::atomic::Ordering::{AcqRel, Relaxed};

/// The embedded store: records in memory, for one process.
///
/// The records are spread over shards by the hash of their [`RecordKey`], each behind its own
/// short-held mutex: two requests contend only when their keys fall in the same shard, and no
/// operation takes a lock over the whole store (the [`sweep`](IdempotencyStore::sweep) takes the
/// shards one at a time). Every operation is a single critical section, so acquiring is atomic.
///
/// Time is [`tokio::time::Instant`], so tests can pause and advance it.
///
/// Records live as long as the process: behind a load balancer with several instances, use a
/// shared store ([`PostgresStore`][super::PostgresStore]) instead, or a duplicate that reaches
/// another instance runs again. Clones share the records.
///
/// # Memory
///
/// At most [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) records (1 000 000), in every state;
/// [`with_capacity`](Self::with_capacity) sets another bound. At the bound the store forgets
/// nothing to make room (a `PROCESSING` or `UNKNOWN` record lost would let a duplicate run
/// again): [`acquire`](IdempotencyStore::acquire) of a new key fails with
/// [`StoreError::is_full`], and the layer answers that request `503 Service Unavailable` with
/// `Retry-After: 1` and `surely-not-processed: idempotency-store`, the handler not run. Keys
/// already held are answered as before, and a [sweep](IdempotencyStore::sweep) (the layer's
/// [`sweep`](crate::server::idempotency::IdempotencyLayer::sweep)) makes room by deleting
/// expired records. Each record holds its stored response and checkpoints besides its key.
///
/// ```
/// use std::time::Duration;
/// use surely::server::store::{Acquire, IdempotencyStore, MemoryStore, RecordKey, RequestDigest};
/// use surely::idempotency::IdempotencyKey;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryStore::new();
/// let key = RecordKey::new("t", "POST /orders", IdempotencyKey::new("k-1").unwrap());
/// let digest = RequestDigest::of(b"o-1");
/// let lease = Duration::from_secs(30);
/// assert!(matches!(store.acquire(&key, &digest, lease).await.unwrap(), Acquire::Owner(_)));
/// assert!(matches!(store.acquire(&key, &digest, lease).await.unwrap(), Acquire::InFlight { .. }));
/// # }
/// ```
#[cfg_attr(
    not(all(feature = "server", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "super::PostgresStore",
    )
)]
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct Shared {
    shards: Box<[Mutex<Shard>]>,
    /// Records held, in every shard: counted up before a new key goes in, down after one goes.
    held: AtomicUsize,
    /// The most records the store takes.
    capacity: AtomicUsize,
}

/// A shard: record keys carry their hash, so the map's hasher passes it through.
type Shard = HashMap<RecordKey, Record, BuildHasherDefault<PassThrough>>;

/// Takes the `u64` that [`RecordKey`]'s `Hash` writes as the hash.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by RecordKey; a plain FNV-1a so that any other input still hashes.
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

struct Record {
    digest: RequestDigest,
    fence: u64,
    state: State,
    /// The owners' steps, oldest first; dropped on release.
    checkpoints: Vec<Checkpoint>,
}

impl Record {
    /// Whether the record is owned, or found unknown, with `fence`: only then may it be
    /// completed or released.
    fn finishable(&self, fence: Fence) -> bool {
        let fenced = self.fence == fence.get();
        let open = matches!(self.state, State::Processing { .. } | State::Unknown { .. });
        #[cfg(surely_loom)]
        let (fenced, open) = (
            fenced || mutation("store_no_fence"),
            open || mutation("store_finish_any_state"),
        );
        fenced && open
    }
}

enum State {
    Processing {
        lease_until: Instant,
        /// When the owner acquired it: renewals do not move it.
        since: Instant,
    },
    Completed {
        response: StoredResponse,
        expires_at: Instant,
    },
    Released {
        at: Instant,
    },
    Unknown {
        evidence: Box<str>,
        since: Instant,
    },
}

/// The default number of shards.
const SHARDS: usize = 64;

impl MemoryStore {
    /// The records a store takes unless [`with_capacity`](Self::with_capacity) says otherwise.
    pub const DEFAULT_CAPACITY: usize = 1_000_000;

    /// An empty store with 64 shards.
    pub fn new() -> Self {
        Self::with_shards(SHARDS)
    }

    /// An empty store with `shards` shards, rounded up to a power of two, from 1 to 65 536.
    /// More shards mean less contention between threads and a little more memory.
    pub fn with_shards(shards: usize) -> Self {
        let n = shards.clamp(1, 1 << 16).next_power_of_two();
        MemoryStore {
            shared: Arc::new(Shared {
                shards: (0..n).map(|_| Mutex::new(Shard::default())).collect(),
                held: AtomicUsize::new(0),
                capacity: AtomicUsize::new(Self::DEFAULT_CAPACITY),
            }),
        }
    }

    /// The same store, taking at most `records` records (at least 1) in every state: past
    /// them a new key is refused with [`StoreError::is_full`] (see "Memory" above). The bound is
    /// the store's, so its clones share it. Nothing is allocated ahead.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::server::store::{IdempotencyStore, MemoryStore, RecordKey, RequestDigest};
    /// use surely::idempotency::IdempotencyKey;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let store = MemoryStore::new().with_capacity(1);
    /// let key = |k| RecordKey::new("t", "POST /orders", IdempotencyKey::new(k).unwrap());
    /// let (digest, lease) = (RequestDigest::of(b"o-1"), Duration::from_secs(30));
    /// assert!(store.acquire(&key("k-1"), &digest, lease).await.is_ok());
    /// let full = store.acquire(&key("k-2"), &digest, lease).await.unwrap_err();
    /// assert!(full.is_full());
    /// // A key it holds is answered as before.
    /// assert!(store.acquire(&key("k-1"), &digest, lease).await.is_ok());
    /// # }
    /// ```
    #[must_use]
    pub fn with_capacity(self, records: usize) -> Self {
        self.shared.capacity.store(records.max(1), Relaxed);
        self
    }

    /// The most records the store takes ([`with_capacity`](Self::with_capacity)).
    pub fn capacity(&self) -> usize {
        self.shared.capacity.load(Relaxed)
    }

    /// Counts a new record in, unless the store is full.
    fn admit(&self) -> Result<(), StoreError> {
        let capacity = self.capacity();
        let held = &self.shared.held;
        if held.fetch_add(1, AcqRel) >= capacity {
            held.fetch_sub(1, AcqRel);
            return Err(StoreError::full(capacity));
        }
        Ok(())
    }

    /// Counts `n` records out.
    fn gone(&self, n: usize) {
        if n > 0 {
            self.shared.held.fetch_sub(n, AcqRel);
        }
    }

    /// The number of records held, in every state.
    pub fn len(&self) -> usize {
        self.shared.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &RecordKey) -> MutexGuard<'_, Shard> {
        // The map indexes its buckets by the low bits and tags them with the top seven: the
        // shard takes bits from the middle, so that neither is constant within a shard.
        let h = (key.hash_value() >> 32) as usize;
        let shards = &self.shared.shards;
        lock(&shards[h & (shards.len() - 1)])
    }

    fn acquire_now(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> Result<Acquire, StoreError> {
        let now = clock();
        let lease_until = later(now, lease);
        #[cfg(surely_loom)]
        if mutation("store_acquire_split") && !self.shard(key).contains_key(key) {
            // The look and the insert under two locks: two acquirers may both find no record.
            self.admit()?;
            let record = Record {
                digest: *digest,
                fence: 1,
                state: State::Processing {
                    lease_until,
                    since: now,
                },
                checkpoints: Vec::new(),
            };
            if self.shard(key).insert(key.clone(), record).is_some() {
                self.gone(1);
            }
            return Ok(Acquire::Owner(Fence::new(1)));
        }
        let mut shard = self.shard(key);
        Ok(match shard.entry(key.clone()) {
            Entry::Vacant(v) => {
                self.admit()?;
                v.insert(Record {
                    digest: *digest,
                    fence: 1,
                    state: State::Processing {
                        lease_until,
                        since: now,
                    },
                    checkpoints: Vec::new(),
                });
                Acquire::Owner(Fence::new(1))
            }
            Entry::Occupied(mut o) => {
                let record = o.get_mut();
                // How long a processing record was held past its lease, when taken over.
                let overdue = match &record.state {
                    State::Released { .. } => None,
                    State::Processing {
                        lease_until: held,
                        since,
                    } => {
                        if record.digest != *digest {
                            return Ok(Acquire::Mismatch);
                        }
                        if *held > now {
                            return Ok(Acquire::InFlight {
                                retry_after: held.saturating_duration_since(now),
                            });
                        }
                        Some((
                            now.saturating_duration_since(*held),
                            now.saturating_duration_since(*since),
                        ))
                    }
                    State::Unknown { evidence, .. } => {
                        return Ok(if record.digest != *digest {
                            Acquire::Mismatch
                        } else {
                            Acquire::Unknown {
                                evidence: evidence.to_string(),
                            }
                        });
                    }
                    State::Completed {
                        response,
                        expires_at,
                    } => {
                        return Ok(if *expires_at <= now {
                            Acquire::Expired
                        } else if record.digest != *digest {
                            Acquire::Mismatch
                        } else {
                            Acquire::Completed(response.clone())
                        });
                    }
                };
                // Released, or a lease that passed: take over.
                record.fence += 1;
                record.digest = *digest;
                record.state = State::Processing {
                    lease_until,
                    since: now,
                };
                let fence = Fence::new(record.fence);
                match overdue {
                    Some((overdue, age)) => Acquire::TakenOver {
                        fence,
                        overdue,
                        age,
                        checkpoints: record.checkpoints.clone(),
                    },
                    None => Acquire::Owner(fence),
                }
            }
        })
    }

    /// Completes or releases the record owned (or found unknown) with `fence`.
    fn finish(&self, key: &RecordKey, fence: Fence, state: State) -> Result<(), StoreError> {
        let mut shard = self.shard(key);
        match shard.get_mut(key) {
            Some(record) if record.finishable(fence) => {
                if let State::Released { .. } = state {
                    record.checkpoints = Vec::new();
                }
                record.state = state;
                Ok(())
            }
            _ => Err(StoreError::stale()),
        }
    }

    /// Changes the `PROCESSING` record owned with `fence`.
    fn owned(
        &self,
        key: &RecordKey,
        fence: Fence,
        change: impl FnOnce(&mut Record) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut shard = self.shard(key);
        match shard.get_mut(key) {
            Some(record)
                if record.fence == fence.get()
                    && matches!(record.state, State::Processing { .. }) =>
            {
                change(record)
            }
            _ => Err(StoreError::stale()),
        }
    }

    fn unknowns_now(&self, limit: usize) -> Vec<UnknownRecord> {
        let now = clock();
        let mut found: Vec<UnknownRecord> = Vec::new();
        for shard in self.shared.shards.iter() {
            for (key, record) in lock(shard).iter() {
                if let State::Unknown { evidence, since } = &record.state {
                    found.push(UnknownRecord::new(
                        key.clone(),
                        Fence::new(record.fence),
                        evidence.as_ref(),
                        record.checkpoints.clone(),
                        now.saturating_duration_since(*since),
                    ));
                }
            }
        }
        found.sort_by_key(|u| std::cmp::Reverse(u.age));
        found.truncate(limit);
        found
    }

    /// Extends the lease of the record owned with `fence`, keeping when it was acquired.
    fn renew_now(&self, key: &RecordKey, fence: Fence, lease: Duration) -> Result<(), StoreError> {
        let mut shard = self.shard(key);
        match shard.get_mut(key) {
            Some(Record {
                fence: f,
                state: State::Processing { lease_until, .. },
                ..
            }) if *f == fence.get() => {
                *lease_until = later(clock(), lease);
                Ok(())
            }
            _ => Err(StoreError::stale()),
        }
    }

    fn stuck_now(&self, older_than: Duration, limit: usize) -> Vec<StuckRecord> {
        let now = clock();
        let mut stuck: Vec<StuckRecord> = Vec::new();
        for shard in self.shared.shards.iter() {
            for (key, record) in lock(shard).iter() {
                if let State::Processing { since, .. } = record.state {
                    let age = now.saturating_duration_since(since);
                    if age >= bounded(older_than) {
                        stuck.push(StuckRecord::new(key.clone(), Fence::new(record.fence), age));
                    }
                }
            }
        }
        stuck.sort_by_key(|s| std::cmp::Reverse(s.age));
        stuck.truncate(limit);
        stuck
    }

    /// Takes over up to `limit` records `PROCESSING` whose lease passed, oldest lease first.
    /// Found shard by shard, then each taken under its shard's lock if it is still as found
    /// (same fence, still processing, lease still passed): a record is taken once, by one
    /// caller, whatever runs meanwhile.
    fn take_abandoned_now(
        &self,
        overdue_by: Duration,
        lease: Duration,
        limit: usize,
    ) -> Vec<AbandonedRecord> {
        let now = clock();
        let due_by = |lease_until: Instant| later(lease_until, bounded(overdue_by)) <= now;
        let mut due: Vec<(Instant, RecordKey, u64)> = Vec::new();
        for shard in self.shared.shards.iter() {
            for (key, record) in lock(shard).iter() {
                if let State::Processing { lease_until, .. } = record.state
                    && due_by(lease_until)
                {
                    due.push((lease_until, key.clone(), record.fence));
                }
            }
        }
        due.sort_by_key(|(lease_until, _, _)| *lease_until);
        due.truncate(limit);
        let mut taken = Vec::with_capacity(due.len());
        for (_, key, fence) in due {
            let mut shard = self.shard(&key);
            let Some(record) = shard.get_mut(&key) else {
                continue;
            };
            let State::Processing { lease_until, since } = record.state else {
                continue;
            };
            if record.fence != fence || !due_by(lease_until) {
                continue;
            }
            record.fence += 1;
            record.state = State::Processing {
                lease_until: later(now, lease),
                since: now,
            };
            taken.push(AbandonedRecord::new(
                key.clone(),
                Fence::new(record.fence),
                now.saturating_duration_since(since),
                now.saturating_duration_since(lease_until),
                record.digest,
                record.checkpoints.clone(),
            ));
        }
        taken
    }

    fn expired_now(&self, keep_expired_for: Duration, limit: usize) -> Vec<ExpiredRecord> {
        let now = clock();
        let mut found: Vec<(Instant, ExpiredRecord)> = Vec::new();
        for shard in self.shared.shards.iter() {
            for (key, record) in lock(shard).iter() {
                let (ended, status, resource) = match &record.state {
                    State::Completed {
                        response,
                        expires_at,
                    } => (
                        *expires_at,
                        Some(response.status()),
                        response.resource().map(str::to_owned),
                    ),
                    State::Released { at } => (*at, None, None),
                    State::Processing { .. } | State::Unknown { .. } => continue,
                };
                if later(ended, keep_expired_for) <= now {
                    let expired = ExpiredRecord::new(
                        key.clone(),
                        Fence::new(record.fence),
                        status,
                        resource,
                        record.checkpoints.clone(),
                    );
                    found.push((ended, expired));
                }
            }
        }
        found.sort_by_key(|(ended, _)| *ended);
        found.truncate(limit);
        found.into_iter().map(|(_, e)| e).collect()
    }

    fn forget_now(&self, records: &[ExpiredRecord]) -> u64 {
        let mut removed = 0;
        for expired in records {
            let mut shard = self.shard(&expired.key);
            let terminal = shard.get(&expired.key).is_some_and(|r| {
                r.fence == expired.fence.get()
                    && matches!(r.state, State::Completed { .. } | State::Released { .. })
            });
            if terminal {
                shard.remove(&expired.key);
                self.gone(1);
                removed += 1;
            }
        }
        removed
    }

    fn sweep_now(&self, keep_expired_for: Duration) -> u64 {
        let now = clock();
        let mut removed = 0;
        for shard in self.shared.shards.iter() {
            let mut shard = lock(shard);
            let before = shard.len();
            shard.retain(|_, record| match record.state {
                State::Processing { .. } | State::Unknown { .. } => true,
                State::Completed { expires_at, .. } => later(expires_at, keep_expired_for) > now,
                State::Released { at } => later(at, keep_expired_for) > now,
            });
            self.gone(before - shard.len());
            removed += (before - shard.len()) as u64;
        }
        removed
    }
}

/// `at + d`, with `d` at most [`MAX_DURATION`](crate::MAX_DURATION): the store's one sum of an
/// instant and a duration, which never panics.
fn later(at: Instant, d: Duration) -> Instant {
    crate::time::later(at, bounded(d))
}

/// A poisoned shard still holds consistent records: every critical section above leaves a record
/// whole before anything that could panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.shared.shards.len())
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl IdempotencyStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn acquire(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> impl Future<Output = Result<Acquire, StoreError>> + Send {
        ready(self.acquire_now(key, digest, lease))
    }

    fn complete(
        &self,
        key: &RecordKey,
        fence: Fence,
        response: &StoredResponse,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let state = State::Completed {
            response: response.clone(),
            expires_at: later(clock(), retention),
        };
        ready(self.finish(key, fence, state))
    }

    fn release(
        &self,
        key: &RecordKey,
        fence: Fence,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let state = State::Released { at: clock() };
        ready(self.finish(key, fence, state))
    }

    fn renew(
        &self,
        key: &RecordKey,
        fence: Fence,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(self.renew_now(key, fence, lease))
    }

    fn stuck(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StuckRecord>, StoreError>> + Send {
        ready(Ok(self.stuck_now(older_than, limit)))
    }

    fn inspect(
        &self,
        key: &RecordKey,
    ) -> impl Future<Output = Result<Option<RecordView>, StoreError>> + Send {
        let now = clock();
        let view = self.shard(key).get(key).map(|record| {
            let state = match &record.state {
                State::Processing { lease_until, .. } => RecordState::Processing {
                    lease_left: lease_until.saturating_duration_since(now),
                },
                State::Completed {
                    response,
                    expires_at,
                } => RecordState::Completed {
                    response: response.clone(),
                    expired: *expires_at <= now,
                },
                State::Released { .. } => RecordState::Released,
                State::Unknown { evidence, .. } => RecordState::Unknown {
                    evidence: evidence.to_string(),
                },
            };
            RecordView::new(
                state,
                Fence::new(record.fence),
                record.digest,
                record.checkpoints.clone(),
            )
        });
        ready(Ok(view))
    }

    fn sweep(
        &self,
        keep_expired_for: Duration,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        ready(Ok(self.sweep_now(keep_expired_for)))
    }

    fn checkpoint(
        &self,
        key: &RecordKey,
        fence: Fence,
        checkpoint: &Checkpoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(self.owned(key, fence, |record| {
            Checkpoint::room_after(record.checkpoints.len()).map_err(StoreError::rejected)?;
            record.checkpoints.push(checkpoint.clone());
            Ok(())
        }))
    }

    fn mark_unknown(
        &self,
        key: &RecordKey,
        fence: Fence,
        evidence: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        ready(self.owned(key, fence, |record| {
            record.state = State::Unknown {
                evidence: evidence.into(),
                since: clock(),
            };
            Ok(())
        }))
    }

    fn unknowns(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<UnknownRecord>, StoreError>> + Send {
        ready(Ok(self.unknowns_now(limit)))
    }

    fn expired(
        &self,
        keep_expired_for: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ExpiredRecord>, StoreError>> + Send {
        ready(Ok(self.expired_now(keep_expired_for, limit)))
    }

    fn forget(
        &self,
        records: &[ExpiredRecord],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        ready(Ok(self.forget_now(records)))
    }

    fn take_abandoned(
        &self,
        overdue_by: Duration,
        lease: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<AbandonedRecord>, StoreError>> + Send {
        ready(Ok(self.take_abandoned_now(overdue_by, lease, limit)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::IdempotencyKey;

    fn key(n: u64) -> RecordKey {
        let key = IdempotencyKey::new(format!("k-{n}")).expect("a valid key");
        RecordKey::new("t", "POST /orders", key)
    }

    /// A million distinct keys into a store of 1 000 records: the store holds 1 000, and every
    /// key past them is refused as full; a sweep of expired records makes room again.
    #[tokio::test(start_paused = true)]
    async fn a_million_keys_fill_the_store_to_its_capacity_and_no_further() {
        let store = MemoryStore::with_shards(8).with_capacity(1_000);
        let digest = RequestDigest::of(b"body");
        let lease = Duration::from_secs(30);
        let response = StoredResponse::new(
            http::StatusCode::OK,
            &http::HeaderMap::new(),
            bytes::Bytes::from_static(b"ok"),
        );
        let mut full = 0u64;
        for n in 0..1_000_000 {
            match store.acquire_now(&key(n), &digest, lease) {
                Ok(Acquire::Owner(fence)) => {
                    let state = State::Completed {
                        response: response.clone(),
                        expires_at: later(clock(), Duration::from_secs(60)),
                    };
                    store.finish(&key(n), fence, state).expect("completed");
                }
                Ok(other) => panic!("a new key, not the owner: {other:?}"),
                Err(e) => {
                    assert!(e.is_full(), "{e}");
                    full += 1;
                }
            }
        }
        assert_eq!(store.len(), 1_000);
        assert_eq!(full, 999_000);
        // A key it holds is still answered.
        assert!(matches!(
            store.acquire_now(&key(7), &digest, lease),
            Ok(Acquire::Completed(_))
        ));
        // Room comes back as expired records go.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(store.sweep_now(Duration::ZERO), 1_000);
        assert!(matches!(
            store.acquire_now(&key(1_000_001), &digest, lease),
            Ok(Acquire::Owner(_))
        ));
        assert_eq!(store.len(), 1);
    }
}
