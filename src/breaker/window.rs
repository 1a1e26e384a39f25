//! The sliding windows that count calls and failures, without a lock.

use std::sync::atomic::Ordering::{AcqRel, Relaxed};
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::{now as clock, AtomicI64, AtomicU32, AtomicU64, AtomicU8};

/// Calls and failures counted by a window.
///
/// Its fields may grow (`#[non_exhaustive]`): build one with [`new`](Self::new), as a test
/// that compares a breaker's [`window`](crate::breaker::CircuitBreaker::window) does.
///
/// ```
/// use surely::breaker::WindowCounts;
///
/// let counts = WindowCounts::new(10, 3);
/// assert_eq!((counts.calls, counts.failures), (10, 3));
/// assert_eq!(WindowCounts::default(), WindowCounts::new(0, 0));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowCounts {
    /// Calls counted.
    pub calls: u32,
    /// Failures among them (slow calls included, when enabled).
    pub failures: u32,
}

impl WindowCounts {
    /// `calls` counted, `failures` among them.
    pub const fn new(calls: u32, failures: u32) -> Self {
        WindowCounts { calls, failures }
    }
}

pub(super) enum Window {
    Count(CountWindow),
    Time(TimeWindow),
}

impl Window {
    pub(super) fn count(size: u32) -> Self {
        Window::Count(CountWindow {
            slots: (0..size).map(|_| AtomicU8::new(EMPTY)).collect(),
            next: AtomicU32::new(0),
            calls: AtomicI64::new(0),
            failures: AtomicI64::new(0),
        })
    }

    pub(super) fn time(epoch: Instant, length: Duration, buckets: u32) -> Self {
        let bucket_nanos = (length.as_nanos() / u128::from(buckets)).max(1);
        Window::Time(TimeWindow {
            epoch,
            bucket_nanos: u64::try_from(bucket_nanos).unwrap_or(u64::MAX),
            buckets: (0..buckets).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Whether recording needs the time.
    #[inline]
    pub(super) fn needs_clock(&self) -> bool {
        matches!(self, Window::Time(_))
    }

    #[inline]
    pub(super) fn record(&self, failure: bool, now: Option<Instant>) {
        match self {
            Window::Count(w) => w.record(failure),
            Window::Time(w) => w.record(failure, now.unwrap_or_else(clock)),
        }
    }

    /// The counts now (`now` is read if the window needs it and it is `None`).
    pub(super) fn counts(&self, now: Option<Instant>) -> WindowCounts {
        match self {
            Window::Count(w) => w.counts(),
            Window::Time(w) => w.counts(now.unwrap_or_else(clock)),
        }
    }

    pub(super) fn clear(&self) {
        match self {
            Window::Count(w) => w.clear(),
            Window::Time(w) => w.clear(),
        }
    }
}

const EMPTY: u8 = 0;
const SUCCESS: u8 = 1;
const FAILURE: u8 = 2;

/// The last `slots.len()` calls: a ring of slots, each the result of one call, and running
/// totals kept in step with them. Recording a call is a `fetch_add` and a read of its slot;
/// the slot is written, and a total updated, only when the slot's result changes. A success
/// into a full window without failures is two reads and nothing else.
pub(super) struct CountWindow {
    slots: Box<[AtomicU8]>,
    // 32 bits, so that the slot is found with a 32-bit division: the ring jumps once every
    // 2^32 calls, when it wraps, which moves no total.
    next: AtomicU32,
    // Signed: a clear racing with a record may leave a total briefly off by one; reads clamp.
    calls: AtomicI64,
    failures: AtomicI64,
}

impl CountWindow {
    #[inline]
    fn record(&self, failure: bool) {
        // A full window without a failure stays so after a success, wherever the success would
        // go: nothing to write, nor to move (a failure after it moves the ring again). Two
        // reads, the healthy dependency's path, inlined into the caller.
        if !failure
            && self.failures.load(Relaxed) == 0
            && self.calls.load(Relaxed) >= self.slots.len() as i64
        {
            return;
        }
        self.record_slow(failure);
    }

    #[inline(never)]
    fn record_slow(&self, failure: bool) {
        // The window's size is a `u32`.
        let len = self.slots.len() as u32;
        let slot = &self.slots[(self.next.fetch_add(1, Relaxed) % len) as usize];
        let new = if failure { FAILURE } else { SUCCESS };
        // A slot another call writes at the same time (the ring came round in between) is
        // that call's to count: the newer result stands either way.
        if slot.load(Relaxed) == new {
            return;
        }
        let old = slot.swap(new, Relaxed);
        if old == new {
            return;
        }
        // A failure's count publishes the call counted before it (release), and takes in the
        // calls of the failures counted before it (acquire): whichever of two racing failures
        // counts last then reads both calls when it checks the window. All relaxed, it could
        // read the other's failure without its call, and at a ratio of 1 neither would open
        // the breaker (loom's model `breaker_trips_open_exactly_once` found this). On x86 the
        // add is the same locked instruction whatever the ordering: no cost there.
        if old == EMPTY {
            self.calls.fetch_add(1, Relaxed);
        }
        if new == FAILURE {
            self.failures.fetch_add(1, AcqRel);
        } else if old == FAILURE {
            self.failures.fetch_sub(1, AcqRel);
        }
    }

    fn counts(&self) -> WindowCounts {
        let calls = clamp(self.calls.load(Relaxed), u32::MAX);
        let failures = clamp(self.failures.load(Relaxed), calls);
        WindowCounts { calls, failures }
    }

    fn clear(&self) {
        for slot in self.slots.iter() {
            slot.store(EMPTY, Relaxed);
        }
        self.calls.store(0, Relaxed);
        self.failures.store(0, Relaxed);
    }
}

fn clamp(v: i64, max: u32) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX).min(max)
}

/// The calls of the last `buckets.len() × bucket_nanos`: a ring of buckets, each one word
/// holding its tick (which bucket-length slice of time it counts) and its calls and failures,
/// updated together by compare-and-swap. A bucket of an older tick is started afresh by the
/// first call that lands in it.
pub(super) struct TimeWindow {
    epoch: Instant,
    bucket_nanos: u64,
    buckets: Box<[AtomicU64]>,
}

// One bucket's word: tick (20 bits, modulo) | calls (22 bits) | failures (22 bits).
const TICK_BITS: u32 = 20;
const COUNT_BITS: u32 = 22;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const TICK_MASK: u64 = (1 << TICK_BITS) - 1;

fn pack(tick: u64, calls: u64, failures: u64) -> u64 {
    ((tick & TICK_MASK) << (2 * COUNT_BITS)) | (calls << COUNT_BITS) | failures
}

fn unpack(word: u64) -> (u64, u64, u64) {
    (
        word >> (2 * COUNT_BITS),
        (word >> COUNT_BITS) & COUNT_MAX,
        word & COUNT_MAX,
    )
}

impl TimeWindow {
    fn tick(&self, now: Instant) -> u64 {
        // In u64: a u128 division would cost more than the rest of the record.
        let since = now.saturating_duration_since(self.epoch);
        let nanos = since
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(since.subsec_nanos()));
        nanos / self.bucket_nanos
    }

    fn record(&self, failure: bool, now: Instant) {
        let tick = self.tick(now);
        let bucket = &self.buckets[(tick % self.buckets.len() as u64) as usize];
        let f = u64::from(failure);
        let mut word = bucket.load(Relaxed);
        loop {
            let (t, calls, failures) = unpack(word);
            let new = if t != tick & TICK_MASK {
                pack(tick, 1, f)
            } else if calls == COUNT_MAX {
                // Full: stop counting this bucket rather than skew its ratio.
                return;
            } else {
                pack(tick, calls + 1, failures + f)
            };
            match bucket.compare_exchange_weak(word, new, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }

    fn counts(&self, now: Instant) -> WindowCounts {
        let tick = self.tick(now);
        let len = self.buckets.len() as u64;
        let mut counts = WindowCounts::default();
        for bucket in self.buckets.iter() {
            let (t, calls, failures) = unpack(bucket.load(Relaxed));
            // The bucket's age in ticks, modulo the tick's width.
            let age = (tick & TICK_MASK).wrapping_sub(t) & TICK_MASK;
            if age < len && calls > 0 {
                counts.calls = counts.calls.saturating_add(calls as u32);
                counts.failures = counts.failures.saturating_add(failures as u32);
            }
        }
        counts
    }

    fn clear(&self) {
        for bucket in self.buckets.iter() {
            bucket.store(0, Relaxed);
        }
    }
}
