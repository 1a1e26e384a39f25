//! The inbox's retention as a chore: processed events' records deleted in leased, bounded
//! batches, the versions kept.

use std::fmt;
use std::time::Duration;

use super::MemoryInbox;
use crate::classify::BoxError;
use crate::maintenance::{self, Batch, BoxFuture, Chore};
use crate::ConfigError;

/// The inbox a sweeper sweeps.
#[derive(Clone)]
pub(crate) enum Target {
    Memory(MemoryInbox),
    #[cfg(feature = "postgres")]
    Postgres(super::PostgresInbox),
}

/// The [chore](Chore) that keeps an inbox's table bounded: each batch deletes at most its limit
/// of the records of events processed [`retention`](Self::retention) ago or more, the oldest
/// first. The latest version applied per aggregate is never deleted, so that a redelivery of a
/// versioned event older than the sweep is still [`Stale`](super::Processed::Stale), not
/// applied. Without a sweeper, the inbox keeps a record of every event it processed.
///
/// Made by [`PostgresInbox::sweeper`][super::PostgresInbox::sweeper] (named `inbox <table>`) or
/// [`MemoryInbox::sweeper`], each with the broker's redelivery window, which the retention must
/// exceed (see the [module docs](super#retention)).
#[cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "super::PostgresInbox::sweeper",
    )
)]
pub struct InboxSweeper {
    target: Target,
    name: String,
    retention: Duration,
    redelivery_window: Duration,
}

impl InboxSweeper {
    pub(crate) fn new(
        target: Target,
        name: String,
        retention: Duration,
        redelivery_window: Duration,
    ) -> Result<Self, ConfigError> {
        ConfigError::at_most_max("inbox redelivery window", redelivery_window)?;
        ConfigError::at_most_max("inbox retention", retention)?;
        if retention <= redelivery_window {
            return Err(ConfigError::new(
                "inbox retention",
                format!(
                    "{retention:?} does not exceed the broker's redelivery window \
                     ({redelivery_window:?}): an event without versions redelivered after its \
                     record was swept would be applied again"
                ),
            ));
        }
        Ok(InboxSweeper {
            target,
            name,
            retention,
            redelivery_window,
        })
    }

    /// How long a record is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The broker's redelivery window, as the caller stated it.
    pub fn redelivery_window(&self) -> Duration {
        self.redelivery_window
    }
}

impl Chore for InboxSweeper {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&self, limit: usize) -> BoxFuture<'_, Result<Batch, BoxError>> {
        Box::pin(async move {
            let done = match &self.target {
                Target::Memory(inbox) => inbox.sweep_batch(self.retention, limit),
                #[cfg(feature = "postgres")]
                Target::Postgres(inbox) => inbox.sweep_batch(self.retention, limit).await?,
            };
            Ok(maintenance::swept(done, limit))
        })
    }
}

impl fmt::Debug for InboxSweeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxSweeper")
            .field("name", &self.name)
            .field("retention", &self.retention)
            .field("redelivery_window", &self.redelivery_window)
            .finish_non_exhaustive()
    }
}
