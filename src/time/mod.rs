//! Time as the crate's layers speak it: the [`Deadline`] value, and the codecs that carry a
//! budget on the wire as a relative value.
//!
//! Vocabulary (see the architecture chapter of the docs): re-exported by [`crate::deadline`].

use std::time::Duration;

use tokio::time::Instant;

pub mod codec;

/// The longest duration any setting of the crate accepts: ten years. A configured duration past
/// it (a lease, a retention, a timeout, a cap on a server's pushback) is refused when the
/// builder or the configuration file is read, with a [`ConfigError`](crate::ConfigError) that
/// names the setting: ten years is a typo more likely than a wish, and every sum of it with
/// an instant stays far from the clock's end. Durations that arrive from a peer (a
/// `Retry-After`, a `grpc-timeout`) are not refused but clamped where they are read, each to
/// the bound its reader documents.
///
/// ```
/// use std::time::Duration;
/// use surely::retry::RetryLayer;
///
/// let err = RetryLayer::builder().max_pushback(Duration::MAX).build().unwrap_err();
/// assert_eq!(err.setting(), "retry max pushback");
/// assert!(RetryLayer::builder().max_pushback(surely::MAX_DURATION).build().is_ok());
/// ```
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 86_400);

/// About 30 years: what a deadline "infinitely far" away is clamped to, so that arithmetic on
/// instants never overflows; also the longest wait a pushback header reads as (three times
/// [`MAX_DURATION`], so that it is past every client's cap).
pub(crate) const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// `from + by`, without a panic whatever `by` is: a duration past [`FAR_FUTURE`] (about 30
/// years) counts as 30 years. Every sum of an instant and a duration that a caller, a
/// configuration file or a peer supplied goes through here (the architecture chapter of the
/// docs, "Durations").
#[inline]
pub(crate) fn later(from: Instant, by: Duration) -> Instant {
    // `Instant` is the clock's reading since an arbitrary start (boot, on Linux): 30 years more
    // fits it. Should it not, the sum is the instant itself (already due), not a panic.
    from.checked_add(by.min(FAR_FUTURE)).unwrap_or(from)
}

/// The instant a logical call stops being useful, on tokio's clock (so paused-time tests
/// control it).
///
/// Put it in an `http::Request`'s extensions to give one call a deadline; the layers combine it
/// with the [`current`](crate::deadline::current) one, and the earlier wins.
///
/// ```
/// use std::time::Duration;
/// use surely::deadline::Deadline;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let parent = Deadline::after(Duration::from_secs(5));
/// let child = Deadline::after(Duration::from_secs(10)).min(parent);
/// assert_eq!(child, parent);
/// tokio::time::advance(Duration::from_secs(3)).await;
/// assert_eq!(parent.remaining(), Duration::from_secs(2));
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(Instant);

impl Deadline {
    /// A deadline at `instant`.
    pub fn at(instant: Instant) -> Self {
        Deadline(instant)
    }

    /// A deadline `budget` from now. An absurdly long budget is clamped to about 30 years.
    pub fn after(budget: Duration) -> Self {
        Self::after_from(Instant::now(), budget)
    }

    /// A deadline `budget` after `now`, clamped like [`after`](Self::after).
    pub fn after_from(now: Instant, budget: Duration) -> Self {
        Deadline(later(now, budget))
    }

    /// The instant.
    pub fn instant(self) -> Instant {
        self.0
    }

    /// The budget left now; zero once passed.
    pub fn remaining(self) -> Duration {
        self.remaining_at(Instant::now())
    }

    /// The budget left at `now`; zero once passed.
    pub fn remaining_at(self, now: Instant) -> Duration {
        self.0.saturating_duration_since(now)
    }

    /// Whether the deadline has passed (no budget left).
    pub fn is_expired(self) -> bool {
        self.remaining().is_zero()
    }

    /// The earlier of two deadlines: a child deadline is never later than its parent.
    #[must_use]
    pub fn min(self, other: Deadline) -> Deadline {
        Ord::min(self, other)
    }

    /// The earlier of `own` and `other`, where `None` means "no deadline".
    pub fn earliest(own: Option<Deadline>, other: Option<Deadline>) -> Option<Deadline> {
        match (own, other) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_never_panics_and_clamps_to_far_future() {
        let now = Instant::now();
        assert_eq!(later(now, Duration::MAX), now + FAR_FUTURE);
        assert_eq!(
            later(now, FAR_FUTURE + Duration::from_nanos(1)),
            now + FAR_FUTURE
        );
        assert_eq!(
            later(now, Duration::from_secs(3)),
            now + Duration::from_secs(3)
        );
        assert_eq!(later(now, Duration::ZERO), now);
    }
}
