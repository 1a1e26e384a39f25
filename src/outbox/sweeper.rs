//! The outbox's retention as a chore: published events deleted in leased, bounded batches.

use std::fmt;
use std::time::Duration;

use super::{MemoryOutbox, OutboxStore};
use crate::classify::BoxError;
use crate::maintenance::{self, Batch, BoxFuture, Chore};
use crate::ConfigError;

/// The [chore](Chore) that keeps an outbox's table bounded: each batch deletes at most its
/// limit of the events published [`retention`](Self::retention) ago or more, the longest
/// published first ([`OutboxStore::sweep_batch`]). Pending and quarantined events are never
/// deleted: a quarantined one waits for a person, whatever its age.
///
/// Made by [`PostgresOutbox::sweeper`][super::PostgresOutbox::sweeper] (named
/// `outbox <table>`), [`MemoryOutbox::sweeper`], or [`new`](Self::new) for a store of your
/// own. The retention is at least [`MIN_RETENTION`](maintenance::MIN_RETENTION), so that an
/// event just published can still be looked up when a consumer says it never came. Without
/// a sweeper (and with the relay's [`no_sweep`](super::RelayBuilder::no_sweep)), published
/// events are kept; the relay's own sweep, by default, deletes them 24 hours after they were
/// published.
///
/// ```
/// use std::time::Duration;
/// use surely::maintenance::Maintenance;
/// use surely::outbox::MemoryOutbox;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), surely::ConfigError> {
/// let outbox = MemoryOutbox::new();
/// let maintenance = Maintenance::builder()
///     .chore(outbox.sweeper(Duration::from_secs(7 * 24 * 3600))?)
///     .build()?
///     .spawn();
/// # maintenance.shutdown().await;
/// # Ok(()) }
/// ```
#[cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "super::PostgresOutbox::sweeper",
    )
)]
pub struct OutboxSweeper<S> {
    store: S,
    name: String,
    retention: Duration,
}

impl<S: OutboxStore> OutboxSweeper<S> {
    /// A sweeper of `store`'s published events, named `name` (the name of its lease: the
    /// same on every instance that sweeps the same table), that keeps each for `retention`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `outbox retention` and both values: `retention` shorter than
    /// [`MIN_RETENTION`](maintenance::MIN_RETENTION), or longer than
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn new(
        store: S,
        name: impl Into<String>,
        retention: Duration,
    ) -> Result<Self, ConfigError> {
        let retention = maintenance::check_retention("outbox retention", retention)?;
        Ok(OutboxSweeper {
            store,
            name: name.into(),
            retention,
        })
    }

    /// How long a published event is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }
}

impl<S: OutboxStore> Chore for OutboxSweeper<S> {
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

impl<S> fmt::Debug for OutboxSweeper<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxSweeper")
            .field("name", &self.name)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl MemoryOutbox {
    /// The [chore](Chore) that deletes this outbox's events published `retention` ago or more
    /// ([`OutboxSweeper`]), named `outbox memory <this process>`: each process sweeps its
    /// own memory.
    ///
    /// # Errors
    ///
    /// As [`OutboxSweeper::new`].
    pub fn sweeper(&self, retention: Duration) -> Result<OutboxSweeper<MemoryOutbox>, ConfigError> {
        OutboxSweeper::new(
            self.clone(),
            maintenance::memory_chore_name("outbox"),
            retention,
        )
    }
}

#[cfg(feature = "postgres")]
impl super::PostgresOutbox {
    /// The [chore](Chore) that deletes this outbox's events published `retention` ago or more
    /// ([`OutboxSweeper`]), named `outbox <table>`: the instances that share the table share
    /// its lease. Each batch is one statement, read through the table's index on
    /// `published_at` ([`docs::operators`](crate::docs::operators)).
    ///
    /// ```no_run
    /// # fn run(pool: surely::postgres::Pool) -> Result<(), surely::ConfigError> {
    /// use std::time::Duration;
    /// use surely::maintenance::{Maintenance, PostgresLeases};
    /// use surely::outbox::PostgresOutbox;
    ///
    /// let outbox = PostgresOutbox::new(pool.clone());
    /// let maintenance = Maintenance::builder()
    ///     .leases(PostgresLeases::new(pool))
    ///     .chore(outbox.sweeper(Duration::from_secs(7 * 24 * 3600))?)
    ///     .build()?;
    /// # let _ = maintenance; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`OutboxSweeper::new`].
    pub fn sweeper(
        &self,
        retention: Duration,
    ) -> Result<OutboxSweeper<super::PostgresOutbox>, ConfigError> {
        OutboxSweeper::new(self.clone(), format!("outbox {}", self.table()), retention)
    }
}
