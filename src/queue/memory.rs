//! The queue in memory: items in insertion order, under one lock.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{bounded, Refused, States};
use crate::time::later;

/// A queue of items of payload `V` in states `S`, found by their key `K`. Clones share the
/// items. Time is [`tokio::time::Instant`], so tests can pause and advance it.
///
/// Every operation is made on the [locked](Self::lock) [`Items`], so that what a component does
/// in one of its methods (look, then change) is one atomic step of the store.
pub(crate) struct MemoryQueue<K, S, V> {
    items: Arc<Mutex<Items<K, S, V>>>,
}

impl<K, S, V> Clone for MemoryQueue<K, S, V> {
    fn clone(&self) -> Self {
        MemoryQueue {
            items: Arc::clone(&self.items),
        }
    }
}

impl<K, S, V> Default for MemoryQueue<K, S, V> {
    fn default() -> Self {
        MemoryQueue {
            items: Arc::new(Mutex::new(Items {
                next: 0,
                by_seq: BTreeMap::new(),
                by_key: HashMap::new(),
                capacity: DEFAULT_CAPACITY,
            })),
        }
    }
}

impl<K, S, V> MemoryQueue<K, S, V> {
    /// The items, locked until the guard is dropped.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Items<K, S, V>> {
        // Every critical section leaves the items whole before anything that could panic.
        self.items.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The items a queue takes unless its component sets another bound: 100 000.
pub(crate) const DEFAULT_CAPACITY: usize = 100_000;

/// An insert refused: the queue holds its capacity of items (this many), in every state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Full(pub(crate) usize);
impl<K: Eq + Hash + Clone, S: States, V> MemoryQueue<K, S, V> {
    /// Deletes every item settled `retention` ago or more, in batches of
    /// [`SWEEP_BATCH`](super::SWEEP_BATCH), the lock let go between them; returns how many.
    pub(crate) fn sweep_all(&self, retention: Duration) -> u64 {
        let mut total = 0u64;
        loop {
            let n = self.lock().sweep(retention, super::SWEEP_BATCH);
            total = total.saturating_add(n);
            if n < super::SWEEP_BATCH as u64 {
                return total;
            }
        }
    }
}

/// The items of a [`MemoryQueue`], in the order they were inserted.
pub(crate) struct Items<K, S, V> {
    next: u64,
    /// Each item with its key, by the order it was inserted in.
    by_seq: BTreeMap<u64, (K, Item<S, V>)>,
    by_key: HashMap<K, u64>,
    /// The most items it takes: an insert past them is refused, nothing is dropped for it.
    capacity: usize,
}

/// One item: the queue's part (its state, fence, time, tries) and the component's payload.
pub(crate) struct Item<S, V> {
    state: S,
    fence: u64,
    /// Waiting: due from then (none: at once); claimed: the lease's end.
    until: Option<Instant>,
    tries: u32,
    recorded: Instant,
    settled: Option<Instant>,
    /// The component's part.
    pub(crate) value: V,
}

impl<K, S, V> Items<K, S, V>
where
    K: Eq + Hash + Clone,
    S: States,
{
    /// Inserts an item under `key`, in `state`, due after `hold` (at once without one); returns
    /// false, and changes nothing, if an item has the key; refuses a new key, changing nothing,
    /// when the queue holds its capacity.
    pub(crate) fn insert(
        &mut self,
        key: K,
        state: S,
        hold: Option<Duration>,
        value: V,
    ) -> Result<bool, Full> {
        if self.by_key.contains_key(&key) {
            return Ok(false);
        }
        if self.by_seq.len() >= self.capacity {
            return Err(Full(self.capacity));
        }
        let now = Instant::now();
        let seq = self.next;
        self.next = self.next.wrapping_add(1);
        self.by_key.insert(key.clone(), seq);
        self.by_seq.insert(
            seq,
            (
                key,
                Item {
                    state,
                    fence: 0,
                    until: hold.map(|d| later(now, bounded(d))),
                    tries: 0,
                    recorded: now,
                    settled: None,
                    value,
                },
            ),
        );
        Ok(true)
    }

    /// Takes at most `capacity` items (at least 1) from now on; items already in stay.
    pub(crate) fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
    }

    /// The most items it takes.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The item with this key.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<&Item<S, V>>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.by_seq.get(self.by_key.get(key)?).map(|(_, item)| item)
    }

    /// The item with this key, to change.
    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut Item<S, V>>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.by_seq
            .get_mut(self.by_key.get(key)?)
            .map(|(_, item)| item)
    }

    /// Deletes the item with this key if `when` says so of it; returns it.
    pub(crate) fn remove_if<Q>(
        &mut self,
        key: &Q,
        when: impl FnOnce(&Item<S, V>) -> bool,
    ) -> Option<Item<S, V>>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        let seq = *self.by_key.get(key)?;
        if !self.by_seq.get(&seq).is_some_and(|(_, item)| when(item)) {
            return None;
        }
        self.by_key.remove(key);
        self.by_seq.remove(&seq).map(|(_, item)| item)
    }

    /// Claims up to `max` due items for `lease`, oldest first: each moves to the claimed
    /// state, its fence one higher, held until the lease ends. Returns what `read` makes of
    /// each, claimed.
    pub(crate) fn claim<R>(
        &mut self,
        max: usize,
        lease: Duration,
        mut read: impl FnMut(&Item<S, V>) -> R,
    ) -> Vec<R> {
        let now = Instant::now();
        let until = later(now, bounded(lease));
        let mut claimed = Vec::new();
        for (_, item) in self.by_seq.values_mut() {
            if claimed.len() >= max {
                break;
            }
            if item.is_due(now) {
                item.state = S::CLAIMED;
                item.fence = item.fence.wrapping_add(1);
                item.until = Some(until);
                claimed.push(read(item));
            }
        }
        claimed
    }

    /// The item a claim with `fence` holds, for its holder to change; or why not.
    pub(crate) fn held<Q>(&mut self, key: &Q, fence: u64) -> Result<&mut Item<S, V>, Refused>
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        let item = self.get_mut(key).ok_or(Refused::Missing)?;
        if item.state != S::CLAIMED || item.fence != fence {
            return Err(Refused::Stale);
        }
        Ok(item)
    }

    /// Deletes at most `limit` of the items settled `retention` ago or more (at most
    /// [`MAX_DURATION`] counted), the longest settled first; returns how many. Never an
    /// unsettled one.
    ///
    /// [`MAX_DURATION`]: crate::MAX_DURATION
    pub(crate) fn sweep(&mut self, retention: Duration, limit: usize) -> u64 {
        let now = Instant::now();
        let retention = bounded(retention);
        let mut expired: Vec<(Instant, u64)> = self
            .by_seq
            .iter()
            .filter(|(_, (_, item))| item.state.settled())
            .filter_map(|(seq, (_, item))| Some((item.settled?, *seq)))
            .filter(|(at, _)| now.saturating_duration_since(*at) >= retention)
            .collect();
        expired.sort_unstable();
        expired.truncate(limit);
        for (_, seq) in &expired {
            if let Some((key, _)) = self.by_seq.remove(seq) {
                self.by_key.remove(&key);
            }
        }
        expired.len() as u64
    }

    /// Every item, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Item<S, V>> {
        self.by_seq.values().map(|(_, item)| item)
    }

    /// How many items there are.
    pub(crate) fn len(&self) -> usize {
        self.by_seq.len()
    }
}

impl<S: States, V> Item<S, V> {
    /// Its state.
    pub(crate) fn state(&self) -> S {
        self.state
    }

    /// Its fence: the number of its latest claim (or reopening).
    pub(crate) fn fence(&self) -> u64 {
        self.fence
    }

    /// How many times a holder put it back or parked it.
    pub(crate) fn tries(&self) -> u32 {
        self.tries
    }

    /// How long ago it was inserted.
    pub(crate) fn age(&self) -> Duration {
        Instant::now().saturating_duration_since(self.recorded)
    }

    fn is_due(&self, now: Instant) -> bool {
        self.state.claimable() && self.until.is_none_or(|t| t <= now)
    }

    /// Settles it (`to` a settled state): never claimed again, swept after the retention.
    pub(crate) fn settle(&mut self, to: S) {
        debug_assert!(to.settled());
        self.state = to;
        self.until = None;
        self.settled = Some(Instant::now());
    }

    /// Puts it back (`to` a claimable state), due after `after` (at most
    /// [`MAX_DURATION`](crate::MAX_DURATION) counted); counts a try.
    pub(crate) fn retry_later(&mut self, to: S, after: Duration) {
        debug_assert!(to.claimable());
        self.state = to;
        self.tries = self.tries.saturating_add(1);
        self.until = Some(later(Instant::now(), bounded(after)));
    }

    /// Parks it in a manual state (`to`): never claimed until a person reopens it; counts a
    /// try.
    pub(crate) fn park(&mut self, to: S) {
        debug_assert!(to.manual());
        self.state = to;
        self.tries = self.tries.saturating_add(1);
        self.until = None;
    }

    /// A person sends it back to be claimed (`to` a claimable state), at once: its fence moves
    /// on, so that no claim from before counts.
    pub(crate) fn reopen(&mut self, to: S) {
        debug_assert!(to.claimable());
        self.state = to;
        self.fence = self.fence.wrapping_add(1);
        self.until = None;
    }

    /// Moves it to `to` (a state that is not the claimed one: an intent that became an entry)
    /// due at once, its fence and tries kept.
    pub(crate) fn set_due_now(&mut self, to: S) {
        self.state = to;
        self.until = None;
    }

    /// Counts its tries from zero again.
    pub(crate) fn reset_tries(&mut self) {
        self.tries = 0;
    }
}
