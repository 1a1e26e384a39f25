//! What the maintenance task reports, as plain data: one report per chore per round.

use std::fmt;
use std::time::Duration;

/// How one chore's round went: a [maintenance task][crate::maintenance::Maintenance] sends one
/// to its recorder for every chore it ran or tried to run.
///
/// ```
/// use surely::record::{MaintenanceOutcome, MaintenanceReport, Record};
///
/// let alert = |record: Record<'_>| {
///     if let Record::Maintenance(report) = record {
///         if let MaintenanceOutcome::Failed(why) = &report.outcome {
///             eprintln!("{} kept its rows for the next round: {why}", report.chore);
///         }
///     }
/// };
/// # let _ = alert;
/// ```
#[cfg_attr(
    not(any(feature = "server", feature = "durable")),
    doc = crate::docs::links::to_features!(
        "crate::maintenance::Maintenance",
    )
)]
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MaintenanceReport {
    /// The chore's name (`inbox surely_inbox`).
    pub chore: String,
    /// The rows or records its batches did this round.
    pub done: u64,
    /// Its batches this round.
    pub batches: u32,
    /// How long the round took.
    pub took: Duration,
    /// How the round ended.
    pub outcome: MaintenanceOutcome,
}

impl MaintenanceReport {
    /// A report.
    pub fn new(
        chore: impl Into<String>,
        done: u64,
        batches: u32,
        took: Duration,
        outcome: MaintenanceOutcome,
    ) -> Self {
        MaintenanceReport {
            chore: chore.into(),
            done,
            batches,
            took,
            outcome,
        }
    }
}

impl fmt::Display for MaintenanceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} done in {} batches ({:?}), {}",
            self.chore, self.done, self.batches, self.took, self.outcome
        )
    }
}

/// How a chore's round ended ([`MaintenanceReport`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MaintenanceOutcome {
    /// Nothing more to do now.
    Done,
    /// The round's time ran out with more to do: the next round goes on.
    OutOfTime,
    /// Another instance holds the chore's lease: it runs it this round.
    HeldElsewhere,
    /// A batch failed or did not finish in its time: what it could not do is kept for the next
    /// round. The error chain, as text.
    Failed(String),
}

impl MaintenanceOutcome {
    /// Its name in metrics and logs: `done`, `out_of_time`, `held_elsewhere`, `failed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            MaintenanceOutcome::Done => "done",
            MaintenanceOutcome::OutOfTime => "out_of_time",
            MaintenanceOutcome::HeldElsewhere => "held_elsewhere",
            MaintenanceOutcome::Failed(_) => "failed",
        }
    }
}

impl fmt::Display for MaintenanceOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaintenanceOutcome::Failed(why) => write!(f, "failed: {why}"),
            other => f.write_str(other.as_str()),
        }
    }
}
