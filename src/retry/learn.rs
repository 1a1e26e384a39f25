//! The minimum attempt time, learned from recent attempts.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

/// How many recent attempt times are kept.
const SLOTS: usize = 64;

/// Samples needed before the estimate is used.
const MIN_SAMPLES: usize = 8;

/// Recent attempt times in a lock-free ring (microseconds, saturating at about 71 minutes),
/// and the quantile of them that admission uses.
pub(super) struct AttemptTimes {
    slots: [AtomicU32; SLOTS],
    seen: AtomicUsize,
    quantile: f64,
}

impl AttemptTimes {
    pub(super) fn new(quantile: f64) -> Self {
        AttemptTimes {
            slots: std::array::from_fn(|_| AtomicU32::new(0)),
            seen: AtomicUsize::new(0),
            quantile,
        }
    }

    /// Keeps the time an answered attempt took.
    pub(super) fn observe(&self, took: Duration) {
        let micros = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        let i = self.seen.fetch_add(1, Ordering::Relaxed);
        self.slots[i % SLOTS].store(micros, Ordering::Relaxed);
    }

    /// The quantile of the recent attempt times, once there are enough of them.
    pub(super) fn estimate(&self) -> Option<Duration> {
        let n = self.seen.load(Ordering::Relaxed).min(SLOTS);
        if n < MIN_SAMPLES {
            return None;
        }
        let mut times = [0u32; SLOTS];
        for (t, slot) in times.iter_mut().zip(&self.slots).take(n) {
            *t = slot.load(Ordering::Relaxed);
        }
        let times = &mut times[..n];
        // The nearest rank: the smallest time at least `quantile` of the samples do not exceed.
        let rank = ((self.quantile * n as f64).ceil() as usize).clamp(1, n) - 1;
        let (_, nth, _) = times.select_nth_unstable(rank);
        Some(Duration::from_micros(u64::from(*nth)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_enough_samples() {
        let times = AttemptTimes::new(0.9);
        for _ in 0..MIN_SAMPLES - 1 {
            times.observe(Duration::from_millis(5));
        }
        assert_eq!(times.estimate(), None);
        times.observe(Duration::from_millis(5));
        assert_eq!(times.estimate(), Some(Duration::from_millis(5)));
    }

    #[test]
    fn takes_the_quantile_of_the_recent_window() {
        let times = AttemptTimes::new(0.9);
        for ms in 1..=10 {
            times.observe(Duration::from_millis(ms));
        }
        assert_eq!(times.estimate(), Some(Duration::from_millis(9)));
        // Older samples fall out of the window.
        for _ in 0..SLOTS {
            times.observe(Duration::from_millis(50));
        }
        assert_eq!(times.estimate(), Some(Duration::from_millis(50)));
    }

    #[test]
    fn saturates_instead_of_wrapping() {
        let times = AttemptTimes::new(1.0);
        for _ in 0..MIN_SAMPLES {
            times.observe(Duration::from_secs(u64::MAX / 4));
        }
        assert_eq!(
            times.estimate(),
            Some(Duration::from_micros(u64::from(u32::MAX)))
        );
    }
}
