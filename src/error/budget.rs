//! The retry budget's error.

use std::fmt;
use std::time::Duration;

/// A [`RetryBudget`](crate::budget::RetryBudget) refused a retry (or a hedge): too many recent attempts
/// were retries already.
///
/// It may carry a hint, like governor's `NotUntil`: how long until the budget would allow a
/// retry again if nothing else happened meanwhile. [`RatioBudget`](crate::budget::RatioBudget) computes
/// one (when the retries it counts leave its window); [`TokenBucket`](crate::budget::TokenBucket)
/// cannot, because only successes refill it, and says `None`.
///
/// ```
/// use std::time::Duration;
/// use surely::budget::BudgetExhausted;
///
/// let e = BudgetExhausted::new(Some(Duration::from_millis(300)));
/// assert_eq!(e.to_string(), "retry budget exhausted");
/// assert_eq!(e.retry_after(), Some(Duration::from_millis(300)));
/// assert_eq!(BudgetExhausted::new(None).retry_after(), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BudgetExhausted {
    retry_after: Option<Duration>,
}

impl BudgetExhausted {
    /// A refusal, with a hint of how long until a retry would be allowed again, if known.
    pub fn new(retry_after: Option<Duration>) -> Self {
        BudgetExhausted { retry_after }
    }

    /// How long until the budget would allow a retry again, assuming no new first attempts
    /// arrive meanwhile; `None` if the budget cannot tell (or never will without new first
    /// attempts or successes). A hint, not a promise: other callers may spend the budget first.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for BudgetExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("retry budget exhausted")
    }
}

impl std::error::Error for BudgetExhausted {}
