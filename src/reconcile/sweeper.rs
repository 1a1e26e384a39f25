//! The reconciliation differences' retention as a chore: repaired and resolved differences
//! deleted in leased, bounded batches.

use std::fmt;
use std::time::Duration;

use super::{DifferenceStore, MemoryDifferences};
use crate::classify::BoxError;
use crate::maintenance::{self, Batch, BoxFuture, Chore};
use crate::ConfigError;

/// The [chore](Chore) that keeps a differences' table bounded: each batch deletes at most its
/// limit of the differences repaired or resolved [`retention`](Self::retention) ago or more,
/// the longest done first ([`DifferenceStore::sweep_batch`]). An open, claimed or manual
/// difference is never deleted, whatever its age: it still waits for its repair or a person.
///
/// Made by [`PostgresDifferences::sweeper`][super::PostgresDifferences::sweeper] (named
/// `reconcile <table>`), [`MemoryDifferences::sweeper`], or [`new`](Self::new) for a store of
/// your own. The retention is at least [`MIN_RETENTION`](maintenance::MIN_RETENTION), so that
/// a difference just repaired or resolved can still be read with its note and who did it.
/// Without a sweeper, repaired and resolved differences are kept.
///
/// ```
/// use std::time::Duration;
/// use surely::maintenance::Maintenance;
/// use surely::reconcile::MemoryDifferences;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), surely::ConfigError> {
/// let differences = MemoryDifferences::new();
/// let maintenance = Maintenance::builder()
///     .chore(differences.sweeper(Duration::from_secs(30 * 24 * 3600))?)
///     .build()?
///     .spawn();
/// # maintenance.shutdown().await;
/// # Ok(()) }
/// ```
#[cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "super::PostgresDifferences::sweeper",
    )
)]
pub struct DifferenceSweeper<S> {
    store: S,
    name: String,
    retention: Duration,
}

impl<S: DifferenceStore> DifferenceSweeper<S> {
    /// A sweeper of `store`'s repaired and resolved differences, named `name` (the name of its lease: the
    /// same on every instance that sweeps the same table), that keeps each for `retention`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `reconcile retention` and both values: `retention` shorter than
    /// [`MIN_RETENTION`](maintenance::MIN_RETENTION), or longer than
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn new(
        store: S,
        name: impl Into<String>,
        retention: Duration,
    ) -> Result<Self, ConfigError> {
        let retention = maintenance::check_retention("reconcile retention", retention)?;
        Ok(DifferenceSweeper {
            store,
            name: name.into(),
            retention,
        })
    }

    /// How long a repaired or resolved difference is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }
}

impl<S: DifferenceStore> Chore for DifferenceSweeper<S> {
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

impl<S> fmt::Debug for DifferenceSweeper<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DifferenceSweeper")
            .field("name", &self.name)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl MemoryDifferences {
    /// The [chore](Chore) that deletes this store's differences repaired or resolved
    /// `retention` ago or more ([`DifferenceSweeper`]), named `reconcile memory <this
    /// process>`: each process sweeps its own memory.
    ///
    /// # Errors
    ///
    /// As [`DifferenceSweeper::new`].
    pub fn sweeper(
        &self,
        retention: Duration,
    ) -> Result<DifferenceSweeper<MemoryDifferences>, ConfigError> {
        DifferenceSweeper::new(
            self.clone(),
            maintenance::memory_chore_name("reconcile"),
            retention,
        )
    }
}

#[cfg(feature = "postgres")]
impl super::PostgresDifferences {
    /// The [chore](Chore) that deletes this store's differences repaired or resolved
    /// `retention` ago or more ([`DifferenceSweeper`]), named `reconcile <table>`: the
    /// instances that share the table share its lease. Each batch is one statement, read
    /// through the table's index on `settled_at` ([`docs::operators`](crate::docs::operators)).
    ///
    /// ```no_run
    /// # fn run(pool: surely::postgres::Pool) -> Result<(), surely::ConfigError> {
    /// use std::time::Duration;
    /// use surely::maintenance::{Maintenance, PostgresLeases};
    /// use surely::reconcile::PostgresDifferences;
    ///
    /// let differences = PostgresDifferences::new(pool.clone());
    /// let maintenance = Maintenance::builder()
    ///     .leases(PostgresLeases::new(pool))
    ///     .chore(differences.sweeper(Duration::from_secs(30 * 24 * 3600))?)
    ///     .build()?;
    /// # let _ = maintenance; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`DifferenceSweeper::new`].
    pub fn sweeper(
        &self,
        retention: Duration,
    ) -> Result<DifferenceSweeper<super::PostgresDifferences>, ConfigError> {
        DifferenceSweeper::new(
            self.clone(),
            format!("reconcile {}", self.table()),
            retention,
        )
    }
}
