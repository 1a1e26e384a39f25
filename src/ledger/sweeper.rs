//! The ledger's retention as a chore: settled entries deleted in leased, bounded batches.

use std::fmt;
use std::time::Duration;

use super::{Ledger, MemoryLedger};
use crate::classify::BoxError;
use crate::maintenance::{self, Batch, BoxFuture, Chore};
use crate::ConfigError;

/// The [chore](Chore) that keeps a ledger's tables bounded: each batch deletes at most its
/// limit of the entries settled [`retention`](Self::retention) ago or more, the longest
/// settled first, with their attempts ([`Ledger::sweep_batch`]). An entry in doubt, open,
/// claimed or in the manual queue is never deleted, whatever its age: its call has no answer
/// yet.
///
/// Made by [`PostgresLedger::sweeper`][super::PostgresLedger::sweeper] (named
/// `ledger <table>`), [`MemoryLedger::sweeper`], or [`new`](Self::new) for a ledger of your
/// own. The retention is at least [`MIN_RETENTION`](maintenance::MIN_RETENTION), so that an
/// entry just settled (by a reconciler, or by hand) can still be read with its evidence.
/// Without a sweeper (and with the reconciler's
/// [`no_sweep`](super::ReconcilerBuilder::no_sweep)), settled entries are kept; the
/// reconciler's own sweep, by default, deletes them 30 days after they were settled.
///
/// ```
/// use std::time::Duration;
/// use surely::maintenance::Maintenance;
/// use surely::ledger::MemoryLedger;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), surely::ConfigError> {
/// let ledger = MemoryLedger::new();
/// let maintenance = Maintenance::builder()
///     .chore(ledger.sweeper(Duration::from_secs(90 * 24 * 3600))?)
///     .build()?
///     .spawn();
/// # maintenance.shutdown().await;
/// # Ok(()) }
/// ```
#[cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "super::PostgresLedger::sweeper",
    )
)]
pub struct LedgerSweeper<S> {
    store: S,
    name: String,
    retention: Duration,
}

impl<S: Ledger> LedgerSweeper<S> {
    /// A sweeper of `store`'s settled entries, named `name` (the name of its lease: the
    /// same on every instance that sweeps the same table), that keeps each for `retention`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `ledger retention` and both values: `retention` shorter than
    /// [`MIN_RETENTION`](maintenance::MIN_RETENTION), or longer than
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn new(
        store: S,
        name: impl Into<String>,
        retention: Duration,
    ) -> Result<Self, ConfigError> {
        let retention = maintenance::check_retention("ledger retention", retention)?;
        Ok(LedgerSweeper {
            store,
            name: name.into(),
            retention,
        })
    }

    /// How long a settled entry is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }
}

impl<S: Ledger> Chore for LedgerSweeper<S> {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&self, limit: usize) -> BoxFuture<'_, Result<Batch, BoxError>> {
        Box::pin(async move {
            let done = self.store.sweep_batch(self.retention, limit).await?;
            Ok(maintenance::swept(done, limit))
        })
    }
}

impl<S> fmt::Debug for LedgerSweeper<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LedgerSweeper")
            .field("name", &self.name)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl MemoryLedger {
    /// The [chore](Chore) that deletes this ledger's entries settled `retention` ago or more
    /// ([`LedgerSweeper`]), named `ledger memory <this process>`: each process sweeps its
    /// own memory.
    ///
    /// # Errors
    ///
    /// As [`LedgerSweeper::new`].
    pub fn sweeper(&self, retention: Duration) -> Result<LedgerSweeper<MemoryLedger>, ConfigError> {
        LedgerSweeper::new(
            self.clone(),
            maintenance::memory_chore_name("ledger"),
            retention,
        )
    }
}

#[cfg(feature = "postgres")]
impl super::PostgresLedger {
    /// The [chore](Chore) that deletes this ledger's entries settled `retention` ago or more
    /// ([`LedgerSweeper`]), named `ledger <table>`: the instances that share the table share
    /// its lease. Each batch is one statement, read through the table's index on
    /// `settled_at` ([`docs::operators`](crate::docs::operators)).
    ///
    /// ```no_run
    /// # fn run(pool: surely::postgres::Pool) -> Result<(), surely::ConfigError> {
    /// use std::time::Duration;
    /// use surely::maintenance::{Maintenance, PostgresLeases};
    /// use surely::ledger::PostgresLedger;
    ///
    /// let ledger = PostgresLedger::new(pool.clone());
    /// let maintenance = Maintenance::builder()
    ///     .leases(PostgresLeases::new(pool))
    ///     .chore(ledger.sweeper(Duration::from_secs(90 * 24 * 3600))?)
    ///     .build()?;
    /// # let _ = maintenance; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LedgerSweeper::new`].
    pub fn sweeper(
        &self,
        retention: Duration,
    ) -> Result<LedgerSweeper<super::PostgresLedger>, ConfigError> {
        LedgerSweeper::new(self.clone(), format!("ledger {}", self.table()), retention)
    }
}
