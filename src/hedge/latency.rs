//! The learned hedge delay: a percentile of the latencies of recent successful attempts.
//!
//! Recording a latency is two relaxed atomic operations (a slot claimed in a small ring, a store
//! into it), with no lock: it runs on every successful attempt that was not answered at once.
//! Every `batch` samples (a quarter of the window), the thread that recorded the last one folds
//! the batch into an [`hdrhistogram::Histogram`] (behind a mutex taken with `try_lock`, so no
//! caller ever waits on it; a batch that finds it taken is dropped, which costs a few samples),
//! and publishes the delay and the median latency in atomics that the hedge futures read.
//!
//! The window rotates: samples go into a `current` histogram; when it holds a window's worth, it
//! becomes `previous` and a fresh one starts. The percentile is read from `current` once it holds
//! the minimum number of samples, else from `previous`: it always describes between
//! `min_samples` and a window of the most recent samples.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, TryLockError};
use std::time::Duration;

use hdrhistogram::Histogram;

/// The largest latency the histogram tells apart: ten minutes, in microseconds. Longer ones are
/// counted as ten minutes.
const MAX_MICROS: u64 = 600_000_000;

/// Two significant figures: a percentile is exact to within 1%.
const SIGFIG: u8 = 2;

/// Sentinel for "no typical latency known yet".
const UNKNOWN: u64 = u64::MAX;

pub(super) struct Learned {
    /// The percentile, as a quantile in (0, 1].
    quantile: f64,
    min_samples: u64,
    window: u64,
    /// The latest samples, in microseconds; slot `n % len` holds sample `n`.
    ring: Box<[AtomicU64]>,
    /// Samples recorded so far.
    recorded: AtomicU64,
    /// The current delay, in microseconds: the fallback until `min_samples` were seen.
    delay: AtomicU64,
    /// The median latency, in microseconds, or [`UNKNOWN`].
    typical: AtomicU64,
    /// `None` if the histograms could not be made (they always can with these bounds): the
    /// delay then stays the fallback.
    histograms: Mutex<Option<Histograms>>,
}

struct Histograms {
    current: Histogram<u64>,
    previous: Histogram<u64>,
    /// Samples folded in so far.
    folded: u64,
}

impl Learned {
    pub(super) fn new(percentile: f64, fallback: Duration, min_samples: u32, window: u32) -> Self {
        let histograms = Histogram::new_with_max(MAX_MICROS, SIGFIG)
            .ok()
            .map(|histogram| Histograms {
                previous: histogram.clone(),
                current: histogram,
                folded: 0,
            });
        let window = u64::from(window.max(1));
        let min_samples = u64::from(min_samples.max(1)).min(window);
        let batch = (window / 4).max(1);
        Learned {
            quantile: percentile / 100.0,
            min_samples,
            window,
            ring: (0..batch.max(min_samples))
                .map(|_| AtomicU64::new(0))
                .collect(),
            recorded: AtomicU64::new(0),
            delay: AtomicU64::new(micros(fallback)),
            typical: AtomicU64::new(UNKNOWN),
            histograms: Mutex::new(histograms),
        }
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
        let batch = (self.window / 4).max(1);
        if count == self.min_samples || count.is_multiple_of(batch) {
            self.fold(count);
        }
    }

    /// Folds the samples recorded since the last fold (at most a ring's worth) into the
    /// histograms, and publishes the new delay once enough samples were seen.
    #[cold]
    fn fold(&self, count: u64) {
        let mut h = match self.histograms.try_lock() {
            Ok(h) => h,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            // Another thread is folding: this batch is skipped.
            Err(TryLockError::WouldBlock) => return,
        };
        let Some(h) = h.as_mut() else {
            return;
        };
        let len = self.ring.len() as u64;
        let from = h.folded.max(count.saturating_sub(len));
        for k in from..count {
            let v = self.ring[(k % len) as usize].load(Ordering::Relaxed);
            h.current.saturating_record(v);
        }
        h.folded = h.folded.max(count);
        if h.current.len() >= self.window {
            std::mem::swap(&mut h.current, &mut h.previous);
            h.current.reset();
        }
        if count < self.min_samples {
            return;
        }
        let source = if h.current.len() >= self.min_samples {
            &h.current
        } else {
            &h.previous
        };
        let delay = source.value_at_quantile(self.quantile);
        let typical = source.value_at_quantile(0.5);
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
        let l = Learned::new(90.0, Duration::from_millis(50), 10, 100);
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
        let l = Learned::new(50.0, Duration::from_millis(50), 1, 20);
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
    fn many_threads_record_at_once() {
        let l = std::sync::Arc::new(Learned::new(50.0, Duration::from_secs(1), 100, 1000));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        l.record(Duration::from_micros(1000 + (i + t) % 3));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Every sample is between 1000 and 1002 µs; a skipped batch changes nothing.
        let d = l.delay().as_micros();
        assert!((1000..=1010).contains(&d), "{d}");
        assert!(l.typical().is_some());
    }

    #[test]
    fn huge_latencies_saturate() {
        let l = Learned::new(99.0, Duration::from_millis(1), 1, 10);
        l.record(Duration::MAX);
        assert!(l.delay() >= Duration::from_secs(590));
    }
}
