//! The idempotency layer's background work, as chores for a
//! [`Maintenance`](crate::maintenance::Maintenance).

use std::fmt;
use std::time::Duration;

use super::layer::{ArchiveRefused, Config};
use super::IdempotencyLayer;
use crate::classify::BoxError;
use crate::maintenance::{Batch, BoxFuture, Chore};
use crate::server::store::{IdempotencyStore, StoreError};

use crate::ConfigError;

/// One batch of the sweep: at most `limit` expired records read, handed to the archive if there
/// is one, and deleted (each only if still terminal with the same fence). Returns how many it
/// deleted and whether the batch was full.
pub(super) async fn sweep_batch<St: IdempotencyStore>(
    config: &Config<St>,
    keep_expired_for: Duration,
    limit: usize,
) -> Result<(u64, bool), StoreError> {
    let batch = config.store.expired(keep_expired_for, limit).await?;
    if batch.is_empty() {
        return Ok((0, false));
    }
    let full = batch.len() >= limit;
    if let Some(archive) = &config.archive {
        archive(batch.clone())
            .await
            .map_err(|e| StoreError::backend(ArchiveRefused(e)))?;
    }
    let deleted = config.store.forget(&batch).await?;
    Ok((deleted, full))
}

/// The sweep of an [`IdempotencyLayer`]'s store, as a chore:
/// [`IdempotencyLayer::sweeper`].
pub struct IdempotencySweeper<St> {
    layer: IdempotencyLayer<St>,
    keep_expired_for: Duration,
    name: String,
}

impl<St> fmt::Debug for IdempotencySweeper<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencySweeper")
            .field("name", &self.name)
            .field("keep_expired_for", &self.keep_expired_for)
            .finish_non_exhaustive()
    }
}

impl<St> IdempotencySweeper<St> {
    /// The same sweeper under another name: for a second idempotency layer (another store or
    /// table) in the same maintenance, since each chore needs a name of its own. The default is
    /// `idempotency sweep`.
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
}

impl<St: IdempotencyStore> IdempotencyLayer<St> {
    /// The [sweep](Self::sweep) as a [chore](Chore) for a
    /// [`Maintenance`](crate::maintenance::Maintenance): each batch reads at most the
    /// maintenance's batch size of completed and released records whose retention ended
    /// `keep_expired_for` ago or more, hands them to the
    /// [archive](super::IdempotencyLayerBuilder::archive) if there is one, and deletes them.
    /// Never a `PROCESSING` or `UNKNOWN` record. An archive that refuses a batch keeps it (and
    /// every later one) for the next round.
    ///
    /// `keep_expired_for` is the safety window past each record's retention: a request with
    /// the key answers `410 Gone` during it instead of running again.
    ///
    /// # Errors
    ///
    /// `keep_expired_for` over [`MAX_DURATION`](crate::MAX_DURATION).
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::maintenance::Maintenance;
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), surely::ConfigError> {
    /// let layer = IdempotencyLayer::new(MemoryStore::new());
    /// let maintenance = Maintenance::builder()
    ///     .chore(layer.sweeper(Duration::from_secs(3600))?)
    ///     .build()?
    ///     .spawn();
    /// # let _ = maintenance; Ok(()) }
    /// ```
    pub fn sweeper(
        &self,
        keep_expired_for: Duration,
    ) -> Result<IdempotencySweeper<St>, ConfigError> {
        ConfigError::at_most_max("keep_expired_for", keep_expired_for)?;
        Ok(IdempotencySweeper {
            layer: self.clone(),
            keep_expired_for,
            name: "idempotency sweep".to_owned(),
        })
    }
}

impl<St: IdempotencyStore> Chore for IdempotencySweeper<St> {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&self, limit: usize) -> BoxFuture<'_, Result<Batch, BoxError>> {
        Box::pin(async move {
            let (deleted, full) =
                sweep_batch(&self.layer.config, self.keep_expired_for, limit).await?;
            // A full batch none of which could be deleted (all acquired again since) would come
            // back at once: wait for the next round.
            Ok(Batch::new(deleted, full && deleted > 0))
        })
    }
}

/// The recovery of abandoned records, as a chore: [`IdempotencyLayer::recoverer`].
pub struct IdempotencyRecoverer<St> {
    layer: IdempotencyLayer<St>,
    name: String,
}

impl<St> fmt::Debug for IdempotencyRecoverer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyRecoverer")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<St> IdempotencyRecoverer<St> {
    /// The same recoverer under another name (default `idempotency recovery`), as
    /// [`IdempotencySweeper::named`].
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
}

impl<St: IdempotencyStore> IdempotencyLayer<St> {
    /// The [recovery of abandoned records](Self::recover_abandoned) as a [chore](Chore) for a
    /// [`Maintenance`](crate::maintenance::Maintenance): each batch takes over at most the
    /// maintenance's batch size of records whose owner's lease passed (and the
    /// [grace](super::IdempotencyLayerBuilder::abandoned_grace) after it), and decides each
    /// with the [hook](super::IdempotencyLayerBuilder::recover_abandoned), or by the rule
    /// without one. Run it a few times per lease: a record whose owner and client died
    /// together is then settled within a lease or two, with no request.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::maintenance::Maintenance;
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), surely::ConfigError> {
    /// let layer = IdempotencyLayer::builder(MemoryStore::new())
    ///     .lease(Duration::from_secs(30))
    ///     .build()?;
    /// let maintenance = Maintenance::builder()
    ///     .chore(layer.recoverer())
    ///     .chore(layer.sweeper(Duration::from_secs(3600))?)
    ///     .every(Duration::from_secs(10))
    ///     .round_time(Duration::from_secs(10))
    ///     .build()?
    ///     .spawn();
    /// # let _ = maintenance; Ok(()) }
    /// ```
    pub fn recoverer(&self) -> IdempotencyRecoverer<St> {
        IdempotencyRecoverer {
            layer: self.clone(),
            name: "idempotency recovery".to_owned(),
        }
    }
}

impl<St: IdempotencyStore> Chore for IdempotencyRecoverer<St> {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&self, limit: usize) -> BoxFuture<'_, Result<Batch, BoxError>> {
        Box::pin(async move {
            let round = self.layer.recover_abandoned(limit).await?;
            let decided = round.seen - round.left;
            // Records left as they were (a hook that panicked or hung) come back after the
            // round's lease, not in this round.
            Ok(Batch::new(
                decided as u64,
                round.seen >= limit && decided > 0,
            ))
        })
    }
}
