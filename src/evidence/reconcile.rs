//! What reconciliation reports, as plain data: the records know the open differences without
//! knowing the reconciler.

use std::time::Duration;

/// How the differences found by reconciliation stand: what an operator watches. A
/// [`Reconciler`][crate::reconcile::Reconciler] sends one to its recorder after each pass.
///
/// ```
/// use surely::record::{Record, ReconcileReport};
///
/// let alert = |record: Record<'_>| {
///     if let Record::Reconcile(report) = record {
///         for (rule, open) in &report.open_by_rule {
///             println!("{rule}: {open} open");
///         }
///     }
/// };
/// # let _ = alert;
/// let report = ReconcileReport::new(vec![("payment-order".to_owned(), 2)], 1, None);
/// assert_eq!(report.open(), 2);
/// ```
#[cfg_attr(
    not(feature = "durable"),
    doc = crate::docs::links::to_features!(
        "crate::reconcile::Reconciler",
    )
)]
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// Differences neither repaired nor resolved, by rule, in rule name order.
    pub open_by_rule: Vec<(String, u64)>,
    /// Of those, in the manual queue.
    pub manual: u64,
    /// How long the oldest of them has been open; `None` without any.
    pub oldest_open: Option<Duration>,
}

impl ReconcileReport {
    /// A report.
    pub fn new(
        open_by_rule: Vec<(String, u64)>,
        manual: u64,
        oldest_open: Option<Duration>,
    ) -> Self {
        ReconcileReport {
            open_by_rule,
            manual,
            oldest_open,
        }
    }

    /// Open differences, all rules together.
    pub fn open(&self) -> u64 {
        self.open_by_rule.iter().map(|(_, n)| n).sum()
    }
}
