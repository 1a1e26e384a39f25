//! One piece of background work, in bounded batches.

use std::future::Future;
use std::pin::Pin;

use crate::classify::BoxError;

/// A future a [`Chore`] or a [`Leases`](super::Leases) returns: boxed, so that the maintenance
/// task can hold chores of every kind in one list.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One piece of background work that keeps a table (or a store) bounded: a sweep of expired
/// rows, a recovery of abandoned records. The [maintenance task](super::Maintenance) runs each
/// chore in **batches**, as long as a batch says there is [`more`](Batch::more) and the round's
/// time lasts, under a [lease](super::Leases) named after the chore so that, of the instances
/// that run the same chores, one runs each per round.
///
/// A batch is one bounded step: at most `limit` rows, done in one atomic move or in moves that
/// each leave the store consistent, so that a batch cut short (a timeout, a crash) loses
/// nothing and the next round picks up what it left. A chore that fails says why in its error;
/// the task reports it and tries again next round.
///
/// The components of the crate hand out their chores (the idempotency layer's sweep and
/// recovery, the inbox's, outbox's, ledger's, reconciliation's and audit log's retention); a
/// chore of your own is a type that implements this trait:
///
/// ```
/// use surely::maintenance::{Batch, BoxFuture, Chore};
///
/// struct ForgetOldSessions;
///
/// impl Chore for ForgetOldSessions {
///     fn name(&self) -> &str {
///         "sessions"
///     }
///
///     fn run(&self, limit: usize) -> BoxFuture<'_, Result<Batch, surely::classify::BoxError>> {
///         Box::pin(async move {
///             let deleted = 0; // delete at most `limit` expired sessions here
///             Ok(Batch::new(deleted, deleted == limit as u64))
///         })
///     }
/// }
/// ```
pub trait Chore: Send + Sync + 'static {
    /// The chore's name: the name of its lease, and its label in reports and metrics. Two
    /// chores that work on the same rows must have the same name (so that one runs at a time);
    /// chores on different rows, different names (the crate's name theirs after the table:
    /// `inbox surely_inbox`).
    fn name(&self) -> &str;

    /// Does one batch of at most `limit` rows, and says how many and whether there may be more.
    fn run(&self, limit: usize) -> BoxFuture<'_, Result<Batch, BoxError>>;
}

/// What one batch of a [`Chore`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Batch {
    /// The rows (or records) it deleted, recovered or moved.
    pub done: u64,
    /// Whether there may be more to do now: the batch was full. The task runs another batch
    /// at once while the round's time lasts.
    pub more: bool,
}

impl Batch {
    /// A batch that did `done`, with `more` to do or not.
    pub fn new(done: u64, more: bool) -> Self {
        Batch { done, more }
    }
}
