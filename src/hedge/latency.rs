//! The learned hedge delay: a percentile of the latencies of recent successful attempts.
//!
//! Recording a latency is two relaxed atomic operations (a slot claimed in a ring, a store into
//! it), with no lock: it runs on every successful attempt. Every `refresh_every` samples, the
//! thread that recorded the last one folds the ring into an [`hdrhistogram::Histogram`] (behind
//! a mutex taken with `try_lock`, so no caller ever waits on it) and publishes the new delay and
//! the typical (median) latency in atomics, which the hedge futures read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;

/// The largest latency the histogram tells apart: one hour, in microseconds. Longer ones are
/// counted as one hour.
const MAX_MICROS: u64 = 3_600_000_000;

/// Two significant figures: a percentile is exact to within 1%.
const SIGFIG: u8 = 2;

/// Sentinel for "no typical latency known yet".
const UNKNOWN: u64 = u64::MAX;

pub(super) struct Learned {
    /// The percentile, as a quantile in (0, 1].
    quantile: f64,
    min_samples: u64,
    refresh_every: u64,
    /// The last `window` latencies, in microseconds; slot `n % window` holds sample `n`.
    ring: Box<[AtomicU64]>,
    /// Samples recorded so far.
    recorded: AtomicU64,
    /// The current delay, in microseconds: the fallback until `min_samples` were seen.
    delay: AtomicU64,
    /// The median latency, in microseconds, or [`UNKNOWN`].
    typical: AtomicU64,
    histogram: Mutex<Histogram<u64>>,
}

impl Learned {
    pub(super) fn new(
        percentile: f64,
        fallback: Duration,
        min_samples: u32,
        window: u32,
    ) -> Option<Self> {
        let histogram = Histogram::new_with_max(MAX_MICROS, SIGFIG).ok()?;
        let window = u64::from(window.max(1));
        Some(Learned {
            quantile: percentile / 100.0,
            min_samples: u64::from(min_samples.max(1)),
            refresh_every: (window / 10).max(1),
            ring: (0..window).map(|_| AtomicU64::new(0)).collect(),
            recorded: AtomicU64::new(0),
            delay: AtomicU64::new(micros(fallback)),
            typical: AtomicU64::new(UNKNOWN),
            histogram: Mutex::new(histogram),
        })
    }

    /// The delay before the next hedge.
    #[inline]
    pub(super) fn delay(&self) -> Duration {
        Duration::from_micros(self.delay.load(Ordering::Relaxed))
    }

    /// The median latency of recent successful attempts, once enough were seen.
    #[inline]
    pub(super) fn typical(&self) -> Option<Duration> {
        match self.typical.load(Ordering::Relaxed) {
            UNKNOWN => None,
            t => Some(Duration::from_micros(t)),
        }
    }

    /// Records the latency of a successful attempt.
    #[inline]
    pub(super) fn record(&self, latency: Duration) {
        let n = self.recorded.fetch_add(1, Ordering::Relaxed);
        let len = self.ring.len() as u64;
        self.ring[(n % len) as usize].store(micros(latency), Ordering::Relaxed);
        let count = n + 1;
        if count >= self.min_samples
            && (count == self.min_samples || count % self.refresh_every == 0)
        {
            self.refresh(count.min(len));
        }
    }

    /// Recomputes the delay from the ring's first `filled` slots.
    #[cold]
    fn refresh(&self, filled: u64) {
        // Another thread is refreshing: its result is as good as ours.
        let Ok(mut histogram) = self.histogram.try_lock().or_else(|e| match e {
            std::sync::TryLockError::Poisoned(p) => Ok(PoisonError::into_inner(p)),
            std::sync::TryLockError::WouldBlock => Err(()),
        }) else {
            return;
        };
        histogram.reset();
        for slot in &self.ring[..filled as usize] {
            histogram.saturating_record(slot.load(Ordering::Relaxed));
        }
        let delay = histogram.value_at_quantile(self.quantile);
        let typical = histogram.value_at_quantile(0.5);
        self.delay.store(delay, Ordering::Relaxed);
        self.typical.store(typical, Ordering::Relaxed);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX)
        .min(MAX_MICROS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_holds_until_enough_samples() {
        let l = Learned::new(90.0, Duration::from_millis(50), 10, 100).unwrap();
        for _ in 0..9 {
            l.record(Duration::from_millis(5));
        }
        assert_eq!(l.delay(), Duration::from_millis(50));
        assert_eq!(l.typical(), None);
        l.record(Duration::from_millis(5));
        // Two significant figures: within 1%.
        let d = l.delay().as_micros();
        assert!((5000..=5050).contains(&d), "{d}");
    }

    #[test]
    fn the_window_forgets_old_samples() {
        let l = Learned::new(50.0, Duration::from_millis(50), 1, 20).unwrap();
        for _ in 0..20 {
            l.record(Duration::from_millis(100));
        }
        assert!(l.delay() >= Duration::from_millis(99));
        for _ in 0..20 {
            l.record(Duration::from_millis(1));
        }
        assert!(l.delay() <= Duration::from_micros(1010), "{:?}", l.delay());
    }

    #[test]
    fn huge_latencies_saturate() {
        let l = Learned::new(99.0, Duration::from_millis(1), 1, 10).unwrap();
        l.record(Duration::MAX);
        assert!(l.delay() >= Duration::from_secs(3500));
    }
}
