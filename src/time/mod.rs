//! Time as the crate's layers speak it: the [`Deadline`] value, and the codecs that carry a
//! budget on the wire as a relative value.
//!
//! Vocabulary (see the architecture chapter of the docs): re-exported by [`crate::deadline`].

use std::time::Duration;

use tokio::time::Instant;

pub mod codec;

/// About 30 years: what a deadline "infinitely far" away is clamped to, so that arithmetic on
/// instants never overflows.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

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
        Deadline(now + budget.min(FAR_FUTURE))
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
